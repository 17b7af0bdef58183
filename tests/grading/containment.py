"""The judge's pytest plugin for containment (grade.py's runner loads it with -p): each test's
children get their module's user and a fresh home (tests/grading/sandbox.py), pytest's temporary
folders are handed to that user as they are made, and nothing of a test outlives it."""
import os

import pytest
from _pytest.tmpdir import TempPathFactory

from tests.grading import sandbox


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
    """A user and a home before the test's set-up; its processes and home gone after teardown."""
    sandbox.begin_test(item.nodeid.split("::")[0])
    try:
        yield
    finally:
        sandbox.end_test()
