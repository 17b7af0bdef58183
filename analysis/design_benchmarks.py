"""The measurements beside the strategy sweep: the MLP's step against the bucket size (§4.5, §6.4)
and benchmarks/step_bench.py's tables: every configuration in the same processes over interleaved
repeats, and the best hand-written strategy's verdict against DDP (§6.3)."""
import os

from analysis.design_numbers import load, lookup, repo_relative, table
from analysis.design_performance import register_run_spreads, slug
from analysis.results_folder import spread

BUCKETING = ("manual bucketed", "ddp")  # the series whose step depends on --bucket-mb
STEP_BENCH_SCHEMA = "step-bench/3"
STEP_BENCH_FIELDS = {"mean_step_s": "ms", "mean_compute_s": "ms", "mean_comm_exposed_s": "ms",
                     "mean_comm_busy_s": "ms", "overlap": "percent", "step_ratio_to_ddp": "ratio"}
STEP_BENCH_COLUMNS = ["model", "ranks", "configuration", "repeats", "steps (all ranks)", "step",
                      "compute", "exposed comm", "busy comm", "overlap", "× DDP"]
STEP_VERDICT_COLUMNS = ["model", "ranks", "best strategy", "× DDP", "verdict",
                        "same-transport DDP", "× it", "verdict"]
# the verdict's comparisons: the numbers' name -> the results file's
STEP_VERDICT_SIDES = {"vs_ddp": "against_ddp", "vs_same": "against_same_transport_ddp"}
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


def compare_sizes(numbers, runs, series, best, size):
    """The verdict of `series`' step at bucket size `best` against size `size`, paired by round."""
    world = max(world for _, _, world, _ in runs)
    name = f"bucket.{slug(series)}.{best:g}-vs-{size:g}"
    numbers.paired_ratio(name, runs.get(("mlp", series, world, best), []),
                         runs.get(("mlp", series, world, size), []),
                         "timing.across_ranks.step.mean", formula="the step at one size / another")
    numbers.verdict(f"{name}.verdict", name)
    return numbers.text(f"{name}.verdict")  # the takeaway says it


def best_size_takeaway(numbers, runs, series, sizes):
    """What may be said of `series`' bucket sizes: the size of the smallest median step, and which
    sizes it beats beyond both spreads (none: no size is told apart from another)."""
    name = f"bucket.{slug(series)}"
    medians = {size: numbers.value(f"{name}.{size:g}.step.median") for size in sizes}
    best = min((size for size in sizes if medians[size] is not None), key=medians.get,
               default=None)
    numbers.add(f"{name}.best_mb", best, "MiB", kind="derived",
                formula="the size of the smallest median",
                inputs=[f"{name}.{size:g}.step.median" for size in sizes])
    if best is None:
        return ""
    beaten = [size for size in sizes if size != best and medians[size] is not None
              and compare_sizes(numbers, runs, series, best, size) == "faster"]
    if not beaten:
        return f"{slug(series)}: no size is told apart from another"
    return (f"{slug(series)}: {best:g} MiB is faster than "
            + ", ".join(f"{size:g}" for size in beaten) + " MiB")


def bucket_sweep_section(numbers, grouped):
    """The MLP's step against the bucket size at the bucket runs' world size, with the best
    size's verdict."""
    runs = mlp_bucketing_runs(grouped)
    swept_worlds = [world for _, _, world, _ in runs]
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
    takeaways = [best_size_takeaway(numbers, runs, series, sizes) for series in BUCKETING]
    said = "; ".join(takeaway for takeaway in takeaways if takeaway)
    columns = ["--bucket-mb", "manual bucketed: step", "torch DDP: step"]
    return {"table.bucket_sweep": table(columns, rows), "text.bucket_takeaway": said + "."}


def step_bench_section(numbers, results_dir):
    """benchmarks/step_bench.py's tables (schema step-bench/3): every configuration in the same
    processes, median (min–max) over interleaved repeats, and the best strategy's verdicts."""
    path = os.path.join(results_dir, "step-bench.json")
    document = load(path) if os.path.exists(path) else {}
    if document.get("schema") != STEP_BENCH_SCHEMA:
        register_step_verdicts(numbers, None, [])  # every quoted verdict: not measured
        message = f"*{step_bench_problem(path, document)}: run python -m benchmarks.step_bench.*"
        return {"table.step_bench": message, "table.step_bench_verdict": message}
    rows = step_bench_rows(numbers, path, document["measurements"])
    verdicts = register_step_verdicts(numbers, path,
                                      document["verdict"]["per_world_size_and_model"])
    return {"table.step_bench": table(STEP_BENCH_COLUMNS, rows),
            "table.step_bench_verdict": table(STEP_VERDICT_COLUMNS, verdicts)}


def step_bench_problem(path, document):
    """Why the step benchmark's file cannot be read: there is none, or an older schema wrote it."""
    if not document:
        return f"No {repo_relative(path)}"
    return (f"{repo_relative(path)} is from an older schema ({document.get('schema')!r}, not "
            f"{STEP_BENCH_SCHEMA}) and must be written again")


def step_bench_rows(numbers, path, measurements):
    """One table row per (model, world size, configuration): each field's median (min–max) over
    the repeats, registered as 'stepbench.<model>.w<n>.<configuration>.<field>.median' and so on."""
    repeats = {}  # (model, world size, configuration) -> indices of its rows, one per repeat
    for index, row in enumerate(measurements):
        configuration = (row["model"], row["world_size"], row["configuration"])
        repeats.setdefault(configuration, []).append(index)
    rows = []
    for (model, world, name), indices in repeats.items():
        key = f"stepbench.{model}.w{world}.{name}"
        cells = [repeat_spread_text(numbers, f"{key}.{field}", path, indices, field, unit)
                 for field, unit in STEP_BENCH_FIELDS.items()]
        steps = measurements[indices[0]].get("steps", "—")
        rows.append([model, world, name, len(indices), steps] + cells)
    return rows


def repeat_spread_text(numbers, key, path, indices, field, unit):
    """Register `key.median`, `.min`, `.max` and `.n` of `field` over the rows `indices` (one per
    repeat); returns 'median (min–max)', or '—' where the field is None (no communication)."""
    inputs = [f"{path}#measurements[{index}].{field}" for index in indices]
    units = {"median": unit, "min": unit, "max": unit, "n": "count"}
    numbers.derived_fields(key, lambda *values: spread(values), inputs, units,
                           f"results_folder.spread over the repeats of {field}")
    return "—" if numbers.value(f"{key}.median") is None else numbers.spread_text(key)


def register_step_verdicts(numbers, path, report):
    """Per model and world size, 'stepbench.<model>.w<n>.best' (the best hand-written strategy)
    and, against DDP ('.vs_ddp') and DDP on the same transport ('.vs_same'), the step ratio's
    '.median', '.min', '.max', '.n', '.low' and '.high', the DDP configuration '.ddp' and the
    '.verdict'. The MLP and CNN at 2 and 4 ranks are always registered (not
    measured without a report). Returns the verdict table's rows."""
    where = {(entry["model"], entry["world_size"]): index for index, entry in enumerate(report)}
    quoted = [(model, world) for model in ("mlp", "cnn") for world in (2, 4)]
    rows = []
    for model, world in list(where) + [pair for pair in quoted if pair not in where]:
        index = where.get((model, world))
        source = None if index is None else path
        entry = f"verdict.per_world_size_and_model[{index}]"
        name = f"stepbench.{model}.w{world}"
        numbers.measured(f"{name}.best", source, f"{entry}.best_strategy", "name")
        vs_ddp, vs_same = [register_side(numbers, f"{name}.{short}", source, f"{entry}.{side}")
                           for short, side in STEP_VERDICT_SIDES.items()]
        if index is not None:
            rows.append([model, world, numbers.text(f"{name}.best"), *vs_ddp,
                         numbers.text(f"{name}.vs_same.ddp"), *vs_same])
    return rows


def register_side(numbers, key, source, side):
    """One comparison of the best strategy with a DDP configuration (`side`, a JSON path in
    `source`): the step ratio within each repeat, its spread and interval, and the verdict by the
    document's one rule (results_folder.verdict, not the file's own); returns its table cells."""
    numbers.measured(f"{key}.ddp", source, f"{side}.ddp", "name")
    ratios = [f"{source}#{side}.step_ratio.per_repeat[{index}]"
              for index in range(len(lookup(load(source), f"{side}.step_ratio.per_repeat")))
              ] if source else []
    numbers.paired_values(key, ratios, "ratio", 1.0,
                          "the best strategy's step / DDP's, within each repeat",
                          already_ratios=True)
    numbers.verdict(f"{key}.verdict", key)
    return [numbers.spread_text(key), numbers.text(f"{key}.verdict")]
