"""The GPU check: one command that fits a short loan of one GPU (about 4 minutes of its 5) and
writes, under OUT (default results/gpu):
  runs/                   every --mode at world size 1, then 2 and 4 ranks sharing the GPU over
                          gloo: one epoch of the MLP each, results files as every run writes them
  plain-loop.json         our step against a plain PyTorch loop, MLP and CNN (plain_loop.py)
  time-to-accuracy.json   the CNN's time to 99 % against pytorch/examples' mnist/main.py recipe
                          on the same GPU (time_to_accuracy.py, one repeat)
  summary.json            each step's command, exit code and seconds, and the figures read back

    python -m benchmarks.gpu_check --data-dir DIR            (DIR/MNIST/raw: the GPU machine has
                                                              no network; OFFLINE_DATA_DIR works)
    python -m benchmarks.gpu_check /tmp/dry --device cpu --quick --data-dir DIR   (the dry run)

--quick trains a few steps on a few hundred samples, at world size 2 only, with nothing reaching
its target: it checks that every step runs and is read back, not what it measures. Each step has
its own time limit, and the steps left when --budget-s is spent are skipped and said so.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from runtime.device import DEVICES
from runtime.results import write_json_atomic

MODES_AT_ONE = ("single", "ddp", "manual", "ddp-no-sync", "sharded")
# (world size, mode, its options): the ring's and shm's messages are staged through the host
RING = ("flat-ring", ("--sync", "flat", "--transport", "ring"))
BUCKETED = ("bucketed", ("--sync", "bucketed"))
SHARING = ((2, "manual", RING), (2, "ddp", None), (4, "manual", BUCKETED), (4, "ddp", None))
QUICK_SHARING = ((2, "manual", RING), (2, "ddp", None))
QUICK_RUN = ("--train-samples", "256", "--val-samples", "32", "--test-samples", "64",
             "--max-steps", "3", "--batch-size", "16", "--warmup-steps", "1")
QUICK_PLAIN_LOOP = ("--models", "mlp", "--steps", "2", "--warmup", "1", "--repeats", "1")
PLAIN_LOOP = ("--models", "mlp,cnn", "--steps", "100", "--warmup", "20", "--repeats", "5")
QUICK_TIME_TO_ACCURACY = ("--classic-epochs", "1", "--evals-per-epoch", "1", "--test-samples",
                          "64", "--cnn-options", "--batch-size 32 --epochs 1 --train-samples 128")
TIME_TO_ACCURACY = ("--classic-epochs", "3", "--evals-per-epoch", "4")
STEP_LIMIT_S = 150  # a step that takes longer is stopped: a hang must not eat the loan
WITHIN = 1.2  # our step's goal against the plain loop's


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("out", nargs="?", default="results/gpu", help="the folder written (default results/gpu)")
    add("--device", choices=DEVICES, default="cuda")
    add("--quick", action="store_true", help="a few steps of everything: a dry run")
    add("--data-dir", default="data")
    add("--offline-data-dir", default=os.environ.get("OFFLINE_DATA_DIR"))
    add("--budget-s", type=float, default=270.0, help="no step starts after this many seconds")
    add("--only", type=lambda text: text.split(","), default=None, metavar="NAME,...",
        help="run only these steps (the names it prints)")
    args = parser.parse_args(argv)
    names = [name for name, _ in planned_steps(args)]
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        parser.error(f"no step {', '.join(unknown)}; the steps: {', '.join(names)}")
    return args


def planned_steps(args):
    """(name, argv after the Python interpreter) of every step, in order."""
    data = ["--data-dir", args.data_dir]
    if args.offline_data_dir:
        data += ["--offline-data-dir", args.offline_data_dir]
    runs_dir = os.path.join(args.out, "runs")
    training = [*data, "--device", args.device, "--epochs", "1", "--results-dir", runs_dir,
                *(QUICK_RUN if args.quick else ())]
    steps = []
    for mode in MODES_AT_ONE:
        world = [] if mode == "single" else ["--world-size", "1"]
        steps.append((f"{mode}-w1", ["mlp_ddp.py", "--mode", mode, *world, *training,
                                     "--run-name", f"{mode}-w1"]))
    for world, mode, options in QUICK_SHARING if args.quick else SHARING:
        label, how = options or ("", ())
        name = f"{mode}{'-' + label if label else ''}-w{world}-shared"
        steps.append((name, ["mlp_ddp.py", "--mode", mode, *how, "--world-size", str(world),
                             *training, "--run-name", name]))
    steps.append(("plain-loop", ["-m", "benchmarks.step_bench", "--plain-loop", "--device",
                                 args.device, *(QUICK_PLAIN_LOOP if args.quick else PLAIN_LOOP),
                                 "--output", os.path.join(args.out, "plain-loop.json")]))
    steps.append(("time-to-accuracy", [
        "-m", "benchmarks.time_to_accuracy", *data, "--device", args.device, "--models", "cnn",
        "--world-sizes", "1", "--repeats", "1",
        *(QUICK_TIME_TO_ACCURACY if args.quick else TIME_TO_ACCURACY),
        "--output", os.path.join(args.out, "time-to-accuracy.json")]))
    return steps


def run_step(name, argv, seconds_left, logs):
    """Run one step with its output in logs/NAME.log; its record."""
    record = {"name": name, "command": " ".join(["python", *argv])}
    if seconds_left <= 0:
        return {**record, "status": "skipped: the budget was spent"}
    started = time.perf_counter()
    with open(os.path.join(logs, f"{name}.log"), "w") as log:
        try:
            done = subprocess.run([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT,
                                  timeout=min(STEP_LIMIT_S, seconds_left))
            status = "ok" if done.returncode == 0 else f"failed: exit code {done.returncode}"
        except subprocess.TimeoutExpired:
            status = f"failed: stopped after {min(STEP_LIMIT_S, seconds_left):.0f} s"
    return {**record, "status": status, "seconds": time.perf_counter() - started}


def read_json(path):
    """A results file, or None if the step wrote none."""
    try:
        with open(path) as file:
            return json.load(file)
    except (OSError, ValueError):
        return None


def figures(args):
    """What the steps measured, read back from their files."""
    runs = []
    for name in sorted(os.listdir(os.path.join(args.out, "runs"))):
        document = read_json(os.path.join(args.out, "runs", name))
        if document:
            environment = document["environment"]
            runs.append({"run": document["run_name"], "mode": document["config"]["mode"],
                         "world_size": environment["world_size"],
                         "device": environment["device"], "backend": environment["backend"],
                         "test_accuracy": document["test"]["accuracy"],
                         "samples_per_s": document["throughput_samples_per_s"],
                         "median_step_s": document["timing"]["across_ranks"]["step"]["median"]})
    plain = read_json(os.path.join(args.out, "plain-loop.json")) or {"rows": []}
    step_ratios = [{"model": row["model"], "configuration": row["configuration"],
                    "ratio_to_plain": row["ratio_to_plain"],
                    "within_goal": row["ratio_to_plain"] <= WITHIN}
                   for row in plain["rows"] if row["configuration"] != "plain"]
    race = read_json(os.path.join(args.out, "time-to-accuracy.json")) or {"runs": []}
    to_target = [{"name": run["name"], "time_to_target_s": run["time_to_target_s"].get("cnn"),
                  "evaluation_s": run["evaluation_s"]} for run in race["runs"]]
    return {"runs": runs, "step_against_plain_loop": step_ratios, "cnn_time_to_99": to_target}


def print_summary(summary):
    for step in summary["steps"]:
        seconds = f"{step['seconds']:.0f} s" if "seconds" in step else ""
        print(f"  {step['name']:<28} {step['status']:<32} {seconds}")
    for run in summary["figures"]["runs"]:
        print(f"  {run['run']:<28} {run['device']:<7} {run['backend']:<5} "
              f"acc {100 * run['test_accuracy']:.2f}% {run['samples_per_s']:.0f} samples/s")
    for ratio in summary["figures"]["step_against_plain_loop"]:
        print(f"  step {ratio['model']} {ratio['configuration']:<8} "
              f"x{ratio['ratio_to_plain']:.2f} plain loop (goal <= {WITHIN})")
    for run in summary["figures"]["cnn_time_to_99"]:
        print(f"  cnn to 99%: {run['name']:<8} {run['time_to_target_s']} s")


def main(argv=None):
    """Run every step within the budget, write summary.json; 1 if a step failed."""
    args = parse_args(argv)
    logs = os.path.join(args.out, "logs")
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    started = time.perf_counter()
    steps = []
    for name, step_argv in planned_steps(args):
        if args.only and name not in args.only:
            continue
        print(f"{name} ...", flush=True)
        left = args.budget_s - (time.perf_counter() - started)
        steps.append(run_step(name, step_argv, left, logs))
    summary = {"schema": "gpu-check/1", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "device": args.device, "quick": args.quick,
               "seconds": time.perf_counter() - started, "steps": steps,
               "figures": figures(args)}
    write_json_atomic(os.path.join(args.out, "summary.json"), summary)
    print_summary(summary)
    print(f"\nresults: {args.out} ({summary['seconds']:.0f} s)")
    return 0 if all(step["status"] == "ok" for step in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
