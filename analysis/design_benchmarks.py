"""The measurements beside the strategy sweep: the MLP's step against the bucket size (§4.5, §6.4)
and benchmarks/step_bench.py's table of every configuration in the same processes (§6.3)."""
import os

from analysis.design_numbers import load, repo_relative, table
from analysis.design_performance import register_run_spreads, sentence, slug
from runtime.options import DEFAULT_BUCKET_MB

BUCKETING = ("manual bucketed", "ddp")  # the series whose step depends on --bucket-mb
STEP_BENCH_FIELDS = {"mean_step_s": "ms", "mean_compute_s": "ms", "mean_comm_exposed_s": "ms",
                     "mean_comm_busy_s": "ms", "overlap": "percent", "step_ratio_to_ddp": "ratio"}
STEP_BENCH_COLUMNS = ["model", "ranks", "configuration", "steps", "mean step", "compute",
                      "exposed comm", "busy comm", "overlap", "× DDP"]
NO_BUCKET_SWEEP = {"table.bucket_sweep": "*No bucket sweep (bucket-*.json) in the results: "
                                         "run python -m analysis.sweep.*",
                   "text.bucket_takeaway": "*No bucket sweep.*"}


def mlp_bucketing_runs(grouped):
    """The MLP's runs of the bucketing series, by configuration."""
    chosen = {}
    for configuration, runs in grouped.items():
        model, series, _world, _bucket_mb = configuration
        if model == "mlp" and series in BUCKETING:
            chosen[configuration] = runs
    return chosen


def best_size_takeaway(numbers, series, sizes):
    """The bucket size of the smallest median step for `series`, and what may be said of it
    against the default."""
    name = f"bucket.{slug(series)}"
    medians = {size: numbers.value(f"{name}.{size:g}.step.median") for size in sizes}
    best = min((size for size in sizes if medians[size] is not None), key=medians.get,
               default=None)
    numbers.add(f"{name}.best_mb", best, "MiB", kind="derived",
                formula="the size of the smallest median",
                inputs=[f"{name}.{size:g}.step.median" for size in sizes])
    if best is None:
        return ""
    if best == DEFAULT_BUCKET_MB:
        return f"{series}: the default {DEFAULT_BUCKET_MB:g} MiB has the smallest median"
    verdict = numbers.verdict(f"{name}.best_vs_default", f"{name}.{best:g}.step",
                              f"{name}.{DEFAULT_BUCKET_MB:g}.step")
    return sentence(f"{series} at {best:g} MiB", f"{series} at {DEFAULT_BUCKET_MB:g} MiB",
                    verdict)


def bucket_sweep_section(numbers, grouped):
    """The MLP's step against the bucket size at the bucket runs' world size, with the best
    size's verdict."""
    runs = mlp_bucketing_runs(grouped)
    # the bucket sweep's runs are those at a size other than the default
    swept_worlds = [world for _, _, world, bucket_mb in runs if bucket_mb != DEFAULT_BUCKET_MB]
    sizes = []
    if swept_worlds:
        sizes = sorted({bucket_mb for _, _, world, bucket_mb in runs
                        if world == max(swept_worlds)})
    if len(sizes) < 2:
        numbers.add("bucket.world", None, "count")
        return dict(NO_BUCKET_SWEEP)
    world = max(swept_worlds)
    numbers.stated("bucket.world", world, "count", "code", "the world size of the bucket runs")
    rows = []
    for size in sizes:
        for series in BUCKETING:
            register_run_spreads(numbers, f"bucket.{slug(series)}.{size:g}",
                                 runs.get(("mlp", series, world, size), []))
        rows.append([f"{size:g} MiB"] + [numbers.spread_text(f"bucket.{slug(series)}.{size:g}.step")
                                         for series in BUCKETING])
    takeaways = [best_size_takeaway(numbers, series, sizes) for series in BUCKETING]
    said = "; ".join(takeaway for takeaway in takeaways if takeaway)
    columns = ["--bucket-mb", "manual bucketed: step", "torch DDP: step"]
    return {"table.bucket_sweep": table(columns, rows), "text.bucket_takeaway": said + "."}


def step_bench_section(numbers, results_dir):
    """benchmarks/step_bench.py's table (schema step-bench/2): every configuration in the same
    processes."""
    path = os.path.join(results_dir, "step-bench.json")
    document = load(path) if os.path.exists(path) else {}
    if document.get("schema") != "step-bench/2":
        if document:
            found = f"{repo_relative(path)} has schema {document.get('schema')!r}"
        else:
            found = f"no {repo_relative(path)}"
        return {"table.step_bench": f"*{found}, not step-bench/2: "
                                    "run python -m benchmarks.step_bench.*"}
    rows = []
    for index, measurement in enumerate(document.get("measurements", [])):
        name = (f"stepbench.{measurement['model']}.w{measurement['world_size']}."
                f"{measurement['configuration']}")
        for field, unit in STEP_BENCH_FIELDS.items():
            numbers.measured(f"{name}.{field}", path, f"measurements[{index}].{field}", unit)
        cells = ["—" if measurement.get(field) is None else numbers.text(f"{name}.{field}")
                 for field in STEP_BENCH_FIELDS]
        rows.append([measurement["model"], measurement["world_size"],
                     measurement["configuration"], measurement.get("steps", "—")] + cells)
    return {"table.step_bench": table(STEP_BENCH_COLUMNS, rows)}
