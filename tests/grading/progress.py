"""The run's progress as it happens, one JSON object a line, for grade.py's watchdog.

    python -m pytest --grade-progress progress.jsonl ...

grade.py cannot wait for the end of a run to learn what happened: it kills a run whose test hangs,
and a student's code can end the whole process (a segfault, os._exit). So every event is written,
and flushed, when it happens; a run killed at any moment leaves every finished test's outcome.
Events (each with "event" and "time", seconds since the epoch):
    collect_error  {"nodeid", "output"}: a module could not be collected
    collected      {"members": {nodeid: [item ids]}, "outside", "broken_modules"}
    start          {"nodeid"}: a test's set-up begins
    report         {"nodeid", "when", "outcome", "duration", "output"}: one phase's result
                   (outcome as the plugin grades it, or null; output when the phase failed or
                   skipped: the traceback and captured output, or the reason for the skip)
    finish         {"exitstatus"}: the run ended by itself
"""
import json
import os
import time

OUTPUT_LIMIT = 6000  # characters of a failure kept: a student's code may print from every rank


class Progress:
    """The hooks that write the events to `path` (appended, one write per line)."""

    def __init__(self, path, grading, outcome_of):
        self.grading = grading  # the plugin's Grading: the tests' items as it classified them
        self.outcome_of = outcome_of  # the plugin's reading of a phase's report
        self.descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, event, **fields):
        """One event, written whole: a line in one write to a file opened for appending."""
        line = json.dumps({"event": event, "time": time.time(), **fields}) + "\n"
        os.write(self.descriptor, line.encode())

    def pytest_collectreport(self, report):
        """A module that cannot be collected: the reason (an import error, a syntax error)."""
        if report.failed:
            self.write("collect_error", nodeid=report.nodeid, output=tail(report.longreprtext))

    def pytest_collection_finish(self, session):
        """The tests this run will run, with their rubric items."""
        self.write("collected", members={nodeid: list(ids)
                                         for nodeid, ids in self.grading.members.items()},
                   outside=self.grading.outside,
                   broken_modules=self.grading.broken_modules)

    def pytest_runtest_logstart(self, nodeid):
        """A test begins: from now on its time counts against its timeout."""
        self.write("start", nodeid=nodeid)

    def pytest_runtest_logreport(self, report):
        """One phase's result; a failure comes with its traceback and captured output, a skip
        with its reason."""
        strict = ("rubric_strict_xfail", True) in report.user_properties
        output = None
        if report.failed:
            output = failure_text(report)
        elif report.skipped:
            output = skip_reason(report)
        self.write("report", nodeid=report.nodeid, when=report.when,
                   outcome=self.outcome_of(report, strict), duration=report.duration, output=output)

    def pytest_sessionfinish(self, exitstatus):
        """The run ended by itself (a killed run never writes this)."""
        self.write("finish", exitstatus=int(exitstatus))
        os.close(self.descriptor)


def failure_text(report):
    """The failure as pytest prints it, then what the test printed: each cut to its end."""
    parts = [tail(report.longreprtext)]
    for title, content in report.sections:
        if content.strip():
            parts.append(f"--- {title} ---\n{tail(content)}")
    return "\n".join(parts)


def skip_reason(report):
    """Why a test was skipped: pytest keeps (file, line, reason) for a skip."""
    if isinstance(report.longrepr, tuple):
        return report.longrepr[2]
    return tail(report.longreprtext)


def tail(text, limit=OUTPUT_LIMIT):
    """The last `limit` characters of `text`, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} characters cut ...]\n{text[-limit:]}"
