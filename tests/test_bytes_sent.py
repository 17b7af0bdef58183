"""The bytes that leave a rank, as the timing layer measures them for ZeRO-1, -2 and -3: over the
hand-written ring halves, counted at each point-to-point send, they are the formula's (2P(n-1)/n
for ZeRO-1 and ZeRO-2, DDP's; 3P(n-1)/n for ZeRO-3); over the library (gloo) they are what its
process group sends, where a reduce-scatter costs a whole all-reduce.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grading.launch import run_in_processes

WORLD = 3
STEPS = 2
LEVELS = ("optimizer", "gradients", "parameters")  # ZeRO-1, ZeRO-2, ZeRO-3


def bytes_per_step(rank, world_size, level, transport):
    """This rank's StepTimer.bytes_sent() after STEPS steps at `level` over `transport`,
    and the padded bytes of the flat shards (P)."""
    from runtime.sharded import wrap_sharded
    from runtime.timing import StepTimer

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    timer = StepTimer()
    # 1e-4 MiB: ZeRO-2 sends each of the two layers' gradients in a bucket of its own
    wrapped = wrap_sharded(module, level, 1e-4, transport=transport, recorder=timer.comm)
    optimizer = wrapped.make_optimizer(torch.optim.SGD, lr=0.1)
    for step in range(STEPS):
        generator = torch.Generator().manual_seed(100 * step + rank)
        inputs, labels = torch.randn(4, 6, generator=generator), torch.randint(0, 3, (4,))
        timer.start_step()
        F.cross_entropy(wrapped(inputs), labels).backward()
        wrapped.finish_gradient_synchronization()
        optimizer.step()
        optimizer.zero_grad()
        timer.end_step()
    shards = wrapped.shards if level == "parameters" else wrapped.optimizer.shards
    return timer.bytes_sent(), 4 * sum(shard.padded_numel for shard in shards)


@pytest.mark.parametrize("level", LEVELS)
def test_over_the_ring_halves_each_level_sends_the_formulas_bytes(level):
    for sent, padded in run_in_processes(WORLD, bytes_per_step, level, "ring"):
        factor = 3 if level == "parameters" else 2  # ZeRO-3 gathers twice: forward, backward
        # counted at the sends: the ring's (n-1)/n of each tensor, exactly
        assert sent == {"transport": "point-to-point",
                        "measured_per_step": factor * padded * (WORLD - 1) // WORLD,
                        "ring_formula_per_step": factor * padded * (WORLD - 1) // WORLD}


@pytest.mark.parametrize("level", LEVELS)
def test_over_the_library_a_reduce_scatter_sends_a_whole_all_reduce(level):
    for sent, padded in run_in_processes(WORLD, bytes_per_step, level, "library"):
        gathers = 2 if level == "parameters" else 1
        # gloo's reduce-scatter: 2P(n-1)/n (an all-reduce); each all-gather P(n-1)/n
        assert sent["transport"] == "library"
        assert sent["measured_per_step"] == (2 + gathers) * padded * (WORLD - 1) // WORLD
        assert sent["ring_formula_per_step"] == (1 + gathers) * padded * (WORLD - 1) // WORLD


def test_a_step_without_collectives_sends_nothing_over_no_transport():
    from runtime.timing import StepTimer

    timer = StepTimer()
    timer.start_step()
    timer.end_step()
    # nothing timed: no transport to name, no bytes
    assert timer.bytes_sent() == {"transport": None, "measured_per_step": 0,
                                  "ring_formula_per_step": 0}
