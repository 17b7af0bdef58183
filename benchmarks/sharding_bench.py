"""Sharding benchmark: what a rank holds and how long a step takes, torch's DDP against ZeRO-1, -2
and -3 written by hand (manual_sharding.py, through runtime/sharded.py), side by side.

Configurations, each training with AdamW (lr 1e-3, fused):
  ddp                torch's DistributedDataParallel (runtime.wrappers, mode ddp): all on every rank
  zero1              --shard optimizer: each rank steps, and keeps the state of, 1/n of the model
  zero2              --shard gradients: ... and keeps 1/n of the gradients
  zero3              --shard parameters: ... and 1/n of the parameters, each layer gathered when it
                     is used, the next layer's gather started early (prefetch)
  zero3-no-prefetch  the same, each gather started only when its layer needs it, over gloo (whose
                     gathers can overlap compute: shared memory's block) beside zero3-library
  torch-zero1        torch's ZeroRedundancyOptimizer inside its DDP: ZeRO-1 as torch ships it
  torch-fully-shard  torch's fully_shard on each layer, then on the root: ZeRO-3 as torch ships it
  zeroK-ring         zeroK over the hand-written ring (--transport ring): the formula's bytes
  zeroK-library      zeroK over gloo's reduce-scatter and all-gather (--transport library)
  ddp-shm, ddp-ring  torch's DDP whose buckets go over shared memory or the ring (a comm hook)
Ours run over --transport's default, auto (shared memory, the ranks sharing this host), but where
a name says otherwise. Each row's step is also taken over the DDP of its own transport in the same
repeat (step_ratio_to_same_transport_ddp: zeroK over ddp-shm, zeroK-ring over ddp-ring,
zeroK-library over ddp): like against like, so that a ratio measures sharding, not the transport.
torch's two run their own collectives, which the timing layer does not see (DDP's all-reduces
aside): their rows give the step and the memory, and no bytes or communication times.
Per rank: the bytes of parameters, gradients and optimizer state it holds (runtime/memory.py's
MemoryWatch, just before the optimizer step, and their sum at its most: as each collective starts
too, where ZeRO-3 holds a unit whole; torch's collectives are unseen, so theirs is None), its peak
resident memory, the bytes it sends per step as the timing layer measures them and what carried
them (shared memory: none; the library's process group, gloo: its reduce-scatter is a whole
all-reduce, so ZeRO sends more than the formula, timing.SENT_BY_LIBRARY),
beside what a ring sends for the same collectives (an all-reduce of B bytes 2B(n-1)/n, a
reduce-scatter of input B or an all-gather of output B, B(n-1)/n), and the median over its steps of
timing.py's fields: step, compute, communication busy, hidden and exposed.
A gather inside forward is "hidden" by those definitions (compute has not ended): the step time,
not the hidden share, says what prefetching buys.

Each configuration runs in processes of its own, so that their peak RSS is its own: the models one
after the other, the high-water mark reset before each (/proc/self/clear_refs). A repeat launches
every world size (in order, then in reverse order in the next repeat) and at each every
configuration, in an order shuffled anew for each repeat from --order-seed and recorded in the
results ("orders"); the summary gives the median and min-max over the repeats, and each repeat's
ratios to that repeat's DDP. Data: random tensors of MNIST's
shape, as benchmarks/step_bench.py's.

    python -m benchmarks.sharding_bench      # mlp,cnn x world 1-4, 15 configurations, 6 repeats
    python -m benchmarks.sharding_bench --models mlp --world-sizes 1,2 --steps 2 --warmup 1 \
        --repeats 1 --output /tmp/sharding.json

Writes results/sharding.json; analysis/zero_formulas.py holds the paper's formulas the table sets
the measurements against (design_doc/7-sharding.md).
"""
import argparse
import os
import random
import shlex
import sys
import tempfile
import threading
import time
from datetime import timedelta
from statistics import median

import torch
import torch.distributed as dist

from analysis import zero_formulas
from benchmarks.common import int_list, launch_part
from benchmarks.step_bench import (
    BATCH_POOL,
    machine,
    name_list,
    range_text,
    spread,
    world_size_orders,
)
from runtime import collective_record, torch_compat
from runtime.launch import threads_per_rank
from runtime.memory import CATEGORIES, MemoryWatch
from runtime.models import build_model, count_parameters
from runtime.optimizers import Schedule
from runtime.options import DEFAULT_BUCKET_MB, OneLineParser
from runtime.results import write_json_atomic
from runtime.sharded import wrap_sharded
from runtime.step import Precision, TrainingStep
from runtime.timing import FIELDS, CommRecorder, StepTimer, summarize_ranks, watch_gradients
from runtime.wrapped_model import WrappedModel
from runtime.wrappers import SyncOptions, wrap_model

SCHEMA = "sharding-bench/2"
TORCH = ("torch-zero1", "torch-fully-shard")  # torch's own, beside ours at the same world sizes
SHARD_FLAG = {"zero1": "optimizer", "zero2": "gradients", "zero3": "parameters"}  # --shard
# configuration -> (--shard, prefetch, --transport) of ours; ddp and TORCH are torch's. The bare
# names run over the default (auto: shared memory on one host); "-ring" sends what the formula
# says, "-library" what gloo sends
SHARDING = {**{level: (flag, True, "auto") for level, flag in SHARD_FLAG.items()},
            "zero3-no-prefetch": ("parameters", False, "library"),  # beside zero3-library
            **{f"{level}-{transport}": (flag, True, transport) for transport in ("ring", "library")
               for level, flag in SHARD_FLAG.items()}}
OTHER_TRANSPORTS = tuple(name for name in SHARDING if name not in zero_formulas.CONFIGURATIONS)
DDP_OVER = {"ddp": "library", "ddp-shm": "shm", "ddp-ring": "ring"}  # DDP's buckets over each
CONFIGURATIONS = zero_formulas.CONFIGURATIONS + TORCH + OTHER_TRANSPORTS + tuple(DDP_OVER)[1:]
# the DDP of each of our transports, the like a ZeRO level is compared with (auto: one host's shm)
SAME_TRANSPORT_DDP = {"auto": "ddp-shm", "shm": "ddp-shm", "ring": "ddp-ring", "library": "ddp"}
TIMED = ("step", "compute", "comm_busy", "comm_hidden", "comm_exposed")  # summarised over repeats
CLEAR_REFS = "/proc/self/clear_refs"


def parse_args(argv=None):
    """The options, checked: a bad one is one line and exit code 2."""
    parser = OneLineParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--models", type=name_list(("mlp", "cnn")), default=["mlp", "cnn"], help="e.g. mlp,cnn")
    add("--world-sizes", type=int_list, default=[1, 2, 3, 4], help="e.g. 1,2,4")
    add("--configurations", type=name_list(CONFIGURATIONS), default=list(CONFIGURATIONS),
        help="e.g. ddp,zero3")
    add("--steps", type=int, default=20, help="measured steps per model and configuration")
    add("--warmup", type=int, default=3,
        help="steps left out first (>= 1: DDP rebuilds its buckets after the first)")
    add("--repeats", type=int, default=6, help="launches of every configuration, interleaved")
    add("--order-seed", type=int, default=0, help="seeds each repeat's order of configurations")
    add("--batch-size", type=int, default=64, help="per rank")
    add("--bucket-mb", type=float, default=DEFAULT_BUCKET_MB,
        help="DDP's bucket cap and ZeRO-2's buckets (MiB)")
    add("--threads", type=int, default=0, help="torch threads per rank (0: cores / ranks)")
    add("--seed", type=int, default=0)
    add("--timeout", type=float, default=300.0, help="seconds a collective may wait for a peer")
    add("--output", default="results/sharding.json")
    args = parser.parse_args(argv)
    problems = [f"{name} must be >= {low}, got {value}" for name, value, low in (
        ("--steps", args.steps, 1), ("--warmup", args.warmup, 1), ("--repeats", args.repeats, 1),
        ("--batch-size", args.batch_size, 1), ("--threads", args.threads, 0),
        ("every world size", min(args.world_sizes), 1)) if value < low]
    if args.bucket_mb <= 0:
        problems.append(f"--bucket-mb must be > 0, got {args.bucket_mb:g}")
    for option, names in (("--models", args.models), ("--world-sizes", args.world_sizes),
                          ("--configurations", args.configurations)):
        if len(set(names)) < len(names):
            problems.append(f"{option} names one twice")
    if problems:
        parser.error("; ".join(problems))
    return args


class CollectiveLog(CommRecorder):
    """timing.CommRecorder that also keeps each collective's name beside its bytes, so that its
    kind (all-reduce, reduce-scatter, all-gather) says how much of them a rank sends."""

    def __init__(self, clock):
        super().__init__(clock)
        self.named = []
        self._named_lock = threading.Lock()

    def started(self, name, nbytes=0):
        with self._named_lock:
            self.named.append((name, nbytes))
        return super().started(name, nbytes)

    def take_named(self):
        """(name, bytes) of each collective since the last call."""
        with self._named_lock:
            named, self.named = self.named, []
        return named


class TorchFullyShard(WrappedModel, torch.nn.Module):
    """torch's fully_shard on each layer holding parameters, then on the root (as a user writes
    it), behind the training step's interface: the optimizer steps the DTensor shards."""

    def __init__(self, module):
        from torch.distributed.fsdp import fully_shard

        super().__init__()
        for each in list(module.modules())[1:]:
            if any(True for _ in each.parameters(recurse=False)):
                fully_shard(each)
        self.module = fully_shard(module)


class Run:
    """One model in one configuration: wrapped, its AdamW optimizer, its timer and memory watch."""

    def __init__(self, configuration, model_name, args):
        torch.manual_seed(args.seed)  # every rank starts from the same weights
        self.model = build_model(model_name)
        self.parameters = count_parameters(self.model)
        self.timer = StepTimer(warmup_steps=args.warmup)
        self.timer.comm = recorder = CollectiveLog(self.timer.clock)
        adamw = dict(lr=1e-3, fused=True)
        if configuration in ("torch-zero1", *DDP_OVER):
            options = SyncOptions("ddp", bucket_mb=args.bucket_mb,
                                  transport=DDP_OVER.get(configuration, "library"))
            wrapped = wrap_model(self.model, options, recorder)
            if configuration in DDP_OVER:
                optimizer = torch.optim.AdamW(self.model.parameters(), **adamw)
            else:
                from torch.distributed.optim import ZeroRedundancyOptimizer

                optimizer = ZeroRedundancyOptimizer(self.model.parameters(), torch.optim.AdamW,
                                                    **adamw)
        elif configuration == "torch-fully-shard":
            wrapped = TorchFullyShard(self.model)
            optimizer = torch.optim.AdamW(self.model.parameters(), **adamw)
        else:
            level, prefetch, transport = SHARDING[configuration]
            watch_gradients(self.model, recorder)  # before the wrapper's own hooks, as wrap_model
            wrapped = wrap_sharded(self.model, level, args.bucket_mb, prefetch=prefetch,
                                   transport=transport, recorder=recorder)
            optimizer = wrapped.make_optimizer(torch.optim.AdamW, **adamw)
        self.wrapped = wrapped
        self.configuration = configuration
        self.watch = MemoryWatch(wrapped, optimizer, recorder)
        self.train_step = TrainingStep(wrapped, optimizer, Schedule(), load=lambda batch: batch,
                                       precision=Precision(None, torch.device("cpu")),
                                       timer=self.timer)
        self.collectives = []  # per measured step: [(name, bytes)] in launch order

    def step(self, images, labels, measured):
        """One training step, timed as the trainer times it."""
        self.timer.start_step()
        self.train_step([(images, labels)])
        self.timer.end_step()
        named = self.timer.comm.take_named()
        if measured:
            self.collectives.append(named)

    def shards(self):
        """{name, numel, padded_numel} of each flat shard (none for DDP): the padding."""
        optimizer = getattr(self.wrapped, "optimizer", None)  # ZeRO-1/2's; ZeRO-3 shards units
        owner, what = (optimizer, "bucket") if optimizer is not None else (self.wrapped, "unit")
        return [{"name": f"{what} {index}", "numel": shard.numel,
                 "padded_numel": shard.padded_numel}
                for index, shard in enumerate(getattr(owner, "shards", []))]


def reset_peak_rss():
    """Reset the process's high-water mark to its resident memory now; False where Linux's
    clear_refs is not available (the peak is then since the process began)."""
    try:
        with open(CLEAR_REFS, "w") as file:
            file.write("5")
        return True
    except OSError:
        return False


def resident_bytes():
    """The process's resident memory now."""
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rank_result(run, world, reset, rss_at_start):
    """What this rank measured: held bytes, peak RSS, bytes sent per step and the medians over
    its measured steps; its records too, for the pooled statistics."""
    layout = run.collectives[-1]
    sent = sum(zero_formulas.bytes_sent(zero_formulas.collective_kind(name), nbytes, world)
               for name, nbytes in layout)
    held = run.watch.record()
    measured = run.timer.bytes_sent()
    if run.configuration in TORCH:  # torch's collectives are out of the timing layer's sight
        measured = {"transport": None, "measured_per_step": None}
        sent = None
        held["model_states_peak"] = None  # counted as collectives start: theirs are unseen
    records = run.timer.take_epoch()
    return {"held_bytes": {key: held[key] for key in CATEGORIES + ("model_states",
                                                                   "model_states_peak")},
            "peak_rss_bytes": held["peak_rss"], "rss_at_start_bytes": rss_at_start,
            "peak_rss_reset": reset, "bytes_sent_per_step": sent,
            "transport": measured["transport"],
            "bytes_measured_per_step": measured["measured_per_step"],
            "same_collectives_every_step": all(step == layout for step in run.collectives),
            "collectives": [{"name": name, "kind": zero_formulas.collective_kind(name),
                             "bytes": nbytes} for name, nbytes in layout],
            "median_s": {field: median(record[field] for record in records) for field in FIELDS},
            "records": records}


def bench_model(model_name, args, rank, world):
    """One model in args.configuration on this rank; rank 0 returns the row, the others None."""
    generator = torch.Generator().manual_seed(args.seed + rank)  # each rank its own slice
    images = torch.randn(BATCH_POOL, args.batch_size, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (BATCH_POOL, args.batch_size), generator=generator)
    reset = reset_peak_rss()
    rss_at_start = resident_bytes()
    run = Run(args.configuration, model_name, args)
    for step in range(args.warmup + args.steps):
        dist.barrier()  # every step starts with the ranks aligned
        run.step(images[step % BATCH_POOL], labels[step % BATCH_POOL], step >= args.warmup)
    mine = rank_result(run, world, reset, rss_at_start)
    per_rank = [None] * world
    dist.all_gather_object(per_rank, mine)
    if rank != 0:
        return None
    return measurement(args.configuration, model_name, run, world, per_rank)


def measurement(name, model_name, run, world, per_rank):
    """The row of one model in one configuration: per rank, and the largest rank's or the
    pooled medians."""
    pooled = summarize_ranks([rank.pop("records") for rank in per_rank])["across_ranks"]
    collectives = [rank.pop("collectives") for rank in per_rank]  # kept once, if they agree
    return {"world_size": world, "model": model_name, "configuration": name,
            "level": zero_formulas.LEVEL_OF[name], "parameters": run.parameters,
            "parameter_bytes": 4 * run.parameters, "steps_per_rank": len(run.collectives),
            # the largest rank's (ZeRO's shards are equal: so are the ranks)
            "held_bytes": {key: most([rank["held_bytes"][key] for rank in per_rank])
                           for key in per_rank[0]["held_bytes"]},
            "peak_rss_bytes": max(rank["peak_rss_bytes"] for rank in per_rank),
            "peak_rss_growth_bytes": max(rank["peak_rss_bytes"] - rank["rss_at_start_bytes"]
                                         for rank in per_rank),
            # a ring's bytes for the recorded collectives, and what left the rank: the most of any
            "bytes_sent_per_step": most([rank["bytes_sent_per_step"] for rank in per_rank]),
            "transport": per_rank[0]["transport"],
            "bytes_measured_per_step": most([rank["bytes_measured_per_step"]
                                             for rank in per_rank]),
            "collectives": collectives[0],
            "same_collectives_every_step": all(rank["same_collectives_every_step"]
                                               for rank in per_rank)
                                           and all(each == collectives[0] for each in collectives),
            "shards": run.shards(),
            # the median over every rank's measured steps
            **{f"median_{field}_s": pooled[field]["median"] for field in FIELDS},
            "per_rank": per_rank}


def most(values):
    """The largest of `values`, or None if any is None (not measured)."""
    return None if None in values else max(values)


def bench_rank(placement, args):
    """One rank of one (world size, configuration) launch; rank 0 writes the rows."""
    world = placement.world_size
    torch.set_num_threads(threads_per_rank(args.threads, world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{placement.master_port}",
                            rank=placement.rank, world_size=world,
                            timeout=timedelta(seconds=args.timeout))
    collective_record.intercept()  # the ring's bytes are counted at its sends (said in main)
    try:
        rows = [bench_model(model_name, args, placement.rank, world)
                for model_name in args.models]
        if placement.rank == 0:
            write_json_atomic(args.part_path,
                              {"rows": rows, "threads_per_rank": torch.get_num_threads()})
    finally:
        torch_compat.destroy_process_group()


def launch(world, configuration, args, folder):
    """One (world size, configuration): its rows and threads per rank, or None if a rank
    failed."""
    part_path = os.path.join(folder, f"{configuration}-w{world}.json")
    job = argparse.Namespace(**vars(args), configuration=configuration, part_path=part_path)
    # forked: this process has run no tensor operation, and a fork starts in a second
    return launch_part(bench_rank, world, job, f"{configuration} at world size {world}: ",
                       fork=True)


def configuration_orders(configurations, repeats, seed=0):
    """Each repeat's order of the configurations: shuffled anew for each repeat, seeded."""
    return [random.Random(seed * 100_003 + repeat).sample(configurations, len(configurations))
            for repeat in range(1, repeats + 1)]


def run_repeats(args):
    """Every (world size, configuration) launched args.repeats times, interleaved. Returns the
    rows, each with its repeat and its step over the same repeat's DDP step, and the threads per
    rank by world size; None if a rank failed."""
    # DDP's constructor imports torch._dynamo, two seconds of CPU: once here, and every forked rank
    # has it
    import torch._dynamo  # noqa: F401

    rows = []
    threads = {}
    orders = list(zip(world_size_orders(args.world_sizes, args.repeats),
                      configuration_orders(args.configurations, args.repeats, args.order_seed)))
    with tempfile.TemporaryDirectory() as folder:
        for repeat, (worlds, configurations) in enumerate(orders, start=1):
            print(f"repeat {repeat} of {args.repeats}:", flush=True)
            for world in worlds:
                for configuration in configurations:
                    part = launch(world, configuration, args, folder)
                    if part is None:
                        return None
                    threads[str(world)] = part["threads_per_rank"]
                    rows += [{"repeat": repeat, **row} for row in part["rows"]]
                    steps = ", ".join(f"{row['model']} {row['median_step_s'] * 1e3:.1f} ms"
                                      for row in part["rows"])
                    print(f"  world {world} {configuration}: {steps}", flush=True)
    add_ratios_to_ddp(rows)
    rows.sort(key=lambda row: (row["world_size"], row["model"], row["repeat"]))
    return rows, threads, [{"repeat": repeat, "world_sizes": worlds, "configurations": names}
                           for repeat, (worlds, names) in enumerate(orders, start=1)]


def add_ratios_to_ddp(rows):
    """Each row's step and model states over those of DDP's row of the same repeat, world size
    and model, and its step over the DDP of its own transport's (SAME_TRANSPORT_DDP); None where
    that DDP did not run."""
    ddp = {(row["repeat"], row["world_size"], row["model"], row["configuration"]): row
           for row in rows if row["configuration"] in DDP_OVER}
    for row in rows:
        where = (row["repeat"], row["world_size"], row["model"])
        theirs = ddp.get((*where, "ddp"))
        transport = SHARDING[row["configuration"]][2] if row["configuration"] in SHARDING else None
        same = ddp.get((*where, SAME_TRANSPORT_DDP.get(transport)))
        row["step_ratio_to_ddp"] = theirs and row["median_step_s"] / theirs["median_step_s"]
        row["step_ratio_to_same_transport_ddp"] = same and (row["median_step_s"]
                                                            / same["median_step_s"])
        row["model_states_ratio_to_ddp"] = theirs and (row["held_bytes"]["model_states"]
                                                       / theirs["held_bytes"]["model_states"])


def spread_or_none(values):
    """spread() of the values, or None if any is None (no DDP to compare with)."""
    return None if None in values else spread(values)


def summarize(rows):
    """Per (world size, model, configuration), over the repeats: the spread of every median, of
    the memory and of the ratios to DDP, beside the formulas."""
    groups = {}
    for row in rows:
        groups.setdefault((row["world_size"], row["model"], row["configuration"]), []).append(row)
    summary = []
    for (world, model, name), repeats in groups.items():
        first = repeats[0]
        level = first["level"]
        summary.append({
            "world_size": world, "model": model, "configuration": name, "level": level,
            "repeats": len(repeats), "parameters": first["parameters"],
            **{f"median_{field}_s": spread([row[f"median_{field}_s"] for row in repeats])
               for field in TIMED},
            "held_bytes": {key: spread_or_none([row["held_bytes"][key] for row in repeats])
                           for key in first["held_bytes"]},
            "peak_rss_bytes": spread([row["peak_rss_bytes"] for row in repeats]),
            "peak_rss_growth_bytes": spread([row["peak_rss_growth_bytes"] for row in repeats]),
            "bytes_sent_per_step": spread_or_none([row["bytes_sent_per_step"]
                                                   for row in repeats]),
            "transport": first["transport"],
            "bytes_measured_per_step": spread_or_none([row["bytes_measured_per_step"]
                                                       for row in repeats]),
            **{ratio: spread_or_none([row[ratio] for row in repeats])
               for ratio in ("step_ratio_to_ddp", "step_ratio_to_same_transport_ddp")},
            "model_states_ratio_to_ddp": spread_or_none([row["model_states_ratio_to_ddp"]
                                                         for row in repeats]),
            "formula": {"held_bytes": zero_formulas.model_states(level, first["parameters"],
                                                                 world),
                        "bytes_sent_per_step": zero_formulas.traffic(
                            level, first["parameter_bytes"], world)}})
    summary.sort(key=lambda entry: (entry["model"], entry["world_size"],
                                    CONFIGURATIONS.index(entry["configuration"])))
    return summary


def megabytes(value):
    return f"{value / 1e6:.2f}"


def measured_megabytes(spread_of_bytes):
    """The median's megabytes, or "-" where torch's collectives went unseen."""
    return "-" if spread_of_bytes is None else megabytes(spread_of_bytes["median"])


def print_table(summary):
    """Side by side: model states (measured, formula, x DDP), peak RSS, bytes sent per step
    (measured, by what transport, the formula), step and its communication, medians with the
    step's spread."""
    print(f"\n{'model':>5} {'n':>2} {'configuration':>17} {'states MB':>9} {'formula':>8} "
          f"{'x ddp':>6} {'peak MB':>7} {'RSS MB':>7} {'sent MB':>8} {'over':>14} {'formula':>8} "
          f"{'step ms (min-max)':>20} "
          f"{'x ddp':>5} {'busy':>7} {'hidden':>7} {'exposed':>7}")
    for entry in summary:
        formula = entry["formula"]
        states_ratio = entry["model_states_ratio_to_ddp"]
        step_ratio = entry["step_ratio_to_ddp"]
        print(f"{entry['model']:>5} {entry['world_size']:>2} {entry['configuration']:>17} "
              f"{megabytes(entry['held_bytes']['model_states']['median']):>9} "
              f"{megabytes(formula['held_bytes']['model_states']):>8} "
              f"{'' if states_ratio is None else format(states_ratio['median'], '.2f'):>6} "
              f"{measured_megabytes(entry['held_bytes']['model_states_peak']):>7} "
              f"{entry['peak_rss_bytes']['median'] / 1e6:>7.0f} "
              f"{measured_megabytes(entry['bytes_measured_per_step']):>8} "
              f"{entry['transport'] or '':>14} "
              f"{megabytes(formula['bytes_sent_per_step']):>8} "
              f"{range_text(entry['median_step_s'], 1e3):>20} "
              f"{'' if step_ratio is None else format(step_ratio['median'], '.2f'):>5} "
              + " ".join(f"{entry[f'median_{field}_s']['median'] * 1e3:>7.2f}"
                         for field in ("comm_busy", "comm_hidden", "comm_exposed")))
    repeats = max(entry["repeats"] for entry in summary)
    print(f"(per rank; MB = 1e6 bytes; states: parameters + gradients + optimizer state held "
          "before the step;\n peak: their sum at its most (-: torch's, unseen); sent: bytes that "
          "left a rank per step,\n measured; over: what carried "
          f"them;\n ms: the median over steps, median (min-max) over {repeats} repeats; "
          "x ddp: within each repeat;\n formulas: "
          "analysis/zero_formulas.py, a ring's bytes, without the shards' padding)")


def main(argv=None):
    """Run every configuration, repeated, write the results file, print the table; 1 if a rank
    failed."""
    args = parse_args(argv)
    command = "python -m benchmarks.sharding_bench " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    environment = machine()
    environment["peak_rss"] = ("the high-water mark of the process, reset before each model "
                               "(/proc/self/clear_refs): the interpreter and torch included")
    print(collective_record.INTERCEPTION, flush=True)  # what every rank installs
    measured = run_repeats(args)
    if measured is None:
        return 1
    rows, threads, orders = measured
    environment["threads_per_rank"] = threads
    summary = summarize(rows)
    write_json_atomic(args.output, {"schema": SCHEMA,
                                    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                    "command": command.strip(), "environment": environment,
                                    "config": vars(args), "orders": orders,
                                    "measurements": rows,
                                    "summary": summary})
    print_table(summary)
    print(f"\nresults: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
