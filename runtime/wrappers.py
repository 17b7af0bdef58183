"""The --mode values behind one interface, `WrappedModel`, so one training loop and one
checkpoint format serve them all:
  single       one process, nothing to synchronise: the baseline
  ddp          torch's DistributedDataParallel, its buckets averaged by a communication hook that
               times each all-reduce; with --comm-hook shm summed by manual_collectives'
               shared-memory all-reduce instead of gloo's
  ddp-no-sync  DDP with every backward inside no_sync(): each rank keeps its own gradients, so the
               ranks drift apart. A benchmark, not training: the same processes with no
               communication, the compute baseline that tells contention for the cores from
               communication
  manual       `runtime.manual_ddp.ManualDDP`, the hand-written strategies of manual_allreduce.py
  sharded      runtime/sharded.py: manual_sharding.py's ZeRO-1, 2 or 3 (--shard), which also builds
               the optimizer and gathers the model for checkpoints
Every collective goes through the timing layer (timing.timed) and the record's
(collective_record.recorded), composed around it here. --compress is the lesson's
compression layer for mode manual and torch's fp16_compress_wrapper design for mode ddp: a
reference mode runs no code of the lesson's but the shared-memory transport it is asked for.
"""
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from manual_allreduce import DEFAULT_BUCKET_MB, completed
from runtime.collective_record import recorded
from runtime.timing import timed, watch_gradients

WIRE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}  # --compress
PER_PARAMETER = "tensors per parameter (--mode single, ddp or manual)"  # a torch optimizer's


class WrappedModel:
    """What the training loop and the checkpoints expect of a wrapped model, with the defaults of
    a whole model on every rank (`self.module`, optimized by a torch optimizer). Every --mode
    wrapper derives from it; the sharded ones override what sharding changes."""

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def no_sync(self):
        """A context whose backward passes only accumulate local gradients."""
        return nullcontext()

    def finish_gradient_synchronization(self):
        """After backward, before the optimizer step: every gradient averaged over the ranks."""

    def make_optimizer(self, optimizer_class, **options):
        """The optimizer over what this rank steps."""
        return optimizer_class(self.module.parameters(), **options)

    def full_state_dict(self):
        """The whole model's state_dict, unwrapped (no `module.` prefix); a collective where the
        model is sharded: every rank calls it."""
        return self.module.state_dict()

    def load_full_state_dict(self, state):
        """Take a full_state_dict()."""
        self.module.load_state_dict(state)

    def optimizer_state_dict(self, optimizer):
        """`optimizer`'s whole state (a collective where it is sharded)."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer, state):
        """Take an optimizer_state_dict() (each rank its shard, where it is sharded)."""
        optimizer.load_state_dict(state)

    def optimizer_layout(self):
        """How the optimizer's state is laid out: a checkpoint resumes only into the same."""
        return PER_PARAMETER

    def held_during_step(self):
        """(parameters, gradients): model state held only during part of a step, beyond the
        module's parameters and their .grad (runtime/memory.py counts its high-water mark)."""
        return [], []

    @contextmanager
    def replicated(self):
        """The (name, tensor) pairs every rank holds alike after a step, for the check that the
        ranks have not drifted apart (guards.check_in_sync); a collective where it gathers."""
        yield list(self.module.named_parameters())


@dataclass(frozen=True)
class SyncOptions:
    """How a run synchronises its gradients: the options of mlp_ddp.py that wrap_model reads."""
    mode: str = "manual"
    sync: str = "bucketed"  # the hand-written strategy of mode manual
    bucket_mb: float = DEFAULT_BUCKET_MB
    compress: str | None = None  # the wire dtype: None, "fp16" or "bf16"
    comm_hook: str = "none"  # how mode ddp sums its buckets: "none" (gloo/NCCL) or "shm"
    shard: str = "parameters"  # mode sharded: "optimizer", "gradients" or "parameters" (ZeRO-1/2/3)
    compute_dtype: str = "fp32"  # --shard parameters: "fp32", "fp16" or "bf16"
    prefetch: bool = True  # --shard parameters: the next layer's gather started early
    collectives: str = "auto"  # mode sharded: "library" (gloo/NCCL), "ring", "shm" or "auto"

    @classmethod
    def from_args(cls, args):
        """The options of `args`; those that do not apply to its mode (None) take the defaults."""
        sharding = {name: getattr(args, name)
                    for name in ("shard", "compute_dtype", "prefetch", "collectives")
                    if getattr(args, name) is not None}
        return cls(args.mode, args.sync, args.bucket_mb, args.compress, args.comm_hook,
                   **sharding)

    @property
    def through_shared_memory(self):
        """Whether the gradients are summed through shared memory, which holds CPU tensors."""
        return ((self.mode == "manual" and self.sync == "shm")
                or (self.mode == "ddp" and self.comm_hook == "shm")
                or (self.mode == "sharded" and self.collectives == "shm"))


class SingleProcess(WrappedModel, nn.Module):
    """The model alone: one process has nothing to synchronise."""

    def __init__(self, module):
        super().__init__()
        self.module = module


class HookedDDP(DistributedDataParallel, WrappedModel):
    """torch's DDP, its buckets averaged by `all_reduce` (a tensor in, a future out, with the
    timing layer around it) from a communication hook that does what DDP's default does: divide,
    then sum. So DDP's all-reduces are timed, and their bytes logged, as every other
    mode's."""

    def __init__(self, module, all_reduce, bucket_mb=DEFAULT_BUCKET_MB, compress=None,
                 device_ids=None):
        super().__init__(module, device_ids=device_ids, bucket_cap_mb=bucket_mb)
        self.all_reduce = all_reduce
        hook = self.average_bucket
        if compress:
            hook = compress_wrapper(hook, WIRE_DTYPES[compress])
        self.register_comm_hook(None, hook)

    def average_bucket(self, state, bucket):
        """As torch's allreduce_hook: the bucket divided by the world size, then summed."""
        buffer = bucket.buffer().div_(dist.get_world_size())

        def averaged(summed):
            summed.value()  # raises the all-reduce's error again, if it failed
            return buffer

        return self.all_reduce(buffer).then(averaged)


def compress_wrapper(hook, wire_dtype):
    """torch's fp16_compress_wrapper for any 16-bit `wire_dtype` (its bf16 one needs NCCL): the
    bucket cast to the wire dtype, `hook` run on it, the sum cast back."""
    def compressed_hook(state, bucket):
        bucket.set_buffer(bucket.buffer().to(wire_dtype))
        summed = hook(state, bucket)

        def decompress(done):
            decompressed = bucket.buffer()
            decompressed.copy_(done.value())
            return decompressed

        return summed.then(decompress)

    return compressed_hook


class NoSyncDDP(DistributedDataParallel, WrappedModel):
    """DDP whose every forward runs inside no_sync(), so no backward communicates: the same
    processes and the same backward without communication, the compute baseline."""

    def forward(self, *args, **kwargs):
        with self.no_sync():
            return super().forward(*args, **kwargs)

    @contextmanager
    def replicated(self):
        yield []  # the ranks drift apart by design


def shared_memory_all_reduce(slot_bytes=None):
    """An all-reduce through manual_collectives' shared memory (blocking: its future is complete
    when it returns), and the SharedMemoryAllReduce behind it. A collective: every rank calls it."""
    from manual_collectives import SLOT_BYTES, SharedMemoryAllReduce  # the lesson's transport

    shared = SharedMemoryAllReduce(slot_bytes=max(SLOT_BYTES, slot_bytes or 0))

    def all_reduce_shared(tensor):
        shared.all_reduce(tensor)
        return completed(tensor)

    return all_reduce_shared, shared


def library_all_reduce(tensor):
    """The library's all-reduce, started without waiting: manual_allreduce.all_reduce, written
    again so that the reference modes run none of the code they are compared with."""
    return dist.all_reduce(tensor, async_op=True).get_future()


def all_reduce_by_ring(tensor):
    """manual_collectives' ring all-reduce; blocking, so the future returned is complete."""
    from manual_collectives import ring_all_reduce

    return completed(ring_all_reduce(tensor))


# what each --sync's messages are called in the trace, numbered in the order they are sent
MESSAGES = {"per-param": "param", "bucketed": "bucket"}
TRANSPORTS = {"ring": "point-to-point", "shm": "shared-memory"}  # --sync's; the others: library


def wrap_model(model, options, recorder=None, device_ids=None, record=None):
    """`model` wrapped for `options.mode` (see above); `recorder` (a timing.CommRecorder), if
    given, records the collectives' spans and bytes and when each gradient was accumulated;
    `record` (a collective_record.Recorder), if given, keeps each collective for a hang's
    verdict (a ring's messages it sees at the launcher's interception instead)."""
    if recorder:
        watch_gradients(model, recorder)
    if options.mode == "single":
        return SingleProcess(model)
    if options.mode == "ddp-no-sync":
        return NoSyncDDP(model, device_ids=device_ids, bucket_cap_mb=options.bucket_mb)
    if options.mode == "ddp":
        shm = options.comm_hook == "shm"
        collective = shared_memory_all_reduce()[0] if shm else library_all_reduce
        if record:
            collective = recorded(collective, record, "all_reduce")
        if recorder:
            # DDP's buckets, in index order
            collective = timed(collective, recorder, message="bucket",
                               transport="shared-memory" if shm else "library")
        return HookedDDP(model, collective, options.bucket_mb, options.compress, device_ids)
    if options.mode == "sharded":
        from runtime.sharded import wrap_sharded  # the lesson's code runs only here, and in manual

        return wrap_sharded(model, options.shard, options.bucket_mb, options.compute_dtype,
                            options.prefetch, options.collectives, recorder, record=record)
    from runtime.manual_ddp import ManualDDP  # the lesson's code: see the module's docstring

    message = MESSAGES.get(options.sync, "flat")
    transport = TRANSPORTS.get(options.sync, "library")
    recording = [partial(recorded, recorder=record, operation="all_reduce")
                 ] if record and transport != "point-to-point" else []
    timing = [partial(timed, recorder=recorder, message=message, transport=transport)
              ] if recorder else []
    return ManualDDP(model, options.sync, options.bucket_mb,
                     recording + timing + compression_layers(options.compress))


def compression_layers(compress):
    """The lesson's compression layer for --compress `compress` (none without it)."""
    if not compress:
        return []
    from manual_allreduce import compressed

    return [partial(compressed, wire_dtype=WIRE_DTYPES[compress])]
