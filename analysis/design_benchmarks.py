"""The measurements beside the strategy sweep (§4.5, §6): benchmarks/step_bench.py's tables, the
shared-memory all-reduce against gloo's and results/one-machine/; a missing file: "not measured"."""
import os

from analysis.design_numbers import indices_by, load, lookup, read_results, table
from analysis.design_performance import STEP, THROUGHPUT, register_run_spreads, slug
from analysis.results_folder import STEP_BENCH_SCHEMA
from analysis.scaling_inputs import grouped_runs, runs_of

STEP_BENCH_FIELDS = {"mean_step_s": "ms", "mean_compute_s": "ms", "mean_comm_exposed_s": "ms",
                     "mean_comm_busy_s": "ms", "overlap": "percent", "step_ratio_to_ddp": "ratio"}
ONE_MACHINE = [(series, world) for series in ("single", "ddp", "manual flat", "manual flat-shm")
               for world in ((1,) if series == "single" else (2, 4))]


def step_bench_section(numbers, results_dir):
    """Per configuration the median (min–max) over the repeats; the best strategy's verdicts."""
    path = os.path.join(results_dir, "step-bench.json")
    document, problem = read_results(path, STEP_BENCH_SCHEMA, "python -m benchmarks.step_bench")
    if problem:
        step_verdicts(numbers, None, [])  # every quoted verdict: not measured
        return {"table.step_bench": problem, "table.step_bench_verdict": problem}
    measurements = document["measurements"]
    rows = []
    for (model, world, name), indices in indices_by(measurements, "model", "world_size",
                                                    "configuration").items():
        cells = []
        for field, unit in STEP_BENCH_FIELDS.items():
            spread = f"stepbench.{model}.w{world}.{name}.{field}"
            numbers.spread_of(spread, [f"{path}#measurements[{index}].{field}"
                                       for index in indices], unit, field)
            cells.append("—" if numbers.value(f"{spread}.median") is None  # not communicating
                         else numbers.spread_text(spread))
        steps = measurements[indices[0]].get("steps", "—")
        rows.append([model, world, name, len(indices), steps] + cells)
    verdicts = step_verdicts(numbers, path, document["verdict"]["per_world_size_and_model"])
    return {"table.step_bench": table(["model", "ranks", "configuration", "repeats",
                                       "steps (all ranks)", "step", "compute", "exposed comm",
                                       "busy comm", "overlap", "× DDP"], rows),
            "table.step_bench_verdict": table(["model", "ranks", "best strategy", "× DDP",
                                               "verdict", "same-transport DDP", "× it",
                                               "verdict"], verdicts)}


def step_verdicts(numbers, path, report):
    """The rows: each best strategy ('stepbench.<model>.w<n>.best'), its step over DDP's ('.vs_ddp')
    and its transport's DDP's ('.vs_same') per repeat, verdicts; MLP, CNN at 2, 4 ranks always."""
    where = {(entry["model"], entry["world_size"]): index for index, entry in enumerate(report)}
    rows = []
    for model, world in dict.fromkeys([*where, ("mlp", 2), ("mlp", 4), ("cnn", 2), ("cnn", 4)]):
        index = where.get((model, world))
        source = None if index is None else path
        entry = f"verdict.per_world_size_and_model[{index}]"
        name = f"stepbench.{model}.w{world}"
        numbers.measured(f"{name}.best", source, f"{entry}.best_strategy", "name")
        sides = []
        for short, side in (("vs_ddp", "against_ddp"), ("vs_same", "against_same_transport_ddp")):
            side_key, side = f"{name}.{short}", f"{entry}.{side}"
            numbers.measured(f"{side_key}.ddp", source, f"{side}.ddp", "name")
            count = len(lookup(load(source), f"{side}.step_ratio.per_repeat")) if source else 0
            numbers.paired_values(side_key, [f"{source}#{side}.step_ratio.per_repeat[{repeat}]"
                                             for repeat in range(count)], "ratio", 1.0,
                                  "the best strategy's step / DDP's, within each repeat",
                                  already_ratios=True, verdict=f"{side_key}.verdict")
            sides.append([numbers.spread_text(side_key), numbers.text(f"{side_key}.verdict")])
        if index is not None:
            rows.append([model, world, numbers.text(f"{name}.best"), *sides[0],
                         numbers.text(f"{name}.vs_same.ddp"), *sides[1]])
    return rows


def one_machine_section(numbers, results_dir):
    """§4.5's context: shm's all-reduce against gloo's, each model's series in one-machine/ and
    shm's step over DDP's and flat's, in each round (the same global batch per step)."""
    bench = os.path.join(results_dir, "allreduce-bench.json")
    for world in (2, 3, 4):  # the worst shm / gloo bus-bandwidth ratio at 1 MiB and above
        numbers.measured(f"shm.allreduce.w{world}.worst_ratio",
                         bench if os.path.exists(bench) else None,
                         f"shm_target.per_world_size.{world}.worst_ratio", "ratio")
    grouped = grouped_runs(os.path.join(results_dir, "one-machine"))
    rows = []
    for model in [model for model in ("mlp", "cnn") if any(key[0] == model for key in grouped)]:
        single_runs = runs_of(grouped, model, "single", 1)
        for series, world in ONE_MACHINE:
            found = runs_of(grouped, model, series, world)
            if found:
                name = f"one_machine.{model}.{slug(series)}.w{world}"
                register_run_spreads(numbers, name, found, ("step", "comm_exposed", "throughput"))
                numbers.paired_ratio(f"{name}.vs_single", found, single_runs, THROUGHPUT,
                                     formula="throughput / one process's, in the same round")
                rows.append([f"{model.upper()} {slug(series)}, {world}"]
                            + [numbers.spread_text(f"{name}.{field}") for field in
                               ("step", "comm_exposed", "throughput", "vs_single")])
        for world, against in ((2, "ddp"), (2, "manual flat"), (4, "ddp"), (4, "manual flat")):
            name = f"shm.{model}.w{world}.step_vs_{slug(against)}"
            numbers.paired_ratio(f"{name}.ratio", runs_of(grouped, model, "manual flat-shm", world),
                                 runs_of(grouped, model, against, world), STEP,
                                 formula="shm's mean step / the other's", verdict=name)
    numbers.derived("drift.single_mlp", lambda mine, theirs: mine / theirs,
                    ["one_machine.mlp.single.w1.throughput.median",
                     "sweep.mlp.single.w1.throughput.median"], "ratio",
                    "the one-machine sweep's single-process median throughput / the main sweep's")
    columns = ["configuration", "step", "exposed comm", "throughput", "÷ one process's throughput"]
    return {"table.one_machine": table(columns, rows) if rows else
            "*Not measured: run the sweep of analysis/make_reference_results.sh.*"}
