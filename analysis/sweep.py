"""The scaling sweep in one command: every mode and strategy at every world size, repeated, then
the plots.

    python -m analysis.sweep             # the full default sweep (see DEFAULT_* for its size)
    python -m analysis.sweep --dry-run   # print the commands only
    python -m analysis.sweep --models mlp --world-sizes 1,2 --strategies flat --repeats 1

Runs mlp_ddp.py one job at a time: per model the single process, then at each world size ddp,
ddp-no-sync (the compute baseline) and each manual strategy; then bucketed and ddp at each
--bucket-mbs at the largest world size (MLP only). Each round runs every configuration in an order
shuffled from --order-seed, recorded in <results-dir>/sweep-order.json. A stable --run-name
(sweep-mlp-manual-flat-w4-r2) makes a re-run replace its file; a failed run is reported and the
sweep goes on (exit code 1). The default, 6 rounds of 38 runs, took 35 minutes on 2 cores.
"""
import argparse
import os
import random
import shlex
import subprocess
import sys
import time

from analysis import plots
from runtime.options import MANUAL_CONFIGURATIONS, comma_list, manual_arguments
from runtime.results import write_json_atomic

MANUAL_NAMES = tuple(MANUAL_CONFIGURATIONS)  # --strategies: (--sync, --transport) by name

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Sized by timing short runs on 2 cores: most of a short run is start-up.
DEFAULT_MLP_STEPS = 100  # per epoch; the first 5 steps of a run are warm-up, left out of the timing
DEFAULT_CNN_STEPS = 20  # a CNN step is about 10 MLP steps
DEFAULT_EPOCHS = 2  # two points per learning curve
DEFAULT_REPEATS = 6  # from 5 the verdicts need a bootstrap interval of the paired ratios
ORDER_FILE, ORDER_SCHEMA = "sweep-order.json", "sweep-order/1"
DEFAULT_EVAL_SAMPLES = ("--val-samples", "2000", "--test-samples", "2000")


def parse_args(argv=None):
    """The sweep's options; a usage error for an unknown strategy or fewer than one repeat."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--models", type=comma_list(str), default=["mlp", "cnn"])
    add("--world-sizes", type=comma_list(int), default=[1, 2, 4])
    add("--strategies", type=comma_list(str), default=MANUAL_NAMES,
        help="manual configurations: each --sync over the library, and flat-ring and flat-shm "
             "(the flat buffer over the ring and over shared memory)")
    add("--bucket-mbs", type=comma_list(float), default=[0.25, 1, 4, 25],
        help="bucket sweep sizes ('' for none)")
    add("--max-steps", type=int, default=DEFAULT_MLP_STEPS, help="MLP steps per epoch")
    add("--cnn-max-steps", type=int, default=DEFAULT_CNN_STEPS, help="CNN steps per epoch")
    add("--epochs", type=int, default=DEFAULT_EPOCHS)
    add("--repeats", type=int, default=DEFAULT_REPEATS,
        help="runs of every configuration, interleaved")
    add("--order-seed", type=int, default=0, help="seeds each round's shuffled order")
    add("--train-samples", type=int, default=0, help="training subset (0: all)")
    add("--results-dir", default="results")
    add("--extra", default="",
        help='more mlp_ddp.py arguments for every run, e.g. "--val-samples 256"')
    add("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.strategies) - set(MANUAL_NAMES))
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if unknown:
        parser.error(f"unknown strategies {unknown}; choose from {', '.join(MANUAL_NAMES)}")
    return args


def configurations(args):
    """(name, mlp_ddp.py arguments) of each configuration, once."""
    modes = [("ddp", ["--mode", "ddp"]), ("ddp-no-sync", ["--mode", "ddp-no-sync"])]
    modes += [(f"manual-{strategy}", manual_arguments(strategy)) for strategy in args.strategies]
    runs = []
    for model in args.models:
        if 1 in args.world_sizes:
            runs.append((f"sweep-{model}-single-w1", ["--model", model, "--mode", "single"]))
        for world in sorted(size for size in args.world_sizes if size > 1):
            runs += [(f"sweep-{model}-{mode}-w{world}",
                      ["--model", model, "--world-size", str(world)] + mode_arguments)
                     for mode, mode_arguments in modes]
    largest = max(args.world_sizes)
    if "mlp" in args.models and largest > 1:
        for size in (f"{megabytes:g}" for megabytes in args.bucket_mbs):
            launch = ["--model", "mlp", "--world-size", str(largest), "--bucket-mb", size]
            runs += [(f"bucket-mlp-bucketed-{size}mb-w{largest}",
                      launch + manual_arguments("bucketed")),
                     (f"bucket-mlp-ddp-{size}mb-w{largest}", launch + ["--mode", "ddp"])]
    return runs


def command_for(name, run_arguments, args):
    """(name, mlp_ddp.py command line) of one run."""
    model = run_arguments[run_arguments.index("--model") + 1]
    steps = args.cnn_max_steps if model == "cnn" else args.max_steps
    command = [sys.executable, os.path.join(REPO, "mlp_ddp.py")] + run_arguments
    command += ["--epochs", str(args.epochs), "--max-steps", str(steps),
                "--train-samples", str(args.train_samples), *DEFAULT_EVAL_SAMPLES]
    command += shlex.split(args.extra)  # after the sweep's own options, so --extra wins
    return name, command + ["--results-dir", args.results_dir, "--run-name", name]


def minutes(seconds):
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def run_all(commands, results_dir):
    """Run each command in turn; returns the names of the runs that failed."""
    failed = []
    start = time.perf_counter()
    for index, (name, command) in enumerate(commands, 1):
        elapsed = minutes(time.perf_counter() - start)
        print(f"[{index}/{len(commands)}] {name} (elapsed {elapsed})", flush=True)
        stale = os.path.join(results_dir, name + ".json")
        if os.path.exists(stale):
            os.remove(stale)  # a failed re-run must not leave the old result to be plotted as new
        if (code := subprocess.call(command)) != 0:
            print(f"FAILED: {name} (exit code {code}): {shlex.join(command)}", flush=True)
            failed.append(name)
    print(f"sweep done: {len(commands) - len(failed)} of {len(commands)} runs succeeded "
          f"in {minutes(time.perf_counter() - start)}", flush=True)
    return failed


def main(argv=None):
    """Run (or with --dry-run print) every run, then draw the plots; 1 if any failed."""
    args = parse_args(argv)
    once = configurations(args)  # each round in its own order, shuffled from the seed
    rounds = [random.Random(args.order_seed * 100_003 + repeat).sample(once, len(once))
              for repeat in range(1, args.repeats + 1)]
    commands = [command_for(f"{name}-r{repeat}", arguments, args)
                for repeat, order in enumerate(rounds, 1) for name, arguments in order]
    if args.dry_run:
        for _name, command in commands:
            print(shlex.join(command))
        return 0
    write_json_atomic(os.path.join(args.results_dir, ORDER_FILE), {  # its folder made if missing
        "schema": ORDER_SCHEMA, "order_seed": args.order_seed,
        "rounds": [[name for name, _ in order] for order in rounds]})
    failed = run_all(commands, args.results_dir)
    plots.main(["--results-dir", args.results_dir])
    if failed:
        print(f"failed runs: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
