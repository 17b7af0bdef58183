"""Our training step against a plain PyTorch loop, in one process, on the CPU or a GPU.

The plain loop is what a user writes (pytorch/examples' mnist): the same model and batch, Adam
as torch builds it by default, the data already on the device and each batch indexed there. Ours
is the trainer's own step (Trainer.train_one_step: the timer's stamps, the training sums, the NaN
watch, the learning-rate schedule) in mode single, and in a process group of one (NCCL on a GPU,
gloo on the CPU, as `--world-size 1` runs) under DDP and the bucketed manual sync. The
configurations take turns, a block of --steps steps each, for --repeats rounds; a block is timed
from one device synchronisation to the next, so a GPU's queue is counted whole and nothing inside
a block waits for it. Per configuration: the median over rounds of a block's time per step, and
its ratio to the plain loop's.

    python -m benchmarks.step_bench --plain-loop                  (a GPU if torch sees one)
    python -m benchmarks.step_bench --plain-loop --device cpu --models mlp --steps 20
Writes results/plain-loop.json (or --output).
"""
import os
import platform
import tempfile
import time
from statistics import median

import torch
import torch.distributed as dist
from torch.nn.functional import cross_entropy

from runtime import device as devices
from runtime import torch_compat
from runtime.data import Data, Split, shard_indices
from runtime.launch import Placement, free_port, threads_per_rank
from runtime.metrics import TrainingSums
from runtime.models import build_model
from runtime.optimizers import build_optimizer
from runtime.options import parse_args
from runtime.results import write_json_atomic
from runtime.timing import StepTimer
from runtime.trainer import Trainer
from runtime.wrappers import SyncOptions, wrap_model

SCHEMA = "plain-loop/1"
DEFAULT_OUTPUT = "results/plain-loop.json"
SAMPLES = 8192  # random samples of MNIST's shape: the step's compute does not depend on them
OURS = ("single", "ddp", "manual")  # --mode values; manual with its default sync, bucketed


def random_data(samples, seed):
    """Random images and labels in every split."""
    generator = torch.Generator().manual_seed(seed)
    split = Split(torch.randn(samples, 1, 28, 28, generator=generator),
                  torch.randint(0, 10, (samples,), generator=generator))
    return Data(split, split, split)


class PlainLoop:
    """pytorch/examples' step: zero the gradients, forward, loss, backward, the optimizer step."""

    def __init__(self, model_name, split, seed):
        torch.manual_seed(seed)
        self.images, self.labels = split.images, split.labels
        self.model = build_model(model_name).to(self.images.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)

    def __call__(self, step, indices):
        self.optimizer.zero_grad(set_to_none=True)
        loss = cross_entropy(self.model(self.images[indices]), self.labels[indices])
        loss.backward()
        self.optimizer.step()

    def between_blocks(self):
        """Nothing kept between blocks."""


class OurStep:
    """The trainer of an mlp_ddp.py run in `mode`, stepped one batch at a time."""

    def __init__(self, mode, model_name, dataset, batch_size, rank_device, seed):
        args = parse_args(["--mode", mode, "--model", model_name, "--batch-size", str(batch_size),
                           "--epochs", "1", "--check-sync-every", "0", "--warmup-steps", "0",
                           "--results-dir", tempfile.gettempdir()])
        torch.manual_seed(seed)
        model = build_model(model_name).to(rank_device)
        self.timer = StepTimer(rank_device)
        device_ids = [rank_device.index] if rank_device.type == "cuda" else None
        wrapped = wrap_model(model, SyncOptions.from_args(args), self.timer.comm, device_ids)
        optimizer, schedule = build_optimizer(wrapped, args, len(dataset.train) // batch_size)
        placement = Placement(launcher="single" if mode == "single" else "local")
        self.trainer = Trainer(wrapped, optimizer, schedule, dataset, args, placement, self.timer)
        self.sums = TrainingSums(rank_device)

    def __call__(self, step, indices):
        self.trainer.train_one_step(step, indices.view(1, -1), self.sums)

    def between_blocks(self):
        """Read the block's stamps, as the trainer does after an epoch (outside the timing)."""
        self.timer.take_epoch()
        self.sums = TrainingSums(self.sums.loss_sum.device)


def synchronize(rank_device):
    """Wait for the device's queue (nothing to wait for on the CPU)."""
    if rank_device.type == "cuda":
        torch.cuda.synchronize(rank_device)


def time_block(step_function, batches, first, steps, rank_device):
    """Seconds per step of `steps` steps from step `first`, the device's queue included."""
    synchronize(rank_device)
    started = time.perf_counter()
    for step in range(first, first + steps):
        step_function(step, batches[step % len(batches)])
    synchronize(rank_device)
    return (time.perf_counter() - started) / steps


def bench_model(model_name, args, rank_device):
    """{configuration: [seconds per step of each round]} for the plain loop and OURS."""
    dataset = random_data(SAMPLES, args.seed)
    on_device = dataset.train.to(rank_device)
    batches = shard_indices(SAMPLES, args.batch_size, 0, 1, 0, args.seed).to(rank_device)
    runs = {"plain": PlainLoop(model_name, on_device, args.seed)}
    runs.update({mode: OurStep(mode, model_name, dataset, args.batch_size, rank_device, args.seed)
                 for mode in OURS})
    names = list(runs)
    for name in names:  # warm-up: allocator, kernels' first launches, DDP's bucket rebuild
        time_block(runs[name], batches, 0, max(args.warmup, 1), rank_device)
        runs[name].between_blocks()
    seconds = {name: [] for name in names}
    for round_number in range(args.repeats):
        for turn in range(len(names)):  # who goes first rotates
            name = names[(round_number + turn) % len(names)]
            first = args.warmup + round_number * args.steps
            seconds[name].append(time_block(runs[name], batches, first, args.steps, rank_device))
            runs[name].between_blocks()
    return seconds


def summarize(model_name, seconds, batch_size):
    """One row per configuration: the median step, its range, samples/s, and ours / plain."""
    plain = median(seconds["plain"])
    return [{"model": model_name, "configuration": name, "per_round_s": values,
             "median_step_s": median(values), "min_step_s": min(values),
             "max_step_s": max(values), "samples_per_s": batch_size / median(values),
             "ratio_to_plain": median(values) / plain}
            for name, values in seconds.items()]


def print_rows(rows, where):
    """The table: median ms per step (min-max), samples/s, and the ratio to the plain loop."""
    print(f"\nour step against a plain PyTorch loop, on {where}")
    print(f"{'model':>5} {'configuration':>13} {'ms/step (min-max)':>24} {'samples/s':>10} "
          f"{'x plain':>8}")
    for row in rows:
        spread = (f"{row['median_step_s'] * 1e3:.3f} ({row['min_step_s'] * 1e3:.3f}-"
                  f"{row['max_step_s'] * 1e3:.3f})")
        print(f"{row['model']:>5} {row['configuration']:>13} {spread:>24} "
              f"{row['samples_per_s']:>10.0f} {row['ratio_to_plain']:>8.2f}")


def run(args):
    """The whole comparison for every model of `args` (step_bench's options); returns 0."""
    plan = devices.plan(args.device, "auto", 1)
    rank_device = plan.for_rank(0)
    torch.set_num_threads(threads_per_rank(args.threads, 1))
    dist.init_process_group(plan.backend, init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1)
    try:
        rows = []
        for model_name in args.models:
            rows += summarize(model_name, bench_model(model_name, args, rank_device),
                              args.batch_size)
    finally:
        torch_compat.destroy_process_group()
    where = plan.describe(1)
    print_rows(rows, where)
    output = DEFAULT_OUTPUT if args.output == "results/step-bench.json" else args.output
    environment = {"torch": torch.__version__, "python": platform.python_version(),
                   "platform": platform.platform(), "device": str(rank_device),
                   "described": where, "threads": torch.get_num_threads(),
                   "cores_available": len(os.sched_getaffinity(0))}
    config = {key: getattr(args, key) for key in ("models", "batch_size", "steps", "warmup",
                                                    "repeats", "seed", "device")}
    write_json_atomic(output, {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "environment": environment, "config": config, "rows": rows})
    print(f"\nresults: {output}")
    return 0
