"""The grade of a watched run (runner.py): the plugin's grading, over the events of every restart.

The plugin's rule stands: an item earns its marks when every one of its tests that ran passed,
and earns 0 when any failed (a timeout and a crash are failures). Two cases are added, because
here the grader, not the test, ended the run:
- a test the budget did not reach proves nothing either way: an item that lost none of its tests
  but had some cut by the budget is "not assessed", with the reason, never earned on a part;
- when pytest could not collect any test (a conftest that does not import, a hang at import),
  every item is lost, with pytest's last words as the reason.
An item a person grades has no tests: neither case touches it; it stays "graded by a person".
"""
from tests.grading.plugin import Grading, load_rubric
from tests.grading.report import BY_PERSON, tests_count, totals


def grade_report(tests, failure, rubric_path):
    """The plugin-shaped grade report of the merged `tests` (record.Tests)."""
    grading = Grading(load_rubric(rubric_path), None)
    grading.members = dict(tests.members)
    grading.outcomes = dict(tests.outcomes)
    grading.outside = list(tests.outside)
    grading.broken_modules = list(tests.broken_modules)
    report = grading.grade([])
    # The plugin can only say "never run"; the grader knows why.
    report["incomplete_because"] = reasons_of(tests, failure) + [
        reason for reason in report["incomplete_because"] if not reason.endswith("never run")]
    report["complete"] = not report["incomplete_because"]
    for item in report["items"]:
        if item["status"] == BY_PERSON:
            continue  # no test of this run could change it
        if failure:
            lose_everything(item, failure)
        elif item["status"] == "earned" and any(nodeid in tests.budget_cut
                                                for nodeid in item["tests"]["not_run"]):
            item.update(status="not assessed", earned=None,
                        because="the grading budget ran out before some of its tests")
    report.update(totals(report["items"]))
    return report


def lose_everything(item, failure):
    """An item of a run where no test could be collected: lost, for that reason."""
    item.update(status="lost", earned=0, because=failure.splitlines()[0])


def reasons_of(tests, failure):
    """Why the grades may not be the whole story: the grader's own interventions."""
    reasons = []
    if failure:
        reasons.append(failure.splitlines()[0])
    timed_out = [nodeid for nodeid, text in tests.outputs.items()
                 if text.startswith("timed out") and tests.outcomes.get(nodeid) == "failed"]
    if timed_out:
        reasons.append(f"{tests_count(len(timed_out))} timed out (killed with their processes)")
    if tests.budget_cut:
        reasons.append(f"the budget ran out: {tests_count(len(tests.budget_cut))} not run")
    left_out = [why for nodeid, why in tests.not_run.items() if nodeid not in tests.budget_cut]
    for why in dict.fromkeys(left_out):
        reasons.append(f"{tests_count(left_out.count(why))} {why}")
    silent = [nodeid for nodeid in tests.members
              if nodeid not in tests.outcomes and nodeid not in tests.not_run]
    if silent:
        reasons.append(f"{tests_count(len(silent))} of the rubric never reported an outcome")
    return reasons


def test_entries(tests, report, hidden):
    """Every graded test with its items, outcome, time and, unless it passed, its output; and
    each module that could not be collected, with the items it counts for."""
    entries = []
    for nodeid, ids in tests.members.items():
        outcome = tests.outcomes.get(nodeid, "not_run")
        entry = {"nodeid": nodeid, "items": list(ids), "outcome": outcome,
                 "duration_s": round(tests.durations.get(nodeid, 0.0), 2),
                 "hidden": hidden(nodeid)}
        if outcome != "passed":
            entry["output"] = tests.outputs.get(nodeid, "")
        entries.append(entry)
    for module, output in tests.broken_modules.items():
        ids = [item["id"] for item in report["items"] if module in item["tests"]["failed"]]
        entries.append({"nodeid": module, "items": ids, "outcome": "failed", "duration_s": 0.0,
                        "hidden": hidden(module),
                        "output": f"could not be collected:\n{output}"})
    return entries
