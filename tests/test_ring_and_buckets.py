"""The hand-written ring equals the library's all-reduce; bucketed sync really overlaps backward.

The code under test is imported inside the functions that run in the child processes, never at the
top: this module is also imported by the process that decides the tests (grading/judge.py)."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from grading.launch import run_in_processes
from tests.differences import assert_none, difference_message

pytestmark = pytest.mark.rubric("core.bucketed")


def lengths_for(world_size):
    return sorted({0, 1, max(world_size - 1, 0), world_size + 1, 100_003})


def compare_ring_with_library(rank, world_size):
    from manual_collectives import ring_all_reduce

    mismatches = []  # each case's difference_message: None where it equals the library's
    for dtype in (torch.float32, torch.float64):
        for length in lengths_for(world_size):
            generator = torch.Generator().manual_seed(rank * 1000 + length)
            mine = torch.randn(length, generator=generator, dtype=dtype)
            library = mine.clone()
            ring_all_reduce(mine)
            dist.all_reduce(library)
            if not length:
                continue
            # Both add the same n numbers in different orders: each sum may differ by a few ulps
            # of the largest term.
            largest = max(library.abs().max().item(), 1)
            tolerance = world_size * torch.finfo(dtype).eps * largest * 4
            mismatches.append(difference_message(mine, library, f"rank {rank}, {dtype} of "
                                                 f"length {length}", atol=tolerance))
    return [mismatch for mismatch in mismatches if mismatch]


@pytest.mark.rubric("core.ring")
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_ring_all_reduce_equals_dist_all_reduce_for_awkward_lengths_and_dtypes(world_size):
    for mismatches in run_in_processes(world_size, compare_ring_with_library):
        assert_none(mismatches)


def noting_launches(launches, ready):
    """A layer around the all-reduce that notes each launch: (the tensor it sends, gradients ready
    then)."""
    def layer(all_reduce):
        def noted(tensor):
            launches.append((tensor, len(ready)))
            return all_reduce(tensor)
        return noted
    return layer


def named(launches, buckets):
    """The launches with each tensor named by the bucket whose buffer it is: "bucket <index>"."""
    index = {bucket.buffer.data_ptr(): number for number, bucket in enumerate(buckets)}
    return [(f"bucket {index[tensor.data_ptr()]}", ready) for tensor, ready in launches]


def record_bucket_launches(rank, world_size):
    """Train two steps with small buckets; return each step's launches, as they were when
    backward returned and after finishing."""
    from manual_allreduce import BucketedSync
    from tests.adapters import StrategyAlone, small_mlp

    torch.manual_seed(0)
    module = small_mlp()
    ready = []  # this backward's gradients, counted by a hook that runs before the strategy's
    for param in module.parameters():
        param.register_post_accumulate_grad_hook(ready.append)
    launches = []
    model = StrategyAlone(module, "bucketed", bucket_mb=0.01,  # the first layer's weight alone
                          layers=[noting_launches(launches, ready)])
    assert isinstance(model.sync, BucketedSync)
    steps = []
    for step in range(2):
        generator = torch.Generator().manual_seed(step * 10 + rank)
        images = torch.randn(16, 1, 28, 28, generator=generator)
        launches.clear()
        ready.clear()
        F.cross_entropy(model(images), torch.zeros(16, dtype=torch.long)).backward()
        launched_during_backward = named(launches, model.sync.buckets)  # before finish()
        model.finish_gradient_synchronization()
        steps.append({"during_backward": launched_during_backward,
                      "all": named(launches, model.sync.buckets),
                      "buckets": len(model.sync.buckets), "gradients": len(model.sync.params)})
    return steps


def test_bucketed_launches_the_first_all_reduce_before_backward_has_finished():
    for rank, steps in enumerate(run_in_processes(2, record_bucket_launches)):
        for step in steps:
            assert step["buckets"] > 1, "the test needs several buckets"
            first_bucket, grads_ready_at_launch = step["during_backward"][0]
            assert first_bucket == "bucket 0"
            assert grads_ready_at_launch < step["gradients"], \
                f"rank {rank}: bucket 0 started only once all {step['gradients']} were ready"


def bucket_layout(rank, world_size):
    from manual_allreduce import BucketedSync

    # 784 KiB, 1 KiB, 256 KiB, 1 KiB, 10 KiB and 40 bytes: one weight larger than the cap
    module = nn.Sequential(nn.Linear(784, 256), nn.Linear(256, 256), nn.Linear(256, 10))
    params = list(module.parameters())
    sync = BucketedSync(params, bucket_mb=0.5)
    position = {id(param): index for index, param in enumerate(params)}
    layout = [[position[id(param)] for param in bucket.params] for bucket in sync.buckets]
    return layout, [bucket.buffer.numel() * 4 for bucket in sync.buckets]


def test_buckets_fill_in_reverse_registration_order_and_respect_the_cap():
    layout, sizes = run_in_processes(1, bucket_layout)[0]  # BucketedSync needs a group
    assert [index for bucket in layout for index in bucket] == list(range(6))[::-1]
    assert layout == [[5, 4, 3, 2, 1], [0]]
    for bucket, size in zip(layout, sizes):
        assert len(bucket) == 1 or size <= 0.5 * 2**20, f"bucket {bucket} holds {size} bytes"
