"""Checkpoints that survive a crash mid-write and load in any mode.

Rank 0 writes `ckpt-e<epoch>-s<step>.pt` atomically (temporary file, fsync, rename) and keeps
the newest `keep`. The model is saved unwrapped, so there is no `module.` prefix: a checkpoint
from --mode ddp loads in manual or single. Every rank's RNG state is saved, so a resumed run
draws the same dropout masks as an uninterrupted one.
"""
import glob
import os
import re
import sys

import torch

NAME = re.compile(r"ckpt-e(\d+)-s(\d+)\.pt$")


def checkpoint_path(folder, epoch, step):
    return os.path.join(folder, f"ckpt-e{epoch:04d}-s{step:08d}.pt")


def save_atomic(obj, path):
    """torch.save to a temporary file, flushed to disk, then renamed: a crash never leaves half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = path + ".tmp"
    with open(temporary, "wb") as file:
        torch.save(obj, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def save(folder, state, keep):
    """Write `state` for (state['epoch'], state['step_in_epoch']) atomically; delete all but the newest `keep`."""
    path = checkpoint_path(folder, state["epoch"], state["step_in_epoch"])
    save_atomic(state, path)
    for old in sorted(existing(folder))[:-keep]:
        os.remove(old)
    return path


def existing(folder):
    return [path for path in glob.glob(os.path.join(folder, "ckpt-e*-s*.pt")) if NAME.search(path)]


def load_latest(folder, device):
    """The newest checkpoint that loads, or None; a corrupt or truncated one is skipped with a warning."""
    for path in sorted(existing(folder), reverse=True):
        try:
            return torch.load(path, map_location=device, weights_only=True), path
        except Exception as error:
            print(f"warning: skipping unreadable checkpoint {path} ({type(error).__name__})", file=sys.stderr)
    return None, None


def rng_state():
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state):
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"]:
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
