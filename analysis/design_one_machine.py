"""One machine made to pay (§4.7): the shared-memory all-reduce against gloo's, data parallelism
with it against one process, the hand-written sync against DDP on the same transport, and the time
to a target accuracy against the classic MNIST recipe.

Inputs: results/allreduce-bench.json (its shm rows); results/one-machine/, a sweep of its own
(single, ddp, ddp-no-sync, flat and shm, repeated and interleaved: the runs compared here ran side
by side); results/step-bench.json (its target report) and results/time-to-accuracy.json. A missing
one reads "not measured".
"""
import os

from analysis.design_numbers import load, ratio, table
from analysis.design_performance import register_run_spreads
from runtime import results

SHM_WORLDS = (2, 3, 4)
SWEEP_SERIES = ("single", "ddp", "manual flat", "manual shm")
THROUGHPUT_TARGET = 0.85  # MLP at 2 ranks with --sync shm, over one process with 2 threads
TIME_TO_ACCURACY_COLUMNS = ["model", "run", "ranks", "repeats", "reached", "time to target",
                            "÷ the classic recipe's"]


def one_machine_section(numbers, results_dir):
    """The context of §4.7: its numbers and the time-to-accuracy table."""
    shm_allreduce(numbers, os.path.join(results_dir, "allreduce-bench.json"))
    one_machine_sweep(numbers, os.path.join(results_dir, "one-machine"))
    numbers.stated("shm.throughput_target", THROUGHPUT_TARGET, "ratio", "code",
                   "the issue's target for the MLP at 2 ranks")
    same_transport(numbers, os.path.join(results_dir, "step-bench.json"))
    return {"table.time_to_accuracy": time_to_accuracy_table(
        numbers, os.path.join(results_dir, "time-to-accuracy.json"))}


def one_machine_sweep(numbers, folder):
    """Every series' spreads ('one_machine.<model>.<series>.w<n>.<field>') and, per model and
    world size, shm's median throughput over one process's and over DDP's."""
    runs, _ = results.load_folder(folder, note=lambda _: None) if os.path.isdir(folder) \
        else ([], {})
    grouped = results.repeats(runs)
    for model in ("mlp", "cnn"):
        for series in SWEEP_SERIES:
            for world in (1,) if series == "single" else (2, 4):
                found = [runs for (run_model, run_series, run_world, _), runs in grouped.items()
                         if (run_model, run_series, run_world) == (model, series, world)]
                register_run_spreads(numbers, prefix(model, series, world),
                                     found[0] if found else [])
        single = f"{prefix(model, 'single', 1)}.throughput.median"
        for world in (2, 4):
            shm = f"{prefix(model, 'manual shm', world)}.throughput.median"
            for against, source in (("single", single),
                                    ("ddp", f"{prefix(model, 'ddp', world)}.throughput.median"),
                                    ("flat",
                                     f"{prefix(model, 'manual flat', world)}.throughput.median")):
                numbers.derived(f"shm.{model}.w{world}.throughput_vs_{against}", ratio,
                                [shm, source], "ratio",
                                f"median throughput of the shm runs / of the {against} runs")
            for against in ("ddp", "manual flat"):  # the same global batch per step
                numbers.verdict(f"shm.{model}.w{world}.step_vs_{against.replace('manual ', '')}",
                                f"{prefix(model, 'manual shm', world)}.step",
                                f"{prefix(model, against, world)}.step")


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
                kind="derived", file=bench,
                formula="the largest shm / gloo busbw ratio at 1 MiB and above")


def same_transport(numbers, path):
    """The step benchmark's fastest hand-written strategy against DDP, and against DDP on the same
    transport (shm: DDP with the shm comm hook), per model and world size."""
    report = load(path).get("target", {}).get("per_world_size_and_model", []) \
        if os.path.exists(path) else []
    for index, row in enumerate(report):
        name = f"same_transport.{row['model']}.w{row['world_size']}"
        field = f"target.per_world_size_and_model[{index}]"
        numbers.measured(f"{name}.best", path, f"{field}.best_strategy", "name")
        numbers.measured(f"{name}.vs_ddp", path, f"{field}.step_ratio_to_ddp", "ratio")
        numbers.measured(f"{name}.vs_same", path,
                         f"{field}.step_ratio_to_same_transport_ddp", "ratio")


def time_to_accuracy_table(numbers, path):
    """Per model and run (ours per world size and sync, the classic recipe): the median time to
    the target over the repeats, and its ratio to the recipe's."""
    if not os.path.exists(path):
        return "*Not measured: run `python -m benchmarks.time_to_accuracy`.*"
    rows = []
    for index, summary in enumerate(load(path).get("summary", [])):
        name = f"tta.{summary['model']}.{summary['name']}.w{summary['world_size']}"
        field = f"summary[{index}]"
        numbers.measured(f"{name}.median_s", path, f"{field}.median_time_to_target_s", "s")
        numbers.measured(f"{name}.vs_classic", path, f"{field}.ratio_to_classic", "ratio")
        times = summary["times_to_target_s"]
        reached = sorted(time for time in times if time is not None)
        for label, value in (("fastest_s", reached[0] if reached else None),
                             ("slowest_s", reached[-1] if reached else None)):
            numbers.add(f"{name}.{label}", value, "s", kind="measured", file=path,
                        field=f"{field}.times_to_target_s")
        shown = numbers.text(f"{name}.median_s")
        if len(reached) > 1:
            shown += f" ({numbers.text(name + '.fastest_s')}–{numbers.text(name + '.slowest_s')})"
        rows.append([summary["model"].upper(), summary["name"], summary["world_size"],
                     len(times), f"{len(reached)} of {len(times)}", shown,
                     numbers.text(f"{name}.vs_classic")])
    return table(TIME_TO_ACCURACY_COLUMNS, rows)
