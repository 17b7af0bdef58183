"""Gradescope's results.json from a grade report (merge.py's, with grade.py's per-test entries).

One Gradescope test per rubric item, worth the item's marks: the rubric grades an item all or
nothing (it earns its marks when every one of its tests passed), so splitting its marks over its
tests would show a student part marks the rubric never gives. The item's output names each failed
test with what it printed. Hidden tests (profile.HIDDEN_TESTS) are never named there: the item
says how many hidden tests failed, and each has its own entry, worth 0 marks and "hidden", that
only the instructor sees. An item that is "not assessed" (its tests need what the machine lacks:
the real MNIST, root for Slurm) is worth 0 of 0 marks, with the reason: neither given nor taken.
Every item is "visible": the checks are objective, so a student can act on them before the
deadline; what needs a human reader (the report's needs_human) is graded by hand on top.
"""

from tests.grading.progress import tail

ITEM_OUTPUT_LIMIT = 20000  # characters per entry
FAILURE_LIMIT = 1500  # characters of each failed test under its item: its end says why


def results(report, elapsed_s):
    """The results.json document."""
    tests = [item_entry(item, report["tests"]) for item in report["items"]]
    tests += [hidden_entry(test) for test in report["tests"]
              if test["hidden"] and test["outcome"] == "failed"]
    for number, test in enumerate(tests, start=1):
        test["number"] = str(number)
    return {"score": report["total_earned"], "execution_time": round(elapsed_s),
            "output": summary(report), "visibility": "visible",
            "stdout_visibility": "hidden",  # the log names hidden tests
            "tests": tests}


def failure_results(reason, elapsed_s):
    """results.json when no grading could run: score 0 and the reason."""
    return {"score": 0, "execution_time": round(elapsed_s),
            "output": f"The submission could not be graded: {reason}",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": []}


def item_entry(item, tests):
    """One rubric item as one Gradescope test."""
    assessed = item["status"] != "not assessed"
    entry = {"name": f"{item['id']}: {item['title']}",
             "score": item["earned"] or 0, "max_score": item["marks"] if assessed else 0,
             "status": "failed" if item["status"] == "lost" else "passed",
             "output": cut(item_output(item, tests)),
             "visibility": "visible"}
    if not assessed:
        entry["name"] += " (not assessed)"
    return entry


def item_output(item, tests):
    """What the student reads under an item: its status, then each failed test and why."""
    mine = [test for test in tests if item["id"] in test["items"]]
    counts = {outcome: sum(test["outcome"] == outcome for test in mine)
              for outcome in ("passed", "failed", "skipped", "not_run")}
    lines = [f"{item['status']}: {item['earned'] or 0:g} of {item['marks']:g} marks; "
             + ", ".join(f"{count} {outcome.replace('_', ' ')}"
                         for outcome, count in counts.items() if count)]
    if item.get("because"):
        lines.append(f"Because {item['because']}.")
    lines.append(f"Checked: {item['checks']}")
    hidden_failures = sum(test["hidden"] and test["outcome"] == "failed" for test in mine)
    for test in mine:
        if test["outcome"] == "failed" and not test["hidden"]:
            why = tail(test.get("output", ""), FAILURE_LIMIT)
            lines.append(f"\nFAILED {test['nodeid']}\n{why}")
    if hidden_failures:
        lines.append(f"\n{hidden_failures} hidden test(s) of this item failed: the autograder's "
                     "own checks, whose details are not shown.")
    not_run = [test.get("output", "") for test in mine if test["outcome"] == "not_run"]
    for why in dict.fromkeys(not_run):  # one line per reason: there can be hundreds
        lines.append(f"{not_run.count(why)} test(s) {why}")
    for test in mine:
        if test["outcome"] == "skipped" and not test["hidden"]:
            lines.append(f"skipped {test['nodeid']}: {test.get('output', '')}")
    return "\n".join(lines)


def hidden_entry(test):
    """A failed hidden test, for the instructor's eyes only."""
    return {"name": test["nodeid"], "score": 0, "max_score": 0, "status": "failed",
            "output": cut(test.get("output", "")), "visibility": "hidden"}


def cut(text):
    """At most ITEM_OUTPUT_LIMIT characters, saying so when cut (the grade report has it all)."""
    if len(text) <= ITEM_OUTPUT_LIMIT:
        return text
    return text[:ITEM_OUTPUT_LIMIT] + "\n[... cut: the grade report (--report) has every test]"


def summary(report):
    """The top of the student's page: the marks per item and the total."""
    lines = []
    for item in report["items"]:
        earned = "-" if item["earned"] is None else f"{item['earned']:g}"
        lines.append(f"{item['id']:<22} {earned:>3}/{item['marks']:g}  {item['status']}")
    lines.append(f"total: {report['total_earned']:g} of {report['total_assessed']:g} assessed "
                 f"marks ({report['total_available']:g} available)")
    lines += [f"incomplete: {reason}" for reason in report["incomplete_because"]]
    lines += [f"note: {note}" for note in report.get("notes", []) if note.startswith("refused")]
    lines.append("The design document's writing, and what each item's 'needs a human' names, "
                 "are graded by hand.")
    return "\n".join(lines)
