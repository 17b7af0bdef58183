"""The --mode values behind one interface, `WrappedModel` (runtime/wrapped_model.py), so one
training loop and one checkpoint format serve them all:
  single       one process, nothing to synchronise: the baseline
  ddp          torch's DistributedDataParallel, its buckets averaged by a communication hook that
               times each all-reduce, over --transport: DDP's own all-reduce (the library's) by
               default, or manual_collectives' ring or shared memory
  ddp-no-sync  DDP with every backward inside no_sync(): each rank keeps its own gradients, so the
               ranks drift apart. A benchmark, not training: the same processes with no
               communication, the compute baseline that tells contention for the cores from
               communication
  manual       `runtime.manual_ddp.ManualDDP`: the --sync strategy of manual_allreduce.py, over
               --transport
  sharded      runtime/sharded.py: manual_sharding.py's ZeRO-1, 2 or 3 (--shard), over --transport,
               which also builds the optimizer and gathers the model for checkpoints
What each --transport is, and what `auto` means in each mode: runtime/transports.py. Every
collective goes through the timing layer (timing.timed) and the record's
(collective_record.recorded), composed around it here. --compress is the lesson's compression
layer for mode manual and torch's fp16_compress_wrapper design for mode ddp: a reference mode runs
no code of the lesson's but the hand-written transport it is asked for.
"""
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from manual_allreduce import DEFAULT_BUCKET_MB, compressed
from runtime import transports
from runtime.collective_record import recorded
from runtime.dtypes import DTYPES
from runtime.manual_ddp import ManualDDP
from runtime.sharded import wrap_sharded
from runtime.timing import timed, watch_gradients
from runtime.wrapped_model import WrappedModel


@dataclass(frozen=True)
class SyncOptions:
    """How a run synchronises its gradients: the options of mlp_ddp.py that wrap_model reads."""
    mode: str = "manual"
    sync: str = "bucketed"  # mode manual: how gradients are grouped and when they are sent
    bucket_mb: float = DEFAULT_BUCKET_MB
    compress: str | None = None  # the wire dtype: None, "fp16" or "bf16"
    transport: str = "auto"  # what carries the bytes: "auto", "library", "ring" or "shm"
    shard: str = "parameters"  # mode sharded: "optimizer", "gradients" or "parameters" (ZeRO-1/2/3)
    compute_dtype: str = "fp32"  # --shard parameters: "fp32", "fp16" or "bf16"
    prefetch: bool = True  # --shard parameters: the next layer's gather started early

    @classmethod
    def from_args(cls, args):
        """The options of `args`; those that do not apply to its mode (None) take the defaults."""
        applying = {name: getattr(args, name)
                    for name in ("transport", "shard", "compute_dtype", "prefetch")
                    if getattr(args, name) is not None}
        return cls(args.mode, args.sync, args.bucket_mb, args.compress, **applying)

    @property
    def through_shared_memory(self):
        """Whether the gradients are summed through shared memory, which holds CPU tensors."""
        return self.transport == "shm"


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
            hook = compress_wrapper(hook, DTYPES[compress])
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


# what each --sync's messages are called in the trace, numbered in the order they are sent
MESSAGES = {"per-param": "param", "bucketed": "bucket"}


def wrap_model(model, options, recorder=None, device_ids=None, record=None):
    """`model` wrapped for `options.mode` (see above); `recorder` (a timing.CommRecorder), if
    given, records the collectives' spans and bytes and when each gradient was accumulated;
    `record` (a collective_record.Recorder), if given, keeps each collective for a hang's
    verdict (a ring's messages it sees at the launcher's interception instead)."""
    if options.mode == "single":  # no collective for the gradients' stamps to split
        return SingleProcess(model)
    if recorder:
        watch_gradients(model, recorder)
    if options.mode == "ddp-no-sync":
        return NoSyncDDP(model, device_ids=device_ids, bucket_cap_mb=options.bucket_mb)
    if options.mode == "sharded":
        return wrap_sharded(model, options.shard, options.bucket_mb, options.compute_dtype,
                            options.prefetch, options.transport, recorder, record=record)
    transport = transports.resolve(options.transport, options.mode)
    carrier = transports.TRANSPORTS[transport].carrier
    # a ring's messages are recorded by the launcher's interception, at the lesson's own lines
    recording = [partial(recorded, recorder=record, operation="all_reduce")
                 ] if record and carrier != "point-to-point" else []
    if options.mode == "ddp":
        collective = transports.TRANSPORTS[transport].make().all_reduce
        for layer in recording:
            collective = layer(collective)
        if recorder:  # DDP's buckets, in index order
            collective = timed(collective, recorder, message="bucket", transport=carrier)
        return HookedDDP(model, collective, options.bucket_mb, options.compress, device_ids)
    message = MESSAGES.get(options.sync, "flat")
    timing = [partial(timed, recorder=recorder, message=message, transport=carrier)
              ] if recorder else []
    return ManualDDP(model, options.sync, options.bucket_mb,
                     recording + timing + compression_layers(options.compress),
                     transport=transport)


def compression_layers(compress):
    """The lesson's compression layer for --compress `compress` (none without it)."""
    if not compress:
        return []
    return [partial(compressed, wire_dtype=DTYPES[compress])]
