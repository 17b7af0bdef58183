"""A pytest plugin that grades a run against the rubric in grading/rubric.py.

    python -m pytest --grade-report grade.json         # run all, print the rubric, write the JSON
    python -m pytest --collect-only -q --rubric-tests  # which rubric item each test counts for
    python -m pytest -k core.ring                      # one item's tests (-m rubric: all graded)
    python -m pytest --grade-profile                   # the grading profile only (profile.py)

A test's items are its closest `rubric(item, ...)` marker's. An item earns its marks when every
one of its tests that ran passed, and is "not assessed" when none ran; GRADING.md, "Reading the
report", gives every rule (xfail, the budget, items graded by a person). report.py shows the grade.
"""
import ast
import importlib.util
import os
import time

import pytest

from grading.profile import collects, in_profile, is_hidden
from grading.repeats import hide_repeats
from grading.report import (
    BY_PERSON,
    OUTCOMES,
    failure_text,
    skip_reason,
    tests_count,
    totals,
    write_atomically,
    write_table,
)

RUBRIC_PROPERTY = "rubric"  # a report's user property: (the test's items, strict xfail)
DEFAULT_RUBRIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rubric.py")


def pytest_addoption(parser):
    """--grade-report, --rubric and --rubric-tests."""
    group = parser.getgroup("grading", "grading against the rubric (grading/rubric.py)")
    group.addoption("--grade-report", metavar="PATH", help="write the grades as JSON to PATH")
    group.addoption("--rubric", metavar="PATH", default=DEFAULT_RUBRIC,
                    help="the rubric (default: grading/rubric.py)")
    group.addoption("--rubric-tests", action="store_true",
                    help="list the tests of every rubric item")
    group.addoption("--grade-profile", action="store_true",
                    help="run only the grading profile (grading/profile.py)")
    group.addoption("--grade-budget", type=float, metavar="S",
                    help="grade.py's run: no test starts after S seconds, and a skip fails "
                    "unless excused")
    group.addoption("--grade-excuse", action="append", default=[], metavar="TEXT",
                    help="under --grade-budget, a skip whose reason holds TEXT does not fail")


def pytest_configure(config):
    """Register the marker, and this run's grading with the rubric."""
    config.addinivalue_line("markers", "rubric(item, ...): the rubric item(s) this test assesses "
                                       "(grading/rubric.py)")
    report = config.getoption("grade_report")
    if report and getattr(config.option, "tx", None) and config.option.dist != "no":
        # A grade counts what -k left out and what never ran, which only the process that
        # collects sees: pytest-xdist's workers (pyproject.toml) give way to this one.
        config.option.dist = "no"
        print("--grade-report: the tests run in this process, not on pytest-xdist's workers")
    grading = Grading(load_rubric(config.getoption("rubric")), report and os.path.abspath(report))
    grading.profile = config.getoption("grade_profile")
    grading.budget_s = config.getoption("grade_budget")
    grading.excuses = config.getoption("grade_excuse")
    config.pluginmanager.register(grading, "grading-run")


def pytest_ignore_collect(collection_path, config):
    """Under --grade-profile, a test module without a test in the profile is not collected."""
    if not config.getoption("grade_profile") or collection_path.suffix != ".py":
        return None
    relative = os.path.relpath(collection_path, config.rootpath).replace(os.sep, "/")
    if relative.startswith("tests/test_") and not collects(relative):
        return True
    return None


class Rubric:
    """rubric.py's items, by id (grading/tests/test_grading.py checks the rubric's consistency)."""

    def __init__(self, items, path):
        self.path = path
        self.items = {item.id: item for item in items}

    def by_person(self, item_id):
        """Whether the item is graded by a person, not by tests (False for an unknown id)."""
        item = self.items.get(item_id)
        return item is not None and graded_by(item) == "person"

    def items_of_module(self, nodeid):
        """Every item a rubric marker names in the module `nodeid` (relative to the folder that
        holds grading/rubric.py's tests/): what a module that cannot be collected hides."""
        root = os.path.dirname(os.path.dirname(os.path.abspath(self.path)))
        return items_named_in(os.path.join(root, nodeid.split("::")[0]))


def items_named_in(path):
    """The item ids that rubric markers name in the Python file at `path`, read without
    importing it: `rubric("core.ring")` as a decorator, a module's pytestmark, or a case's marks."""
    try:
        with open(path) as file:
            tree = ast.parse(file.read())
    except (OSError, SyntaxError, ValueError):
        return []
    found = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "rubric"):
            found.update(dict.fromkeys(arg.value for arg in node.args
                                       if isinstance(arg, ast.Constant)))
    return list(found)


def graded_by(item):
    """Who grades a rubric item: "tests" (the default, and an old rubric's Item) or "person"."""
    return getattr(item, "graded_by", "tests")


def builds_on(item):
    """The items whose code the item's tests also run; () for an old rubric's Item."""
    return tuple(getattr(item, "builds_on", ()))


def load_rubric(path):
    """The Rubric of the rubric file at `path`; a usage error if it cannot be read."""
    spec = importlib.util.spec_from_file_location("rubric_under_grading", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except OSError as error:
        raise pytest.UsageError(f"cannot read the rubric: {error}") from None
    return Rubric(module.ITEMS, path)


class Grading:
    """The hooks of one run: classify the tests, record their outcomes, grade, report."""

    def __init__(self, rubric, report_path):
        self.rubric = rubric
        self.report_path = report_path
        self.members = {}  # node id -> item ids, every graded test
        self.strict_xfail = set()  # node ids
        self.outside = []  # node ids outside the rubric
        self.broken_modules = []  # node ids of modules that could not be collected
        self.deselected = set()  # node ids deselected by -k or -m
        self.outcomes = {}  # node id -> passed, failed or skipped
        self.outputs = {}  # node id -> its failure, or why it was skipped or not run
        self.durations = {}  # node id -> seconds, over its phases
        self.not_run = set()  # node ids the run chose not to run (below)
        self.budget_cut = set()
        self.lost = set()  # item ids a failed test lost
        self.profile = False
        self.budget_s = None
        self.excuses = []
        self.started = time.monotonic()
        self.report = None
        self.write_error = None

    @pytest.hookimpl(tryfirst=True)  # before -k and -m deselect by the marker and the item ids
    def pytest_collection_modifyitems(self, config, items):
        """Keep only the grading profile's tests (--grade-profile); classify them by the rubric."""
        ids = {test.nodeid: self.items_of(test) for test in items}
        if config.getoption("grade_profile"):
            self.check_binding(items, ids, config.rootpath)
            left_out = [test for test in items if not in_profile(test.nodeid)]
            items[:] = [test for test in items if in_profile(test.nodeid)]
            # Shown as deselected, but never classified: outside the profile, not "not run".
            config.hook.pytest_deselected(items=left_out)
        for test in items:
            self.classify(test, ids[test.nodeid])

    def items_of(self, test):
        """A test's rubric items: its closest rubric marker's (the case's, the function's, then
        the module's pytestmark); () when it has none or an empty one (outside the rubric)."""
        # a parametrised case's own marks come after its function's in pytest: they win here
        case = [mark for mark in getattr(getattr(test, "callspec", None), "marks", ())
                if mark.name == "rubric"]
        mark = case[0] if case else test.get_closest_marker("rubric")
        ids = tuple(dict.fromkeys(mark.args)) if mark else ()
        for item_id in ids:
            if item_id not in self.rubric.items:
                raise pytest.UsageError(f"{test.nodeid}: rubric item {item_id!r} "
                                        f"is not in {self.rubric.path}")
            if self.rubric.by_person(item_id):
                raise pytest.UsageError(f"{test.nodeid}: rubric item {item_id!r} is graded by "
                                        "a person: no test counts for it")
        return ids

    def check_binding(self, items, ids, root):
        """Under --grade-profile: a test of the profile in no item, or an item the tests grade
        that no test module under `root`/tests names, is a usage error."""
        problems = [f"{test.nodeid} is in the grading profile but in no rubric item"
                    for test in items if in_profile(test.nodeid) and not ids[test.nodeid]]
        named = {item_id for path in sorted((root / "tests").glob("test_*.py"))
                 for item_id in items_named_in(path)}
        problems += [f"rubric item {item.id!r} has no test" for item in self.rubric.items.values()
                     if not self.rubric.by_person(item.id) and item.id not in named]
        if problems:
            raise pytest.UsageError("; ".join(problems))

    def classify(self, test, ids):
        """Record a test's rubric items, also as keywords (-k core.ring), and on its reports for
        a run that pytest-xdist spreads over workers (learn)."""
        strict = xfail_is_strict(test)
        test.user_properties.append((RUBRIC_PROPERTY, (ids, strict)))
        test.extra_keyword_matches.update(ids)
        self.record(test.nodeid, ids, strict)

    def record(self, nodeid, ids, strict):
        """A test's items and whether it is a strict xfail."""
        if not ids:
            self.outside.append(nodeid)
            return
        if strict:
            self.strict_xfail.add(nodeid)
        self.members[nodeid] = ids

    def learn(self, report):
        """Under pytest-xdist the workers collect, not this process: a test's items come with its
        first report."""
        if report.nodeid in self.members or report.nodeid in self.outside:
            return
        for ids, strict in (value for name, value in report.user_properties
                            if name == RUBRIC_PROPERTY):
            self.record(report.nodeid, tuple(ids), strict)

    def pytest_deselected(self, items):
        """Remember the tests -k and -m left out."""
        self.deselected.update(test.nodeid for test in items)

    def pytest_collectreport(self, report):
        """Remember the modules that could not be collected."""
        if report.failed:
            self.broken_modules.append(report.nodeid)
            self.outputs[report.nodeid] = "could not be collected:\n" + report.longreprtext

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        """Under the grading profile, a test is not run once its items are lost, nor under
        --grade-budget once the budget is spent."""
        ids = set(self.members.get(item.nodeid, ()))
        why = None
        if self.budget_s and time.monotonic() - self.started > self.budget_s:
            self.budget_cut.add(item.nodeid)
            why = f"not run: the grading budget of {self.budget_s:g} s ran out before this test"
        elif self.profile and ids and ids <= self.lost:
            why = f"not run: {', '.join(sorted(ids))} already lost to a failed test"
        if why:
            self.not_run.add(item.nodeid)
            self.outputs[item.nodeid] = why
            pytest.skip(why)

    def pytest_runtest_logreport(self, report):
        """Record a test's outcome (a failure in any phase wins), time and output."""
        self.learn(report)
        nodeid = report.nodeid
        ids = self.members.get(nodeid, ())
        self.durations[nodeid] = self.durations.get(nodeid, 0.0) + report.duration
        if nodeid in self.not_run:
            return
        outcome = outcome_of(report, nodeid in self.strict_xfail)
        output = failure_text(report) if report.failed else \
            skip_reason(report) if report.skipped else None
        if outcome == "skipped" and self.budget_s and not any(excuse in output
                                                              for excuse in self.excuses):
            outcome, output = "failed", ("skipped, and under the grader a test may not skip "
                                         f"(only for a resource the grader lacks): {output}")
        if outcome == "failed":
            self.lost.update(ids)
        if output:
            self.outputs[nodeid] = (self.outputs.get(nodeid, "") + "\n" + output).strip()
        if outcome and self.outcomes.get(nodeid) != "failed":
            self.outcomes[nodeid] = outcome

    # outermost: pytest's summary, printed on the way out, comes before the marks table
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session, exitstatus):
        """Grade the run and write the report (not under --collect-only); show each error's
        failures once; after pytest's summary, print the marks table."""
        config = session.config
        if config.option.collectonly or exitstatus == pytest.ExitCode.USAGE_ERROR:
            return (yield)
        self.report = self.grade(incomplete_because(session, exitstatus))
        if self.report_path:
            try:
                write_atomically(self.report_path, self.report)
            except OSError as error:
                self.write_error = f"could not write the grade report: {error}"
                session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            hide_repeats(terminal.stats)
        try:
            return (yield)
        finally:
            if terminal is not None:
                write_table(terminal, self.report, self.report_path, self.write_error)

    def grade(self, reasons):
        """The grade report: every item graded, the totals, and why it may be incomplete."""
        items = [self.grade_item(item) for item in self.rubric.items.values()]
        not_run = [nodeid for nodeid in self.members
                   if nodeid not in self.outcomes and nodeid not in self.not_run]
        deselected = sum(nodeid in self.deselected for nodeid in not_run)
        if deselected:
            reasons.append(f"{tests_count(deselected)} of the rubric deselected")
        if len(not_run) > deselected:
            reasons.append(f"{tests_count(len(not_run) - deselected)} of the rubric never run")
        if self.budget_cut:
            reasons.append(f"the budget ran out: {tests_count(len(self.budget_cut))} not run")
        if self.broken_modules:
            reasons.append(f"could not collect {', '.join(self.broken_modules)}")
        return {
            **totals(items),
            "complete": not reasons, "incomplete_because": reasons,
            "items": items,
            "tests": self.test_entries(),
            "tests_outside_the_rubric": self.outside,
            "rubric": self.rubric.path,
        }

    def test_entries(self):
        """Every graded test with its items, outcome, time and, unless it passed, its output;
        and each module that could not be collected, with the items it counts for."""
        entries = []
        for nodeid, ids in self.members.items():
            outcome = self.outcome(nodeid)
            entry = {"nodeid": nodeid, "items": list(ids), "outcome": outcome,
                     "duration_s": round(self.durations.get(nodeid, 0.0), 2),
                     "hidden": is_hidden(nodeid)}
            if outcome != "passed":
                entry["output"] = self.outputs.get(nodeid, "")
            entries.append(entry)
        for module in self.broken_modules:
            entries.append({"nodeid": module, "items": self.rubric.items_of_module(module),
                            "outcome": "failed", "duration_s": 0.0, "hidden": is_hidden(module),
                            "output": self.outputs[module]})
        return entries

    def outcome(self, nodeid):
        """passed, failed, skipped, or not_run (chosen not to run, or never reached)."""
        return "not_run" if nodeid in self.not_run else self.outcomes.get(nodeid, "not_run")

    def grade_item(self, item):
        """One item's entry: its tests by outcome, its status and the marks it earned."""
        tests = {outcome: [] for outcome in OUTCOMES}
        for nodeid, ids in self.members.items():
            if item.id in ids:
                tests[self.outcome(nodeid)].append(nodeid)
        tests["failed"] += [module for module in self.broken_modules
                            if item.id in self.rubric.items_of_module(module)]
        status = "lost" if tests["failed"] else "earned" if tests["passed"] else "not assessed"
        because = {}
        if status == "earned" and self.budget_cut.intersection(tests["not_run"]):
            status = "not assessed"  # a test the budget cut proves nothing either way
            because = {"because": "the grading budget ran out before some of its tests"}
        if self.rubric.by_person(item.id):  # no test counts for it (checked at load time)
            status = BY_PERSON
        return {**because, "id": item.id, "title": item.title, "marks": item.marks,
                "earned": {"earned": item.marks, "lost": 0}.get(status), "status": status,
                "graded_by": graded_by(item), "builds_on": list(builds_on(item)),
                "tests": tests,
                "checks": item.checks, "needs_human": item.needs_human}

    def pytest_terminal_summary(self, terminalreporter, config):
        """Print the rubric tests (--rubric-tests); the grades come last (pytest_sessionfinish)."""
        if config.getoption("rubric_tests"):
            self.list_tests(terminalreporter)

    def list_tests(self, terminal):
        """Each rubric item with its tests, then the tests outside it or in none."""
        terminal.write_sep("=", "rubric tests")
        for item in self.rubric.items.values():
            if self.rubric.by_person(item.id):
                terminal.write_line(f"{item.id} ({item.marks:g} marks): {BY_PERSON}")
                continue
            tests = [nodeid for nodeid, ids in self.members.items() if item.id in ids]
            terminal.write_line(f"{item.id} ({item.marks:g} marks): {tests_count(len(tests))}")
            for nodeid in tests:
                terminal.write_line(f"    {nodeid}")
        terminal.write_line(f"outside the rubric: {tests_count(len(self.outside))}")
        for nodeid in self.outside:
            terminal.write_line(f"    {nodeid}")


def xfail_is_strict(test):
    """Whether the test's xfail marker (or the ini option) makes it strict."""
    mark = test.get_closest_marker("xfail")
    if mark is None:
        return False
    strict = mark.kwargs.get("strict")
    # pytest 9's names first; pytest 8 knows only xfail_strict
    for name in ("strict_xfail", "xfail_strict", "strict"):
        if strict is not None:
            break
        try:
            strict = test.config.getini(name)
        except ValueError:
            pass
    return bool(strict)


def outcome_of(report, strict_xfail):
    """What one phase's report says of its test; None when it says nothing new (a set-up that
    passed)."""
    if report.failed:
        return "failed"
    if hasattr(report, "wasxfail"):
        return "passed" if strict_xfail and report.skipped else "skipped"
    if report.skipped:
        return "skipped"
    if report.passed and report.when == "call":
        return "passed"
    return None


def incomplete_because(session, exitstatus):
    """Why the run's grades are incomplete, as far as the session says: stopped early."""
    if exitstatus == pytest.ExitCode.INTERRUPTED or session.shouldfail or session.shouldstop:
        why = session.shouldfail or session.shouldstop or "interrupted"
        return [f"the run was stopped early ({why})"]
    return []
