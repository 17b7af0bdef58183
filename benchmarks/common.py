"""What the benchmarks share: one set of local processes per world size, rank 0 handing its
part back; one all-reduce timed from a barrier; and the parsing of a list of integers."""
import argparse
import json
import os
import sys
import tempfile
import time

import torch.distributed as dist

from runtime.launch import LaunchError, free_port, launch_local


def run_world_sizes(bench_rank, args, fork=False):
    """Run `bench_rank(placement, args)` at each of `args.world_sizes` (forked with `fork`); rank 0
    writes its part to `args.part_path`. Returns {world size: part}, or None (after one error line)
    if a rank failed."""
    parts = {}
    with tempfile.TemporaryDirectory() as folder:
        for world in args.world_sizes:
            print(f"world size {world}:", flush=True)
            args.part_path = os.path.join(folder, f"world-{world}.json")
            parts[world] = launch_part(bench_rank, world, args, fork=fork)
            if parts[world] is None:
                return None
    del args.part_path
    return parts


def launch_part(bench_rank, world, args, what="", fork=False):
    """Run `bench_rank(placement, args)` on `world` local ranks (forked with `fork`); rank 0
    writes its part to `args.part_path`. Returns the part, or None (after one error line, which
    `what` begins) if a rank failed."""
    try:
        failure = launch_local(bench_rank, world, args, free_port(), fork=fork)
    except LaunchError as error:  # e.g. an emulated network that cannot be made
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    if failure:
        print(f"error: {what}rank {failure[0]} failed (exit code {failure[1]})", file=sys.stderr)
        return None
    with open(args.part_path) as file:
        return json.load(file)


def time_blocking_all_reduce(tensor, all_reduce=dist.all_reduce):
    """Seconds this rank spends in `all_reduce(tensor)`, a call that returns with the sum in place,
    timed from a barrier: the ranks start together, so the slowest rank's time is the call's."""
    dist.barrier()
    start = time.perf_counter()
    all_reduce(tensor)
    return time.perf_counter() - start


def int_list(text):
    """An argparse type: '2,3,4' -> [2, 3, 4]."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        message = f"expected integers separated by commas, got {text!r}"
        raise argparse.ArgumentTypeError(message) from None
