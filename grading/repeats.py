"""A failure already shown is not shown again: of the tests that fail with the same error (a task
not written yet fails dozens of tests alike), the first keeps its traceback, and the others are
left to pytest's short summary, one line each. The untouched handout's whole run then prints
under two thousand lines, not the sixteen thousand it printed with every traceback."""
import re

# The last exception a failure's last line names, the code's, not a test's assertion about it:
# "NotImplementedError: Task 6: the ring all-reduce" in "LaunchFailed: launch(2) failed in an
# earlier test: NotImplementedError: Task 6: the ring all-reduce".
LAST_RAISED = re.compile(r".*\b((?!AssertionError\b)[A-Za-z_]\w*(?:Error|Exception): .*)")


def error_of(report):
    """What makes two failures the same: the last exception their message's last line names,
    or else the whole message; None where the report carries none."""
    message = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
    if not message:
        return None
    raised = LAST_RAISED.fullmatch(message.strip().splitlines()[-1].strip())
    return raised.group(1) if raised else message


def hide_repeats(stats):
    """Keep the first of each error's failures whole, with a note of how many more failed alike.
    A repeated failure is left out of pytest's FAILURES section; a repeated error in set-up or
    teardown, which pytest's ERRORS section always prints, shrinks there to one line. Every one
    stays in the counts and the short summary."""
    first, repeats = {}, {}
    for report in stats.get("error", []) + stats.get("failed", []):
        error = error_of(report)
        if error is None:
            continue
        if error not in first:
            first[error] = report
            continue
        repeats[error] = repeats.get(error, 0) + 1
        if report.when == "call":
            # pytest leaves out of the FAILURES section a report its debugger has already shown
            report._pdbshown = True
        else:
            report.longrepr = f"{error} (as in {first[error].nodeid}, shown in full)"
            report.sections = []
    for error, count in repeats.items():
        more = f"{count} more test{'s' if count > 1 else ''}"
        first[error].sections.append(
            ("the same error", f"{more} failed with it: listed in the short test summary"))
