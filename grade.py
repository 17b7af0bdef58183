"""Grade a submission: the grading profile's tests, each under a hard timeout, within a budget.

    python grade.py                                   # grade this repository (the solution)
    python grade.py SUBMISSION_DIR --report grade.json
    python grade.py /autograder/submission --gradescope /autograder/results/results.json
    python grade.py SUBMISSION_DIR --timeout-per-test 60 --budget 300

The submission is copied to a read-only sandbox with the instructor's tests/ over it; pytest runs
once in the judge's folder (grading/judge.py) and never imports it; student code runs only in
the children the tests start (grading/sandbox.py). GRADING.md, "The grading run", says the
rest. Exit code 0 when grading ran, whatever the marks; 2 on bad input; 1 if the grader itself
failed (results.json is still written, with the reason).
"""
import argparse
import compileall
import ctypes
import functools
import os
import subprocess
import sys
import tempfile
import time

from grading import calibration, gradescope, profile, view
from grading.judge import make_judge
from grading.leftovers import (
    descendants_of,
    kill_processes_of,
    kill_until_gone,
    remove_files_of,
    remove_ipc_objects_of,
)
from grading.plugin import Grading, load_rubric
from grading.report import BY_PERSON, totals, write_atomically
from grading.runner import run_pytest
from grading.sandbox import become, real_mnist
from grading.submission import copy_submission, file_hashes

INSTRUCTOR = os.path.dirname(os.path.abspath(__file__))  # its tests/ grade every submission
# Student code runs as uids of this grading alone, no account's: one per test module.
FIRST_CHILD_UID = 2**24
CHILD_UIDS = 256
# tests/conftest.py's reason when the real MNIST is missing: the one skip the grader excuses, and
# only when it has no MNIST itself.
NO_REAL_MNIST = "the real MNIST is not here"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad option is one line on stderr and exit code 2 (runtime/options.py's
    twin, which imports the lesson, and so torch)."""

    def error(self, message):
        """Leave with `message` alone."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive(text):
    """An argparse type: a number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0: {text}")
    return value


def parse(argv):
    """The command line."""
    parser = OneLineParser(prog="grade.py", description=__doc__.split("\n")[0])
    parser.add_argument("submission", nargs="?", default=".", metavar="SUBMISSION_DIR",
                        help="the repository to grade (default: .)")
    parser.add_argument("--report", metavar="PATH", help="write the grade report (JSON)")
    parser.add_argument("--gradescope", metavar="PATH", help="write Gradescope's results.json")
    parser.add_argument("--timeout-per-test", type=positive, metavar="S",
                        help="seconds a test may run before it is killed (default "
                        f"{profile.DEFAULT_TIMEOUT_S:g}, known-long tests more, times the "
                        "calibration's stretch)")
    parser.add_argument("--no-namespaces", action="store_true",
                        help="contain student code as where Linux refuses namespaces (by users "
                        "alone): to check that fallback")
    parser.add_argument("--budget", type=positive, metavar="S",
                        help=f"seconds for the whole run (default {profile.BUDGET_S:g} times the "
                        "calibration's stretch)")
    return parser.parse_args(argv)


def environment(instructor):
    """The tests' environment: CI unset (a missing resource skips, not fails), no pytest options
    from outside, passive OpenMP threads, and the instructor's MNIST where there is one."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("CI", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONPATH")}
    # spinning OpenMP threads beside one busy process made the accuracy test take 150 s, not 5
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    env.pop("OFFLINE_DATA_DIR", None)
    folder = real_mnist(instructor)
    if folder:
        env["OFFLINE_DATA_DIR"] = folder
    return env


def contain(work, private, judge, sandbox, scratch, env, instructor, namespaces=True):
    """As root: student code runs as users of this grading alone (GRADE_UIDS, one per test
    module: grading/sandbox.py), who may enter `work` and `scratch` but list neither, read
    the sandbox and write nothing of it, and cannot enter the judge's folders (its code and
    hidden tests; its report and log); each launch in namespaces of its own where the system
    allows and `namespaces` (GRADE_NAMESPACES: grading/view.py). Returns the uids, and the
    report's notes."""
    os.chmod(work, 0o711)
    os.chmod(scratch, 0o711)
    for folder in (private, judge):
        os.chmod(folder, 0o700)
    read_only(sandbox)
    env["GRADE_NAMESPACES"] = "0"
    if os.geteuid() != 0:
        return range(0), [
            "grade.py did not run as root, so student code ran as the grader's own user: it could "
            "reach the grader's files, the hidden tests among them (they are not secret here; the "
            "grade is sound only where it runs as root)", "namespaces: no (not root)"]
    first = FIRST_CHILD_UID + os.getpid() * CHILD_UIDS  # pids are unique: so are the ranges
    try:
        subprocess.run([sys.executable, "-c", "pass"], cwd="/", check=True, capture_output=True,
                       timeout=60, preexec_fn=functools.partial(become, first))
    except (OSError, subprocess.SubprocessError):
        return range(0), [f"uid {first} cannot run {sys.executable} (a folder on its way is "
                          "private; for pyenv under /root: chmod o+x /root), so student code ran "
                          "as root", "namespaces: no (student code ran as root)"]
    env["GRADE_UIDS"] = f"{first}:{CHILD_UIDS}"
    why = (namespaces_refused(first, sandbox, scratch, work, instructor) if namespaces
           else "--no-namespaces chose the fallback")
    notes = [f"student code ran as uids {first} and up, one per test module, owned by no account: "
             "they can neither open the grader's files nor signal its processes, nor each other's"]
    if why is None:
        env["GRADE_NAMESPACES"] = "1"
        return range(first, first + CHILD_UIDS), notes + [NAMESPACES]
    notes.append(f"namespaces: no ({why}): {FALLBACK}")
    if readable_by_everyone(instructor):
        notes.append(f"not contained: the instructor's folder {instructor} can be read by every "
                     "user, student code included (make it root's alone, as run_autograder does)")
    return range(first, first + CHILD_UIDS), notes


NAMESPACES = ("namespaces: yes (each launch of student code had a network with only loopback, IPC "
              "objects and processes of its own, and saw of the files only the interpreter's, the "
              "read-only sandbox and data, the folders handed to its test's user and a private "
              "/tmp and /dev/shm; the ranks whose bytes a test counts shared only the network, "
              "which the kernel counted)")
FALLBACK = ("student code saw the file system as any user does (the grader's folders are root's "
            "alone, and the children's environment and working folder name none of them); the "
            "ranks of a launch shared the machine's network and IPC objects, removed after each "
            "test: where a test counts their bytes, the kernel counted what their processes wrote, "
            "and they could open no socket, but what they exchanged through memory or the process "
            "group's store went uncounted")


def readable_by_everyone(folder):
    """Whether any user may enter every folder down to `folder`, and read it."""
    path = os.path.realpath(folder)
    ancestors = [path]
    while ancestors[-1] != "/":
        ancestors.append(os.path.dirname(ancestors[-1]))
    return (os.stat(path).st_mode & 0o005 == 0o005
            and all(os.stat(ancestor).st_mode & 0o001 for ancestor in ancestors))


def namespaces_refused(uid, sandbox, scratch, work, instructor):
    """Why a child cannot have a view of its own here (grading/view.py), tried once; None where
    it can."""
    try:
        namespaces = view.Namespaces(("net", "ipc", "pid"))
    except OSError as error:
        return str(error)
    shm, mount_point = (tempfile.mkdtemp(dir=scratch) for _ in range(2))
    try:
        interpreter = view.interpreter_folders([work], instructor)
        seen = view.View(namespaces.joined, (sandbox, *interpreter), (), shm, mount_point)
        return view.refused(seen, uid)
    finally:
        namespaces.close()
        os.rmdir(shm)
        os.rmdir(mount_point)


def read_only(sandbox):
    """The sandbox as root's, readable by all, writable by root alone. Done before any student
    code ran, on the copy grade.py has just made (links refused), and compiled, so that children
    need not write bytecode."""
    for folder, _, names in os.walk(sandbox):
        os.chmod(folder, 0o755)
        for name in names:
            path = os.path.join(folder, name)
            os.chmod(path, 0o755 if os.stat(path).st_mode & 0o111 else 0o644)
    compileall.compile_dir(sandbox, quiet=2)


def calibrated(args):
    """(timeout per test, budget, the calibration's record): an option given is taken as it is; a
    default is stretched by how much slower this machine is now than the reference
    (grading/calibration.py)."""
    if args.timeout_per_test and args.budget:
        return args.timeout_per_test, args.budget, {"stretch": 1.0}
    measured_s = calibration.measure()
    stretch = calibration.stretch(measured_s)
    record = {"measured_s": round(measured_s, 2), "reference_s": calibration.REFERENCE_S,
              "stretch": round(stretch, 2)}
    return (args.timeout_per_test or profile.DEFAULT_TIMEOUT_S * stretch,
            args.budget or profile.BUDGET_S * stretch, record)


def grade(submission, timeout_s, budget_s, instructor=None, stretch=1.0, namespaces=True):
    """Grade the submission with the instructor's tests (default: INSTRUCTOR's), each named
    test's own timeout times `stretch`; the report (without the time taken)."""
    instructor = instructor or INSTRUCTOR
    load_before = os.getloadavg()
    hashes = file_hashes(submission)
    env = environment(instructor)
    with tempfile.TemporaryDirectory(prefix="grade-") as work:
        private, judge, sandbox, scratch = (os.path.join(work, name) for name in
                                            ("private", "judge", "submission", "scratch"))
        notes = copy_submission(submission, instructor, sandbox)
        make_judge(instructor, judge)
        os.makedirs(private)
        os.makedirs(scratch)
        env.update(GRADE_SANDBOX=sandbox, GRADE_SCRATCH=scratch, GRADE_STRETCH=f"{stretch:g}")
        env["GRADE_INSTRUCTOR"] = instructor  # named to no child (grading/sandbox.py)
        uids, more_notes = contain(work, private, judge, sandbox, scratch, env, instructor,
                                   namespaces)
        notes += more_notes
        # the grader says whether the real MNIST is here, not a variable student code can pop
        excuse = [] if "OFFLINE_DATA_DIR" in env else ["--grade-excuse", NO_REAL_MNIST]
        longest_s = max([timeout_s] + [stretch * seconds for _, seconds in profile.TIMEOUTS])
        try:
            report, run, failure = run_pytest(
                judge, private, env, budget_s, longest_s,
                ["--basetemp", os.path.join(scratch, "pytest"), "--grade-timeout",
                 f"{timeout_s:g}", "--grade-stretch", f"{stretch:g}", *excuse])
        finally:  # nothing of student code's reaches what comes next
            kill_processes_of(*uids)
            remove_files_of(*uids)
            remove_ipc_objects_of(*uids)
    if report is None:
        report = lost_to(failure, os.path.join(instructor, "grading", "rubric.py"))
    report.update(submission=submission, files=hashes, notes=notes, failure=failure,
                  default_timeout_s=timeout_s, budget_s=budget_s, runs=[run],
                  load_average={"before": load_before, "after": os.getloadavg()})
    return report


def lost_to(failure, rubric_path):
    """The report of a run that ended without one: every item the tests grade lost, saying why."""
    why = failure.splitlines()[0]
    report = Grading(load_rubric(rubric_path), None).grade([why])
    for item in report["items"]:
        if item["status"] != BY_PERSON:  # no test could have changed it
            item.update(status="lost", earned=0, because=why)
    report.update(totals(report["items"]))
    return report


def become_subreaper():
    """Make this process the parent of every orphan below it (Linux's PR_SET_CHILD_SUBREAPER): a
    process of the submission's that left its session and double-forked is then still a descendant
    that kill_descendants() finds, not init's child. False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # 36: PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def kill_descendants(spare):
    """SIGKILL and reap every process below this one but those in `spare` (there before the
    grading began): nothing the submission started may outlive the grading, or write after it."""
    kill_until_gone(lambda: [pid for pid in descendants_of(os.getpid()) if pid not in spare],
                    reap=True)


def main(argv=None):
    """Grade, write the reports, print the marks."""
    args = parse(argv)
    started = time.time()
    submission = os.path.abspath(args.submission)
    if not os.path.isdir(submission):
        print(f"grade.py: error: no such folder: {args.submission}", file=sys.stderr)
        return 2
    reaping = become_subreaper()
    before = set(descendants_of(os.getpid()))  # main() called by a test: its own children
    try:
        timeout_s, budget_s, measured = calibrated(args)
        report = grade(submission, timeout_s, budget_s, stretch=measured["stretch"],
                       namespaces=not args.no_namespaces)
        report["calibration"] = measured
        if not reaping:
            report["notes"].append("this system cannot adopt orphans (no PR_SET_CHILD_SUBREAPER):"
                                   " a process that left its session may outlive the grading")
    except Exception as error:  # the grader's own failure must still reach the student's page
        kill_descendants(spare=before)
        reason = f"the grader failed: {type(error).__name__}: {error}"
        if args.report:
            write_atomically(os.path.abspath(args.report),
                             {"submission": submission, "failure": reason, "items": []})
        if args.gradescope:
            write_atomically(os.path.abspath(args.gradescope),
                             gradescope.failure_results(reason, time.time() - started))
        print(f"grade.py: {reason}", file=sys.stderr)
        return 1
    kill_descendants(spare=before)  # before any report is written
    elapsed = time.time() - started
    report["elapsed_s"] = round(elapsed, 1)
    if args.report:
        write_atomically(os.path.abspath(args.report), report)
    if args.gradescope:
        write_atomically(os.path.abspath(args.gradescope), gradescope.results(report, elapsed))
    print(gradescope.summary(report))
    print(f"graded {len(report['tests'])} tests in {elapsed:.0f} s "
          f"({len(report['runs'])} pytest run(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
