"""MNIST and FashionMNIST held in memory as normalised tensors, and which samples each rank takes.

The whole split is converted once (uint8 -> float, normalised) and batches are taken by
indexing: fed by a torchvision DataLoader with ToTensor()/Normalize instead, one epoch of the
MLP took about three times as long on 2 cores, most of it spent decoding samples one by one
(benchmarks/dataloader_bench.py, results/dataloader-bench.json).
"""
import glob
import importlib.util
import math
import os
import shutil
import struct
from dataclasses import dataclass

import torch

from runtime.atomic import write_atomic

# --dataset name: (torchvision class and folder name, mean, std of the training pixels)
DATASETS = {
    "mnist": ("MNIST", 0.1307, 0.3081),
    "fashion-mnist": ("FashionMNIST", 0.2860, 0.3530),
}

# The extracted files torchvision leaves in <Folder>/raw, the same names for both datasets.
RAW_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}

_torchvision_fix = None  # the schema library must stay alive as long as torchvision is used


class DataError(Exception):
    """A problem with the data that the user can fix; reported as one line."""


def import_torchvision():
    """Import torchvision, also where its CUDA-built extension cannot load against CPU torch.

    torchvision 0.28.0's only wheel is a CUDA build; on CPU torch its C++ ops fail to
    register and `import torchvision` raises "operator torchvision::nms does not exist"
    (pytorch/vision#9085). Declaring the two schemas it looks up at import lets it load;
    the C++ ops (nms, roi_align, ...) stay unavailable, and this project needs none.
    """
    global _torchvision_fix
    if _torchvision_fix is None and not _extension_loads():
        _torchvision_fix = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            schema = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
            _torchvision_fix.define(op + schema)
    import torchvision
    return torchvision


def _extension_loads():
    """Whether torchvision's compiled ops load against this torch (not a CUDA build on CPU)."""
    package = importlib.util.find_spec("torchvision").submodule_search_locations[0]
    libraries = glob.glob(os.path.join(package, "_C*.so"))
    libraries += glob.glob(os.path.join(package, "_C*.pyd"))
    for library in libraries:
        try:
            torch.ops.load_library(library)
            return True
        except (OSError, RuntimeError):
            return False
    return False


def dataset_class(name):
    """The torchvision dataset class of a --dataset name."""
    folder = DATASETS[name][0]
    return getattr(import_torchvision().datasets, folder)


def fetch(name, data_dir, offline_dir=None):
    """Make `data_dir/<Folder>/raw` hold the verified, extracted files; return nothing.

    With `offline_dir`, the .gz files are copied from `offline_dir/<Folder>/raw` after
    checking their MD5 against torchvision's list, and the network is never touched.
    """
    folder = DATASETS[name][0]
    raw_dir = os.path.join(data_dir, folder, "raw")
    # Present: done, without importing torchvision (a second per process; ranks never need it).
    if all(os.path.isfile(os.path.join(raw_dir, file))
           for files in RAW_FILES.values() for file in files):
        return
    dataset_type = dataset_class(name)
    from torchvision.datasets.utils import check_integrity
    if offline_dir:
        source_dir = os.path.join(offline_dir, folder, "raw")
        for file, md5 in dataset_type.resources:
            source = os.path.join(source_dir, file)
            if not os.path.isfile(source):
                raise DataError(f"{source} not found: "
                                f"--offline-data-dir must hold {folder}/raw/*.gz")
            if not check_integrity(source, md5):
                raise DataError(f"{source} is corrupt or truncated "
                                "(MD5 differs from torchvision's)")
        for file, md5 in dataset_type.resources:
            target = os.path.join(raw_dir, file)
            if not check_integrity(target, md5):
                copy_atomic(os.path.join(source_dir, file), target)
    try:
        download(dataset_type, raw_dir)
    except (RuntimeError, OSError) as error:
        raise DataError(
            f"{name} is not in {raw_dir} and could not be downloaded ({type(error).__name__}); "
            "offline, pass --offline-data-dir DIR (or set OFFLINE_DATA_DIR) naming a folder with "
            f"{folder}/raw/*.gz"
        ) from None


def download(dataset_type, raw_dir):
    """Each of the dataset's .gz files from the first mirror that serves it, verified and
    extracted; one already there with the right MD5 is only extracted. torchvision's MNIST.download
    loop, without loading the tensors: mlp_ddp.py's launcher forks the ranks, and must not have
    run a tensor operation before (OpenMP's threads do not survive a fork)."""
    from torchvision.datasets.utils import download_and_extract_archive
    for file, md5 in dataset_type.resources:
        for mirror in dataset_type.mirrors:
            try:
                download_and_extract_archive(mirror + file, raw_dir, filename=file, md5=md5)
                break
            except (RuntimeError, OSError) as error:
                failure = error
        else:
            raise failure


def copy_atomic(source, target):
    """Copy a file so that a reader never sees half of it."""
    with open(source, "rb") as original:
        write_atomic(target, lambda copy: shutil.copyfileobj(original, copy), binary=True)


@dataclass
class Split:
    """One split's samples, in memory."""

    images: torch.Tensor  # float32, N x 1 x 28 x 28, normalised
    labels: torch.Tensor  # int64, N

    def __len__(self):
        return len(self.labels)

    def to(self, device):
        """The same split on `device`."""
        return Split(self.images.to(device), self.labels.to(device))


@dataclass
class Data:
    """The three splits of a dataset."""

    train: Split
    val: Split
    test: Split


def load(name, data_dir, val_samples=5000, train_samples=0, test_samples=0, seed=0):
    """Load the fetched files into memory: a seeded train/validation split and the test split.

    `train_samples` / `test_samples` > 0 keep only that many (for quick runs and tests).
    """
    folder, mean, std = DATASETS[name]
    raw_dir = os.path.join(data_dir, folder, "raw")

    def normalised(split):
        image_file, label_file = RAW_FILES[split]
        images = read_idx(os.path.join(raw_dir, image_file), dimensions=3)
        labels = read_idx(os.path.join(raw_dir, label_file), dimensions=1)
        if len(images) != len(labels):
            raise DataError(f"{raw_dir}: {len(images)} {split} images but {len(labels)} labels")
        images = images.to(torch.float32).div_(255).sub_(mean).div_(std).unsqueeze(1)
        return Split(images, labels.to(torch.int64))

    full_train = normalised("train")
    test = normalised("test")
    if val_samples >= len(full_train):
        raise DataError(f"--val-samples {val_samples} leaves no training data "
                        f"({len(full_train)} samples)")
    order = torch.randperm(len(full_train), generator=torch.Generator().manual_seed(seed))
    val_indices = order[:val_samples]
    train_indices = order[val_samples:]
    if train_samples:
        train_indices = train_indices[:train_samples]
    if test_samples:
        test = Split(test.images[:test_samples], test.labels[:test_samples])

    def pick(indices):
        return Split(full_train.images[indices], full_train.labels[indices])

    return Data(train=pick(train_indices), val=pick(val_indices), test=test)


def read_idx(path, dimensions):
    """An extracted IDX file as a uint8 tensor. The format: two zero bytes, a type byte (0x08:
    uint8), the number of dimensions, each dimension as a big-endian int32, then the bytes. Read
    here rather than by torchvision's dataset class, whose import costs each rank a second."""
    try:
        with open(path, "rb") as file:
            raw = file.read()
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror}") from None
    header = 4 + 4 * dimensions
    if len(raw) < header or struct.unpack_from(">HBB", raw) != (0, 0x08, dimensions):
        raise DataError(f"{path} is not a {dimensions}-dimensional IDX file of bytes")
    shape = struct.unpack_from(f">{dimensions}i", raw, 4)
    if len(raw) - header != math.prod(shape):
        raise DataError(f"{path} is truncated: {len(raw) - header} bytes of data for shape "
                        f"{'x'.join(map(str, shape))}")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8, offset=header).view(shape)


def shard_indices(num_samples, batch_size, rank, world_size, epoch, seed):
    """This rank's sample indices for one epoch, as a [steps, batch_size] tensor.

    The same indices `DistributedSampler(shuffle=True, seed=seed, drop_last=True)` after
    `set_epoch(epoch)` gives, cut into full batches. Rank r takes every world_size-th
    sample of one shared permutation, so the union over ranks of row t is the permutation's
    t-th slice of batch_size * world_size samples: the global batch of step t is the same
    set of samples for any world size with the same global batch size. The remainder
    that does not fill a global batch is dropped.
    """
    # BEGIN PROMPT
    # When it returns: this rank's indices as the docstring says, a [steps, batch_size] tensor
    # equal to DistributedSampler's, rows in step order.
    # HINTS outline
    # One permutation seeded by seed + epoch, shared by every rank; keep only whole global batches;
    # this rank's share, shaped [steps, batch_size].
    # END PROMPT
    # BEGIN SOLUTION Task 2: each rank's shard of the global batches
    generator = torch.Generator().manual_seed(seed + epoch)
    permutation = torch.randperm(num_samples, generator=generator)
    steps = num_samples // (batch_size * world_size)
    used = permutation[: steps * batch_size * world_size]
    return used[rank::world_size].view(steps, batch_size)
    # END SOLUTION


def eval_range(num_samples, rank, world_size):
    """The contiguous slice of an evaluation split this rank scores: disjoint, covering every
    sample once."""
    # BEGIN PROMPT
    # A slice: rank r scores its own contiguous part of the split, the parts in rank order.
    # END PROMPT
    # BEGIN SOLUTION Task 2: each rank's evaluation slice
    return slice(num_samples * rank // world_size, num_samples * (rank + 1) // world_size)
    # END SOLUTION
