"""One training loop for every mode: the wrapped model decides how gradients are synchronised.

The loop only ever calls `model(x)`, `model.no_sync()` and
`model.finish_gradient_synchronization()`; see sync_modes.py for the three wrappers.
"""
import os
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F

from data import eval_range, shard_indices
from timing import COMPUTE_PHASES, summarize_ranks


def all_reduce_sum(values, device):
    """Sum a list of numbers over ranks (a no-op for one process)."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor.tolist()


def gather(obj):
    """Every rank's `obj`, in rank order."""
    if not dist.is_initialized():
        return [obj]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


@torch.no_grad()
def evaluate(model, split, rank, world_size, device, batch_size=1000):
    """Loss and accuracy over the whole split: each rank scores a disjoint slice, the sums are reduced."""
    model.eval()
    part = eval_range(len(split), rank, world_size)
    images, labels = split.images[part], split.labels[part]
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for start in range(0, len(labels), batch_size):
        x = images[start:start + batch_size].to(device, non_blocking=True)
        y = labels[start:start + batch_size].to(device, non_blocking=True)
        logits = model(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum")
        correct += (logits.argmax(1) == y).sum()
    loss_sum, correct, count = all_reduce_sum([loss_sum.item(), correct.item(), len(labels)], device)
    return loss_sum / count, correct / count


class Trainer:
    """Trains a wrapped model on the in-memory data; rank 0 prints one line per epoch."""

    def __init__(self, model, optimizer, scheduler, data, config, placement, device, timer):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.data, self.config, self.placement = data, config, placement
        self.device, self.timer = device, timer
        self.train = data.train.to(device)  # on a GPU the whole split fits: batches are then indexed there
        self.global_step = 0
        self.history = []
        self.all_steps = []

    def log(self, line):
        if self.placement.rank == 0:
            print(line, flush=True)

    def run_epoch(self, epoch):
        config, placement, timer = self.config, self.placement, self.timer
        accumulation = config.accum_steps
        indices = shard_indices(len(self.train), config.batch_size * accumulation, placement.rank,
                                placement.world_size, epoch, config.seed)
        if config.max_steps:
            indices = indices[:config.max_steps]
        self.model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        start = time.perf_counter()
        for step_indices in indices:
            self.maybe_fail_for_test()
            timer.start_step()
            for micro, batch in enumerate(step_indices.view(accumulation, config.batch_size)):
                x = self.train.images[batch].to(self.device, non_blocking=True)
                y = self.train.labels[batch].to(self.device, non_blocking=True)
                timer.mark("data")
                last = micro == accumulation - 1
                with nullcontext() if last else self.model.no_sync():  # communicate on the last micro-batch only
                    logits = self.model(x)
                    loss = F.cross_entropy(logits, y)
                    timer.mark("forward")
                    (loss / accumulation).backward()
                    timer.mark("backward")
                loss_sum += loss.detach() * len(y)  # stays on the device: no host sync per step
                correct += (logits.detach().argmax(1) == y).sum()
            self.model.finish_gradient_synchronization()
            timer.mark("sync")
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            timer.mark("optimizer")
            timer.end_step()
            self.global_step += 1
        train_time = time.perf_counter() - start
        if self.scheduler is not None:
            self.scheduler.step()
        return self.finish_epoch(epoch, len(indices), loss_sum, correct, train_time)

    def finish_epoch(self, epoch, steps, loss_sum, correct, train_time):
        steps_timed = self.timer.take_epoch()
        self.all_steps += steps_timed
        totals = [sum(s[phase] for s in steps_timed) for phase in ("data",) + COMPUTE_PHASES + ("sync", "comm_busy")]
        samples = steps * self.config.batch_size * self.config.accum_steps
        sums = all_reduce_sum([loss_sum.item(), correct.item(), samples, train_time] + totals, self.device)
        world = self.placement.world_size
        data_s, forward_s, backward_s, optimizer_s, exposed_s, busy_s = (value / world for value in sums[4:])
        val_loss, val_accuracy = evaluate(self.model, self.data.val, self.placement.rank, world, self.device)
        record = {
            "epoch": epoch + 1,
            "steps": steps,
            "train_loss": sums[0] / max(sums[2], 1),
            "train_accuracy": sums[1] / max(sums[2], 1),
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "epoch_time_s": sums[3] / world,
            "data_s": data_s,
            "compute_s": forward_s + backward_s + optimizer_s,
            "comm_exposed_s": exposed_s,
            "comm_busy_s": busy_s,
            "samples_per_s": sums[2] / (sums[3] / world) if sums[3] else 0.0,
            "lr": self.optimizer.param_groups[0]["lr"],
        }
        self.history.append(record)
        self.log(f"epoch {record['epoch']}/{self.config.epochs} | train loss {record['train_loss']:.4f} "
                 f"acc {100 * record['train_accuracy']:.2f}% | val loss {val_loss:.4f} acc {100 * val_accuracy:.2f}% | "
                 f"{record['epoch_time_s']:.1f} s ({record['samples_per_s']:.0f} samples/s) | "
                 f"compute {record['compute_s']:.2f} s | comm {busy_s:.2f} s busy, {exposed_s:.2f} s exposed")
        return record

    def maybe_fail_for_test(self):
        """--debug-exit-rank/--debug-exit-step: this rank dies here, as a crashed worker would."""
        config = self.config
        if config.debug_exit_step is not None and self.global_step == config.debug_exit_step \
                and self.placement.rank == config.debug_exit_rank:
            print(f"rank {self.placement.rank}: exiting at step {self.global_step} (--debug-exit-step)",
                  file=sys.stderr, flush=True)
            os._exit(3)

    def fit(self):
        for epoch in range(self.config.epochs):
            self.run_epoch(epoch)
        test_loss, test_accuracy = evaluate(self.model, self.data.test, self.placement.rank,
                                            self.placement.world_size, self.device)
        self.log(f"test loss {test_loss:.4f} acc {100 * test_accuracy:.2f}%")
        timing = summarize_ranks(gather(self.all_steps))
        return {"epochs": self.history, "test": {"loss": test_loss, "accuracy": test_accuracy}, "timing": timing}
