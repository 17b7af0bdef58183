"""The grading plugin on small generated suites, run in-process by pytester: what an item earns,
loses or leaves unassessed, or leaves to a person; and the real rubric: its marks, and a home for
every test in tests/."""
import ast
import json
import re
import time
from pathlib import Path

import pytest

from tests.grading import gradescope, plugin

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

RUBRIC = """
from typing import NamedTuple

class Item(NamedTuple):
    id: str
    title: str
    marks: float
    checks: str
    needs_human: str

ITEMS = [Item("core.model", "The model", 2, "it learns", "read models.py"),
         Item("core.sync", "The sync", 3, "it averages", "read the sync"),
         Item("doc.timing", "The timing", 5, "it is measured", "read the section")]
TESTS = [("test_graded.py::test_model_", "core.model"),
         ("test_graded.py::test_sync_", "core.sync"),
         ("test_graded.py::test_timing_", "doc.timing"),
         ("test_graded.py::test_extra_", None),
         ("test_broken.py::", "core.sync")]
"""

# RUBRIC's Item has neither graded_by nor builds_on (the plugin reads "tests" and ()); this one
# has both, and an item a person grades.
RUBRIC_WITH_A_PERSON = """
from typing import NamedTuple

class Item(NamedTuple):
    id: str
    title: str
    marks: float
    checks: str
    needs_human: str
    graded_by: str = "tests"
    builds_on: tuple = ()

ITEMS = [Item("core.model", "The model", 2, "it learns", "read models.py"),
         Item("core.sync", "The sync", 3, "it averages", "read the sync",
              builds_on=("core.model",)),
         Item("doc.argument", "The argument", 4, "",
              "Read the design document: is every projection argued from the measurements, "
              "with its assumptions stated, rather than asserted?", graded_by="person")]
TESTS = [("test_graded.py::test_model_", "core.model"),
         ("test_graded.py::test_sync_", "core.sync")]
"""


@pytest.fixture(autouse=True)
def no_installed_plugins(monkeypatch):
    """The generated suites need none; re-importing hypothesis' alone cost a second per run
    (pytester forgets the modules a run imported)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def totals(report):
    """(earned, assessed, available) marks of a grade report."""
    return report["total_earned"], report["total_assessed"], report["total_available"]


def grade(pytester, source, *args, broken=None, rubric=RUBRIC):
    """Run `source` as test_graded.py under the plugin and `rubric`; the run's result, the report,
    and the report's items by id."""
    pytester.makeconftest('pytest_plugins = ["tests.grading.plugin"]')
    rubric = pytester.makepyfile(rubric_for_grading=rubric)
    pytester.makepyfile(test_graded=source)
    if broken:
        pytester.makepyfile(test_broken=broken)
    result = pytester.runpytest("-p", "no:cacheprovider", "--rubric", str(rubric),
                                "--grade-report", "out/grade.json", *args)
    report = json.loads((pytester.path / "out" / "grade.json").read_text())
    return result, report, {item["id"]: item for item in report["items"]}


def test_a_failing_test_loses_exactly_its_items_marks_and_the_other_items_are_earned(pytester):
    result, report, items = grade(pytester, """
        def test_model_learns(): pass
        def test_sync_averages(): pass
        def test_sync_sums_by_mistake(): assert 1 == 2
        def test_timing_counts(): pass
    """)
    # the plugin grades; it does not change the verdict
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert (items["core.model"]["status"], items["core.model"]["earned"]) == ("earned", 2)
    assert (items["core.sync"]["status"], items["core.sync"]["earned"]) == ("lost", 0)
    assert items["core.sync"]["tests"]["failed"] == ["test_graded.py::test_sync_sums_by_mistake"]
    assert items["core.sync"]["tests"]["passed"] == ["test_graded.py::test_sync_averages"]
    assert (items["doc.timing"]["status"], items["doc.timing"]["earned"]) == ("earned", 5)
    assert totals(report) == (7, 10, 10)
    result.stdout.fnmatch_lines(["*= rubric =*",
                                 "core.model * 2/2 * earned: 1 passed",
                                 "core.sync * 0/3 * lost: 1 failed: "
                                 "test_graded.py::test_sync_sums_by_mistake",
                                 "doc.timing * 5/5 * earned: 1 passed",
                                 "total: 7 of 10 assessed marks (10 available)"])


def test_an_item_whose_tests_were_all_skipped_is_not_assessed_and_a_partial_skip_still_earns(
        pytester):
    result, report, items = grade(pytester, """
        import pytest

        def test_model_learns(): pass

        @pytest.mark.skip(reason="needs the real data")
        def test_sync_on_real_data(): pass

        def test_sync_across_two_nodes(): pytest.skip("no cluster here")

        @pytest.mark.skipif(True, reason="needs root")
        def test_timing_on_slurm(): pass

        def test_timing_counts(): pass
    """)
    assert (items["core.sync"]["status"], items["core.sync"]["earned"]) == ("not assessed", None)
    assert len(items["core.sync"]["tests"]["skipped"]) == 2
    assert (items["doc.timing"]["status"], items["doc.timing"]["earned"]) == ("earned", 5)
    assert totals(report) == (7, 7, 10)
    result.stdout.fnmatch_lines(["core.sync * -/3 * not assessed: 2 skipped",
                                 "doc.timing * 5/5 * earned: 1 passed, 1 skipped",
                                 "total: 7 of 7 assessed marks (10 available)"])


def test_the_json_report_has_the_documented_fields_and_is_written_whole(pytester):
    _, report, items = grade(pytester, """
        def test_model_learns(): pass
        def test_sync_sums_by_mistake(): assert False
        def test_extra_bad_option_is_refused(): pass
    """)
    assert {"total_earned", "total_assessed", "total_available", "items"} <= report.keys()
    assert totals(report) == (2, 5, 10)
    assert [item["id"] for item in report["items"]] == ["core.model", "core.sync", "doc.timing"]
    for item in report["items"]:
        assert {"id", "title", "marks", "earned", "status", "tests", "needs_human"} <= item.keys()
        assert {"passed", "failed", "skipped"} <= item["tests"].keys()
    assert items["core.model"]["title"] == "The model"
    assert items["core.model"]["needs_human"] == "read models.py"
    # RUBRIC's Item has neither field: graded by tests, building on nothing
    assert (items["core.model"]["graded_by"], items["core.model"]["builds_on"]) == ("tests", [])
    assert report["total_graded_by_person"] == 0
    assert items["doc.timing"] == {**items["doc.timing"], "status": "not assessed", "earned": None}
    outside = ["test_graded.py::test_extra_bad_option_is_refused"]
    assert report["tests_outside_the_rubric"] == outside
    assert report["complete"] is True
    # no temporary file left
    assert [path.name for path in (pytester.path / "out").iterdir()] == ["grade.json"]


def test_an_error_in_a_fixture_set_up_or_teardown_loses_the_item(pytester):
    _, report, items = grade(pytester, """
        import pytest

        @pytest.fixture
        def port():
            raise OSError("address already in use")

        @pytest.fixture
        def cluster():
            yield
            raise RuntimeError("a daemon was left behind")

        def test_model_learns(port): pass
        def test_sync_averages(cluster): pass
        def test_timing_counts(): pass
    """)
    assert items["core.model"]["status"] == "lost"
    assert items["core.model"]["tests"]["failed"] == ["test_graded.py::test_model_learns"]
    assert items["core.sync"]["status"] == "lost"  # its body passed; its teardown did not
    assert items["core.sync"]["tests"] == {"passed": [],
                                           "failed": ["test_graded.py::test_sync_averages"],
                                           "skipped": [], "not_run": []}
    assert report["total_earned"] == 5


def test_a_strict_xfail_counts_as_passed_and_a_non_strict_one_as_skipped(pytester):
    _, _, items = grade(pytester, """
        import pytest

        @pytest.mark.xfail(strict=True, reason="a sum instead of a mean must be caught")
        def test_model_rejects_a_sum(): assert False

        @pytest.mark.xfail(reason="may fail")
        def test_sync_may_fail(): assert False

        @pytest.mark.xfail(reason="may fail")
        def test_sync_may_pass(): pass

        @pytest.mark.xfail(strict=True, reason="must fail")
        def test_timing_passes_unexpectedly(): pass
    """)
    assert items["core.model"]["status"] == "earned"
    assert items["core.sync"]["status"] == "not assessed"
    unexpected = ["test_graded.py::test_timing_passes_unexpectedly"]
    assert items["doc.timing"]["tests"]["failed"] == unexpected


def test_a_module_that_cannot_be_collected_loses_its_items_and_the_report_says_it_is_incomplete(
        pytester):
    result, report, items = grade(pytester, "def test_model_learns(): pass\n",
                                  broken="import a_module_the_student_forgot\n\n"
                                         "def test_anything(): pass\n")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert items["core.sync"]["status"] == "lost"
    assert items["core.sync"]["tests"]["failed"] == ["test_broken.py"]
    # collected, never run: pytest stops after the error
    assert items["core.model"]["status"] == "not assessed"
    assert items["core.model"]["tests"]["not_run"] == ["test_graded.py::test_model_learns"]
    assert report["complete"] is False
    assert any("test_broken.py" in reason for reason in report["incomplete_because"])
    result.stdout.fnmatch_lines(
        ["core.sync * 0/3 * lost: 1 failed: test_broken.py (not collected)"])


def test_a_test_marked_directly_counts_for_its_item_and_the_marker_wins_over_the_rules(pytester):
    _, _, items = grade(pytester, """
        import pytest

        @pytest.mark.rubric("doc.timing")
        def test_model_named_like_the_model_but_marked_for_timing(): assert False

        @pytest.mark.rubric("core.sync")
        def test_with_a_name_no_rule_matches(): pass

        def test_model_learns(): pass
    """)
    marked = "test_graded.py::test_model_named_like_the_model_but_marked_for_timing"
    assert items["doc.timing"]["tests"]["failed"] == [marked]
    assert items["core.model"]["status"] == "earned"
    unmatched = ["test_graded.py::test_with_a_name_no_rule_matches"]
    assert items["core.sync"]["tests"]["passed"] == unmatched


def test_a_marker_naming_an_unknown_item_is_a_usage_error(pytester):
    pytester.makeconftest('pytest_plugins = ["tests.grading.plugin"]')
    rubric = pytester.makepyfile(rubric_for_grading=RUBRIC)
    pytester.makepyfile(test_graded="""
        import pytest

        @pytest.mark.rubric("core.typo")
        def test_model_learns(): pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--rubric", str(rubric),
                                "--grade-report", "grade.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*rubric item 'core.typo' is not in*"])
    assert not (pytester.path / "grade.json").exists()


def test_the_marker_is_registered_and_selects_by_item_with_k_and_every_graded_test_with_m(pytester):
    args = ("-W", "error::pytest.PytestUnknownMarkWarning", "--strict-markers")
    source = """
        def test_model_learns(): pass
        def test_sync_averages(): pass
        def test_extra_bad_option_is_refused(): pass
    """
    result, report, items = grade(pytester, source, *args, "-k", "core.sync")
    result.assert_outcomes(passed=1, deselected=2)
    assert items["core.model"]["status"] == "not assessed"
    assert report["incomplete_because"] == ["1 test of the rubric deselected"]
    result, _, _ = grade(pytester, source, *args, "-m", "rubric")
    result.assert_outcomes(passed=2, deselected=1)


def test_a_test_in_no_rubric_item_is_named_in_the_summary_and_the_report(pytester):
    source = "def test_model_learns(): pass\ndef test_forgotten(): pass\n"
    result, report, _ = grade(pytester, source)
    assert report["tests_in_no_rubric_item"] == ["test_graded.py::test_forgotten"]
    result.stdout.fnmatch_lines(
        ["1 test in no rubric item (map them in *): test_graded.py::test_forgotten"])


def test_an_item_graded_by_a_person_is_never_earned_by_tests_and_is_left_out_of_the_assessed_marks(
        pytester):
    result, report, items = grade(pytester, """
        def test_model_learns(): pass
        def test_sync_sums_by_mistake(): assert False
    """, rubric=RUBRIC_WITH_A_PERSON)
    argument = items["doc.argument"]
    assert (argument["status"], argument["earned"]) == ("graded by a person", None)
    assert argument["graded_by"] == "person"
    assert argument["tests"] == {"passed": [], "failed": [], "skipped": [], "not_run": []}
    # the report keeps what the person needs: the marks, the title, what to read
    assert (argument["marks"], argument["title"]) == (4, "The argument")
    assert argument["needs_human"].startswith("Read the design document")
    assert (items["core.sync"]["graded_by"], items["core.sync"]["builds_on"]) == ("tests",
                                                                                ["core.model"])
    # earned 2 of the 5 the tests assessed; 9 available, 4 of them left to the person
    assert totals(report) == (2, 5, 9)
    assert report["total_graded_by_person"] == 4
    assert report["complete"] is True
    # what the person reads, shortened to a line
    result.stdout.fnmatch_lines(["doc.argument * -/4 * graded by a person: Read the design "
                                 "document: is every projection *...",
                                 "total: 2 of 5 assessed marks (9 available; 4 graded by a "
                                 "person)"])


def test_results_json_shows_an_item_graded_by_a_person_as_neither_earned_nor_lost(pytester):
    _, report, _ = grade(pytester, "def test_model_learns(): pass\n", rubric=RUBRIC_WITH_A_PERSON)
    document = gradescope.results({**report, "tests": []}, 1.0)
    entries = {entry["name"].split(":")[0]: entry for entry in document["tests"]}
    argument = entries["doc.argument"]
    assert argument["name"] == "doc.argument: The argument (graded by a person, up to 4 marks)"
    # 0 of 0 marks, and no status: Gradescope shows no verdict
    assert (argument["score"], argument["max_score"]) == (0, 0)
    assert "status" not in argument
    assert "Marked by hand against the rubric" in argument["output"]
    assert "is every projection argued from the measurements" in argument["output"]
    assert document["score"] == 2
    assert "(9 available; 4 graded by a person)" in document["output"]
    # an item the tests grade says whose code its tests also run
    assert "also run the code of core.model" in entries["core.sync"]["output"]


def test_a_rule_or_a_marker_giving_tests_to_an_item_a_person_grades_is_a_usage_error(pytester):
    pytester.makeconftest('pytest_plugins = ["tests.grading.plugin"]')
    rule = RUBRIC_WITH_A_PERSON.replace('"core.sync")]', '"core.sync"), ("test_", "doc.argument")]')
    rubric = pytester.makepyfile(rubric_for_grading=rule)
    pytester.makepyfile(test_graded="def test_model_learns(): pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--rubric", str(rubric))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*rule 'test_' gives tests to item 'doc.argument', which a "
                                 "person grades*"])
    rubric = pytester.makepyfile(rubric_for_grading=RUBRIC_WITH_A_PERSON)
    pytester.makepyfile(test_graded="""
        import pytest

        @pytest.mark.rubric("doc.argument")
        def test_the_argument(): pass
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "--rubric", str(rubric))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*rubric item 'doc.argument' is graded by a person*"])


def test_the_rubric_gives_the_code_most_marks_and_leaves_each_design_section_to_a_person():
    rubric = plugin.load_rubric(plugin.DEFAULT_RUBRIC)
    items = list(rubric.items.values())
    # the code's items carry at least 60% of all marks
    code = sum(item.marks for item in items if item.id.startswith("core."))
    assert code >= 0.6 * sum(item.marks for item in items)
    # every section of the design document is read by a person; its numbers are checked
    sections = [item for item in items
                if item.id.startswith("design.") and item.id != "design.numbers"]
    assert sections and all(item.graded_by == "person" for item in sections)
    # an item is checked by tests or graded by a person; a reader knows what to look for in each
    assert all(item.checks or item.graded_by == "person" for item in items)
    assert all(item.needs_human for item in items)
    # builds_on names other items of the rubric
    assert all(set(item.builds_on) <= set(rubric.items) - {item.id} for item in items)


def test_every_test_in_the_suite_has_a_place_in_the_rubric_and_every_item_has_tests():
    """By name, without importing the suite; an item a person grades has none. A parametrized test
    no rule matches by name may name its item in its parameters ("[mlp-manual-flat-2]"), where
    its module has rules for them ("tests/test_gradient_sync.py::*-flat-"): it counts for their
    items, and is checked at run time (the summary names a test in no item)."""
    rubric = plugin.load_rubric(plugin.DEFAULT_RUBRIC)
    assessed = set()
    for module in sorted(TESTS.glob("test_*.py")):
        by_parameters = items_named_by_parameters(rubric, module.name)
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                ids = rubric.items_for(f"tests/{module.name}::{node.name}")
                if ids is None and by_parameters and is_parametrized(node):
                    ids = by_parameters
                assert ids is not None, (f"tests/{module.name}::{node.name} is in no rubric "
                                         "item: map it in rubric.py")
                assessed.update(ids)
    has_design_doc = (TESTS / "test_design_doc.py").exists()
    expected = {item_id for item_id in rubric.items if not rubric.by_person(item_id)
                and (item_id.startswith("core.") or has_design_doc)}
    assert expected <= assessed


def items_named_by_parameters(rubric, module):
    """The items of the rules that match a module's tests by their parameters, not their names."""
    prefix = f"tests/{module}::*".lower()
    return {item_id for pattern, ids in rubric.rules if pattern.startswith(prefix)
            for item_id in ids}


def is_parametrized(function):
    """Whether a test function carries @pytest.mark.parametrize."""
    return any("parametrize" in ast.unparse(decorator) for decorator in function.decorator_list)


def test_grading_md_lists_every_rubric_item_with_its_marks_in_the_rubrics_order():
    rubric = plugin.load_rubric(plugin.DEFAULT_RUBRIC)
    grading = (TESTS.parent / "GRADING.md").read_text()
    rows = re.findall(r"^\| `([\w.]+)`[^|]*\| ([\d.]+) \|", grading, re.M)
    assert rows == [(item.id, f"{item.marks:g}") for item in rubric.items.values()]


def test_the_watchdog_times_a_test_from_when_it_read_its_start_not_from_what_the_event_claims():
    from tests.grading.record import Tests

    tests = Tests()
    before = time.time()
    tests.apply({"event": "start", "time": 0.0, "nodeid": "tests/test_a.py::test_b"})
    # an event claiming the epoch began the test would otherwise look 56 years old (or, claiming
    # the future, never time out)
    assert tests.started["tests/test_a.py::test_b"] >= before
    assert tests.last_event >= before
