"""Gradient synchronisation written by hand: what DistributedDataParallel does, step by step.

Data parallelism keeps one copy of the model per process (rank); each rank runs forward and
backward on its own slice of the global batch, and so ends with its own gradients. Replacing
them by their average over the ranks before every optimizer step keeps the copies identical,
and makes the step equal one step on the whole global batch.

`average_gradients`, first below, is that idea as it is first written. The file then builds
up to what DDP really does, in this order:
  1. start-up     every rank begins from rank 0's parameters
  2. per-param    after backward, one all-reduce per gradient tensor: many small messages
  3. flat         after backward, all gradients copied into one buffer: one large message
  4. bucketed     buckets all-reduced from autograd hooks while backward is still running,
                  so communication overlaps the rest of backward (DDP's design)
  5. compression  any strategy can send fp16 or bf16 (`compress`): half the bytes on the wire
  6. ring         the collective itself replaced: the flat buffer summed by `ring_all_reduce`,
                  built from point-to-point sends and receives
  7. shm          the flat buffer summed through memory shared by the ranks of a host
Sections 6 and 7 are how the bytes move: their collectives are in manual_collectives.py, read
it after this file; here, only the strategies that use them. runtime/manual_ddp.py puts these
strategies behind the interface of torch's DDP.
"""
import torch
import torch.distributed as dist

from manual_collectives import SLOT_BYTES, SharedMemoryAllReduce, ring_all_reduce

STRATEGIES = ("per-param", "flat", "bucketed", "ring", "shm")  # --sync, in the order built here
DEFAULT_BUCKET_MB = 25.0  # as DDP's bucket_cap_mb
FIRST_BUCKET_MB = 1.0  # as DDP: a small first bucket, so the first all-reduce starts early
WIRE_DTYPES = {None: None, "none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def average_gradients(model):
    """After backward, replace every parameter's gradient (none may be missing) by its mean."""
    # BEGIN PROMPT
    # Sum each gradient over the ranks with the library's all-reduce, then divide by their number.
    # END PROMPT
    # BEGIN SOLUTION Task 3: average_gradients
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad /= dist.get_world_size()
    # END SOLUTION


# --- 1. Start-up: every rank must begin from rank 0's parameters -------------------------------
def broadcast_parameters(module, src=0):
    """Copy rank `src`'s parameters and buffers to every rank, so differently seeded ranks agree."""
    # BEGIN PROMPT
    # Every parameter and buffer, in the same order on every rank, in place and without autograd.
    # END PROMPT
    # BEGIN SOLUTION Task 3: the start-up broadcast
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor, src)
    # END SOLUTION


# --- 2. What every strategy shares, and the simplest: one all-reduce per parameter ------------
class NoRecorder:
    """Timing is optional: a strategy calls `started(name)` just before each collective and
    `finished(span)` once it is complete. This one keeps nothing; CommRecorder keeps the spans."""

    def started(self, name):
        return None

    def finished(self, span):
        pass


def start_all_reduce(tensor, name, recorder):
    """Start summing `tensor` over the ranks in place with the library's all-reduce, without
    waiting; returns a future that completes once the sum is in `tensor` and recorded."""
    span = recorder.started(name)  # before the call: a collective may do its work inside it
    work = dist.all_reduce(tensor, async_op=True)

    def record_end(done):
        recorder.finished(span)
        return done.value()  # raises the collective's error again, if it failed

    return work.get_future().then(record_end)


class GradientSync:
    """What every strategy shares: the parameters, the world size, compression and timing.
    Backward leaves each rank its own gradients; `finish()` after it leaves every rank the mean."""

    def __init__(self, params, compress=None, recorder=None):
        self.params = params
        self.world_size = dist.get_world_size()
        self.wire_dtype = WIRE_DTYPES[compress]  # section 5
        self.recorder = recorder or NoRecorder()
        self.overflowed = torch.zeros((), dtype=torch.bool, device=params[0].device)  # section 5
        self.zero_filled = set()  # parameters given a zero gradient to send in this step
        self.accumulating = False  # inside no_sync(): backward keeps its local gradients

    def gradients_or_zeros(self, params):
        """The gradients of `params`, zeros where a parameter has none (this rank did not use
        it), so that every rank sends the same tensors; `zero_filled` remembers which."""
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
                self.zero_filled.add(param)
        return [param.grad for param in params]

    def average(self, buffer, name):
        """Replace `buffer` by its average over the ranks; blocking."""
        # BEGIN PROMPT
        # Divide first (as DDP's hooks), put it on the wire (to_wire), sum it with self.all_reduce,
        # and bring the sum back into `buffer` (from_wire).
        # END PROMPT
        # BEGIN SOLUTION Task 3: averaging one buffer
        buffer.div_(self.world_size)  # before the sum, as DDP's hooks: float16 overflows less
        wire = to_wire(buffer, self.wire_dtype)
        self.all_reduce(wire, name)
        from_wire(wire, buffer, self.overflowed)
        # END SOLUTION

    def all_reduce(self, wire, name):
        """Sum `wire` over the ranks in place; blocking. Section 6 replaces it by the ring."""
        start_all_reduce(wire, name, self.recorder).wait()


class PerParameterSync(GradientSync):
    """After backward, one blocking all-reduce per gradient: simple, one message per tensor."""

    def finish(self):
        # BEGIN PROMPT
        # Average every gradient (gradients_or_zeros) on its own, named "param <index>".
        # END PROMPT
        # BEGIN SOLUTION Task 3: per-parameter sync
        for index, grad in enumerate(self.gradients_or_zeros(self.params)):
            self.average(grad, f"param {index}")
        # END SOLUTION


# --- 3. Flat: one message for all gradients ---------------------------------------------------
def flat_buffer(params):
    """An empty tensor with room for every element of `params`, end to end."""
    size = sum(param.numel() for param in params)
    return torch.empty(size, dtype=params[0].dtype, device=params[0].device)


def copy_into(grads, buffer):
    """Write the consecutive slices of a flat `buffer` back into the gradient tensors."""
    for grad, averaged in zip(grads, buffer.split([grad.numel() for grad in grads])):
        grad.copy_(averaged.view_as(grad))


class FlatSync(GradientSync):
    """After backward, every gradient copied into one contiguous buffer: one all-reduce."""

    def __init__(self, params, compress=None, recorder=None):
        super().__init__(params, compress, recorder)
        self.buffer = flat_buffer(params)

    def finish(self):
        # BEGIN PROMPT
        # Pack every gradient into self.buffer, average it as "flat", and unpack it (copy_into).
        # END PROMPT
        # BEGIN SOLUTION Task 3: flat sync
        grads = self.gradients_or_zeros(self.params)
        torch.cat([grad.view(-1) for grad in grads], out=self.buffer)
        self.average(self.buffer, "flat")
        copy_into(grads, self.buffer)
        # END SOLUTION


# --- 4. Bucketed: sending while backward still runs (DDP's design) -----------------------------
class Bucket:
    """Consecutive gradients sent as one message, and the state of its all-reduce this step."""

    def __init__(self, params):
        self.params = params
        self.buffer = flat_buffer(params)
        self.ready = 0  # how many of its gradients this backward has finished
        self.wire = None  # while its all-reduce is in flight: the tensor being summed,
        self.in_flight = None  # and the future that completes with the sum


class BucketedSync(GradientSync):
    """DDP's design: buckets of gradients all-reduced asynchronously while backward runs.
    Gradients become ready roughly in reverse registration order (the last layer's first), so
    buckets are filled in that order, each up to `bucket_mb` MiB (the first up to
    `first_bucket_mb`, as DDP's), and started as soon as full, strictly in index order: every
    rank issues the same collectives in the same order even where a hook fires early."""

    def __init__(self, params, bucket_mb=DEFAULT_BUCKET_MB, compress=None, recorder=None,
                 first_bucket_mb=FIRST_BUCKET_MB):
        super().__init__(params, compress, recorder)
        # BEGIN PROMPT
        # Lay out self.buckets (Bucket objects) as the docstring says, and self.bucket_of: the
        # bucket of each parameter.
        # END PROMPT
        # BEGIN SOLUTION Task 3: the bucket layout
        groups = [[]]
        size = 0
        for param in reversed(params):  # a gradient larger than a bucket gets one of its own
            nbytes = param.numel() * param.element_size()
            capacity = min(first_bucket_mb, bucket_mb) if len(groups) == 1 else bucket_mb
            if groups[-1] and size + nbytes > capacity * 2**20:
                groups.append([])
                size = 0
            groups[-1].append(param)
            size += nbytes
        self.buckets = [Bucket(group) for group in groups]
        self.bucket_of = {param: bucket for bucket in self.buckets for param in bucket.params}
        # END SOLUTION
        self.next_to_start = 0
        self.grads_ready = 0
        self.launch_log = []  # this step's (bucket, gradients ready at its start): the overlap
        # BEGIN PROMPT
        # Have autograd call self.grad_ready(param) as soon as each gradient is final.
        # END PROMPT
        # BEGIN SOLUTION Task 3: the bucket hooks
        # Autograd calls a post-accumulate-grad hook once `param.grad` holds this backward's whole
        # gradient (a shared parameter's uses summed): it can be sent while backward goes on.
        for param in params:
            param.register_post_accumulate_grad_hook(self.grad_ready)
        # END SOLUTION

    def grad_ready(self, param):
        """The hook (and ManualDDP's call for a parameter this step leaves unused, which sends
        zeros): count `param`'s gradient in its bucket, and start the buckets now complete."""
        # BEGIN PROMPT
        # Nothing inside no_sync(); a step's first gradient empties launch_log; count the gradient
        # and start what is complete.
        # END PROMPT
        # BEGIN SOLUTION Task 3: the bucket hook
        if self.accumulating:
            return
        if self.next_to_start == 0 and self.grads_ready == 0:
            self.launch_log = []  # a new step's first gradient
        self.grads_ready += 1
        self.bucket_of[param].ready += 1
        self.start_ready_buckets()
        # END SOLUTION

    def start_ready_buckets(self, force=False):
        """Start the all-reduce of each next bucket whose gradients are all ready, in index
        order; with `force`, of every bucket not yet started."""
        # BEGIN PROMPT
        # Pack a bucket's gradients, divide, put them on the wire, start_all_reduce it as
        # "bucket <index>" without waiting, and log (index, gradients ready) in launch_log.
        # END PROMPT
        # BEGIN SOLUTION Task 3: starting the buckets
        while self.next_to_start < len(self.buckets):
            bucket = self.buckets[self.next_to_start]
            if not force and bucket.ready < len(bucket.params):
                return
            grads = self.gradients_or_zeros(bucket.params)
            torch.cat([grad.view(-1) for grad in grads], out=bucket.buffer)
            bucket.buffer.div_(self.world_size)  # as in `average`
            bucket.wire = to_wire(bucket.buffer, self.wire_dtype)
            name = f"bucket {self.next_to_start}"
            bucket.in_flight = start_all_reduce(bucket.wire, name, self.recorder)
            self.launch_log.append((self.next_to_start, self.grads_ready))
            self.next_to_start += 1
        # END SOLUTION

    def finish(self):
        # BEGIN PROMPT
        # Start what is left, wait for every bucket in order, unpack its average into the
        # gradients, and reset the buckets and counters for the next step.
        # END PROMPT
        # BEGIN SOLUTION Task 3: finishing the buckets
        self.start_ready_buckets(force=True)  # buckets holding a gradient no hook reported
        for bucket in self.buckets:
            bucket.in_flight.wait()
            from_wire(bucket.wire, bucket.buffer, self.overflowed)
            copy_into([param.grad for param in bucket.params], bucket.buffer)
            bucket.ready = 0
            bucket.wire = None
            bucket.in_flight = None
        self.next_to_start = 0
        self.grads_ready = 0
        # END SOLUTION


# --- 5. Compression: half the bytes on the wire ------------------------------------------------
def to_wire(buffer, wire_dtype):
    """What goes on the wire: `buffer` itself, or a copy in a 16-bit `wire_dtype`, as DDP's
    fp16_compress_hook and bf16_compress_hook do (divide, cast, sum, cast back). float16 keeps
    11 significant bits but overflows past 65504; bfloat16 keeps 8, with float32's range."""
    if wire_dtype is None:
        return buffer
    # BEGIN PROMPT
    # A copy of `buffer` in the 16-bit type.
    # END PROMPT
    # BEGIN SOLUTION Task 3: compression
    return buffer.to(wire_dtype)
    # END SOLUTION


def from_wire(wire, buffer, overflowed):
    """Write the summed `wire` back into `buffer`. Where float16 made finite gradients infinite,
    set `overflowed` (a tensor on the device: no host sync per step); gradients that were
    infinite before sending are divergence instead, which the trainer reports."""
    if wire is buffer:
        return
    # BEGIN PROMPT
    # Flag float16 overflow in `overflowed` as the docstring says, then copy `wire` into `buffer`.
    # END PROMPT
    # BEGIN SOLUTION Task 3: decompression
    if wire.dtype == torch.float16:
        became_infinite = torch.isfinite(buffer).all() & ~torch.isfinite(wire).all()
        torch.logical_or(overflowed, became_infinite, out=overflowed)
    buffer.copy_(wire)
    # END SOLUTION


# --- 6. Replacing the collective itself: the ring (manual_collectives.py) ---------------------
class RingSync(FlatSync):
    """The flat buffer, summed by `ring_all_reduce` instead of the library's all-reduce."""

    def all_reduce(self, wire, name):
        """Sum `wire` around the ring; it returns when done, so its end is recorded then."""
        span = self.recorder.started("ring")
        ring_all_reduce(wire)
        self.recorder.finished(span)


# --- 7. Within one host: shared memory instead of sockets (manual_collectives.py) -------------
class SharedMemorySync(FlatSync):
    """The flat buffer, summed through a segment of memory shared by the ranks of each host:
    no bytes through loopback TCP (between hosts, through the library)."""

    def __init__(self, params, compress=None, recorder=None):
        super().__init__(params, compress, recorder)
        if self.buffer.device.type != "cpu":
            raise ValueError("--sync shm sums CPU tensors; on GPUs use NCCL (--backend nccl with "
                             "another strategy)")
        buffer_bytes = self.buffer.numel() * self.buffer.element_size()
        # a collective: every rank builds it at once, with a slot that holds the whole buffer
        self.shared = SharedMemoryAllReduce(slot_bytes=max(SLOT_BYTES, -(-buffer_bytes // 64) * 64))
        # the buffer kept in this rank's slot: packing the gradients is writing the slot
        self.buffer = self.shared.own_slot(self.buffer.dtype, self.buffer.numel())

    def all_reduce(self, wire, name):
        """Sum `wire` through shared memory; blocking, so its end is recorded on return."""
        span = self.recorder.started("shm")
        self.shared.all_reduce(wire)
        self.recorder.finished(span)
