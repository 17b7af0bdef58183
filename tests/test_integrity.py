"""Integrity: each hand-written piece does what it claims, proved by watching torch.distributed.

In each rank, torch.distributed's communicating functions, wherever a loaded module holds them,
record every call; a check reads the calls of each step's synchronisation, from the start of
backward to the end of finish_gradient_synchronization(). Below those names, the process group
itself reports every operation it carries (grading/recorded_group.py): each must match a watched
call, so a strategy that goes around the names (a saved reference to dist.all_reduce, the group
object's own methods, torch's DDP) is caught too. Each test also runs deliberately wrong
strategies, defined here, and asserts that its check rejects them: a check that cannot fail
proves nothing. Only the autograder has this file.

Each test needs one piece of the lesson only: a strategy driven alone (tests/adapters.py), or one
function called after backward by the tests themselves (average_gradients, the ring all-reduce,
the compression layer around the library's all-reduce).

The code under test is imported inside the functions that run in the child processes, never at the
top: this module is also imported by the process that decides the tests (grading/judge.py).
"""
import collections
import functools
import inspect
import itertools
import sys
import types

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from grading import recorded_group
from grading.launch import ChildFailed, run_counting_bytes, run_in_processes

STEPS = 2
BUCKET_MB = 0.01  # 10 KiB: the small model below then needs five buckets
PREFIXES = ("all", "reduce", "broadcast", "gather", "scatter", "barrier", "monitored", "send",
            "recv", "isend", "irecv", "batch_isend")
WATCHED = [name for name, value in vars(dist).items()
           if type(value) is types.FunctionType and name.lstrip("_").startswith(PREFIXES)]
# The process group's operation for each watched function (recorded_group.py's names).
OPERATION = {"all_reduce": "allreduce", "isend": "send", "irecv": "recv",
             "all_gather": "allgather", "all_gather_into_tensor": "allgather",
             "reduce_scatter_tensor": "reduce_scatter"}
# A reference to dist.all_reduce under a name the recorder does not replace.
ALL_REDUCE_UNDER_ANOTHER_NAME = dist.all_reduce


def small_model():
    """Four linear layers: eight gradients of 40 to 16,640 bytes."""
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


NUMELS = [param.numel() for param in small_model().parameters()]


class Recorder:
    """While entered, each outermost call of a watched function appends a dict to `calls`."""

    def __init__(self):
        self.calls = []
        self.phase = "start-up"
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
        """Append the call's facts; for batch_isend_irecv, those of each message it holds."""
        try:
            arguments = signature.bind(*args, **kwargs).arguments
        except TypeError:  # a call that does not fit: the function itself will raise
            arguments = {}
        messages = [(getattr(op.op, "__name__", "?"), op.tensor, op.peer, True)
                    for op in arguments.get("p2p_op_list") or []]
        if name != "batch_isend_irecv":
            peer = arguments.get("dst", arguments.get("src"))
            messages.append((name, arguments.get("tensor"), peer, arguments.get("async_op")))
        for name, tensor, peer, async_op in messages:
            call = {"name": name, "phase": self.phase, "peer": peer, "async": bool(async_op),
                    "grads_ready": self.grads_ready, "in_layer": self.in_layers > 0}
            if isinstance(tensor, torch.Tensor):
                call.update(dtype=str(tensor.dtype).removeprefix("torch."), numel=tensor.numel(),
                            nbytes=tensor.numel() * tensor.element_size())
            self.calls.append(call)

    def through_layer(self, all_reduce):
        """A layer of the test's own: records each call that passes through it (as a call named
        "layer"), and marks the watched calls made inside it."""
        def passed(tensor):
            self.calls.append({"name": "layer", "phase": self.phase,
                               "dtype": str(tensor.dtype).removeprefix("torch."),
                               "numel": tensor.numel()})
            self.in_layers += 1
            try:
                return all_reduce(tensor)
            finally:
                self.in_layers -= 1
        return passed


def record_cases(rank, world_size, cases):
    """In one rank: {label: calls} of STEPS steps of wrapper(model, recorder, *args, **options)
    per case; a case names its wrapper ("Strategy", "AfterBackward" or "Wrong"): a class handed
    over itself would be imported, while the arguments are read, from the judge's folder, not the
    sandbox."""
    wrappers = {"Strategy": strategy_alone, "AfterBackward": AfterBackward, "Wrong": Wrong}
    recorded = {}
    for label, wrapper_name, args, options in cases:
        wrapper = wrappers[wrapper_name]
        torch.manual_seed(rank)  # different on each rank: what is sent is each rank's own
        model = small_model()
        with Recorder() as recorder:
            for param in model.parameters():  # before the strategy's hooks: they run first
                param.register_post_accumulate_grad_hook(recorder.count_gradient)
            wrapped = wrapper(model, recorder, *args, **options)
            for step in range(STEPS):
                recorder.phase = "forward"
                inputs = torch.randn(8, 32)  # seeded above: each rank its own
                loss = F.cross_entropy(wrapped(inputs), torch.randint(0, 10, (8,)))
                recorder.phase = step
                recorder.grads_ready = 0
                loss.backward()
                wrapped.finish_gradient_synchronization()
        recorded[label] = recorder.calls
    return recorded


# --- How the tests drive the lesson: one piece at a time ---------------------------------------
def strategy_alone(model, recorder, strategy, bucket_mb=25.0, through_layer=False):
    """The lesson's strategy alone (tests/adapters.py: no other piece of the lesson), with the
    test's own layer around its all-reduce where `through_layer`."""
    from tests.adapters import StrategyAlone

    layers = [recorder.through_layer] if through_layer else []
    return StrategyAlone(model, strategy, bucket_mb, layers)


class AfterBackward:
    """`module`, and after each backward one function of the lesson, called by the test itself
    (no strategy around it), that averages the gradients: the method named `average`. Takes the
    recorder as every wrapper does, and needs none of it."""

    def __init__(self, module, recorder, average, wire=None):
        self.module = module
        self.grads = lambda: [param.grad for param in module.parameters()]
        self.average = getattr(self, average)
        self.wire = wire  # the compression layer's wire dtype, by name

    def __call__(self, inputs):
        """The module's forward."""
        return self.module(inputs)

    def finish_gradient_synchronization(self):
        self.average()

    def average_gradients(self):
        """manual_allreduce.average_gradients, on the module."""
        from manual_allreduce import average_gradients

        average_gradients(self.module)

    def ring_all_reduce(self):
        """Every gradient in one flat buffer (the test's own), summed by the lesson's ring."""
        from manual_collectives import ring_all_reduce

        grads = self.grads()
        flat = torch.cat([grad.view(-1) for grad in grads])
        ring_all_reduce(flat)
        flat /= dist.get_world_size()
        for grad, averaged in zip(grads, flat.split([grad.numel() for grad in grads])):
            grad.copy_(averaged.view_as(grad))

    def compressed(self):
        """Each gradient summed by the lesson's compression layer around the library's
        all-reduce (manual_allreduce.all_reduce, given)."""
        from manual_allreduce import all_reduce, compressed

        layered = compressed(all_reduce, getattr(torch, self.wire))
        for grad in self.grads():
            grad /= dist.get_world_size()
            layered(grad).wait()


# --- The checks: each yields what contradicts the claim in one step's calls --------------------
def problems(check, calls, *args):
    """`check`'s complaints about each step's watched calls, and every_operation_watched's, one a
    line ("" when none)."""
    complaints = []
    for step in range(STEPS):
        made = [call for call in calls if call["phase"] == step and not call.get("below")]
        below = [call for call in calls if call["phase"] == step and call.get("below")]
        for problem in itertools.chain(check(made, *args), every_operation_watched(made, below)):
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
               "called for (a saved reference, the group object, or DDP)")


def only(made, dtype, *names):
    """Complaints naming what was called besides `names`, and what was sent besides `dtype`."""
    others = sorted({call["name"] for call in made} - set(names))
    if others:
        yield f"{others} called, where only {names} may be"
    dtypes = sorted({call.get("dtype") for call in made} - {dtype}, key=str)
    if dtypes:
        yield f"tensors of {dtypes} sent, not {dtype}"


def all_reduced(made, dtype, sizes=None):
    """Only all_reduces, of `dtype`, sending every gradient element once (in tensors of `sizes`
    elements, where given): with a 16-bit `dtype`, half the bytes of float32."""
    yield from only(made, dtype, "all_reduce")
    numels = sorted(call.get("numel", -1) for call in made)
    if sum(numels) != sum(NUMELS) or (sizes is not None and sizes != numels):
        yield f"all_reduce of tensors of {numels} elements, not {sizes or sum(NUMELS)}"


def bucketed(made):
    """Several async all_reduces sending every gradient element once, one started before backward
    had computed every gradient (a step's calls begin with backward)."""
    yield from all_reduced(made, "float32")
    if len(made) < 2:
        yield f"one all_reduce, where buckets of {BUCKET_MB} MiB need several"
    if not all(call["async"] for call in made):
        yield "an all_reduce without async_op=True"
    if not any(call["grads_ready"] < len(NUMELS) for call in made):
        yield "no all_reduce started while backward still had gradients to compute"


def through_layers(made):
    """Every all_reduce called from inside the test's own layer, which saw every gradient element
    once, in float32."""
    passed = [call for call in made if call["name"] == "layer"]
    outside = sorted({call["name"] for call in made
                      if call["name"] != "layer" and not call["in_layer"]})
    if outside:
        yield f"{outside} called outside the strategy's layers"
    numels = sum(call["numel"] for call in passed)
    if numels != sum(NUMELS):
        yield f"the layers saw {numels} gradient elements, not {sum(NUMELS)}"
    dtypes = sorted({call["dtype"] for call in passed} - {"float32"})
    if dtypes:
        yield f"the layers saw tensors of {dtypes}, not the gradients' float32"


def ring(made, wire, rank, world_size):
    """Point-to-point messages of `wire`, with the neighbours only, 2(n-1)/n of the flat buffer's
    bytes sent by each rank (chunks may differ by a few elements)."""
    size = torch.tensor([], dtype=getattr(torch, wire)).element_size()
    expected = 2 * (world_size - 1) / world_size * sum(NUMELS) * size
    messages = [call for call in made if call["name"] in ("send", "recv", "isend", "irecv")]
    sent = sum(call.get("nbytes", 0) for call in messages if "send" in call["name"])
    yield from only(made, wire, "send", "recv", "isend", "irecv")
    peers = {call["peer"] for call in messages} - {(rank + 1) % world_size, (rank - 1) % world_size}
    if peers:
        yield f"messages with ranks {sorted(peers, key=str)}, not neighbours"
    if abs(sent - expected) > 2 * world_size * size:
        yield f"rank {rank} sent {sent} bytes, not 2(n-1)/n of the buffer: {expected:.0f}"


# --- Deliberately wrong strategies, which the checks must reject ------------------------------
class Wrong:
    """ManualDDP's interface and start-up around a wrong way to send gradients: the method named
    `finish` runs after backward, the one named `on_gradient` each time a gradient is ready."""

    def __init__(self, module, recorder, finish=None, on_gradient=None, ddp=False):
        # `ddp`: the model wrapped in torch's DDP, which averages the gradients in backward
        self.module = nn.parallel.DistributedDataParallel(module) if ddp else module
        self.params = list(module.parameters())
        self.finish = getattr(self, finish) if finish else lambda: None
        self.on_gradient = getattr(self, on_gradient) if on_gradient else lambda: None
        self.works, self.ready = [], []
        for param in self.params:
            dist.broadcast(param.detach(), 0)
            param.register_post_accumulate_grad_hook(self.grad_ready)

    def __call__(self, inputs):
        """The module's forward."""
        return self.module(inputs)

    def grad_ready(self, param):
        """The hook: `param`'s gradient is ready."""
        self.ready.append(param)
        self.on_gradient()

    def finish_gradient_synchronization(self):
        """`finish`, then wait for what was started."""
        self.finish()
        for work in self.works:
            work.wait()
        self.works, self.ready = [], []

    def flat(self):
        """A new buffer holding every gradient."""
        return torch.cat([param.grad.view(-1) for param in self.params])

    def one_all_reduce(self):
        """A per-param that flattens, a ring that calls all_reduce."""
        dist.all_reduce(self.flat())

    def gather_each(self):
        """The tests' own strategy (tests/adapters.py) handed in as an answer: every rank's
        gradient gathered, then their mean."""
        from tests.adapters import AverageEachAfterBackward

        AverageEachAfterBackward(self.params).finish()

    def all_reduce_each(self):
        """A flat that sends each gradient alone; float32 despite compression; a strategy that
        goes around its layers."""
        for param in self.params:
            dist.all_reduce(param.grad)

    def start_after_backward(self):
        """Buckets (of one gradient) started only once backward has returned."""
        for param in self.params:
            self.works.append(dist.all_reduce(param.grad, async_op=True))

    def start_at_last_gradient(self):
        """Buckets started from backward, but only once every gradient is ready."""
        if len(self.ready) == len(self.params):
            self.start_after_backward()

    def send_blocking(self):
        """Buckets sent from backward, blocking it meanwhile."""
        dist.all_reduce(self.ready[-1].grad)

    def ring_messages(self):
        """The ring's 2(n-1) messages of a chunk each, to the right, from the left: what the ring
        check counts, with nothing summed."""
        world_size, rank = dist.get_world_size(), dist.get_rank()
        chunks = self.flat().tensor_split(world_size)
        for step in range(2 * (world_size - 1)):
            request = dist.isend(chunks[(rank - step) % world_size], (rank + 1) % world_size)
            dist.recv(torch.empty_like(chunks[(rank - step - 1) % world_size]),
                      (rank - 1) % world_size)
            request.wait()

    def ring_and_a_renamed_all_reduce(self):
        """The ring's messages for show; the sum from dist.all_reduce under another name."""
        self.ring_messages()
        ALL_REDUCE_UNDER_ANOTHER_NAME(self.flat())

    def ring_and_the_groups_all_reduce(self):
        """The ring's messages for show; the sum from the process group's own method."""
        self.ring_messages()
        dist.group.WORLD.allreduce([self.flat()]).wait()

    def send_whole_buffer(self):
        """A ring whose rank sends its whole buffer to the right: 1, not 2(n-1)/n, buffers."""
        world_size, rank = dist.get_world_size(), dist.get_rank()
        request = dist.isend(self.flat(), (rank + 1) % world_size)
        dist.recv(self.flat(), (rank - 1) % world_size)
        request.wait()


# --- The tests: the submission's piece passes each check, the wrong ones fail it -------------
def record(world_size, solutions, wrong):
    """Each rank's {label: calls}: first the lesson's, for each label: (wrapper, args, options) of
    `solutions` (one that raises stops the test), then each Wrong of `wrong` (label: options)."""
    cases = [(label, wrapper, args, options)
             for label, (wrapper, args, options) in solutions.items()]
    cases += [(label, "Wrong", (), options) for label, options in wrong.items()]
    # a hang: 30 s
    return run_in_processes(world_size, record_cases, cases, timeout_s=30, recorded=True)


# The rubric item of each strategy's checks: each test drives that strategy alone
RUBRIC_ITEM = {"per-param": pytest.mark.rubric("core.per_parameter"),
               "flat": pytest.mark.rubric("core.flat"),
               "bucketed": pytest.mark.rubric("core.bucketed")}


def case(strategy, *values):
    """A test case of `strategy` (and `values`), named by it and marked with its item."""
    return pytest.param(strategy, *values, id=strategy,
                        marks=RUBRIC_ITEM[strategy])


@pytest.mark.parametrize("strategy, sizes, wrong", [
    case("per-param", sorted(NUMELS), "one_all_reduce"),  # one per gradient; wrong: flattened
    case("flat", [sum(NUMELS)], "all_reduce_each"),  # one of every element; wrong: one per gradient
])
def test_per_param_and_flat_send_all_reduces_of_the_claimed_sizes_and_nothing_else(
        strategy, sizes, wrong):
    solution = {"solution": ("Strategy", (strategy,), {})}
    for rank, calls in enumerate(record(2, solution, {wrong: {"finish": wrong}})):
        assert problems(all_reduced, calls["solution"], "float32", sizes) == "", f"rank {rank}"
        assert problems(all_reduced, calls[wrong], "float32", sizes), f"accepts {wrong}"


@pytest.mark.rubric("core.per_parameter")
def test_average_gradients_sends_one_all_reduce_per_gradient_and_nothing_else():
    solution = {"solution": ("AfterBackward", ("average_gradients",), {})}
    # wrong: the tests' own strategy (all_gather, then the mean), and one flattened all-reduce
    wrong = {"gather": {"finish": "gather_each"}, "flattened": {"finish": "one_all_reduce"}}
    for rank, calls in enumerate(record(2, solution, wrong)):
        found = problems(all_reduced, calls["solution"], "float32", sorted(NUMELS))
        assert found == "", f"rank {rank}"
        for label in wrong:
            assert problems(all_reduced, calls[label], "float32", sorted(NUMELS)), \
                f"accepts {label}"


@pytest.mark.parametrize("strategy", [case("per-param"), case("flat"), case("bucketed")])
def test_every_all_reduce_of_a_strategy_goes_through_its_layers(strategy):
    # The ring and shared-memory strategies are the flat one with another collective: flat's case
    # covers them, and the ring's would need two pieces of the lesson.
    options = {"through_layer": True, "bucket_mb": BUCKET_MB}
    solution = {"solution": ("Strategy", (strategy,), options)}
    wrong = {"around the layers": {"finish": "all_reduce_each"}}
    for rank, calls in enumerate(record(2, solution, wrong)):
        assert problems(through_layers, calls["solution"]) == "", f"rank {rank}"
        assert problems(through_layers, calls["around the layers"]), "accepts no layers"


@pytest.mark.rubric("core.bucketed")
def test_bucketed_starts_async_all_reduces_while_backward_runs():
    solution = {"solution": ("Strategy", ("bucketed",), {"bucket_mb": BUCKET_MB})}
    wrong = {"after backward": {"finish": "start_after_backward"},
             "at the last gradient": {"on_gradient": "start_at_last_gradient"},
             "blocking": {"on_gradient": "send_blocking"}}
    for rank, calls in enumerate(record(2, solution, wrong)):
        assert problems(bucketed, calls["solution"]) == "", f"rank {rank}"
        for label in wrong:
            assert problems(bucketed, calls[label]), f"accepts buckets sent {label}"


@pytest.mark.rubric("core.ring")  # manual_collectives.ring_all_reduce alone
@pytest.mark.parametrize("world_size", [2, 3, 4])  # 3: chunks of uneven length
def test_the_ring_sends_2_n_minus_1_over_n_of_the_buffer_to_its_neighbours_only(world_size):
    # the lesson's ring_all_reduce on the test's own flat buffer of every gradient
    solution = {"solution": ("AfterBackward", ("ring_all_reduce",), {})}
    wrong = {"all_reduce": {"finish": "one_all_reduce"}, "whole": {"finish": "send_whole_buffer"},
             # the ring's messages for show, the sum from around the watched names
             "renamed": {"finish": "ring_and_a_renamed_all_reduce"},
             "group": {"finish": "ring_and_the_groups_all_reduce"},
             "ddp": {"finish": "ring_messages", "ddp": True}}
    if world_size == 2:  # sending the whole buffer is what the ring sends there: 2(n-1)/n = 1
        del wrong["whole"]
    for rank, calls in enumerate(record(world_size, solution, wrong)):
        assert problems(ring, calls["solution"], "float32", rank, world_size) == "", f"rank {rank}"
        for label in wrong:
            assert problems(ring, calls[label], "float32", rank, world_size), f"accepts {label}"


@pytest.mark.rubric("core.compression")  # the layer alone, around the library's all-reduce
def test_compression_sends_half_the_bytes_in_the_wire_dtype():
    # the lesson's compression layer around the library's all-reduce, on each gradient
    wires = {"fp16": "float16", "bf16": "bfloat16"}
    solutions = {compress: ("AfterBackward", ("compressed",), {"wire": wire})
                 for compress, wire in wires.items()}
    wrong = {"float32": {"finish": "all_reduce_each"}}
    for rank, calls in enumerate(record(2, solutions, wrong)):
        for compress, wire in wires.items():
            found = problems(all_reduced, calls[compress], wire, sorted(NUMELS))
            assert found == "", f"rank {rank}: {compress}"
        assert problems(all_reduced, calls["float32"], "float16", sorted(NUMELS)), \
            "accepts float32"


# --- What the ring moves, counted outside the ranks --------------------------------------------
# The checks above watch the ranks from inside their own processes, where code can reach past any
# watcher (the gloo group inside the recorded one, say). Here the kernel counts what the ranks sent
# (grading/launch.py run_counting_bytes: over a network of their own, with nothing else shared),
# and the ring's messages must explain it.
RING_ELEMENTS = 2**18  # 1 MiB of float32: far above what setting up the process group sends
# What a rank may send besides its messages' payloads: the process group's set-up and the headers
# of its messages, about 8 KiB a rank with the lesson's ring at 3 ranks (the failure message
# prints it); a sum outside the ring adds at least the whole buffer
WIRE_OVERHEAD = 32 * 2**10


def ring_on_the_wire(rank, world_size, how):
    """The lesson's ring_all_reduce of every rank's RING_ELEMENTS (`how` "lesson"), or a cheat:
    the ring's messages for show, the sum through the gloo group the recorded one forwards to
    ("gloo"), or through sockets of its own, their ports swapped through the process group's
    store ("sockets"). Returns the sum's least and greatest element."""
    tensor = torch.full((RING_ELEMENTS,), float(rank + 1))
    if how == "lesson":
        from manual_collectives import ring_all_reduce

        ring_all_reduce(tensor)
        return float(tensor.min()), float(tensor.max())
    chunks = tensor.tensor_split(world_size)
    for step in range(2 * (world_size - 1)):
        request = dist.isend(chunks[(rank - step) % world_size], (rank + 1) % world_size)
        dist.recv(torch.empty_like(chunks[(rank - step - 1) % world_size]),
                  (rank - 1) % world_size)
        request.wait()
    if how == "gloo":
        import gc

        recorded = next(thing for thing in gc.get_objects()
                        if isinstance(thing, recorded_group.RecordedGloo))
        recorded._gloo.allreduce([tensor]).wait()
    else:
        sum_over_sockets(tensor, rank, world_size)
    return float(tensor.min()), float(tensor.max())


def sum_over_sockets(tensor, rank, world_size):
    """Every rank's tensor summed over TCP sockets of the ranks' own: send() and its kin write
    nothing the kernel counts as a process's writes."""
    import socket

    from torch.distributed.distributed_c10d import _get_default_store

    store = _get_default_store()
    listener = socket.create_server(("127.0.0.1", 0))
    store.set(f"port-{rank}", str(listener.getsockname()[1]))
    original = tensor.clone()
    for peer in range(world_size):
        if peer == rank:
            continue
        outgoing = socket.create_connection(("127.0.0.1", int(store.get(f"port-{peer}"))))
        outgoing.sendall(original.numpy().tobytes())
        incoming, _ = listener.accept()
        data = bytearray()
        while len(data) < original.numel() * 4:
            data += incoming.recv(1 << 20)
        tensor += torch.frombuffer(data, dtype=torch.float32)
        outgoing.close()
        incoming.close()


def unexplained_bytes(world_size, how):
    """The bytes the ranks sent beyond the ring's payload (2(n-1)/n of the buffer a rank), how
    they were counted, and each rank's sum's least and greatest element."""
    payload = world_size * 2 * (world_size - 1) * RING_ELEMENTS * 4 / world_size
    results, sent, counted = run_counting_bytes(world_size, ring_on_the_wire, how, timeout_s=30,
                                                recorded=True)
    return sent - payload, counted, results


def caught(world_size, how):
    """Whether a cheat `how` is caught: its bytes counted beyond the allowance, or its channel
    refused (no new sockets where nothing would count them)."""
    try:
        extra, _, _ = unexplained_bytes(world_size, how)
    except ChildFailed as error:
        return "Operation not permitted" in str(error)
    return extra > world_size * WIRE_OVERHEAD


@pytest.mark.rubric("core.ring")
@pytest.mark.parametrize("world_size", [3])  # chunks of uneven length
def test_the_ring_sends_no_byte_its_messages_do_not_explain(world_size):
    total = world_size * (world_size + 1) / 2
    extra, counted, results = unexplained_bytes(world_size, "lesson")
    for rank, extremes in enumerate(results):
        assert extremes == (total, total), f"rank {rank}: the sum is wrong"
    assert abs(extra) <= world_size * WIRE_OVERHEAD, (
        f"the ranks sent {extra:+,.0f} bytes (counted: {counted}) beyond the ring's messages: a "
        "sum through another channel, or messages that never went over the wire")
    # the check must catch a sum outside the ring, through the library or through sockets
    assert caught(world_size, "gloo"), "accepts a sum through the library's own group"
    assert caught(world_size, "sockets"), "accepts a sum through sockets of the ranks' own"
