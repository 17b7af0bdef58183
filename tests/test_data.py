"""The data module: in-memory splits, offline copies verified by MD5, and sharding identical to
DistributedSampler.

runtime.data runs in child processes (grading/launch.py run_alone), which return tensors, numbers
and strings: it is imported inside those functions, never at the top, as this module is also
imported by the process that decides the tests (grading/judge.py)."""
import gzip
import os
import re

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from grading.launch import run_alone
from grading.sandbox import run_interpreter
from tests.harness import write_dataset

SPLITS = ("train", "val", "test")


def load_splits(name, data_dir, options):
    """data.load(name, data_dir, **options): each split's images, labels and length."""
    from runtime import data

    loaded = data.load(name, data_dir, **options)
    return {split: {"images": getattr(loaded, split).images,
                    "labels": getattr(loaded, split).labels,
                    "length": len(getattr(loaded, split))} for split in SPLITS}


def split_lengths(name, data_dir, options):
    """The lengths of the splits data.load(name, data_dir, **options) gives."""
    from runtime import data

    loaded = data.load(name, data_dir, **options)
    return [len(getattr(loaded, split)) for split in SPLITS]


def fetch_then_count(name, data_dir, offline_dir):
    """data.fetch from `offline_dir`, then the lengths of the default splits."""
    from runtime import data

    data.fetch(name, data_dir, offline_dir=offline_dir)
    return split_lengths(name, data_dir, {})


def data_error(function_name, args, options):
    """The message of the DataError that data.FUNCTION_NAME(*args, **options) raises; None if it
    raises none (any other error fails the child, and so the test)."""
    from runtime import data

    try:
        getattr(data, function_name)(*args, **options)
    except data.DataError as error:
        return str(error)
    return None


def assert_data_error(message, pattern):
    """As pytest.raises(DataError, match=pattern) would check it."""
    assert message is not None, "no DataError raised"
    assert re.search(pattern, message), message


def test_torchvision_imports_on_this_torch_in_a_fresh_interpreter():
    code = ("from runtime import data; torchvision = data.import_torchvision(); "
            "print(torchvision.datasets.MNIST.__name__)")
    done = run_interpreter(["-c", code], timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "MNIST"


@pytest.mark.rubric("core.mlp")
def test_splits_are_normalised_float_tensors_held_in_memory(tiny_data):
    loaded = run_alone(load_splits, "mnist", tiny_data, {"val_samples": 100})
    assert loaded["train"]["images"].shape == (500, 1, 28, 28)
    assert loaded["train"]["images"].dtype == torch.float32
    assert loaded["val"]["length"] == 100 and loaded["test"]["length"] == 200
    assert loaded["train"]["labels"].dtype == torch.int64
    pixels = torch.cat([loaded["train"]["images"], loaded["val"]["images"]])
    raw_min = (0 - 0.1307) / 0.3081
    assert abs(pixels.min().item() - raw_min) < 1e-5  # uint8 0 maps to -mean/std


def read_both_ways(data_dir):
    """Per split, (images, labels) as data.read_idx reads the raw files and as torchvision's
    dataset class does."""
    from runtime import data

    mnist = data.dataset_class("mnist")
    read = {}
    for train, split in ((True, "train"), (False, "test")):
        reference = mnist(data_dir, train=train, download=False)
        images, labels = (data.read_idx(os.path.join(data_dir, "MNIST", "raw", name), dimensions)
                          for name, dimensions in zip(data.RAW_FILES[split], (3, 1)))
        read[split] = {"ours": (images, labels),
                       "torchvision": (reference.data, reference.targets)}
    return read


def test_the_files_read_as_torchvision_reads_them(tiny_data):
    for split, read in run_alone(read_both_ways, tiny_data).items():
        (images, labels), (reference_images, reference_labels) = read["ours"], read["torchvision"]
        assert torch.equal(images, reference_images) and torch.equal(labels, reference_labels), \
            split


@pytest.mark.parametrize("damage, message", [(lambda raw: raw[:-1], "truncated"),
                                             (lambda raw: b"\x1f\x8b" + raw[2:], "not a 1-dim")])
def test_a_damaged_extracted_file_is_one_clear_error(tiny_data, damage, message):
    labels = os.path.join(tiny_data, "MNIST", "raw", "t10k-labels-idx1-ubyte")
    with open(labels, "rb") as file:
        raw = file.read()
    with open(labels, "wb") as file:
        file.write(damage(raw))
    error = run_alone(data_error, "load", ("mnist", tiny_data), {"val_samples": 10})
    assert_data_error(error, message)


@pytest.mark.rubric("core.mlp")
def test_validation_split_is_seeded_and_disjoint_from_training(tiny_data):
    first, again, other = (run_alone(load_splits, "mnist", tiny_data,
                                     {"val_samples": 100, "seed": seed}) for seed in (1, 1, 2))
    assert torch.equal(first["val"]["images"], again["val"]["images"])
    assert not torch.equal(first["val"]["images"], other["val"]["images"])
    train_rows = {tuple(row.tolist()) for row in first["train"]["images"].flatten(1)[:, :60]}
    assert not any(tuple(row.tolist()) in train_rows
                   for row in first["val"]["images"].flatten(1)[:, :60])


@pytest.mark.rubric("core.mlp")
def test_subsets_keep_only_the_requested_number_of_samples(tiny_data):
    options = {"val_samples": 50, "train_samples": 120, "test_samples": 30}
    assert run_alone(split_lengths, "mnist", tiny_data, options) == [120, 50, 30]


def test_fashion_mnist_reads_its_own_folder(tmp_path):
    root = write_dataset(str(tmp_path), folder="FashionMNIST")
    _, _, test = run_alone(split_lengths, "fashion-mnist", root, {"val_samples": 10})
    assert test == 200


def test_an_offline_folder_without_the_files_is_one_clear_error(tmp_path):
    error = run_alone(data_error, "fetch", ("mnist", str(tmp_path / "data")),
                      {"offline_dir": str(tmp_path / "empty")})
    assert_data_error(error, "offline-data-dir")


def resource_files(name):
    """The names of the files torchvision downloads for dataset `name`."""
    from runtime import data

    return [file for file, _ in data.dataset_class(name).resources]


def test_a_corrupt_offline_file_is_refused_by_its_md5_and_nothing_is_copied(tmp_path):
    raw = tmp_path / "offline" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for file in run_alone(resource_files, "mnist"):
        with gzip.open(raw / file, "wb") as handle:
            handle.write(b"not the real thing")
    error = run_alone(data_error, "fetch", ("mnist", str(tmp_path / "data")),
                      {"offline_dir": str(tmp_path / "offline")})
    assert_data_error(error, "corrupt or truncated")
    assert not (tmp_path / "data").exists()


def test_the_offline_copy_is_verified_extracted_and_leaves_the_source_untouched(
        tmp_path, real_data):
    before = sorted(os.listdir(os.path.join(real_data, "MNIST", "raw")))
    lengths = run_alone(fetch_then_count, "mnist", str(tmp_path), real_data)
    assert sorted(os.listdir(os.path.join(real_data, "MNIST", "raw"))) == before
    assert lengths == [55000, 5000, 10000]


def shards(calls):
    """data.shard_indices(num_samples, batch_size, rank, world_size, epoch, seed) for each
    argument tuple in `calls`."""
    from runtime import data

    return [data.shard_indices(*call) for call in calls]


@pytest.mark.rubric("core.minibatch")
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_are_exactly_what_distributed_sampler_gives(world_size):
    cases = [(epoch, rank) for epoch in (0, 3) for rank in range(world_size)]
    computed = run_alone(shards, [(1003, 16, rank, world_size, epoch, 7)
                                  for epoch, rank in cases])
    for (epoch, rank), shard in zip(cases, computed):
        sampler = DistributedSampler(range(1003), world_size, rank, shuffle=True, seed=7,
                                     drop_last=True)
        sampler.set_epoch(epoch)
        expected = list(sampler)
        assert shard.flatten().tolist() == expected[:shard.numel()], (epoch, rank)


@pytest.mark.rubric("core.minibatch")
def test_shards_are_disjoint_and_cover_every_full_global_batch():
    computed = run_alone(shards, [(1000, 10, rank, 4, 0, 0) for rank in range(4)])
    together = torch.cat([shard.flatten() for shard in computed])
    assert len(set(together.tolist())) == together.numel() == 1000 // 40 * 40


@pytest.mark.rubric("core.minibatch")
def test_set_epoch_changes_the_order():
    first_epoch, second_epoch = run_alone(shards, [(1000, 10, 0, 2, 0, 0), (1000, 10, 0, 2, 1, 0)])
    assert not torch.equal(first_epoch, second_epoch)


@pytest.mark.rubric("core.minibatch")
def test_the_global_batch_of_each_step_is_the_same_set_for_any_world_size():
    global_batch = 24
    (reference,) = run_alone(shards, [(1000, global_batch, 0, 1, 2, 5)])
    for world_size in (2, 3, 4):
        world = run_alone(shards, [(1000, global_batch // world_size, rank, world_size, 2, 5)
                                   for rank in range(world_size)])
        for step in range(len(reference)):
            together = sorted(torch.cat([shard[step] for shard in world]).tolist())
            assert together == sorted(reference[step].tolist())


def eval_slices(num_samples, world_size):
    """Each rank's data.eval_range, as (start, stop, step)."""
    from runtime import data

    slices = [data.eval_range(num_samples, rank, world_size) for rank in range(world_size)]
    return [(part.start, part.stop, part.step) for part in slices]


@pytest.mark.rubric("core.minibatch")
@pytest.mark.parametrize("world_size", [1, 3, 7])
def test_evaluation_slices_count_every_sample_exactly_once(world_size):
    covered = [index for start, stop, step in run_alone(eval_slices, 10, world_size)
               for index in range(10)[start:stop:step]]
    assert covered == list(range(10))
