"""One training loop for every mode: the wrapped model decides how gradients are synchronised.

The loop only ever calls `model(x)`, `model.no_sync()` and
`model.finish_gradient_synchronization()`; see sync_modes.py for the three wrappers.
"""
import os
import statistics
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F

from runtime import checkpoint
from runtime.data import eval_range, shard_indices
from runtime.results import write_json_atomic
from runtime.timing import COMM_FIELDS, chrome_trace, summarize_ranks

CALIBRATION_WINDOW = 5  # DDP's baseline: the median of this many latest no-communication backwards


class TrainingDiverged(Exception):
    """The loss became NaN or infinite."""


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
    """Trains a wrapped model on the in-memory data; rank 0 prints one line per epoch and writes checkpoints."""

    def __init__(self, model, optimizer, scheduler, data, config, placement, device, timer, tensorboard=None):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.data, self.config, self.placement = data, config, placement
        self.device, self.timer, self.tensorboard = device, timer, tensorboard
        self.train = data.train.to(device)  # on a GPU the whole split fits: batches are then indexed there
        self.start_epoch = self.skip_steps = self.global_step = 0
        self.history, self.all_steps, self.calibrations = [], [], []
        self.samples_seen, self.elapsed = 0, 0.0  # over this run's epochs, for learning curves against both
        self.first_bad_step = torch.full((), -1, dtype=torch.int64, device=device)  # checked off the hot path
        amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.amp)
        self.autocast = (lambda: torch.autocast(device.type, dtype=amp_dtype)) if amp_dtype else nullcontext
        # fp16's narrow range needs the loss scaled up before backward (and the step skipped on overflow); bf16's does not.
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.amp == "fp16")

    def log(self, line):
        if self.placement.rank == 0:
            print(line, flush=True)

    # --- the loop ---------------------------------------------------------------------------

    def run_epoch(self, epoch):
        config, timer = self.config, self.timer
        accumulation = config.accum_steps
        indices = shard_indices(len(self.train), config.batch_size * accumulation, self.placement.rank,
                                self.placement.world_size, epoch, config.seed)
        if config.max_steps:
            indices = indices[:config.max_steps]
        first_step, self.skip_steps = self.skip_steps, 0  # a run resumed mid-epoch starts where it stopped
        self.model.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        step_losses = torch.zeros(len(indices), device=self.device)
        start = last_progress = time.perf_counter()
        calibration_time = 0.0  # left out of the epoch's time: the throughput is training's alone
        for step in range(first_step, len(indices)):
            self.maybe_fail_for_test()
            micro_batches = indices[step].view(accumulation, config.batch_size)
            timer.start_step()
            for micro, batch in enumerate(micro_batches):
                x = self.train.images[batch].to(self.device, non_blocking=True)
                y = self.train.labels[batch].to(self.device, non_blocking=True)
                self.maybe_slow_down_for_test()
                timer.mark("data")
                last = micro == accumulation - 1
                with nullcontext() if last else self.model.no_sync():  # communicate on the last micro-batch only
                    with self.autocast():
                        logits = self.model(x)
                        loss = F.cross_entropy(logits, y)
                    timer.mark("forward")
                    self.scaler.scale(loss / accumulation).backward()
                    timer.mark("backward")
                loss_sum += loss.detach() * len(y)  # stays on the device: no host sync per step
                correct += (logits.detach().argmax(1) == y).sum()
                step_losses[step] += loss.detach() / accumulation
            self.model.finish_gradient_synchronization()
            timer.mark("sync")
            self.check_wire_overflow()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            timer.mark("optimizer")
            timer.end_step()
            if hasattr(self.model, "record_runtime_statistics") and timer.steps_seen > timer.warmup_steps:
                self.model.record_runtime_statistics()  # DDP's own view, the cross-check of its estimate
            if self.calibration_due():
                calibration_time += self.calibrate_backward(micro_batches[-1])
            self.first_bad_step = torch.where((self.first_bad_step < 0) & ~torch.isfinite(loss.detach()),
                                              self.global_step, self.first_bad_step)
            self.global_step += 1
            if config.checkpoint_every and self.global_step % config.checkpoint_every == 0:
                self.save_checkpoint(epoch, step + 1)
            if time.perf_counter() - last_progress >= config.progress_every:
                last_progress = time.perf_counter()
                self.show_progress(epoch, step + 1 - first_step, len(indices) - first_step, last_progress - start)
        train_time = time.perf_counter() - start - calibration_time
        self.check_finite()
        if self.scheduler is not None:
            self.scheduler.step()
        record, steps_timed = self.finish_epoch(epoch, len(indices) - first_step, loss_sum, correct, train_time)
        self.log_tensorboard(record, steps_timed, step_losses[first_step:])
        self.save_checkpoint(epoch + 1, 0)
        return record

    def show_progress(self, epoch, done, total, elapsed):
        rate = done * self.config.batch_size * self.config.accum_steps * self.placement.world_size / elapsed
        self.log(f"  epoch {epoch + 1} step {done}/{total} | {rate:.0f} samples/s | "
                 f"ETA {elapsed / done * (total - done):.0f} s")

    def finish_epoch(self, epoch, steps, loss_sum, correct, train_time):
        steps_timed = self.timer.take_epoch()
        self.all_steps += steps_timed
        fields = ("data", "compute") + COMM_FIELDS
        totals = [sum(s[field] for s in steps_timed) for field in fields]
        samples = steps * self.config.batch_size * self.config.accum_steps
        sums = all_reduce_sum([loss_sum.item(), correct.item(), samples, train_time] + totals, self.device)
        world = self.placement.world_size
        per_rank = {f"{field}_s": value / world for field, value in zip(fields, sums[4:])}  # each rank's epoch total
        self.samples_seen += sums[2]
        self.elapsed += sums[3] / world
        val_loss, val_accuracy = evaluate(self.model, self.data.val, self.placement.rank, world, self.device)
        epoch_timing = summarize_ranks(gather(steps_timed))  # per field mean/median/p95 over all ranks' steps
        record = {
            "epoch": epoch + 1,
            "steps": steps,
            "train_loss": sums[0] / max(sums[2], 1),
            "train_accuracy": sums[1] / max(sums[2], 1),
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "epoch_time_s": sums[3] / world,
            **per_rank,
            "samples_seen": self.samples_seen,
            "elapsed_s": self.elapsed,
            "samples_per_s": sums[2] / (sums[3] / world) if sums[3] else 0.0,
            "lr": self.optimizer.param_groups[0]["lr"],
            "timing": dict(epoch_timing["across_ranks"], straggler=epoch_timing["straggler"]),
        }
        self.history.append(record)
        self.log(f"epoch {record['epoch']}/{self.config.epochs} | train loss {record['train_loss']:.4f} "
                 f"acc {100 * record['train_accuracy']:.2f}% | val loss {val_loss:.4f} acc {100 * val_accuracy:.2f}% | "
                 f"{record['epoch_time_s']:.1f} s ({record['samples_per_s']:.0f} samples/s) | "
                 f"compute {record['compute_s']:.2f} s | comm {record['comm_busy_s']:.2f} s busy, "
                 f"{record['comm_hidden_s']:.2f} s hidden, {record['comm_exposed_s']:.2f} s exposed")
        return record, steps_timed

    # --- DDP's exposed communication: an estimate, calibrated through the run ---------------------

    def calibration_due(self):
        """DDP waits inside backward, so its backward is timed without communication: before each of the first
        CALIBRATION_WINDOW measured steps (a baseline from the start), then every `--calibrate-every` steps."""
        every, upcoming = self.config.calibrate_every, self.timer.steps_seen - self.timer.warmup_steps
        return getattr(self.model, "waits_inside_backward", False) and every > 0 and upcoming >= 0 \
            and (upcoming < CALIBRATION_WINDOW or upcoming % every == 0)

    def calibrate_backward(self, batch):
        """Time a backward of the step's batch, just after the step (caches as warm as the step's own), as
        training runs it (autocast, loss scaling, DDP's bucket copies) but with the all-reduce left out. The
        timer's baseline for the steps that follow is the median of the latest CALIBRATION_WINDOW of these.
        Training is left bit-identical: the RNG is restored and the gradients discarded. Returns its seconds.
        """
        began = time.perf_counter()
        x, y = self.train.images[batch].to(self.device), self.train.labels[batch].to(self.device)
        rng = checkpoint.rng_state()
        with self.model.without_communication():
            with self.autocast():
                loss = F.cross_entropy(self.model(x), y)
            begin = self.timer.clock.stamp()
            self.scaler.scale(loss / self.config.accum_steps).backward()
            end = self.timer.clock.stamp()
        self.optimizer.zero_grad(set_to_none=True)
        checkpoint.set_rng_state(rng)
        begin, end = self.timer.clock.seconds([begin, end])
        self.calibrations.append(end - begin)
        self.timer.backward_baseline = statistics.median(self.calibrations[-CALIBRATION_WINDOW:])
        return time.perf_counter() - began

    def timing_provenance(self):
        """How comm_exposed was obtained, for the results file: measured, or DDP's estimate and its baseline."""
        if not getattr(self.model, "waits_inside_backward", False):
            return {"exposed_method": "measured: communication in flight after the last backward returned"}
        samples = gather(self.calibrations)
        return {"exposed_method": f"estimate: DDP's last backward minus the median of the latest {CALIBRATION_WINDOW} "
                                  "backwards timed without communication (a step's batch, just after the step; "
                                  "autocast and loss scaling as training; bucket copies kept)",
                "calibration": {"every_steps": self.config.calibrate_every,
                                "backward_without_communication_s": samples},
                "ddp_runtime_statistics": gather(self.model.runtime_statistics())}

    def fit(self):
        self.resume()
        if dist.is_initialized():
            dist.barrier()  # the trace's common origin
        self.trace_origin = time.perf_counter()
        for epoch in range(self.start_epoch, self.config.epochs):
            self.run_epoch(epoch)
        test_loss, test_accuracy = evaluate(self.model, self.data.test, self.placement.rank,
                                            self.placement.world_size, self.device)
        self.log(f"test loss {test_loss:.4f} acc {100 * test_accuracy:.2f}%")
        timing = dict(summarize_ranks(gather(self.all_steps)), **self.timing_provenance())
        if self.config.trace:
            traces = gather((self.trace_origin, self.timer.trace))
            if self.placement.rank == 0:
                write_json_atomic(self.config.trace, chrome_trace(traces))
        return {"epochs": self.history, "test": {"loss": test_loss, "accuracy": test_accuracy}, "timing": timing}

    # --- failures, checkpoints, logging -------------------------------------------------------

    def check_finite(self):
        """Stop every rank together if any rank's loss became NaN or infinite (one small all-reduce)."""
        bad = self.first_bad_step.clone()
        bad = torch.where(bad < 0, torch.iinfo(torch.int64).max, bad)
        if dist.is_initialized():
            dist.all_reduce(bad, op=dist.ReduceOp.MIN)
        if bad.item() != torch.iinfo(torch.int64).max:
            kept = checkpoint.existing(self.config.checkpoint_dir) if self.config.checkpoint_dir else []
            raise TrainingDiverged(f"the loss became NaN or infinite at step {bad.item()}; stopped"
                                   + (f" (last good checkpoint: {sorted(kept)[-1]})" if kept else ""))

    def check_wire_overflow(self):
        """fp16 on the wire without a loss scaler: an overflow stops the run at once (with --amp fp16 the
        scaler sees the inf and skips the step instead). One host sync per step, in this case only."""
        overflowed = getattr(self.model, "wire_overflowed", None)  # only the modes that communicate
        if self.config.compress == "fp16" and not self.scaler.is_enabled() and overflowed and overflowed():
            raise TrainingDiverged(f"a gradient overflowed float16 on the wire at step {self.global_step} "
                                   "(largest float16: 65504); use --compress bf16, or --amp fp16 for loss scaling")

    def save_checkpoint(self, epoch, step_in_epoch):
        """Every rank takes part (its RNG state is gathered); rank 0 writes."""
        if not self.config.checkpoint_dir:
            return
        self.check_finite()  # never save a diverged model over the last good one
        rng = gather(checkpoint.rng_state())
        if self.placement.rank == 0:
            state = {"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                     "scheduler": self.scheduler.state_dict() if self.scheduler else None,
                     "scaler": self.scaler.state_dict(),
                     "epoch": epoch, "step_in_epoch": step_in_epoch, "global_step": self.global_step,
                     "history": self.history, "rng": rng, "world_size": self.placement.world_size}
            checkpoint.save(self.config.checkpoint_dir, state, self.config.keep_checkpoints)

    def resume(self):
        if not (self.config.resume and self.config.checkpoint_dir):
            return
        state, path = checkpoint.load_latest(self.config.checkpoint_dir, self.device)
        if state is None:
            self.log(f"no checkpoint in {self.config.checkpoint_dir}: starting from scratch")
            return
        model_state = {key.removeprefix("module."): value for key, value in state["model"].items()}
        self.model.module.load_state_dict(model_state)
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler and state["scheduler"]:
            self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.start_epoch, self.skip_steps = state["epoch"], state["step_in_epoch"]
        self.global_step, self.history = state["global_step"], state["history"]
        if self.history:
            self.samples_seen, self.elapsed = self.history[-1]["samples_seen"], self.history[-1]["elapsed_s"]
        if state["world_size"] == self.placement.world_size:
            checkpoint.set_rng_state(state["rng"][self.placement.rank])
        self.log(f"resumed from {path}: epoch {self.start_epoch + 1}, step {self.skip_steps}")

    def log_tensorboard(self, record, steps_timed, step_losses):
        if self.tensorboard is None or self.placement.rank != 0:
            return
        step_losses = step_losses.tolist()  # the epoch's one copy off the device
        first = self.global_step - len(step_losses)
        for offset, loss in enumerate(step_losses):
            self.tensorboard.add_scalar("train/step_loss", loss, first + offset)
        for offset, timed in enumerate(steps_timed, start=self.global_step - len(steps_timed)):
            for field in ("compute",) + COMM_FIELDS:
                self.tensorboard.add_scalar(f"time/{field}_s", timed[field], offset)
        for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "samples_per_s"):
            self.tensorboard.add_scalar(f"epoch/{key}", record[key], record["epoch"])
        self.tensorboard.flush()

    def maybe_slow_down_for_test(self):
        """--debug-slow-rank: this rank does 10 ms more work per micro-batch, a straggler the timing must show."""
        if self.config.debug_slow_rank == self.placement.rank:
            time.sleep(0.010)

    def maybe_fail_for_test(self):
        """--debug-exit-rank/--debug-exit-step: this rank dies here, as a crashed worker would (first attempt only)."""
        config = self.config
        if config.debug_exit_step == self.global_step and self.placement.rank == config.debug_exit_rank \
                and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            print(f"rank {self.placement.rank}: exiting at step {self.global_step} (--debug-exit-step)",
                  file=sys.stderr, flush=True)
            os._exit(3)
