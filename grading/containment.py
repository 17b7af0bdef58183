"""The judge's pytest plugin for containment (grade.py's runner loads it with -p): each test's
deadline, its children's uid and home (grading/sandbox.py), and pytest's temporary folders
handed to that uid as they are made."""
import os

import pytest
from _pytest.tmpdir import TempPathFactory

from grading import profile, sandbox


def pytest_addoption(parser):
    """--grade-timeout and --grade-stretch."""
    parser.addoption("--grade-timeout", type=float, default=profile.DEFAULT_TIMEOUT_S,
                     metavar="S", help="seconds a test's children may run, at least")
    parser.addoption("--grade-stretch", type=float, default=1.0, metavar="X",
                     help="the factor on a test's own timeout (grading/profile.py)")


def pytest_configure(config):
    """Folders from tmp_path and tmp_path_factory go to the current test's user, made empty."""
    if not sandbox.UIDS:
        return
    make = TempPathFactory.mktemp

    def mktemp(factory, basename, numbered=True):
        folder = make(factory, basename, numbered)
        os.chmod(factory.getbasetemp(), 0o711)  # its folders can be entered, not listed
        return type(folder)(sandbox.hand_over(str(folder)))

    TempPathFactory.mktemp = mktemp


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A deadline, a user and a home before the test's set-up; its processes and home gone after
    its teardown."""
    config = item.config
    timeout_s = max(config.getoption("grade_timeout"),
                    config.getoption("grade_stretch") * profile.timeout_for(item.nodeid, 0))
    sandbox.begin_test(item.nodeid.split("::")[0], timeout_s)
    try:
        yield
    finally:
        sandbox.end_test()
