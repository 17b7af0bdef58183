"""grade.py, the grading run: on tiny synthetic assignments, a test whose child hangs is killed
at its timeout and the others still run, a crashing child fails its test only, the budget leaves
tests "not run", a submission cannot replace the instructor's tests, and both reports are written.

The tiny assignment (grading/tests/tiny_assignment.py) is an instructor's repository (the real
plugin, a small rubric, tests that pass or fail, or whose child hangs or crashes) and a submission
(a module the tests import). Timeouts of a few seconds keep this module well under a minute.
"""
import contextlib
import hashlib
import json
import os
import subprocess
import sys

import pytest

import grade
from grading import calibration, gradescope, leftovers, profile, sandbox
from grading.tests.tiny_assignment import (
    LEFT_BY_A_HUNG_TEST,
    REPO,
    SUBMISSION,
    TESTS,
    instructor_repository,
    uids_of,
    write_files,
)

TIMEOUT_S = 4


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One grading of the synthetic assignment: the report, and the files the run left."""
    root = tmp_path_factory.mktemp("grading")
    instructor = instructor_repository(str(root / "instructor"))
    submission = str(root / "submission")
    write_files(submission, SUBMISSION)
    with contextlib.suppress(FileNotFoundError):  # an earlier grading's, whose users are gone
        os.unlink(LEFT_BY_A_HUNG_TEST)
    report = grade.grade(submission, TIMEOUT_S, 120, instructor)
    return {"report": report, "submission": submission,
            "left": leftovers.processes_of(set(uids_of(report)))}


def by_nodeid(report):
    return {test["nodeid"]: test for test in report["tests"]}


def items(report):
    return {item["id"]: item for item in report["items"]}


def test_a_test_whose_child_hangs_is_killed_at_its_timeout_with_its_processes_and_others_run(
        graded):
    tests = by_nodeid(graded["report"])
    hang = tests["tests/test_hang.py::test_hangs_with_a_child_in_its_own_session"]
    assert hang["outcome"] == "failed"
    assert f"timed out after {TIMEOUT_S} s" in hang["output"]
    assert hang["duration_s"] < TIMEOUT_S + 5
    # its item is lost: the sibling that would hang as well is not run
    sibling = tests["tests/test_hang.py::test_hangs_as_well"]
    assert sibling["outcome"] == "not_run" and "core.hang already lost" in sibling["output"]
    assert tests["tests/test_later.py::test_runs_after_the_hang_and_the_crash"]["outcome"] == \
        "passed"
    # the hung child's own child, in a session of its own, is gone too
    assert graded["left"] == [], "a process of the grading left running"


def test_a_crash_of_student_code_fails_its_test_only_and_pytest_runs_once(graded):
    tests = by_nodeid(graded["report"])
    dead = tests["tests/test_crash.py::test_dies"]
    assert dead["outcome"] == "failed" and "killed by SIGSEGV" in dead["output"]
    assert tests["tests/test_crash.py::test_survives"]["outcome"] == "passed"
    assert [run["ended"] for run in graded["report"]["runs"]] == ["exited"]


def test_items_are_graded_all_or_nothing(graded):
    report = graded["report"]
    statuses = {item_id: item["status"] for item_id, item in items(report).items()}
    assert statuses == {"core.fast": "earned", "core.hang": "lost", "core.crash": "lost",
                        "core.fail": "lost", "core.later": "earned",
                        "doc.prose": "graded by a person"}
    # the person's 2 marks are available, never assessed by the tests
    assert (report["total_earned"], report["total_assessed"]) == (7, 15)
    assert (report["total_available"], report["total_graded_by_person"]) == (17, 2)
    assert not any("outside_profile" in nodeid for nodeid in by_nodeid(report))
    # a module outside the profile is not even imported: its import error does not count
    assert not any("could not collect" in reason for reason in report["incomplete_because"])
    assert report["complete"], report["incomplete_because"]


def test_the_instructors_tests_ran_not_the_submissions(graded):
    report = graded["report"]
    # the submission's conftest.py would have skipped every test (the judge never reads it), its
    # test_hang.py passed
    assert items(report)["core.fast"]["tests"]["passed"]
    assert any("tests/" in note for note in report["notes"])


def test_the_report_records_the_sha256_of_every_submitted_file(graded):
    files = graded["report"]["files"]
    assert sorted(files) == sorted(os.path.normpath(path) for path in SUBMISSION)
    for relative, digest in files.items():
        with open(os.path.join(graded["submission"], relative), "rb") as file:
            assert digest == hashlib.sha256(file.read()).hexdigest()


def test_results_json_has_gradescopes_schema_one_test_per_item_and_hides_hidden_tests(graded):
    document = gradescope.results(graded["report"], 12.3)
    assert document["score"] == 7 and document["execution_time"] == 12
    entries = {entry["name"].split(":")[0]: entry for entry in document["tests"]}
    for entry in document["tests"]:
        assert {"name", "score", "max_score", "output", "visibility"} <= entry.keys()
        # Gradescope's optional status: none for the item a person grades (no verdict)
        assert entry.get("status", "none") in ("passed", "failed", "none")
        assert entry["visibility"] in ("hidden", "after_due_date", "after_published", "visible")
    prose = entries["doc.prose"]
    assert prose["name"] == "doc.prose: The prose (graded by a person, up to 2 marks)"
    assert (prose["score"], prose["max_score"]) == (0, 0) and "status" not in prose
    assert "Read the document: is it argued?" in prose["output"]
    assert (entries["core.later"]["score"], entries["core.later"]["max_score"]) == (5, 5)
    assert (entries["core.fail"]["score"], entries["core.fail"]["status"]) == (0, "failed")
    assert "1 hidden test(s) of this item failed" in entries["core.fail"]["output"]
    visible = "\n".join(entry["output"] for entry in document["tests"]
                        if entry["visibility"] != "hidden")
    assert "the hidden check's detail" not in visible and "test_integrity" not in visible
    hidden = entries["tests/test_integrity.py"]
    assert hidden["visibility"] == "hidden" and "the hidden check's detail" in hidden["output"]
    assert "timed out after" in entries["core.hang"]["output"]


def test_the_budget_leaves_the_tests_it_did_not_reach_not_run_and_their_item_not_assessed(
        tmp_path):
    slow = {"test_later.py": "import time\n\nimport pytest\n\n"
                             "pytestmark = pytest.mark.rubric('core.later')\n\n\n" + "".join(
        f"def test_slow_{number}():\n    time.sleep(2)\n\n\n" for number in range(8))}
    instructor = instructor_repository(str(tmp_path / "instructor"), slow,
                                       item_marks=(("core.later", 5),))
    submission = str(tmp_path / "submission")
    write_files(submission, {"student.py": ""})
    report = grade.grade(submission, TIMEOUT_S, 6, instructor)
    outcomes = [test["outcome"] for test in report["tests"]]
    assert "not_run" in outcomes and "failed" not in outcomes
    cut = [test for test in report["tests"] if test["outcome"] == "not_run"]
    assert all("grading budget of 6 s ran out" in test["output"] for test in cut)
    later = items(report)["core.later"]
    assert later["status"] == "not assessed" and later["earned"] is None
    assert any("budget ran out" in reason for reason in report["incomplete_because"])


def test_a_submission_that_does_not_import_loses_the_items_of_those_tests_with_the_reason(
        tmp_path):
    instructor = instructor_repository(str(tmp_path / "instructor"),
                                       {name: TESTS[name] for name in ("test_fast.py",
                                                                       "test_later.py")},
                                       item_marks=(("core.fast", 2), ("core.later", 5)))
    submission = str(tmp_path / "submission")
    write_files(submission, {"student.py": "def answer(:\n"})
    report = grade.grade(submission, TIMEOUT_S, 120, instructor)
    assert items(report)["core.fast"]["status"] == "lost"
    assert items(report)["core.later"]["status"] == "earned"
    broken = by_nodeid(report)["tests/test_fast.py::test_the_answer"]
    assert broken["outcome"] == "failed" and "SyntaxError" in broken["output"]


def test_when_no_test_can_be_collected_every_item_is_lost_and_results_json_says_why(
        tmp_path, monkeypatch, capsys):
    instructor = instructor_repository(str(tmp_path / "instructor"), {"test_later.py": "\n"})
    with open(os.path.join(instructor, "tests", "conftest.py"), "a") as file:
        file.write("raise ImportError('no helpers here')\n")  # an autograder built wrong
    submission = str(tmp_path / "submission")
    write_files(submission, {"student.py": ""})
    monkeypatch.setattr(grade, "INSTRUCTOR", instructor)
    paths = [str(tmp_path / "out" / "grade.json"), str(tmp_path / "out" / "results.json")]
    # a budget and timeout given: no calibration (two runs of its workload, tested above)
    assert grade.main([submission, "--report", paths[0], "--gradescope", paths[1],
                       "--timeout-per-test", str(TIMEOUT_S), "--budget", "60"]) == 0
    with open(paths[0]) as file:
        report = json.load(file)
    # every item is lost but the one a person grades: no test could have earned it
    statuses = {item["id"]: item["status"] for item in report["items"]}
    assert statuses.pop("doc.prose") == "graded by a person"
    assert set(statuses.values()) == {"lost"}
    assert "no helpers here" in report["failure"]
    with open(paths[1]) as file:
        results = json.load(file)
    assert results["score"] == 0
    assert all("pytest could not run the tests" in entry["output"]
               for entry in results["tests"] if not entry["name"].startswith("doc.prose"))
    assert "total: 0 of 15 assessed marks" in capsys.readouterr().out


def test_when_the_grader_itself_fails_results_json_still_says_why_and_it_exits_1(
        tmp_path, monkeypatch):
    def broken(*args, **options):
        raise OSError("disk full")

    monkeypatch.setattr(grade, "grade", broken)
    path = str(tmp_path / "results.json")
    assert grade.main([str(tmp_path), "--gradescope", path, "--budget", "9",
                       "--timeout-per-test", "3"]) == 1
    with open(path) as file:
        results = json.load(file)
    assert results["score"] == 0 and "OSError: disk full" in results["output"]


@pytest.mark.parametrize("arguments", [["/no/such/folder"], [".", "--budget", "0"],
                                       [".", "--timeout-per-test", "soon"]])
def test_bad_input_is_one_line_and_exit_code_2(arguments):
    done = subprocess.run([sys.executable, os.path.join(REPO, "grade.py"), *arguments],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_the_calibration_stretches_default_budget_and_timeouts_on_a_slower_machine_only(
        monkeypatch):
    reference = calibration.REFERENCE_S
    # a faster machine keeps them, a slower one stretches them, up to a run inside 10 minutes
    assert calibration.stretch(reference / 2) == 1.0
    assert calibration.stretch(reference * 1.5) == pytest.approx(1.5)
    assert calibration.stretch(reference * 10) == calibration.MAX_STRETCH
    assert profile.BUDGET_S * calibration.MAX_STRETCH < 600
    # the defaults are stretched by what was measured, the named tests' own timeouts too...
    monkeypatch.setattr(calibration, "measure", lambda: reference * 1.5)
    timeout_s, budget_s, record = grade.calibrated(grade.parse([]))
    assert (timeout_s, budget_s) == pytest.approx((1.5 * profile.DEFAULT_TIMEOUT_S,
                                                   1.5 * profile.BUDGET_S))
    assert record == pytest.approx({"measured_s": reference * 1.5, "reference_s": reference,
                                    "stretch": 1.5})
    # ...and what the command line gives is taken as it is, with nothing measured
    monkeypatch.setattr(calibration, "measure", lambda: pytest.fail("measured"))
    given = grade.parse(["--timeout-per-test", "7", "--budget", "70"])
    assert grade.calibrated(given) == (7, 70, {"stretch": 1.0})


def test_every_profile_pattern_selects_rubric_tests_and_every_item_keeps_tests():
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "--grade-profile", "--rubric-tests"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    selected = [line.strip() for line in done.stdout.splitlines() if line.startswith("    ")]
    # A student's copy has no hidden test files: their patterns may select nothing there only.
    absent = [module for module in profile.HIDDEN_TESTS
              if not os.path.exists(os.path.join(REPO, module))]
    unmatched = [pattern for pattern in profile.PROFILE
                 if not any(profile.matches(nodeid, pattern) for nodeid in selected)
                 and pattern.split("::")[0] not in absent]
    assert not unmatched, f"profile patterns that select nothing: {unmatched}"
    assert "outside the rubric: 0 tests" in done.stdout
    for line in done.stdout.splitlines():
        if " marks): " in line:  # "core.mlp (2 marks): 10 tests"
            assert not line.endswith(": 0 tests"), line


def test_the_real_mnist_reaches_the_tests_as_an_absolute_path_from_a_relative_variable(
        tmp_path, monkeypatch):
    """CI sets OFFLINE_DATA_DIR=../shared/data; the tests run in a scratch folder, where that
    named nothing and the accuracy test skipped (the solution lost core.mlp)."""
    instructor = str(tmp_path / "instructor")
    for name in sandbox.MNIST_FILES:
        write_files(str(tmp_path / "data" / "MNIST" / "raw"), {name: ""})
    monkeypatch.chdir(tmp_path / "data")
    monkeypatch.setenv("OFFLINE_DATA_DIR", os.path.join("..", "data"))
    assert grade.environment(instructor)["OFFLINE_DATA_DIR"] == str(tmp_path / "data")
    monkeypatch.setenv("OFFLINE_DATA_DIR", "no-such-folder")
    assert "OFFLINE_DATA_DIR" not in grade.environment(instructor)
