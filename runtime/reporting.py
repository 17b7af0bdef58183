"""What rank 0 tells: progress lines during an epoch, one line per epoch, and, with --tensorboard,
TensorBoard scalars. The other ranks stay silent."""
import time

from runtime.timing import COMM_FIELDS

TENSORBOARD_EPOCH_FIELDS = ("train_loss", "train_accuracy", "val_loss", "val_accuracy",
                            "samples_per_s")


class Report:
    """Rank 0's console lines and TensorBoard scalars."""

    def __init__(self, epochs, tensorboard_dir, rank):
        self.speaks = rank == 0
        self.epochs = epochs
        self.tensorboard = None
        if tensorboard_dir and self.speaks:
            from torch.utils.tensorboard import SummaryWriter  # optional: only with --tensorboard
            self.tensorboard = SummaryWriter(tensorboard_dir)

    def log(self, line):
        """Print `line` on rank 0."""
        if self.speaks:
            print(line, flush=True)

    def epoch(self, record):
        """The epoch's line: losses, accuracies, time and throughput, and where the time went."""
        self.log(f"epoch {record['epoch']}/{self.epochs} | "
                 f"train loss {record['train_loss']:.4f} "
                 f"acc {100 * record['train_accuracy']:.2f}% | "
                 f"val loss {record['val_loss']:.4f} acc {100 * record['val_accuracy']:.2f}% | "
                 f"{record['epoch_time_s']:.1f} s ({record['samples_per_s']:.0f} samples/s) | "
                 f"compute {record['compute_s']:.2f} s | comm {record['comm_busy_s']:.2f} s busy, "
                 f"{record['comm_hidden_s']:.2f} s hidden, "
                 f"{record['comm_exposed_s']:.2f} s exposed")

    def scalars(self, record, steps_timed, step_losses, global_step):
        """TensorBoard: each step's loss and timing (the steps end at `global_step`), and the
        epoch's record."""
        if self.tensorboard is None:
            return
        first_step = global_step - len(step_losses)
        for offset, loss in enumerate(step_losses):
            self.tensorboard.add_scalar("train/step_loss", loss, first_step + offset)
        first_timed = global_step - len(steps_timed)
        for offset, timed in enumerate(steps_timed):
            for field in ("compute",) + COMM_FIELDS:
                self.tensorboard.add_scalar(f"time/{field}_s", timed[field], first_timed + offset)
        for key in TENSORBOARD_EPOCH_FIELDS:
            self.tensorboard.add_scalar(f"epoch/{key}", record[key], record["epoch"])
        self.tensorboard.flush()

    def close(self):
        """Flush and close TensorBoard's files."""
        if self.tensorboard is not None:
            self.tensorboard.close()


class ProgressLine:
    """A line at most every `every_s` seconds of an epoch: steps done, samples/s, time left."""

    def __init__(self, report, epoch, steps, samples_per_step, every_s):
        self.report = report
        self.epoch = epoch
        self.steps = steps
        self.samples_per_step = samples_per_step
        self.every_s = every_s
        self.started = time.perf_counter()
        self.shown = self.started

    def step_done(self, done):
        """`done` of the epoch's steps are done: say so if the last line is old enough."""
        now = time.perf_counter()
        if now - self.shown < self.every_s:
            return
        self.shown = now
        elapsed = now - self.started
        rate = done * self.samples_per_step / elapsed
        left = elapsed / done * (self.steps - done)
        self.report.log(f"  epoch {self.epoch + 1} step {done}/{self.steps} | "
                        f"{rate:.0f} samples/s | ETA {left:.0f} s")
