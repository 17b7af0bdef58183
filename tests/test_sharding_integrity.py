"""Integrity of the sharding lesson (manual_sharding.py): each piece sends what it claims, proved by
watching torch.distributed, as tests/test_integrity.py does for the all-reduce strategies.

In each rank, torch.distributed's communicating functions, wherever a loaded module holds them,
record every call with the tensor it sends; below those names the process group itself reports
every operation it carries (grading/recorded_group.py), and each must match a watched call, so
that a collective reached around the names (a saved reference, the group object) is caught.
What each piece claims, per step, Ψ the parameters and n the ranks:
  the ring's halves  point-to-point messages only, sent to the right neighbour and received from
                     the left, (n-1)/n of the buffer sent by each rank
  ZeRO-1             one reduce-scatter of every gradient element (padded to a multiple of n) and
                     one all-gather of every parameter, nothing else: no all-reduce; each through
                     the lesson's collectives and the layers around them (what times them)
  ZeRO-2             the same per bucket, each reduce-scatter started while backward still runs,
                     and no full gradient left once backward is over
  ZeRO-3 / FSDP      each unit all-gathered twice (forward, then backward) and its gradients
                     reduce-scattered once; no all-reduce the size of a unit; every unit freed
Each test also runs deliberately wrong versions, defined here, and asserts that its check rejects
them: an all-reduce of the whole gradient with every shard stepped locally, a gather made of an
all-reduce, messages for show beside a renamed collective. A check that cannot fail proves
nothing. Only the autograder has this file.

Each item's pieces run in a launch of their own, with the library's collectives (the runtime's):
ZeRO's and FSDP's checks need none of the student's ring. The code under test is imported only in
the child processes: the judge (grading/judge.py) imports this module too. This module is
self-contained: a hidden test's child gets its code alone (grading/sandbox.py), so it cannot
import tests/test_integrity.py, whose recorder it repeats.
"""
import collections
import functools
import inspect
import sys
import types

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from grading import recorded_group
from grading.launch import launch_once, run_counting_bytes, run_in_processes

WORLD_SIZE = 3  # chunks that are not powers of two, and a neighbour on each side that differs
STEPS = 2
CHUNK = 1001  # elements of each rank's chunk in the ring's checks
LR = 1e-2
PREFIXES = ("all", "reduce", "broadcast", "gather", "scatter", "barrier", "monitored", "send",
            "recv", "isend", "irecv", "batch_isend")
WATCHED = [name for name, value in vars(dist).items()
           if type(value) is types.FunctionType and name.lstrip("_").startswith(PREFIXES)]
# The argument that holds what a watched function sends (default "tensor"); a list is each tensor.
SENT = {"reduce_scatter_tensor": "input", "reduce_scatter_single": "input",
        "all_gather_into_tensor": "input_tensor", "all_gather_single": "input_tensor",
        "reduce_scatter": "input_list", "all_to_all_single": "input",
        "all_gather_object": None, "scatter": "scatter_list"}
# Torch 2.13's names for the same collectives (reduce_scatter_tensor calls reduce_scatter_single):
# recorded under the older name, which the checks use.
SAME_AS = {"reduce_scatter_single": "reduce_scatter_tensor",
           "all_gather_single": "all_gather_into_tensor"}
# The process group's operation for each watched function (recorded_group.py's names).
OPERATION = {"all_reduce": "allreduce", "isend": "send", "irecv": "recv", "all_gather": "allgather",
             "all_gather_into_tensor": "allgather", "reduce_scatter_tensor": "reduce_scatter"}
MESSAGES = ("send", "recv", "isend", "irecv")
# References under names the recorder does not replace: the wrong versions' way around it.
ALL_REDUCE_UNDER_ANOTHER_NAME = dist.all_reduce
REDUCE_SCATTER_UNDER_ANOTHER_NAME = dist.reduce_scatter_tensor


def small_model():
    """Four linear layers of four different sizes (410 to 3,136 parameters): each FSDP unit, and
    each ZeRO-2 bucket of one parameter, is told apart by its size."""
    torch.manual_seed(0)  # the same on every rank: ZeRO's ranks must start equal
    return nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 64), nn.ReLU(),
                         nn.Linear(64, 40), nn.ReLU(), nn.Linear(40, 10))


LAYERS = [module for module in small_model() if isinstance(module, nn.Linear)]
PARAMS = [param.numel() for layer in LAYERS for param in layer.parameters()]  # in forward order
UNITS = [sum(param.numel() for param in layer.parameters()) for layer in LAYERS]


def padded(numel, world_size=WORLD_SIZE):
    """`numel` rounded up to a multiple of the world size: a flat buffer cut in equal shards."""
    return -(-numel // world_size) * world_size


class Recorder:
    """While entered, each outermost call of a watched function appends a dict to `calls` (its
    name, the step, the stage of the step, the peer, the dtype and size of what it sends, and how
    many gradients backward had finished), and the process group's every operation one with
    "below" set."""

    def __init__(self):
        self.calls = []
        self.phase = "start-up"
        self.stage = "start-up"  # "forward", "backward" or "after" within a step
        self.grads_ready = 0
        self.depth = 0  # of calls in progress: a watched function may call another
        self.in_layers = 0  # of calls of the test's own layer in progress (through_layer)
        self.restore = []

    def count_gradient(self, param):
        """A post-accumulate-grad hook: one more gradient of this backward is complete."""
        self.grads_ready += 1

    def record_below(self, operation, tensors, peer):
        """recorded_group's listener: one operation the process group carried."""
        for tensor in tensors:
            self.calls.append({"name": operation, "phase": self.phase, "peer": peer, "below": True,
                               "dtype": str(tensor.dtype).removeprefix("torch."),
                               "numel": tensor.numel()})

    def __enter__(self):
        recorded_group.LISTENERS.append(self.record_below)
        modules = [vars(module) for module in list(sys.modules.values())
                   if isinstance(getattr(module, "__dict__", None), dict)]
        for name in WATCHED:
            original = getattr(dist, name)
            wrapper = self.wrap(name, original)
            for namespace in modules:  # also `from torch.distributed import all_reduce`
                if namespace.get(name) is original:
                    self.restore.append((namespace, name, original))
                    namespace[name] = wrapper
        return self

    def __exit__(self, *exception):
        recorded_group.LISTENERS.remove(self.record_below)
        for namespace, name, original in self.restore:
            namespace[name] = original

    def wrap(self, name, original):
        """`original`, recording its outermost calls under `name`."""
        signature = inspect.signature(original)

        @functools.wraps(original)
        def recorded(*args, **kwargs):
            if self.depth == 0:
                self.record(name, signature, args, kwargs)
            self.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self.depth -= 1
        return recorded

    def record(self, name, signature, args, kwargs):
        """Append the call's facts, one entry per tensor it sends; for batch_isend_irecv, those of
        each message it holds."""
        try:
            arguments = signature.bind(*args, **kwargs).arguments
        except TypeError:  # a call that does not fit: the function itself will raise
            arguments = {}
        messages = [(getattr(op.op, "__name__", "?"), op.tensor, op.peer)
                    for op in arguments.get("p2p_op_list") or []]
        if name != "batch_isend_irecv":
            sent = arguments.get(SENT.get(name, "tensor")) if SENT.get(name, "tensor") else None
            peer = arguments.get("dst", arguments.get("src"))
            tensors = sent if isinstance(sent, (list, tuple)) else [sent]
            messages += [(name, tensor, peer) for tensor in tensors]
        for name, tensor, peer in messages:
            call = {"name": SAME_AS.get(name, name), "phase": self.phase, "stage": self.stage,
                    "peer": peer, "grads_ready": self.grads_ready, "in_layer": self.in_layers > 0}
            if isinstance(tensor, torch.Tensor):
                call.update(dtype=str(tensor.dtype).removeprefix("torch."), numel=tensor.numel(),
                            nbytes=tensor.numel() * tensor.element_size())
            self.calls.append(call)


    def through_layer(self, collective):
        """A layer of the test's own around one of the lesson's collectives (as runtime/timing.py's
        timing is): marks the watched calls made inside it."""
        def passed(output, tensor):
            self.in_layers += 1
            try:
                return collective(output, tensor)
            finally:
                self.in_layers -= 1
        return passed


# --- The checks: each yields what contradicts the claim in one step's calls --------------------
def problems(check, calls, *args, steps=STEPS):
    """`check`'s complaints about each step's watched calls, and every_operation_watched's, one a
    line ("" when none)."""
    complaints = []
    for step in range(steps):
        made = [call for call in calls if call["phase"] == step and not call.get("below")]
        below = [call for call in calls if call["phase"] == step and call.get("below")]
        for problem in [*check(made, *args), *every_operation_watched(made, below)]:
            complaints.append(f"step {step}: {problem}")
    return "\n".join(complaints)


def every_operation_watched(made, below):
    """Complaints naming what the process group carried with no watched call behind it."""
    def carried(calls):
        return collections.Counter((OPERATION.get(call["name"], call["name"]), call.get("dtype"),
                                    call.get("numel")) for call in calls)
    unseen = carried(below) - carried(made)
    if unseen:
        operations = ", ".join(f"{name} of {numel} {dtype}" for name, dtype, numel in unseen)
        yield (f"the process group carried {operations} that no torch.distributed function was "
               "called for (a saved reference, or the group object)")


def only(made, names, dtype="float32"):
    """Complaints naming what was called besides `names`, and what was sent besides `dtype`."""
    others = sorted({call["name"] for call in made} - set(names))
    if others:
        yield f"{others} called, where only {sorted(names)} may be"
    dtypes = sorted({call.get("dtype") for call in made} - {dtype}, key=str)
    if dtypes:
        yield f"tensors of {dtypes} sent, not {dtype}"


def sizes(made, name, stage=None):
    """The sizes (elements) of what the calls named `name` (in `stage`, where given) sent,
    sorted."""
    return sorted(call.get("numel", -1) for call in made
                  if call["name"] == name and stage in (None, call["stage"]))


def ring_half(made, rank, world_size, buffer_numel):
    """Point-to-point messages only, sent to the right neighbour and received from the left;
    (n-1)/n of the buffer's float32 bytes sent by this rank."""
    yield from only(made, MESSAGES)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    sends = [call for call in made if call["name"] in ("send", "isend")]
    receives = [call for call in made if call["name"] in ("recv", "irecv")]
    wrong_peers = ({call["peer"] for call in sends} - {right}) | (
        {call["peer"] for call in receives} - {left})
    if wrong_peers:
        yield (f"messages with ranks {sorted(wrong_peers, key=str)}: rank {rank} may send only to "
               f"{right} and receive only from {left}")
    sent = sum(call.get("nbytes", 0) for call in sends)
    expected = (world_size - 1) * buffer_numel // world_size * 4
    if sent != expected:
        yield f"rank {rank} sent {sent} bytes, not (n-1)/n of the buffer: {expected}"


def through_layers(made):
    """Every reduce-scatter and all-gather made through the lesson's collectives
    (self.reduce_scatter and self.all_gather), inside the layers they were built with: what times
    them in a run."""
    outside = sorted({call["name"] for call in made if not call["in_layer"]
                      and call["name"] in ("reduce_scatter_tensor", "all_gather_into_tensor")})
    if outside:
        yield (f"{outside} called outside the collectives' layers: not through self.reduce_scatter "
               "and self.all_gather")


def zero(made, gradients, parameters):
    """Only reduce-scatters and all-gathers of float32, through the collectives' layers: the
    reduce-scatters send the padded flat buffers `gradients` (their sizes), the all-gathers one
    shard of each: every gradient element and every parameter once. No all-reduce."""
    yield from only(made, ("reduce_scatter_tensor", "all_gather_into_tensor"))
    yield from through_layers(made)
    scattered = sizes(made, "reduce_scatter_tensor")
    if scattered != sorted(gradients):
        yield f"reduce-scatters of {scattered} elements, not of the gradients: {sorted(gradients)}"
    gathered = sizes(made, "all_gather_into_tensor")
    if gathered != sorted(numel // WORLD_SIZE for numel in parameters):
        yield (f"all-gathers of shards of {gathered} elements, not one shard of each flat "
               f"buffer of parameters {sorted(parameters)}")


def zero_1(made):
    """ZeRO-1: one flat buffer of every parameter."""
    total = padded(sum(PARAMS))
    yield from zero(made, [total], [total])


def zero_2(made):
    """ZeRO-2, with buckets of one parameter each: a reduce-scatter per parameter, every one but
    the last started before backward had finished every gradient."""
    buckets = [padded(numel) for numel in PARAMS]
    yield from zero(made, buckets, buckets)
    early = [call for call in made if call["name"] == "reduce_scatter_tensor"
             and call["grads_ready"] < len(PARAMS)]
    if len(early) < len(PARAMS) - 1:
        yield (f"{len(early)} reduce-scatters started while backward ran, where each of "
               f"{len(PARAMS) - 1} buckets is ready before its end")


def fsdp(made, dtype="float32"):
    """ZeRO-3: each unit's shard all-gathered once in forward and once in backward, its padded
    gradients reduce-scattered once, every one but the last started while backward ran, all of
    them in the compute `dtype`; an all-reduce, if any, smaller than every unit."""
    names = ("reduce_scatter_tensor", "all_gather_into_tensor", "all_reduce")
    yield from only(made, names, dtype)
    yield from through_layers(made)
    large = [call.get("numel", -1) for call in made
             if call["name"] == "all_reduce" and call.get("numel", -1) >= min(UNITS)]
    if large:
        yield f"all-reduces of {large} elements: as large as a unit's parameters ({min(UNITS)})"
    shards = sorted(padded(numel) // WORLD_SIZE for numel in UNITS)
    for stage in ("forward", "backward"):
        gathered = sizes(made, "all_gather_into_tensor", stage)
        if gathered != shards:
            yield (f"all-gathers of shards of {gathered} elements in {stage}, not one of each "
                   f"unit's: {shards}")
    if sizes(made, "all_gather_into_tensor", "after"):
        yield "an all-gather after backward"
    scattered = sizes(made, "reduce_scatter_tensor")
    if scattered != sorted(padded(numel) for numel in UNITS):
        yield (f"reduce-scatters of {scattered} elements, not one of each unit's padded "
               f"gradients: {sorted(padded(numel) for numel in UNITS)}")
    early = [call for call in made if call["name"] == "reduce_scatter_tensor"
             and call["grads_ready"] < len(PARAMS)]
    if len(early) < len(UNITS) - 1:
        yield (f"{len(early)} reduce-scatters started while backward ran, where each of "
               f"{len(UNITS) - 1} units is done before its end")


# --- In the ranks: the lesson's pieces, and the wrong versions ---------------------------------
def rank_tensor(rank, numel):
    """Rank `rank`'s values: any rank can make every rank's, so the expected result needs no
    message."""
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 + rank))


def ring_cases(rank, world_size, wrong):
    """{label: (calls, the result is right)} of the lesson's two halves and of each wrong version
    named in `wrong` (this module's functions, as (output, input) collectives)."""
    from manual_sharding import ring_all_gather, ring_reduce_scatter

    halves = {"reduce-scatter": ring_reduce_scatter, "all-gather": ring_all_gather}
    halves.update({label: globals()[label] for label in wrong})
    numel = world_size * CHUNK
    whole = torch.stack([rank_tensor(each, numel) for each in range(world_size)])
    shards = torch.stack([rank_tensor(each, CHUNK) for each in range(world_size)])
    recorded = {}
    for label, half in halves.items():
        gathering = "gather" in label
        if gathering:
            output, given, expected = torch.empty(numel), shards[rank].clone(), shards.view(-1)
        else:
            output, given = torch.empty(CHUNK), whole[rank].clone()
            expected = whole.sum(dim=0)[rank * CHUNK:(rank + 1) * CHUNK]
        with Recorder() as recorder:
            recorder.phase = 0
            half(output, given)
        recorded[label] = (recorder.calls, torch.allclose(output, expected, atol=1e-5))
    return recorded


def reduce_scatter_by_the_library(output, tensor):
    """The collective itself, no messages of one's own."""
    dist.reduce_scatter_tensor(output, tensor)


def all_gather_by_the_library(output, shard):
    dist.all_gather_into_tensor(output, shard)


def reduce_scatter_straight_to_the_owner(output, tensor):
    """Each chunk sent straight to the rank that owns it: the ring's bytes, not its neighbours."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    chunks = tensor.view(world_size, -1)
    output.copy_(chunks[rank])
    incoming = torch.empty_like(output)
    for distance in range(1, world_size):
        request = dist.isend(chunks[(rank + distance) % world_size], (rank + distance) % world_size)
        dist.recv(incoming, (rank - distance) % world_size)
        request.wait()
        output.add_(incoming)


def all_gather_straight_from_each_rank(output, shard):
    """Each rank's shard sent straight to every other rank."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    chunks = output.view(world_size, -1)
    chunks[rank].copy_(shard)
    for distance in range(1, world_size):
        request = dist.isend(shard, (rank + distance) % world_size)
        dist.recv(chunks[(rank - distance) % world_size], (rank - distance) % world_size)
        request.wait()


def reduce_scatter_by_passing_the_whole_buffer(output, tensor):
    """The whole buffer passed around the ring and summed as it goes: n-1 buffers, not (n-1)/n."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    total, travelling = tensor.clone(), tensor.clone()
    incoming = torch.empty_like(tensor)
    for _ in range(world_size - 1):
        request = dist.isend(travelling, (rank + 1) % world_size)
        dist.recv(incoming, (rank - 1) % world_size)
        request.wait()
        travelling = incoming.clone()
        total += incoming
    output.copy_(total.view(world_size, -1)[rank])


def reduce_scatter_by_a_renamed_all_reduce(output, tensor):
    """The ring's messages for show, nothing summed; the sum from dist.all_reduce under another
    name."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    chunks = tensor.view(world_size, -1)
    for step in range(world_size - 1):
        request = dist.isend(chunks[(rank - step - 1) % world_size].clone(),
                             (rank + 1) % world_size)
        dist.recv(torch.empty_like(chunks[0]), (rank - 1) % world_size)
        request.wait()
    ALL_REDUCE_UNDER_ANOTHER_NAME(tensor)
    output.copy_(chunks[rank])


WRONG_RING = {"reduce-scatter": ["reduce_scatter_by_the_library",
                                 "reduce_scatter_straight_to_the_owner",
                                 "reduce_scatter_by_passing_the_whole_buffer",
                                 "reduce_scatter_by_a_renamed_all_reduce"],
              "all-gather": ["all_gather_by_the_library", "all_gather_straight_from_each_rank"]}


def train(model, forward, recorder, step):
    """STEPS steps of `forward` on this rank's own batches, each followed by `step()` (the
    optimizer's); `model` is the module whose parameters are measured. {stage: (elements of the
    trainable parameters held whole, how many of them hold a gradient) at its end}, in the last
    step."""
    held = {}
    generator = torch.Generator().manual_seed(dist.get_rank())
    for index in range(STEPS):
        recorder.phase, recorder.stage, recorder.grads_ready = index, "forward", 0
        inputs = torch.randn(8, 32, generator=generator)
        loss = F.cross_entropy(forward(inputs), torch.randint(0, 10, (8,), generator=generator))
        held["forward"] = whole_and_gradients(model)
        recorder.stage = "backward"
        loss.backward()
        held["backward"] = whole_and_gradients(model)
        recorder.stage = "after"
        step()
    recorder.phase = "end"
    return held


def whole_and_gradients(model):
    """(elements of the trainable parameters held, how many of them hold a gradient) of `model`
    (a module, or a list of parameters)."""
    params = model if isinstance(model, list) else model.parameters()
    params = [param for param in params if param.requires_grad]
    return (sum(param.numel() for param in params),
            sum(param.grad is not None for param in params))


def counting(model, recorder):
    """The recorder's gradient count on `model`'s parameters: registered before the lesson's
    hooks, so it runs first."""
    for param in model.parameters():
        param.register_post_accumulate_grad_hook(recorder.count_gradient)


def step(optimizer, sharded=None):
    """After backward: FSDP's `sharded` finishes its reduce-scatters, then the optimizer steps."""
    if sharded is not None:
        sharded.finish_gradient_synchronization()
    optimizer.step()
    optimizer.zero_grad()


def through(recorder):
    """The library's collectives, as runtime/sharded.py passes them, inside the test's own layer:
    the keyword arguments of the lesson's classes."""
    from runtime.sharded import collectives

    return collectives("library", layers=[recorder.through_layer])


def zero_cases(rank, world_size, labels):
    """{label: (calls, what train() saw held)} of ShardedOptimizer, ZeRO-1 and ZeRO-2 (buckets of
    one parameter each), and of the wrong versions of `labels`."""
    versions = zero_versions()
    recorded = {}
    for label in labels:
        version, options = versions[label]
        model = small_model()
        with Recorder() as recorder:
            counting(model, recorder)
            optimizer = version(model.parameters(), torch.optim.AdamW, lr=LR,
                                **through(recorder), **options)
            held = train(model, model, recorder, functools.partial(step, optimizer))
        recorded[label] = (recorder.calls, held)
    return recorded


def zero_versions():
    """{label: (class, options)}: the lesson's ZeRO-1 and ZeRO-2, and wrong versions made from
    them, each with only the methods of the student's regions replaced."""
    from manual_sharding import ShardedOptimizer

    one_bucket_each = {"shard_gradients": True, "bucket_mb": 1e-9}

    class AllReduceAndStepEveryShard(ShardedOptimizer):
        """The whole gradient all-reduced, and each rank stepping a whole copy of the optimizer:
        DDP's bytes, none of ZeRO's memory."""

        def __init__(self, params, optimizer_class, **options):
            super().__init__(params, optimizer_class, **options)
            self.whole = [nn.Parameter(flat, requires_grad=False) for flat in self.flat_params]
            self.whole_optimizer = optimizer_class(self.whole, lr=LR)

        def reduce_gradients(self):
            for whole, grads in zip(self.whole, self.flat_grads):
                dist.all_reduce(grads)
                whole.grad = grads / dist.get_world_size()
            self.reduced = True

        def step(self, closure=None):
            if not self.reduced:
                self.reduce_gradients()
            self.whole_optimizer.step()
            self.reduced = False

    class AroundTheLayers(ShardedOptimizer):
        """ZeRO-1's collectives, called straight from torch.distributed: nothing times them."""

        def reduce_gradients(self):
            for shard, master, grads in zip(self.shards, self.masters, self.flat_grads):
                master.grad = grads.new_empty(shard.shard_numel)
                dist.reduce_scatter_tensor(master.grad, grads / shard.world)
            self.reduced = True

        def step(self, closure=None):
            if not self.reduced:
                self.reduce_gradients()
            self.optimizer.step()
            for master, flat in zip(self.masters, self.flat_params):
                dist.all_gather_into_tensor(flat, master.detach())
            self.reduced = False

    class ReduceScatterForShow(ShardedOptimizer):
        """A reduce-scatter for show; the average from dist.all_reduce under another name."""

        def reduce_gradients(self):
            for shard, master, grads in zip(self.shards, self.masters, self.flat_grads):
                self.reduce_scatter(grads.new_empty(shard.shard_numel), grads.clone()).wait()
                ALL_REDUCE_UNDER_ANOTHER_NAME(grads)
                master.grad = shard.own(grads) / shard.world
            self.reduced = True

        def step(self, closure=None):
            if not self.reduced:
                self.reduce_gradients()
            self.optimizer.step()
            for master, flat in zip(self.masters, self.flat_params):
                self.all_gather(flat, master.detach()).wait()
            self.reduced = False

    class AfterBackward(ReduceScatterForShow):
        """ZeRO-2 whose buckets are all reduce-scattered once backward is over, their gradients
        kept until then: ZeRO-1 with buckets."""

        def _grad_ready(self, param):
            pass

        def reduce_gradients(self):
            for shard, master in zip(self.shards, self.masters):
                flat = shard.flatten([param.grad for param in shard.params]) / shard.world
                master.grad = flat.new_empty(shard.shard_numel)
                self.reduce_scatter(master.grad, flat).wait()
                for param in shard.params:
                    param.grad = None
            self.reduced = True

    class KeepsTheGradients(AfterBackward):
        """ZeRO-2 that sends each bucket from backward but keeps its gradients: ZeRO-1's
        memory."""

        def _grad_ready(self, param):
            index = self.shard_of[param]
            self.ready[index] += 1
            shard = self.shards[index]
            if self.ready[index] == len(shard.params):
                self.ready[index] = 0
                flat = shard.flatten([each.grad for each in shard.params]) / shard.world
                self.masters[index].grad = flat.new_empty(shard.shard_numel)
                self.reduce_scatter(self.masters[index].grad, flat).wait()

        def reduce_gradients(self):
            self.reduced = True

    return {"ZeRO-1": (ShardedOptimizer, {}),
            "ZeRO-2": (ShardedOptimizer, one_bucket_each),
            "all-reduce, every shard stepped": (AllReduceAndStepEveryShard, {}),
            "around the layers": (AroundTheLayers, {}),
            "reduce-scatter for show": (ReduceScatterForShow, {}),
            "ZeRO-2 after backward": (AfterBackward, one_bucket_each),
            "ZeRO-2 keeping the gradients": (KeepsTheGradients, one_bucket_each)}


def fsdp_cases(rank, world_size, labels):
    """{label: (calls, what train() saw held)} of FullyShardedModel, in float32 and computing in
    bfloat16, and of the wrong versions of `labels`."""
    versions = fsdp_versions()
    recorded = {}
    for label in labels:
        model = small_model()
        with Recorder() as recorder:
            counting(model, recorder)
            version, options = versions[label]
            whole = list(model.parameters())
            sharded = version(model, **through(recorder), **options)
            optimizer = torch.optim.AdamW(sharded.parameters(), lr=LR)
            # the whole parameters, which the module shows only while a unit computes
            held = train(whole, sharded, recorder, functools.partial(step, optimizer, sharded))
        recorded[label] = (recorder.calls, held)
    return recorded


def fsdp_versions():
    """{label: a function of the module}: the lesson's FullyShardedModel, and wrong versions made
    from it, each with only the methods of the student's regions replaced."""
    from manual_sharding import FullyShardedModel

    class AllReduceTheGradients(FullyShardedModel):
        """Each unit's gradients all-reduced whole, this rank's shard kept."""

        def scatter_gradients(self, index):
            shard = self.shards[index]
            flat = shard.flatten([param.grad for param in shard.params], torch.float32)
            dist.all_reduce(flat.div_(shard.world))
            output = shard.own(flat).clone()
            done = torch.futures.Future()
            done.set_result(output)
            self.pending.append((index, done, output))
            for param in shard.params:
                param.grad = None
            self.free(index)

    class GatherByAllReduce(FullyShardedModel):
        """Each unit gathered by an all-reduce of a buffer of zeros holding this rank's shard."""

        def start_gather(self, index, dtype=None):
            shard = self.shards[index]
            if self.gathering[index] is not None or shard.params[0].numel():
                return
            flat = torch.zeros(shard.padded_numel)
            shard.own(flat).copy_(self.masters[index].detach())
            dist.all_reduce(flat)
            done = torch.futures.Future()
            done.set_result(flat)
            self.gathering[index] = (done, flat)

    class NeverFreed(FullyShardedModel):
        """Every unit gathered once and kept whole: DDP's memory, a gather a step saved."""

        def free(self, index):
            if not hasattr(self, "kept"):
                self.kept = set()
            if index not in self.kept:
                super().free(index)

        def gather(self, index, dtype=None):
            super().gather(index, dtype)
            self.kept.add(index)

    class ForShow(FullyShardedModel):
        """A reduce-scatter for show; the average from dist.all_reduce under another name."""

        def scatter_gradients(self, index):
            shard = self.shards[index]
            flat = shard.flatten([param.grad for param in shard.params], torch.float32)
            flat.div_(shard.world)
            self.reduce_scatter(flat.new_empty(shard.shard_numel), flat.clone()).wait()
            ALL_REDUCE_UNDER_ANOTHER_NAME(flat)
            output = shard.own(flat).clone()
            done = torch.futures.Future()
            done.set_result(output)
            self.pending.append((index, done, output))
            for param in shard.params:
                param.grad = None
            self.free(index)

    def in_bfloat16(model, **collectives):
        """The lesson's FullyShardedModel computing in bfloat16, as the runtime runs it."""
        from runtime.sharded import computing_in

        return computing_in(FullyShardedModel(model, **collectives), torch.bfloat16)

    return {"FSDP": (FullyShardedModel, {}),
            "FSDP in bfloat16": (in_bfloat16, {}),
            "all-reduced gradients": (AllReduceTheGradients, {}),
            "gathered by all-reduce": (GatherByAllReduce, {}), "never freed": (NeverFreed, {}),
            "reduce-scatter for show": (ForShow, {})}


# --- The tests: one launch per item, the lesson's piece and the wrong versions side by side ----
ZERO_WRONG = {"ZeRO-1": ("all-reduce, every shard stepped", "around the layers",
                         "reduce-scatter for show"),
              "ZeRO-2": ("ZeRO-2 after backward", "ZeRO-2 keeping the gradients")}
FSDP_WRONG = ("all-reduced gradients", "gathered by all-reduce", "never freed",
              "reduce-scatter for show")


@launch_once
def ring_run():
    """The ring's two halves and their wrong versions, in one launch (a hang: 30 s)."""
    wrong = tuple(label for labels in WRONG_RING.values() for label in labels)
    return run_in_processes(WORLD_SIZE, ring_cases, wrong, timeout_s=30, recorded=True)


@launch_once
def zero_run():
    """ZeRO-1, ZeRO-2 and their wrong versions, in one launch."""
    labels = tuple(ZERO_WRONG) + tuple(label for wrong in ZERO_WRONG.values() for label in wrong)
    return run_in_processes(WORLD_SIZE, zero_cases, labels, timeout_s=30, recorded=True)


@launch_once
def fsdp_run():
    """FullyShardedModel and its wrong versions, in one launch."""
    labels = ("FSDP", "FSDP in bfloat16", *FSDP_WRONG)
    return run_in_processes(WORLD_SIZE, fsdp_cases, labels, timeout_s=30, recorded=True)


@pytest.mark.rubric("core.sharding_collectives")
@pytest.mark.parametrize("half", ["reduce-scatter", "all-gather"])
def test_each_half_of_the_ring_sends_n_minus_1_over_n_to_its_right_neighbour_only(half):
    numel = WORLD_SIZE * CHUNK  # the reduce-scatter's input, the all-gather's output
    for rank, cases in enumerate(ring_run()):
        calls, right = cases[half]
        assert right, f"rank {rank}: the {half} left a wrong result"
        assert problems(ring_half, calls, rank, WORLD_SIZE, numel, steps=1) == "", f"rank {rank}"
        # the library's collective, messages to the wrong ranks or of the wrong size, and
        # messages for show beside a renamed all-reduce: each rejected
        for label in WRONG_RING[half]:
            assert problems(ring_half, cases[label][0], rank, WORLD_SIZE, numel, steps=1), \
                f"accepts {label}"


@pytest.mark.rubric("core.zero")
def test_zero_1_reduce_scatters_every_gradient_and_all_gathers_every_parameter_once_a_step():
    for rank, cases in enumerate(zero_run()):
        calls, _ = cases["ZeRO-1"]
        assert problems(zero_1, calls) == "", f"rank {rank}"
        # an all-reduce of the whole gradient, every shard stepped locally (DDP's bytes, none of
        # ZeRO's memory), the collectives called around their layers, and a reduce-scatter for
        # show beside a renamed all-reduce: rejected
        for label in ZERO_WRONG["ZeRO-1"]:
            assert problems(zero_1, cases[label][0]), f"accepts {label}"


@pytest.mark.rubric("core.zero")
def test_zero_2_reduce_scatters_each_bucket_while_backward_runs_and_keeps_no_gradient():
    for rank, cases in enumerate(zero_run()):
        calls, held = cases["ZeRO-2"]
        assert problems(zero_2, calls) == "", f"rank {rank}"
        # once backward is over, no parameter holds a gradient: each bucket's were freed
        assert held["backward"][1] == 0, f"rank {rank}: {held['backward'][1]} gradients kept"
        # every bucket sent after backward, and gradients kept once sent: rejected
        for label in ZERO_WRONG["ZeRO-2"]:
            calls, held = cases[label]
            assert problems(zero_2, calls) or held["backward"][1], f"accepts {label}"


@pytest.mark.rubric("core.fsdp")
@pytest.mark.parametrize("label, dtype", [("FSDP", "float32"),
                                          ("FSDP in bfloat16", "bfloat16")],
                         ids=["float32", "bfloat16"])
def test_fsdp_gathers_each_unit_in_forward_and_in_backward_and_reduce_scatters_it_once(label,
                                                                                      dtype):
    for rank, cases in enumerate(fsdp_run()):
        calls, held = cases[label]
        assert problems(fsdp, calls, dtype) == "", f"rank {rank}"
        # every unit freed after its forward, and after its backward with its gradients
        assert held["forward"][0] == 0, f"rank {rank}: {held['forward'][0]} elements kept whole"
        assert held["backward"] == (0, 0), f"rank {rank}: kept after backward: {held['backward']}"
        # gradients all-reduced whole, a gather made of an all-reduce, units never freed, and a
        # reduce-scatter for show beside a renamed all-reduce: rejected
        for wrong in FSDP_WRONG:
            calls, held = cases[wrong]
            assert problems(fsdp, calls) or held["forward"][0] or held["backward"] != (0, 0), \
                f"accepts {wrong}"


# --- What each half moves, counted outside the ranks -------------------------------------------
# As tests/test_integrity.py does for the ring all-reduce: the kernel counts what the ranks sent
# (grading/launch.py run_counting_bytes), and the half's messages must explain it.
WIRE_CHUNK = 2**17  # 512 KiB of float32 per rank's chunk: far above the process group's set-up
WIRE_OVERHEAD = 32 * 2**10  # set-up and message headers: under 5 KiB with the lesson's halves


def half_on_the_wire(rank, world_size, half, how):
    """The lesson's half (`how` "lesson") on WIRE_CHUNK elements per rank, or a cheat: the half's
    messages for show, the result through the gloo group the recorded one forwards to. Returns
    whether the result is right."""
    import gc

    from manual_sharding import ring_all_gather, ring_reduce_scatter

    whole = torch.stack([rank_tensor(each, world_size * WIRE_CHUNK) for each in range(world_size)])
    shards = torch.stack([rank_tensor(each, WIRE_CHUNK) for each in range(world_size)])
    gathering = half == "all-gather"
    if gathering:
        output, given, expected = torch.empty(world_size * WIRE_CHUNK), shards[rank].clone(), \
            shards.view(-1)
    else:
        output, given = torch.empty(WIRE_CHUNK), whole[rank].clone()
        expected = whole.sum(dim=0)[rank * WIRE_CHUNK:(rank + 1) * WIRE_CHUNK]
    if how == "lesson":
        (ring_all_gather if gathering else ring_reduce_scatter)(output, given)
    else:
        show = torch.empty(WIRE_CHUNK)
        for _ in range(world_size - 1):
            request = dist.isend(show, (rank + 1) % world_size)
            dist.recv(torch.empty_like(show), (rank - 1) % world_size)
            request.wait()
        inner = next(thing for thing in gc.get_objects()
                     if isinstance(thing, recorded_group.RecordedGloo))._gloo
        if gathering:
            inner.allgather([list(output.view(world_size, -1))], [given]).wait()
        else:
            inner.allreduce([given]).wait()
            output.copy_(given.view(world_size, -1)[rank])
    return bool(torch.allclose(output, expected, atol=1e-4))


@pytest.mark.rubric("core.sharding_collectives")
@pytest.mark.parametrize("half", ["reduce-scatter", "all-gather"])
def test_each_half_sends_no_byte_its_messages_do_not_explain(half):
    payload = WORLD_SIZE * (WORLD_SIZE - 1) * WIRE_CHUNK * 4  # (n-1)/n of n chunks, a rank

    def extra(how):
        results, sent, counted = run_counting_bytes(WORLD_SIZE, half_on_the_wire, half, how,
                                                    timeout_s=30, recorded=True)
        assert all(results), f"the {how}'s {half} left a wrong result"
        return sent - payload, counted

    lesson, counted = extra("lesson")
    assert abs(lesson) <= WORLD_SIZE * WIRE_OVERHEAD, (
        f"the ranks sent {lesson:+,} bytes (counted: {counted}) beyond the {half}'s messages: a "
        "result through another channel, or messages that never went over the wire")
    assert extra("cheat")[0] > WORLD_SIZE * WIRE_OVERHEAD, "accepts a result from outside the ring"
