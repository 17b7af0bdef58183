"""How a grade report is shown and written: the rubric table at the end of the run, the totals,
and the JSON file, written whole."""
import json
import os
import tempfile
import textwrap

OUTCOMES = ("passed", "failed", "skipped", "not_run")
BY_PERSON = "graded by a person"  # the status of an item no test earns
NEEDS_HUMAN_WIDTH = 60  # characters of an item's needs_human in the table
OUTPUT_LIMIT = 6000  # characters of a failure kept: a student's code may print from every rank


def write_atomically(path, document):
    """A reader sees the old report or the whole new one, never half of one."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".grade-", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            json.dump(document, file, indent=2)
            file.write("\n")
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def totals(items):
    """The report's totals over its graded items: earned, assessed (earned or lost by tests),
    available (every item), and graded by a person (left to the reader)."""
    return {
        "total_earned": sum(item["earned"] or 0 for item in items),
        "total_assessed": sum(item["marks"] for item in items
                              if item["status"] not in ("not assessed", BY_PERSON)),
        "total_available": sum(item["marks"] for item in items),
        "total_graded_by_person": sum(item["marks"] for item in items
                                      if item["status"] == BY_PERSON),
    }


def totals_line(report):
    """'total: 12 of 16 assessed marks (25 available; 5 graded by a person)'."""
    by_person = report["total_graded_by_person"]
    left = f"; {by_person:g} graded by a person" if by_person else ""
    return (f"total: {report['total_earned']:g} of {report['total_assessed']:g} assessed marks "
            f"({report['total_available']:g} available{left})")


def rows(report, status):
    """Each item's marks and `status(item)`, the totals, and why the grade is incomplete."""
    width = max(len(item["id"]) for item in report["items"])
    lines = [f"{item['id']:<{width}}  {earned(item):>3}/{item['marks']:<3g} {status(item)}"
             for item in report["items"]]
    return lines + [totals_line(report)] + [f"incomplete: {reason}"
                                            for reason in report["incomplete_because"]]


def earned(item):
    """An item's marks earned, or "-" where no test earns it or none ran."""
    return "-" if item["earned"] is None else f"{item['earned']:g}"


def write_table(terminal, report, report_path, write_error):
    """The rubric table at the end of the run, and where the report went."""
    terminal.write_sep("=", "rubric")
    for line in rows(report, describe):
        terminal.write_line(line, yellow=line.startswith("incomplete: "))
    if report_path and not write_error:
        terminal.write_line(f"grade report: {report_path}")
    if write_error:
        terminal.write_line(write_error, red=True)


def describe(item):
    """An item's status with the count of its tests per outcome (the failed ones named), or what
    the person who grades it reads."""
    if item["status"] == BY_PERSON:
        return f"{BY_PERSON}: " + textwrap.shorten(item["needs_human"], NEEDS_HUMAN_WIDTH,
                                                    placeholder="...")
    tests = item["tests"]
    counts = ", ".join(f"{len(tests[outcome])} {outcome.replace('_', ' ')}"
                       for outcome in OUTCOMES if tests[outcome] and outcome != "failed")
    if item["status"] == "lost":
        failed = [nodeid if "::" in nodeid else f"{nodeid} (not collected)"
                  for nodeid in tests["failed"]]
        return f"lost: {len(failed)} failed: {first_few(failed)}"
    return f"{item['status']}: {counts or 'no test collected'}"


def tests_count(count):
    """'1 test', '3 tests'."""
    return f"{count} test" if count == 1 else f"{count} tests"


def first_few(names, count=3):
    """The first `count` names, and how many more."""
    more = f" and {len(names) - count} more" if len(names) > count else ""
    return ", ".join(names[:count]) + more


def failure_text(report):
    """A failed phase as pytest prints it, then what the test printed: each cut to its end."""
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
