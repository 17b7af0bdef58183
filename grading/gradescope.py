"""Gradescope's results.json from a grade report (the plugin's, with what grade.py adds).

One Gradescope test per rubric item, worth the item's marks, all or nothing as the rubric grades.
Its output names each failed test with what it printed, except hidden tests: those are counted
there, and each has an entry of its own, worth 0 and "hidden", for the instructor. An item not
assessed is worth 0 of 0, with the reason; an item a person grades is 0 of 0 with no status, its
marks added in Gradescope's manual grading. Every item is "visible": a student can act on it.
"""

from grading.report import BY_PERSON, rows, tail

ITEM_OUTPUT_LIMIT = 20000  # characters per entry
FAILURE_LIMIT = 1500  # characters of each failed test under its item: its end says why


def results(report, elapsed_s):
    """The results.json document."""
    tests = [person_entry(item) if item["status"] == BY_PERSON
             else item_entry(item, report["tests"]) for item in report["items"]]
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


def person_entry(item):
    """An item a person grades: 0 of 0 marks here, never shown as earned nor lost, and no status
    (Gradescope would show one as a verdict); the output says who marks it, and against what."""
    return {"name": f"{item['id']}: {item['title']} ({BY_PERSON}, up to {item['marks']:g} marks)",
            "score": 0, "max_score": 0,
            "output": f"Marked by hand against the rubric, up to {item['marks']:g} marks: not "
                      "part of the autograder's score.\n"
                      f"The reader looks for: {item['needs_human']}",
            "visibility": "visible"}


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
    if item.get("builds_on"):
        lines.append(f"Its tests also run the code of {', '.join(item['builds_on'])}: an item of "
                     "those that is lost may be why.")
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
    lines = rows(report, lambda item: item["status"])
    lines += [f"note: {note}" for note in report.get("notes", []) if note.startswith("refused")]
    by_person = report["total_graded_by_person"]
    if by_person:
        lines.append(f"The items graded by a person ({by_person:g} marks) are marked by hand "
                     "against the rubric.")
    lines.append("What each item's 'needs a human' names is read by hand as well.")
    return "\n".join(lines)
