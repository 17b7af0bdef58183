"""Checkpoints that survive a crash mid-write and load in any mode.

Rank 0 writes `ckpt-e<epoch>-s<step>.pt` atomically (runtime/atomic.py) and keeps the newest
`keep`. The model is saved unwrapped, so there is no `module.` prefix: a checkpoint from
--mode ddp loads in manual or single. Every rank's RNG state is saved, so a resumed run draws
the same dropout masks as an uninterrupted one.

--mode sharded (runtime/sharded.py) holds 1/n of the model or of the optimizer on each rank:
every rank takes part in gathering them whole (collectives), so its checkpoint holds the whole
model, which loads in any mode, and the whole optimizer state, which loads at any world size;
each rank keeps its shard of it. That state is per flat shard, not per parameter: it resumes
with the same --shard (`optimizer_layout`), and a mismatch is one clear line. Every mode's wrapper
says how through runtime/wrapped_model.WrappedModel's methods.
"""
import glob
import os
import re
import sys
from dataclasses import dataclass, field

import torch

from runtime.atomic import write_atomic
from runtime.launch import LaunchError
from runtime.wrapped_model import PER_PARAMETER

NAME = re.compile(r"ckpt-e(\d+)-s(\d+)\.pt$")


@dataclass
class Progress:
    """Where training stands: what a checkpoint holds besides the tensors."""

    epoch: int = 0  # the epoch running, or the next to run (counted from 0)
    step_in_epoch: int = 0  # its steps already done: a resumed run starts there
    global_step: int = 0
    history: list = field(default_factory=list)  # one record per finished epoch

    @property
    def samples_seen(self):
        """Training samples over the finished epochs of this run and the runs it resumed."""
        return self.history[-1]["samples_seen"] if self.history else 0

    @property
    def elapsed_s(self):
        """Training seconds over the same epochs."""
        return self.history[-1]["elapsed_s"] if self.history else 0.0


def checkpoint_path(folder, epoch, step):
    """The file name of the checkpoint taken after `step` steps of epoch `epoch`."""
    return os.path.join(folder, f"ckpt-e{epoch:04d}-s{step:08d}.pt")


def save_atomic(obj, path):
    """torch.save `obj` to `path`, whole or not at all."""
    write_atomic(path, lambda file: torch.save(obj, file), binary=True)


def save(folder, state, keep):
    """Write `state` for (state['epoch'], state['step_in_epoch']) atomically; delete all but the
    newest `keep`."""
    path = checkpoint_path(folder, state["epoch"], state["step_in_epoch"])
    save_atomic(state, path)
    for old in sorted(existing(folder))[:-keep]:
        os.remove(old)
    return path


def existing(folder):
    """The checkpoint files in `folder`."""
    paths = glob.glob(os.path.join(folder, "ckpt-e*-s*.pt"))
    return [path for path in paths if NAME.search(path)]


def load_latest(folder, device):
    """The newest checkpoint that loads, and its path, or (None, None); a corrupt or truncated one
    is skipped with a warning."""
    for path in sorted(existing(folder), reverse=True):
        try:
            return torch.load(path, map_location=device, weights_only=True), path
        except Exception as error:
            print(f"warning: skipping unreadable checkpoint {path} ({type(error).__name__})",
                  file=sys.stderr)
    return None, None


def training_state(trainer, rng_per_rank, world_size):
    """Everything a resumed run needs: the unwrapped model, optimizer, scheduler, loss scaler, the
    progress and every rank's RNG state. Every rank calls it (a sharded model and optimizer are
    gathered); rank 0 saves it."""
    progress = trainer.progress
    return {
        "model": trainer.model.full_state_dict(),
        "optimizer": trainer.model.optimizer_state_dict(trainer.optimizer),
        "optimizer_layout": trainer.model.optimizer_layout(),
        "scheduler": trainer.schedule.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "epoch": progress.epoch,
        "step_in_epoch": progress.step_in_epoch,
        "global_step": progress.global_step,
        "history": progress.history,
        "rng": rng_per_rank,
        "world_size": world_size,
    }


def restore_training(trainer, state, rank, world_size, path=""):
    """Load `state` (training_state's, read from `path`) into the trainer's model, optimizer,
    scheduler and scaler, and this rank's RNG where the world size is the same; returns the
    Progress it had saved. A sharded model and optimizer keep this rank's shard of it."""
    model = trainer.model
    saved_layout = state.get("optimizer_layout", PER_PARAMETER)  # older checkpoints: per parameter
    if saved_layout != model.optimizer_layout():
        raise LaunchError(f"--resume: {path or 'the checkpoint'} holds optimizer state in "
                          f"{saved_layout}; this run keeps it in {model.optimizer_layout()}: "
                          "resume with the options it was saved with, or use another "
                          "--checkpoint-dir")
    model_state = {key.removeprefix("module."): value for key, value in state["model"].items()}
    model.load_full_state_dict(model_state)
    model.load_optimizer_state_dict(trainer.optimizer, state["optimizer"])
    trainer.schedule.load_state_dict(state["scheduler"])
    if state.get("scaler"):
        trainer.scaler.load_state_dict(state["scaler"])
    if state["world_size"] == world_size:  # each rank's generator state is its own
        set_rng_state(state["rng"][rank])
    return Progress(state["epoch"], state["step_in_epoch"], state["global_step"], state["history"])


def rng_state():
    """This process's random number generators' state (CPU, and every GPU's)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {"torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state):
    """Restore what rng_state() returned."""
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"]:
        torch.cuda.set_rng_state_all([generator.cpu() for generator in state["cuda"]])
