"""One training loop for every mode: the wrapped model decides how gradients are synchronised.

A step (runtime/step.py, which the benchmarks run too) calls only `model(images)`,
`model.no_sync()` and `model.finish_gradient_synchronization()`; runtime/wrappers.py has the
wrappers. What surrounds the step lives beside it: the NaN watch (guards.py), checkpoints
(checkpoint.py), progress lines and TensorBoard (reporting.py) and injected faults (faults.py).
"""
import time

import torch.distributed as dist

from runtime import checkpoint
from runtime.across_ranks import gather, sum_over_ranks
from runtime.collective_record import kept
from runtime.data import shard_indices
from runtime.faults import FaultInjection
from runtime.guards import DivergenceGuard, check_in_sync
from runtime.memory import MemoryWatch
from runtime.metrics import TrainingSums, evaluate
from runtime.reporting import ProgressLine, Report
from runtime.results import write_json_atomic
from runtime.step import Precision, TrainingStep
from runtime.timing import COMM_FIELDS, chrome_trace, summarize_ranks

EPOCH_TIME_FIELDS = ("data", "compute") + COMM_FIELDS  # each rank's epoch total, in the record


class Trainer:
    """Trains a wrapped model on one rank's share of the in-memory data (see `fit`)."""

    def __init__(self, model, optimizer, schedule, dataset, args, placement, timer):
        self.model = model
        self.optimizer = optimizer
        self.schedule = schedule  # runtime/optimizers.py's Schedule: the learning rate over the run
        self.dataset = dataset
        self.args = args
        self.placement = placement
        self.timer = timer
        self.device = next(model.parameters()).device
        # On a GPU the whole split fits: batches are then indexed there.
        self.train = dataset.train.to(self.device)
        precision = Precision(args.amp, self.device)
        self.scaler = precision.scaler  # its state is checkpointed
        self.guard = DivergenceGuard(self.device, args.compress, self.scaler.is_enabled(),
                                     args.checkpoint_dir)
        self.train_step = TrainingStep(model, optimizer, schedule, self.load, precision, timer,
                                       self.guard)
        self.progress = checkpoint.Progress()
        self.steps_timed = []  # the timing record of every measured step of the run
        self.faults = FaultInjection(args.debug_exit_rank, args.debug_exit_step,
                                     args.debug_slow_rank, placement.rank)
        self.report = Report(args.epochs, args.tensorboard, placement.rank)
        self.memory = MemoryWatch(model, optimizer, timer.comm)  # what the rank holds

    def fit(self):
        """Train the remaining epochs and score the test split; returns the results' training part:
        {"epochs": records, "test": {"loss", "accuracy"}, "timing": summary,
        "memory": {"per_rank": each rank's MemoryWatch record}}."""
        self.resume()
        if dist.is_initialized():
            with kept("barrier"):
                dist.barrier()  # the trace's common origin
        trace_origin = time.perf_counter()
        for epoch in range(self.progress.epoch, self.args.epochs):
            self.run_epoch(epoch)
        if self.args.check_sync_every:
            self.check_in_sync()  # the end too, whatever the step
        test_loss, test_accuracy = evaluate(self.model, self.dataset.test, self.placement.rank,
                                            self.placement.world_size, self.device)
        self.report.log(f"test loss {test_loss:.4f} acc {100 * test_accuracy:.2f}%")
        timing = summarize_ranks(gather(self.steps_timed))
        timing["all_reduce_layouts"] = self.timer.layouts.layouts  # rank 0's; every rank's agree
        timing["bytes_sent"] = {"per_rank": gather(self.timer.bytes_sent())}
        if self.args.trace:
            traces = gather((trace_origin, self.timer.trace))
            if self.placement.rank == 0:
                write_json_atomic(self.args.trace, chrome_trace(traces))
        memory = {"per_rank": gather(self.memory.record())}
        self.report.close()
        return {"epochs": self.progress.history,
                "test": {"loss": test_loss, "accuracy": test_accuracy},
                "timing": timing,
                "memory": memory}

    def run_epoch(self, epoch):
        """One pass over this rank's shard of the training split; returns the epoch's record."""
        args = self.args
        shard = self.epoch_batches(epoch)
        first_step = self.progress.step_in_epoch  # a run resumed mid-epoch starts where it stopped
        steps = len(shard) - first_step
        samples_per_step = args.batch_size * args.accum_steps * self.placement.world_size
        progress_line = ProgressLine(self.report, epoch, steps, samples_per_step,
                                     args.progress_every)
        self.model.train()
        sums = TrainingSums(self.device)
        started = time.perf_counter()
        for step in range(first_step, len(shard)):
            self.train_one_step(step, shard[step].view(args.accum_steps, args.batch_size), sums)
            progress_line.step_done(step + 1 - first_step)
        train_time = time.perf_counter() - started
        self.guard.check_losses()
        self.schedule.after_epoch()
        record = self.finish_epoch(epoch, steps, sums, train_time)
        self.progress.epoch = epoch + 1
        self.progress.step_in_epoch = 0
        self.save_checkpoint()
        return record

    def epoch_batches(self, epoch):
        """This rank's rows of sample indices for `epoch` (data.shard_indices), cut by
        --max-steps, on the model's device: a GPU indexed by host indices copies them from
        pageable memory, which waits for the GPU to finish its queue, at every step."""
        args = self.args
        shard = shard_indices(len(self.train), args.batch_size * args.accum_steps,
                              self.placement.rank, self.placement.world_size, epoch, args.seed)
        if args.max_steps:
            shard = shard[:args.max_steps]
        return shard.to(self.device)

    def train_one_step(self, step, micro_batches, sums):
        """Step `step` of the epoch on `micro_batches` (rows of sample indices), timed, with what
        follows it; benchmarks/plain_loop.py times this against a plain PyTorch loop."""
        self.faults.exit_if_due(self.progress.global_step)
        # collectives timed between steps (a sharded model's evaluation and checkpoints gather
        # it) are no step's
        self.timer.comm.take()
        self.timer.start_step()
        loss = self.train_step(micro_batches, self.progress.global_step, sums)
        self.timer.end_step()
        self.after_step(step, loss)

    def load(self, batch):
        """A micro-batch's images and labels on the model's device."""
        images = self.train.images[batch].to(self.device, non_blocking=True)
        labels = self.train.labels[batch].to(self.device, non_blocking=True)
        self.faults.slow_down()  # --debug-slow-rank lags here, in the data phase
        return images, labels

    def after_step(self, step, loss):
        """What follows every step, off its reading path: the NaN watch and the periodic
        checkpoint."""
        self.guard.note_loss(loss, self.progress.global_step)
        self.progress.global_step += 1
        self.progress.step_in_epoch = step + 1
        every = self.args.checkpoint_every
        if every and self.progress.global_step % every == 0:
            self.save_checkpoint()
        every = self.args.check_sync_every
        if every and self.progress.global_step % every == 0:
            self.check_in_sync()

    def check_in_sync(self):
        """With --check-sync-every: every rank holds the same parameters, or every rank stops
        naming the first that differs (guards.check_in_sync)."""
        if self.placement.world_size == 1:
            return
        with self.model.replicated() as named:
            if named:
                check_in_sync(named, self.progress.global_step, self.device)

    def finish_epoch(self, epoch, steps, sums, train_time):
        """The epoch's record, appended to the history: the training sums of every rank,
        validation, and the timing of the epoch's measured steps. Rank 0 reports it."""
        world = self.placement.world_size
        steps_timed = self.timer.take_epoch()
        self.steps_timed += steps_timed
        own = {"loss_sum": sums.loss_sum.item(),
               "correct": sums.correct.item(),
               "samples": steps * self.args.batch_size * self.args.accum_steps,
               "train_time": train_time}
        for field in EPOCH_TIME_FIELDS:
            own[field] = sum(timed[field] for timed in steps_timed)
        total = sum_over_ranks(own, self.device)
        samples = total["samples"]
        epoch_time = total["train_time"] / world  # the ranks' mean
        val_loss, val_accuracy = evaluate(self.model, self.dataset.val, self.placement.rank, world,
                                          self.device)
        epoch_timing = summarize_ranks(gather(steps_timed))  # mean, median, p95 over every step
        record = {
            "epoch": epoch + 1,
            "steps": steps,
            "train_loss": total["loss_sum"] / max(samples, 1),
            "train_accuracy": total["correct"] / max(samples, 1),
            "val_loss": val_loss,
            "val_accuracy": val_accuracy,
            "epoch_time_s": epoch_time,
            **{f"{field}_s": total[field] / world for field in EPOCH_TIME_FIELDS},
            "samples_seen": self.progress.samples_seen + samples,
            "elapsed_s": self.progress.elapsed_s + epoch_time,
            "samples_per_s": samples / epoch_time if total["train_time"] else 0.0,
            "lr": self.optimizer.param_groups[0]["lr"],
            "timing": dict(epoch_timing["across_ranks"], straggler=epoch_timing["straggler"]),
        }
        self.progress.history.append(record)
        self.report.epoch(record)
        step_losses = sums.step_losses(self.args.accum_steps)
        self.report.scalars(record, steps_timed, step_losses, self.progress.global_step)
        return record

    def save_checkpoint(self):
        """With --checkpoint-dir: every rank takes part (its RNG state is gathered, and a sharded
        model and optimizer); rank 0 writes."""
        if not self.args.checkpoint_dir:
            return
        self.guard.check_losses()  # never save a diverged model over the last good one
        rng_per_rank = gather(checkpoint.rng_state())
        state = checkpoint.training_state(self, rng_per_rank, self.placement.world_size)
        if self.placement.rank == 0:
            checkpoint.save(self.args.checkpoint_dir, state, self.args.keep_checkpoints)

    def resume(self):
        """With --resume: continue from the newest readable checkpoint, if there is one."""
        folder = self.args.checkpoint_dir
        if not (self.args.resume and folder):
            return
        state, path = checkpoint.load_latest(folder, self.device)
        if state is None:
            self.report.log(f"no checkpoint in {folder}: starting from scratch")
            return
        rank, world_size = self.placement.rank, self.placement.world_size
        self.progress = checkpoint.restore_training(self, state, rank, world_size, path)
        self.report.log(f"resumed from {path}: epoch {self.progress.epoch + 1}, "
                        f"step {self.progress.step_in_epoch}")
