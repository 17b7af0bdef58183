r"""Time to accuracy: wall-clock seconds from the start of training until the test accuracy first
reaches the target (MLP 98.0 %, CNN 99.0 %), ours at world sizes 1, 2 and 4 beside the classic
MNIST recipe, interleaved and repeated; medians and ratios to the recipe are printed.

    python -m benchmarks.time_to_accuracy                 # the full run: about 40 minutes
    python -m benchmarks.time_to_accuracy --models cnn --world-sizes 2 --repeats 1
    python -m benchmarks.time_to_accuracy --resume        # finish an interrupted run
    python -m benchmarks.time_to_accuracy --configs "bucketed=--mode manual --sync bucketed" \
        "ddp=--mode ddp" --world-sizes 2,4

The full run (--repeats 3, both models, world sizes 1, 2, 4) on a quiet 2-core machine: per
repeat the recipe about 3.5 min (99 % after about 2.5 epochs of 71 s), our CNN 2-2.5 min per
world size, our MLP under a minute per world size: about 40 min; on a busy machine up to twice.

Ours: mlp_ddp.py's model, wrappers (runtime/modes.py), optimizer and schedule
(runtime/optimizers.py) and in-memory data, in a loop that is the trainer's step without its
instrumentation. Each model's settings (--mlp-options, --cnn-options) are mlp_ddp.py options,
except that --batch-size there is the global batch, split over the ranks, so every world size
trains on the same samples at each step. World size 1 is one process, --mode single; each
--configs entry (NAME=OPTIONS, OPTIONS added last) runs at every larger world size: the
gradient sync under test (e.g. "shm=--mode manual --sync shm").
The classic recipe (pytorch/examples mnist/main.py), as usually written: its Net (conv 32, conv
64, max-pool, dropout 0.25, fc 128, dropout 0.5, fc 10, log-softmax: the same layers as our
CNN), Adadelta lr 1.0, StepLR gamma 0.7 every epoch, batch 64, a torchvision DataLoader with
ToTensor and Normalize((0.1307,), (0.3081,)), in one process. The loader shuffles, as main.py's
does on a GPU (on a CPU main.py leaves shuffle off, a quirk not copied), and has no worker
processes, as main.py's on a CPU. Its curve serves both targets.

Both train on all 60,000 training images. Evaluation: every 1/--evals-per-epoch of an epoch on
the whole test split, by the same function (runtime.metrics.evaluate, in-memory tensors normalised
as Normalize does) on both sides; the clock is paused while it runs, so the time to target is
training time alone, and each run reports its evaluation time (`evaluation_s`) separately, as
it does the set-up before training (`setup_s`: data loading, model, process group). A run stops
at its target or at the end of its epochs. Writes results/time-to-accuracy.json after every run.
"""
import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common import int_list
from runtime import data
from runtime.collectives import sum_over_ranks
from runtime.launch import Placement, free_port, launch_local, process_group, threads_per_rank
from runtime.metrics import evaluate
from runtime.models import build_model
from runtime.modes import wrap_model
from runtime.optimizers import build_optimizer, steps_per_epoch
from runtime.options import OneLineParser
from runtime.options import parse_args as parse_training_options
from runtime.results import write_json_atomic
from runtime.timing import CommRecorder

SCHEMA = "time-to-accuracy/1"
TARGETS = {"mlp": 0.98, "cnn": 0.99}
# Ours, per model (mlp_ddp.py options; --batch-size is the global batch). Chosen with this script:
# see benchmarks/README.md.
OURS = {
    "mlp": "--batch-size 256 --lr-schedule onecycle --lr 3e-3 --epochs 5",
    "cnn": "--batch-size 128 --lr-schedule onecycle --lr 3e-3 --epochs 3",
}
# the fastest sync on one machine (design_doc §4.7: the step benchmark and results/one-machine/)
CONFIGS = ("shm=--mode manual --sync shm",)
TARGET = "our CNN's time to its target test accuracy is at most 0.5x the classic recipe's"
CLASSIC = "classic"
EVALUATION = ("the whole test split every 1/evals_per_epoch of an epoch, by the same function on "
              "both sides; the clock is paused during it (evaluation_s, per run, is separate)")


def time_to_target(curve, target):
    """The first point of `curve` ([{"time_s", "samples", "test_accuracy"}, ...], in order) whose
    accuracy reaches `target`: (time_s, samples), or (None, None) when none does."""
    for point in curve:
        if point["test_accuracy"] >= target:
            return point["time_s"], point["samples"]
    return None, None


def median_or_none(times):
    """The median of repeated times to target, a repeat that never reached it counting as
    infinitely slow; None when that median is infinite (or there are no repeats)."""
    if not times:
        return None
    middle = statistics.median(float("inf") if time is None else time for time in times)
    return None if middle == float("inf") else middle


class ClassicNet(nn.Module):
    """pytorch/examples mnist/main.py's Net, as written there."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


class Curve:
    """Test accuracy against training time: the clock runs only between evaluations."""

    def __init__(self, model, test, placement, target, samples_per_step):
        self.model = model
        self.test = test
        self.placement = placement
        self.target = target
        self.samples_per_step = samples_per_step
        self.points = []
        self.steps = 0
        self.training_s = 0.0
        self.evaluation_s = 0.0
        self.started = time.perf_counter()

    def step_done(self):
        self.steps += 1

    def evaluate(self, epoch):
        """Pause the clock, score the test split, restart; returns whether the target is reached
        (the accuracy is reduced over ranks, so every rank answers the same)."""
        paused = time.perf_counter()
        self.training_s += paused - self.started
        _, accuracy = evaluate(self.model, self.test, self.placement.rank,
                               self.placement.world_size, torch.device("cpu"))
        self.model.train()
        self.points.append({"time_s": self.training_s, "samples": self.steps
                            * self.samples_per_step, "epoch": epoch, "test_accuracy": accuracy})
        self.started = time.perf_counter()
        self.evaluation_s += self.started - paused
        return accuracy >= self.target


def evaluation_steps(steps, per_epoch):
    """The steps of an epoch (1-based) after which the test split is scored: `per_epoch` evenly
    spaced, the last one at the epoch's end."""
    return {round(steps * index / per_epoch) for index in range(1, per_epoch + 1)} - {0}


def ours_rank(placement, job):
    """One rank of one of our runs; rank 0 writes the run's part to job.part_path."""
    begun = time.perf_counter()
    args = job.options
    world = job.world_size
    if world == 1:
        placement = Placement()  # one process, no process group
    torch.set_num_threads(threads_per_rank(args.threads, world))
    torch.manual_seed(args.seed + placement.rank)
    with process_group(placement, "gloo", args.timeout):
        dataset = data.load(args.dataset, args.data_dir, 0, args.train_samples,
                            args.test_samples, args.seed)
        model = build_model(args.model, args.hidden_sizes, args.dropout)
        recorder = CommRecorder()
        wrapped = wrap_model(model, args.mode, recorder, args.sync, args.bucket_mb, args.compress)
        steps = steps_per_epoch(len(dataset.train), args, world)
        optimizer, schedule = build_optimizer(model, args, steps)
        evaluate_after = evaluation_steps(steps, job.evals_per_epoch)
        setup_s = time.perf_counter() - begun
        sum_over_ranks({"ready": 1}, torch.device("cpu"))  # every rank starts the clock together
        curve = Curve(wrapped, dataset.test, placement, job.target, args.batch_size * world)
        reached = False
        wrapped.train()
        for epoch in range(args.epochs):
            shard = data.shard_indices(len(dataset.train), args.batch_size, placement.rank, world,
                                       epoch, args.seed)[:steps]
            for step, batch in enumerate(shard, 1):
                # the trainer's train_step, without its timer marks and guards
                loss = F.cross_entropy(wrapped(dataset.train.images[batch]),
                                       dataset.train.labels[batch])
                loss.backward()
                wrapped.finish_gradient_synchronization()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                recorder.take()  # the spans are not needed: keep the list from growing
                schedule.after_step()
                curve.step_done()
                if step in evaluate_after and curve.evaluate(epoch + step / steps):
                    reached = True
                    break
            if reached:
                break
            schedule.after_epoch()
        if placement.rank == 0:
            write_part(job, curve, setup_s)


def classic_rank(placement, job):
    """The classic recipe in one process; writes the run's part to job.part_path."""
    begun = time.perf_counter()
    torchvision = data.import_torchvision()
    transforms = torchvision.transforms
    torch.set_num_threads(threads_per_rank(0, 1))
    torch.manual_seed(job.seed)
    transform = transforms.Compose([transforms.ToTensor(),
                                    transforms.Normalize((0.1307,), (0.3081,))])
    train_set = torchvision.datasets.MNIST(job.data_dir, train=True, download=False,
                                           transform=transform)
    loader = torch.utils.data.DataLoader(train_set, batch_size=64, shuffle=True)
    test = data.load("mnist", job.data_dir, 0, 0, job.test_samples, job.seed).test
    model = ClassicNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    evaluate_after = evaluation_steps(len(loader), job.evals_per_epoch)
    curve = Curve(model, test, Placement(), job.target, 64)
    setup_s = time.perf_counter() - begun
    curve.started = time.perf_counter()
    model.train()
    for epoch in range(job.epochs):
        for step, (images, labels) in enumerate(loader, 1):
            optimizer.zero_grad()
            loss = F.nll_loss(model(images), labels)
            loss.backward()
            optimizer.step()
            curve.step_done()
            if step in evaluate_after and curve.evaluate(epoch + step / len(loader)):
                write_part(job, curve, setup_s)
                return
        scheduler.step()
    write_part(job, curve, setup_s)


def write_part(job, curve, setup_s):
    """The run's measurements, for the launcher to read."""
    write_json_atomic(job.part_path, {"curve": curve.points, "evaluation_s": curve.evaluation_s,
                                      "setup_s": setup_s, "threads_per_rank":
                                      torch.get_num_threads()})


def planned_runs(args):
    """Every run of one repeat: (model, name, world size, options) for ours, and the classic
    recipe's (None, "classic", 1, None)."""
    runs = [(None, CLASSIC, 1, None)] if args.classic else []
    for model in args.models:
        for world in args.world_sizes:
            configs = [("single", "--mode single")] if world == 1 else args.configs
            for name, options in configs:
                runs.append((model, name, world, options))
    return runs


def parse_config(text):
    """An argparse type: NAME=OPTIONS, OPTIONS being mlp_ddp.py's."""
    name, equals, options = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=OPTIONS, got {text!r}")
    return name, options


def training_options(args, model, options, world, seed):
    """mlp_ddp.py's parsed options for one of our runs, --batch-size made per rank; a bad option
    ends the program with mlp_ddp.py's one line and exit code 2."""
    argv = ["--model", model, "--val-samples", "0", "--data-dir", args.data_dir,
            "--test-samples", str(args.test_samples), "--seed", str(seed),
            *shlex.split(args.model_options[model]), *shlex.split(options)]
    parsed = parse_training_options(argv)
    if parsed.batch_size % world:
        print(f"error: {model}: the global batch {parsed.batch_size} does not divide over "
              f"{world} ranks", file=sys.stderr)
        sys.exit(2)
    parsed.batch_size //= world
    return parsed


def parse_args(argv=None):
    """The options, checked: a bad one is one line and exit code 2."""
    parser = OneLineParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--models", type=lambda text: text.split(","), default=["cnn", "mlp"], help="cnn,mlp")
    add("--world-sizes", type=int_list, default=[1, 2, 4], help="e.g. 1,2,4")
    add("--configs", type=parse_config, nargs="+", default=[parse_config(c) for c in CONFIGS],
        help="NAME=OPTIONS: the gradient sync at world sizes above 1")
    add("--repeats", type=int, default=3)
    add("--no-classic", dest="classic", action="store_false", help="leave the recipe out")
    add("--classic-epochs", type=int, default=6, help="the recipe stops here at the latest")
    add("--evals-per-epoch", type=int, default=4)
    add("--mlp-options", default=OURS["mlp"], help="ours, MLP (--batch-size: global)")
    add("--cnn-options", default=OURS["cnn"], help="ours, CNN (--batch-size: global)")
    add("--mlp-target", type=float, default=TARGETS["mlp"])
    add("--cnn-target", type=float, default=TARGETS["cnn"])
    add("--test-samples", type=int, default=0, help="0: the whole test split")
    add("--seed", type=int, default=0, help="repeat r uses seed + r")
    add("--data-dir", default="data")
    add("--offline-data-dir", default=os.environ.get("OFFLINE_DATA_DIR"))
    add("--output", default="results/time-to-accuracy.json")
    add("--resume", action="store_true", help="keep the runs already in --output, run the rest")
    args = parser.parse_args(argv)
    unknown = set(args.models) - set(TARGETS)
    if unknown:
        parser.error(f"unknown model {', '.join(sorted(unknown))}; choose from mlp, cnn")
    if min(args.world_sizes) < 1 or args.repeats < 1 or args.classic_epochs < 1 \
            or args.evals_per_epoch < 1 or args.test_samples < 0:
        parser.error("world sizes, --repeats, --classic-epochs, --evals-per-epoch must be >= 1")
    if not all(0 < target <= 1 for target in (args.mlp_target, args.cnn_target)):
        parser.error("a target is a fraction in (0, 1]")
    args.model_options = {"mlp": args.mlp_options, "cnn": args.cnn_options}
    args.targets = {"mlp": args.mlp_target, "cnn": args.cnn_target}
    for model, _, world, options in planned_runs(args):
        if options is not None:  # every run's options are checked before the first starts
            training_options(args, model, options, world, args.seed)
    return args


def run_one(args, planned, repeat, folder):
    """One run in fresh processes; its record, or None (after a line on stderr) if it failed."""
    model, name, world, options = planned
    seed = args.seed + repeat
    job = SimpleNamespace(world_size=world, evals_per_epoch=args.evals_per_epoch, seed=seed,
                          part_path=os.path.join(folder, "part.json"))
    if model is None:  # the recipe runs until it reaches the highest target asked for
        targets = {each: args.targets[each] for each in args.models}
        job.target = max(targets.values())
        job.epochs = args.classic_epochs
        job.data_dir = args.data_dir
        job.test_samples = args.test_samples
        worker = classic_rank
    else:
        targets = {model: args.targets[model]}
        job.target = targets[model]
        job.options = training_options(args, model, options, world, seed)
        worker = ours_rank
    failure = launch_local(worker, world, job, free_port())
    if failure:
        print(f"error: {name} {model} world {world}: rank {failure[0]} failed (exit code "
              f"{failure[1]})", file=sys.stderr)
        return None
    with open(job.part_path) as file:
        part = json.load(file)
    reached = {each: time_to_target(part["curve"], target)
               for each, target in targets.items()}
    return {"model": model, "name": name, "world_size": world, "repeat": repeat, "seed": seed,
            "options": options if model is None else (args.model_options[model] + " " + options),
            **part,
            "time_to_target_s": {each: found[0] for each, found in reached.items()},
            "samples_to_target": {each: found[1] for each, found in reached.items()}}


def key(record):
    """What identifies a run across a resumed benchmark."""
    return record["model"], record["name"], record["world_size"], record["repeat"], \
        record["options"]


def summarise(args, records):
    """Per model and configuration: the median time to target, and its ratio to the recipe's
    median time to the same target."""
    rows = []
    for model in args.models:
        classic = [record["time_to_target_s"][model] for record in records
                   if record["name"] == CLASSIC and model in record["time_to_target_s"]]
        classic_median = median_or_none(classic)
        groups = [(CLASSIC, 1, classic)] if classic else []
        for _, name, world, _ in planned_runs(args):
            times = [record["time_to_target_s"][model] for record in records
                     if (record["model"], record["name"], record["world_size"])
                     == (model, name, world)]
            if times and (name, world) not in [(group[0], group[1]) for group in groups]:
                groups.append((name, world, times))
        for name, world, times in groups:
            median = median_or_none(times)
            ratio = None
            if median is not None and classic_median:
                ratio = median / classic_median
            rows.append({"model": model, "target": args.targets[model], "name": name,
                         "world_size": world, "times_to_target_s": times,
                         "median_time_to_target_s": median, "ratio_to_classic": ratio})
    return rows


def print_summary(rows):
    """The medians and ratios as a table, then the target's verdict."""
    print(f"\n{'model':>5} {'target':>6} {'config':>10} {'world':>5} {'median s':>9} "
          f"{'x classic':>9}  repeats (s)")
    for row in rows:
        median = row["median_time_to_target_s"]
        ratio = row["ratio_to_classic"]
        times = ", ".join("-" if time is None else f"{time:.1f}"
                          for time in row["times_to_target_s"])
        print(f"{row['model']:>5} {100 * row['target']:>5.1f}% {row['name']:>10} "
              f"{row['world_size']:>5} {'-' if median is None else f'{median:.1f}':>9} "
              f"{'-' if ratio is None else f'{ratio:.2f}':>9}  {times}")
    print("(training time to the first evaluation at or above the target, evaluation excluded;"
          " -: not reached)")
    print(f"\ntarget: {TARGET}")
    for row in rows:
        if row["model"] == "cnn" and row["name"] != CLASSIC:
            holds = row["ratio_to_classic"] is not None and row["ratio_to_classic"] <= 0.5
            print(f"  {row['name']} world {row['world_size']}: "
                  f"{'holds' if holds else 'does not hold'}")


def main(argv=None):
    """Run every repeat's runs interleaved, writing the results after each; 1 if a run failed."""
    args = parse_args(argv)
    # SIGTERM as an exception, so that launch_local's clean-up stops the ranks of the run too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    data.fetch("mnist", args.data_dir, args.offline_data_dir)
    environment = {"torch": torch.__version__, "python": platform.python_version(),
                   "platform": platform.platform(), "cores": os.cpu_count(),
                   "cores_available": len(os.sched_getaffinity(0)), "backend": "gloo",
                   "load_average_1min_at_start": os.getloadavg()[0]}
    config = {name: value for name, value in vars(args).items() if name != "offline_data_dir"}
    records = []
    if args.resume and os.path.isfile(args.output):
        with open(args.output) as file:
            records = json.load(file).get("runs", [])
    done = {key(record) for record in records}
    plan = planned_runs(args)
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            shift = repeat % len(plan)  # each repeat starts with another run: interleaved
            for planned in plan[shift:] + plan[:shift]:
                model, name, world, options = planned
                label = f"repeat {repeat + 1}/{args.repeats}: {name} {model or ''} world {world}"
                options_text = options if model is None else \
                    args.model_options[model] + " " + options
                if (model, name, world, repeat, options_text) in done:
                    print(f"{label}: kept from {args.output}", flush=True)
                    continue
                record = run_one(args, planned, repeat, folder)
                if record is None:
                    failed = True
                    continue
                times = ", ".join(f"{each} {'-' if time is None else f'{time:.1f} s'}"
                                  for each, time in record["time_to_target_s"].items())
                print(f"{label}: time to target {times}", flush=True)
                records.append(record)
                write_json_atomic(args.output, {
                    "schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "environment": environment, "config": config, "evaluation": EVALUATION,
                    "targets": args.targets, "runs": records,
                    "summary": summarise(args, records)})
    print_summary(summarise(args, records))
    print(f"\nresults: {args.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
