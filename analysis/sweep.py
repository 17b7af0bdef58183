"""The scaling sweep in one command: every mode and strategy at every world size, repeated, then
the plots.

    python -m analysis.sweep             # the full default sweep (see DEFAULT_* for its size)
    python -m analysis.sweep --dry-run   # print the commands only
    python -m analysis.sweep --models mlp --world-sizes 1,2 --strategies flat --repeats 1

Runs mlp_ddp.py one job at a time: per model the single process, then at each world size ddp,
ddp-no-sync (the compute baseline) and each manual strategy; then bucketed and ddp at each
--bucket-mbs at the largest world size (MLP only). Rounds are interleaved (every other one
reversed), so slow spells of the machine spread over every configuration; a stable --run-name
(sweep-mlp-manual-flat-w4-r2) makes a re-run replace its file; a failed run is reported and the
sweep goes on (exit code 1). The default takes about 40 minutes on 2 cores.
"""
import argparse
import os
import shlex
import subprocess
import sys
import time

from analysis import plots
from runtime.options import STRATEGY_NAMES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Sized by timing short runs on 2 cores: most of a short run is start-up.
DEFAULT_MLP_STEPS = 100  # per epoch; the first 5 steps of a run are warm-up, left out of the timing
DEFAULT_CNN_STEPS = 20  # a CNN step is about 10 MLP steps
DEFAULT_EPOCHS = 2  # two points per learning curve
DEFAULT_REPEATS = 3  # the fewest that give a median and a spread
DEFAULT_EVAL_SAMPLES = ("--val-samples", "2000", "--test-samples", "2000")


def comma_list(kind):
    """An argparse type: 'a,b,c' as a list of `kind`, empty items left out."""
    def parse(text):
        return [kind(item) for item in text.split(",") if item.strip()]
    return parse


def parse_args(argv=None):
    """The sweep's options; a usage error for an unknown strategy or fewer than one repeat."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=comma_list(str), default=["mlp", "cnn"])
    parser.add_argument("--world-sizes", type=comma_list(int), default=[1, 2, 4])
    parser.add_argument("--strategies", type=comma_list(str), default=list(STRATEGY_NAMES),
                        help="manual strategies")
    parser.add_argument("--bucket-mbs", type=comma_list(float), default=[0.25, 1, 4, 25],
                        help="bucket sweep sizes ('' for none)")
    parser.add_argument("--max-steps", type=int, default=DEFAULT_MLP_STEPS,
                        help="MLP steps per epoch")
    parser.add_argument("--cnn-max-steps", type=int, default=DEFAULT_CNN_STEPS,
                        help="CNN steps per epoch")
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help="runs of every configuration, interleaved")
    parser.add_argument("--train-samples", type=int, default=0, help="training subset (0: all)")
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--extra", default="",
                        help="more mlp_ddp.py arguments for every run, "
                             "e.g. \"--val-samples 256\"")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    unknown = set(args.strategies) - set(STRATEGY_NAMES)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if unknown:
        parser.error(f"unknown strategies {sorted(unknown)}; "
                     f"choose from {', '.join(STRATEGY_NAMES)}")
    return args


def planned_runs(args):
    """(run name, mlp_ddp.py arguments) for every run of the sweep, in the order they run."""
    runs = configurations(args)
    planned = []
    for repeat in range(args.repeats):
        round_runs = runs if repeat % 2 == 0 else runs[::-1]
        planned += [(f"{name}-r{repeat + 1}", arguments) for name, arguments in round_runs]
    return planned


def configurations(args):
    """(name, mlp_ddp.py arguments) of each configuration, once."""
    runs = []
    for model in args.models:
        if 1 in args.world_sizes:
            runs.append((f"sweep-{model}-single-w1", ["--model", model, "--mode", "single"]))
        for world in sorted(size for size in args.world_sizes if size > 1):
            launch = ["--model", model, "--world-size", str(world)]
            runs.append((f"sweep-{model}-ddp-w{world}", launch + ["--mode", "ddp"]))
            runs.append((f"sweep-{model}-ddp-no-sync-w{world}", launch + ["--mode", "ddp-no-sync"]))
            runs += [(f"sweep-{model}-manual-{strategy}-w{world}",
                      launch + ["--mode", "manual", "--sync", strategy])
                     for strategy in args.strategies]
    largest = max(args.world_sizes)
    if "mlp" in args.models and largest > 1:
        for megabytes in args.bucket_mbs:
            launch = ["--model", "mlp", "--world-size", str(largest),
                      "--bucket-mb", f"{megabytes:g}"]
            runs.append((f"bucket-mlp-bucketed-{megabytes:g}mb-w{largest}",
                         launch + ["--mode", "manual", "--sync", "bucketed"]))
            runs.append((f"bucket-mlp-ddp-{megabytes:g}mb-w{largest}",
                         launch + ["--mode", "ddp"]))
    return runs


def command_for(name, run_arguments, args):
    """The mlp_ddp.py command line of one run."""
    model = run_arguments[run_arguments.index("--model") + 1]
    steps = args.cnn_max_steps if model == "cnn" else args.max_steps
    command = [sys.executable, os.path.join(REPO, "mlp_ddp.py")] + run_arguments
    command += ["--epochs", str(args.epochs), "--max-steps", str(steps),
                "--train-samples", str(args.train_samples)]
    command += list(DEFAULT_EVAL_SAMPLES)
    command += shlex.split(args.extra)  # after the sweep's own options, so --extra wins
    return command + ["--results-dir", args.results_dir, "--run-name", name]


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
        code = subprocess.call(command)
        if code != 0:
            print(f"FAILED: {name} (exit code {code}): {shlex.join(command)}", flush=True)
            failed.append(name)
    print(f"sweep done: {len(commands) - len(failed)} of {len(commands)} runs succeeded "
          f"in {minutes(time.perf_counter() - start)}", flush=True)
    return failed


def main(argv=None):
    """Run (or with --dry-run print) every run, then draw the plots; 1 if any failed."""
    args = parse_args(argv)
    commands = [(name, command_for(name, run_arguments, args))
                for name, run_arguments in planned_runs(args)]
    if args.dry_run:
        for _name, command in commands:
            print(shlex.join(command))
        return 0
    failed = run_all(commands, args.results_dir)
    plots.main(["--results-dir", args.results_dir])
    if failed:
        print(f"failed runs: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
