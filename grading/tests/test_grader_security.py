"""Submissions that try to fool grade.py, on a tiny synthetic assignment: each must earn nothing,
and still leave a valid results.json that names what was refused.

The instructor's repository (grading/tests/tiny_assignment.py's plugin and rubric) grades one item,
core.fast (2 marks), with two tests of `student.answer()`: one alone, one on "the real MNIST"
(a folder the grader holds). Each calls it in a child process in the sandbox, as the real tests
call the assignment's code (grading/sandbox.py). Every submission here answers 41 on the
real data, or not at all, and adds one trick. grade.py runs as it does on Gradescope: a process
of its own, as root (the tricks that reach the grader's files through /proc are stopped only
there: student code then runs as an unprivileged user), here with a fake MNIST folder and a small
budget, so each grading takes a few seconds.
"""
import contextlib
import ctypes
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from grading import leftovers
from grading.tests.tiny_assignment import REPO, instructor_repository, uids_of, write_files

HIDDEN_SECRET = "the-hidden-tests-secret-7d3f"
TESTS = {
    "test_fast.py": """
        import os

        import pytest

        from tests.student_code import answer

        pytestmark = pytest.mark.rubric("core.fast")


        @pytest.fixture
        def real_data():
            folder = os.environ.get("OFFLINE_DATA_DIR")
            if not folder:
                pytest.skip("the real MNIST is not here: set OFFLINE_DATA_DIR")
            return folder


        def test_the_answer():
            assert answer() == 42


        def test_the_answer_on_the_real_data(real_data):
            assert answer(real_data) == 42
    """,
    # the tiny assignment's hidden module: graded, never shown, never where student code reads it
    "test_integrity.py": f"""
        import pytest

        from tests.student_code import answer
        from tests.test_fast import real_data  # noqa: F401 (a fixture)

        pytestmark = pytest.mark.rubric("core.fail")


        def test_the_hidden_check(real_data):
            assert answer(real_data) == 42  # {HIDDEN_SECRET}
    """,
}
# Right without the data, wrong with it: earns 2 marks only if the real-data test does not fail.
WRONG_ON_DATA = "def answer(data=None):\n    return 41 if data else 42\n"

# Where the tests' paths are, as a student would know them: in where.json beside student.py (the
# children's environment names no folder they cannot see).
WHERE = """
import json as _json
import os as _os

with open(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "where.json")) as _file:
    WHERE = _json.load(_file)
"""

# Student code's way to the grader: up its ancestors to the first whose command line holds an
# option, and that option's value.
ANCESTOR_WITH = """
import json, os, signal, time


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as file:
        stat = file.read()
    return int(stat[stat.rfind(")") + 2:].split()[1])


def ancestor_with(option):
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            words = file.read().decode().split("\\0")
        if option in words:
            return pid, words[words.index(option) + 1]
        pid = parent_of(pid)
    return None, None
"""

# Reads the hidden test module wherever it might be (the sandbox it runs in, the folders its
# environment names, which grade.py's own would, and the folder of each process above it: the
# judge's) and puts what it read, hex-encoded, into the error of every answer: a visible test's
# failure would show it.
READ_THE_HIDDEN_TESTS = ANCESTOR_WITH + """
folders, pid = [os.getcwd()], os.getpid()
folders += [os.environ[name] for name in ("PWD", "OLDPWD", "HOME") if name in os.environ]
while pid > 1:
    pid = parent_of(pid)
    try:
        folders.append(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        pass
found = []
for folder in folders:
    try:
        with open(os.path.join(folder, "tests", "test_integrity.py")) as file:
            found.append(file.read())
    except OSError:
        pass


def answer(data=None):
    raise NotImplementedError("".join(found).encode().hex() or "found nothing")
"""

# A process that leaves its session, waits for grade.py to exit, then writes full marks into the
# results.json named on grade.py's command line.
DAEMON = WHERE + ANCESTOR_WITH + """
pid, results = ancestor_with("--gradescope")
if results and os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(WHERE["daemon_pid_file"], "w") as file:
            file.write(str(os.getpid()))
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.05)
        time.sleep(0.5)
        with open(results, "w") as file:
            file.write('{"score": 25, "tests": []}')
    os._exit(0)
"""

# Finds the one pytest whose command line names the grade report grade.py reads, and the
# folders it and grade.py run in.
FIND_THE_JUDGE = ANCESTOR_WITH + """
JUDGE, REPORT = ancestor_with("--grade-report")
if JUDGE is None:
    raise SystemExit("no judge found")
# the folders the judge and grade.py (its parent) run in: each reads grading/rubric.py
FOLDERS = [os.readlink(f"/proc/{pid}/cwd") for pid in (JUDGE, parent_of(JUDGE))]
"""

# Writes a report of full marks where the judge's goes, then kills the judge: grade.py would read
# it as the plugin's.
FORGE_THE_REPORT = FIND_THE_JUDGE + """
with open(REPORT, "w") as file:
    json.dump({"total_earned": 6, "total_assessed": 6, "total_available": 6,
               "total_graded_by_person": 0, "complete": True, "incomplete_because": [],
               "items": [], "tests": []}, file)
os.kill(JUDGE, signal.SIGKILL)
os._exit(0)
"""

# Takes the failing real-data test out of the rubric in the test module the judge and grade.py
# read, so that core.fast is earned on the other (as root, refused: they are not the child user's;
# without root, too late: items are taken from the run's first collection).
REWRITE_RUBRIC = FIND_THE_JUDGE + """
for folder in FOLDERS:
    with open(os.path.join(folder, "tests", "test_fast.py"), "a") as file:
        file.write("test_the_answer_on_the_real_data = pytest.mark.rubric()("
                   "test_the_answer_on_the_real_data)\\n")
"""

# Registers, in whatever pytest runs in its process, a plugin that turns every report into a pass.
PLUGIN_IN_PROCESS = """
import gc

import pytest


class AllPass:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        outcome.get_result().outcome = "passed"


for thing in gc.get_objects():
    if type(thing).__name__ == "Config" and hasattr(thing, "pluginmanager"):
        thing.pluginmanager.register(AllPass(), "all-pass")
"""

# Links a root-only file into every folder it may write: a grader that chowned such a folder's
# contents would hand that file over. The answer is right only if the file became readable.
LINKS_A_ROOT_FILE = WHERE + """
import os, tempfile

SECRET = WHERE["root_only_file"]
for folder in (tempfile.gettempdir(), os.path.expanduser("~"), os.getcwd(), "/tmp"):
    try:
        os.symlink(SECRET, os.path.join(folder, f"link-{os.getpid()}"))
    except OSError:
        pass


def answer(data=None):
    try:
        with open(SECRET):
            return 42
    except OSError:
        return 41 if data else 42
"""

# Plants a module among the instructor's tests in the sandbox, which later children import from:
# right only if it could.
WRITES_THE_TESTS = """
import os

try:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests",
                           "planted.py"), "w") as file:
        file.write("PLANTED = True\\n")
    PLANTED = True
except OSError:
    PLANTED = False


def answer(data=None):
    return 42 if PLANTED or not data else 41
"""

# The first test's child leaves a file in /tmp that any user may read; a later test's child,
# the one with the data, is right only if it finds it there.
LEFT_FOR_LATER = "/tmp/left-by-an-earlier-test-of-the-grader"
LEAVES_A_FILE_FOR_LATER = f"""
import os

LEFT = {LEFT_FOR_LATER!r}
EARLIER = os.path.exists(LEFT)
try:
    with open(LEFT, "w") as file:
        file.write("42")
    os.chmod(LEFT, 0o666)
except OSError:
    pass


def answer(data=None):
    return 42 if EARLIER or not data else 41
"""

# Leaves a file in a folder any user may write that is none of the shared temporary folders the
# grader empties (an image may have one: WORLD_WRITABLE, made by the test outside /tmp); the
# child with the data is right only if an earlier one's file is there.
LEAVES_A_FILE_IN_A_WORLD_WRITABLE_FOLDER = WHERE + """
import os

LEFT = os.path.join(WHERE["world_writable"], "left")
EARLIER = os.path.exists(LEFT)
try:
    open(LEFT, "w").close()
except OSError:
    pass


def answer(data=None):
    return 42 if EARLIER or not data else 41
"""

# Runs the instructor's own answer, from the folder grade.py was started in ($PWD, which every
# child inherited), any folder its environment names, or the autograder's, whose path is known:
# right only if it found one.
RUNS_THE_INSTRUCTORS_ANSWER = WHERE + """
import os

FOUND = None
for folder in [WHERE.get("autograder_source", "")] + [
        folder for name in sorted(os.environ) for folder in os.environ[name].split(os.pathsep)]:
    path = os.path.join(folder, "solution", "student.py")
    if FOUND is None and os.path.isabs(folder) and os.path.isfile(path):
        FOUND = {}
        with open(path) as file:
            exec(file.read(), FOUND)


def answer(data=None):
    return FOUND["answer"](data) if FOUND else 41 if data else 42
"""

# Leaves a System V shared memory segment that any user may read; a later child, the one with the
# data, is right only if it finds it (a hidden test's child could leave a hidden test so).
SYSTEM_V_KEY = 0x6b1d0000 | os.getpid() & 0xFFFF  # this session's: none left by an earlier one
LEAVES_A_SYSTEM_V_SEGMENT = f"""
import ctypes

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.shmat.restype = ctypes.c_void_p
EARLIER = LIBC.shmget({SYSTEM_V_KEY}, 0, 0) >= 0
if not EARLIER:
    segment = LIBC.shmget({SYSTEM_V_KEY}, 4096, 0o1000 | 0o666)  # IPC_CREAT
    ctypes.memmove(LIBC.shmat(segment, None, 0), b"42", 2)


def answer(data=None):
    return 42 if EARLIER or not data else 41
"""

TRICKS = {
    "forges the grade report": {"student.py": FORGE_THE_REPORT + WRONG_ON_DATA},
    "rewrites the rubric": {"student.py": REWRITE_RUBRIC + WRONG_ON_DATA},
    "registers a pytest plugin": {"student.py": PLUGIN_IN_PROCESS + WRONG_ON_DATA},
    # the real-data test skips, which must not leave its item earned on the other test alone
    "pops the data variable": {"student.py": "import os\nos.environ.pop('OFFLINE_DATA_DIR')\n"
                                             + WRONG_ON_DATA},
    "links to the rubric": {"student.py": WRONG_ON_DATA, "pyproject.toml": "LINK:rubric"},
    "shadows pytest's dependency": {
        "student.py": WRONG_ON_DATA,
        "iniconfig.py": "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
                        "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
                        "    outcome.get_result().outcome = 'passed'\n",
    },
    "hooks python's start-up": {"student.py": WRONG_ON_DATA,
                                "sitecustomize.py": "print('hooked')\n",
                                "evil.pth": "import os\n",
                                "runtime/conftest.py": "print('hooked')\n"},
    "a daemon rewrites the results": {"student.py": DAEMON + WRONG_ON_DATA},
    "reads the hidden tests": {"student.py": READ_THE_HIDDEN_TESTS},
    "writes 1.1 GiB": {"student.py": "import os, tempfile\n\n\ndef answer(data=None):\n"
                                     "    big = os.path.join(tempfile.gettempdir(), 'big')\n"
                                     "    with open(big, 'wb') as file:\n"
                                     "        for _ in range(1100):\n"
                                     "            file.write(bytes(2**20))\n"
                                     "    return 42\n"},
    # 600 MiB printed before each answer: under the file-size limit, so it all reaches the grader
    "prints 600 MiB": {"student.py": "import sys\nfor _ in range(600):\n"
                                     "    sys.stdout.write('x' * 2**20)\n" + WRONG_ON_DATA},
    "links a root file into its folders": {"student.py": LINKS_A_ROOT_FILE},
    "writes the instructor's tests": {"student.py": WRITES_THE_TESTS},
    "leaves a file for a later test": {"student.py": LEAVES_A_FILE_FOR_LATER},
    "leaves a file in a world-writable folder": {
        "student.py": LEAVES_A_FILE_IN_A_WORLD_WRITABLE_FOLDER},
    "runs the instructor's answer": {"student.py": RUNS_THE_INSTRUCTORS_ANSWER},
    "leaves a System V segment for a later test": {"student.py": LEAVES_A_SYSTEM_V_SEGMENT},
    "needs 4 GiB": {"student.py": "def answer(data=None):\n    memory = bytearray(4 * 2**30)\n"
                                  "    return 42 + memory[-1]\n"},
}



def fake_mnist(folder):
    """The grader's MNIST folder: the four file names are all it checks."""
    raw = os.path.join(folder, "MNIST", "raw")
    os.makedirs(raw)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        open(os.path.join(raw, name), "wb").close()
    return folder


# Runs the command it is given, then prints on its last line of stderr the largest resident set,
# in KiB, of any process below it that was waited for: grade.py, the judge, student processes.
PEAK_MEMORY = ("import resource, subprocess, sys\n"
               "code = subprocess.run(sys.argv[1:]).returncode\n"
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
               "sys.exit(code)\n")


def instructor_and_submission(root, files):
    """A synthetic instructor's repository with grade.py and its own answer, and a submission of
    `files` ("LINK:rubric" makes a link to the instructor's rubric); (instructor, submission, env:
    grade.py's, started in the instructor's folder)."""
    instructor = instructor_repository(str(root / "instructor"), TESTS,
                                       item_marks=(("core.fast", 2), ("core.fail", 4)))
    shutil.copy(os.path.join(REPO, "grade.py"), instructor)
    write_files(instructor, {"solution/student.py": "def answer(data=None):\n    return 42\n"})
    rubric = os.path.join(instructor, "grading", "rubric.py")
    submission = root / "submission"
    write_files(str(submission), {name: text for name, text in files.items()
                                  if not text.startswith("LINK:")})
    for name, text in files.items():
        if text == "LINK:rubric":
            os.symlink(rubric, submission / name)
    secret = root / "root-only"  # a file of root's that no other user may read
    secret.write_text("the grader's\n")
    secret.chmod(0o600)
    env = dict(os.environ, OFFLINE_DATA_DIR=fake_mnist(str(root / "mnist")), PWD=instructor,
               OLDPWD=instructor)
    return instructor, submission, env


@contextlib.contextmanager
def places_for_the_tricks(root, submission, **known):
    """Where the tricks look (where.json beside student.py): a root-only file, a folder any user
    may write that is none of the shared temporary ones (only the child's view keeps it), where
    the daemon leaves its pid (not in root's tmp_path), and the `known` paths."""
    drop = tempfile.mkdtemp(prefix="grader-security-")
    os.chmod(drop, 0o777)
    world_writable = tempfile.mkdtemp(prefix="grader-security-", dir=WORLD_WRITABLE_IN)
    os.chmod(world_writable, 0o777)
    where = {"root_only_file": str(root / "root-only"), "world_writable": world_writable,
             "daemon_pid_file": os.path.join(drop, "daemon.pid"), **known}
    (submission / "where.json").write_text(json.dumps(where))
    try:
        yield where
    finally:
        if os.path.exists(where["daemon_pid_file"]):  # a daemon, had it outlived the grading,
            time.sleep(1)  # has had time to act (any other process left fails the test anyway)
            shutil.copy(where["daemon_pid_file"], root / "daemon.pid")
        shutil.rmtree(drop)
        shutil.rmtree(world_writable)


def grade_in_a_process(root, files, options=()):
    """grade.py, copied into a synthetic instructor's repository, on a submission of `files`
    ("LINK:rubric" makes a link to the instructor's rubric), with grade.py's `options`; (report,
    results.json, output, the largest resident set of a process of the grading, in bytes)."""
    instructor, submission, env = instructor_and_submission(root, files)
    report, results = root / "report.json", root / "results.json"
    grade = [sys.executable, "grade.py", str(submission), "--report", str(report),
             "--gradescope", str(results), "--timeout-per-test", "20", "--budget", "60", *options]
    with places_for_the_tricks(root, submission):
        done = subprocess.run([sys.executable, "-c", PEAK_MEMORY, *grade], cwd=instructor,
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    peak_bytes = int(done.stderr.splitlines()[-1]) * 1024
    return (json.loads(report.read_text()), json.loads(results.read_text()),
            done.stdout + done.stderr, peak_bytes)


def another_user_can_run_python():
    """Whether grade.py here can run student code as another user: root, and an interpreter that
    a user of no account (grade.py's children) may run."""
    if os.geteuid() != 0:
        return False
    try:
        subprocess.run([sys.executable, "-c", "pass"], user=2**24, group=2**24, extra_groups=[],
                       cwd="/", check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def namespaces_refused():
    """Why grade.py's children cannot have namespaces of their own here; None if they can."""
    if os.geteuid() != 0:
        return "only root makes them"
    import grade
    work = tempfile.mkdtemp()
    try:
        for name in ("submission", "scratch"):
            os.mkdir(os.path.join(work, name))
        return grade.namespaces_refused(2**24 + 1, os.path.join(work, "submission"),
                                        os.path.join(work, "scratch"), work, REPO)
    finally:
        shutil.rmtree(work)


def left_by_the_grading(report):
    """What a user of this grading's children (the range its report names: another grading on
    the machine has its own) left behind: files in the shared temporary folders, System V IPC
    objects, processes."""
    uids = set(uids_of(report))
    found = [f"process {pid}" for pid in leftovers.processes_of(uids)]
    found += [f"{kind} {identifier}" for kind, identifier in leftovers.ipc_objects_of(*uids)]
    for folder in leftovers.SHARED_FOLDERS:
        if os.path.isdir(folder):
            found += [entry.path for entry in os.scandir(folder)
                      if entry.stat(follow_symlinks=False).st_uid in uids]
    return found


@pytest.fixture
def open_folder():
    """A folder of root's that any user may enter and read, as an instructor's checkout or
    /autograder is (pytest's own temporary folders are root's alone, which would hide what the
    grader must)."""
    folder = tempfile.mkdtemp(prefix="grader-security-")
    os.chmod(folder, 0o755)
    yield pathlib.Path(folder)
    shutil.rmtree(folder)


def test_the_honest_submission_earns_its_marks(open_folder):
    honest = {"student.py": "def answer(data=None):\n    return 42\n"}
    report, results, _, _ = grade_in_a_process(open_folder, honest)
    # core.fast's 2 marks, and the hidden test's item core.fail's 4
    assert report["total_earned"] == results["score"] == 6


# Stopped only where student code runs as another user than the grader's (as root).
AS_ROOT_ONLY = ("forges the grade report", "reads the hidden tests",
                "links a root file into its folders", "writes the instructor's tests",
                "leaves a file for a later test", "runs the instructor's answer",
                "leaves a System V segment for a later test")
# Stopped only where each launch has namespaces of its own (as root, where Linux allows).
WITH_NAMESPACES_ONLY = ("leaves a file in a world-writable folder",)
WORLD_WRITABLE_IN = "/var/lib"  # none of the shared temporary folders
# The tricks that reach for the instructor's checkout, the hidden tests, or a later test, graded
# with the fallback too, as where Linux refuses namespaces (grade.py --no-namespaces): the others
# meet the same defences either way.
IN_THE_FALLBACK_TOO = ("reads the hidden tests", "runs the instructor's answer",
                       "leaves a System V segment for a later test",
                       "leaves a file for a later test")
CONTAINMENTS = {"namespaces": (), "fallback": ("--no-namespaces",)}


def skip_unless_contained(trick, containment):
    """Skip where this machine cannot contain student code the way `trick` needs."""
    if trick in AS_ROOT_ONLY + WITH_NAMESPACES_ONLY and not another_user_can_run_python():
        why = ("grade.py stops this only as root, where another user can run this Python (see "
               ".ci/run): student code then runs as users of the grading's own")
        if os.environ.get("CI"):
            pytest.fail(f"CI must run this test; {why}")
        pytest.skip(why)
    if containment == "namespaces" and trick in WITH_NAMESPACES_ONLY and namespaces_refused():
        pytest.skip(f"grade.py stops this only with namespaces: {namespaces_refused()}")


@pytest.mark.parametrize("trick, containment",
                         [(trick, "namespaces") for trick in TRICKS]
                         + [(trick, "fallback") for trick in IN_THE_FALLBACK_TOO])
def test_a_trick_earns_nothing_and_results_json_says_what_was_refused(open_folder, trick,
                                                                      containment):
    skip_unless_contained(trick, containment)
    if os.path.lexists(LEFT_FOR_LATER):
        os.unlink(LEFT_FOR_LATER)
    report, results, output, peak_bytes = grade_in_a_process(open_folder, TRICKS[trick],
                                                             CONTAINMENTS[containment])
    # nothing earned, in the report and in what Gradescope reads
    assert report["total_earned"] == 0 and results["score"] == 0, output
    assert [test["name"] for test in results["tests"]][0].startswith("core.fast")
    refused = [note for note in report["notes"] if note.startswith("refused")]
    if trick == "links to the rubric":
        assert refused == ["refused pyproject.toml: a symbolic link (it could point at the "
                           "grader's files): submit the file itself"]
        assert "refused pyproject.toml" in results["output"]
    if trick != "links to the rubric":  # the judge imports nothing of the sandbox's
        assert refused == []
    if trick == "pops the data variable":  # in its own process: the tests still see the data
        lost = [test["nodeid"] for test in report["tests"] if test["outcome"] == "failed"]
        assert lost == ["tests/test_fast.py::test_the_answer_on_the_real_data",
                        "tests/test_integrity.py::test_the_hidden_check"]
    if trick == "reads the hidden tests":  # the student's page shows neither the module nor its hex
        shown = json.dumps([results["output"]] + [test for test in results["tests"]
                                                  if test["visibility"] != "hidden"])
        assert HIDDEN_SECRET not in shown and HIDDEN_SECRET.encode().hex() not in shown
        assert "found nothing" in shown
    if trick == "prints 600 MiB":  # what comes back of a stream is at most a MiB
        assert peak_bytes < 600 * 2**20, f"a process of the grading held {peak_bytes} bytes"
    if trick == "a daemon rewrites the results" and os.path.exists(open_folder / "daemon.pid"):
        with open(open_folder / "daemon.pid") as file:  # where it could leave its pid at all
            assert not os.path.exists(f"/proc/{int(file.read())}")  # killed and reaped
    secret = os.stat(open_folder / "root-only")  # handed to no other user, whatever the trick
    assert (secret.st_uid, secret.st_gid, secret.st_mode & 0o777) == (0, 0, 0o600)
    # the report says how the children were held
    expected = "namespaces: yes" if containment == "namespaces" and not namespaces_refused() \
        else "namespaces: no"
    assert any(note.startswith(expected) for note in report["notes"]), report["notes"]
    # without namespaces, a checkout any user may read is named as not contained
    exposed = [note for note in report["notes"] if note.startswith("not contained: ")]
    assert len(exposed) == (expected == "namespaces: no"), report["notes"]
    if trick == "leaves a file for a later test":  # nor left behind by the grading
        assert not os.path.lexists(LEFT_FOR_LATER)
    # no file, IPC object or process of the grading's users outlives it
    assert not left_by_the_grading(report)
    if trick in ("writes 1.1 GiB", "needs 4 GiB"):  # right answers, past the limits
        lost = [test for test in report["tests"] if test["outcome"] == "failed"]
        assert ("File too large" if "writes" in trick else "MemoryError") in lost[0]["output"]


# The tricks that reach for the grader's state, the results, a root file, the instructor's
# folder or a later test: where the layout differs from grade.py's own (the others act in the
# same grade.py, graded above).
IN_THE_LAYOUT = ("forges the grade report", "a daemon rewrites the results",
                 "links a root file into its folders", "runs the instructor's answer",
                 "reads the hidden tests", "leaves a System V segment for a later test")


@pytest.mark.parametrize("trick, containment",
                         [(trick, "namespaces") for trick in IN_THE_LAYOUT]
                         + [(trick, "fallback") for trick in IN_THE_LAYOUT
                            if trick in ("runs the instructor's answer", "reads the hidden tests")])
def test_a_trick_earns_nothing_through_run_autograder_in_gradescopes_layout(open_folder, trick,
                                                                            containment):
    if not another_user_can_run_python():
        pytest.skip("as root only: Gradescope runs the autograder as root")
    instructor, submission, env = instructor_and_submission(open_folder, TRICKS[trick])
    root = open_folder / "autograder"  # /autograder: source (the zip), submission, results
    shutil.copytree(instructor, root / "source")
    shutil.copy(os.path.join(REPO, "grading", "handout", "run_autograder"), root / "source")
    shutil.copytree(submission, root / "submission", symlinks=True)
    shutil.copytree(env["OFFLINE_DATA_DIR"], root / "data")
    # as Gradescope starts it: in the autograder's source folder
    env.update(AUTOGRADER_ROOT=str(root), PYTHON=sys.executable, PWD=str(root / "source"))
    with places_for_the_tricks(open_folder, root / "submission",
                               autograder_source=str(root / "source")):
        done = subprocess.run([str(root / "source" / "run_autograder"), "--timeout-per-test",
                               "20", "--budget", "60", *CONTAINMENTS[containment]], env=env,
                              timeout=120, capture_output=True, text=True)
    results = json.loads((root / "results" / "results.json").read_text())
    assert done.returncode == 0 and results["score"] == 0, done.stdout + done.stderr
    assert results["tests"][0]["name"].startswith("core.fast"), results["output"]
    shown = json.dumps([results["output"]] + [test for test in results["tests"]
                                              if test["visibility"] != "hidden"])
    assert HIDDEN_SECRET not in shown and HIDDEN_SECRET.encode().hex() not in shown
    secret = os.stat(open_folder / "root-only")
    assert (secret.st_uid, secret.st_mode & 0o777) == (0, 0o600)


# --- The primitives of containment (grading/sandbox.py), as root --------------------------
def as_root_with_a_child_user(function):
    """Run `function(sandbox, uid)` with sandbox.Child set to a uid of no account's, as grade.py
    does."""
    if os.geteuid() != 0:
        pytest.skip("only root changes users")
    from grading import sandbox
    uid = 2**24 + 1
    saved = (sandbox.Child.uid, sandbox.Child.handed_over)
    sandbox.Child.uid, sandbox.Child.handed_over = uid, []
    try:
        function(sandbox, uid)
    finally:
        sandbox.Child.uid, sandbox.Child.handed_over = saved


def test_only_an_empty_folder_is_handed_over_and_never_through_a_link(tmp_path):
    def check(sandbox, uid):
        secret = tmp_path / "secret"
        secret.write_text("root's")
        full = tmp_path / "full"
        full.mkdir()
        os.symlink(secret, full / "link")
        with pytest.raises(RuntimeError, match="only empty folders"):
            sandbox.hand_over(str(full))
        os.symlink(full, tmp_path / "link-to-a-folder")
        with pytest.raises(OSError):
            sandbox.hand_over(str(tmp_path / "link-to-a-folder"))
        empty = tmp_path / "empty"
        empty.mkdir()
        assert sandbox.hand_over(str(empty)) == str(empty)
        assert os.stat(empty).st_uid == uid and os.stat(secret).st_uid == 0
    as_root_with_a_child_user(check)


def test_settling_kills_the_users_processes_and_removes_the_links_it_left():
    def check(sandbox, uid):
        base = tempfile.mkdtemp()  # entered by the child user, as grade.py's scratch folder
        os.chmod(base, 0o711)
        try:
            secret = os.path.join(base, "secret")
            with open(secret, "w") as file:
                file.write("root's")
            folder = sandbox.hand_over(tempfile.mkdtemp(dir=base))
            script = (f"import os, time\nos.makedirs('{folder}/deep')\n"
                      f"os.symlink('{secret}', '{folder}/deep/link')\n"
                      f"os.symlink('{base}', '{folder}/up')\n"
                      f"open('{folder}/own', 'w').write('mine')\n"
                      "print('ready', flush=True)\ntime.sleep(60)\n")
            process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                       text=True, user=uid, group=uid, extra_groups=[])
            assert process.stdout.readline().strip() == "ready"
            sandbox.settle()
            assert process.wait(timeout=10) == -9 and not leftovers.processes_of({uid})
            left = sorted(os.path.relpath(os.path.join(top, name), folder)
                          for top, subfolders, names in os.walk(folder)
                          for name in subfolders + names)
            assert left == ["deep", "own"]
            assert os.stat(secret).st_uid == 0
        finally:
            shutil.rmtree(base)
    as_root_with_a_child_user(check)


# What a child in its view reports of itself: its folders, what it can write, its processes,
# network and IPC objects, and its environment.
LOOKS_AROUND = """
import errno, json, os, socket, sys


def attempt(action, path):
    try:
        return action(path)
    except OSError as error:
        return errno.errorcode[error.errno]


print(json.dumps({
    "work": sorted(os.listdir(os.path.dirname(os.getcwd()))),
    "instructor": sorted(os.listdir(sys.argv[1])) if os.path.isdir(sys.argv[1]) else [],
    "root": attempt(os.mkdir, "/made-by-a-child"),
    "sandbox": attempt(os.mkdir, "made-by-a-child"),
    "home": attempt(os.mkdir, os.environ["HOME"] + "/x"),
    "tmp": attempt(os.mkdir, "/tmp/x"),
    "processes": sorted(int(name) for name in os.listdir("/proc") if name.isdigit()),
    "interfaces": [name for _, name in socket.if_nameindex()],
    "ipc": open("/proc/sysvipc/shm").read().splitlines()[1:],
    "environment": {name: value for name, value in os.environ.items()
                    if name in ("PWD", "OLDPWD") or sys.argv[1] in value},
}))
"""


LIBC = ctypes.CDLL(None, use_errno=True)


def judges_segment():
    """A System V shared memory segment in the judge's IPC namespace that anyone may read."""
    segment = LIBC.shmget(0x6b1d7e58, 4096, 0o1000 | 0o666)  # IPC_CREAT
    assert segment >= 0, os.strerror(ctypes.get_errno())
    return segment


def test_a_childs_view_holds_the_sandbox_read_only_its_own_folders_and_nothing_of_the_grader(
        monkeypatch):
    if namespaces_refused():
        pytest.skip(f"no namespaces here: {namespaces_refused()}")

    def check(sandbox, uid):
        work = tempfile.mkdtemp()  # grade.py's layout: entered by the child user, not listed
        os.chmod(work, 0o711)
        try:
            for name in ("judge", "private", "submission", "scratch"):
                os.mkdir(os.path.join(work, name), 0o700 if name in ("judge", "private") else 0o711)
            open(os.path.join(work, "judge", "rubric.py"), "w").close()
            monkeypatch.setattr(sandbox, "SANDBOX", os.path.join(work, "submission"))
            monkeypatch.setattr(sandbox, "SCRATCH", os.path.join(work, "scratch"))
            monkeypatch.setattr(sandbox, "REPO", os.path.join(work, "judge"))
            monkeypatch.setattr(sandbox, "WORK", work)
            monkeypatch.setattr(sandbox, "NAMESPACES", "1")
            monkeypatch.setattr(sandbox.Child, "home", sandbox.hand_over(
                tempfile.mkdtemp(dir=sandbox.SCRATCH)))
            monkeypatch.setattr(sandbox.Child, "handed_over", [sandbox.Child.home])
            monkeypatch.setenv("PWD", REPO)  # as grade.py started in the instructor's checkout
            monkeypatch.setenv("GRADE_INSTRUCTOR", REPO)
            sandbox.mount_point.cache_clear()
            segment = judges_segment()
            done = sandbox.run_interpreter(["-c", LOOKS_AROUND, REPO])
            LIBC.shmctl(segment, 0, None)  # IPC_RMID
            assert done.returncode == 0, done.stderr
            seen = json.loads(done.stdout)
            # of the grading's folders, only the sandbox and the folders on the way to the
            # child's home; of the instructor's checkout, only the interpreter it may hold
            assert seen["work"] == ["scratch", "submission"]
            interpreter = os.path.relpath(sys.prefix, REPO).split(os.sep)[0]
            assert set(seen["instructor"]) <= {interpreter}, seen["instructor"]
            # the file system and the sandbox read-only by their mounts; its home and /tmp its own
            assert (seen["root"], seen["sandbox"], seen["home"], seen["tmp"]) == \
                ("EROFS", "EROFS", None, None)
            # its own processes (its launch's PID namespace), loopback alone, and not the
            # judge's System V segment
            assert len(seen["processes"]) <= 2 and seen["interfaces"] == ["lo"]
            assert seen["ipc"] == []
            # no folder outside the view named
            assert seen["environment"] == {}, seen["environment"]
        finally:
            sandbox.settle()
            sandbox.mount_point.cache_clear()
            shutil.rmtree(work)
    as_root_with_a_child_user(check)


SETUP_SPREAD = 32 * 2**10  # measured: the quiet launch's count varied between 17 and 22 KiB


def test_a_counted_launch_counts_what_its_ranks_send_through_their_own_sockets():
    if namespaces_refused():
        pytest.skip(f"no namespaces here: {namespaces_refused()}")
    from grading.launch import run_counting_bytes
    # a plain all-reduce of 1 KiB, and the same plus 1 MiB each way over sockets of the ranks' own
    _, quiet, counted = run_counting_bytes(2, sends_over_sockets, 0)
    _, loud, _ = run_counting_bytes(2, sends_over_sockets, 2**20)
    assert counted == "network"
    # the sockets' 2 MiB counted, within the set-up's spread between two launches (a few KiB)
    assert loud - quiet >= 2 * 2**20 - SETUP_SPREAD, (quiet, loud)


def test_without_namespaces_a_counted_launch_can_open_no_socket(monkeypatch):
    from grading import sandbox
    from grading.launch import ChildFailed, run_counting_bytes
    monkeypatch.setattr(sandbox, "NAMESPACES", "0")  # as grade.py --no-namespaces
    _, _, counted = run_counting_bytes(2, sends_over_sockets, 0)
    assert counted == "writes"
    # what send() moves, no write count sees: so no socket is to be had
    with pytest.raises(ChildFailed, match="Operation not permitted"):
        run_counting_bytes(2, sends_over_sockets, 2**20)


def sends_over_sockets(rank, world_size, size):
    """An all-reduce, then `size` bytes to the other rank over a socket pair of their own (their
    ports swapped through the process group's store)."""
    import socket

    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    dist.all_reduce(torch.ones(256))
    if not size:
        return 0
    store = _get_default_store()
    listener = socket.create_server(("127.0.0.1", 0))
    store.set(f"port-{rank}", str(listener.getsockname()[1]))
    with socket.create_connection(("127.0.0.1", int(store.get(f"port-{1 - rank}")))) as out:
        out.sendall(bytes(size))
        incoming, _ = listener.accept()
        received = 0
        while received < size:
            received += len(incoming.recv(1 << 20))
    return received
