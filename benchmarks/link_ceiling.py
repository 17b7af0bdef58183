"""Up to which link rate is the emulated link, not the CPU, the bottleneck? As root:

    python -m benchmarks.link_ceiling                       # 1,2,5,10gbit and unshaped, 16 MiB
    python -m benchmarks.link_ceiling --rates 500mbit,1gbit --size 64M --iterations 20

Runs benchmarks.allreduce_bench at 2 ranks, each in its own namespace behind a link of each rate
(one file per rate: results/emulated/ceiling/allreduce-<rate>.json; "unshaped" is a plain local
run, no namespaces, over loopback),
then compares each implementation's bus bandwidth with the configured rate: achieved = busbw /
rate. A 2-rank all-reduce puts 2(n-1)/n x N = N bytes on each link each way, so busbw can reach
the link's rate and no more. A rate is link-bound when gloo achieves at least --bound (0.8) of it:
above the highest such rate, the figures measure the CPU (tbf, veth and gloo on 2 shared cores),
not the link. Writes results/emulated/link-ceiling.json (schema link-ceiling/1).
"""
import json
import os
import sys
import time

from benchmarks import allreduce_bench
from runtime import shaped_links
from runtime.options import OneLineParser
from runtime.results import write_json_atomic

SCHEMA = "link-ceiling/1"
UNSHAPED = "unshaped"


def parse_args(argv=None):
    """The rates (tc syntax, or 'unshaped'), the message size and where the files go."""
    parser = OneLineParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--rates", default=f"1gbit,2gbit,5gbit,10gbit,{UNSHAPED}",
        help="link rates to measure, in tc syntax; 'unshaped' for no shaping at all")
    add("--size", default="16M", help="message size (allreduce_bench syntax)")
    add("--iterations", type=int, default=10)
    add("--bound", type=float, default=0.8,
        help="link-bound when gloo's busbw reaches this fraction of the rate")
    add("--output-dir", default=os.path.join("results", "emulated"))
    args = parser.parse_args(argv)
    args.rates = [rate for rate in args.rates.split(",") if rate]
    for rate in args.rates:
        if rate != UNSHAPED:
            try:
                shaped_links.parse_rate(rate)
            except ValueError as error:
                parser.error(str(error))
    try:
        shaped_links.check_usable()
    except shaped_links.NetworkUnavailable as error:
        parser.error(str(error))
    return args


def measure(rate, args):
    """allreduce_bench at one rate; its results file's measurements."""
    # a folder of their own: allreduce-1gbit.json beside them is the full benchmark's
    output = os.path.join(args.output_dir, "ceiling", f"allreduce-{rate}.json")
    link = [] if rate == UNSHAPED else ["--emulate-link", rate]
    command = ["--world-sizes", "2", "--sizes", args.size, "--iterations", str(args.iterations),
               "--output", output, *link]
    print(f"\n== {rate}: python -m benchmarks.allreduce_bench {' '.join(command)}", flush=True)
    if allreduce_bench.main(command) != 0:
        raise SystemExit(f"error: the benchmark at {rate} failed")
    with open(output) as file:
        return json.load(file)["measurements"]


def main(argv=None):
    """Measure every rate, then write and print achieved / configured."""
    args = parse_args(argv)
    rows = []
    for rate in args.rates:
        bits_per_s = None if rate == UNSHAPED else shaped_links.parse_rate(rate)
        for row in measure(rate, args):
            achieved = None if bits_per_s is None else row["busbw_gbps"] * 8e9 / bits_per_s
            rows.append({"rate": rate, "bits_per_s": bits_per_s, "bytes": row["bytes"],
                         "implementation": row["implementation"], "median_s": row["median_s"],
                         "busbw_gbps": row["busbw_gbps"], "achieved_fraction": achieved})
    bound = [row for row in rows if row["implementation"] == "gloo"
             and row["achieved_fraction"] is not None and row["achieved_fraction"] >= args.bound]
    ceiling = max(bound, key=lambda row: row["bits_per_s"])["rate"] if bound else None
    output = os.path.join(args.output_dir, "link-ceiling.json")
    write_json_atomic(output, {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "config": vars(args), "rows": rows,
                               "highest_link_bound_rate": ceiling})
    print(f"\n{'rate':>9} {'impl':>6} {'busbw Gbit/s':>13} {'achieved/rate':>14}")
    for row in rows:
        achieved = row["achieved_fraction"]
        shown = "-" if achieved is None else f"{achieved:.2f}"
        print(f"{row['rate']:>9} {row['implementation']:>6} {row['busbw_gbps'] * 8:>13.2f} "
              f"{shown:>14}")
    print(f"\nhighest rate where the link, not the CPU, bounds gloo (>= {args.bound:g} of it): "
          f"{ceiling or 'none of those measured'}\nresults: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
