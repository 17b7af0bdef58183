"""FullyShardedModel seen from a torch user's side, as fully_shard is: the optimizer built over
`model.parameters()` trains; one over the parameters taken before wrapping is refused in one line;
a trainable layer left out of every unit is sharded in a last unit, alike on every rank; and no
thread is left waiting for a collective after the last step.
"""
import threading

import torch
import torch.nn.functional as F
from torch import nn

from grading.launch import launch_once, run_in_processes
from tests.differences import assert_same

STEPS = 3


def layer_norm_between():
    """Linear, LayerNorm, Linear: the LayerNorm is the layer a user's `units` may leave out."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3))


def batch(step, rank):
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 6, generator=generator), torch.randint(0, 3, (4,), generator=generator)


def train_step(model, optimizer, inputs_and_labels):
    """One step of a FullyShardedModel as a torch user writes it."""
    inputs, labels = inputs_and_labels
    F.cross_entropy(model(inputs), labels).backward()
    model.finish_gradient_synchronization()
    optimizer.step()
    optimizer.zero_grad()


def whole_parameters(model):
    """{name: whole parameter} of a FullyShardedModel (a collective)."""
    from runtime.sharded import FullyShardedTraining

    with FullyShardedTraining.whole(model) as module:
        return {name: param.detach().clone() for name, param in module.named_parameters()}


def every_case(rank, world_size):
    """Each test's case, in one launch of 2 ranks: the threads' first, before any other."""
    return {"threads": threads_of_three_steps(rank, world_size),
            "layer outside": train_with_a_layer_outside_every_unit(rank, world_size),
            "optimizer over freed": optimizer_over_freed(rank, world_size)}


@launch_once
def launch():
    return run_in_processes(2, every_case)


def train_with_a_layer_outside_every_unit(rank, world_size):
    """Every rank's whole parameters after STEPS steps of SGD, built over model.parameters(), the
    LayerNorm in no unit; and one process's, trained on the global batch."""
    from manual_sharding import FullyShardedModel
    from runtime.sharded import collectives

    net = layer_norm_between()
    model = FullyShardedModel(net, units=[[net[0]], [net[2]]], **collectives("library"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference = layer_norm_between()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(STEPS):
        train_step(model, optimizer, batch(step, rank))
        everyone = [batch(step, each) for each in range(world_size)]
        inputs = torch.cat([inputs for inputs, _ in everyone])
        labels = torch.cat([labels for _, labels in everyone])
        F.cross_entropy(reference(inputs), labels).backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    return whole_parameters(model), dict(reference.named_parameters())


def test_a_trainable_layer_in_no_unit_is_sharded_in_a_last_unit_and_alike_on_every_rank():
    """The LayerNorm left out of `units` goes to a last unit, as fully_shard's root holds what no
    layer took: every rank holds the same parameters, to the bit, and they are one process's on
    the global batch."""
    outcomes = [outcome["layer outside"] for outcome in launch()]
    (first, reference), (second, _) = outcomes
    assert set(first) == set(reference)
    for name, value in first.items():
        # the ranks never drift apart
        assert_same(second[name], value, f"rank 1, parameter '{name}', against rank 0")
        # and they train what one process trains
        assert_same(value, reference[name].detach(),
                    f"rank 0, parameter '{name}', against one process", atol=1e-6, rtol=1e-5)


def optimizer_over_freed(rank, world_size):
    """What stepping an optimizer over the parameters taken before wrapping says."""
    from manual_sharding import FullyShardedModel

    net = layer_norm_between()
    taken_before = list(net.parameters())
    model = FullyShardedModel(net)
    optimizer = torch.optim.SGD(taken_before, lr=0.1)
    F.cross_entropy(model(torch.randn(2, 6)), torch.tensor([0, 1])).backward()
    model.finish_gradient_synchronization()
    try:
        optimizer.step()
    except ValueError as error:
        return str(error)
    return "stepped"


def test_an_optimizer_over_the_parameters_taken_before_wrapping_is_refused():
    """They are freed: stepping them would change nothing, silently. One line says what to do."""
    for said in [outcome["optimizer over freed"] for outcome in launch()]:
        assert "build it over model.parameters() after wrapping" in said, said
        assert "\n" not in said


# --- A process that ends right after its last step ----------------------------------------------
def threads_of_three_steps(rank, world_size):
    """The Python threads started during 3 steps through the library's collectives (gloo's
    reduce-scatter has no future of its own), and those alive after them, when a process may
    destroy its group and end."""
    from manual_sharding import FullyShardedModel
    from runtime.sharded import collectives

    started = []
    start = threading.Thread.start

    def counted(thread):
        started.append(thread.name)
        start(thread)

    threading.Thread.start = counted
    try:
        model = FullyShardedModel(layer_norm_between(), **collectives("library"))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(STEPS):
            train_step(model, optimizer, batch(step, rank))
    finally:
        threading.Thread.start = start
    return started, sorted(thread.name for thread in threading.enumerate())


def test_no_thread_waits_for_a_collective_so_none_outlives_the_last_step():
    """A thread still waiting for a collective when the group is destroyed aborts the process at
    exit ("terminate called without an active exception"): no thread is started at all."""
    for started, alive in [outcome["threads"] for outcome in launch()]:
        assert started == [] and alive == ["MainThread"], (started, alive)
