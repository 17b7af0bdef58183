"""Training-step benchmark: each hand-written gradient sync against torch's DDP, step by step.

Inside one set of gloo processes every rank builds one copy of the model per configuration
(same seed, own Adam optimizer) and trains them round-robin, one step each in rotating
order, a barrier before every step: all configurations see the same machine conditions.
Configurations: ddp, ddp-shm (DDP whose buckets are summed through shared memory by its comm
hook: --transport shm), ddp-no-sync (DDP whose every backward runs inside `no_sync()`: the same
processes without communication), and every manual configuration (runtime/options.py's
MANUAL_CONFIGURATIONS: each strategy of manual_allreduce.py over the library, the flat buffer over
the ring and over shared memory). The verdict
sets the fastest strategy against DDP, and against DDP on the same transport (shm: ddp-shm). With
--record, every strategy also runs with its collectives recorded as a run records them
(runtime/collective_record.py: "flat+record"), and the report sets each against itself without.

Data: random tensors of MNIST's shape (N x 1 x 28 x 28, labels 0-9), a pool of batches made
once per rank. The step's compute does not depend on the pixel values, and this skips the load.

    python -m benchmarks.step_bench              # mlp,cnn x world 2,4, 30 steps, 6 repeats
    python -m benchmarks.step_bench --models mlp --world-sizes 2 --steps 60 --bucket-mb 1
    python -m benchmarks.step_bench --record --strategies per-param,flat-ring --output /tmp/r.json
    python -m benchmarks.step_bench --models mlp --world-sizes 2 --steps 2 --warmup 1 \
        --repeats 1 --output /tmp/s.json
    python -m benchmarks.step_bench --plain-loop --device cuda     (benchmarks/plain_loop.py)

Every world size's processes are launched --repeats times (6), interleaved: repeat 1 runs every
world size in order, repeat 2 in reverse order, and so on, so a slow spell of the machine falls on
all of them. Each repeat keeps its own means; the summary gives their median and min-max, and each
repeat's step over that repeat's DDP step. The verdict on the best hand-written strategy is the
design document's, from those ratios (VERDICT_RULE); with fewer than 3 repeats, nothing.

Every field is timing.py's, measured alike in every configuration, DDP's included: comm busy is the
union of the step's collective spans, hidden the part before compute ended (the last gradient's
accumulation), exposed the part after. Each step is the trainer's (runtime/step.py), on a batch
already in memory. overlap = hidden / busy. Means pool every rank's measured steps (means add up:
data + compute + exposed = step). Writes results/step-bench.json.
"""
import argparse
import os
import platform
import sys
import tempfile
import textwrap
import time
from datetime import timedelta
from statistics import median

import torch
import torch.distributed as dist

from analysis import results_folder
from benchmarks import plain_loop
from benchmarks.common import int_list, run_world_sizes
from runtime import collective_record, torch_compat
from runtime.device import DEVICES
from runtime.launch import threads_per_rank
from runtime.models import build_model, count_parameters
from runtime.optimizers import Schedule
from runtime.options import MANUAL_CONFIGURATIONS
from runtime.results import overlap, write_json_atomic
from runtime.step import Precision, TrainingStep
from runtime.timing import FIELDS, StepTimer, summarize_ranks
from runtime.wrappers import DEFAULT_BUCKET_MB, SyncOptions, wrap_model

SCHEMA = "step-bench/3"
MIN_REPEATS = 3  # fewer repeats give no range worth the name: no verdict
DEFAULT_REPEATS = 6  # the design document's verdicts take a bootstrap interval from 5 repeats
VERDICT_RULE = ("faster or slower than DDP only where the step ratios, taken within each repeat, "
                f"all agree or, from {results_folder.BOOTSTRAP_FROM} repeats, the 95 % bootstrap "
                "interval of their median excludes 1 (the design document's rule), else "
                "indistinguishable; "
                f"nothing with fewer than {MIN_REPEATS} repeats")
BATCH_POOL = 8  # distinct random batches per rank, cycled
MANUAL_NAMES = tuple(MANUAL_CONFIGURATIONS)  # the hand-written ones, by their names
# name -> (--mode, --transport) of the DDP configurations, run before the strategies
DDP_CONFIGURATIONS = {"ddp": ("ddp", "library"), "ddp-shm": ("ddp", "shm"),
                      "ddp-no-sync": ("ddp-no-sync", "auto")}
# a transport -> DDP over it (the ring has none: ddp)
SAME_TRANSPORT_DDP = {transport: name for name, (mode, transport) in DDP_CONFIGURATIONS.items()
                      if mode == "ddp"}
RECORDED = "+record"  # a strategy's name with it: its collectives recorded


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
    add("--strategies", type=name_list(MANUAL_NAMES), default=list(MANUAL_NAMES),
        help="hand-written strategies to run")
    add("--steps", type=int, default=30, help="measured steps per configuration")
    add("--warmup", type=int, default=5, help="steps per configuration left out of the statistics")
    add("--repeats", type=int, default=DEFAULT_REPEATS,
        help="launches of every world size, interleaved")
    add("--batch-size", type=int, default=64, help="per rank")
    add("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB,
        help="bucket size of DDP and of the bucketed strategy")
    add("--threads", type=int, default=0,
        help="torch threads per rank (0: cores / ranks, at least 1)")
    add("--seed", type=int, default=0)
    add("--timeout", type=float, default=300.0, help="seconds a collective may wait for a peer")
    add("--record", action="store_true",
        help="also run every strategy with its collectives recorded (STRATEGY+record)")
    add("--output", default="results/step-bench.json")
    add("--plain-loop", action="store_true",
        help="instead: our step in one process against a plain PyTorch loop, on --device, "
             "--repeats rounds of --steps steps (benchmarks/plain_loop.py; writes "
             f"{plain_loop.DEFAULT_OUTPUT})")
    add("--device", choices=DEVICES, default="auto", help="--plain-loop: where it runs")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or (min(args.world_sizes) < 2 and not args.plain_loop):
        parser.error("--steps must be >= 1, --warmup >= 0, every world size >= 2")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    return args


class Configuration:
    """One wrapped model copy with its optimizer, its own timer (so its own comm recorder), and
    the trainer's step."""

    def __init__(self, name, model_name, args, record=None):
        torch.manual_seed(args.seed)  # every copy starts from the same weights (as rank 0's)
        self.name = name
        strategy = name.removesuffix(RECORDED)
        self.recorded = strategy != name
        self.model = build_model(model_name)
        self.timer = StepTimer(warmup_steps=args.warmup)
        if name in DDP_CONFIGURATIONS:
            (mode, transport), sync = DDP_CONFIGURATIONS[name], "bucketed"
        else:
            mode, (sync, transport) = "manual", MANUAL_CONFIGURATIONS[strategy]
        options = SyncOptions(mode, sync, args.bucket_mb, transport=transport)
        wrapped = wrap_model(self.model, options, self.timer.comm,
                             record=record if self.recorded else None)
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
    names += [name + RECORDED for name in args.strategies] if args.record else []
    # installed once; switched on for the recorded configurations' steps only
    recorder = collective_record.install(tempfile.mkdtemp(prefix="step-bench-record-"),
                                         rank) if args.record else None
    configurations = [Configuration(name, model_name, args, recorder) for name in names]
    generator = torch.Generator().manual_seed(args.seed + rank)  # each rank its own slice
    images = torch.randn(BATCH_POOL, args.batch_size, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (BATCH_POOL, args.batch_size), generator=generator)
    for step in range(args.warmup + args.steps):
        for turn in range(len(configurations)):
            # rotate who goes first
            configuration = configurations[(step + turn) % len(configurations)]
            dist.barrier()  # every configuration's step starts with the ranks aligned
            if recorder:
                recorder.enabled = configuration.recorded
            configuration.step(images[step % BATCH_POOL], labels[step % BATCH_POOL])
            if recorder:
                recorder.enabled = False
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
    collective_record.intercept()  # the ring's bytes are counted at its sends (said in main)
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
        torch_compat.destroy_process_group()


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


def world_size_orders(world_sizes, repeats):
    """Each repeat's order of the world sizes: forward, backward, forward...; a slow spell of the
    machine then falls on every world size, not on the last one launched."""
    return [list(world_sizes) if repeat % 2 == 0 else world_sizes[::-1]
            for repeat in range(repeats)]


def run_repeats(args):
    """Launch every world size `args.repeats` times, interleaved. Returns the rows, each with its
    repeat (1, 2, ...), and the threads per rank by world size; None if a rank failed."""
    rows = []
    threads = {}
    for repeat, order in enumerate(world_size_orders(args.world_sizes, args.repeats), start=1):
        print(f"repeat {repeat} of {args.repeats}:", flush=True)
        parts = run_world_sizes(bench_rank, argparse.Namespace(**{**vars(args),
                                                                   "world_sizes": order}),
                                fork=True)
        if parts is None:
            return None
        for world, part in parts.items():
            rows += [{"repeat": repeat, **row} for row in part["rows"]]
            threads[str(world)] = part["threads_per_rank"]
    # by world size, then repeat; within a launch, the models and configurations in run order
    rows.sort(key=lambda row: (row["world_size"], row["repeat"]))
    return rows, threads


def spread(values):
    """One quantity over the repeats: each repeat's value, their median, min and max."""
    return {"per_repeat": values, "median": median(values),
            "min": min(values), "max": max(values)}


def median_or_none(values):
    """The median, or None if any value is None (an overlap without communication)."""
    return None if None in values else median(values)


def summarize(rows):
    """Per (world size, model, configuration), over the repeats: the median of every mean, and the
    spread of the mean step and of the step ratio to DDP (each repeat's ratio to its own DDP)."""
    groups = {}
    for row in rows:
        groups.setdefault((row["world_size"], row["model"], row["configuration"]), []).append(row)
    summary = []
    for (world, model, name), repeats in groups.items():
        summary.append({
            "world_size": world, "model": model, "configuration": name, "repeats": len(repeats),
            "median_of_means_s": {field: median(row[f"mean_{field}_s"]
                                                           for row in repeats)
                                  for field in FIELDS},
            "median_overlap": median_or_none([row["overlap"] for row in repeats]),
            "mean_step_s": spread([row["mean_step_s"] for row in repeats]),
            "step_ratio_to_ddp": spread([row["step_ratio_to_ddp"] for row in repeats])})
    return summary


def compare_with_ddp(ratios, ddp_name="DDP"):
    """The verdict on a strategy's step over DDP's, one ratio a repeat (VERDICT_RULE)."""
    if len(ratios) < MIN_REPEATS:
        return f"not enough repeats: {len(ratios)} < {MIN_REPEATS}"
    said = results_folder.verdict(*results_folder.interval(ratios))
    return said if said == "indistinguishable" else f"{said} than {ddp_name}"


def against(strategy, ddp):
    """A strategy's summary against one DDP configuration's: the step ratio within each repeat,
    never across repeats, and the verdict."""
    mine = strategy["mean_step_s"]["per_repeat"]
    theirs = ddp["mean_step_s"]["per_repeat"]
    ratios = [step / ddp_step for step, ddp_step in zip(mine, theirs)]
    name = ddp["configuration"]
    return {"ddp": name, "step_ratio": spread(ratios),
            "verdict": compare_with_ddp(ratios, "DDP" if name == "ddp" else name)}


def verdicts(summary):
    """Per (world size, model): the hand-written strategy of the smallest median step ratio to DDP,
    against DDP and against DDP on its own transport (flat-shm: ddp-shm; the others: ddp)."""
    report = []
    for world, model in sorted({(entry["world_size"], entry["model"]) for entry in summary}):
        mine = {entry["configuration"]: entry for entry in summary
                if (entry["world_size"], entry["model"]) == (world, model)}
        manual = [name for name in mine if name in MANUAL_NAMES]
        best = min(manual, key=lambda name: mine[name]["step_ratio_to_ddp"]["median"])
        same = SAME_TRANSPORT_DDP.get(MANUAL_CONFIGURATIONS[best][1], "ddp")
        report.append({"world_size": world, "model": model, "best_strategy": best,
                       "repeats": mine[best]["repeats"],
                       "against_ddp": against(mine[best], mine["ddp"]),
                       "against_same_transport_ddp": against(mine[best], mine[same]),
                       "record_cost": [against(mine[name + RECORDED], mine[name])
                                       for name in manual if name + RECORDED in mine]})
    return report


def range_text(values, scale=1.0, digits=2):
    """'7.17 (7.01-7.40)': the median and min-max of a spread, scaled."""
    median, low, high = (values[key] * scale for key in ("median", "min", "max"))
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def print_table(summary, report):
    """The summary as a table of median milliseconds with the step's and ratio's spreads, then
    the verdicts."""
    columns = ("compute", "comm_busy", "comm_hidden", "comm_exposed")
    print(f"\n{'world':>5} {'model':>5} {'configuration':>13} {'step (min-max)':>21} "
          + " ".join(f"{column:>12}" for column in columns)
          + f" {'overlap':>8} {'x ddp (min-max)':>17}")
    for entry in summary:
        medians = entry["median_of_means_s"]
        overlap = "" if entry["median_overlap"] is None else f"{entry['median_overlap']:.2f}"
        print(f"{entry['world_size']:>5} {entry['model']:>5} {entry['configuration']:>13} "
              f"{range_text(entry['mean_step_s'], scale=1e3):>21} "
              + " ".join(f"{medians[column] * 1e3:>12.2f}" for column in columns)
              + f" {overlap:>8} {range_text(entry['step_ratio_to_ddp']):>17}")
    repeats = max(entry["repeats"] for entry in summary)
    print(f"(ms per step: median over {repeats} repeats of each repeat's mean, min-max beside the "
          "step;\n overlap = hidden / busy; x ddp: each repeat's step over that repeat's ddp step)")
    print("\n" + textwrap.fill(f"verdict: {VERDICT_RULE}", width=100))
    print("(the step ratio to each DDP: median (min-max) over the repeats)")
    for verdict in report:
        # one comparison when the same transport's DDP is ddp itself
        said = [f"vs {side['ddp']} {range_text(side['step_ratio'])}: {side['verdict']}"
                for side in (verdict["against_ddp"], verdict["against_same_transport_ddp"])]
        print(f"  world {verdict['world_size']} {verdict['model']}: best "
              f"{verdict['best_strategy']}, " + "; ".join(dict.fromkeys(said)))
        for cost in verdict["record_cost"]:
            print(f"    recorded vs {cost['ddp']}: {range_text(cost['step_ratio'])}: "
                  f"{cost['verdict'].replace('than ' + cost['ddp'], 'than without')}")


def machine():
    """What the results depend on besides the options."""
    return {"torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cores": os.cpu_count(),
            "cores_available": len(os.sched_getaffinity(0)), "backend": "gloo",
            "data": "random tensors of MNIST shape",
            "load_average_1min_at_start": os.getloadavg()[0]}


def main(argv=None):
    """Run every world size, repeated, write the results file, print the table; 1 if a rank
    failed."""
    args = parse_args(argv)
    if args.plain_loop:
        return plain_loop.run(args)
    environment = machine()
    print(collective_record.INTERCEPTION, flush=True)  # what every rank installs
    # The ranks are forked from here (this process runs no tensor operation, and a fork starts in
    # a second), with torch._dynamo, which each rank's first optimizer imports: two seconds of CPU
    # once here instead of in every rank.
    import torch._dynamo  # noqa: F401
    measured = run_repeats(args)
    if measured is None:
        return 1
    rows, threads = measured
    environment["threads_per_rank"] = threads
    summary = summarize(rows)
    report = verdicts(summary)
    created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json_atomic(args.output, {"schema": SCHEMA, "created": created,
                                    "environment": environment, "config": vars(args),
                                    "measurements": rows, "summary": summary,
                                    "verdict": {"rule": VERDICT_RULE,
                                                "minimum_repeats": MIN_REPEATS,
                                                "per_world_size_and_model": report}})
    print_table(summary, report)
    print(f"\nresults: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
