"""ZeRO by hand (manual_sharding.py) trains exactly what one process on the global batch trains,
and what torch's ZeroRedundancyOptimizer and fully_shard train; its ring halves are the library's
reduce-scatter and all-gather, and together the ring all-reduce.

Two launches per world size (2, 3 and 4 gloo ranks) run everything the tests read:
  the halves    ring_reduce_scatter and ring_all_gather against dist's, on awkward lengths, in
                float32, float16 and bfloat16, on grading/recorded_group.py's process group, which
                reports the bytes each rank sends to each peer (a launch of its own: fully_shard's
                device mesh cannot take that group, and the trainings run slower through it)
  the levels    ZeRO-1 (ShardedOptimizer), ZeRO-2 (shard_gradients, 200-byte buckets: five) and
                ZeRO-3 (FullyShardedModel), with SGD (momentum) and AdamW (weight decay), with
                the library's collectives and (with SGD) the ring's; ZeRO-3 computing in float16
                and bfloat16; the optimizer state gathered whole and loaded again; and torch's
                own: ZeroRedundancyOptimizer inside DistributedDataParallel, and fully_shard (per
                layer and the root), with the same optimizers
Every rank returns its whole parameters after every step; the tests, in this process, compare them
with a one-process run on the global batch (in a child of its own, tests/harness.run_alone) and
with torch's. The model carries the traps: a frozen layer (stays whole and unchanged), a weight
shared by two layers (one gradient, the sum of both uses; one ZeRO-3 unit), and units of 121, 143
and 55 elements, 319 in all: every count odd and none divisible by 3, so every shard is padded.

SGD with momentum shows a gradient summed instead of averaged (a step n times too large), a shard
stepped twice, or one never stepped; AdamW, which divides the gradient's scale away, shows it in
its state (exp_avg, exp_avg_sq), compared with one process's after flattening.

The code under test is imported inside the functions that run in the child processes, never at the
top: this module is also imported by the process that decides the tests (grading/judge.py).
"""
import copy
import math
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from grading import recorded_group
from grading.launch import launch_once, run_alone, run_in_processes
from tests.differences import assert_same

WORLD_SIZES = (2, 3, 4)
STEPS = 3
BATCH_PER_RANK = 4
OPTIMIZERS = {"sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
              "adamw": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1})}
BUCKET_MB = 200 / 2**20  # 200 bytes: ZeRO-2 then makes five buckets of the model below
LEVELS = ("zero1", "zero2", "zero3")
# the halves: chunks of one element, of an odd few, and of many; integer values sum exactly in
# every dtype and order (|sum| <= 4 * 8 = 32: bfloat16's 8 significand bits hold it)
CHUNKS = (1, 3, 1_001)
HALF_DTYPES = ("float32", "float16", "bfloat16")
SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8}  # the implicit one included


class Traps(nn.Module):
    """The traps in one small model: a frozen layer, a weight shared by `first` and `second` (one
    ZeRO-3 unit of both, with both biases), and units of 121, 143 and 55 elements, 319 in all: every
    count odd and none divisible by 3, so every shard at 2, 3 and 4 ranks is padded. tanh, not ReLU:
    every gradient element is nonzero, so a shard left unstepped cannot hide."""

    def __init__(self, hidden=11):
        super().__init__()
        self.embed = nn.Linear(10, hidden)
        self.frozen = nn.Linear(hidden, hidden)
        self.frozen.requires_grad_(False)
        self.first = nn.Linear(hidden, hidden)
        self.second = nn.Linear(hidden, hidden)
        self.second.weight = self.first.weight
        self.head = nn.Linear(hidden, 5, bias=False)

    def forward(self, inputs):
        hidden = torch.tanh(self.embed(inputs))
        hidden = torch.tanh(self.frozen(hidden))
        hidden = torch.tanh(self.first(hidden))
        hidden = torch.tanh(self.second(hidden))
        return self.head(hidden)


UNIT_NUMELS = [121, 143, 55]  # ZeRO-3's units, in order: embed; first and second; head
TRAINABLE_NUMEL = sum(UNIT_NUMELS)


def global_batches(world_size):
    generator = torch.Generator().manual_seed(1234)
    size = STEPS * BATCH_PER_RANK * world_size
    return torch.randn(size, 10, generator=generator), torch.randint(0, 5, (size,),
                                                                      generator=generator)


def batch_of(step, world_size, rank=None):
    """The slice of the global batches that `rank` trains on at `step`; all of it without one."""
    first = step * world_size * BATCH_PER_RANK
    if rank is None:
        return slice(first, first + world_size * BATCH_PER_RANK)
    return slice(first + rank * BATCH_PER_RANK, first + (rank + 1) * BATCH_PER_RANK)


def copied(parameters):
    return {name: param.detach().clone() for name, param in parameters}


# --- The reference: one process, the whole global batch -----------------------------------------
def train_one_process(world_size, optimizer_name, compute_dtype=None):
    """Traps on the whole global batch: its parameters before and after each step, its optimizer's
    state (by parameter name) before the last step, and the largest gradient element seen. With
    `compute_dtype`, ZeRO-3's casts: float32 master parameters, a copy computing in it
    (computing_in), its output cast back to float32, the gradients cast to float32 for a float32
    optimizer."""
    torch.manual_seed(0)
    model = Traps()
    names = {param: name for name, param in model.named_parameters()}
    params = [param for param in model.parameters() if param.requires_grad]
    optimizer_class, options = OPTIMIZERS[optimizer_name]
    optimizer = optimizer_class(params, **options)
    inputs, labels = global_batches(world_size)
    history = [copied(model.named_parameters())]
    state, largest_gradient = None, 0.0
    for step in range(STEPS):
        if step == STEPS - 1:
            state = {names[param]: copy.deepcopy(values)
                     for param, values in optimizer.state.items()}
        batch = batch_of(step, world_size)
        if compute_dtype is None:
            F.cross_entropy(model(inputs[batch]), labels[batch]).backward()
        else:
            dtype = getattr(torch, compute_dtype)
            compute = computing_in(model, dtype)
            outputs = compute(inputs[batch]).to(torch.float32)
            F.cross_entropy(outputs, labels[batch]).backward()
            for master, param in zip(model.parameters(), compute.parameters()):
                if param.grad is not None:
                    master.grad = param.grad.to(torch.float32)
        largest_gradient = max([largest_gradient] + [p.grad.abs().max().item() for p in params])
        optimizer.step()
        optimizer.zero_grad()
        history.append(copied(model.named_parameters()))
    return {"history": history, "state": state, "largest_gradient": largest_gradient}


def computing_in(model, dtype):
    """A copy of `model` computing as FullyShardedModel with compute_dtype `dtype` does: each layer
    of trainable parameters in `dtype`, the frozen layer in float32, as its whole parameters are;
    each layer's inputs cast to its dtype."""
    compute = copy.deepcopy(model)
    for layer in compute.modules():
        params = list(layer.parameters(recurse=False))
        if not params:
            continue
        layer_dtype = dtype if all(param.requires_grad for param in params) else torch.float32
        for param in params:
            param.data = param.data.to(layer_dtype)
        layer.register_forward_pre_hook(
            lambda module, args, layer_dtype=layer_dtype: tuple(
                arg.to(layer_dtype) for arg in args))
    return compute


def reference_runs():
    return [(world_size, optimizer_name, None) for world_size in WORLD_SIZES
            for optimizer_name in OPTIMIZERS] + \
        [(world_size, "sgd", dtype) for world_size in WORLD_SIZES for dtype in SIGNIFICAND_BITS]


def train_references():
    return {run: train_one_process(*run) for run in reference_runs()}


@launch_once
def references():
    # one child for every world size: a launch costs most of a second
    return run_alone(train_references)


def reference(world_size, optimizer_name, compute_dtype=None):
    return references()[(world_size, optimizer_name, compute_dtype)]


# --- The runs: each level, or torch's counterpart, driven alike ----------------------------------
class Run:
    """Traps (rank 0's seed on every rank) trained by `level`: "zero1", "zero2" or "zero3" of the
    lesson, or torch's "ZeroRedundancyOptimizer" (inside DDP) or "fully_shard"."""

    def __init__(self, level, optimizer_name, transport="library", compute_dtype=None):
        torch.manual_seed(0)
        self.level = level
        self.optimizer_name = optimizer_name
        self.module = Traps()
        self.names = {param: name for name, param in self.module.named_parameters()}
        trainable = [param for param in self.module.parameters() if param.requires_grad]
        optimizer_class, options = OPTIMIZERS[optimizer_name]
        self.model = self.module
        if level in ("zero1", "zero2"):
            from runtime.sharded import TorchShardedOptimizer, collectives

            # the lesson's ShardedOptimizer, its state gathered for checkpoints by the runtime
            self.optimizer = TorchShardedOptimizer(self.module.parameters(), optimizer_class,
                                                   shard_gradients=level == "zero2",
                                                   bucket_mb=BUCKET_MB,
                                                   **collectives(transport), **options)
            self.shards = self.optimizer.shards
            self.inner = self.optimizer.optimizer
        elif level == "zero3":
            from runtime.sharded import FullyShardedTraining, collectives

            # the lesson's FullyShardedModel, gathered for checkpoints by the runtime
            dtype = getattr(torch, compute_dtype) if compute_dtype else None
            self.model = FullyShardedTraining(self.module, compute_dtype=dtype,
                                              **collectives(transport))
            # built as torch users build it over fully_shard: over the model's parameters
            self.optimizer = optimizer_class(self.model.parameters(), **options)
            self.shards = self.model.shards
            self.inner = self.optimizer
        elif level == "ZeroRedundancyOptimizer":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.model = nn.parallel.DistributedDataParallel(self.module)
            self.optimizer = ZeroRedundancyOptimizer(trainable, optimizer_class, **options)
        elif level == "fully_shard":
            from torch.distributed.fsdp import fully_shard

            for layer in (self.module.embed, self.module.frozen, self.module.head):
                fully_shard(layer)
            fully_shard(self.module)  # the root: first and second, which share a weight
            self.optimizer = optimizer_class(
                [param for param in self.module.parameters() if param.requires_grad], **options)

    def backward(self, inputs, labels):
        F.cross_entropy(self.model(inputs), labels).backward()
        if self.level == "zero3":
            self.model.finish_gradient_synchronization()

    def step(self):
        self.optimizer.step()
        self.optimizer.zero_grad()

    def whole_parameters(self):
        """{name: the whole parameter} (a collective for ZeRO-3 and fully_shard)."""
        if self.level == "zero3":
            full = self.model.full_state_dict()
            return {name: full[name].clone() for name in self.names.values()}
        if self.level == "fully_shard":
            return {name: param.full_tensor().detach().clone()
                    for name, param in self.module.named_parameters()}
        return copied(self.module.named_parameters())

    def live_frozen(self):
        """The frozen parameters as the lesson's module holds them between steps."""
        if self.level not in LEVELS:
            return {}  # fully_shard's are sharded (DTensors)
        return copied((name, param) for name, param in self.module.named_parameters()
                      if not param.requires_grad)

    def state_numel(self):
        """Elements of this rank's optimizer state tensors (not the scalar steps)."""
        return sum(value.numel() for values in self.inner.state.values()
                   for value in values.values() if torch.is_tensor(value) and value.dim())

    def kept(self):
        """After backward: gradients the whole parameters still hold, and elements of them still
        there (ZeRO-3 frees them: its module shows this rank's pieces instead); ZeRO-3's pieces'
        gradients, as (name, shape, dtype, the piece's shape)."""
        if self.level == "zero3":
            trainable = [param for shard in self.model.shards for param in shard.params]
        else:
            trainable = [param for param in self.module.parameters() if param.requires_grad]
        kept = {"gradients": sum(param.grad is not None for param in trainable),
                "parameter elements": sum(param.numel() for param in trainable)}
        if self.level == "zero3":
            kept["piece gradients"] = [
                (name, None if piece.grad is None else tuple(piece.grad.shape),
                 None if piece.grad is None else str(piece.grad.dtype), tuple(piece.shape))
                for name, piece in self.module.named_parameters() if piece.requires_grad]
        return kept

    def gathered_state(self):
        """The optimizer state gathered whole (a collective), and each shard's parameter names.
        Copied, as a checkpoint would be: like torch's state_dict(), it holds the live tensors
        (AdamW's step), which the next steps would change."""
        if self.level == "zero3":
            state = self.model.optimizer_state_dict(self.optimizer)
        else:
            state = self.optimizer.state_dict()
        names = [[self.names[param] for param in shard.params] for shard in self.shards]
        return copy.deepcopy(state), names

    def load(self, parameters, state):
        """Take whole parameters and a whole optimizer state (gathered_state's)."""
        if self.level == "zero3":
            self.model.load_full_state_dict(parameters)
            self.model.load_optimizer_state_dict(self.optimizer, state)
            return
        with torch.no_grad():
            for name, param in self.module.named_parameters():
                param.copy_(parameters[name])
        self.optimizer.load_state_dict(state)


def train(rank, world_size, configuration):
    """One configuration's run on this rank: whole parameters after every step, the live frozen
    ones, what backward left behind, the optimizer state's size; for the lesson's levels with the
    library's collectives, also the state gathered before the last step and the parameters of a
    run resumed from it."""
    level, optimizer_name, collectives, compute_dtype = configuration
    run = Run(level, optimizer_name, collectives, compute_dtype)
    inputs, labels = global_batches(world_size)
    round_trip = level in LEVELS and collectives == "library" and compute_dtype is None
    outcome = {"history": [], "frozen": [run.live_frozen()]}
    for step in range(STEPS):
        if round_trip and step == STEPS - 1:
            resumed = attempt(resume, run, outcome)
            outcome.setdefault("state", resumed)  # an error: gathering the state raised
        mine = batch_of(step, world_size, rank)
        run.backward(inputs[mine], labels[mine])
        if level in LEVELS and step == 0:
            outcome["kept"] = run.kept()
        run.step()
        if level in LEVELS and step == 0:
            outcome["state_numel"] = run.state_numel()
            outcome["shard_numels"] = [shard.numel for shard in run.shards]
        outcome["history"].append(run.whole_parameters())
        outcome["frozen"].append(run.live_frozen())
    if round_trip:
        outcome["resumed"] = attempt(resumed_step, resumed, inputs[mine], labels[mine])
    return outcome


def resume(run, outcome):
    """A new Run of the same level, given `run`'s whole parameters and gathered optimizer state;
    the state and each shard's parameter names into `outcome`, or the error where it raised."""
    state, shard_names = run.gathered_state()
    outcome.update(state=state["state"], shard_names=shard_names)
    resumed = Run(run.level, run.optimizer_name)
    resumed.load(outcome["history"][-1], copy.deepcopy(state))  # it takes AdamW's step tensor
    return resumed


def resumed_step(resumed, inputs, labels):
    """The resumed run's last step: its whole parameters after it."""
    if isinstance(resumed, str):
        return resumed  # resume() raised
    resumed.backward(inputs, labels)
    resumed.step()
    return resumed.whole_parameters()


def configurations():
    """(level, optimizer, collectives, compute dtype) of every run a launch trains."""
    lesson = [(level, optimizer_name, "library", None) for level in LEVELS
              for optimizer_name in OPTIMIZERS]
    lesson += [(level, "sgd", "ring", None) for level in LEVELS]  # the ring: with SGD only
    sixteen_bit = [("zero3", "sgd", "library", dtype) for dtype in SIGNIFICAND_BITS]
    torchs = [(level, optimizer_name, "library", None) for optimizer_name in OPTIMIZERS
              for level in ("ZeroRedundancyOptimizer", "fully_shard")]
    return lesson + sixteen_bit + torchs


def rubric_item(configuration):
    """The rubric marker of a configuration's cases."""
    level, _, collectives, _ = configuration
    if collectives == "ring":
        # ZeRO through the student's ring runs core.ring's code too
        return pytest.mark.rubric("core.end_to_end")
    if level not in LEVELS:
        return pytest.mark.rubric()  # torch's ZeRO and fully_shard: the tests' own reference
    if level == "zero3":
        return pytest.mark.rubric("core.fsdp")  # ZeRO-3 shards the parameters too
    return pytest.mark.rubric("core.zero")


def rubric_cases(configurations):
    """Each configuration as a test case: its id name()'s, marked with its rubric item."""
    return [pytest.param(configuration, id=name(configuration), marks=rubric_item(configuration))
            for configuration in configurations]


# --- The halves: ring_reduce_scatter and ring_all_gather against the library's --------------------
class Messages:
    """While entered: the bytes of each operation the process group carries, by operation and
    peer (recorded_group's view, below torch.distributed's names)."""

    def __enter__(self):
        self.carried = {}
        recorded_group.LISTENERS.append(self.note)
        return self

    def note(self, operation, tensors, peer):
        key = f"{operation} {peer}"
        for tensor in tensors:
            self.carried[key] = self.carried.get(key, 0) + tensor.numel() * tensor.element_size()

    def __exit__(self, *exception):
        recorded_group.LISTENERS.remove(self.note)


def values(kind, length, dtype, rank, salt):
    """`length` values for this rank: small integers (their sums exact in any order and dtype) or
    normal random ones, in `dtype`."""
    generator = torch.Generator().manual_seed(rank * 1000 + length + salt)
    if kind == "integers":
        drawn = torch.randint(-8, 9, (length,), generator=generator).to(torch.float32)
    else:
        drawn = torch.randn(length, generator=generator)
    return drawn.to(getattr(torch, dtype))


def compare_halves(rank, world_size, half):
    """For each dtype, kind of values and padded length, one half's largest differences from the
    library's: the ring's reduce-scatter's; or its all-gather's (a separate shard, and output's
    own chunk) and the two halves' composition's from ring_all_reduce. With what each ring half
    carried, and the largest element of the library's sum. A piece that raises leaves its error
    in place of its numbers; one that hangs, in place of every later piece's too."""
    from manual_sharding import ring_all_gather, ring_reduce_scatter
    from runtime.torch_compat import all_gather_single, reduce_scatter_single

    library_group = dist.new_group(backend="gloo")  # the library's own, beside the recorded one
    cases = {}
    for dtype in HALF_DTYPES:
        for kind in ("integers", "random"):
            for chunk in CHUNKS:
                length = chunk * world_size
                tensor = values(kind, length, dtype, rank, 0)
                shard = values(kind, chunk, dtype, rank, 1)
                library_sum = tensor.clone()
                dist.all_reduce(library_sum, group=library_group)
                case = cases[(dtype, kind, length)] = {
                    "largest_sum": library_sum.abs().max().item()}
                if half == "reduce_scatter":
                    library = tensor.new_empty(chunk)
                    reduce_scatter_single(library, tensor.clone(), group=library_group)
                    scattered = attempt(carrying, ring_reduce_scatter, tensor.new_empty(chunk),
                                        tensor.clone())
                    case.update(reduce_scatter=difference(scattered, library),
                                reduce_scatter_carried=carried(scattered))
                else:
                    library = tensor.new_empty(length)
                    all_gather_single(library, shard, group=library_group)
                    gathered = attempt(carrying, ring_all_gather, tensor.new_empty(length), shard)
                    in_place = attempt(gather_in_place, ring_all_gather, shard, world_size, rank)
                    case.update(all_gather=difference(gathered, library),
                                all_gather_in_place=difference(in_place, library),
                                all_gather_carried=carried(gathered))
                    # the composition needs the all-gather: it hangs with it, not alone
                    composed = attempt(compose, ring_reduce_scatter, ring_all_gather,
                                       tensor.clone())
                    case["composed"] = difference(composed, attempt(all_reduce_by_ring,
                                                                    tensor.clone()))
    return cases


HUNG = []  # in a child: the error of a piece that hung, after which the group is unusable


def attempt(function, *args):
    """function(*args), or the end of its traceback: a piece of the lesson that raises (a task not
    done yet) fails only the tests that need it. Every rank raises alike, so none is left waiting
    in a collective for another. After a piece timed out in a collective the group's connections
    are closed: every later piece gives that error at once."""
    if HUNG:
        return HUNG[0]
    try:
        return function(*args)
    except Exception as error:  # noqa: BLE001 - the child's error, for the tests that need it
        failure = traceback.format_exc(limit=-4)
        if "timed out" in str(error).lower():
            HUNG.append(f"{failure}\n(it hung: the later pieces of this launch were not run)")
        return failure


def carrying(half, output, tensor):
    """half(output, tensor), and what the process group carried meanwhile."""
    with Messages() as messages:
        half(output, tensor)
    return output, messages.carried


def gather_in_place(ring_all_gather, shard, world_size, rank):
    """ring_all_gather with the shard already in output's own chunk, as ZeRO gathers."""
    output = shard.new_zeros(shard.numel() * world_size)
    own = output.view(world_size, -1)[rank]
    own.copy_(shard)
    return ring_all_gather(output, own)


def compose(ring_reduce_scatter, ring_all_gather, tensor):
    """The ring's reduce-scatter, then its all-gather: an all-reduce."""
    chunk = tensor.new_empty(tensor.numel() // dist.get_world_size())
    return ring_all_gather(torch.empty_like(tensor), ring_reduce_scatter(chunk, tensor))


def all_reduce_by_ring(tensor):
    """manual_collectives.ring_all_reduce (another task's), imported here: a module that does not
    import fails only the composition's test."""
    from manual_collectives import ring_all_reduce

    return ring_all_reduce(tensor)


def largest_difference(got, want):
    return (got.to(torch.float64) - want.to(torch.float64)).abs().max().item()


def difference(got, want):
    """(got, want) for the test to compare (tests/differences.py), or the error of whichever
    raised."""
    for value in (got, want):
        if isinstance(value, str):
            return value
    return got[0] if isinstance(got, tuple) else got, want


def carried(outcome):
    return outcome if isinstance(outcome, str) else outcome[1]


def train_everything(rank, world_size):
    torch.set_num_threads(1)
    return {configuration: attempt(train, rank, world_size, configuration)
            for configuration in configurations()}


@launch_once
def launch(world_size):
    """Every configuration's outcome, rank by rank: one launch per world size."""
    return run_in_processes(world_size, train_everything, timeout_s=60)


def runs(world_size, configuration):
    """Each rank's outcome of `configuration`; the test fails with a rank's error if it raised."""
    outcomes = [result[configuration] for result in launch(world_size)]
    for rank, outcome in enumerate(outcomes):
        succeeded(outcome, f"{name(configuration)} on rank {rank}")
    return outcomes


def succeeded(outcome, where):
    """`outcome`, unless it is a child's error (attempt's): then the test fails with it."""
    if isinstance(outcome, str):
        pytest.fail(f"{where} raised:\n{outcome}", pytrace=False)
    return outcome


@launch_once
def halves(world_size, half):
    """compare_halves' cases of one half, rank by rank, on the recorded process group: a launch of
    its own, since fully_shard's device mesh cannot take that group, and every collective through
    it costs Python; and one per half, so that a half that hangs fails its own tests only (and
    the composition's, which needs both). Every
    rank does the same small work, so a collective that waits 10 s waits for a deadlock."""
    return run_in_processes(world_size, compare_halves, half, timeout_s=10, recorded=True)


def name(configuration):
    return "-".join(part for part in configuration if part and part != "library")


def assert_parameters_close(got, want, when, rtol=1e-5, atol=1e-6):
    """Each parameter as the reference's, to float32 summation-order tolerance after a few steps
    (the same sums in another order differ by a few ulps; 1e-6 absolute near zero); a failure names
    the step and the parameter."""
    __tracebackhide__ = True  # the failure points at the test's line
    assert set(got) == set(want), f"{when}: parameters {sorted(got)}, not {sorted(want)}"
    for key in want:
        assert_same(got[key], want[key], f"{when}, parameter '{key}'", atol=atol, rtol=rtol)


# --- The tests: the halves ------------------------------------------------------------------------
def summation_tolerance(dtype, world_size, largest):
    """n numbers summed in two orders: each sum may differ by a few ulps of the largest term."""
    return world_size * torch.finfo(getattr(torch, dtype)).eps * max(largest, 1) * 4


def allowed(kind, dtype, world_size, case):
    """Integer values sum exactly in every order; random ones within summation order."""
    return 0.0 if kind == "integers" else summation_tolerance(dtype, world_size,
                                                              case["largest_sum"])


@pytest.mark.rubric("core.sharding_collectives")
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_ring_reduce_scatter_equals_dist_reduce_scatter_single(dtype, world_size):
    """Rank r's output is chunk r of the sum: exactly the library's on integer values, whose sums
    are exact in every order; within summation order on random ones."""
    for rank, cases in enumerate(halves(world_size, "reduce_scatter")):
        check_reduce_scatter(rank, cases, dtype, world_size)


def cases_in(rank, cases, dtype):
    """(where, kind, length, case) of each of one rank's cases in `dtype`; `where` names them."""
    for (case_dtype, kind, length), case in cases.items():
        if case_dtype == dtype:
            yield f"rank {rank}, {kind} of length {length} in {dtype}", kind, length, case


def check_reduce_scatter(rank, cases, dtype, world_size):
    """Each of one rank's cases in `dtype`: its ring_reduce_scatter output against the library's;
    a failure names the rank, the case, the chunk and the first index that differs."""
    __tracebackhide__ = True  # the failure points at the test's line
    for where, kind, _, case in cases_in(rank, cases, dtype):
        got, want = succeeded(case["reduce_scatter"], f"ring_reduce_scatter ({where})")
        assert_same(got, want, f"{where}: ring_reduce_scatter's output, chunk {rank} of the sum",
                    atol=allowed(kind, dtype, world_size, case))


@pytest.mark.rubric("core.sharding_collectives")
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_ring_all_gather_equals_dist_all_gather_single_bit_for_bit(dtype, world_size):
    """An all-gather only copies, so it must agree to the bit, whether the shard is a tensor of
    its own or output's own chunk r."""
    for rank, cases in enumerate(halves(world_size, "all_gather")):
        for where, _, length, case in cases_in(rank, cases, dtype):
            chunk = length // world_size
            got, want = succeeded(case["all_gather"], f"ring_all_gather ({where})")
            assert_same(got, want, f"{where}: ring_all_gather's output", chunk=chunk)
            got, want = succeeded(case["all_gather_in_place"], f"ring_all_gather ({where})")
            assert_same(got, want, f"{where}: ring_all_gather's output, the shard in its own "
                                   "chunk", chunk=chunk)


@pytest.mark.rubric("core.end_to_end")  # against core.ring's ring_all_reduce: two items
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_reduce_scatter_then_all_gather_is_the_ring_all_reduce(dtype, world_size):
    """The lesson's claim: the ring all-reduce is a reduce-scatter then an all-gather. To the bit
    on integer values (every order of addition is exact); within summation order on random ones
    (the all-reduce's chunk r ends on rank r-1, the reduce-scatter's on rank r: other orders)."""
    for rank, cases in enumerate(halves(world_size, "all_gather")):
        for where, kind, length, case in cases_in(rank, cases, dtype):
            got, want = succeeded(case["composed"], f"the ring's halves or all-reduce ({where})")
            assert_same(got, want, f"{where}: the halves composed, against ring_all_reduce",
                        atol=allowed(kind, dtype, world_size, case), chunk=length // world_size)


@pytest.mark.rubric("core.sharding_collectives")
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_each_ring_half_sends_n_minus_1_over_n_of_the_tensor_to_its_right_neighbour_only(
        world_size):
    """Bandwidth-optimal: each rank sends (n-1) chunks, all to its right neighbour, and receives as
    many from its left; nothing but point-to-point messages."""
    for half in ("reduce_scatter", "all_gather"):
        for rank, cases in enumerate(halves(world_size, half)):
            right, left = (rank + 1) % world_size, (rank - 1) % world_size
            for (dtype, _, length), case in cases.items():
                size = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
                expected = (world_size - 1) * length // world_size * size
                carried = succeeded(case[f"{half}_carried"], f"ring_{half} (rank {rank})")
                assert carried == {f"send {right}": expected, f"recv {left}": expected}, \
                    f"rank {rank}, {half} of {length} {dtype}: {carried}"


# --- The tests: the levels against one process and against torch ---------------------------------
LESSON = [configuration for configuration in configurations()
          if configuration[0] in LEVELS and configuration[3] is None]
SIXTEEN_BIT = [configuration for configuration in configurations() if configuration[3]]
TORCHS = [configuration for configuration in configurations() if configuration[0] not in LEVELS]
TORCH_COUNTERPART = {"zero1": "ZeroRedundancyOptimizer", "zero2": "ZeroRedundancyOptimizer",
                     "zero3": "fully_shard"}
ROUND_TRIPS = [configuration for configuration in LESSON if configuration[2] == "library"]


def skip_where_fully_shard_needs_a_gpu(level):
    """torch 2.6's fully_shard records events on the device's stream, which its CPU stream cannot:
    there the reference is skipped (the lesson's ZeRO-3 is still checked against one process)."""
    if level == "fully_shard" and not hasattr(torch.cpu.Stream, "record_event"):
        pytest.skip(f"torch {torch.__version__}'s fully_shard does not run on the CPU")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("configuration", rubric_cases(LESSON + TORCHS))
def test_every_step_equals_one_process_on_the_global_batch(configuration, world_size):
    """After every step, rank 0's whole parameters equal one process's trained on the global batch
    (torch's own levels too: the reference they are compared with below)."""
    skip_where_fully_shard_needs_a_gpu(configuration[0])
    history = runs(world_size, configuration)[0]["history"]
    expected = reference(world_size, configuration[1])["history"]
    for step, (got, want) in enumerate(zip(history, expected[1:]), start=1):
        assert_parameters_close(got, want, f"after step {step}, against one process")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("configuration", rubric_cases(LESSON))
def test_every_step_equals_torchs_zero_redundancy_optimizer_or_fully_shard(configuration,
                                                                           world_size):
    """ZeRO-1 and ZeRO-2 against ZeroRedundancyOptimizer inside DDP, ZeRO-3 against fully_shard,
    with the same optimizer, after every step."""
    level, optimizer_name, _, _ = configuration
    counterpart = (TORCH_COUNTERPART[level], optimizer_name, "library", None)
    skip_where_fully_shard_needs_a_gpu(counterpart[0])
    history = runs(world_size, configuration)[0]["history"]
    torchs = runs(world_size, counterpart)[0]["history"]
    for step, (got, want) in enumerate(zip(history, torchs), start=1):
        assert_parameters_close(got, want, f"after step {step}, against {counterpart[0]}")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("configuration", rubric_cases(LESSON + SIXTEEN_BIT))
def test_every_rank_holds_the_same_whole_parameters_after_every_step(configuration, world_size):
    """The all-gather copies: every rank's whole parameters are rank 0's, to the bit."""
    outcomes = runs(world_size, configuration)
    for rank, outcome in enumerate(outcomes[1:], start=1):
        for step, (got, want) in enumerate(zip(outcome["history"], outcomes[0]["history"]),
                                           start=1):
            assert_parameters_close(got, want, f"rank {rank} after step {step}, against rank 0",
                                    rtol=0, atol=0)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("configuration", rubric_cases(LESSON + SIXTEEN_BIT))
def test_the_frozen_layer_stays_whole_and_unchanged_on_every_rank(configuration, world_size):
    """A frozen parameter is not sharded: the module holds it whole between steps, on every rank,
    as built, to the bit (AdamW's weight decay would shrink it if it were stepped)."""
    initial = reference(world_size, configuration[1])["history"][0]
    frozen = {key: value for key, value in initial.items() if key.startswith("frozen.")}
    for rank, outcome in enumerate(runs(world_size, configuration)):
        for step, got in enumerate(outcome["frozen"]):
            assert_parameters_close(got, frozen, f"rank {rank} after step {step}", rtol=0, atol=0)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("configuration", rubric_cases([c for c in LESSON if c[2] == "library"]))
def test_the_shards_hold_each_trainable_parameter_once_and_1_over_n_of_the_state(configuration,
                                                                                 world_size):
    """ZeRO-1 lays the 319 trainable elements in one flat shard (the shared weight once, the frozen
    layer left out), ZeRO-2 in several buckets, ZeRO-3 in its three units; each rank's optimizer
    state is its shards' share, ceil(numel / n) elements per shard for each state tensor of the
    optimizer (one for SGD's momentum, two for AdamW's moments), not a whole copy."""
    level, optimizer_name, _, _ = configuration
    per_element = {"sgd": 1, "adamw": 2}[optimizer_name]
    for rank, outcome in enumerate(runs(world_size, configuration)):
        numels = outcome["shard_numels"]
        assert sum(numels) == TRAINABLE_NUMEL, f"rank {rank}: shards of {numels} elements"
        if level == "zero1":
            assert numels == [TRAINABLE_NUMEL], f"rank {rank}: shards of {numels} elements"
        elif level == "zero2":
            assert len(numels) > 1, f"200-byte buckets should make several, not {numels}"
        else:
            assert numels == UNIT_NUMELS, f"rank {rank}: units of {numels} elements"
        if level == "zero3":  # a state per piece: this rank's elements, not the padding
            share = per_element * sum(
                max(0, min(numel, (rank + 1) * math.ceil(numel / world_size))
                    - rank * math.ceil(numel / world_size)) for numel in numels)
        else:
            share = per_element * sum(math.ceil(numel / world_size) for numel in numels)
        assert outcome["state_numel"] == share, \
            f"rank {rank} holds {outcome['state_numel']} elements of state, not {share}"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("configuration", rubric_cases([c for c in LESSON if c[0] != "zero1"]))
def test_zero2_and_zero3_keep_no_whole_gradient_and_zero3_no_whole_parameter(configuration,
                                                                            world_size):
    """After backward (and ZeRO-3's finish_gradient_synchronization) the module's parameters
    hold no gradient: each was reduce-scattered into a shard and freed; ZeRO-3's parameters hold
    no elements either."""
    for rank, outcome in enumerate(runs(world_size, configuration)):
        assert outcome["kept"]["gradients"] == 0, f"rank {rank}: {outcome['kept']}"
        if configuration[0] == "zero3":
            assert outcome["kept"]["parameter elements"] == 0, f"rank {rank}: {outcome['kept']}"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("configuration", rubric_cases(
    [c for c in LESSON + SIXTEEN_BIT if c[0] == "zero3"]))
def test_zero3_gives_each_parameter_a_float32_gradient_of_its_pieces_shape(configuration,
                                                                          world_size):
    """As fully_shard: the module's trainable parameters are this rank's pieces, under their
    names, and after the gradient sync each holds a float32 gradient of its own shape, in 16-bit
    compute too."""
    for rank, outcome in enumerate(runs(world_size, configuration)):
        pieces = outcome["kept"]["piece gradients"]
        assert [name for name, *_ in pieces] == ["embed.weight", "embed.bias", "first.weight",
                                                 "first.bias", "second.bias", "head.weight"]
        for name, shape, dtype, piece_shape in pieces:
            assert (shape, dtype) == (piece_shape, "torch.float32"), f"rank {rank}, {name}"


@pytest.mark.rubric("core.fsdp")
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("dtype", list(SIGNIFICAND_BITS))
def test_16_bit_compute_stays_within_its_precision_of_one_process_with_the_same_casts(
        dtype, world_size):
    """ZeRO-3 computing in float16 or bfloat16 against one process making the same casts (float32
    masters, 16-bit forward and backward but for the frozen layer's float32, float32 SGD). They
    differ by rounding only: each rank's gradient is rounded to the 16-bit dtype in its own sums,
    divided by n and summed over n ranks in it, so an averaged element is off by at most some 4n
    units of 2^-p (p significand bits) of the largest gradient g; a step moves a parameter by lr
    times the velocity, which with momentum 0.9 carries at most k such errors after k steps: after
    s steps, lr 4n 2^-p g s(s+1)/2. A gradient summed, not averaged, is off by (n-1) lr g at the
    first step: at least 2^p / 8 times the bound (32 for bfloat16, 256 for float16)."""
    configuration = ("zero3", "sgd", "library", dtype)
    history = runs(world_size, configuration)[0]["history"]
    float32 = runs(world_size, ("zero3", "sgd", "library", None))[0]["history"]
    expected = reference(world_size, "sgd", dtype)
    unit = 2.0 ** -SIGNIFICAND_BITS[dtype]
    lr = OPTIMIZERS["sgd"][1]["lr"]
    for step, (got, want) in enumerate(zip(history, expected["history"][1:]), start=1):
        bound = lr * 4 * world_size * unit * expected["largest_gradient"] * step * (step + 1) / 2
        error = max(largest_difference(got[key], want[key]) for key in want)
        assert error <= bound, f"after step {step}: error {error:.3g} above the bound {bound:.3g}"
    # the casts happened: 16-bit compute is not float32's
    assert any(largest_difference(history[0][key], float32[0][key]) > 0 for key in float32[0])


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("configuration", rubric_cases(ROUND_TRIPS))
def test_the_optimizer_state_gathered_whole_equals_one_processs(configuration, world_size):
    """Before the last step, state_dict() (ZeRO-1, ZeRO-2) or optimizer_state_dict() (ZeRO-3)
    holds, for each shard, every state tensor whole: one process's, its parameters' laid end to
    end in the shard's order, the padding cut. Relative tolerance: exp_avg_sq is some 1e-7, where
    an absolute one would see nothing."""
    outcome = runs(world_size, configuration)[0]
    succeeded(outcome["state"], "gathering the optimizer state")
    expected = reference(world_size, configuration[1])["state"]
    assert len(outcome["state"]) == len(outcome["shard_names"]), "one state per shard"
    for index, names in enumerate(outcome["shard_names"]):
        got = outcome["state"][index]
        assert set(got) == set(expected[names[0]]), f"shard {index}: keys {sorted(got)}"
        for key, value in got.items():
            want = torch.cat([expected[name][key].reshape(-1) for name in names]) \
                if value.dim() else expected[names[0]][key]
            largest = want.abs().max().item()
            torch.testing.assert_close(value, want, rtol=1e-4, atol=1e-6 * largest,
                                       msg=lambda detail, key=key, where=f"shard {index} ({names})":
                                       f"{where}, '{key}': {detail}")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("configuration", rubric_cases(ROUND_TRIPS))
def test_a_run_resumed_from_the_gathered_state_steps_as_one_process(configuration, world_size):
    """A new model and optimizer, given the whole parameters and the gathered state before the
    last step (load_full_state_dict, load_state_dict / load_optimizer_state_dict: each rank cuts
    its shards again), take the same last step as one process."""
    for rank, outcome in enumerate(runs(world_size, configuration)):
        want = reference(world_size, configuration[1])["history"][-1]
        resumed = succeeded(outcome["resumed"], f"rank {rank}'s resumed run")
        assert_parameters_close(resumed, want, f"rank {rank}, the resumed last step")


def refusal(params):
    """What ShardedOptimizer says to `params` ("groups": parameter groups; "frozen": nothing
    trainable): the error's type and message, or "accepted". Raised before any collective, so no
    process group is needed."""
    from manual_sharding import ShardedOptimizer

    layer = nn.Linear(2, 2)
    given = {"groups": [{"params": list(layer.parameters())}],
             "frozen": [nn.Parameter(torch.zeros(2), requires_grad=False)]}[params]
    try:
        ShardedOptimizer(given, torch.optim.SGD, lr=0.1)
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return "accepted"


@pytest.mark.rubric("core.zero")
@pytest.mark.parametrize("params", ["groups", "frozen"])
def test_sharded_optimizer_refuses_parameter_groups_and_nothing_to_train(params):
    """One flat buffer is stepped with one set of options: parameter groups are refused by name,
    not half-built; so is a list with nothing to train."""
    said = run_alone(refusal, params)
    expected = {"groups": "TypeError: ShardedOptimizer takes parameters, not parameter groups",
                "frozen": "ValueError: ShardedOptimizer got no parameter that requires a gradient"}
    assert said.startswith(expected[params]), said
