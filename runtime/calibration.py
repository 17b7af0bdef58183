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
from runtime.across_ranks import gather

CALIBRATION_WINDOW = 5  # DDP's baseline: the median of this many latest no-communication backwards


class BackwardCalibration:
    """Times DDP's backward without communication through the run and keeps `baseline` (the
    timer's `backward_baseline`) up to date; says how comm_exposed was obtained. `enabled` only
    for a wrapper that waits inside backward (wrappers.SyncOptions.waits_inside_backward)."""

    def __init__(self, model, timer, precision, accum_steps=1, every=25, enabled=False):
        self.model = model
        self.timer = timer
        self.precision = precision  # step.Precision: autocast and loss scaling, as training's
        self.accum_steps = accum_steps
        self.every = every
        self.enabled = enabled
        self.backwards = []  # seconds of each backward without communication
        self.baseline = None  # the median of the latest CALIBRATION_WINDOW of them
        self.seconds = 0.0  # spent calibrating since the last take_seconds(), off the epoch's time

    def after_step(self, last_batch):
        """After a training step: DDP's own statistics of it, then a calibration on the step's
        last micro-batch where one is due (`last_batch()` gives its images and labels)."""
        if not self.enabled:
            return
        if self.timer.steps_seen > self.timer.warmup_steps:
            self.model.record_runtime_statistics()  # DDP's own view: the estimate's cross-check
        if self.due():
            self.calibrate(*last_batch())

    def due(self):
        """Before each of the first CALIBRATION_WINDOW measured steps (a baseline from the start),
        then every `every` steps."""
        upcoming = self.timer.steps_seen - self.timer.warmup_steps
        if self.every <= 0:
            return False
        return upcoming >= 0 and (upcoming < CALIBRATION_WINDOW or upcoming % self.every == 0)

    def calibrate(self, images, labels):
        """Time a backward of the step's batch, just after the step (caches as warm as the step's
        own), as training runs it (autocast, loss scaling, DDP's bucket copies) but with the
        all-reduce left out. Training is left bit-identical: the RNG is restored and the gradients
        discarded."""
        began = time.perf_counter()
        rng = checkpoint.rng_state()
        with self.model.without_communication():
            with self.precision.autocast():
                loss = cross_entropy(self.model(images), labels)
            stamps = [self.timer.clock.stamp()]
            self.precision.scaler.scale(loss / self.accum_steps).backward()
            stamps.append(self.timer.clock.stamp())
        self.model.zero_grad(set_to_none=True)
        checkpoint.set_rng_state(rng)
        begin, end = self.timer.clock.seconds(stamps)
        self.backwards.append(end - begin)
        self.baseline = statistics.median(self.backwards[-CALIBRATION_WINDOW:])
        self.seconds += time.perf_counter() - began

    def take_seconds(self):
        """Seconds spent calibrating since the last call."""
        seconds = self.seconds
        self.seconds = 0.0
        return seconds

    def provenance(self):
        """How comm_exposed was obtained, for the results file: measured, or DDP's estimate with
        every rank's calibrations and DDP's own statistics beside it. A collective."""
        if not self.enabled:
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
