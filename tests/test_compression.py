"""The compression layer (manual_allreduce.compressed) alone: the library's all-reduce of a 16-bit
copy, the sum copied back into the caller's float32 tensor.

Each rank sends values with 15 significant bits (multiples of 2^-10 below 16 in magnitude): more
than either wire dtype keeps, while their sum over a few ranks is exact in float32. So an
all-reduce that sent float32 would return the exact sum to the bit, and one that rounded to the
wire cannot. Every case runs in real gloo processes, one launch per world size shared by its
cases; each rank returns what it sent and what it got back, and the tests compare with the exact
sum computed here. Needs no piece of the lesson but the layer (the library's all_reduce around it
is given).

The code under test is imported inside the functions that run in the child processes, never at the
top: this module is also imported by the process that decides the tests (grading/judge.py).
"""
import functools
import threading

import pytest
import torch

from grading.launch import launch_once, run_in_processes

pytestmark = pytest.mark.rubric("core.compression")

WIRES = {"fp16": "float16", "bf16": "bfloat16"}  # --compress: the wire dtype
PRECISION_BITS = {"fp16": 11, "bf16": 8}  # significand bits, the implicit one included
LENGTH = 1000  # elements per tensor
BLOCKING_S = 5.0  # a layer that waits for the inner all-reduce inside the call is released then


def values_to_send(rank, wire):
    """Rank `rank`'s float32 tensor: multiples of 2^-10 in (-16, 16), seeded by rank and wire."""
    generator = torch.Generator().manual_seed(100 * rank + len(wire))
    return torch.randint(-2**14 + 1, 2**14, (LENGTH,), generator=generator) / 2**10


def noting(seen):
    """A layer that notes what each call it wraps carries: (dtype, number of elements)."""
    def layer(all_reduce):
        def noted(tensor):
            seen.append((str(tensor.dtype).removeprefix("torch."), tensor.numel()))
            return all_reduce(tensor)
        return noted
    return layer


def sum_once(rank, wire):
    """The layer around the library's all-reduce, on one tensor: what was sent, what the tensor
    holds after waiting, and whether the future gave back that same float32 tensor."""
    from manual_allreduce import all_reduce, compressed

    tensor = values_to_send(rank, wire)
    sent = tensor.clone()
    future = compressed(all_reduce, getattr(torch, WIRES[wire]))(tensor)
    returned = future.wait()
    return {"sent": sent, "result": tensor.clone(), "returned_the_tensor": returned is tensor,
            "dtype": str(tensor.dtype), "done": future.done()}


def fail_inside(wire):
    """The layer around a fake all-reduce whose future is still pending when the layer returns and
    then fails: whether the layer's future was still pending then, and the error its wait raised
    (or the one the call itself raised)."""
    from manual_allreduce import compressed

    inner = torch.futures.Future()
    lock = threading.Lock()

    def fail():
        with lock:
            if not inner.done():
                inner.set_exception(RuntimeError("the inner all-reduce failed"))

    timer = threading.Timer(BLOCKING_S, fail)  # a layer that waits inside the call: released
    timer.start()
    layered = compressed(lambda tensor: inner, getattr(torch, WIRES[wire]))
    try:
        future = layered(torch.ones(4))
    except RuntimeError as error:
        return {"raised_at_the_call": str(error)}
    finally:
        timer.cancel()
    pending = not future.done()
    fail()
    try:
        future.wait()
    except RuntimeError as error:
        return {"pending": pending, "raised_at_the_wait": str(error)}
    return {"pending": pending}


def with_another_layer(rank, wire):
    """The compression layer inside and outside a noting layer, the first listed innermost: what
    each noting layer saw, and each result."""
    from manual_allreduce import all_reduce, compressed

    compress = functools.partial(compressed, wire_dtype=getattr(torch, WIRES[wire]))
    outcome = {}
    for order, layers in (("noting inside", lambda seen: [noting(seen), compress]),
                          ("noting outside", lambda seen: [compress, noting(seen)])):
        seen = []
        tensor = values_to_send(rank, wire)
        layered = all_reduce
        for layer in layers(seen):
            layered = layer(layered)
        layered(tensor).wait()
        outcome[order] = {"seen": seen, "result": tensor}
    return outcome


def every_case(rank, world_size):
    """In one rank: every case of this module, for each wire dtype."""
    return {wire: {"once": sum_once(rank, wire), "failing": fail_inside(wire),
                   "layers": with_another_layer(rank, wire)} for wire in WIRES}


@launch_once
def launch(world_size):
    """Each rank's outcomes at `world_size` ranks: one launch for every case."""
    return run_in_processes(world_size, every_case)


def exact_sum(per_rank, wire):
    """The sum of what the ranks sent, exact in float64, and the bound on a wire sum's error."""
    sent = torch.stack([outcome[wire]["once"]["sent"].double() for outcome in per_rank])
    # Each of the n terms is rounded to the wire once (relative error at most 2^-p), and so is
    # each of the n-1 partial sums, in whatever order the library adds: the error is at most
    # n * 2^-p * the sum of the terms' magnitudes, element by element (to first order in 2^-p).
    unit = 2.0 ** -PRECISION_BITS[wire]
    bound = len(per_rank) * unit * sent.abs().sum(dim=0) * (1 + 4 * unit)
    return sent.sum(dim=0), bound


CASES = [(world_size, wire) for world_size in (2, 3) for wire in WIRES]


def case_id(case):
    world_size, wire = case
    return f"{wire}-{world_size}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_sum_lands_in_the_callers_float32_tensor_and_the_future_completes_with_it(case):
    world_size, wire = case
    for rank, outcome in enumerate(launch(world_size)):
        once = outcome[wire]["once"]
        # the caller's own tensor, still float32, is what the future gives back
        assert once["returned_the_tensor"], f"rank {rank}: the future gave another object"
        assert once["dtype"] == "torch.float32", f"rank {rank}: the tensor became {once['dtype']}"
        assert once["done"], f"rank {rank}: the future is not done after wait()"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_sum_is_within_the_wire_precision_of_the_exact_sum_and_was_rounded(case):
    world_size, wire = case
    per_rank = launch(world_size)
    exact, bound = exact_sum(per_rank, wire)
    for rank, outcome in enumerate(per_rank):
        result = outcome[wire]["once"]["result"].double()
        error = (result - exact).abs()
        worst = int((error - bound).argmax())
        # every element within the wire's precision of the exact sum
        assert (error <= bound).all(), (f"rank {rank}, element {worst}: {result[worst].item()} "
                                        f"where the exact sum is {exact[worst].item()}")
        # and something was rounded: a float32 all-reduce gives this exact sum to the bit
        assert not torch.equal(result, exact), f"rank {rank}: the exact sum: sent in float32?"
        # every rank holds the same sum
        assert torch.equal(result, per_rank[0][wire]["once"]["result"].double()), f"rank {rank}"


@pytest.mark.parametrize("wire", WIRES)
def test_an_error_of_the_inner_all_reduce_is_raised_where_the_future_is_waited_for(wire):
    for rank, outcome in enumerate(launch(2)):
        failing = outcome[wire]["failing"]
        # the layer returns at once: it does not wait for the all-reduce it started
        assert "raised_at_the_call" not in failing, \
            f"rank {rank}: the layer waited for the all-reduce inside the call"
        assert failing["pending"], f"rank {rank}: the future completed before the all-reduce"
        # the all-reduce's own error reaches whoever waits for the layer's future
        assert "the inner all-reduce failed" in failing.get("raised_at_the_wait", ""), \
            f"rank {rank}: waiting raised {failing.get('raised_at_the_wait')!r}"


@pytest.mark.parametrize("wire", WIRES)
def test_the_layer_composes_with_another_layer_and_passes_the_name_inward(wire):
    per_rank = launch(2)
    exact, bound = exact_sum(per_rank, wire)
    for rank, outcome in enumerate(per_rank):
        layers = outcome[wire]["layers"]
        # inside compression a layer sees the wire's tensor, outside it the caller's; both the name
        assert layers["noting inside"]["seen"] == [(WIRES[wire], LENGTH)]
        assert layers["noting outside"]["seen"] == [("float32", LENGTH)]
        for order, composed in layers.items():
            error = (composed["result"].double() - exact).abs()
            assert (error <= bound).all(), f"rank {rank}, {order}: not the sum"
