"""The measurements beside the strategy sweep (§4.5, §6): benchmarks/step_bench.py's tables, the
shared-memory all-reduce against gloo's and results/one-machine/. A missing file reads "not
measured"."""
import os

from analysis import scaling_inputs
from analysis.design_numbers import indices_by, load, lookup, read_results, table
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
            "*Not measured: run the sweep of analysis/make_reference_results.sh.*"}


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
