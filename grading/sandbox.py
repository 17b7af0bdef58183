"""Where student code runs, and as whom: the one door from the judge to student code.

Without grade.py the sandbox is this repository and nothing changes user. Under grade.py as root
(GRADE_SANDBOX, GRADE_SCRATCH, GRADE_UIDS "first:count"), each test module's children run as a uid
of their own, in the read-only sandbox, with a home made empty for each test and an environment
that names no folder they cannot see; where Linux allows (GRADE_NAMESPACES=1), each launch also in
namespaces of its own, seeing only what it needs (view.py). A folder is handed to that uid only
while empty, and after each launch its processes are killed, its namespaces closed and the links it
left removed (settle()), so the judge reads only that uid's own files; after each test, what it left
in the shared temporary folders and its IPC objects go too. GRADING.md, "What the grader trusts",
says why each holds.
"""
import atexit
import contextlib
import functools
import importlib
import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import types

from grading import profile, view
from grading.leftovers import (
    kill_processes_of,
    kill_with_descendants,
    remove_files_of,
    remove_ipc_objects_of,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SANDBOX = os.path.abspath(os.environ.get("GRADE_SANDBOX") or REPO)
SCRATCH = os.environ.get("GRADE_SCRATCH")
UIDS = tuple(map(int, os.environ["GRADE_UIDS"].split(":"))) if os.environ.get("GRADE_UIDS") \
    else None
# "1": grade.py found namespaces possible; "0": refused, or the fallback chosen; unset: not under
# grade.py (a launch whose bytes are counted still tries them)
NAMESPACES = os.environ.get("GRADE_NAMESPACES")
# Where the judge's own state lies: never named to a child (the folder of grade.py's copies)
WORK = os.path.dirname(SCRATCH) if SCRATCH else None

# What one process of student code may use beyond the judge's own limits (file size and memory,
# grading/runner.py): CPU seconds (the one-epoch accuracy run needs under 60), and processes
# and threads of its user together (a rank has some 20 threads).
CPU_SECONDS = 600
TASKS_OF_THE_CHILD_USER = 2048
# Bytes of a stream of student output that reach the judge: its first and its last half.
OUTPUT_LIMIT = 2**20
MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def real_mnist(repo):
    """The real MNIST's folder as an absolute path (the children run elsewhere): $OFFLINE_DATA_DIR,
    else `repo`/data, where the main job downloads it; None where neither holds MNIST/raw/*.gz."""
    for folder in (os.environ.get("OFFLINE_DATA_DIR"), os.path.join(repo, "data")):
        raw = os.path.join(folder or "", "MNIST", "raw")
        if folder and all(os.path.isfile(os.path.join(raw, name)) for name in MNIST_FILES):
            return os.path.abspath(folder)
    return None


class TestTimedOut(Exception):
    """The current test's time ran out while its children ran: they were killed."""


class Child:
    """The current test's children: their uid and home (None: as the judge), and its deadline."""
    uid = None
    home = None
    deadline = None  # time.monotonic()
    timeout_s = None
    handed_over = []  # the folders given to uid (home included), settled after each launch
    module_uids = {}  # test module -> uid
    namespaces = None  # the current launch's shared view.Namespaces, made at its first process
    holders = []  # every view.Namespaces of the current launch, closed after it
    shm = None  # the test's /dev/shm, in its view


def identity():
    """(uid, home, view or None) of the current test's children, or None: what a forked child
    enters."""
    if Child.uid is None:
        return None
    return Child.uid, Child.home, view_of_the_test() if NAMESPACES == "1" else None


def view_of_the_test():
    """What the current launch's children see: its namespaces (made now if not yet), the sandbox
    and the data read-only, and the folders handed to the test's user."""
    if Child.namespaces is None:
        Child.namespaces = held(view.Namespaces(("net", "ipc", "pid")))
    if Child.shm is None:
        Child.shm = hand_over(tempfile.mkdtemp(prefix="shm-", dir=SCRATCH))
    return view.View(Child.namespaces.joined, read_only(), tuple(Child.handed_over), Child.shm,
                     mount_point())


def held(namespaces):
    """`namespaces`, to be closed with the current launch (settle())."""
    Child.holders.append(namespaces)
    return namespaces


def isolated(network, folder, shm):
    """The identity of a rank that shares `network` (view.Namespaces) with its launch's other
    ranks, and nothing else: its IPC objects, processes and /dev/shm (`shm`) its own, and of the
    files only `folder` (its home) writable. As the test's user, or as root where there is none."""
    own = held(view.Namespaces(("ipc", "pid")))
    seen = view.View(network.joined + own.joined, read_only(), (folder,), shm, mount_point())
    return Child.uid, folder, seen


@functools.cache
def mount_point():
    """An empty folder of root's where a child mounts its new root, in its own namespace."""
    folder = tempfile.mkdtemp(prefix="view-", dir=SCRATCH)
    atexit.register(shutil.rmtree, folder, True)
    return folder


def new_folder(path):
    """Make the folder `path` and hand it to the test's user; returns it."""
    os.mkdir(path)
    return hand_over(path)


def read_only():
    """The folders a child reads: the sandbox, the data the environment names, and the
    interpreter's, none of them the judge's."""
    data = os.environ.get("OFFLINE_DATA_DIR", "")
    interpreter = view.interpreter_folders(judges_folders(), os.environ.get("GRADE_INSTRUCTOR"))
    return tuple(sorted({SANDBOX, *interpreter} | ({os.path.abspath(data)} if os.path.isdir(data)
                                                   else set())))


def judges_folders():
    """The folders of the judge's own: grade.py's copies and state, and the judge's code where it
    is not the sandbox."""
    return [folder for folder in (WORK, REPO) if folder and folder != SANDBOX]


def begin_test(module, timeout_s=None):
    """Before a test of `module` sets up: its deadline, its module's uid and a fresh home."""
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
    """After a test's teardown: its children gone, what they left removed, its home too."""
    Child.deadline = None
    if Child.uid is None:
        return
    settle()
    remove_files_of(Child.uid)
    remove_ipc_objects_of(Child.uid)
    for folder in (Child.home, Child.shm):
        if folder:
            discard(folder)
    Child.home = Child.shm = None


def hand_over(folder):
    """Give the current test's uid the empty folder the judge has just made; returns it."""
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
    """A new folder for the current test's children to write, removed on leaving."""
    folder = hand_over(tempfile.mkdtemp(prefix="child-", dir=SCRATCH))
    try:
        yield folder
    finally:
        discard(folder)


def discard(folder):
    """Remove a folder the judge made for children, and forget it."""
    shutil.rmtree(folder, ignore_errors=True)  # by descriptors: follows no link
    Child.handed_over = [kept for kept in Child.handed_over if not view.within(kept, folder)]


def settle():
    """After a launch: kill the current test's uid's processes, close its namespaces, then remove
    the links it left."""
    for namespaces in Child.holders:  # a PID namespace's processes die with it
        namespaces.close()
    Child.namespaces, Child.holders = None, []
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


def seconds_left(timeout_s=None):
    """`timeout_s`, or what is left of the current test's time where that is less."""
    if Child.deadline is None:
        return timeout_s
    left = max(0.0, Child.deadline - time.monotonic())
    return left if timeout_s is None else min(timeout_s, left)


def timed_out():
    """The failure of a test whose time ran out."""
    return TestTimedOut(f"timed out after {Child.timeout_s:g} s (a hang in a collective?): the "
                        "grader killed the test's processes")


def child_process(env=None):
    """subprocess's keyword arguments for a process of student code: in the sandbox, as the
    current test's uid where there is one, TMPDIR and HOME its home, in the test's view."""
    environment = dict(os.environ if env is None else env)
    arguments = {"cwd": SANDBOX, "env": environment}
    child = identity()
    if child is not None:
        environment.clear()
        environment.update(for_children(env if env is not None else os.environ, child))
        arguments["preexec_fn"] = functools.partial(become, *child)
    return arguments


def for_children(environment, child):
    """`environment` as a child sees it: no PWD or OLDPWD, HOME and TMPDIR its home, and no
    folder it cannot see named (a list of folders keeps those it can)."""
    _, home, seen = child
    folders = None if seen is None else (*seen.read_only, *seen.writable, *view.SYSTEM, "/tmp")
    hidden = judges_folders() + ([os.environ["GRADE_INSTRUCTOR"]]
                                 if os.environ.get("GRADE_INSTRUCTOR") else [])

    def visible(path):
        if any(view.within(path, folder) for folder in hidden):
            return False
        return folders is None or any(view.within(path, folder) for folder in folders)

    cleaned = {}
    for name, value in environment.items():
        parts = value.split(os.pathsep)
        kept = [part for part in parts if not os.path.isabs(part) or visible(part)]
        if name not in ("PWD", "OLDPWD") and (kept or not value):
            cleaned[name] = value if kept == parts else os.pathsep.join(kept)
    cleaned.update(HOME=home, TMPDIR=home)
    return cleaned


def become(uid, home=None, seen=None):
    """As root, in the process about to become (or run) student code: its view (view.py) where it
    has one, its limits, then `uid`."""
    if seen is not None:
        view.enter(seen)
        os.chdir(SANDBOX)
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_NPROC, (TASKS_OF_THE_CHILD_USER, TASKS_OF_THE_CHILD_USER))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def run_interpreter(arguments, timeout=None, env=None):
    """run() of a new `python ARGUMENTS` as a process of student code (grading/launch.py's
    run_python forks one from a process that has imported torch instead)."""
    return run([sys.executable, *arguments], timeout=timeout, **child_process(env))


def run(command, timeout=None, **options):
    """subprocess.run(command, capture_output=True, text=True, ...), but each stream through a
    file and cut (bounded()), settled after, and killed with its descendants at the deadline."""
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
    """A file's text, or its first and last OUTPUT_LIMIT / 2 bytes, saying how much was dropped."""
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


def enter(child):
    """In a forked child, before any student code: become `child` (identity() in the judge), and
    import the project from the sandbox only."""
    elsewhere = not os.path.samefile(SANDBOX, REPO)  # asked before the judge's folder is closed
    if child:
        environment = for_children(os.environ, child)
        become(*child)
        os.environ.clear()
        os.environ.update(environment)
        tempfile.tempdir = None  # chosen again, from TMPDIR
    if elsewhere:
        for name, module in list(sys.modules.items()):
            if (getattr(module, "__file__", None) or "").startswith(REPO + os.sep):
                del sys.modules[name]
        sys.path[:] = [SANDBOX] + [entry for entry in sys.path
                                   if entry not in ("", ".") and os.path.abspath(entry) != REPO]
        os.chdir(SANDBOX)


def import_under_test(module_name, hidden=None):
    """The module `module_name`, from the sandbox; or made of `hidden` (hidden_code()'s)."""
    if hidden is None:
        return importlib.import_module(module_name)
    module = types.ModuleType(module_name)
    module.__package__ = module_name.rpartition(".")[0]
    sys.modules[module_name] = module
    exec(hidden, module.__dict__)
    return module


def hidden_code(module_name):
    """The judge's copy of `module_name`, compiled, if it is a hidden test that the sandbox lacks
    (graded elsewhere than in this repository); else None. Named by no path, so that a traceback
    shows no line of it. Read before the change of user."""
    relative = os.path.join(*module_name.split(".")) + ".py"
    if relative not in profile.HIDDEN_TESTS or os.path.samefile(SANDBOX, REPO):
        return None
    with open(os.path.join(REPO, relative)) as file:
        return compile(file.read(), f"<hidden test {module_name}>", "exec")

