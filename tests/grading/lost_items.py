"""A pytest plugin grade.py adds: once a rubric item is lost, its other tests are not run.

The rubric grades an item all or nothing, so they could not change the grade; an unfinished
submission then fails fast (one failure per item) instead of paying every test's start-up of
gloo processes, and the budget reaches every item. A test counting for several items still runs
while one of them can be earned. Plain `pytest` runs every test, as before.
"""
import pytest


class SkipLostItems:
    """Remembers the items a failed test lost, and skips the tests that count only for those."""

    def __init__(self):
        self.lost = set()

    @staticmethod
    def items_of(properties):
        """The rubric items the grading plugin gave a test (its user properties)."""
        return {value for key, value in properties if key == "rubric_item"}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item):
        """Skip a test whose every item is lost already."""
        items = self.items_of(item.user_properties)
        if items and items <= self.lost:
            pytest.skip(f"not run: {', '.join(sorted(items))} already lost to a failed test")

    def pytest_runtest_logreport(self, report):
        """A failure in any phase loses the test's items."""
        if report.failed:
            self.lost.update(self.items_of(report.user_properties))


def pytest_configure(config):
    """Register the plugin's state for this run."""
    config.pluginmanager.register(SkipLostItems(), "grading-lost-items")
