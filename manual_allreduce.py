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
  4. bucketed     buckets all-reduced while backward is still running, so communication
                  overlaps the rest of backward (DDP's design)
  5. compression  a layer around any all-reduce: fp16 or bf16 on the wire, half the bytes
Every strategy has the same two methods: `grad_ready(param)`, called as each gradient becomes
final during backward, and `finish()`, called after backward, which leaves every rank the mean.
Each sums with `self.all_reduce(tensor)`, which it is given: the library's by default; the
runtime (runtime/manual_ddp.py) passes the one `--transport` names (the library's, or the ring or
shared memory of manual_collectives.py: read it after this file) with timing and compression
around it. runtime/manual_ddp.py also puts the strategies behind the interface of torch's DDP:
hooks, no_sync(), unused parameters and misuse. `--sync naive` runs `average_gradients` itself.
"""
import torch
import torch.distributed as dist
from torch import nn

DEFAULT_BUCKET_MB = 25.0  # as DDP's bucket_cap_mb
FIRST_BUCKET_MB = 1.0  # as DDP: a small first bucket, so the first all-reduce starts early


def average_gradients(model):
    """After backward, replace each parameter's gradient (every parameter has one) by its mean:
    sum it over the ranks with the library's all-reduce, then divide by their number."""
    # BEGIN SOLUTION Task 3: average_gradients
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad /= dist.get_world_size()
    # END SOLUTION


# --- 1. Start-up: every rank must begin from rank 0's parameters -------------------------------
def broadcast_parameters(module, src=0):
    """Copy rank `src`'s parameters and buffers to every rank, so differently seeded ranks agree:
    every tensor, in the same order on every rank, in place and without autograd."""
    # BEGIN SOLUTION Task 8: the start-up broadcast
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor, src)
    # END SOLUTION


# --- 2. The simplest strategy: one all-reduce per parameter ------------------------------------
def trainable_parameters(params):
    """The parameters a strategy synchronises: each that takes gradients, once (a tied parameter
    is one); frozen ones are left alone."""
    return list({id(param): param for param in params if param.requires_grad}.values())


def all_reduce(tensor):
    """Start summing `tensor` over the ranks in place with the library's all-reduce, without
    waiting: returns a future that completes once the sum is in `tensor` (and raises the
    collective's error where it is waited for)."""
    return dist.all_reduce(tensor, async_op=True).get_future()


class PerParameterSync:
    """After backward, one blocking all-reduce per gradient, as `average_gradients`: simple, one
    message per tensor. `all_reduce(tensor)` sums in place and returns a future, as the one
    above. Every strategy divides before the sum, as DDP's hooks do: float16 overflows less."""

    def __init__(self, params, all_reduce=all_reduce):
        self.params = params
        self.all_reduce = all_reduce

    def grad_ready(self, param):
        """A gradient is final: nothing to do until backward is over."""

    def finish(self):
        """After backward: divide each gradient by the world size, then sum it with
        self.all_reduce and wait."""
        # BEGIN SOLUTION Task 3: per-parameter sync
        for param in self.params:
            param.grad /= dist.get_world_size()
            self.all_reduce(param.grad).wait()
        # END SOLUTION


# --- 3. Flat: one message for all gradients ---------------------------------------------------
def flat_buffer(params):
    """An empty tensor with room for every element of `params`, end to end."""
    size = sum(param.numel() for param in params)
    return torch.empty(size, dtype=params[0].dtype, device=params[0].device)


def pack(grads, buffer):
    """Copy the gradient tensors end to end into the flat `buffer`."""
    torch.cat([grad.view(-1) for grad in grads], out=buffer)


def unpack(buffer, grads):
    """Copy the consecutive slices of the flat `buffer` back into the gradient tensors."""
    for grad, averaged in zip(grads, buffer.split([grad.numel() for grad in grads])):
        grad.copy_(averaged.view_as(grad))


class FlatSync(PerParameterSync):
    """After backward, every gradient packed into one contiguous buffer: one all-reduce."""

    def __init__(self, params, all_reduce=all_reduce):
        super().__init__(params, all_reduce)
        self.buffer = flat_buffer(params)

    def finish(self):
        """After backward: pack every gradient into self.buffer, average it likewise, unpack."""
        # BEGIN SOLUTION Task 4: flat sync
        grads = [param.grad for param in self.params]
        pack(grads, self.buffer)
        self.buffer /= dist.get_world_size()
        self.all_reduce(self.buffer).wait()
        unpack(self.buffer, grads)
        # END SOLUTION


# --- 4. Bucketed: sending while backward still runs (DDP's design) -----------------------------
def call_when_ready(params, callback):
    """Have autograd call `callback(param)` as soon as each parameter's gradient is final: a
    post-accumulate-grad hook runs once `param.grad` holds this backward's whole gradient (a
    shared parameter's uses summed), so it can be sent while backward goes on."""
    for param in params:
        param.register_post_accumulate_grad_hook(callback)


def bucket_layout(params, bucket_mb, first_bucket_mb=FIRST_BUCKET_MB):
    """`params` in groups of consecutive parameters, taken in reverse (gradients become ready
    roughly from the last layer back), each up to `bucket_mb` MiB and the first up to
    `first_bucket_mb`, as DDP's; a gradient larger than a bucket gets one of its own."""
    # BEGIN SOLUTION Task 5: the bucket layout
    groups = [[]]
    size = 0
    for param in reversed(params):
        nbytes = param.numel() * param.element_size()
        capacity = min(first_bucket_mb, bucket_mb) if len(groups) == 1 else bucket_mb
        if groups[-1] and size + nbytes > capacity * 2**20:
            groups.append([])
            size = 0
        groups[-1].append(param)
        size += nbytes
    return groups
    # END SOLUTION


class Bucket:
    """Consecutive gradients sent as one message, and the state of its all-reduce this step."""

    def __init__(self, params):
        self.params = params
        self.buffer = flat_buffer(params)
        self.ready = 0  # how many of its gradients this backward has finished
        self.summed = None  # while its all-reduce is in flight: the future of the sum


class BucketedSync(PerParameterSync):
    """DDP's design: buckets of gradients all-reduced asynchronously while backward runs. The
    caller reports each gradient with `grad_ready` (from autograd's hook: call_when_ready);
    `finish()` waits for the sums."""

    def __init__(self, params, all_reduce=all_reduce, bucket_mb=DEFAULT_BUCKET_MB):
        super().__init__(params, all_reduce)
        self.buckets = [Bucket(group) for group in bucket_layout(params, bucket_mb)]
        self.bucket_of = {param: bucket for bucket in self.buckets for param in bucket.params}
        self.next_to_start = 0

    def grad_ready(self, param):
        """Count `param`'s gradient in its bucket, then start each next bucket whose gradients
        are all ready: pack, divide, and start its all-reduce without waiting. Strictly in index
        order, so every rank issues the same collectives in the same order even where a hook
        fires early."""
        # BEGIN SOLUTION Task 5: the bucket hook
        self.bucket_of[param].ready += 1
        while self.next_to_start < len(self.buckets):
            bucket = self.buckets[self.next_to_start]
            if bucket.ready < len(bucket.params):
                return
            pack([param.grad for param in bucket.params], bucket.buffer)
            bucket.buffer /= dist.get_world_size()
            bucket.summed = self.all_reduce(bucket.buffer)
            self.next_to_start += 1
        # END SOLUTION

    def finish(self):
        """After backward, every gradient reported: wait for every bucket in order, unpack its
        average into the gradients, and reset the buckets for the next step."""
        # BEGIN SOLUTION Task 5: finishing the buckets
        for bucket in self.buckets:
            bucket.summed.wait()
            unpack(bucket.buffer, [param.grad for param in bucket.params])
            bucket.ready = 0
            bucket.summed = None
        self.next_to_start = 0
        # END SOLUTION


# --- 5. Compression: half the bytes on the wire ------------------------------------------------
def compressed(all_reduce, wire_dtype):
    """A layer: `all_reduce` of a copy in the 16-bit `wire_dtype`, the sum copied back into the
    tensor, as DDP's fp16_compress_hook and bf16_compress_hook do. float16 keeps 11 significant
    bits but overflows past 65504 (the trainer stops on an infinite gradient, or the loss scaler
    skips the step); bfloat16 keeps 8, with float32's range."""

    def all_reduce_compressed(tensor):
        # BEGIN SOLUTION Task 7: compression
        wire = tensor.to(wire_dtype)

        def copy_back(summed):
            summed.value()  # raises the all-reduce's error again, if it failed
            tensor.copy_(wire)
            return tensor

        return all_reduce(wire).then(copy_back)
        # END SOLUTION

    return all_reduce_compressed


# --- Blocking collectives: the ring and shared memory of manual_collectives.py, sharding's ring ---
def completed(tensor):
    """A future that is already complete: what a collective that blocks until done returns."""
    done = torch.futures.Future()
    done.set_result(tensor)
    return done


class NaiveSync(PerParameterSync):
    """`average_gradients` behind the strategies' interface, so that the trainer runs the first
    version (`--sync naive`). It calls the library's all-reduce itself: no transport, timing or
    compression layer reaches it."""

    def __init__(self, params, all_reduce=all_reduce):
        super().__init__(params, all_reduce)
        self.model = nn.ParameterList(params)  # what average_gradients takes: a .parameters()

    def finish(self):
        """After backward: average_gradients."""
        average_gradients(self.model)


# --sync, in the order built here; what sums (--transport) is the all-reduce each is given
STRATEGIES = {"naive": NaiveSync, "per-param": PerParameterSync, "flat": FlatSync,
              "bucketed": BucketedSync}
