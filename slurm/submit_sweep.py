"""Submit the scaling sweep to SLURM, wait for every job, gather the results and draw the plots.

    python -m slurm.submit_sweep --dry-run   # the sbatch commands, nothing submitted
    python -m slurm.submit_sweep             # nodes 1,2 x tasks per node 1,2 x ddp and strategies
    python -m slurm.submit_sweep --nodes 1,2,4 --strategies bucketed,flat-ring --model cnn -- \
        --epochs 1
    python -m slurm.submit_sweep --nodes 2 --repeats 3   # each shape 3 times, interleaved
    LAUNCH=torchrun python -m slurm.submit_sweep   # the torchrun launch style (see run_slurm.sh)

Every job runs run_slurm.sh with a run name that says its shape (slurm-mlp-manual-flat-ring-n2x2: 2
nodes x 2 tasks) and writes to --results-dir (default results/slurm, apart from the local sweep);
the plots go to <results-dir>/plots. With --repeats R > 1 the names end in -r1..-rR and the jobs
are submitted in rounds, every other round in reverse order, as analysis/sweep.py runs locally: with
exclusive jobs (SBATCH_EXCLUSIVE=exclusive) they then run in that order, so slow spells of the
machine spread over every configuration. Arguments after `--` go to mlp_ddp.py. The state of each
job is polled with scontrol, which works without Slurm's accounting database.
"""
import argparse
import os
import re
import subprocess
import sys
import time

from analysis import plots
from runtime.options import comma_list, manual_arguments

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE"}
POLL_S = 2  # seconds between two rounds of scontrol


def parse_args(argv=None):
    """The submitter's options; what follows `--` goes to mlp_ddp.py."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=comma_list(int), default=[1, 2])
    parser.add_argument("--tasks-per-node", type=comma_list(int), default=[1, 2])
    parser.add_argument("--strategies", default="flat,bucketed,flat-ring",
                        help="manual configurations (options.MANUAL_CONFIGURATIONS: flat-ring is "
                             "the flat buffer over the ring); ddp always runs")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run every configuration this many times, interleaved")
    parser.add_argument("--results-dir", default=os.path.join("results", "slurm"))
    parser.add_argument("--limit", type=float, default=3600,
                        help="seconds to wait for all jobs")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("trainer_args", nargs="*", help="after --: passed to mlp_ddp.py")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def jobs(args):
    """(run name, sbatch command) for every point of the sweep, round after round."""
    # (label in the run name, --mode, its --sync and --transport arguments)
    series = [("ddp", "ddp", [])]
    series += [(f"manual-{strategy}", "manual", manual_arguments(strategy)[2:])
               for strategy in args.strategies.split(",") if strategy]
    shapes = [(nodes, tasks, label, mode, sync) for nodes in args.nodes
              for tasks in args.tasks_per_node for label, mode, sync in series]
    for repeat in range(1, args.repeats + 1):
        suffix = f"-r{repeat}" if args.repeats > 1 else ""
        for nodes, tasks, label, mode, sync in shapes if repeat % 2 else reversed(shapes):
            name = f"slurm-{args.model}-{label}-n{nodes}x{tasks}{suffix}"
            command = ["sbatch", "--parsable", f"--nodes={nodes}",
                       f"--ntasks-per-node={tasks}", f"--job-name={name}", "run_slurm.sh",
                       "--model", args.model, "--mode", mode, *sync,
                       "--results-dir", args.results_dir, "--run-name", name,
                       *args.trainer_args]
            yield name, command


def state_of(job_id):
    """(JobState, ExitCode) of a job, as scontrol shows it."""
    completed = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                               text=True, timeout=30)
    fields = dict(re.findall(r"(\w+)=(\S+)", completed.stdout))
    return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "?")


def wait_for(submitted, limit_s):
    """{name: (state, exit code)} of every submitted job once finished; None past the limit."""
    deadline = time.monotonic() + limit_s
    states = {}
    while len(states) < len(submitted):
        for name, job_id in submitted.items():
            if name in states:
                continue
            state, exit_code = state_of(job_id)
            if state in FINISHED:
                states[name] = (state, exit_code)
                print(f"{name}: {state} (exit {exit_code}), "
                      f"{len(states)} of {len(submitted)} done", flush=True)
        if time.monotonic() > deadline:
            unfinished = len(submitted) - len(states)
            print(f"error: {unfinished} jobs unfinished after {limit_s:g} s", file=sys.stderr)
            return None
        time.sleep(POLL_S)
    return states


def main(argv=None):
    """Submit every job, wait for all, then draw the plots; 1 if any failed or wrote nothing."""
    args = parse_args(argv)
    planned = list(jobs(args))
    if args.dry_run:
        for _, command in planned:
            print(" ".join(command))
        return 0
    os.makedirs(os.path.join(REPO, "logs"), exist_ok=True)  # run_slurm.sh's --output folder
    submitted = {}
    for name, command in planned:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            print(f"error: sbatch refused {name}: {done.stderr.strip()}", file=sys.stderr)
            return 1
        job_id, _, _ = done.stdout.strip().partition(";")  # --parsable: id;cluster
        submitted[name] = job_id
        print(f"submitted {name} as job {submitted[name]}", flush=True)
    states = wait_for(submitted, args.limit)
    if states is None:
        return 1
    failed = [name for name, (state, _) in states.items() if state != "COMPLETED"
              or not os.path.exists(os.path.join(REPO, args.results_dir, name + ".json"))]
    plots.main(["--results-dir", os.path.join(REPO, args.results_dir)])
    if failed:
        print(f"error: {len(failed)} jobs failed or wrote no results: {', '.join(failed)} "
              "(see logs/)", file=sys.stderr)
        return 1
    print(f"all {len(states)} jobs completed; results and plots in {args.results_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
