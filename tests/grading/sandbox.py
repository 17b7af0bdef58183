"""Where the code under test runs, and as whom: the one door from the judge to student code.

grade.py sets GRADE_SANDBOX (the submission's copy) and, when it runs as root, GRADE_CHILD_USER
("uid:gid", an unprivileged user) and GRADE_SCRATCH (a folder that user may write). Every process
that runs student code starts here: a fresh one through child_process(), a forked one through
enter(). Without those variables (a student's own `python -m pytest`) the sandbox is this
repository and nothing changes user.
"""
import importlib
import os
import resource
import subprocess
import sys
import tempfile
import types

from tests.grading import profile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SANDBOX = os.path.abspath(os.environ.get("GRADE_SANDBOX") or REPO)
CHILD_USER = os.environ.get("GRADE_CHILD_USER")  # "uid:gid", or None: stay who we are
SCRATCH = os.environ.get("GRADE_SCRATCH")


# What one process of student code may use beyond the judge's own limits (file size and address
# space, tests/grading/runner.py): CPU seconds (the one-epoch accuracy run needs under 60), and
# processes and threads of the child user together (a rank has some 20 threads).
CPU_SECONDS = 600
TASKS_OF_THE_CHILD_USER = 2048
# Bytes of a stream of student output that reach the judge: its first and its last half.
OUTPUT_LIMIT = 2**20


def ids():
    """(uid, gid) of the user student code runs as, or None."""
    return tuple(map(int, CHILD_USER.split(":"))) if CHILD_USER else None


def hand_over(*paths):
    """Let the child user write `paths` (folders the judge made for a child's output) and
    everything in them. Nothing to do without a child user."""
    if not CHILD_USER:
        return
    uid, gid = ids()
    for path in paths:
        for folder, _, names in os.walk(path):
            for name in [None, *names]:
                os.chown(os.path.join(folder, name) if name else folder, uid, gid)


def hand_over_scratch():
    """hand_over() the judge's scratch folder (pytest's tmp_path of every test lives there): a
    child writes its outputs where the test asks, and the judge reads them as data."""
    if SCRATCH:
        hand_over(SCRATCH)


def child_process():
    """subprocess keyword arguments that start a fresh process in the sandbox, as the child
    user where there is one."""
    hand_over_scratch()
    arguments = {"cwd": SANDBOX}
    if CHILD_USER:
        uid, gid = ids()
        arguments.update(user=uid, group=gid, extra_groups=[], preexec_fn=limit)
    return arguments


def limit():
    """The child user's limits, in the process about to become (or run) student code."""
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    resource.setrlimit(resource.RLIMIT_NPROC, (TASKS_OF_THE_CHILD_USER, TASKS_OF_THE_CHILD_USER))


def run_python(arguments, timeout=None, env=None):
    """`python ARGUMENTS` in the sandbox, as the child user where there is one: subprocess.run's
    result, with stdout and stderr as text, each cut to OUTPUT_LIMIT (bounded())."""
    return run([sys.executable, *arguments], timeout=timeout, env=env, **child_process())


def run(command, timeout=None, **options):
    """subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options), but
    each stream goes to a file, and bounded() of it comes back: a flood of output fills neither
    the judge's memory nor its log."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, **options)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
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


def enter(module_name=None):
    """In a forked child, before any student code: become the child user, then import the project
    from the sandbox only (forget what was imported from the judge's folder). Returns the module
    `module_name`, where given: the sandbox's, or, for a hidden test, which the sandbox does not
    hold (tests/grading/submission.py), the judge's copy, read before the change of user and run
    from its compiled code, so that no file of it is there for student code to read."""
    elsewhere = not os.path.samefile(SANDBOX, REPO)  # asked before the judge's folder is closed
    hidden = hidden_code(module_name) if module_name and elsewhere else None
    if CHILD_USER:
        uid, gid = ids()
        limit()
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
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
