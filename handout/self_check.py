"""make_handout.py --self-check: the handout is graded twice, as Otter-Grader checks its own.

1. The untouched student repository: every core item must earn 0, and the run must end within
   the grading budget with no test killed for hanging (each test fails fast on its
   NotImplementedError).
2. The same repository with the solution put back (every file holding a solution region, the
   design document and the results it is built from): every assessed item must earn its marks.
Both grades are written to OUT_DIR/self-check/{untouched,solved}.json.
"""
import json
import os
import shutil
import subprocess
import sys

from handout import build


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


def hung_tests(report):
    """The tests the grader killed at their timeout."""
    return [test["name"] for test in report.get("tests", [])
            if "timed out" in (test.get("output") or "")]


def check_untouched(report, budget_s):
    """Problems with the untouched handout's grade: a core item earned, a hang, over budget."""
    problems = [f"untouched handout: {item['id']} earned {item['earned']:g}"
                for item in report["items"]
                if item["id"].startswith("core.") and item["earned"]]
    problems += [f"untouched handout: {name} hung until its timeout" for name in hung_tests(report)]
    if report["elapsed_s"] > budget_s:
        problems.append(f"untouched handout: grading took {report['elapsed_s']:.0f} s, over the "
                        f"{budget_s} s budget")
    return problems


def check_solved(report):
    """Problems with the solved handout's grade: an assessed item short of its marks, with the
    first line of each of its tests that did not pass (CI's log is all there is to go on)."""
    problems = []
    for item in report["items"]:
        if item["status"] == "not assessed" or item["earned"] == item["marks"]:
            continue
        problems.append(f"handout with the solution: {item['id']} earned {item['earned'] or 0:g}"
                        f" of {item['marks']:g} ({item.get('because') or item['status']})")
        problems += [f"  {test['nodeid']}: {test['outcome']}: "
                     + ((test.get("output") or "").strip().splitlines() or [""])[0][:300]
                     for test in report.get("tests", [])
                     if item["id"] in test["items"] and test["outcome"] != "passed"]
    return problems


def summary(name, report):
    """One line: the marks and the time of one grade."""
    return (f"{name}: {report['total_earned']:g} of {report['total_assessed']:g} assessed marks "
            f"in {report['elapsed_s']:.0f} s")


def self_check(source, handout, out_dir, budget_s=300):
    """Grade the handout untouched and solved; print the outcome; 0 when both are as they must."""
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
    for problem in problems:
        print(f"self-check: {problem}")
    print("self-check: " + ("failed" if problems else "passed"))
    return 1 if problems else 0
