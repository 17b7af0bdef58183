r"""Time to accuracy: wall-clock seconds from the start of training until the test accuracy first
reaches the target (MLP 98.0 %, CNN 99.0 %), ours at world sizes 1, 2 and 4 beside the classic
MNIST recipe, interleaved and repeated; medians and ratios to the recipe are printed.

    python -m benchmarks.time_to_accuracy                 # the full run: about 90 minutes
    python -m benchmarks.time_to_accuracy --models cnn --world-sizes 2 --repeats 1
    python -m benchmarks.time_to_accuracy --resume        # finish an interrupted run
    python -m benchmarks.time_to_accuracy --configs "bucketed=--mode manual --sync bucketed" \
        "ddp=--mode ddp" --world-sizes 2,4

The full run (--repeats 6, both models, world sizes 1, 2, 4) took 86 minutes on 2 cores: per
repeat the recipe 4-6 min (99 % after 170-300 s of training, the evaluations besides), our CNN
2.5-3.5 min per world size, our MLP under a minute per world size. Six repeats, because the
design document's verdicts take a bootstrap interval from 5.

Ours: mlp_ddp.py's model, wrappers, optimizer, schedule and in-memory data, on the CPU over
gloo; each step is the trainer's own (runtime/step.py's TrainingStep, so --accum-steps and --amp
count) with its timing marks off and no collective timed. Of what the trainer does around the
step (DDP's calibration, the NaN watch, checkpoints, progress lines) only the stop on a float16
wire overflow is kept (--compress fp16 without --amp fp16). Each model's settings (--mlp-options,
--cnn-options) are mlp_ddp.py options, except that --batch-size there is the global (micro-)batch,
split over the ranks, so every world size trains on the same samples at each step. World size 1
is one process, --mode single; each --configs entry (NAME=OPTIONS, OPTIONS added last), the
gradient sync under test, runs at every larger world size. The classic recipe (pytorch/examples
mnist/main.py: benchmarks/classic_mnist.py) runs in one process; its curve serves both targets.

Both train on all 60,000 training images and score the whole test split every 1/--evals-per-epoch
of an epoch with the same function, the clock paused meanwhile (benchmarks/accuracy_curve.py), so
the time to target is training time alone; each run reports its evaluation time (`evaluation_s`)
and set-up (`setup_s`) beside it. A run stops at its target or at the end of its epochs. After
every run: results/time-to-accuracy.json, its summary by time_to_accuracy_summary.py.
"""
import argparse
import json
import os
import platform
import shlex
import signal
import sys
import tempfile
import time
from types import SimpleNamespace

import torch

from benchmarks.accuracy_curve import Curve, evaluation_steps, time_to_target, write_part
from benchmarks.classic_mnist import CLASSIC, classic_rank
from benchmarks.common import int_list
from benchmarks.time_to_accuracy_summary import print_summary, summarise
from runtime import data
from runtime import device as devices
from runtime.across_ranks import sum_over_ranks
from runtime.guards import DivergenceGuard
from runtime.launch import Placement, free_port, launch_local, process_group, threads_per_rank
from runtime.models import build_model
from runtime.optimizers import build_optimizer, steps_per_epoch
from runtime.options import OneLineParser
from runtime.options import parse_args as parse_training_options
from runtime.results import write_json_atomic
from runtime.step import Precision, TrainingStep
from runtime.wrappers import SyncOptions, wrap_model

SCHEMA = "time-to-accuracy/1"
TARGETS = {"mlp": 0.98, "cnn": 0.99}
# Ours, per model (mlp_ddp.py options; --batch-size is the global batch). Chosen with this script:
# see benchmarks/README.md.
OURS = {
    "mlp": "--batch-size 256 --lr-schedule onecycle --lr 3e-3 --epochs 5",
    "cnn": "--batch-size 128 --lr-schedule onecycle --lr 3e-3 --epochs 3",
}
# the fastest sync on one machine (design_doc §4.5: the step benchmark)
CONFIGS = ("flat-shm=--mode manual --sync flat --transport shm",)
EVALUATION = ("the whole test split every 1/evals_per_epoch of an epoch, by the same function on "
              "both sides; the clock is paused during it (evaluation_s, per run, is separate)")


def ours_rank(placement, job):
    """One rank of one of our runs: the trainer's step in a loop that scores the test split at the
    evaluation points and stops at the target; rank 0 writes the run's part to job.part_path."""
    begun = time.perf_counter()
    args = job.options
    world = job.world_size
    if world == 1:
        placement = Placement()  # one process, no process group
    torch.set_num_threads(threads_per_rank(args.threads, world))
    torch.manual_seed(args.seed + placement.rank)
    plan = devices.plan(args.device, "auto", placement.local_world_size)
    device = plan.for_rank(placement.local_rank)
    with process_group(placement, plan.backend, args.timeout):
        dataset = data.load(args.dataset, args.data_dir, 0, args.train_samples,
                            args.test_samples, args.seed)
        train = dataset.train.to(device)  # as the trainer: batches indexed where the data is
        model = build_model(args.model, args.hidden_sizes, args.dropout).to(device)
        device_ids = [device.index] if device.type == "cuda" else None
        wrapped = wrap_model(model, SyncOptions.from_args(args), device_ids=device_ids)
        steps = steps_per_epoch(len(dataset.train), args, world)
        optimizer, schedule = build_optimizer(wrapped, args, steps)
        precision = Precision(args.amp, device)
        # the trainer's float16-wire stop; its NaN watch is left out (a diverged run: not reached)
        guard = DivergenceGuard(device, args.compress, precision.scaler.is_enabled())
        train_step = TrainingStep(wrapped, optimizer, schedule, batch_loader(train), precision,
                                  guard=guard)
        evaluate_after = evaluation_steps(steps, job.evals_per_epoch)
        samples_per_step = args.batch_size * args.accum_steps  # this rank's
        setup_s = time.perf_counter() - begun
        sum_over_ranks({"ready": 1}, device)  # every rank starts the clock together
        curve = Curve(wrapped, dataset.test, placement, job.target, samples_per_step * world)
        wrapped.train()
        for epoch in range(args.epochs):
            shard = data.shard_indices(len(dataset.train), samples_per_step, placement.rank,
                                       world, epoch, args.seed)[:steps].to(device)
            for step, indices in enumerate(shard, 1):
                # as the trainer does: a row of the shard is the step's micro-batches
                train_step(indices.view(args.accum_steps, args.batch_size), curve.steps)
                curve.step_done()
                if step in evaluate_after and curve.evaluate(epoch + step / steps):
                    break
            if curve.reached:
                break
            schedule.after_epoch()
        if placement.rank == 0:
            write_part(job.part_path, curve, setup_s)


def batch_loader(split):
    """TrainingStep's `load` for the in-memory `split`: a micro-batch of sample indices becomes
    (images, labels), indexed where the data already is (the indices are there too)."""
    return lambda indices: (split.images[indices], split.labels[indices])


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
    argv = ["--model", model, "--val-samples", "0", "--data-dir", args.data_dir, "--device",
            args.device,
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
    add("--repeats", type=int, default=6)
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
    add("--device", choices=devices.DEVICES, default="auto",
        help="where ours and the recipe train (mlp_ddp.py's --device)")
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


def options_text(args, model, options):
    """A run's options as its record gives them: ours are the model's settings, then the
    config's; the recipe has none (None)."""
    return options if model is None else args.model_options[model] + " " + options


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
        job.device = args.device
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
    reached = {each: time_to_target(part["curve"], target) for each, target in targets.items()}
    return {"model": model, "name": name, "world_size": world, "repeat": repeat, "seed": seed,
            "options": options_text(args, model, options),
            **part,
            "time_to_target_s": {each: found[0] for each, found in reached.items()},
            "samples_to_target": {each: found[1] for each, found in reached.items()}}


def key(record):
    """What identifies a run across a resumed benchmark."""
    return (record["model"], record["name"], record["world_size"], record["repeat"],
            record["options"])


def main(argv=None):
    """Run every repeat's runs interleaved, writing the results after each; 1 if a run failed."""
    args = parse_args(argv)
    # SIGTERM as an exception, so that launch_local's clean-up stops the ranks of the run too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    data.fetch("mnist", args.data_dir, args.offline_data_dir)
    environment = {"torch": torch.__version__, "python": platform.python_version(),
                   "platform": platform.platform(), "cores": os.cpu_count(),
                   "cores_available": len(os.sched_getaffinity(0)), "device": args.device,
                   "load_average_1min_at_start": os.getloadavg()[0]}
    config = {name: value for name, value in vars(args).items() if name != "offline_data_dir"}
    records = []
    if args.resume and os.path.isfile(args.output):
        with open(args.output) as file:
            records = json.load(file).get("runs", [])
    done = {key(record) for record in records}
    plan = planned_runs(args)
    targets = {model: args.targets[model] for model in args.models}
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            shift = repeat % len(plan)  # each repeat starts with another run: interleaved
            for planned in plan[shift:] + plan[:shift]:
                model, name, world, options = planned
                label = f"repeat {repeat + 1}/{args.repeats}: {name} {model or ''} world {world}"
                if (model, name, world, repeat, options_text(args, model, options)) in done:
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
                    "summary": summarise(records, plan, targets)})
    print_summary(summarise(records, plan, targets))
    print(f"\nresults: {args.output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
