"""Shared fixtures: small IDX datasets written by the tests themselves, and the real data where present."""
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

pytest_plugins = ["grading"]  # rubric marks per test and the grade report (tests/grading.py, tests/rubric.py)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(REPO, "..", "shared", "data")


def write_idx(path, array):
    """The IDX format: 0x0000, a type byte (0x08: uint8), the number of dimensions, each as big-endian int32, then the bytes."""
    with open(path, "wb") as file:
        file.write(struct.pack(">HBB", 0, 0x08, array.ndim))
        file.write(struct.pack(f">{array.ndim}i", *array.shape))
        file.write(array.astype(np.uint8).tobytes())


def write_dataset(root, folder="MNIST", train=600, test=200, seed=0):
    """Extracted raw files, as torchvision leaves them after verifying the downloads. The label is
    drawn into the image (a bright row at the label's height), so a model can learn it."""
    rng = np.random.default_rng(seed)
    raw = os.path.join(root, folder, "raw")
    os.makedirs(raw, exist_ok=True)
    for prefix, count in (("train", train), ("t10k", test)):
        labels = rng.integers(0, 10, count)
        images = rng.integers(0, 60, (count, 28, 28))
        images[np.arange(count), 2 + 2 * labels, :] = 255
        write_idx(os.path.join(raw, f"{prefix}-images-idx3-ubyte"), images)
        write_idx(os.path.join(raw, f"{prefix}-labels-idx1-ubyte"), labels)
    return root


@pytest.fixture
def tiny_data(tmp_path):
    return write_dataset(str(tmp_path / "data"))


def run_cli(*args, timeout=180, env=None):
    """`python mlp_ddp.py ARGS` from the repository root, without any OFFLINE_DATA_DIR of the caller's."""
    environment = {k: v for k, v in os.environ.items() if k != "OFFLINE_DATA_DIR"}
    environment.update(env or {})
    return subprocess.run([sys.executable, os.path.join(REPO, "mlp_ddp.py"), *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=environment)
