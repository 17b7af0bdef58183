"""Stopping a run whose numbers went bad: a loss that became NaN or infinite on any rank, a
gradient that overflowed float16 on the wire, or ranks whose parameters drifted apart."""
import hashlib

import torch
import torch.distributed as dist

from runtime import checkpoint, collective_record

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
            with collective_record.kept("all_reduce", bad):
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


class RanksDrifted(TrainingDiverged):
    """Ranks that must hold the same parameters do not: a gradient the sync left out."""


def fingerprints(tensors):
    """A 64-bit fingerprint of each tensor's bytes (BLAKE2b): equal on two ranks exactly when
    the values are, to the bit."""
    found = []
    for tensor in tensors:
        data = tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
        digest = hashlib.blake2b(memoryview(data), digest_size=8).digest()
        found.append(int.from_bytes(digest, "little", signed=True))
    return found


def check_in_sync(named_tensors, step, device):
    """Every rank's fingerprints of `named_tensors` (the same names on every rank), compared: the
    first that differs raises RanksDrifted on every rank, naming it and the step."""
    names = [name for name, _ in named_tensors]
    mine = torch.tensor(fingerprints(tensor for _, tensor in named_tensors), dtype=torch.int64,
                        device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    with collective_record.kept("all_gather", mine):
        dist.all_gather(everyone, mine)
    table = torch.stack(everyone).cpu()
    differs = (table != table[0]).any(dim=0).nonzero()
    if differs.numel():
        index = differs[0].item()
        ranks = [rank for rank in range(len(everyone)) if table[rank, index] != table[0, index]]
        raise RanksDrifted(f"after step {step} the ranks' parameters differ, first '{names[index]}'"
                           f" (rank {', '.join(map(str, ranks))} against rank 0): a gradient the "
                           "synchronisation left out? (--check-sync-every)")
