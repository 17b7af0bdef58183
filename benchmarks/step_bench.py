"""Training-step benchmark: each hand-written gradient sync against torch's DDP, step by step.

Inside one set of gloo processes every rank builds one copy of the model per configuration
(same seed, own Adam optimizer) and trains them round-robin, one step each in rotating
order, a barrier before every step: all configurations see the same machine conditions.
Configurations: ddp, ddp-shm (DDP whose buckets are summed through shared memory by its comm
hook: the transport of --sync shm), ddp-no-sync (DDP whose every backward runs inside `no_sync()`:
the same processes without communication), and every strategy of manual_allreduce.py. The target
compares the fastest strategy with DDP, and with DDP on the same transport (shm with ddp-shm).

Data: random tensors of MNIST's shape (N x 1 x 28 x 28, labels 0-9), a pool of batches made
once per rank. The step's compute does not depend on the pixel values, and this skips the load.

    python -m benchmarks.step_bench                         # mlp,cnn x world 2,4, 30 steps
    python -m benchmarks.step_bench --models mlp --world-sizes 2 --steps 60 --bucket-mb 1
    python -m benchmarks.step_bench --models mlp --world-sizes 2 --steps 2 --warmup 1 \
        --output /tmp/s.json

Every field is timing.py's: comm busy is the union of the step's collective spans, hidden the part
before compute ended, exposed the part after; DDP, which waits inside backward, has its exposed
time estimated as training does, from backwards of the same batches timed without
communication just after each step (runtime/calibration.py). Each step is the trainer's
(runtime/step.py), on a batch already in memory. overlap = hidden / busy. Means
pool every rank's measured steps (means add up: data + compute + exposed = step). Writes
results/step-bench.json.
"""
import argparse
import os
import platform
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from benchmarks.common import int_list, run_world_sizes
from runtime.launch import threads_per_rank
from runtime.models import build_model, count_parameters
from runtime.optimizers import Schedule
from runtime.options import STRATEGY_NAMES
from runtime.results import overlap, write_json_atomic
from runtime.step import Precision, TrainingStep
from runtime.timing import FIELDS, StepTimer, summarize_ranks
from runtime.wrappers import DEFAULT_BUCKET_MB, SyncOptions, wrap_model

SCHEMA = "step-bench/2"
TARGET = "the best hand-written strategy's step time is at most 1.0x DDP's"
BATCH_POOL = 8  # distinct random batches per rank, cycled
# name -> (--mode, --comm-hook) of the DDP configurations, run before the strategies
DDP_CONFIGURATIONS = {"ddp": ("ddp", "none"), "ddp-shm": ("ddp", "shm"),
                      "ddp-no-sync": ("ddp-no-sync", "none")}
SAME_TRANSPORT_DDP = {"shm": "ddp-shm"}  # a strategy -> DDP on its transport (others: ddp)


def name_list(choices):
    """An argparse type: names separated by commas, each one of `choices`."""
    def parse(text):
        names = text.split(",")
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; "
                                             f"choose from {', '.join(choices)}")
        return names
    return parse


def parse_args(argv=None):
    """The options, checked."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--models", type=name_list(("mlp", "cnn")), default=["mlp", "cnn"], help="e.g. mlp,cnn")
    add("--world-sizes", type=int_list, default=[2, 4], help="e.g. 2,4")
    add("--strategies", type=name_list(STRATEGY_NAMES), default=list(STRATEGY_NAMES),
        help="hand-written strategies to run")
    add("--steps", type=int, default=30, help="measured steps per configuration")
    add("--warmup", type=int, default=5, help="steps per configuration left out of the statistics")
    add("--batch-size", type=int, default=64, help="per rank")
    add("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB,
        help="bucket size of DDP and of the bucketed strategy")
    add("--threads", type=int, default=0,
        help="torch threads per rank (0: cores / ranks, at least 1)")
    add("--seed", type=int, default=0)
    add("--timeout", type=float, default=300.0, help="seconds a collective may wait for a peer")
    add("--output", default="results/step-bench.json")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or min(args.world_sizes) < 2:
        parser.error("--steps must be >= 1, --warmup >= 0, every world size >= 2")
    return args


class Configuration:
    """One wrapped model copy with its optimizer, its own timer (so its own comm recorder), and
    the trainer's step and calibration."""

    def __init__(self, name, model_name, args):
        torch.manual_seed(args.seed)  # every copy starts from the same weights (as rank 0's)
        self.name = name
        self.model = build_model(model_name)
        self.timer = StepTimer(warmup_steps=args.warmup)
        mode, hook = DDP_CONFIGURATIONS.get(name, ("manual", "none"))  # else a strategy
        options = SyncOptions(mode, name, args.bucket_mb, comm_hook=hook)
        wrapped = wrap_model(self.model, options, self.timer.comm)
        # mlp_ddp.py's optimizer, at a constant rate
        optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3, fused=True)
        precision = Precision(None, torch.device("cpu"))
        self.train_step = TrainingStep(wrapped, optimizer, Schedule(), load=lambda batch: batch,
                                       precision=precision, timer=self.timer)

    def step(self, images, labels):
        """One training step, timed as the trainer times it; the data phase is only handing over
        the batch, which is in memory already."""
        self.timer.start_step()
        self.train_step([(images, labels)])
        self.timer.end_step()


def bench_model(model_name, args, rank):
    """Round-robin over every configuration; returns {name: statistics pooled over ranks} and
    the model's parameter count, on every rank."""
    names = list(DDP_CONFIGURATIONS) + args.strategies
    configurations = [Configuration(name, model_name, args) for name in names]
    generator = torch.Generator().manual_seed(args.seed + rank)  # each rank its own slice
    images = torch.randn(BATCH_POOL, args.batch_size, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (BATCH_POOL, args.batch_size), generator=generator)
    for step in range(args.warmup + args.steps):
        for turn in range(len(configurations)):
            # rotate who goes first
            configuration = configurations[(step + turn) % len(configurations)]
            dist.barrier()  # every configuration's step starts with the ranks aligned
            configuration.step(images[step % BATCH_POOL], labels[step % BATCH_POOL])
    statistics = {}
    for configuration in configurations:
        steps_per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(steps_per_rank, configuration.timer.take_epoch())
        statistics[configuration.name] = summarize_ranks(steps_per_rank)["across_ranks"]
        statistics[configuration.name]["count"] = sum(len(steps) for steps in steps_per_rank)
    return statistics, count_parameters(configurations[0].model)


def bench_rank(placement, args):
    """One rank of one world size; rank 0 writes its rows to args.part_path."""
    torch.set_num_threads(threads_per_rank(args.threads, placement.world_size))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{placement.master_port}",
                            rank=placement.rank, world_size=placement.world_size,
                            timeout=timedelta(seconds=args.timeout))
    try:
        rows = []
        for model_name in args.models:
            statistics, parameters = bench_model(model_name, args, placement.rank)
            rows += measurements(statistics, model_name, parameters, placement.world_size)
            if placement.rank == 0:
                medians = [f"{name} {stats['step']['median'] * 1e3:.1f} ms"
                           for name, stats in statistics.items()]
                print(f"  world {placement.world_size} {model_name}: " + ", ".join(medians),
                      flush=True)
        if placement.rank == 0:
            write_json_atomic(args.part_path,
                              {"rows": rows, "threads_per_rank": torch.get_num_threads()})
    finally:
        dist.destroy_process_group()


def measurements(statistics, model_name, parameters, world):
    """One row per configuration: its means, p95 step, overlap and step time over DDP's."""
    rows = []
    for name, stats in statistics.items():
        means = {field: stats[field]["mean"] for field in FIELDS}
        rows.append({"world_size": world, "model": model_name, "parameters": parameters,
                     "configuration": name, "steps": stats["count"],
                     **{f"mean_{field}_s": means[field] for field in FIELDS},
                     "p95_step_s": stats["step"]["p95"],
                     "overlap": overlap(means["comm_hidden"], means["comm_busy"]),
                     "step_ratio_to_ddp": means["step"] / statistics["ddp"]["step"]["mean"]})
    return rows


def target_report(rows):
    """Per (world size, model): the fastest hand-written strategy, whether it is within 1.0x DDP,
    and within 1.0x DDP summing through the same transport (shm: DDP with the shm comm hook)."""
    report = []
    for world, model in sorted({(row["world_size"], row["model"]) for row in rows}):
        mine = {row["configuration"]: row for row in rows
                if (row["world_size"], row["model"]) == (world, model)}
        manual = [row for name, row in mine.items() if name in STRATEGY_NAMES]
        best = min(manual, key=lambda row: row["step_ratio_to_ddp"])
        same = SAME_TRANSPORT_DDP.get(best["configuration"], "ddp")
        to_same = best["mean_step_s"] / mine[same]["mean_step_s"] if same in mine else None
        report.append({"world_size": world, "model": model, "best_strategy": best["configuration"],
                       "step_ratio_to_ddp": best["step_ratio_to_ddp"],
                       "holds": best["step_ratio_to_ddp"] <= 1.0,
                       "same_transport_ddp": same, "step_ratio_to_same_transport_ddp": to_same,
                       "holds_same_transport": to_same is not None and to_same <= 1.0})
    return report


def print_table(rows, target):
    """The rows as a table of mean milliseconds, then the target's verdicts."""
    columns = ("step", "compute", "comm_busy", "comm_hidden", "comm_exposed")
    print(f"\n{'world':>5} {'model':>5} {'configuration':>13} "
          + " ".join(f"{column:>12}" for column in columns) + f" {'overlap':>8} {'x ddp':>6}")
    for row in rows:
        overlap = "" if row["overlap"] is None else f"{row['overlap']:.2f}"
        print(f"{row['world_size']:>5} {row['model']:>5} {row['configuration']:>13} "
              + " ".join(f"{row[f'mean_{column}_s'] * 1e3:>12.2f}" for column in columns)
              + f" {overlap:>8} {row['step_ratio_to_ddp']:>6.2f}")
    print("(mean ms per step; overlap = hidden / busy; "
          "ddp's exposed is estimated from a no-communication backward)")
    print(f"\ntarget: {TARGET}")
    for verdict in target:
        holds = "holds" if verdict["holds"] else "does not hold"
        same = verdict["step_ratio_to_same_transport_ddp"]
        print(f"  world {verdict['world_size']} {verdict['model']}: {holds} "
              f"(best {verdict['best_strategy']}, {verdict['step_ratio_to_ddp']:.2f}x ddp"
              + ("" if same is None else f", {same:.2f}x {verdict['same_transport_ddp']}") + ")")


def main(argv=None):
    """Run every world size, write the results file, print the table; 1 if a rank failed."""
    args = parse_args(argv)
    environment = {"torch": torch.__version__, "python": platform.python_version(),
                   "platform": platform.platform(), "cores": os.cpu_count(),
                   "cores_available": len(os.sched_getaffinity(0)), "backend": "gloo",
                   "data": "random tensors of MNIST shape",
                   "load_average_1min_at_start": os.getloadavg()[0]}
    parts = run_world_sizes(bench_rank, args)
    if parts is None:
        return 1
    rows = [row for part in parts.values() for row in part["rows"]]
    threads = {str(world): part["threads_per_rank"] for world, part in parts.items()}
    target = target_report(rows)
    environment["threads_per_rank"] = threads
    config = vars(args)
    created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json_atomic(args.output, {"schema": SCHEMA, "created": created,
                                    "environment": environment, "config": config,
                                    "measurements": rows,
                                    "target": {"statement": TARGET,
                                               "per_world_size_and_model": target}})
    print_table(rows, target)
    print(f"\nresults: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
