"""The --mode values behind one interface, so one training loop serves them all.

Each wraps the model in a module with `forward`, `no_sync()` and
`finish_gradient_synchronization()`:
  single       one process, nothing to synchronise: the baseline
  ddp          torch's DistributedDataParallel, timed through a communication hook
  ddp-no-sync  DDP with every backward inside no_sync(): each rank keeps its own gradients, so the
               ranks drift apart. A benchmark, not training: the same processes with no communication,
               the compute baseline that tells contention for the cores from communication
  manual       `manual_allreduce.ManualDDP`, the hand-written strategies
"""
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from manual_allreduce import DEFAULT_BUCKET_MB, WIRE_DTYPES, ManualDDP, flag_overflow


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

    def __init__(self, module, comm, bucket_mb=DEFAULT_BUCKET_MB, compress=None, device_ids=None):
        super().__init__(module, device_ids=device_ids, bucket_cap_mb=bucket_mb)
        self.wire_dtype = WIRE_DTYPES[compress]
        self.communicate = True
        self.overflowed = torch.zeros((), dtype=torch.bool, device=next(module.parameters()).device)
        self.register_comm_hook(comm, self.timed_average_hook)
        # The reducer's own timings every step (runtime_statistics). On CUDA this makes the reducer read its CUDA
        # events once per step (a host sync after backward): not yet measured on a GPU.
        self._set_ddp_runtime_logging_sample_rate(1)
        self.reducer_steps = []

    def timed_average_hook(self, comm, bucket):
        # As torch's allreduce_hook, or fp16/bf16_compress_hook with a wire dtype: divide, (cast,) sum, (cast back).
        buffer = bucket.buffer().div_(dist.get_world_size())
        if not self.communicate:  # calibration: DDP's whole backward, copies into and out of buckets, no all-reduce
            done = torch.futures.Future()
            done.set_result(buffer)
            return done
        wire = buffer if self.wire_dtype is None else buffer.to(self.wire_dtype)
        future = comm.track(f"bucket {bucket.index()}", lambda: dist.all_reduce(wire, async_op=True))
        return future.then(lambda done: self.write_back(done.value()[0], buffer))

    def write_back(self, wire, buffer):
        """The averaged bucket, in the bucket's own dtype; a float16 overflow is flagged on the device."""
        if wire is buffer:
            return buffer
        if wire.dtype == torch.float16:
            flag_overflow(self.overflowed, buffer, wire)
        return buffer.copy_(wire)

    def wire_overflowed(self):
        """Whether a gradient overflowed float16 on the wire since the last call (a host sync)."""
        overflowed = bool(self.overflowed)
        self.overflowed.zero_()
        return overflowed

    def finish_gradient_synchronization(self):
        pass  # DDP's backward already waited for every bucket before returning

    waits_inside_backward = True  # so the trainer calibrates backward without communication (timing.py)

    @contextmanager
    def without_communication(self):
        """Backward passes inside run every step of DDP's but the all-reduce (their gradients are not averaged)."""
        self.communicate = False
        try:
            yield
        finally:
            self.communicate = True

    def record_runtime_statistics(self):
        """After a training step's backward: the reducer's own timings of it (backward compute, communication,
        their overlap), kept per step so the run's means cover the same steps as the timer's (no warm-up, no
        calibration)."""
        self.logger.set_runtime_stats_and_log()  # DDP calls it at the next forward; here it is this step's
        logged = self._get_ddp_logging_data()
        self.reducer_steps.append([logged.get(f"backward_{key}_time", 0) / 1e9
                                   for key in ("compute", "comm", "compute_comm_overlap")])

    def runtime_statistics(self):
        """The means over the recorded steps, in seconds; exposed = communication - overlap, i.e. communication
        still running after the reducer's last gradient was ready."""
        count = max(1, len(self.reducer_steps))
        compute, comm, overlap = (sum(column) / count for column in zip(*self.reducer_steps or [[0, 0, 0]]))
        return {"steps": len(self.reducer_steps), "backward_compute_s": compute, "backward_comm_s": comm,
                "backward_overlap_s": overlap, "exposed_s": comm - overlap}


class TorchDDPNoSync(DistributedDataParallel):
    """DDP whose forward runs inside no_sync(), so no backward communicates: the compute baseline."""

    def forward(self, *args, **kwargs):
        with self.no_sync():
            return super().forward(*args, **kwargs)

    def finish_gradient_synchronization(self):
        pass


def wrap_model(model, mode, comm, sync="bucketed", bucket_mb=DEFAULT_BUCKET_MB, compress=None, device_ids=None):
    if mode == "single":
        return SingleProcess(model)
    if mode == "ddp":
        return TorchDDP(model, comm, bucket_mb, compress, device_ids)
    if mode == "ddp-no-sync":
        return TorchDDPNoSync(model, device_ids=device_ids, bucket_cap_mb=bucket_mb)
    return ManualDDP(model, sync, bucket_mb, compress, comm)
