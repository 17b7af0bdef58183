"""The judge's pytest, run once: limits on every process it starts, and a hard stop.

A test's children are killed at its timeout (grading/sandbox.py), so student code cannot stall
the run; what is left to guard is pytest itself: it must end within the budget, the longest test's
timeout and a margin, or it is killed, and a run without its report is the grader's failure,
reported with pytest's last words.
"""
import json
import os
import resource
import signal
import subprocess
import sys
import time

from grading.leftovers import kill_with_descendants

START_S = 60  # imports and collection, before the first test
EXIT_S = 10  # from the report's writing to the process's end
POLL_S = 0.1
LOG_TAIL = 3000  # characters of pytest's own output kept when it ended without a report
# Limits on pytest and every process it starts: no file over 1 GiB (a flood of output fails its
# test, not the disk; the tests' largest file, a 4-rank parity record, is over 256 MiB), and 3 GiB
# of memory a process can write (RLIMIT_DATA: torch's CUDA build reserves 3 GiB of address space).
FILE_SIZE_LIMIT = 2**30
MEMORY_LIMIT = 3 * 2**30


def run_pytest(judge, private, env, budget_s, longest_test_s, pytest_args=()):
    """pytest on the grading profile in `judge`, its report and log in `private`. Returns (the
    plugin's grade report, or None; a record of the run; why there is no report, or None)."""
    report_path = os.path.join(private, "report.json")
    log = os.path.join(private, "pytest.log")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-p", "grading.judge_guard", "-p", "grading.containment",
               "--continue-on-collection-errors", "--rootdir", judge, "--grade-profile",
               "-n", "0",  # in this process: the plugins keep the order, budget and limits
               "--grade-report", report_path, "--grade-budget", f"{budget_s:g}",
               *pytest_args, "tests"]
    began = time.monotonic()
    stop_at = began + START_S + budget_s + longest_test_s
    with open(log, "wb") as output:
        process = subprocess.Popen(command, cwd=judge, env=env, stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.STDOUT,
                                   start_new_session=True, preexec_fn=limit_resources)
    while process.poll() is None and time.monotonic() < stop_at:
        if os.path.exists(report_path):  # written at the session's end: the exit is all left
            stop_at = min(stop_at, time.monotonic() + EXIT_S)
        time.sleep(POLL_S)
    ended = "exited" if process.poll() is not None else "killed"
    kill_tree(process)
    returncode = process.wait()
    run = {"ended": ended, "returncode": returncode,
           "seconds": round(time.monotonic() - began, 1)}
    if not os.path.exists(report_path):
        why = "it ran past the budget and was killed" if ended == "killed" \
            else describe_exit(returncode)
        return None, run, f"pytest could not run the tests ({why})\n{log_tail(log)}"
    with open(report_path) as file:
        return json.load(file), run, None


def limit_resources():
    """In the child, before pytest starts: FILE_SIZE_LIMIT and MEMORY_LIMIT, or the system's own
    hard limits where those are lower."""
    for kind, limit in ((resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT),
                        (resource.RLIMIT_DATA, MEMORY_LIMIT)):
        _, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(kind, (limit, limit))


def kill_tree(process):
    """SIGKILL pytest, its descendants (those that started groups of their own too), its group."""
    kill_with_descendants(process.pid)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def describe_exit(returncode):
    """'exit code 3', 'killed by SIGSEGV'."""
    if returncode is not None and returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


def log_tail(path, limit=LOG_TAIL):
    """The end of pytest's output, where its last words are."""
    with open(path, "rb") as file:
        file.seek(0, os.SEEK_END)
        file.seek(max(0, file.tell() - limit))
        return file.read().decode(errors="replace")
