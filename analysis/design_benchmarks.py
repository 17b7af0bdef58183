"""§4.5 beside the strategy sweep: benchmarks/step_bench.py's tables, shared memory's step against
DDP's and flat's, and the best strategy's verdicts; a missing file: "not measured"."""
import itertools
import os

from analysis.design_numbers import indices_by, load, lookup, paired_by_repeat, read_results, table
from analysis.results_folder import STEP_BENCH_SCHEMA

STEP_BENCH_FIELDS = {"mean_step_s": "ms", "mean_compute_s": "ms", "mean_comm_exposed_s": "ms",
                     "mean_comm_busy_s": "ms", "overlap": "percent", "step_ratio_to_ddp": "ratio"}
SHM_AGAINST = ("ddp", "flat")  # flat-shm's step against DDP's and flat's, both over gloo


def step_bench_section(numbers, results_dir):
    """Per configuration the median (min–max) over the repeats; the best strategy's verdicts."""
    path = os.path.join(results_dir, "step-bench.json")
    document, problem = read_results(path, STEP_BENCH_SCHEMA, "python -m benchmarks.step_bench")
    measurements = document.get("measurements", [])
    shared_memory_steps(numbers, path, measurements)
    if problem:
        step_verdicts(numbers, None, [])  # every quoted verdict: not measured
        return {"table.step_bench": problem, "table.step_bench_verdict": problem}
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


def shared_memory_steps(numbers, path, measurements):
    """'shm.<model>.w<n>.step_vs_<other>': flat-shm's mean step over SHM_AGAINST's, per repeat."""
    where = indices_by(measurements, "model", "world_size", "configuration")
    for model, world, other in itertools.product(("mlp", "cnn"), (2, 4), SHM_AGAINST):
        name = f"shm.{model}.w{world}.step_vs_{other}"
        numbers.paired_values(f"{name}.ratio", paired_by_repeat(
            path, measurements, "mean_step_s", where.get((model, world, "flat-shm"), []),
            where.get((model, world, other), [])), "ratio", 1.0,
            "flat-shm's mean step / the other's, in the same repeat", verdict=name)


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
