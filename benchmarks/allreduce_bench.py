"""All-reduce benchmark: gloo's own `dist.all_reduce` against the hand-written `ring_all_reduce`
and the shared-memory all-reduce (manual_collectives.py); and their two halves, ZeRO's
reduce-scatter and all-gather (gloo's, manual_sharding.py's ring, shared memory), beside a copy of
the same buffer in memory: the machine's memory-copy bandwidth, of which each collective reaches a
fraction (copy time / collective time; 1.0 would be a collective as fast as one memcpy).

Real processes on gloo (CPU), one torch thread each, float32 messages. For every message size
the implementations of every collective, and the copy, run interleaved, iteration by iteration and
in rotating order, so machine noise hits each alike. Each call is timed per rank from a barrier to
its return; a call's time is the slowest rank's (every rank copies at once, as they would share
the memory's bandwidth in a collective). Before timing, every size checks each result against the
exact one. A size is rounded down to a whole number of float32 values per rank.

    python -m benchmarks.allreduce_bench                # 4 KiB..64 MiB, x4, world 2,3,4
    python -m benchmarks.allreduce_bench --factor 2 --world-sizes 2,4 --iterations 50
    python -m benchmarks.allreduce_bench --sizes 4M,16M --candidate /tmp/my_ring.py  # a new ring
    python -m benchmarks.allreduce_bench --sizes 4K,64K --iterations 2 --world-sizes 2 \
        --output /tmp/a.json

`--candidate FILE` adds a fourth all-reduce, FILE's `ring_all_reduce(tensor)`, to measure a
change against the original under the same conditions. Writes results/allreduce-bench.json
(structure in benchmarks/README.md): `measurements` the all-reduces, `halves` the reduce-scatters
and all-gathers (bytes: the whole buffer, the input of one and the output of the other),
`memory_copy` the copies; algbw = bytes / median time, busbw = algbw x 2(n-1)/n for an all-reduce
and x (n-1)/n for a half (nccl-tests), both in GB/s (1e9 bytes per second). Two targets: TARGET
(the ring) and SHM_TARGET.
"""
import argparse
import importlib.util
import os
import platform
import sys
import time
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist

from benchmarks.common import int_list, run_world_sizes, time_blocking_all_reduce
from manual_collectives import SharedMemoryAllReduce, ring_all_reduce
from manual_sharding import ring_all_gather, ring_reduce_scatter
from runtime import emulated_network, torch_compat
from runtime.options import OneLineParser
from runtime.results import write_json_atomic
from runtime.timing import summarize

SCHEMA = "allreduce-bench/1"  # halves and memory_copy: later additions, optional to a reader
HALVES = ("reduce-scatter", "all-gather")
TARGET = {"statement": "the ring reaches at least 0.9x gloo's busbw at 4 MiB and above, "
                       "for world sizes 2 to 4",
          "min_bytes": 4 * 2**20, "min_ratio": 0.9, "implementation": "ring"}
# gloo moves the bytes between the ranks of a host through loopback TCP; shared memory skips it
SHM_TARGET = {"statement": "shm reaches at least 3x gloo's busbw at 1 MiB and above, "
                           "for world sizes 2 to 4",
              "min_bytes": 2**20, "min_ratio": 3.0, "implementation": "shm"}
UNITS = {"": 1, "K": 2**10, "KIB": 2**10, "M": 2**20, "MIB": 2**20, "G": 2**30, "GIB": 2**30}


def parse_size(text):
    """'4K', '4KiB', '64M', '4096' -> bytes; a whole number of float32 values."""
    digits = text.rstrip("KkMmGgIiBb")
    try:
        size = int(digits) * UNITS[text[len(digits):].upper()]
    except (ValueError, KeyError):
        message = f"expected a size such as 4096, 4K or 64MiB, got {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    if size <= 0 or size % 4:
        message = f"a size must be a positive multiple of 4 bytes, got {text!r}"
        raise argparse.ArgumentTypeError(message)
    return size


def size_list(text):
    """'4K,1M' -> [4096, 1048576]."""
    return [parse_size(part) for part in text.split(",")]


def parse_args(argv=None):
    """The options, checked; `sizes` filled in from min/max/factor unless given."""
    parser = OneLineParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--world-sizes", type=int_list, default=[2, 3, 4], help="processes per run, e.g. 2,3,4")
    add("--min-size", type=parse_size, default=parse_size("4K"),
        help="smallest message (default 4K)")
    add("--max-size", type=parse_size, default=parse_size("64M"),
        help="largest message (default 64M)")
    add("--factor", type=int, choices=(2, 4), default=4, help="each size is this times the last")
    add("--sizes", type=size_list, default=None,
        help="explicit sizes instead of min/max/factor, e.g. 4K,1M,64M")
    add("--iterations", type=int, default=20, help="timed calls per implementation and size")
    add("--warmup", type=int, default=3, help="untimed calls per implementation and size")
    add("--candidate", default=None, metavar="FILE",
        help="a .py file whose ring_all_reduce(tensor) is measured too")
    add("--timeout", type=float, default=300.0, help="seconds a collective may wait for a peer")
    add("--output", default=None,
        help="default results/allreduce-bench.json; with --emulate-link RATE "
             "results/emulated/allreduce-RATE[-Kpn].json")
    emulated_network.add_options(parser)  # --emulate-link RATE, --ranks-per-node K
    args = parser.parse_args(argv)
    emulated_network.check_options(parser, args)
    if args.output is None:
        args.output = default_output(args)
    if args.sizes is None:
        args.sizes = []
        size = args.min_size
        while size <= args.max_size:
            args.sizes.append(size)
            size *= args.factor
    if args.iterations < 1 or args.warmup < 0 or min(args.world_sizes) < 2:
        parser.error("--iterations must be >= 1, --warmup >= 0, every world size >= 2")
    return args


def default_output(args):
    """Where the results go unless --output says: emulated links apart from the reference run."""
    if not args.emulate_link:
        return "results/allreduce-bench.json"
    per_node = f"-{args.ranks_per_node}pn" if args.ranks_per_node > 1 else ""
    return f"results/emulated/allreduce-{args.emulate_link}{per_node}.json"


def implementations(candidate, timeout_s):
    """(collective, name) -> function(output, tensor) of each implementation; an all-reduce sums
    `tensor` in place and ignores `output` (building shm's segment is a collective: every rank
    calls this at once)."""
    shared = SharedMemoryAllReduce(timeout_s=timeout_s)
    all_reduces = {"gloo": dist.all_reduce, "ring": ring_all_reduce, "shm": shared.all_reduce}
    if candidate:
        spec = importlib.util.spec_from_file_location("candidate_ring", candidate)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        all_reduces["candidate"] = module.ring_all_reduce
    chosen = {("all-reduce", name): lambda _, tensor, function=function: function(tensor)
              for name, function in all_reduces.items()}
    chosen.update({("reduce-scatter", "gloo"): torch_compat.reduce_scatter_single,
                   ("reduce-scatter", "ring"): ring_reduce_scatter,
                   ("reduce-scatter", "shm"): shared.reduce_scatter,
                   ("all-gather", "gloo"): lambda output, tensor: torch_compat.all_gather_single(
                       output, own_chunk(tensor)),
                   ("all-gather", "ring"): lambda output, tensor: ring_all_gather(
                       output, own_chunk(tensor)),
                   ("all-gather", "shm"): lambda output, tensor: shared.all_gather(
                       output, own_chunk(tensor)),
                   ("memory-copy", "copy"): lambda output, tensor: output.copy_(tensor)})
    return chosen


def own_chunk(tensor):
    """This rank's chunk of `tensor`: what it contributes to an all-gather."""
    return tensor.view(dist.get_world_size(), -1)[dist.get_rank()]


def expected_result(collective, base, world, rank):
    """What `collective` leaves on this rank when rank r gives (r+1) x base."""
    chunks = whole_chunks(base, world).view(world, -1)
    if collective == "all-reduce":
        return base * (world * (world + 1) / 2)
    if collective == "reduce-scatter":
        return chunks[rank] * (world * (world + 1) / 2)
    if collective == "all-gather":
        return torch.cat([chunks[other] * (other + 1) for other in range(world)])
    return base * (rank + 1)  # the copy


def whole_chunks(tensor, world):
    """`tensor`'s first elements that make `world` equal chunks: what a half moves."""
    return tensor[:tensor.numel() // world * world]


def buffers(collective, work):
    """(output, tensor) of one call: what the collective writes to and reads from."""
    if collective == "all-reduce":
        return None, work
    if collective == "memory-copy":
        return torch.empty_like(work), work
    tensor = whole_chunks(work, dist.get_world_size())
    if collective == "reduce-scatter":
        return work.new_empty(tensor.numel() // dist.get_world_size()), tensor
    return torch.empty_like(tensor), tensor  # all-gather: from this rank's chunk


def verify(functions, base, source, work, world):
    """{(collective, name): whether its result is the exact one on every rank}; rank r gives
    (r+1) x base."""
    rank = dist.get_rank()
    good = []
    for (collective, _), function in functions.items():
        work.copy_(source)
        output, tensor = buffers(collective, work)
        function(output, tensor)
        result = tensor if output is None else output
        good.append(int(torch.allclose(result, expected_result(collective, base, world, rank),
                                       rtol=1e-5, atol=1e-5)))
    agreed = torch.tensor(good)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return {key: bool(flag) for key, flag in zip(functions, agreed.tolist())}


def measure_size(functions, size, args, world):
    """Slowest-rank seconds of each timed call, {(collective, name): [seconds per iteration]},
    and {(collective, name): verified}."""
    generator = torch.Generator().manual_seed(size)
    base = torch.randn(size // 4, generator=generator)  # the same on every rank
    source = base * (dist.get_rank() + 1)
    work = torch.empty_like(source)
    verified = verify(functions, base, source, work, world)
    del base  # 64 MiB at the largest size, times the ranks
    keys = list(functions)
    calls = [partial(functions[key], *buffers(key[0], work)) for key in keys]  # buffers made once
    times = torch.zeros(len(keys), args.iterations, dtype=torch.float64)
    for iteration in range(args.warmup + args.iterations):
        for turn in range(len(keys)):
            # rotate who goes first: no implementation always follows another
            index = (iteration + turn) % len(keys)
            work.copy_(source)  # sums of sums would grow toward inf; refill outside the timed span
            elapsed = time_blocking_all_reduce(work, lambda _, call=calls[index]: call())
            if iteration >= args.warmup:
                times[index, iteration - args.warmup] = elapsed
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # elementwise: each iteration's slowest rank
    return {key: times[index].tolist() for index, key in enumerate(keys)}, verified


def bench_rank(placement, args):
    """One rank of one world size; rank 0 writes its measurements to args.part_path."""
    torch.set_num_threads(1)  # 2 cores shared by up to 4 ranks: more threads would only fight
    address = f"{placement.master_addr}:{placement.master_port}"  # rank 0's node's, if emulated
    dist.init_process_group("gloo", init_method=f"tcp://{address}",
                            rank=placement.rank, world_size=placement.world_size,
                            timeout=timedelta(seconds=args.timeout))
    try:
        functions = implementations(args.candidate, args.timeout)
        rows = []
        for size in args.sizes:
            times, verified = measure_size(functions, size, args, placement.world_size)
            halves_bytes = size // 4 // placement.world_size * placement.world_size * 4
            made = [measurement(placement.world_size, halves_bytes if key[0] in HALVES else size,
                                key, seconds, verified[key]) for key, seconds in times.items()]
            copy = next(row for row in made if row["collective"] == "memory-copy")
            for row in made:
                row["fraction_of_copy"] = copy["median_s"] / row["median_s"]
            rows += made
            if placement.rank == 0:
                medians = [f"{row['collective']} {row['implementation']} "
                           f"{row['median_s'] * 1e3:.3f} ms"
                           + ("" if row["verified"] else " WRONG RESULT") for row in made]
                print(f"  world {placement.world_size} {human(size):>7}: " + ", ".join(medians),
                      flush=True)
        if placement.rank == 0:
            write_json_atomic(args.part_path, rows)
    finally:
        torch_compat.destroy_process_group()


def measurement(world, size, key, seconds, verified):
    """One row: an implementation's median and p95 at one size, and its bandwidths (a copy's
    busbw is its algbw: it moves no bytes between ranks)."""
    collective, name = key
    stats = summarize(seconds)
    algbw = size / stats["median"] / 1e9
    bus = {"all-reduce": 2 * (world - 1) / world, "memory-copy": 1}.get(collective,
                                                                         (world - 1) / world)
    return {"world_size": world, "bytes": size, "collective": collective, "implementation": name,
            "iterations": len(seconds), "median_s": stats["median"], "p95_s": stats["p95"],
            "algbw_gbps": algbw, "busbw_gbps": algbw * bus, "verified": verified}


def comparisons(measurements):
    """Each non-gloo implementation's busbw over gloo's, per collective, world size and size."""
    gloo = {(row["collective"], row["world_size"], row["bytes"]): row["busbw_gbps"]
            for row in measurements if row["implementation"] == "gloo"}
    return [{"collective": row["collective"], "world_size": row["world_size"],
             "bytes": row["bytes"], "implementation": row["implementation"],
             "busbw_ratio_to_gloo": row["busbw_gbps"] / gloo[
                 row["collective"], row["world_size"], row["bytes"]]}
            for row in measurements if row["implementation"] != "gloo"
            and row["collective"] != "memory-copy"]


def target_report(ratios, world_sizes, target=TARGET):
    """Per world size: does the target's implementation reach min_ratio x gloo's busbw at every
    size >= min_bytes?"""
    report = {}
    for world in world_sizes:
        large = [ratio["busbw_ratio_to_gloo"] for ratio in ratios if ratio["world_size"] == world
                 and ratio["collective"] == "all-reduce"
                 and ratio["implementation"] == target["implementation"]
                 and ratio["bytes"] >= target["min_bytes"]]
        report[str(world)] = {"sizes_checked": len(large),
                              "worst_ratio": min(large) if large else None,
                              "holds": bool(large) and min(large) >= target["min_ratio"]}
    return report


def human(size):
    """4096 -> '4 KiB'."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def environment():
    """The machine and software the figures come from."""
    return {"torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cores": os.cpu_count(),
            "cores_available": len(os.sched_getaffinity(0)), "threads_per_rank": 1,
            "backend": "gloo", "load_average_1min_at_start": os.getloadavg()[0]}


def print_table(measurements, ratios, verdicts):
    """The measurements as a table, then each target's verdicts ({statement: per world size})."""
    print(f"\n{'world':>5} {'size':>9} {'collective':>14} {'impl':>9} {'median ms':>10} "
          f"{'p95 ms':>9} {'algbw GB/s':>11} {'busbw GB/s':>11} {'x gloo':>7} {'of copy':>7}")
    ratio_of = {(ratio["collective"], ratio["world_size"], ratio["bytes"],
                 ratio["implementation"]): ratio["busbw_ratio_to_gloo"] for ratio in ratios}
    for row in measurements:
        ratio = ratio_of.get((row["collective"], row["world_size"], row["bytes"],
                              row["implementation"]))
        shown = "" if ratio is None else f"{ratio:.2f}"
        print(f"{row['world_size']:>5} {human(row['bytes']):>9} {row['collective']:>14} "
              f"{row['implementation']:>9} {row['median_s'] * 1e3:>10.3f} "
              f"{row['p95_s'] * 1e3:>9.3f} {row['algbw_gbps']:>11.3f} "
              f"{row['busbw_gbps']:>11.3f} {shown:>7} {row['fraction_of_copy']:>7.2f}")
    print("(of copy: a copy of the buffer in memory's time over the collective's)")
    for target, per_world in verdicts:
        print(f"\ntarget: {target['statement']}")
        for world, verdict in per_world.items():
            if verdict["worst_ratio"] is None:
                worst = f"no size >= {human(target['min_bytes'])} measured"
            else:
                worst = f"worst {verdict['worst_ratio']:.2f}x"
            holds = "holds" if verdict["holds"] else "does not hold"
            print(f"  world {world}: {holds} ({worst})")


def main(argv=None):
    """Run every world size, write the results file, print the table; 1 on a failure or a wrong
    sum."""
    args = parse_args(argv)
    environment_at_start = environment()
    # forked: this process runs no tensor operation, and a fork starts in a second
    parts = run_world_sizes(bench_rank, args, fork=True)
    if parts is None:
        return 1
    rows = [row for part in parts.values() for row in part]
    ratios = comparisons(rows)
    measurements = [row for row in rows if row["collective"] == "all-reduce"]
    target = target_report(ratios, args.world_sizes)
    shm_target = target_report(ratios, args.world_sizes, SHM_TARGET)
    config = vars(args)
    created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json_atomic(args.output, {"schema": SCHEMA, "created": created,
                                    "environment": environment_at_start, "config": config,
                                    "link": emulated_network.describe(args),
                                    "measurements": measurements,
                                    "halves": [row for row in rows
                                               if row["collective"] in HALVES],
                                    "memory_copy": [row for row in rows
                                                    if row["collective"] == "memory-copy"],
                                    "comparisons": ratios,
                                    "target": dict(TARGET, per_world_size=target),
                                    "shm_target": dict(SHM_TARGET, per_world_size=shm_target)})
    print_table(rows, ratios, [(TARGET, target), (SHM_TARGET, shm_target)])
    print(f"\nresults: {args.output}")
    if not all(row["verified"] for row in rows):
        print("error: an implementation's result differs from the exact one (see 'verified')",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
