"""A tiny assignment for grading/tests/test_grade.py: an instructor's repository and a submission.

The instructor's repository has the real grading plugin with a small rubric (one item of it
graded by a person) and profile, and tests that pass or fail, or whose child hangs or crashes; the
tests call the submission's module in a child process, as the real ones do (STUDENT_CODE); the
submission has that module, and what a submission must not be able to do: a conftest.py that
would skip every test, and its own copy of a test file.
"""
import os
import shutil
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RUBRIC = """
from typing import NamedTuple


class Item(NamedTuple):  # without builds_on: the plugin reads it as ()
    id: str
    title: str
    marks: float
    checks: str
    needs_human: str
    graded_by: str = "tests"


ITEMS = [Item(name, name.title(), marks, f"checks {name}", "-")
         for name, marks in ITEM_MARKS]
ITEMS.append(Item("doc.prose", "The prose", 2, "", "Read the document: is it argued?",
                  graded_by="person"))
"""
ITEM_MARKS = (("core.fast", 2), ("core.hang", 3), ("core.crash", 1), ("core.fail", 4),
              ("core.later", 5))

CONFTEST = """
pytest_plugins = ["grading.plugin"]
"""

# tests/student_code.py: the submission's answer(), called in a child process in the sandbox, as
# grading/launch.py calls the real assignment's code; only its printed JSON comes back.
# Where test_hang.py's child leaves a file before its test is killed (test_later.py looks).
LEFT_BY_A_HUNG_TEST = "/tmp/left-by-a-hung-test-of-the-synthetic-assignment"
STUDENT_CODE = f"""
import json

from grading.sandbox import run_interpreter

LEFT_BY_A_HUNG_TEST = {LEFT_BY_A_HUNG_TEST!r}


def answer(*args):
    code = f"import json, student; print(json.dumps(student.answer(*{{args!r}})))"
    done = run_interpreter(["-c", code], timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])
"""

TESTS = {
    "test_fast.py": """
        import pytest

        from tests.student_code import answer

        pytestmark = pytest.mark.rubric("core.fast")


        def test_the_answer():
            assert answer() == 42


        def test_outside_profile_would_fail_if_it_ran():
            assert False
    """,
    "test_hang.py": """
        import pytest

        from grading.sandbox import run_interpreter
        from tests.student_code import LEFT_BY_A_HUNG_TEST

        pytestmark = pytest.mark.rubric("core.hang")

        # a file of the child user's left in /tmp, and a grandchild in a session of its own
        HANG = f\"\"\"
        import subprocess, sys, time
        open({LEFT_BY_A_HUNG_TEST!r}, 'w').close()
        subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],
                         start_new_session=True)
        time.sleep(600)
        \"\"\"


        def test_hangs_with_a_child_in_its_own_session():
            run_interpreter(["-c", HANG], timeout=600)


        def test_hangs_as_well():
            run_interpreter(["-c", "import time; time.sleep(600)"], timeout=600)
    """,
    "test_crash.py": """
        import signal

        import pytest

        from grading.sandbox import run_interpreter

        pytestmark = pytest.mark.rubric("core.fast")


        @pytest.mark.rubric("core.crash")
        def test_dies():
            crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
            done = run_interpreter(["-c", crash])
            assert done.returncode == 0, f"killed by {signal.Signals(-done.returncode).name}"


        def test_survives():
            pass
    """,
    "test_integrity.py": """
        import pytest


        @pytest.mark.rubric("core.fail")  # a hidden module's
        def test_hidden_check_fails():
            assert False, "the hidden check's detail"
    """,
    "test_later.py": """
        import os

        import pytest

        from tests.student_code import LEFT_BY_A_HUNG_TEST


        @pytest.mark.rubric("core.later")
        def test_nothing_of_the_killed_run_is_left():
            assert not os.path.lexists(LEFT_BY_A_HUNG_TEST)


        @pytest.mark.rubric("core.later")
        def test_runs_after_the_hang_and_the_crash():
            print("printed by the later test")
    """,
    "test_not_in_profile.py": "import no_such_module\n",
}

SUBMISSION = {
    "student.py": "def answer():\n    return 42\n",
    # What a submission must not be able to do: replace the tests, reconfigure pytest.
    "conftest.py": "import pytest\n\n\ndef pytest_runtest_setup(item):\n"
                   "    pytest.skip('the submission skips everything')\n",
    "tests/test_hang.py": "def test_hangs_with_a_child_in_its_own_session():\n    pass\n",
}

PROFILE = """
HIDDEN_TESTS = ("tests/test_integrity.py",)
TASK_FILES = ()
PROFILE = LEFT_OUT = TIMEOUTS = ()
DEFAULT_TIMEOUT_S = 60
BUDGET_S = 300


def in_profile(nodeid):
    return "outside_profile" not in nodeid


def collects(path):
    return path != "tests/test_not_in_profile.py"


def timeout_for(nodeid, default):
    return default


def is_hidden(nodeid):
    return nodeid.startswith(HIDDEN_TESTS)
"""


def write_files(root, files):
    """Write {relative path: text} under root."""
    for relative, text in files.items():
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as file:
            file.write(textwrap.dedent(text).lstrip())


def instructor_repository(root, tests=None, item_marks=ITEM_MARKS):
    """The real plugin with a small rubric of `item_marks` ((id, marks), ...) and a person's
    item, a profile, and the given test modules."""
    grading = os.path.join(root, "grading")
    shutil.copytree(os.path.join(REPO, "grading"), grading,
                    ignore=shutil.ignore_patterns("__pycache__", "rubric.py", "profile.py",
                                                  "handout", "tests"))
    write_files(root, {"tests/__init__.py": "", "tests/conftest.py": CONFTEST,
                       "tests/student_code.py": STUDENT_CODE,
                       "grading/rubric.py": f"ITEM_MARKS = {item_marks!r}\n" + RUBRIC,
                       "grading/profile.py": PROFILE,
                       "pyproject.toml": "[tool.pytest.ini_options]\ntestpaths = ['tests']\n"})
    write_files(os.path.join(root, "tests"), tests or TESTS)
    return root


def uids_of(report):
    """The range of uids a grading's children ran as, from its report's notes; empty if none."""
    for note in report["notes"]:
        if note.startswith("student code ran as uids "):
            first = int(note.split()[5])
            return range(first, first + 256)
    return range(0)
