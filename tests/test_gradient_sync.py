"""Every hand-written strategy trains exactly the model that torch's DDP, and one process on the
global batch, train.

Each strategy runs in real gloo processes of its own, once per world size (so a correct
strategy passes beside an unfinished one), driven alone as ManualDDP drives it
(tests/adapters.py: no other piece of the lesson is needed). Every rank trains every model on
its slice of the same global batches; after every step rank 0 compares its parameters with
DDP's and with a one-process model trained on the whole global batch, and every rank compares
its parameters with rank 0's. SGD without momentum keeps a gradient summed instead of averaged
visible (Adam would hide any constant factor). ManualDDP's start-up broadcast is checked apart,
with a strategy of the tests' own.

The code under test is imported inside the functions that run in the child processes, never at the
top: this module is also imported by the process that decides the tests (grading/judge.py).
The one-process reference trains the same models, so it runs in a child too.
"""
import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from grading.launch import launch_once, run_alone, run_in_processes
from tests.adapters import SYNCED
from tests.differences import assert_same

STEPS = 3
BATCH_PER_RANK = 8
LR = 0.1
WIRE_PRECISION_BITS = {"fp16": 11, "bf16": 8}  # significand bits, the implicit one included


class FrozenFirstLayer(nn.Module):
    """A trap: the first layer is frozen, so a strategy must leave its (absent) gradient alone."""

    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(784, 32)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(32, 10)

    def forward(self, images):
        return self.head(torch.relu(self.frozen(images.flatten(1))))


class SharedWeight(nn.Module):
    """A trap: one weight used by two layers; its gradient must be reduced once, not twice."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(784, 32)
        self.first = nn.Linear(32, 32)
        self.second = nn.Linear(32, 32)
        self.second.weight = self.first.weight
        self.out = nn.Linear(32, 10)

    def forward(self, images):
        hidden = torch.relu(self.inp(images.flatten(1)))
        return self.out(torch.relu(self.second(torch.relu(self.first(hidden)))))


def mlp():
    """An MLP of the tests' own (Task 1's is checked on its own)."""
    from tests.adapters import small_mlp

    return small_mlp()


def cnn():
    """The CNN without dropout."""
    from runtime.models import CNN

    return CNN(dropout=(0.0, 0.0))


MODELS = {"mlp": mlp, "cnn": cnn, "frozen": FrozenFirstLayer, "shared": SharedWeight}


def global_batches(world_size):
    generator = torch.Generator().manual_seed(1234)
    size = STEPS * BATCH_PER_RANK * world_size
    images = torch.randn(size, 1, 28, 28, generator=generator)
    return images, torch.randint(0, 10, (size,), generator=generator)


def flat_parameters(model):
    """{name: a copy} of the model's parameters: a failure can then name the first that differs."""
    return {name: param.detach().clone() for name, param in model.named_parameters()}


def flattened(parameters):
    """One tensor of every parameter's elements, in order."""
    return torch.cat([tensor.reshape(-1) for tensor in parameters.values()])


def assert_parameters_close(got, want, when):
    """Each parameter as the reference's, to float32 summation-order tolerance; a failure names
    the step and the first parameter that differs, expected against got."""
    __tracebackhide__ = True  # the failure points at the test's line
    for name in want:
        assert_same(got[name], want[name], f"{when}, parameter '{name}'", atol=1e-6, rtol=1e-5)


def trainable(model):
    return [param for param in model.parameters() if param.requires_grad]


def train_one_process(model_name, world_size):
    """The reference: one process, the whole global batch each step; parameters after each step."""
    torch.manual_seed(0)  # rank 0's seed: the distributed runs broadcast rank 0's parameters
    model = MODELS[model_name]()
    optimizer = torch.optim.SGD(trainable(model), lr=LR)
    images, labels = global_batches(world_size)
    history = []
    largest_gradient = 0.0
    global_batch = BATCH_PER_RANK * world_size
    for step in range(STEPS):
        batch = slice(step * global_batch, (step + 1) * global_batch)
        F.cross_entropy(model(images[batch]), labels[batch]).backward()
        gradients = [param.grad for param in model.parameters() if param.grad is not None]
        largest_gradient = max([largest_gradient] + [grad.abs().max().item() for grad in gradients])
        optimizer.step()
        optimizer.zero_grad()
        history.append(flat_parameters(model))
    return history, largest_gradient


def train_distributed(rank, world_size, model_name, mode, strategy, compress):
    """Mode ddp: torch's DDP (the given wrapper); mode manual: the strategy alone, with the
    lesson's compression layer for `compress`."""
    from runtime.timing import CommRecorder
    from runtime.wrappers import SyncOptions, compression_layers, wrap_model
    from tests.adapters import StrategyAlone

    torch.manual_seed(0)  # every rank builds rank 0's model: nothing here broadcasts it
    model = MODELS[model_name]()
    if mode == "ddp":
        wrapped = wrap_model(model, SyncOptions(mode, bucket_mb=0.5, compress=compress),
                             CommRecorder())
    else:
        sync, transport = SYNCED[strategy]
        wrapped = StrategyAlone(model, sync, bucket_mb=0.5, layers=compression_layers(compress),
                                transport=transport)
    optimizer = torch.optim.SGD(trainable(model), lr=LR)
    images, labels = global_batches(world_size)
    history = [flat_parameters(model)]  # after construction, before any step
    for step in range(STEPS):
        first = (step * world_size + rank) * BATCH_PER_RANK
        mine = slice(first, first + BATCH_PER_RANK)
        F.cross_entropy(wrapped(images[mine]), labels[mine]).backward()
        wrapped.finish_gradient_synchronization()
        optimizer.step()
        optimizer.zero_grad()
        history.append(flat_parameters(model))
    return history


def run_all(rank, world_size, configurations):
    """Every configuration on this rank; rank 0 returns its parameter histories, every rank its
    distances to rank 0's."""
    outcome = {}
    for configuration in configurations:
        history = train_distributed(rank, world_size, *configuration)
        distances = []
        for parameters in history:
            params = flattened(parameters)
            from_rank0 = params.clone()
            dist.broadcast(from_rank0, 0)
            distances.append((params - from_rank0).abs().max().item())
        outcome[configuration] = (history if rank == 0 else None, distances)
    return outcome


def configurations(strategy=None, compressed=None):
    """(model, mode, strategy, wire dtype) of every run; with `strategy` ("ddp" for DDP) and
    `compressed`, only those runs: what one launch trains."""
    exact = [(model, "manual", strategy, None) for model in MODELS for strategy in SYNCED]
    exact += [(model, "ddp", None, None) for model in MODELS]
    wired = [("mlp", "manual", strategy, wire)
             for strategy in SYNCED if strategy != "naive" for wire in WIRE_PRECISION_BITS]
    wired += [("mlp", "ddp", None, wire) for wire in WIRE_PRECISION_BITS]
    return [run for run in exact + wired
            if strategy is None or ((run[2] or "ddp") == strategy
                                    and (run[3] is not None) == compressed)]


@launch_once
def launch(world_size, strategy, compressed):
    """One launch per strategy, world size and whether compressed: a strategy that fails fails
    only its own tests, and one whose compression fails (another item) only its compressed ones."""
    return run_in_processes(world_size, run_all, configurations(strategy, compressed),
                            timeout_s=120)


def outcomes(world_size, configuration):
    """Rank by rank, {configuration: (history, distances)} of the launch that trained it."""
    return launch(world_size, configuration[2] or "ddp", configuration[3] is not None)


def train_one_process_each(world_size):
    """train_one_process for every model, in one child: a launch costs most of a second."""
    return {model_name: train_one_process(model_name, world_size) for model_name in MODELS}


@launch_once
def references(world_size):
    # one launch for every model, as outcomes() is: a model that fails fails both at this size
    return run_alone(train_one_process_each, world_size)


def reference(model_name, world_size):
    return references(world_size)[model_name]


WORLD_SIZES = (1, 2, 3, 4)
# one rank sends nothing to round; at 2 and 3 ranks every strategy's compressed wire is checked
# against DDP's fp16/bf16 hooks by the parity tests
COMPRESSED_WORLD_SIZES = (4,)
EXACT = [configuration for configuration in configurations() if configuration[3] is None]
COMPRESSED = [configuration for configuration in configurations() if configuration[3] is not None]


# The rubric item of each strategy's exact runs: a strategy driven alone counts for its own piece
RUBRIC_ITEM = {
    "naive": pytest.mark.rubric("core.per_parameter"),  # average_gradients, as the trainer runs it
    "per-param": pytest.mark.rubric("core.per_parameter"),
    "flat": pytest.mark.rubric("core.flat"),
    "flat-shm": pytest.mark.rubric("core.flat"),  # the flat buffer, summed through shared memory
    "bucketed": pytest.mark.rubric("core.bucketed"),
    "flat-ring": pytest.mark.rubric("core.end_to_end"),  # through the hand-written ring: two items
    "ddp": pytest.mark.rubric(),  # torch's DDP against one process: the tests' own reference
}


def name(configuration):
    return "-".join(str(part) for part in configuration if part)


def cases(configurations):
    """Each exact configuration as a test case named by name(), marked with its strategy's item."""
    return [pytest.param(configuration, id=name(configuration),
                         marks=RUBRIC_ITEM[configuration[2] or "ddp"])
            for configuration in configurations]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("configuration", cases(EXACT))
def test_every_step_equals_one_process_on_the_global_batch(world_size, configuration):
    history, _ = outcomes(world_size, configuration)[0][configuration]
    expected, _ = reference(configuration[0], world_size)
    for step, (got, want) in enumerate(zip(history[1:], expected), start=1):
        assert_parameters_close(got, want, f"after step {step}, against one process")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("configuration", cases(c for c in EXACT if c[1] == "manual"))
def test_every_step_equals_torch_ddp(world_size, configuration):
    history, _ = outcomes(world_size, configuration)[0][configuration]
    ddp = (configuration[0], "ddp", None, None)
    ddp_history, _ = outcomes(world_size, ddp)[0][ddp]
    for step, (got, want) in enumerate(zip(history, ddp_history)):
        assert_parameters_close(got, want, f"after step {step}, against torch's DDP")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("configuration", cases(EXACT))
def test_every_rank_holds_rank_0s_parameters_after_every_step(world_size, configuration):
    for rank, result in enumerate(outcomes(world_size, configuration)):
        _, distances = result[configuration]
        assert distances == [0.0] * (STEPS + 1), f"rank {rank} differs from rank 0 by {distances}"


# a strategy and the compression layer together: two items, the main job's (DDP's runs too)
@pytest.mark.rubric("core.end_to_end")
@pytest.mark.parametrize("world_size", COMPRESSED_WORLD_SIZES)
@pytest.mark.parametrize("configuration", COMPRESSED, ids=name)
def test_compressed_gradients_stay_within_the_wire_precision(world_size, configuration):
    """Bound: each averaged gradient element is rounded to the wire dtype at most once per rank's
    contribution and once per partial sum, so its error is below world_size * 2^-p * max|g|
    (p significand bits); an SGD step moves a parameter by lr * g, and errors add up over steps.
    Every rank must still hold rank 0's parameters."""
    runs = outcomes(world_size, configuration)
    for rank, result in enumerate(runs):
        _, distances = result[configuration]
        assert distances == [0.0] * (STEPS + 1), f"rank {rank} differs from rank 0 by {distances}"
    history, _ = runs[0][configuration]
    expected, largest_gradient = reference(configuration[0], world_size)
    unit = 2.0 ** -WIRE_PRECISION_BITS[configuration[3]]
    for step, (got, want) in enumerate(zip(history[1:], expected), start=1):
        bound = step * LR * world_size * unit * largest_gradient + 1e-6
        error = (flattened(got) - flattened(want)).abs().max().item()
        assert error <= bound, f"after step {step}: error {error:.3g} above the bound {bound:.3g}"
        if world_size > 1 and step == 1:
            assert error > 0, "compressed and exact runs agree to the bit: was anything compressed?"


def average_by_hand(rank, world_size):
    """One backward's gradients averaged by `average_gradients`, against the gradient of one
    process on the whole global batch: the largest difference."""
    from manual_allreduce import average_gradients
    from tests.adapters import small_mlp

    torch.manual_seed(0)
    model = small_mlp()
    whole = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(BATCH_PER_RANK * world_size, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (BATCH_PER_RANK * world_size,), generator=generator)
    mine = slice(rank * BATCH_PER_RANK, (rank + 1) * BATCH_PER_RANK)
    F.cross_entropy(model(images[mine]), labels[mine]).backward()
    average_gradients(model)
    F.cross_entropy(whole(images), labels).backward()
    return max((got.grad - want.grad).abs().max().item()
               for got, want in zip(model.parameters(), whole.parameters()))


@pytest.mark.rubric("core.per_parameter")
def test_average_gradients_the_plain_version_equals_one_process_on_the_global_batch():
    for rank, difference in enumerate(run_in_processes(3, average_by_hand)):
        assert difference <= 1e-6, f"rank {rank}: gradients differ by up to {difference:.3g}"


def start_from_rank_0(rank, world_size):
    """ManualDDP around differently seeded ranks, with the tests' own strategy: the largest
    distance of the parameters to rank 0's after construction (buffers too) and after each of
    STEPS steps (a rank's BatchNorm statistics differ until the next forward re-broadcasts them)."""
    from runtime.manual_ddp import ManualDDP
    from tests.adapters import AverageEachAfterBackward

    torch.manual_seed(rank)  # different parameters per rank: ManualDDP must broadcast rank 0's
    model = nn.Sequential(nn.Linear(784, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
    wrapped = ManualDDP(model, AverageEachAfterBackward)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    images, labels = global_batches(world_size)
    distances = []
    for step in range(STEPS + 1):
        tensors = list(model.parameters()) + (list(model.buffers()) if step == 0 else [])
        state = torch.cat([tensor.detach().reshape(-1).float() for tensor in tensors])
        from_rank0 = state.clone()
        dist.broadcast(from_rank0, 0)
        distances.append((state - from_rank0).abs().max().item())
        if step == STEPS:
            break
        mine = slice((step * world_size + rank) * BATCH_PER_RANK,
                     (step * world_size + rank + 1) * BATCH_PER_RANK)
        F.cross_entropy(wrapped(images[mine].flatten(1)), labels[mine]).backward()
        wrapped.finish_gradient_synchronization()
        optimizer.step()
        optimizer.zero_grad()
    return distances


@pytest.mark.rubric("core.manual_ddp")  # ManualDDP with the tests' own strategy
@pytest.mark.parametrize("world_size", [2, 4])
def test_manual_ddp_starts_ranks_seeded_differently_from_rank_0s_parameters(world_size):
    for rank, distances in enumerate(run_in_processes(world_size, start_from_rank_0)):
        assert distances == [0.0] * (STEPS + 1), f"rank {rank} differs from rank 0 by {distances}"
