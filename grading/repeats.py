"""A failure already shown is not shown again: of the tests that fail with the same error (a task
not written yet fails dozens of tests alike), the first keeps its traceback, and the others are
left to pytest's short summary, one line each. The untouched handout's whole run then prints
hundreds of lines, not the sixteen thousand it printed with every traceback."""
import re

# The last line of a failure that is an exception raised by the code under test, not a test's
# assertion: "NotImplementedError: Task 6: the ring all-reduce".
RAISED = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?!AssertionError\b)[A-Za-z_]\w*(?:Error|Exception)"
                    r"\b.*")


def error_of(report):
    """What makes two failures the same: the exception the code raised (its message's last
    line), or else the whole message; None where the report carries none."""
    message = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
    if not message:
        return None
    last = message.strip().splitlines()[-1].strip()
    return last if RAISED.fullmatch(last) else message


def hide_repeats(reports):
    """Keep the first of each error's failures in pytest's FAILURES section, with a note of how
    many more failed alike; hide the others there (they stay in the counts and the summary)."""
    first = {}
    repeats = {}
    for report in reports:
        error = error_of(report)
        if error is None:
            continue
        if error not in first:
            first[error] = report
            continue
        # pytest leaves out of the FAILURES section a report its debugger has already shown
        report._pdbshown = True
        repeats[error] = repeats.get(error, 0) + 1
    for error, count in repeats.items():
        more = f"{count} more test{'s' if count > 1 else ''}"
        first[error].sections.append(
            ("the same error", f"{more} failed with it: listed in the short test summary"))
