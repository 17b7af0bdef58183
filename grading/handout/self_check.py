"""make_handout.py --self-check: the handout graded untouched (every core item earns 0, within the
budget, no test hung) and with the solution put back (every assessed item earns its marks); with
--per-item, also with each item's regions alone (and those it builds on), which must earn exactly
that item (and those). Each grade is written to OUT_DIR/self-check/NAME.json.
"""
import json
import os
import shutil
import subprocess
import sys

from grading.handout import build, regions


def grade(source, submission, report, budget_s):
    """Run the source's grade.py on `submission`; its report (None if it wrote none) and output."""
    command = [sys.executable, os.path.join(source, "grade.py"), submission, "--report", report,
               "--budget", str(budget_s)]
    done = subprocess.run(command, cwd=source, capture_output=True, text=True,
                          timeout=budget_s + 120)
    if not os.path.isfile(report):
        return None, done.stdout + done.stderr
    with open(report) as file:
        return json.load(file), done.stdout


def solution_files(source, handout):
    """What the self-check puts back: the region files, the built design document, results/."""
    restored = {region.path for region in handout.regions}
    restored |= {path for path in build.tracked_files(source) if build.is_generated(path)}
    return sorted(restored)


def check_untouched(report, budget_s):
    """Problems with the untouched handout's grade: a core item earned, a hang, over budget."""
    problems = [f"untouched handout: {item['id']} earned {item['earned']:g}"
                for item in report["items"]
                if item["id"].startswith("core.") and item["earned"]]
    problems += [f"untouched handout: {test['nodeid']} hung until its timeout"
                 for test in report.get("tests", []) if "timed out" in (test.get("output") or "")]
    if report["elapsed_s"] > budget_s:
        problems.append(f"untouched handout: grading took {report['elapsed_s']:.0f} s, over the "
                        f"{budget_s} s budget")
    return problems


def check_solved(report):
    """Problems with the solved handout's grade: an assessed item short of its marks, with each
    of its tests that did not pass; and a grade cut short (the budget ran out), whose items left
    not assessed prove nothing."""
    problems = [f"handout with the solution: incomplete: {reason}"
                for reason in report.get("incomplete_because", [])]
    for item in report["items"]:
        if item["status"] in ("not assessed", "graded by a person") or \
                item["earned"] == item["marks"]:
            continue
        problems.append(f"handout with the solution: {item['id']} earned {item['earned'] or 0:g}"
                        f" of {item['marks']:g} ({item.get('because') or item['status']})")
        problems += not_passed(report, item["id"])
    return problems


def not_passed(report, item_id):
    """One line per test of the item that did not pass: its outcome and the last line it printed
    (CI's log is all there is to go on)."""
    return [f"  {test['nodeid']}: {test['outcome']}: "
            + ((test.get("output") or "").strip().splitlines() or [""])[-1][:300]
            for test in report.get("tests", [])
            if item_id in test["items"] and test["outcome"] != "passed"]


def summary(name, report):
    """One line: the marks and the time of one grade."""
    return (f"{name}: {report['total_earned']:g} of {report['total_assessed']:g} assessed marks "
            f"in {report['elapsed_s']:.0f} s")


def self_check(source, handout, out_dir, budget_s=300, per_item=False):
    """Grade the handout untouched and solved (and each item alone with `per_item`); print the
    outcome; 0 when every grade is as it must be."""
    folder = os.path.join(out_dir, "self-check")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    student = os.path.join(out_dir, "student")
    untouched, output = grade(source, student, os.path.join(folder, "untouched.json"), budget_s)
    if untouched is None:
        print(f"self-check: grading the untouched handout wrote no report:\n{output}")
        return 1
    print(summary("untouched handout", untouched))
    solved_dir = os.path.join(folder, "solved")
    shutil.copytree(student, solved_dir)
    for path in solution_files(source, handout):
        os.makedirs(os.path.dirname(os.path.join(solved_dir, path)), exist_ok=True)
        shutil.copy2(os.path.join(source, path), os.path.join(solved_dir, path))
    solved, output = grade(source, solved_dir, os.path.join(folder, "solved.json"), budget_s)
    if solved is None:
        print(f"self-check: grading the solved handout wrote no report:\n{output}")
        return 1
    print(summary("handout with the solution", solved))
    problems = check_untouched(untouched, budget_s) + check_solved(solved)
    if per_item:
        problems += per_item_check(source, handout, out_dir, budget_s)
    for problem in problems:
        print(f"self-check: {problem}")
    print("self-check: " + ("failed" if problems else "passed"))
    return 1 if problems else 0


def with_tasks(source, handout, titles, tasks):
    """{path: text} of every file holding solution regions: the regions of `tasks` (numbers) as
    the solution has them, every other replaced by its prompt, as in the handout."""
    texts = {}
    for path in sorted({region.path for region in handout.regions}):
        with open(os.path.join(source, path)) as file:
            text = file.read()
        others = [region for region in handout.regions
                  if region.path == path and region.task not in tasks]
        texts[path] = regions.replace_regions(text, others, titles)
    return texts


def one_item_copy(source, handout, rubric, item, student, folder):
    """The `student` repository copied to `folder` with only `item`'s regions written (and those
    of the items it builds on); the design document's item also gets results/ and builds the
    document."""
    shutil.copytree(student, folder)
    numbers = {entry.id: number for number, entry in enumerate(rubric.ITEMS, start=1)}
    tasks = {numbers[item.id]} | {numbers[other] for other in item.builds_on}
    titles = [entry.title for entry in rubric.ITEMS]
    for path, text in with_tasks(source, handout, titles, tasks).items():
        with open(os.path.join(folder, path), "w") as file:
            file.write(text)
    if item.id == "design.numbers":
        for path in build.tracked_files(source):
            if path.startswith("results/"):
                os.makedirs(os.path.dirname(os.path.join(folder, path)), exist_ok=True)
                shutil.copy2(os.path.join(source, path), os.path.join(folder, path))
        subprocess.run([sys.executable, "-m", "analysis.build_design_doc"], cwd=folder,
                       check=True, capture_output=True, timeout=300)


def check_one_item(report, item):
    """Problems with the grade of the handout holding `item` alone: it must earn that item and the
    items it builds on, in full, and nothing else."""
    expected = {item.id, *item.builds_on}
    problems = []
    for entry in report["items"]:
        if entry["id"] in expected and entry["earned"] != entry["marks"]:
            problems.append(f"{item.id} alone: {entry['id']} earned {entry['earned'] or 0:g} of "
                            f"{entry['marks']:g} ({entry['status']})")
            problems += not_passed(report, entry["id"])
        elif entry["id"] not in expected and entry["earned"]:
            problems.append(f"{item.id} alone: {entry['id']} earned {entry['earned']:g} too")
    return problems


def per_item_check(source, handout, out_dir, budget_s):
    """Grade the handout with each item alone; the problems found, and one line per item."""
    rubric = build.load_module(source, "grading/rubric.py")
    folder = os.path.join(out_dir, "self-check")
    with_regions = {rubric.ITEMS[region.task - 1].id for region in handout.regions}
    problems = []
    for item in rubric.ITEMS:
        if item.graded_by != "tests" or item.id not in with_regions:
            continue  # the main job has no region of its own: the solved grade covers it
        copy = os.path.join(folder, "items", item.id)
        one_item_copy(source, handout, rubric, item, os.path.join(out_dir, "student"), copy)
        report, output = grade(source, copy, os.path.join(folder, f"{item.id}.json"), budget_s)
        if report is None:
            problems.append(f"{item.id} alone: grading wrote no report:\n{output}")
            continue
        shutil.rmtree(copy)
        print(summary(f"{item.id} alone", report))
        problems += check_one_item(report, item)
    return problems
