"""Gradient synchronisation written by hand: what DistributedDataParallel does, step by step.

Data parallelism keeps one copy of the model per process (rank). Each rank runs forward and
backward on its own slice of the global batch, so each ends backward with different
gradients. Before the optimizer step every rank replaces its gradients with the average over
all ranks; since every rank started from the same parameters and applies the same averaged
gradients, the copies stay identical, and the step equals one step on the whole global batch.

This file gets there in four ways, from the simplest to what DDP really does:
  per-param  after backward, one all-reduce per gradient tensor: many small messages
  flat       after backward, all gradients copied into one buffer: one large message
  bucketed   buckets all-reduced from autograd hooks while backward is still running,
             so communication overlaps the rest of backward (DDP's design)
  ring       the flat buffer reduced by `ring_all_reduce`, an all-reduce built from
             point-to-point sends and receives instead of the library's collective
Every strategy can send gradients as fp16 or bf16 (`compress`), halving the bytes on the
wire, as DDP's fp16/bf16 compression hooks do.

`ManualDDP` wraps a module with the surface of torch's DDP; the training loop cannot tell
them apart. Read top to bottom: start-up, the ring, the strategies, the wrapper.
"""
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves

from runtime.timing import CommRecorder

STRATEGIES = ("per-param", "flat", "bucketed", "ring")  # --sync, in the order this file builds them
DEFAULT_BUCKET_MB = 25.0  # as DDP's bucket_cap_mb
FIRST_BUCKET_MB = 1.0  # as DDP: a small first bucket, so the first all-reduce starts early in backward
WIRE_DTYPES = {None: None, "none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


# --- 1. Start-up: every rank must begin from rank 0's parameters -----------------------------

def broadcast_parameters(module, src=0):
    """Copy rank `src`'s parameters and buffers to every rank, so differently seeded ranks agree."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor, src)


def trainable_parameters(module):
    """The parameters to synchronise: `parameters()` lists a tied (shared) one once; frozen ones are left alone."""
    return [p for p in module.parameters() if p.requires_grad]


# --- 2. An all-reduce from point-to-point messages -------------------------------------------

def ring_all_reduce(tensor):
    """Sum `tensor` over all ranks in place, with sends and receives around a ring.

    The buffer is cut into n chunks (n = world size; lengths differ by at most one, and may
    be zero). Reduce-scatter: in each of n-1 steps every rank sends one chunk to its right
    neighbour and adds the chunk arriving from its left, so after n-1 steps rank r holds
    the complete sum of chunk (r+1) mod n. All-gather: n-1 more steps pass the finished
    chunks around the ring. Each rank sends 2(n-1)/n of the buffer in all, whatever n is:
    the bandwidth-optimal all-reduce (Patarasuk & Yuan 2009).
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1 or tensor.numel() == 0:
        return tensor
    flat = tensor.view(-1)
    bounds = [flat.numel() * i // world for i in range(world + 1)]
    chunks = [flat[bounds[i]:bounds[i + 1]] for i in range(world)]
    right, left = (rank + 1) % world, (rank - 1) % world
    incoming = receive_buffer(chunks[-1])  # the last chunk is the longest

    for step in range(world - 1):  # reduce-scatter
        send, receive = chunks[(rank - step) % world], chunks[(rank - step - 1) % world]
        _exchange(send, right, incoming[:receive.numel()], left)
        receive.add_(incoming[:receive.numel()])
    for step in range(world - 1):  # all-gather
        send, receive = chunks[(rank + 1 - step) % world], chunks[(rank - step) % world]
        _exchange(send, right, receive, left)
    return tensor


_receive_buffers = {}


def receive_buffer(like):
    """A scratch tensor the size of `like`, kept between calls: allocating tens of MiB afresh for every
    all-reduce costs page faults each time (measured: 0.71x gloo's bus bandwidth at 64 MiB, 1.12x without)."""
    key = (like.dtype, like.device)
    if key not in _receive_buffers or _receive_buffers[key].numel() < like.numel():
        _receive_buffers[key] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
    return _receive_buffers[key][:like.numel()]


def _exchange(send, right, receive, left):
    """Send to the right while receiving from the left; posting the send first keeps the ring from deadlocking."""
    request = dist.isend(send, right) if send.numel() else None  # both ends know a chunk is empty
    if receive.numel():
        dist.recv(receive, left)
    if request is not None:
        request.wait()


# --- 3. The strategies ------------------------------------------------------------------------

class GradientSync:
    """What every strategy shares: the parameters, the world size, compression and timing."""

    def __init__(self, params, compress=None, comm=None):
        self.params = params
        self.world_size = dist.get_world_size()
        self.wire_dtype = WIRE_DTYPES[compress]
        self.comm = comm or CommRecorder()
        self.overflowed = torch.zeros((), dtype=torch.bool, device=params[0].device)  # fp16 only, see wait()
        self.zero_filled = set()

    def grad_ready(self, param):
        """Called by autograd the moment `param.grad` is final for this backward."""

    def skip_unused(self, params):
        """Called after forward with the parameters no backward will reach; they contribute zeros. Strategies that
        work after backward pack those zeros then; only the bucketed one must count them as ready early."""

    def finish(self):
        """Called after backward: on return every gradient holds the average over ranks."""
        raise NotImplementedError

    def gradients(self, params):
        """The gradients of `params`; a parameter without one contributes zeros (remembered in `zero_filled`), so
        every rank sends the same tensors."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
                self.zero_filled.add(p)
        return [p.grad for p in params]

    def start_average(self, buffer, name):
        """Launch the averaging all-reduce of `buffer`; returns a function that waits and writes the result back.

        Dividing before the sum, as DDP's hooks do, keeps fp16 from overflowing.
        """
        wire = buffer.div_(self.world_size)
        if self.wire_dtype is not None:
            wire = buffer.to(self.wire_dtype)
        future = self.launch(wire, name)

        def wait():
            future.wait()
            if wire is not buffer:
                if wire.dtype == torch.float16:
                    flag_overflow(self.overflowed, buffer, wire)
                buffer.copy_(wire)
        return wait

    def launch(self, wire, name):
        """Start summing `wire` over ranks; the library's all-reduce, asynchronous."""
        return self.comm.track(name, lambda: dist.all_reduce(wire, async_op=True))


def flag_overflow(flag, sent, received):
    """Set `flag` (on the device: no host sync) where float16 made finite gradients infinite: past 65504 a cast
    or a sum becomes inf. Gradients already infinite before sending are divergence, which the trainer reports."""
    torch.logical_or(flag, torch.isfinite(sent).all() & ~torch.isfinite(received).all(), out=flag)


def copy_into(grads, buffer):
    """Write the consecutive slices of a flat `buffer` back into the gradient tensors."""
    for grad, averaged in zip(grads, buffer.split([g.numel() for g in grads])):
        grad.copy_(averaged.view_as(grad))


class PerParameterSync(GradientSync):
    """One blocking all-reduce per gradient after backward: simple, and one message per tensor."""

    def finish(self):
        for index, grad in enumerate(self.gradients(self.params)):
            self.start_average(grad, f"param {index}")()


class FlatSync(GradientSync):
    """Every gradient copied into one contiguous buffer, one all-reduce, copied back."""

    def __init__(self, params, compress=None, comm=None):
        super().__init__(params, compress, comm)
        self.buffer = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)

    def finish(self):
        grads = self.gradients(self.params)
        torch.cat([g.view(-1) for g in grads], out=self.buffer)
        self.start_average(self.buffer, "flat")()
        copy_into(grads, self.buffer)


class RingSync(FlatSync):
    """The flat buffer, summed by the hand-written `ring_all_reduce` instead of the library's."""

    def launch(self, wire, name):
        span = self.comm.launched("ring")
        ring_all_reduce(wire)  # blocking: the ring is done when it returns
        self.comm.completed(span)
        done = torch.futures.Future()
        done.set_result(wire)
        return done


class Bucket:
    def __init__(self, index, params):
        self.index, self.params = index, params
        self.buffer = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        self.ready = 0
        self.wait = None  # set when its all-reduce is launched


class BucketedSync(GradientSync):
    """DDP's design: buckets of gradients all-reduced asynchronously while backward still runs.

    Gradients become ready roughly in reverse registration order (the last layer's first), so
    buckets are filled in that order, each up to `bucket_mb` (the first up to 1 MiB, as DDP's). When a bucket's last gradient
    is ready its all-reduce is launched at once; buckets are launched strictly in index order,
    so every rank issues the same collectives in the same order even if a hook fires early.
    """

    def __init__(self, params, bucket_mb=DEFAULT_BUCKET_MB, compress=None, comm=None, first_bucket_mb=FIRST_BUCKET_MB):
        super().__init__(params, compress, comm)
        # As DDP: the first bucket is small (1 MiB), so the first all-reduce starts early in backward.
        capacity = min(first_bucket_mb, bucket_mb) * 2**20
        self.buckets, current, size = [], [], 0
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            if current and size + nbytes > capacity:
                self.buckets.append(Bucket(len(self.buckets), current))
                current, size, capacity = [], 0, bucket_mb * 2**20
            current.append(p)
            size += nbytes
        self.buckets.append(Bucket(len(self.buckets), current))
        self.bucket_of = {p: bucket for bucket in self.buckets for p in bucket.params}
        self.next_to_launch = 0
        self.launch_log = []  # this step's (bucket index, gradients ready when launched): the proof of overlap
        self.grads_ready = 0

    def grad_ready(self, param):
        if self.next_to_launch == 0 and self.grads_ready == 0:
            self.launch_log = []  # a new step's first gradient
        self.grads_ready += 1
        self.bucket_of[param].ready += 1
        self.launch_ready_buckets()

    def skip_unused(self, params):
        """Count parameters that no backward of this step will reach as ready (they send zeros), so their
        buckets launch as soon as their other gradients are in, as DDP's find_unused_parameters does."""
        for param in params:
            self.grad_ready(param)

    def launch_ready_buckets(self, force=False):
        while self.next_to_launch < len(self.buckets):
            bucket = self.buckets[self.next_to_launch]
            if not force and bucket.ready < len(bucket.params):
                return
            torch.cat([g.view(-1) for g in self.gradients(bucket.params)], out=bucket.buffer)
            bucket.wait = self.start_average(bucket.buffer, f"bucket {bucket.index}")
            self.launch_log.append((bucket.index, self.grads_ready))
            self.next_to_launch += 1

    def finish(self):
        self.launch_ready_buckets(force=True)  # buckets holding a gradient no hook reported
        for bucket in self.buckets:
            bucket.wait()
            copy_into([p.grad for p in bucket.params], bucket.buffer)
            bucket.ready, bucket.wait = 0, None
        self.next_to_launch = self.grads_ready = 0


def make_sync(strategy, params, bucket_mb=DEFAULT_BUCKET_MB, compress=None, comm=None):
    if strategy == "bucketed":
        return BucketedSync(params, bucket_mb, compress, comm)
    classes = {"per-param": PerParameterSync, "flat": FlatSync, "ring": RingSync}
    return classes[strategy](params, compress, comm)


# --- 4. A wrapper with DDP's surface ----------------------------------------------------------

def parameters_reached(output):
    """The leaf tensors a backward from `output` will reach: a walk of the autograd graph, as DDP does after
    forward with find_unused_parameters=True (a parameter not reached gets no gradient in this step)."""
    stack = [t.grad_fn for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen, reached = set(), set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # an AccumulateGrad node: it writes a leaf's .grad
            reached.add(node.variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return reached


class ManualDDP(nn.Module):
    """`ManualDDP(model, "bucketed")` where code says `DistributedDataParallel(model)`, with DDP's keyword
    arguments, defaults and semantics.

    The constructor broadcasts rank 0's parameters and buffers; with `broadcast_buffers` (the default)
    `forward` broadcasts rank 0's buffers again before each forward that follows a training forward, so
    BatchNorm statistics stay equal across ranks. `no_sync()` skips communication for gradient
    accumulation. The training loop calls `finish_gradient_synchronization()` after backward and before
    the optimizer step. As in DDP:
      - every backward outside no_sync() is averaged: a second forward and backward before finishing
        first completes the previous one, so both backwards' averaged gradients add up;
      - a gradient reported twice between two forwards is an error;
      - a parameter that gets no gradient is an error, unless `find_unused_parameters=True`: then each
        forward walks the autograd graph, unreached parameters send zeros at once (their buckets are not
        held back), and one parameter unused on every rank keeps `.grad is None`.
    """

    def __init__(self, module, strategy="bucketed", bucket_mb=DEFAULT_BUCKET_MB, compress=None, comm=None,
                 broadcast_buffers=True, find_unused_parameters=False):
        super().__init__()
        self.module = module
        broadcast_parameters(module)
        params = trainable_parameters(module)
        self.sync = make_sync(strategy, params, bucket_mb, compress, comm)
        self.names = {p: name for name, p in module.named_parameters()}
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_sync = True
        self.require_buffer_sync = True  # as DDP: the forward after a training forward broadcasts buffers
        self.ready = set()   # parameters whose gradient arrived since the last forward
        self.unused = set()  # parameters that forward's graph does not reach (find_unused_parameters)
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, param):
        if not self.require_sync:
            return
        if param in self.ready or param in self.unused:
            raise RuntimeError(f"Expected to mark a variable ready only once: parameter '{self.names[param]}' "
                               "got a second gradient in this backward (a second backward needs a new forward)")
        self.ready.add(param)
        self.sync.grad_ready(param)

    def forward(self, *args, **kwargs):
        syncing = torch.is_grad_enabled() and self.require_sync
        if syncing and (self.ready or self.unused):
            self._finish_backward()  # a second forward and backward before finishing: average the first now
        if self.broadcast_buffers and self.require_buffer_sync:
            with torch.no_grad():
                for buffer in self.module.buffers():
                    dist.broadcast(buffer, 0)
        output = self.module(*args, **kwargs)
        self.require_buffer_sync = syncing
        if syncing and self.find_unused_parameters:
            reached = parameters_reached(output)
            self.unused = {p for p in self.sync.params if p not in reached}
            self.sync.skip_unused([p for p in self.sync.params if p in self.unused])
        return output

    @contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate local gradients, as DDP's `no_sync()`."""
        self.require_sync = False
        try:
            yield
        finally:
            self.require_sync = True

    def finish_gradient_synchronization(self):
        if self.ready or self.unused:
            self._finish_backward()

    def wire_overflowed(self):
        """Whether a gradient overflowed float16 on the wire since the last call (a host sync: call it per step
        only where no loss scaler would catch the inf)."""
        overflowed = bool(self.sync.overflowed)
        self.sync.overflowed.zero_()
        return overflowed

    def _finish_backward(self):
        """Average the gradients of the backward(s) since the last forward; then the next backward starts afresh."""
        missing = [p for p in self.sync.params if p not in self.ready and p not in self.unused]
        if missing and not self.find_unused_parameters:
            names = ", ".join(self.names[p] for p in missing)
            raise RuntimeError(f"parameters that received no gradient in this step: {names}. If your model leaves "
                               "parameters unused in forward, pass find_unused_parameters=True to ManualDDP (as to "
                               "DistributedDataParallel)")
        unused_everywhere = self._unused_on_every_rank(missing) if self.find_unused_parameters else []
        self.sync.finish()
        for p in unused_everywhere:  # no rank computed a gradient for it: leave it None, so no optimizer moves it
            if p in self.sync.zero_filled:
                p.grad = None
        self.sync.zero_filled.clear()
        self.ready, self.unused = set(), set()

    def _unused_on_every_rank(self, missing):
        """The parameters no rank used in this step: a bitmap, one entry per parameter, summed over ranks."""
        locally_unused = set(missing) | self.unused
        used = torch.tensor([p not in locally_unused for p in self.sync.params], dtype=torch.int32,
                            device=self.sync.params[0].device)
        dist.all_reduce(used)
        return [p for p, count in zip(self.sync.params, used.tolist()) if count == 0]
