"""The measurements beside the strategy sweep: benchmarks/step_bench.py's tables (§6.3), and one
machine made to pay (§4.5): the shared-memory all-reduce against gloo's, results/one-machine/
and the time to a target accuracy against the classic MNIST recipe. A missing file reads "not
measured"."""
import math
import os
import statistics

from analysis import scaling_inputs
from analysis.design_numbers import indices_by, load, lookup, read_results, table, unchanged
from analysis.design_performance import register_run_spreads
from analysis.results_folder import STEP_BENCH_SCHEMA

STEP_BENCH_FIELDS = {"mean_step_s": "ms", "mean_compute_s": "ms", "mean_comm_exposed_s": "ms",
                     "mean_comm_busy_s": "ms", "overlap": "percent", "step_ratio_to_ddp": "ratio"}
# the verdict's comparisons: the numbers' name -> the results file's
STEP_VERDICT_SIDES = {"vs_ddp": "against_ddp", "vs_same": "against_same_transport_ddp"}
SHM_WORLDS = (2, 3, 4)
ONE_MACHINE_SERIES = ("single", "ddp", "manual flat", "manual shm")


def step_bench_section(numbers, results_dir):
    """Per configuration the median (min–max) over the repeats; the best strategy's verdicts."""
    path = os.path.join(results_dir, "step-bench.json")
    document, problem = read_results(path, STEP_BENCH_SCHEMA, "python -m benchmarks.step_bench")
    if problem:
        register_step_verdicts(numbers, None, [])  # every quoted verdict: not measured
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
            # None where the configuration does not communicate
            cells.append("—" if numbers.value(f"{spread}.median") is None
                         else numbers.spread_text(spread))
        steps = measurements[indices[0]].get("steps", "—")
        rows.append([model, world, name, len(indices), steps] + cells)
    verdicts = register_step_verdicts(numbers, path,
                                      document["verdict"]["per_world_size_and_model"])
    return {"table.step_bench": table(["model", "ranks", "configuration", "repeats",
                                       "steps (all ranks)", "step", "compute", "exposed comm",
                                       "busy comm", "overlap", "× DDP"], rows),
            "table.step_bench_verdict": table(["model", "ranks", "best strategy", "× DDP",
                                               "verdict", "same-transport DDP", "× it",
                                               "verdict"], verdicts)}


def register_step_verdicts(numbers, path, report):
    """Per model and world size the best hand-written strategy ('stepbench.<model>.w<n>.best') and
    its step over DDP's ('.vs_ddp') and over DDP on its transport ('.vs_same') within each repeat,
    with the document's verdict; the MLP and CNN at 2 and 4 ranks always. The table's rows."""
    where = {(entry["model"], entry["world_size"]): index for index, entry in enumerate(report)}
    quoted = [(model, world) for model in ("mlp", "cnn") for world in (2, 4)]
    rows = []
    for model, world in list(where) + [pair for pair in quoted if pair not in where]:
        index = where.get((model, world))
        source = None if index is None else path
        entry = f"verdict.per_world_size_and_model[{index}]"
        name = f"stepbench.{model}.w{world}"
        numbers.measured(f"{name}.best", source, f"{entry}.best_strategy", "name")
        sides = []
        for short, side in STEP_VERDICT_SIDES.items():
            side_key, side = f"{name}.{short}", f"{entry}.{side}"
            numbers.measured(f"{side_key}.ddp", source, f"{side}.ddp", "name")
            count = len(lookup(load(source), f"{side}.step_ratio.per_repeat")) if source else 0
            numbers.paired_values(side_key, [f"{source}#{side}.step_ratio.per_repeat[{repeat}]"
                                             for repeat in range(count)], "ratio", 1.0,
                                  "the best strategy's step / DDP's, within each repeat",
                                  already_ratios=True)
            numbers.verdict(f"{side_key}.verdict", side_key)
            sides.append([numbers.spread_text(side_key), numbers.text(f"{side_key}.verdict")])
        if index is not None:
            rows.append([model, world, numbers.text(f"{name}.best"), *sides[0],
                         numbers.text(f"{name}.vs_same.ddp"), *sides[1]])
    return rows


def one_machine_section(numbers, results_dir):
    """The context of §4.5."""
    shm_allreduce(numbers, os.path.join(results_dir, "allreduce-bench.json"))
    rows = one_machine_sweep(numbers, os.path.join(results_dir, "one-machine"))
    numbers.derived("drift.single_mlp", lambda mine, theirs: mine / theirs,
                    ["one_machine.mlp.single.w1.throughput.median",
                     "sweep.mlp.single.w1.throughput.median"],
                    "ratio", "the one-machine sweep's single-process median throughput / "
                             "the main sweep's")
    columns = ["configuration", "step", "exposed comm", "throughput",
               "÷ one process's throughput"]
    return {"table.one_machine": table(columns, rows) if rows else
            "*Not measured: run the sweep of analysis/make_reference_results.sh.*",
            "table.time_to_accuracy": time_to_accuracy_table(
                numbers, os.path.join(results_dir, "time-to-accuracy.json"))}


def one_machine_sweep(numbers, folder):
    """Each model's series in the folder ('one_machine.<model>.<series>.w<n>') and shm's step
    over DDP's and flat's, within each round; the table's rows."""
    grouped = scaling_inputs.grouped_runs(folder)
    runs_of = scaling_inputs.runs_of
    rows = []
    for model in [model for model in ("mlp", "cnn") if any(key[0] == model for key in grouped)]:
        single_runs = runs_of(grouped, model, "single", 1)
        for series in ONE_MACHINE_SERIES:
            for world in (1,) if series == "single" else (2, 4):
                found = runs_of(grouped, model, series, world)
                if not found:
                    continue
                name = f"one_machine.{model}.{series.replace('manual ', '')}.w{world}"
                register_run_spreads(numbers, name, found, ("step", "comm_exposed", "throughput"))
                numbers.paired_ratio(f"{name}.vs_single", found, single_runs,
                                     "throughput_samples_per_s",
                                     formula="throughput / one process's, in the same round")
                rows.append([f"{model.upper()} {series.replace('manual ', '')}, {world}"]
                            + [numbers.spread_text(f"{name}.{field}") for field in
                               ("step", "comm_exposed", "throughput", "vs_single")])
        for world in (2, 4):
            for against in ("ddp", "manual flat"):  # the same global batch per step
                name = f"shm.{model}.w{world}.step_vs_{against.replace('manual ', '')}"
                numbers.paired_ratio(f"{name}.ratio", runs_of(grouped, model, "manual shm", world),
                                     runs_of(grouped, model, against, world),
                                     "timing.across_ranks.step.mean",
                                     formula="shm's mean step / the other's")
                numbers.verdict(name, f"{name}.ratio")
    return rows


def shm_allreduce(numbers, bench):
    """The worst shm / gloo bus-bandwidth ratio at 1 MiB and above per world size."""
    document = load(bench) if os.path.exists(bench) else {}
    measured = document.get("shm_target", {}).get("per_world_size", {})
    for world in SHM_WORLDS:
        numbers.measured(f"shm.allreduce.w{world}.worst_ratio",
                         bench if str(world) in measured else None,
                         f"shm_target.per_world_size.{world}.worst_ratio", "ratio")


def time_to_accuracy_table(numbers, path):
    """Per model and run: time to the target over the repeats, samples to it, and the time over the
    classic recipe's; per model, ours' best ratio and its samples over the recipe's."""
    document = load(path) if os.path.exists(path) else {}
    for model in ("mlp", "cnn"):
        numbers.measured(f"tta.{model}.target", path if document else None, f"targets.{model}",
                         "percent")
    rows, best = [], {}
    for index, summary in enumerate(document.get("summary", [])):
        model, run, world = summary["model"], summary["name"], summary["world_size"]
        name, field = f"tta.{model}.{run}.w{world}", f"summary[{index}]"
        times = summary["times_to_target_s"]
        numbers.spread_of(f"{name}.time", [f"{path}#{field}.times_to_target_s[{repeat}]"
                                           for repeat, time in enumerate(times) if time],
                          "s", "the repeats' time to target")
        ratio = numbers.measured(f"{name}.vs_classic", path, f"{field}.ratio_to_classic", "ratio")
        samples = [repeat["samples_to_target"].get(model) for repeat in document["runs"]
                   if (repeat["name"], repeat["world_size"]) == (run, world)
                   and repeat["model"] in (model, None)]
        samples = [found for found in samples if found is not None]
        numbers.add(f"{name}.samples", round(statistics.median(samples)) if samples else None,
                    "count", kind="derived", inputs=[f"{path}#runs"],
                    formula="median samples to target over the repeats that reached it")
        if run != "classic" and ratio is not None and ratio < best.get(model, (math.inf,))[0]:
            best[model] = (ratio, name)
        # the classic recipe trains its own CNN, whichever model's target it is timed to
        where = f"{world} rank{'s' if world > 1 else ''}"
        rows.append([model.upper(), f"the classic recipe's CNN, {where}" if run == "classic"
                     else f"ours, {run}, {where}",
                     f"{sum(1 for time in times if time)} of {len(times)}",
                     numbers.spread_text(f"{name}.time"), numbers.text(f"{name}.samples"),
                     numbers.text(f"{name}.vs_classic")])
    for model in ("mlp", "cnn"):
        chosen = best.get(model, (None, None))[1]
        numbers.derived(f"tta.{model}.best.vs_classic", unchanged,
                        [f"{chosen}.vs_classic"] if chosen else [], "ratio",
                        "ours' run with the smallest ratio")
        numbers.derived(f"tta.{model}.best.samples_vs_classic", lambda mine, theirs: mine / theirs,
                        [f"{chosen}.samples", f"tta.{model}.classic.w1.samples"] if chosen
                        else [], "ratio", "ours' median samples to target / the recipe's")
    if not document:
        return "*Not measured: run `python -m benchmarks.time_to_accuracy`.*"
    return table(["model", "run", "reached", "time to target", "samples to target",
                  "time ÷ the classic recipe's"], rows)
