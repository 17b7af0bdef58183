"""One machine made to pay (§4.5): the shared-memory all-reduce against gloo's, data parallelism
with it against one process, the hand-written sync against DDP on the same transport, and the time
to a target accuracy against the classic MNIST recipe.

Inputs: results/allreduce-bench.json (its shm rows); results/one-machine/, a sweep of its own
(single, ddp, ddp-no-sync, flat and shm, repeated and interleaved: the runs compared here ran side
by side); the step benchmark's verdicts (design_benchmarks) and results/time-to-accuracy.json. A
missing one reads "not measured".
"""
import os
import statistics

from analysis import scaling_inputs
from analysis.design_emulated import runs_of
from analysis.design_numbers import load, ratio, table, unchanged
from analysis.design_performance import register_run_spreads

SHM_WORLDS = (2, 3, 4)
SWEEP_SERIES = ("single", "ddp", "manual flat", "manual shm")
SWEEP_COLUMNS = ["configuration", "step", "exposed comm", "throughput",
                 "÷ one process's throughput"]
TIME_TO_ACCURACY_COLUMNS = ["model", "run", "reached", "time to target", "samples to target",
                            "time ÷ the classic recipe's"]


def one_machine_section(numbers, results_dir):
    """The context of §4.5: its numbers and the time-to-accuracy table."""
    shm_allreduce(numbers, os.path.join(results_dir, "allreduce-bench.json"))
    rows = one_machine_sweep(numbers, os.path.join(results_dir, "one-machine"))
    numbers.derived("drift.single_mlp", ratio, ["one_machine.mlp.single.w1.throughput.median",
                                                "sweep.mlp.single.w1.throughput.median"],
                    "ratio", "the one-machine sweep's single-process median throughput / "
                             "the main sweep's")
    return {"text.same_transport": same_transport(numbers),
            "table.one_machine": table(SWEEP_COLUMNS, rows) if rows else
            "*Not measured: run the sweep of analysis/make_reference_results.sh.*",
            "table.time_to_accuracy": time_to_accuracy_table(
        numbers, os.path.join(results_dir, "time-to-accuracy.json"))}


def one_machine_sweep(numbers, folder):
    """Every series' spreads ('one_machine.<model>.<series>.w<n>.<field>') and, per model and
    world size, shm's median throughput over one process's and over DDP's."""
    grouped = scaling_inputs.grouped_runs(folder)
    rows = []
    for model in ("mlp", "cnn"):
        single_runs = runs_of(grouped, model, "single", 1)
        for series in SWEEP_SERIES:
            for world in (1,) if series == "single" else (2, 4):
                found = runs_of(grouped, model, series, world)
                name = prefix(model, series, world)
                register_run_spreads(numbers, name, found)
                numbers.paired_ratio(f"{name}.vs_single", found, single_runs,
                                     "throughput_samples_per_s",
                                     formula="throughput / one process's, in the same round")
                if found:
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


def prefix(model, series, world):
    """The numbers' prefix of one configuration of results/one-machine/."""
    return f"one_machine.{model}.{series.replace('manual ', '')}.w{world}"


def shm_allreduce(numbers, bench):
    """The worst shm / gloo bus-bandwidth ratio at 1 MiB and above, per world size."""
    report = load(bench).get("shm_target", {}) if os.path.exists(bench) else {}
    for world in SHM_WORLDS:
        field = f"shm_target.per_world_size.{world}.worst_ratio"
        numbers.measured(f"shm.allreduce.w{world}.worst_ratio",
                         bench if str(world) in report.get("per_world_size", {}) else None,
                         field, "ratio")
    largest = [row["busbw_ratio_to_gloo"] for row in load(bench).get("comparisons", [])
               if row["implementation"] == "shm" and row["bytes"] >= 2**20] \
        if os.path.exists(bench) else []
    numbers.add("shm.allreduce.best_ratio", max(largest) if largest else None, "ratio",
                kind="derived", inputs=[f"{bench}#comparisons"],
                formula="the largest shm / gloo busbw ratio at 1 MiB and above")


def same_transport(numbers):
    """§4.5's sentence on the step benchmark: per model and world size, the best hand-written
    strategy against DDP on its own transport (the stepbench.* numbers of design_benchmarks)."""
    parts = []
    for model in ("mlp", "cnn"):
        for world in (2, 4):
            name = f"stepbench.{model}.w{world}"
            if numbers.value(f"{name}.best") is not None:
                parts.append(f"{model.upper()} at {world} ranks, "
                             f"`{numbers.text(name + '.best')}` at "
                             f"{numbers.claim(name + '.vs_same', name + '.vs_same.verdict')}")
    if not parts:
        return "*The step benchmark (`python -m benchmarks.step_bench`) is not measured.*"
    return ("**The same transport** (`results/step-bench.json`: all configurations in the same "
            "processes, step by step; the best hand-written strategy's step over DDP's on its "
            "transport, within each repeat): " + "; ".join(parts) + ".")


def time_to_accuracy_table(numbers, path):
    """Per model and run (ours per world size and sync, the classic recipe): the median time to
    the target over the repeats, and its ratio to the recipe's; per model, ours' best ratio and
    its median samples to target over the recipe's."""
    if not os.path.exists(path):
        for model in ("mlp", "cnn"):
            for name in ("target", "best.vs_classic", "best.samples", "best.samples_vs_classic"):
                numbers.add(f"tta.{model}.{name}", None, "ratio")
        return "*Not measured: run `python -m benchmarks.time_to_accuracy`.*"
    document = load(path)
    for model in ("mlp", "cnn"):
        numbers.measured(f"tta.{model}.target", path, f"targets.{model}", "percent")
    rows = []
    best = {}
    for index, summary in enumerate(document.get("summary", [])):
        model = summary["model"]
        name = f"tta.{model}.{summary['name']}.w{summary['world_size']}"
        field = f"summary[{index}]"
        numbers.measured(f"{name}.median_s", path, f"{field}.median_time_to_target_s", "s")
        vs_classic = numbers.measured(f"{name}.vs_classic", path, f"{field}.ratio_to_classic",
                                      "ratio")
        samples = median_samples(document, model, summary["name"], summary["world_size"])
        numbers.add(f"{name}.samples", samples, "count", kind="derived", inputs=[f"{path}#runs"],
                    formula="median samples to target over the repeats that reached it")
        if summary["name"] != "classic" and vs_classic is not None \
                and vs_classic < best.get(model, (float("inf"), None))[0]:
            best[model] = (vs_classic, name)
        times = summary["times_to_target_s"]
        reached = sorted(time for time in times if time is not None)
        for label, value in (("fastest_s", reached[0] if reached else None),
                             ("slowest_s", reached[-1] if reached else None)):
            numbers.add(f"{name}.{label}", value, "s", kind="derived",
                        inputs=[f"{path}#{field}.times_to_target_s"],
                        formula=f"the {label[:-2]} repeat that reached the target")
        shown = numbers.text(f"{name}.median_s")
        if len(reached) > 1:
            shown += f" ({numbers.text(name + '.fastest_s')}–{numbers.text(name + '.slowest_s')})"
        rows.append([model.upper(), run_label(summary),
                     f"{len(reached)} of {len(times)}", shown, numbers.text(f"{name}.samples"),
                     numbers.text(f"{name}.vs_classic")])
    for model in ("mlp", "cnn"):
        chosen = best.get(model, (None, None))[1]
        classic = f"tta.{model}.classic.w1"
        for field in ("vs_classic", "samples"):
            numbers.derived(f"tta.{model}.best.{field}", unchanged,
                            [f"{chosen}.{field}"] if chosen else [], "ratio" if field ==
                            "vs_classic" else "count", "ours' run with the smallest ratio")
        numbers.derived(f"tta.{model}.best.samples_vs_classic", ratio,
                        [f"{chosen}.samples", f"{classic}.samples"] if chosen else [], "ratio",
                        "ours' median samples to target / the recipe's")
    return table(TIME_TO_ACCURACY_COLUMNS, rows)


def run_label(summary):
    """A row's run as a reader should read it: the classic recipe trains its own CNN, whichever
    model's target it is timed to."""
    ranks = summary["world_size"]
    where = f"{ranks} rank{'s' if ranks > 1 else ''}"
    if summary["name"] == "classic":
        return f"the classic recipe's CNN, {where}"
    return f"ours, {summary['name']}, {where}"


def median_samples(document, model, name, world):
    """The median samples to `model`'s target over the repeats of one run that reached it."""
    samples = [run["samples_to_target"].get(model) for run in document.get("runs", [])
               if run["name"] == name and run["world_size"] == world
               and (run["model"] in (model, None))]
    reached = sorted(value for value in samples if value is not None)
    return round(statistics.median(reached)) if reached else None  # samples are whole
