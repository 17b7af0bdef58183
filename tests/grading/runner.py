"""pytest under a watchdog: every test has a hard timeout, the whole run has a budget.

A student's hanging collective must cost that test, not the grading run. pytest runs in its own
process group and writes each event as it happens (progress.py). The watchdog reads them; when
the running test passes its timeout it kills the group (and any descendant that left it), records
the test as failed, and starts pytest again on the tests not yet run. A pytest that dies by itself
(a segfault, os._exit in a student's code) is treated the same way. After a test hangs (it timed
out, or failed after more than half its timeout: a collective's own timeout), the tests that count
only for items already lost are not run: one hanging strategy must not eat the budget of every
other item. When the budget runs out, the tests not reached are "not run", with the reason.
"""
import os
import resource
import signal
import subprocess
import sys
import time

from tests.grading.record import EventReader, Tests

COLLECT_TIMEOUT_S = 60  # imports and collection, before the first test: a hang at import
EXIT_TIMEOUT_S = 10  # from the "finish" event to the process's end (gloo threads can hang exit)
RESTART_MIN_S = 5  # budget left below which a restart could not even start pytest
SLOW_FAILURE = 0.5  # a failure after this share of its timeout counts as a hang
POLL_S = 0.1
LOG_TAIL = 3000  # characters of pytest's own output kept when it could not run
# Limits on pytest and every process it starts, where student code runs: no file over this size
# (a flood of output fills neither the log nor the disk: the write fails, and so does its test;
# the largest file the tests write, the parity matrix's 4-rank record, is over 256 MiB), no process
# writing to more than this much memory (torch and a gloo rank of the tests need well under a
# gigabyte). RLIMIT_DATA counts the memory a process can write, not the address space that
# shared libraries reserve: torch's CUDA build reserves over 3 GiB of it at import.
FILE_SIZE_LIMIT = 2**30
MEMORY_LIMIT = 3 * 2**30


class Watchdog:
    """Runs pytest in `folder` until every selected test ran, or the budget is spent."""

    def __init__(self, folder, work, env, budget_s, timeout_for, idle_s, pytest_args=(),
                 after_run=lambda: None):
        self.folder = folder  # the judge: the instructor's tests and code (grading/judge.py)
        self.work = work  # where the progress files and pytest's logs go
        self.env = env
        self.budget_s = budget_s
        self.timeout_for = timeout_for  # node id -> seconds
        self.idle_s = idle_s  # the longest pause between tests, where no test is to blame
        self.tests = Tests()
        self.runs = []  # one entry per pytest started
        self.failure = None  # why no test could be collected, if so
        self.pytest_args = list(pytest_args)
        self.retried = set()  # tests that timed out once, and were (or are to be) run again alone
        self.retry = None  # the test the next run runs alone
        self.after_run = after_run  # called once each pytest is gone: a killed test's leftovers

    def run(self):
        """Run, restart after each kill or crash; returns the merged Tests."""
        deadline = time.time() + self.budget_s
        selection = ["tests"]  # the first run selects the profile itself
        while True:
            started_before = len(self.tests.started)
            self.run_once(selection, deadline)
            retry, self.retry = self.retry, None
            if not self.tests.collected:
                return self.tests
            remaining = self.drop_lost_items(self.tests.remaining())
            if not remaining:
                return self.tests
            if time.time() >= deadline - RESTART_MIN_S:
                self.tests.leave_out(remaining, self.budget_message(), budget=True)
                return self.tests
            if len(self.tests.started) == started_before and not retry:  # it would loop forever
                why = f"not run: pytest stopped before running any test ({self.runs[-1]['ended']})"
                self.tests.leave_out(remaining, why)
                return self.tests
            selection = [retry] if retry else remaining

    def budget_message(self):
        return f"not run: the grading budget of {self.budget_s:g} s ran out before this test"

    def drop_lost_items(self, remaining):
        """Leave out the tests that count only for items already lost to a hang."""
        lost = self.tests.lost_to_hang
        skipped = [nodeid for nodeid in remaining
                   if lost and set(self.tests.members[nodeid]) <= lost]
        for nodeid in skipped:
            names = ", ".join(self.tests.members[nodeid])
            self.tests.leave_out([nodeid], f"not run: {names} already lost to a test that hung")
        return [nodeid for nodeid in remaining if nodeid not in skipped]

    def hung_since_last_look(self):
        """Whether a test that just failed slowly made items lost whose tests are still to run."""
        tests = self.tests
        newly_lost = set()
        for nodeid in tests.just_finished:
            slow = tests.durations.get(nodeid, 0.0) > SLOW_FAILURE * self.timeout_for(nodeid)
            if tests.outcomes.get(nodeid) == "failed" and slow:
                newly_lost.update(set(tests.members.get(nodeid, ())) - tests.lost_to_hang)
        tests.just_finished = []
        if not newly_lost:
            return False
        tests.lost_to_hang.update(newly_lost)
        # the next test may have started already: it is stopped too, and run again if it counts
        # for an item still open
        return any(set(ids) <= tests.lost_to_hang and newly_lost & set(ids)
                   for nodeid, ids in tests.members.items() if nodeid not in tests.finished)

    def run_once(self, selection, deadline):
        """One pytest, watched until it ends, or until it is killed."""
        number = len(self.runs) + 1
        progress = os.path.join(self.work, f"progress-{number}.jsonl")
        log = os.path.join(self.work, f"pytest-{number}.log")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   "-p", "tests.grading.lost_items", "-p", "tests.grading.judge_guard",
                   "-p", "tests.grading.containment",
                   "--continue-on-collection-errors", "--rootdir", self.folder,
                   "--grade-profile", "--grade-progress", progress, *self.pytest_args,
                   *selection]
        began = time.time()
        self.tests.run_finished = False
        self.tests.current = None
        self.tests.last_event = began
        with open(log, "wb") as output:
            process = subprocess.Popen(command, cwd=self.folder, env=self.env,
                                       stdin=subprocess.DEVNULL, stdout=output,
                                       stderr=subprocess.STDOUT, start_new_session=True,
                                       preexec_fn=limit_resources)
        ended = self.watch(process, progress, began, deadline)
        kill_tree(process)
        self.after_run()
        returncode = process.wait()
        what = "profile" if number == 1 else f"{len(selection)} tests left"
        self.runs.append({"tests": what, "ended": ended,
                          "returncode": returncode, "seconds": round(time.time() - began, 1)})
        self.settle(ended, returncode, log)

    def watch(self, process, progress, began, deadline):
        """Read the events until pytest ends by itself ("exited") or must be killed ("timeout",
        "budget", "collection hang", "stall" between tests, "exit hang" after its last test, "slow
        failure": a hang that ended by itself, whose item's other tests must not run)."""
        reader = EventReader(progress)
        while True:
            for event in reader.events():
                self.tests.apply(event)
            if self.hung_since_last_look():
                return "slow failure"
            if process.poll() is not None:
                for event in reader.events():  # what it wrote before it ended
                    self.tests.apply(event)
                return "exited"
            now = time.time()
            current = self.tests.current
            if now >= deadline:
                return "budget"
            if not self.tests.collected and now - began > COLLECT_TIMEOUT_S:
                return "collection hang"
            if current and now - self.tests.started[current] > self.timeout_for(current):
                return "timeout"
            if self.tests.run_finished and now - self.tests.last_event > EXIT_TIMEOUT_S:
                return "exit hang"
            if self.tests.collected and not current and now - self.tests.last_event > self.idle_s:
                return "stall"
            time.sleep(POLL_S)

    def settle(self, ended, returncode, log):
        """Record what the end of a run means for the test it was running, if any."""
        tests = self.tests
        current = tests.current
        if ended == "timeout" and current not in self.retried:
            # A load spike beside the grader can stretch a correct test past its timeout: once,
            # it is run again, alone, before it counts as a hang.
            self.retried.add(current)
            self.retry = current
            tests.forget(current)
        elif ended == "timeout":
            seconds = self.timeout_for(current)
            tests.fail(current, f"timed out after {seconds:g} s, twice (the second time run "
                                "alone; a hang in a collective?): the grader killed its processes")
            tests.lost_to_hang.update(tests.members.get(current, ()))
        elif ended == "slow failure" and current:
            tests.forget(current)  # stopped as it began: as if it had not started
        elif ended == "budget" and current:
            tests.leave_out([current], self.budget_message(), budget=True)
            tests.current = None
        elif ended == "exited" and not tests.run_finished and current:
            tests.fail(current, f"the test process died ({describe_exit(returncode)}) during "
                                f"this test; the grader ran the remaining tests again\n"
                                f"{log_tail(log)}")
        if not tests.collected:
            why = {"collection hang": f"collection took over {COLLECT_TIMEOUT_S} s "
                                      "(a hang at import?)",
                   "budget": "the budget ran out during collection"}.get(ended,
                                                                         describe_exit(returncode))
            self.failure = f"pytest could not collect the tests: {why}\n{log_tail(log)}"


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
    """SIGKILL pytest's process group, and its descendants that started groups of their own."""
    descendants = descendants_of(process.pid)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already
    for pid in descendants:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


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
