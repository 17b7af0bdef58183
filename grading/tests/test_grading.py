"""The grading plugin on small generated suites, run in-process by pytester: what an item earns,
loses or leaves unassessed, or leaves to a person, each test bound to its items by its closest
rubric marker; and the real rubric: its marks, and tests in tests/ naming every item."""
import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grading import gradescope, plugin
from grading.profile import is_hidden
from grading.rubric import ITEMS

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[2] / "tests"  # the project's, which the rubric grades

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
"""


@pytest.fixture(autouse=True)
def no_installed_plugins(monkeypatch):
    """The generated suites need none; re-importing hypothesis' alone cost a second per run
    (pytester forgets the modules a run imported)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def totals(report):
    """(earned, assessed, available) marks of a grade report."""
    return report["total_earned"], report["total_assessed"], report["total_available"]


def write(pytester, relative, source):
    """Write `source`, dedented, to `relative` under pytester's folder; its path."""
    path = pytester.path / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).strip() + "\n")
    return path


def set_up(pytester, rubric):
    """The plugin in pytester's conftest, and `rubric` where the real one lives: a broken module's
    items are read from its file, found relative to the folder above the rubric's tests/."""
    pytester.makeconftest('pytest_plugins = ["grading.plugin"]')
    return write(pytester, "grading/rubric.py", rubric)


def grade(pytester, source, *args, broken=None, rubric=RUBRIC):
    """Run `source` as test_graded.py under the plugin and `rubric`; the run's result, the report,
    and the report's items by id."""
    rubric = set_up(pytester, rubric)
    write(pytester, "test_graded.py", source)
    if broken:
        write(pytester, "test_broken.py", broken)
    result = pytester.runpytest("-p", "no:cacheprovider", "--rubric", str(rubric),
                                "--grade-report", "out/grade.json", *args)
    report = json.loads((pytester.path / "out" / "grade.json").read_text())
    return result, report, {item["id"]: item for item in report["items"]}


def test_a_failing_test_loses_exactly_its_items_marks_and_the_other_items_are_earned(pytester):
    result, report, items = grade(pytester, """
        import pytest

        @pytest.mark.rubric("core.model")
        def test_model_learns(): pass

        @pytest.mark.rubric("core.sync")
        def test_sync_averages(): pass

        @pytest.mark.rubric("core.sync")
        def test_sync_sums_by_mistake(): assert 1 == 2

        @pytest.mark.rubric("doc.timing")
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

        @pytest.mark.rubric("core.model")
        def test_model_learns(): pass

        @pytest.mark.rubric("core.sync")
        @pytest.mark.skip(reason="needs the real data")
        def test_sync_on_real_data(): pass

        @pytest.mark.rubric("core.sync")
        def test_sync_across_two_nodes(): pytest.skip("no cluster here")

        @pytest.mark.skipif(True, reason="needs root")
        @pytest.mark.rubric("doc.timing")
        def test_timing_on_slurm(): pass

        @pytest.mark.rubric("doc.timing")
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
        import pytest

        @pytest.mark.rubric("core.model")
        def test_model_learns(): pass

        @pytest.mark.rubric("core.sync")
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
    # a test without a marker is outside the rubric: there is no "in no item" any more
    outside = ["test_graded.py::test_extra_bad_option_is_refused"]
    assert report["tests_outside_the_rubric"] == outside
    assert "tests_in_no_rubric_item" not in report
    assert report["complete"] is True
    # no temporary file left
    assert [path.name for path in (pytester.path / "out").iterdir()] == ["grade.json"]


SPREAD = """
    import pytest

    @pytest.mark.rubric("core.model")
    def test_model_learns(): pass

    @pytest.mark.rubric("core.sync")
    def test_sync_sums_by_mistake(): assert False

    @pytest.mark.rubric("core.sync")
    @pytest.mark.xfail(strict=True)
    def test_sync_fails_as_it_must(): assert False

    def test_outside(): pass
"""


def test_under_pytest_xdist_the_table_grades_what_the_workers_ran_and_a_report_runs_here(
        pytester, monkeypatch):
    """The suite runs on workers (pyproject.toml): they collect, and the process that gathers
    their reports never sees a test's markers, nor what -k left out."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))  # for the workers
    rubric = set_up(pytester, RUBRIC)
    write(pytester, "test_graded.py", SPREAD)
    spread = pytester.runpytest("-p", "no:cacheprovider", "--rubric", str(rubric),
                                "-p", "xdist", "-n", "2")
    spread.stdout.fnmatch_lines(["*2 workers*", "core.model * 2/2 * earned: 1 passed",
                                 "core.sync * 0/3 * lost: 1 failed*",
                                 "total: 2 of 5 assessed marks (10 available)"])
    # a grade report needs the deselected tests too: its run stays in one process
    result, report, items = grade(pytester, SPREAD, "-p", "xdist", "-n", "2", "-k", "not mistake")
    result.stdout.fnmatch_lines(["--grade-report: the tests run in this process*"])
    assert "2 workers" not in result.stdout.str()
    assert items["core.sync"]["tests"]["passed"] == ["test_graded.py::test_sync_fails_as_it_must"]
    assert report["incomplete_because"] == ["1 test of the rubric deselected"]
    assert report["tests_outside_the_rubric"] == ["test_graded.py::test_outside"]


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

        @pytest.mark.rubric("core.model")
        def test_model_learns(port): pass

        @pytest.mark.rubric("core.sync")
        def test_sync_averages(cluster): pass

        @pytest.mark.rubric("doc.timing")
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

        @pytest.mark.rubric("core.model")
        @pytest.mark.xfail(strict=True, reason="a sum instead of a mean must be caught")
        def test_model_rejects_a_sum(): assert False

        @pytest.mark.rubric("core.sync")
        @pytest.mark.xfail(reason="may fail")
        def test_sync_may_fail(): assert False

        @pytest.mark.rubric("core.sync")
        @pytest.mark.xfail(reason="may fail")
        def test_sync_may_pass(): pass

        @pytest.mark.rubric("doc.timing")
        @pytest.mark.xfail(strict=True, reason="must fail")
        def test_timing_passes_unexpectedly(): pass
    """)
    assert items["core.model"]["status"] == "earned"
    assert items["core.sync"]["status"] == "not assessed"
    unexpected = ["test_graded.py::test_timing_passes_unexpectedly"]
    assert items["doc.timing"]["tests"]["failed"] == unexpected


def test_a_module_that_cannot_be_collected_loses_the_items_its_markers_name_and_is_incomplete(
        pytester):
    result, report, items = grade(pytester, """
        import pytest

        @pytest.mark.rubric("core.model")
        def test_model_learns(): pass
    """, broken="""
        import pytest

        import a_module_the_student_forgot

        pytestmark = pytest.mark.rubric("core.sync")

        @pytest.mark.parametrize("case", [pytest.param(1, marks=pytest.mark.rubric("doc.timing"))])
        def test_anything(case): pass
    """)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    # both the module's marker and a case's, read from its source without importing it
    for item_id in ("core.sync", "doc.timing"):
        assert items[item_id]["status"] == "lost"
        assert items[item_id]["tests"]["failed"] == ["test_broken.py"]
    # collected, never run: pytest stops after the error
    assert items["core.model"]["status"] == "not assessed"
    assert items["core.model"]["tests"]["not_run"] == ["test_graded.py::test_model_learns"]
    assert report["complete"] is False
    assert any("test_broken.py" in reason for reason in report["incomplete_because"])
    result.stdout.fnmatch_lines(
        ["core.sync * 0/3 * lost: 1 failed: test_broken.py (not collected)"])


def test_the_closest_rubric_marker_wins_and_an_empty_one_or_none_is_outside_the_rubric(pytester):
    _, report, items = grade(pytester, """
        import pytest

        pytestmark = pytest.mark.rubric("core.model")

        def test_by_the_module(): pass

        @pytest.mark.rubric("core.sync")
        def test_by_the_function(): assert False

        @pytest.mark.rubric()
        def test_left_out_by_an_empty_marker(): assert False

        @pytest.mark.parametrize("case", [
            1, pytest.param(2, marks=pytest.mark.rubric("doc.timing")),
            pytest.param(3, marks=pytest.mark.rubric())])
        def test_by_the_case(case): assert case != 3

        @pytest.mark.rubric("core.model", "doc.timing")
        def test_of_two_items(): pass
    """)
    graded = "test_graded.py::"
    assert items["core.model"]["tests"]["passed"] == [graded + "test_by_the_module",
                                                      graded + "test_by_the_case[1]",
                                                      graded + "test_of_two_items"]
    assert items["core.sync"]["tests"]["failed"] == [graded + "test_by_the_function"]
    assert items["doc.timing"]["tests"]["passed"] == [graded + "test_by_the_case[2]",
                                                      graded + "test_of_two_items"]
    # failing outside the rubric costs nothing
    assert report["tests_outside_the_rubric"] == [graded + "test_left_out_by_an_empty_marker",
                                                  graded + "test_by_the_case[3]"]
    assert totals(report) == (7, 10, 10)


def test_a_case_s_rubric_marker_wins_over_its_function_s(pytester):
    _, report, items = grade(pytester, """
        import pytest

        @pytest.mark.rubric("core.sync")
        @pytest.mark.parametrize("case", [
            1, pytest.param(2, marks=pytest.mark.rubric("doc.timing")),
            pytest.param(3, marks=pytest.mark.rubric())])
        def test_by_the_case(case): assert case != 3
    """)
    graded = "test_graded.py::test_by_the_case"
    assert items["core.sync"]["tests"]["passed"] == [graded + "[1]"]
    assert items["doc.timing"]["tests"]["passed"] == [graded + "[2]"]
    # an empty marker on a case takes it out of its function's item: its failure costs nothing
    assert report["tests_outside_the_rubric"] == [graded + "[3]"]
    assert totals(report) == (8, 8, 10)


def test_a_rubric_s_leftover_rules_bind_no_test(pytester):
    rules = RUBRIC + 'TESTS = [("test_graded.py::", "core.model")]\n'
    _, report, items = grade(pytester, "def test_model_learns(): pass\n", rubric=rules)
    assert items["core.model"]["status"] == "not assessed"
    assert report["tests_outside_the_rubric"] == ["test_graded.py::test_model_learns"]


def test_a_marker_naming_an_unknown_item_is_a_usage_error(pytester):
    rubric = set_up(pytester, RUBRIC)
    write(pytester, "test_graded.py", """
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
        import pytest

        @pytest.mark.rubric("core.model")
        def test_model_learns(): pass

        @pytest.mark.rubric("core.sync")
        def test_sync_averages(): pass

        def test_extra_bad_option_is_refused(): pass
    """
    result, report, items = grade(pytester, source, *args, "-k", "core.sync")
    result.assert_outcomes(passed=1, deselected=2)
    assert items["core.model"]["status"] == "not assessed"
    assert report["incomplete_because"] == ["1 test of the rubric deselected"]
    result, _, _ = grade(pytester, source, *args, "-m", "rubric")
    result.assert_outcomes(passed=2, deselected=1)


def test_under_the_grading_profile_a_test_without_an_item_or_an_item_without_tests_is_an_error(
        pytester):
    # test_timing.py is in the real profile, its test_tensorboard_without* left out of it
    rubric = set_up(pytester, RUBRIC_WITH_A_PERSON)
    args = ("-p", "no:cacheprovider", "--rubric", str(rubric), "--grade-profile")
    write(pytester, "tests/test_timing.py", """
        import pytest

        @pytest.mark.rubric("core.model")
        def test_counts(): pass

        def test_forgotten(): pass

        @pytest.mark.rubric()
        def test_left_out_by_an_empty_marker(): pass

        def test_tensorboard_without_the_package(): pass
    """)
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*tests/test_timing.py::test_forgotten is in the grading profile but in no rubric item*"])
    result.stderr.fnmatch_lines(["*tests/test_timing.py::test_left_out_by_an_empty_marker is in "
                                 "the grading profile but in no rubric item*"])
    result.stderr.fnmatch_lines(["*rubric item 'core.sync' has no test*"])
    # a test left out of the profile needs no item, nor does an item a person grades
    assert "test_tensorboard_without_the_package" not in result.stderr.str()
    assert "doc.argument" not in result.stderr.str()
    # every test of the profile in an item, every item the tests grade named: the run grades
    write(pytester, "tests/test_timing.py", """
        import pytest

        @pytest.mark.rubric("core.model")
        def test_counts(): pass

        @pytest.mark.rubric("core.sync")
        def test_averages(): pass

        def test_tensorboard_without_the_package(): pass
    """)
    result = pytester.runpytest(*args, "--grade-report", "grade.json")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=2, deselected=1)
    report = json.loads((pytester.path / "grade.json").read_text())
    assert totals(report) == (5, 5, 9)
    assert report["tests_outside_the_rubric"] == []


def test_an_item_graded_by_a_person_is_never_earned_by_tests_and_is_left_out_of_the_assessed_marks(
        pytester):
    result, report, items = grade(pytester, """
        import pytest

        @pytest.mark.rubric("core.model")
        def test_model_learns(): pass

        @pytest.mark.rubric("core.sync")
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
    source = "import pytest\n\n@pytest.mark.rubric('core.model')\ndef test_model_learns(): pass\n"
    _, report, _ = grade(pytester, source, rubric=RUBRIC_WITH_A_PERSON)
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


@pytest.mark.parametrize("marked", [
    '@pytest.mark.rubric("doc.argument")\ndef test_the_argument(): pass\n',
    'pytestmark = pytest.mark.rubric("core.model", "doc.argument")\n'
    'def test_the_argument(): pass\n',
    '@pytest.mark.parametrize("case", [pytest.param(1, marks=pytest.mark.rubric("doc.argument"))])'
    '\ndef test_the_argument(case): pass\n',
], ids=["function", "module", "case"])
def test_a_marker_giving_tests_to_an_item_a_person_grades_is_a_usage_error(pytester, marked):
    rubric = set_up(pytester, RUBRIC_WITH_A_PERSON)
    write(pytester, "test_graded.py", "import pytest\n\n" + marked)
    result = pytester.runpytest("-p", "no:cacheprovider", "--rubric", str(rubric))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_the_argument*: rubric item 'doc.argument' is graded by a "
                                 "person*"])


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
    # each item once, with marks, graded by tests or by a person
    assert len(items) == len(ITEMS) and all(item.marks > 0 for item in items)
    assert all(item.graded_by in ("tests", "person") for item in items)


def test_items_named_in_reads_every_form_of_the_marker_without_importing_the_module(tmp_path):
    module = tmp_path / "test_module.py"
    module.write_text(textwrap.dedent("""
        import pytest
        import a_module_the_student_forgot

        pytestmark = [pytest.mark.rubric("core.model"), pytest.mark.slow]

        @pytest.mark.rubric("core.sync", "core.model")
        def test_function(): pass

        @pytest.mark.parametrize("case", [pytest.param(1, marks=pytest.mark.rubric("doc.timing"))])
        def test_case(case): pass

        @pytest.mark.rubric()
        def test_outside(): pass
    """))
    assert sorted(plugin.items_named_in(module)) == ["core.model", "core.sync", "doc.timing"]
    # a module that cannot be parsed or read names nothing, rather than stopping the grading
    module.write_text("def test_unfinished(:\n")
    assert plugin.items_named_in(module) == []
    assert plugin.items_named_in(tmp_path / "test_missing.py") == []


def test_every_marker_in_the_suite_names_an_item_the_tests_grade_and_public_tests_name_each():
    """By the markers' source, without importing the suite: a module that cannot be collected loses
    exactly these items. An item a person grades has none; at run time --grade-profile also
    refuses a test of the profile in no item (grading/tests/test_grade.py runs it on the real
    suite)."""
    rubric = plugin.load_rubric(plugin.DEFAULT_RUBRIC)
    public = set()
    for module in sorted(TESTS.glob("test_*.py")):
        ids = plugin.items_named_in(module)
        name = f"tests/{module.name}"
        unknown = [item_id for item_id in ids if item_id not in rubric.items]
        assert not unknown, f"{name} names items not in rubric.py: {unknown}"
        by_person = [item_id for item_id in ids if rubric.by_person(item_id)]
        assert not by_person, f"{name} gives tests to items a person grades: {by_person}"
        # the student's copy has no hidden module: each item needs tests the student can run
        if not is_hidden(name):
            public.update(ids)
    has_design_doc = (TESTS / "test_design_doc.py").exists()
    expected = {item_id for item_id in rubric.items if not rubric.by_person(item_id)
                and (item_id.startswith("core.") or has_design_doc)}
    assert not expected - public, f"items no public test module names: {expected - public}"


def test_every_rubric_marker_in_the_suite_names_its_items_literally():
    """A module that cannot be collected loses the items its source names, read without running
    it: an item passed through a variable (`pytest.mark.rubric(item)`) would be lost by no one."""
    computed = []
    for module in sorted(TESTS.glob("test_*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "rubric"
                    and not all(isinstance(arg, ast.Constant) for arg in node.args)):
                computed.append(f"tests/{module.name}:{node.lineno}: {ast.unparse(node)}")
    assert not computed, "write each item's id in the marker: " + "; ".join(computed)


def test_grading_md_lists_every_rubric_item_with_its_marks_in_the_rubrics_order():
    rubric = plugin.load_rubric(plugin.DEFAULT_RUBRIC)
    grading = (TESTS.parent / "GRADING.md").read_text()
    rows = re.findall(r"^\| `([\w.]+)`[^|]*\| ([\d.]+) \|", grading, re.M)
    assert rows == [(item.id, f"{item.marks:g}") for item in rubric.items.values()]



def test_in_the_judge_every_test_module_imports_without_running_task_code():
    # a constant computed by task code at import would fail every test of its module in the judge,
    # though each passes in a student's own run
    code = ("import importlib, pathlib\n"
            "import grading.judge_guard\n"
            "for path in sorted(pathlib.Path('tests').glob('test_*.py')):\n"
            "    importlib.import_module(f'tests.{path.stem}')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=TESTS.parent, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_in_the_judge_every_function_and_method_of_a_task_module_raises():
    # the judge's guard, loaded as grade.py loads it: no verdict rests on task code run there
    code = ("import grading.judge_guard\n"
            "from analysis import cost_model\n"
            "for call in (lambda: cost_model.ring_coefficients(4),\n"
            "             lambda: cost_model.Fit.__init__(None)):\n"
            "    try:\n"
            "        call()\n"
            "    except grading.judge_guard.TaskCodeInTheJudge:\n"
            "        continue\n"
            "    raise SystemExit('task code ran in the judge')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=TESTS.parent, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
