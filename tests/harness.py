"""What the tests share beside the launches (grading/launch.py): small IDX datasets, the real MNIST
where present, and the options of runs that check only the data's sharding."""
import os
import struct

import numpy as np

from grading import sandbox

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Options for runs that check the data's sharding, not the MLP, a strategy or the timing: the given
# CNN under torch's DDP (or one process), every step a warm-up step, so that no step is timed.
# Such a run needs no code of the lesson but runtime/data.py's.
SHARDING_ONLY = ("--model", "cnn", "--warmup-steps", 10**6)


def real_mnist():
    """A folder holding the real MNIST, or None (sandbox.real_mnist)."""
    return sandbox.real_mnist(REPO)


def write_idx(path, array):
    """The IDX format: 0x0000, a type byte (0x08: uint8), the number of dimensions, each as
    big-endian int32, then the bytes."""
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


def one_line_exit_2(done):
    """A refused input: exit code 2 and one line on stderr, no traceback."""
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
