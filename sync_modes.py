"""The three --mode values behind one interface, so one training loop serves them all.

Each wraps the model in a module with `forward`, `no_sync()` and
`finish_gradient_synchronization()`:
  single  one process, nothing to synchronise: the baseline
  ddp     torch's DistributedDataParallel, timed through a communication hook
  manual  `manual_allreduce.ManualDDP`, the hand-written strategies
"""
from contextlib import nullcontext

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from manual_allreduce import WIRE_DTYPES, ManualDDP


class SingleProcess(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def no_sync(self):
        return nullcontext()

    def finish_gradient_synchronization(self):
        pass


class TorchDDP(DistributedDataParallel):
    """torch's DDP; its hook does what the default hook does (average by all-reduce) and records each bucket's span."""

    def __init__(self, module, comm, bucket_mb=25.0, compress=None, device_ids=None):
        super().__init__(module, device_ids=device_ids, bucket_cap_mb=bucket_mb)
        self.wire_dtype = WIRE_DTYPES[compress]
        self.register_comm_hook(comm, self.timed_average_hook)

    def timed_average_hook(self, comm, bucket):
        # As torch's allreduce_hook, or fp16/bf16_compress_hook with a wire dtype: divide, (cast,) sum, (cast back).
        buffer = bucket.buffer().div_(dist.get_world_size())
        wire = buffer if self.wire_dtype is None else buffer.to(self.wire_dtype)
        future = comm.track(f"bucket {bucket.index()}", lambda: dist.all_reduce(wire, async_op=True))
        return future.then(lambda done: buffer.copy_(done.value()[0]) if wire is not buffer else done.value()[0])

    def finish_gradient_synchronization(self):
        pass  # DDP's backward already waited for every bucket before returning

    waits_inside_backward = True  # so the trainer calibrates backward without communication (timing.py)


def wrap_model(model, mode, comm, sync="per-param", bucket_mb=25.0, compress=None, device_ids=None):
    if mode == "single":
        return SingleProcess(model)
    if mode == "ddp":
        return TorchDDP(model, comm, bucket_mb, compress, device_ids)
    return ManualDDP(model, sync, bucket_mb, compress, comm)
