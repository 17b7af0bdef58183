"""Where student code runs, and as whom: the one door from the judge to student code.

Without grade.py (a student's own `python -m pytest`) the sandbox is this repository and nothing
changes user. Under grade.py as root, containment comes from how folders and users are made, not
from checks of what a child did:
- The sandbox (GRADE_SANDBOX: the submission's copy, the instructor's tests over it) is root's and
  read-only to children: no child can change what a later one imports.
- Each test module's children run as a user of their own (GRADE_UIDS "first:count": uids no
  account holds, this grading's alone), so one module's processes and files are out of reach of
  another's, the hidden tests' modules among them.
- Each test's children get a home (cwd stays the sandbox; TMPDIR and HOME are the home) made for
  them, empty, in GRADE_SCRATCH, which children cannot write; it is removed after the test.
- A folder is handed to that user only while it is empty and its parent is root's. The judge
  never walks and chowns a tree after student code ran.
- After each launch and each test, every process of that user is killed (nothing of a test
  outlives it), and links it left in its folders are removed (settle()), so what the judge reads
  there afterwards is a file of that user's, not a path to the judge's.
- Under grade.py, with or without root, each test has a deadline: a launch still running at it is
  killed with its descendants and the test fails (TestTimedOut). The judge runs no student code,
  so a hang or a crash of it ends its own test, never the run.
"""
import contextlib
import functools
import importlib
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import types

from tests.grading import namespace, profile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SANDBOX = os.path.abspath(os.environ.get("GRADE_SANDBOX") or REPO)
SCRATCH = os.environ.get("GRADE_SCRATCH")
UIDS = tuple(map(int, os.environ["GRADE_UIDS"].split(":"))) if os.environ.get("GRADE_UIDS") \
    else None
MOUNT_NAMESPACE = os.environ.get("GRADE_MOUNT_NAMESPACE") == "1"  # grade.py found it possible

# What one process of student code may use beyond the judge's own limits (file size and memory,
# tests/grading/runner.py): CPU seconds (the one-epoch accuracy run needs under 60), and processes
# and threads of its user together (a rank has some 20 threads).
CPU_SECONDS = 600
TASKS_OF_THE_CHILD_USER = 2048
# Bytes of a stream of student output that reach the judge: its first and its last half.
OUTPUT_LIMIT = 2**20
KILL_WITHIN_S = 10
# Where any user may write: what a test's user left there is removed with the test.
SHARED_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")


class TestTimedOut(Exception):
    """The current test's time ran out while its children ran: they were killed."""


class Child:
    """Who the current test's children are: a uid, and the home made for them (None: as the
    judge, in the sandbox); and when the test's time runs out (None: never)."""
    uid = None
    home = None
    deadline = None  # time.monotonic()
    timeout_s = None
    handed_over = []  # the folders given to uid (home included), settled after each launch
    module_uids = {}  # test module -> uid


def identity():
    """(uid, home) of the current test's children, or None: what a forked child enters."""
    return (Child.uid, Child.home) if Child.uid is not None else None


def begin_test(module, timeout_s=None):
    """As the judge, before a test of `module` sets up: its deadline, `timeout_s` from now; its
    module's user, and a fresh home."""
    Child.timeout_s = timeout_s
    Child.deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if not UIDS:
        return
    first, count = UIDS
    uid = Child.module_uids.setdefault(module, first + len(Child.module_uids) % count)
    if uid != Child.uid:
        Child.handed_over = []
    Child.uid = uid
    Child.home = hand_over(tempfile.mkdtemp(prefix="home-", dir=SCRATCH))


def end_test():
    """As the judge, after a test's teardown: its children gone, its home removed."""
    Child.deadline = None
    if Child.uid is None:
        return
    settle()
    remove_files_of(Child.uid)
    discard(Child.home)
    Child.home = None


def hand_over(folder):
    """Give the current test's user the folder the judge has just made (empty, in a folder of
    the judge's, so no one else could have put anything there); returns it."""
    if Child.uid is None:
        return folder
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if os.listdir(descriptor):
            raise RuntimeError(f"the grader hands over only empty folders: {folder}")
        os.fchown(descriptor, Child.uid, Child.uid)
    finally:
        os.close(descriptor)
    Child.handed_over.append(folder)
    return folder


@contextlib.contextmanager
def fresh_folder():
    """A new empty folder for the current test's children to write, in the scratch folder;
    removed, with what they left there, on leaving."""
    folder = hand_over(tempfile.mkdtemp(prefix="child-", dir=SCRATCH))
    try:
        yield folder
    finally:
        discard(folder)


def discard(folder):
    """Remove a folder the judge made for children, and forget it."""
    shutil.rmtree(folder, ignore_errors=True)  # by descriptors: follows no link
    if folder in Child.handed_over:
        Child.handed_over.remove(folder)


def settle():
    """After a launch: kill every process of the current test's user, then remove every link
    left in its folders. Nothing then changes them while the judge reads or writes there."""
    if Child.uid is None:
        return
    kill_processes_of(Child.uid)
    for top in Child.handed_over:
        for folder, subfolders, names in os.walk(top):  # follows no link to a folder
            for name in subfolders + names:
                path = os.path.join(folder, name)
                status = os.lstat(path)
                if stat.S_ISLNK(status.st_mode) or (stat.S_ISREG(status.st_mode) and
                                                    status.st_nlink > 1 and
                                                    status.st_uid != Child.uid):
                    os.unlink(path)  # a link, or another name of somebody else's file


def processes_of(uids):
    """The live (not zombie) processes whose real or effective uid is in `uids`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as file:
                fields = dict(line.split(":", 1) for line in file if ":" in line)
        except (OSError, ValueError):
            continue
        real_and_effective = map(int, fields.get("Uid", "").split()[:2])
        alive = fields.get("State", "").strip()[:1] not in "ZX"
        if alive and not uids.isdisjoint(real_and_effective):
            found.append(int(name))
    return found


def kill_processes_of(*uids):
    """SIGKILL every process of these uids until none is left (they may be forking meanwhile)."""
    deadline = time.monotonic() + KILL_WITHIN_S
    while (pids := processes_of(set(uids))) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def remove_files_of(*uids):
    """What these users left in the SHARED_FOLDERS (none of them may still run)."""
    for folder in SHARED_FOLDERS:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid not in uids:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)  # by descriptors: follows no link
                else:
                    os.unlink(entry.path)


def seconds_left(timeout_s=None):
    """`timeout_s`, or what is left of the current test's time where that is less."""
    if Child.deadline is None:
        return timeout_s
    left = max(0.0, Child.deadline - time.monotonic())
    return left if timeout_s is None else min(timeout_s, left)


def timed_out():
    """The failure of a test whose time ran out (its children have been killed)."""
    return TestTimedOut(f"timed out after {Child.timeout_s:g} s (a hang in a collective?): the "
                        "grader killed the test's processes")


def kill_with_descendants(pid):
    """SIGKILL a process and every process below it, found first."""
    for process in [*descendants_of(pid), pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process, signal.SIGKILL)


def descendants_of(root):
    """Every live descendant of `root`, from /proc (empty where there is no /proc)."""
    children = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as file:
                stat = file.read()
        except OSError:
            continue
        parent = int(stat[stat.rfind(")") + 2:].split()[1])  # after "pid (comm) state"
        children.setdefault(parent, []).append(int(name))
    found = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def child_process(env=None):
    """subprocess keyword arguments that start a fresh process of student code: in the sandbox,
    as the current test's user where there is one, with `env` (default: the judge's) pointing
    TMPDIR and HOME at its home."""
    environment = dict(os.environ if env is None else env)
    arguments = {"cwd": SANDBOX, "env": environment}
    if Child.uid is not None:
        environment.update(TMPDIR=Child.home, HOME=Child.home)
        arguments["preexec_fn"] = functools.partial(become, Child.uid)
    return arguments


def become(uid):
    """As root, in the process about to become (or run) student code: its own view of the files
    where grade.py found one possible (tests/grading/namespace.py), its limits, then `uid`."""
    if MOUNT_NAMESPACE:
        namespace.private_view(SANDBOX, SCRATCH, SHARED_FOLDERS)
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_NPROC, (TASKS_OF_THE_CHILD_USER, TASKS_OF_THE_CHILD_USER))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def run_python(arguments, timeout=None, env=None):
    """`python ARGUMENTS` in the sandbox, as the child user where there is one: subprocess.run's
    result, with stdout and stderr as text, each cut to OUTPUT_LIMIT (bounded())."""
    return run([sys.executable, *arguments], timeout=timeout, **child_process(env))


def run(command, timeout=None, **options):
    """subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options), but
    each stream goes to a file, and bounded() of it comes back: a flood of output fills neither
    the judge's memory nor its log. The child's user is settled after it. Past the test's
    deadline, it is killed with its descendants, and the test fails (TestTimedOut)."""
    limited = seconds_left(timeout)
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, **options)
        try:
            process.wait(timeout=limited)
        except subprocess.TimeoutExpired:
            kill_with_descendants(process.pid)
            process.wait()
            if limited != timeout:
                raise timed_out() from None
            raise
        finally:
            settle()
        return subprocess.CompletedProcess(command, process.returncode, bounded(stdout),
                                           bounded(stderr))


def bounded(file):
    """A file's text, at most OUTPUT_LIMIT bytes of it: all of it, or its start and its end with
    a line saying how much was dropped between them."""
    size = file.seek(0, os.SEEK_END)
    file.seek(0)
    if size <= OUTPUT_LIMIT:
        data = file.read()
    else:
        head = file.read(OUTPUT_LIMIT // 2)
        file.seek(size - OUTPUT_LIMIT // 2)
        dropped = f"\n[... {size - OUTPUT_LIMIT} bytes of output dropped here ...]\n"
        data = head + dropped.encode() + file.read()
    return data.decode(errors="replace")


def enter(child, module_name=None):
    """In a forked child, before any student code: become `child` (identity() in the judge), then
    import the project from the sandbox only (forget what was imported from the judge's folder).
    Returns the module `module_name`, where given: the sandbox's, or, for a hidden test, which
    the sandbox does not hold (tests/grading/submission.py), the judge's copy, read before the
    change of user and run from its compiled code, so that no file of it is there for student
    code to read."""
    elsewhere = not os.path.samefile(SANDBOX, REPO)  # asked before the judge's folder is closed
    hidden = hidden_code(module_name) if module_name and elsewhere else None
    if child:
        uid, home = child
        become(uid)
        os.environ.update(TMPDIR=home, HOME=home)
        tempfile.tempdir = None  # chosen again, from TMPDIR
    if elsewhere:
        for name, module in list(sys.modules.items()):
            if (getattr(module, "__file__", None) or "").startswith(REPO + os.sep):
                del sys.modules[name]
        sys.path[:] = [SANDBOX] + [entry for entry in sys.path
                                   if entry not in ("", ".") and os.path.abspath(entry) != REPO]
        os.chdir(SANDBOX)
    if module_name is None:
        return None
    if hidden is None:
        return importlib.import_module(module_name)
    module = types.ModuleType(module_name)
    module.__package__ = module_name.rpartition(".")[0]
    sys.modules[module_name] = module
    exec(hidden, module.__dict__)
    return module


def hidden_code(module_name):
    """The compiled code of the judge's copy of `module_name` if it is a hidden test, else None:
    always the judge's, whatever student code left in the sandbox under that name. Compiled under
    a name that is no path: a traceback shows no line of it."""
    relative = os.path.join(*module_name.split(".")) + ".py"
    if relative not in profile.HIDDEN_TESTS:
        return None
    with open(os.path.join(REPO, relative)) as file:
        return compile(file.read(), f"<hidden test {module_name}>", "exec")

