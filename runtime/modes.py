"""The --mode values behind one interface, so one training loop serves them all.

Each wraps the model in a module with `forward`, `no_sync()` and
`finish_gradient_synchronization()`:
  single       one process, nothing to synchronise: the baseline
  ddp          torch's DistributedDataParallel, timed through a communication hook; with
               --comm-hook shm its buckets are summed by manual_collectives' shared-memory
               all-reduce instead of gloo's
  ddp-no-sync  DDP with every backward inside no_sync(): each rank keeps its own gradients, so the
               ranks drift apart. A benchmark, not training: the same processes with no
               communication, the compute baseline that tells contention for the cores from
               communication
  manual       `runtime.manual_ddp.ManualDDP`, the hand-written strategies of manual_allreduce.py
"""
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from manual_allreduce import DEFAULT_BUCKET_MB, WIRE_DTYPES, from_wire, start_all_reduce, to_wire
from manual_collectives import SharedMemoryAllReduce
from runtime.manual_ddp import ManualDDP

REDUCER_TIMES = ("compute", "comm", "compute_comm_overlap")  # DDP's backward_<name>_time fields


class SingleProcess(nn.Module):
    """The model alone, with the wrappers' interface: one process has nothing to synchronise."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def no_sync(self):
        """Nothing to skip: a context that does nothing."""
        return nullcontext()

    def finish_gradient_synchronization(self):
        """Nothing to wait for."""


def start_shared_memory_all_reduce(shared, tensor, name, recorder):
    """As start_all_reduce, through `shared` (a SharedMemoryAllReduce). The bytes move in this
    thread, so the sum is done, and its span recorded, when the (completed) future returns."""
    span = recorder.started(name)
    shared.all_reduce(tensor)
    recorder.finished(span)
    done = torch.futures.Future()
    done.set_result([tensor])
    return done


class TimedDDP(DistributedDataParallel):
    """torch's DDP; its hook does what the default hook does (average by all-reduce) and records
    each bucket's span. With comm_hook="shm" the all-reduce goes through shared memory: blocking
    inside backward, where gloo's runs on its own thread, and timed by the same calibration."""

    waits_inside_backward = True  # so the trainer calibrates backward without communication

    def __init__(self, module, recorder, bucket_mb=DEFAULT_BUCKET_MB, compress=None,
                 device_ids=None, comm_hook="none"):
        super().__init__(module, device_ids=device_ids, bucket_cap_mb=bucket_mb)
        self.shared = SharedMemoryAllReduce() if comm_hook == "shm" else None
        self.wire_dtype = WIRE_DTYPES[compress]
        self.communicate = True
        self.overflowed = torch.zeros((), dtype=torch.bool, device=next(module.parameters()).device)
        self.register_comm_hook(recorder, self.timed_average_hook)
        # The reducer's own timings every step (runtime_statistics). On CUDA this makes the
        # reducer read its CUDA events once per step (a host sync after backward): not yet
        # measured on a GPU.
        self._set_ddp_runtime_logging_sample_rate(1)
        self.reducer_steps = []

    def timed_average_hook(self, recorder, bucket):
        """As torch's allreduce_hook, or fp16/bf16_compress_hook with a wire dtype: divide,
        (cast,) sum, (cast back); the all-reduce's span goes to `recorder`."""
        buffer = bucket.buffer().div_(dist.get_world_size())
        if not self.communicate:  # calibration: DDP's whole backward, but no all-reduce
            skipped = torch.futures.Future()
            skipped.set_result(buffer)
            return skipped
        wire = to_wire(buffer, self.wire_dtype)
        name = f"bucket {bucket.index()}"
        if self.shared is None:
            summed = start_all_reduce(wire, name, recorder)
        else:
            summed = start_shared_memory_all_reduce(self.shared, wire, name, recorder)
        return summed.then(lambda done: self.write_back(done, wire, buffer))

    def write_back(self, done, wire, buffer):
        """The averaged bucket, in the bucket's own dtype; a float16 overflow is flagged on the
        device."""
        done.value()  # raises the all-reduce's error again, if it failed
        from_wire(wire, buffer, self.overflowed)
        return buffer

    def wire_overflowed(self):
        """Whether a gradient overflowed float16 on the wire since the last call (a host sync)."""
        overflowed = bool(self.overflowed)
        self.overflowed.zero_()
        return overflowed

    def finish_gradient_synchronization(self):
        """Nothing to do: DDP's backward already waited for every bucket before returning."""

    @contextmanager
    def without_communication(self):
        """Backward passes inside run every step of DDP's but the all-reduce (their gradients
        are not averaged)."""
        self.communicate = False
        try:
            yield
        finally:
            self.communicate = True

    def record_runtime_statistics(self):
        """After a training step's backward: the reducer's own timings of it (backward compute,
        communication, their overlap), kept per step so the run's means cover the same steps as
        the timer's (no warm-up, no calibration)."""
        self.logger.set_runtime_stats_and_log()  # DDP calls it at the next forward; here, now
        logged = self._get_ddp_logging_data()
        times = {name: logged.get(f"backward_{name}_time", 0) / 1e9 for name in REDUCER_TIMES}
        self.reducer_steps.append(times)

    def runtime_statistics(self):
        """The means over the recorded steps, in seconds; exposed = communication - overlap,
        i.e. communication still running after the reducer's last gradient was ready."""
        count = max(1, len(self.reducer_steps))
        mean = {name: sum(step[name] for step in self.reducer_steps) / count
                for name in REDUCER_TIMES}
        return {"steps": len(self.reducer_steps), "backward_compute_s": mean["compute"],
                "backward_comm_s": mean["comm"],
                "backward_overlap_s": mean["compute_comm_overlap"],
                "exposed_s": mean["comm"] - mean["compute_comm_overlap"]}


class NoSyncDDP(DistributedDataParallel):
    """DDP whose every forward runs inside no_sync(), so no backward communicates: the same
    processes and the same backward without communication, the compute baseline."""

    def forward(self, *args, **kwargs):
        with self.no_sync():
            return super().forward(*args, **kwargs)

    def finish_gradient_synchronization(self):
        """Nothing to do: no gradient is averaged."""


def wrap_model(model, mode, comm, sync="bucketed", bucket_mb=DEFAULT_BUCKET_MB, compress=None,
               device_ids=None, comm_hook="none"):
    """`model` wrapped for `mode` (see above); `comm` records the collectives' spans (a
    timing.CommRecorder), `sync` is the hand-written strategy of mode manual, `comm_hook` how
    mode ddp sums its buckets ("none": gloo's all-reduce, "shm": shared memory)."""
    if mode == "single":
        return SingleProcess(model)
    if mode == "ddp":
        return TimedDDP(model, comm, bucket_mb, compress, device_ids, comm_hook)
    if mode == "ddp-no-sync":
        return NoSyncDDP(model, device_ids=device_ids, bucket_cap_mb=bucket_mb)
    return ManualDDP(model, sync, bucket_mb, compress, comm)
