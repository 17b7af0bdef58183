"""Stopping a run whose numbers went bad: a loss that became NaN or infinite on any rank, or a
gradient that overflowed float16 on the wire."""
import torch
import torch.distributed as dist

from runtime import checkpoint

NO_STEP = torch.iinfo(torch.int64).max  # "no bad step", the identity of a MIN all-reduce


class TrainingDiverged(Exception):
    """The loss became NaN or infinite, or a gradient overflowed float16 on the wire."""


class DivergenceGuard:
    """Notes the first step whose loss was not finite on the device (no host sync per step) and
    stops every rank together when asked to check; stops at once on a float16 wire overflow where
    gradients cross the wire in float16 (`compress`) with no loss scaler to catch it."""

    def __init__(self, device, compress=None, scaler_enabled=False, checkpoint_dir=None):
        self.watch_wire = compress == "fp16" and not scaler_enabled
        self.checkpoint_dir = checkpoint_dir
        self.first_bad_step = torch.full((), -1, dtype=torch.int64, device=device)

    def note_loss(self, loss, step):
        """Remember `step` if its loss is the first that is NaN or infinite."""
        first_bad = (self.first_bad_step < 0) & ~torch.isfinite(loss.detach())
        self.first_bad_step = torch.where(first_bad, step, self.first_bad_step)

    def check_losses(self):
        """Raise TrainingDiverged on every rank if any rank's loss went bad (a small all-reduce)."""
        bad = torch.where(self.first_bad_step < 0, NO_STEP, self.first_bad_step)
        if dist.is_initialized():
            dist.all_reduce(bad, op=dist.ReduceOp.MIN)
        if bad.item() == NO_STEP:
            return
        kept = checkpoint.existing(self.checkpoint_dir) if self.checkpoint_dir else []
        last_good = f" (last good checkpoint: {sorted(kept)[-1]})" if kept else ""
        raise TrainingDiverged(f"the loss became NaN or infinite at step {bad.item()}; stopped"
                               + last_good)

    def check_wire(self, params, step):
        """On a float16 wire with no loss scaler, after synchronisation: an averaged gradient that
        is not finite overflowed float16 on the wire, and stops the run at once (with --amp fp16
        the scaler sees the inf and skips the step instead). A host sync, in this case only."""
        if not self.watch_wire:
            return
        grads = [param.grad for param in params if param.grad is not None]
        if not torch.stack([grad.isfinite().all() for grad in grads]).all():
            raise TrainingDiverged(f"a gradient overflowed float16 on the wire at step {step} "
                                   "(not finite once averaged; largest float16: 65504); use "
                                   "--compress bf16, or --amp fp16 for loss scaling")
