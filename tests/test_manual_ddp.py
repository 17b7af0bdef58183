"""ManualDDP's own semantics, with a strategy of the tests' own (tests/adapters.py), so that none
of the lesson's strategies is needed: buffers broadcast before a forward as DDP does, and
gradient accumulation under no_sync(). The start-up broadcast is checked in
tests/test_gradient_sync.py (test_manual_ddp_starts_...).

The code under test is imported inside the functions that run in the child processes, never at the
top: this module is also imported by the process that decides the tests (grading/judge.py).
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from grading.launch import run_in_processes
from tests.differences import assert_same

pytestmark = pytest.mark.rubric("core.manual_ddp")

BATCH = 8


def batch(rank, micro_batch):
    generator = torch.Generator().manual_seed(100 * rank + micro_batch)
    return torch.randn(BATCH, 1, 28, 28, generator=generator), \
        torch.randint(0, 10, (BATCH,), generator=generator)


def counting_strategy():
    """The tests' strategy, counting the gradients reported to it."""
    from tests.adapters import AverageEachAfterBackward

    class Counting(AverageEachAfterBackward):
        reported = 0

        def grad_ready(self, param):
            Counting.reported += 1

    return Counting


def accumulate(rank, world_size):
    """Two micro-batches, the first under no_sync(), each loss halved as the trainer does; the
    gradients, what was reported inside no_sync(), and whether no_sync() ends on an error."""
    from runtime.manual_ddp import ManualDDP
    from tests.adapters import small_mlp

    torch.manual_seed(0)
    strategy = counting_strategy()
    model = ManualDDP(small_mlp(), strategy)
    with model.no_sync():
        images, labels = batch(rank, 0)
        (F.cross_entropy(model(images), labels) / 2).backward()
    reported_inside = strategy.reported
    images, labels = batch(rank, 1)
    (F.cross_entropy(model(images), labels) / 2).backward()
    model.finish_gradient_synchronization()
    gradients = [param.grad.clone() for param in model.parameters()]
    try:
        with model.no_sync():
            raise KeyError("inside")
    except KeyError:
        pass
    return gradients, reported_inside, model.accumulating


def one_process_gradients(world_size):
    """The same model's gradient on every rank's two micro-batches at once."""
    from tests.adapters import small_mlp

    torch.manual_seed(0)
    model = small_mlp()
    parts = [batch(rank, micro) for rank in range(world_size) for micro in range(2)]
    images = torch.cat([images for images, _ in parts])
    labels = torch.cat([labels for _, labels in parts])
    F.cross_entropy(model(images), labels).backward()
    return [param.grad for param in model.parameters()]


@pytest.mark.parametrize("world_size", [2, 3])
def test_no_sync_accumulates_locally_and_the_next_backward_averages_the_sum(world_size):
    expected = one_process_gradients(world_size)
    for rank, (gradients, reported_inside, accumulating) in enumerate(
            run_in_processes(world_size, accumulate)):
        assert reported_inside == 0, f"rank {rank}: no_sync() still reported gradients"
        for index, (got, want) in enumerate(zip(gradients, expected)):
            where = f"rank {rank}, parameter {index}: against one process on the larger batch"
            assert_same(got, want, where, atol=1e-6, rtol=1e-5)
        assert not accumulating, "no_sync() left accumulating on after an error inside it"


def buffers_after_an_evaluation_forward(rank, world_size, broadcast_buffers):
    """A training step on this rank's own data (so BatchNorm's running statistics differ), then a
    forward in evaluation mode: rank 0's running mean before it, and every rank's after it."""
    from runtime.manual_ddp import ManualDDP
    from tests.adapters import AverageEachAfterBackward

    torch.manual_seed(0)
    module = nn.Sequential(nn.Flatten(), nn.Linear(784, 16), nn.BatchNorm1d(16), nn.ReLU(),
                           nn.Linear(16, 10))
    model = ManualDDP(module, AverageEachAfterBackward, broadcast_buffers=broadcast_buffers)
    images, labels = batch(rank, 0)
    F.cross_entropy(model(images + rank), labels).backward()
    model.finish_gradient_synchronization()
    before = module[2].running_mean.clone()
    dist.broadcast(before, 0)
    module.eval()
    with torch.no_grad():
        model(images)
    return before, module[2].running_mean.clone()


def test_buffers_are_rank_0s_after_the_next_forward_and_only_with_broadcast_buffers():
    for rank, (rank0_before, after) in enumerate(
            run_in_processes(2, buffers_after_an_evaluation_forward, True)):
        assert torch.equal(after, rank0_before), f"rank {rank} kept its own running mean"
    (_, own0), (_, own1) = run_in_processes(2, buffers_after_an_evaluation_forward, False)
    assert not torch.equal(own0, own1), "broadcast_buffers=False still broadcast the buffers"
