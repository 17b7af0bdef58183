"""DDP's exposed communication, estimated: its backward timed again without communication.

DDP waits for its buckets inside backward, so the end of its computation cannot be stamped:
timing.py takes it as the last backward's start plus a baseline, the median of the latest
CALIBRATION_WINDOW backwards of a step's batch timed without the all-reduce, just after the step.
The other modes wait after backward, where the waiting is measured; none of this runs for them.
"""
import statistics
import time

from torch.nn.functional import cross_entropy

from runtime import checkpoint
from runtime.collectives import gather

CALIBRATION_WINDOW = 5  # DDP's baseline: the median of this many latest no-communication backwards


class BackwardCalibration:
    """Times DDP's backward without communication through the run and keeps the timer's
    `backward_baseline` up to date; says how comm_exposed was obtained."""

    def __init__(self, model, timer, args, autocast, scaler):
        self.model = model
        self.timer = timer
        self.every = args.calibrate_every
        self.accum_steps = args.accum_steps
        self.autocast = autocast
        self.scaler = scaler
        self.backwards = []  # seconds of each backward without communication
        self.seconds = 0.0  # spent calibrating since the last take_seconds(), off the epoch's time

    def after_step(self, split, batch):
        """After a training step: DDP's own statistics of it, then a calibration on `batch` (the
        step's last micro-batch of `split`) where one is due."""
        measured = self.timer.steps_seen > self.timer.warmup_steps
        if hasattr(self.model, "record_runtime_statistics") and measured:
            self.model.record_runtime_statistics()  # DDP's own view: the estimate's cross-check
        if self.due():
            self.calibrate(split, batch)

    def due(self):
        """Before each of the first CALIBRATION_WINDOW measured steps (a baseline from the start),
        then every `--calibrate-every` steps; only for DDP, which waits inside backward."""
        upcoming = self.timer.steps_seen - self.timer.warmup_steps
        if not getattr(self.model, "waits_inside_backward", False) or self.every <= 0:
            return False
        return upcoming >= 0 and (upcoming < CALIBRATION_WINDOW or upcoming % self.every == 0)

    def calibrate(self, split, batch):
        """Time a backward of the step's batch, just after the step (caches as warm as the step's
        own), as training runs it (autocast, loss scaling, DDP's bucket copies) but with the
        all-reduce left out. Training is left bit-identical: the RNG is restored and the gradients
        discarded."""
        began = time.perf_counter()
        images = split.images[batch]  # the split is on the model's device already
        labels = split.labels[batch]
        rng = checkpoint.rng_state()
        with self.model.without_communication():
            with self.autocast():
                loss = cross_entropy(self.model(images), labels)
            stamps = [self.timer.clock.stamp()]
            self.scaler.scale(loss / self.accum_steps).backward()
            stamps.append(self.timer.clock.stamp())
        self.model.zero_grad(set_to_none=True)
        checkpoint.set_rng_state(rng)
        begin, end = self.timer.clock.seconds(stamps)
        self.backwards.append(end - begin)
        self.timer.backward_baseline = statistics.median(self.backwards[-CALIBRATION_WINDOW:])
        self.seconds += time.perf_counter() - began

    def take_seconds(self):
        """Seconds spent calibrating since the last call."""
        seconds = self.seconds
        self.seconds = 0.0
        return seconds

    def provenance(self):
        """How comm_exposed was obtained, for the results file: measured, or DDP's estimate with
        every rank's calibrations and DDP's own statistics beside it. A collective."""
        if not getattr(self.model, "waits_inside_backward", False):
            return {"exposed_method": "measured: communication in flight after the last backward "
                                      "returned"}
        method = (f"estimate: DDP's last backward minus the median of the latest "
                  f"{CALIBRATION_WINDOW} backwards timed without communication (a step's batch, "
                  "just after the step; autocast and loss scaling as training; bucket copies kept)")
        calibration = {"every_steps": self.every,
                       "backward_without_communication_s": gather(self.backwards)}
        return {"exposed_method": method,
                "calibration": calibration,
                "ddp_runtime_statistics": gather(self.model.runtime_statistics())}
