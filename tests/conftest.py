"""Shared fixtures: small IDX datasets written by the tests themselves, and the real MNIST where
present."""
import os

import pytest

from tests.harness import real_mnist, write_dataset

# Rubric marks per test and the grade report (grading/plugin.py, grading/rubric.py).
pytest_plugins = ["grading.plugin"]


@pytest.fixture
def tiny_data(tmp_path):
    return write_dataset(str(tmp_path / "data"))


@pytest.fixture
def real_data():
    """The folder with the real MNIST's raw files; under CI a missing one fails the test instead of
    skipping it."""
    folder = real_mnist()
    if folder is None:
        reason = ("the real MNIST is not here: set OFFLINE_DATA_DIR, or run python mlp_ddp.py "
                  "once (it downloads ./data)")
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the real-data tests; {reason}")
        pytest.skip(reason)
    return folder
