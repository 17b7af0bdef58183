"""What the watched pytest runs found out (runner.py), merged over restarts: every test with its
items, outcome, output and time, read from the events that progress.py writes as they happen.
"""
import json
import time


class Tests:
    """What the runs found out, merged: the tests with their items, outcomes and outputs."""

    def __init__(self):
        self.collected = False
        self.members = {}  # node id -> item ids
        self.outside = []
        self.broken_modules = {}  # module node id -> why it could not be collected
        self.outcomes = {}  # node id -> passed, failed or skipped
        self.outputs = {}  # node id -> what it printed when it failed, or why it did not run
        self.durations = {}  # node id -> seconds, over its phases
        self.started = {}  # node id -> when it started (seconds since the epoch)
        self.finished = set()  # node ids whose teardown was reported
        self.not_run = {}  # node id -> why it never ran
        self.budget_cut = set()  # node ids not run because the budget ran out
        self.lost_to_hang = set()  # item ids lost to a test that hung
        self.current = None  # the test running now, if any
        self.just_finished = []  # tests finished since the watchdog last looked
        self.run_finished = False  # the current run wrote its "finish" event
        self.last_event = 0.0  # when the current run last wrote anything

    def apply(self, event):
        """Take in one event of progress.py."""
        kind = event["event"]
        # when the watchdog read it: the time an event claims is never trusted
        self.last_event = time.time()
        if kind == "collect_error":
            self.broken_modules[event["nodeid"]] = event["output"]
        elif kind == "collected" and not self.collected:
            self.collected = True
            self.members = {nodeid: tuple(ids) for nodeid, ids in event["members"].items()}
            self.outside = event["outside"]
        elif kind == "start":
            self.started[event["nodeid"]] = self.last_event
            self.current = event["nodeid"]
        elif kind == "report":
            self.record(event)
        elif kind == "finish":
            self.run_finished = True

    def record(self, event):
        """One phase's report: a failure in any phase wins; the teardown ends the test."""
        nodeid = event["nodeid"]
        if event["outcome"] and self.outcomes.get(nodeid) != "failed":
            self.outcomes[nodeid] = event["outcome"]
        if event["output"]:
            self.add_output(nodeid, event["output"])
        self.durations[nodeid] = self.durations.get(nodeid, 0.0) + event["duration"]
        if event["when"] == "teardown":
            self.finished.add(nodeid)
            self.just_finished.append(nodeid)
            self.current = None

    def add_output(self, nodeid, text):
        """Append to a test's output (a failed call, then a failed teardown)."""
        self.outputs[nodeid] = (self.outputs.get(nodeid, "") + "\n" + text).strip()

    def fail(self, nodeid, why):
        """A test that the watchdog ended: failed, with the reason in its output."""
        self.durations[nodeid] = time.time() - self.started[nodeid]
        self.outcomes[nodeid] = "failed"
        self.add_output(nodeid, why)
        self.finished.add(nodeid)
        self.current = None

    def forget(self, nodeid):
        """A test stopped by the watchdog for another test's sake: as if it never started."""
        for record in (self.started, self.outcomes, self.outputs, self.durations):
            record.pop(nodeid, None)
        self.current = None

    def remaining(self):
        """The collected tests that never started and were not left out, in collection order."""
        return [nodeid for nodeid in self.members
                if nodeid not in self.started and nodeid not in self.not_run]

    def fail_skips(self, excused):
        """Under the grader a test may not skip (student code could make a required one skip):
        each skipped test fails, with its reason, unless `excused(reason)` or its items are lost
        already (lost_items.py skips those, and then it changes nothing)."""
        lost = {item for nodeid, outcome in self.outcomes.items() if outcome == "failed"
                for item in self.members.get(nodeid, ())} | self.lost_to_hang
        for nodeid, outcome in self.outcomes.items():
            reason = self.outputs.get(nodeid, "")
            items = set(self.members.get(nodeid, ()))
            if outcome == "skipped" and not (excused(reason) or (items and items <= lost)):
                self.outcomes[nodeid] = "failed"
                self.outputs[nodeid] = ("skipped, and under the grader a test may not skip "
                                        f"(only for a resource the grader lacks): {reason}")

    def leave_out(self, nodeids, why, budget=False):
        """Tests that will not run, and why."""
        for nodeid in nodeids:
            self.not_run[nodeid] = why
            self.outputs[nodeid] = why
            if budget:
                self.budget_cut.add(nodeid)


class EventReader:
    """The complete lines appended to a progress file since the last read."""

    def __init__(self, path):
        self.path = path
        self.offset = 0

    def events(self):
        """The new events, each a dict; a half-written last line waits for the next read."""
        try:
            with open(self.path, "rb") as file:
                file.seek(self.offset)
                data = file.read()
        except FileNotFoundError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]
