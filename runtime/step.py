"""One optimizer step, the same for mlp_ddp.py's trainer and for the benchmarks that time it.

`TrainingStep` runs a batch as pytorch/examples' DDP tutorial does (forward, loss, backward, the
optimizer step), with gradient accumulation, mixed precision and loss scaling, for any wrapped
model (runtime/wrappers.py). With a `timer` each phase is stamped (timing.py); without one (the
time-to-accuracy benchmark) the step is the same with the marks off.
"""
from contextlib import contextmanager, nullcontext
from functools import partial

import torch
from torch.nn.functional import cross_entropy

from runtime.dtypes import DTYPES


class Precision:
    """--amp: autocast to bf16 or fp16, and for fp16 the loss scaled up before backward (its
    narrow range needs it, and an overflowed step is skipped); None: float32 throughout."""

    def __init__(self, amp, device):
        dtype = DTYPES[amp] if amp else None
        self.autocast = partial(torch.autocast, device.type, dtype=dtype) if dtype else nullcontext
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")


class TrainingStep:
    """`step(micro_batches, number)`: one optimizer step of `model` on the micro-batches, each
    turned into (images, labels) on the model's device by `load`. Gradients are averaged over
    the ranks on the last micro-batch only (no_sync() on the others)."""

    def __init__(self, model, optimizer, schedule, load, precision, timer=None, guard=None):
        self.model = model
        self.optimizer = optimizer
        self.schedule = schedule  # runtime/optimizers.py's Schedule: moved after every step
        self.load = load
        self.precision = precision
        self.timer = timer
        self.guard = guard  # runtime/guards.py: an overflow on a float16 wire stops the run

    def __call__(self, micro_batches, number=0, sums=None):
        """The step; `number` (the run's step count) names it in errors, and `sums` (a
        metrics.TrainingSums) adds each micro-batch's loss and accuracy. Returns the last
        micro-batch's loss."""
        last = len(micro_batches) - 1
        for index, batch in enumerate(micro_batches):
            with self.phase("data"):
                images, labels = self.load(batch)
            with self.model.no_sync() if index < last else nullcontext():
                with self.phase("forward"), self.precision.autocast():
                    logits = self.model(images)
                    loss = cross_entropy(logits, labels)
                with self.phase("backward"):
                    self.precision.scaler.scale(loss / len(micro_batches)).backward()
            if sums is not None:
                sums.add(loss, logits, labels)
        with self.phase("sync"):
            self.model.finish_gradient_synchronization()
        with self.phase("optimizer"):
            if self.guard is not None:
                self.guard.check_wire(self.model.parameters(), number)
            self.precision.scaler.step(self.optimizer)
            self.precision.scaler.update()
            # Last, as nanoGPT does: timing.py counts zeroing the gradients in the optimizer phase.
            self.optimizer.zero_grad(set_to_none=True)
            self.schedule.after_step()
        return loss

    @contextmanager
    def phase(self, name):
        """A timed phase of the step (timing.py) ends with its block. Phases are contiguous: each
        runs from the end of the one before, so work between two blocks counts towards the next."""
        yield
        if self.timer is not None:
            self.timer.mark(name)
