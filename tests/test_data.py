"""The data module: in-memory splits, offline copies verified by MD5, and sharding identical to
DistributedSampler."""
import gzip
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from runtime import data
from tests.harness import REPO, write_dataset


def test_torchvision_imports_on_this_torch_in_a_fresh_interpreter():
    code = ("from runtime import data; torchvision = data.import_torchvision(); "
            "print(torchvision.datasets.MNIST.__name__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "MNIST"


def test_splits_are_normalised_float_tensors_held_in_memory(tiny_data):
    loaded = data.load("mnist", tiny_data, val_samples=100)
    assert loaded.train.images.shape == (500, 1, 28, 28)
    assert loaded.train.images.dtype == torch.float32
    assert len(loaded.val) == 100 and len(loaded.test) == 200
    assert loaded.train.labels.dtype == torch.int64
    pixels = torch.cat([loaded.train.images, loaded.val.images])
    raw_min = (0 - 0.1307) / 0.3081
    assert abs(pixels.min().item() - raw_min) < 1e-5  # uint8 0 maps to -mean/std


def test_the_files_read_as_torchvision_reads_them(tiny_data):
    mnist = data.dataset_class("mnist")
    for train, split in ((True, "train"), (False, "test")):
        reference = mnist(tiny_data, train=train, download=False)
        images, labels = (data.read_idx(os.path.join(tiny_data, "MNIST", "raw", name), dimensions)
                          for name, dimensions in zip(data.RAW_FILES[split], (3, 1)))
        assert torch.equal(images, reference.data) and torch.equal(labels, reference.targets)


@pytest.mark.parametrize("damage, message", [(lambda raw: raw[:-1], "truncated"),
                                             (lambda raw: b"\x1f\x8b" + raw[2:], "not a 1-dim")])
def test_a_damaged_extracted_file_is_one_clear_error(tiny_data, damage, message):
    labels = os.path.join(tiny_data, "MNIST", "raw", "t10k-labels-idx1-ubyte")
    with open(labels, "rb") as file:
        raw = file.read()
    with open(labels, "wb") as file:
        file.write(damage(raw))
    with pytest.raises(data.DataError, match=message):
        data.load("mnist", tiny_data, val_samples=10)


def test_validation_split_is_seeded_and_disjoint_from_training(tiny_data):
    first = data.load("mnist", tiny_data, val_samples=100, seed=1)
    again = data.load("mnist", tiny_data, val_samples=100, seed=1)
    other = data.load("mnist", tiny_data, val_samples=100, seed=2)
    assert torch.equal(first.val.images, again.val.images)
    assert not torch.equal(first.val.images, other.val.images)
    train_rows = {tuple(row.tolist()) for row in first.train.images.flatten(1)[:, :60]}
    assert not any(tuple(row.tolist()) in train_rows for row in first.val.images.flatten(1)[:, :60])


def test_subsets_keep_only_the_requested_number_of_samples(tiny_data):
    loaded = data.load("mnist", tiny_data, val_samples=50, train_samples=120, test_samples=30)
    assert (len(loaded.train), len(loaded.val), len(loaded.test)) == (120, 50, 30)


def test_fashion_mnist_reads_its_own_folder(tmp_path):
    root = write_dataset(str(tmp_path), folder="FashionMNIST")
    assert len(data.load("fashion-mnist", root, val_samples=10).test) == 200


def test_an_offline_folder_without_the_files_is_one_clear_error(tmp_path):
    with pytest.raises(data.DataError, match="offline-data-dir"):
        data.fetch("mnist", str(tmp_path / "data"), offline_dir=str(tmp_path / "empty"))


def test_a_corrupt_offline_file_is_refused_by_its_md5_and_nothing_is_copied(tmp_path):
    raw = tmp_path / "offline" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for file, _ in data.dataset_class("mnist").resources:
        with gzip.open(raw / file, "wb") as handle:
            handle.write(b"not the real thing")
    with pytest.raises(data.DataError, match="corrupt or truncated"):
        data.fetch("mnist", str(tmp_path / "data"), offline_dir=str(tmp_path / "offline"))
    assert not (tmp_path / "data").exists()


def test_the_offline_copy_is_verified_extracted_and_leaves_the_source_untouched(
        tmp_path, real_data):
    before = sorted(os.listdir(os.path.join(real_data, "MNIST", "raw")))
    data.fetch("mnist", str(tmp_path), offline_dir=real_data)
    assert sorted(os.listdir(os.path.join(real_data, "MNIST", "raw"))) == before
    loaded = data.load("mnist", str(tmp_path))
    assert (len(loaded.train), len(loaded.val), len(loaded.test)) == (55000, 5000, 10000)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_are_exactly_what_distributed_sampler_gives(world_size):
    for epoch in (0, 3):
        for rank in range(world_size):
            sampler = DistributedSampler(range(1003), world_size, rank, shuffle=True, seed=7,
                                         drop_last=True)
            sampler.set_epoch(epoch)
            expected = list(sampler)
            shard = data.shard_indices(1003, 16, rank, world_size, epoch, seed=7)
            assert shard.flatten().tolist() == expected[:shard.numel()]


def test_shards_are_disjoint_and_cover_every_full_global_batch():
    shards = [data.shard_indices(1000, 10, rank, 4, epoch=0, seed=0) for rank in range(4)]
    together = torch.cat([shard.flatten() for shard in shards])
    assert len(set(together.tolist())) == together.numel() == 1000 // 40 * 40


def test_set_epoch_changes_the_order():
    first_epoch = data.shard_indices(1000, 10, 0, 2, epoch=0, seed=0)
    second_epoch = data.shard_indices(1000, 10, 0, 2, epoch=1, seed=0)
    assert not torch.equal(first_epoch, second_epoch)


def test_the_global_batch_of_each_step_is_the_same_set_for_any_world_size():
    global_batch = 24
    reference = data.shard_indices(1000, global_batch, 0, 1, epoch=2, seed=5)
    for world_size in (2, 3, 4):
        shards = [data.shard_indices(1000, global_batch // world_size, rank, world_size, 2, 5)
                  for rank in range(world_size)]
        for step in range(len(reference)):
            together = sorted(torch.cat([shard[step] for shard in shards]).tolist())
            assert together == sorted(reference[step].tolist())


@pytest.mark.parametrize("world_size", [1, 3, 7])
def test_evaluation_slices_count_every_sample_exactly_once(world_size):
    covered = [index for rank in range(world_size)
               for index in range(10)[data.eval_range(10, rank, world_size)]]
    assert covered == list(range(10))
