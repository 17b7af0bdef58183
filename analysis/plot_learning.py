"""Learning and scaling: curves-<model>.png (accuracy and loss per epoch, every repeat drawn),
scaling-<model>.png (throughput, speedup and efficiency against world size, median of repeats),
efficiency-projected.png (§5.4's α-β projection against ranks) and memory-per-rank.png (each ZeRO
level's model states per rank, counted and by the formulas: §7)."""
import os
import statistics

import matplotlib.pyplot as plt
import numpy as np

from analysis import cost_model, zero_formulas
from analysis.design_numbers import load
from analysis.plot_common import colour, errors, medians, order, plural, series_rank
from analysis.results_folder import paired, spread

LINE_STYLES = ("-", "--", ":", "-.")  # one per world size in the learning curves
PROJECTED_WORLDS = 2 ** np.arange(1, 13)  # 2 to 4,096 ranks


def plot_curves(groups, model):
    """Validation accuracy and training loss against samples seen and against wall-clock."""
    figure, axes = plt.subplots(2, 2, figsize=(14, 8), sharex="col")
    worlds = sorted({world for _, _, world, _ in groups})
    for (_, series, world, _), runs in sorted(groups.items(), key=order):
        line_style = LINE_STYLES[worlds.index(world) % len(LINE_STYLES)]
        style = dict(color=colour(series), linestyle=line_style, linewidth=1, marker=".")
        for index, run in enumerate(runs):
            style["label"] = f"{series}, {plural(world, 'process')}" if index == 0 else "_repeat"
            epochs = run["epochs"]
            for (accuracy, loss), key in zip(axes.T, ("samples_seen", "elapsed_s")):
                abscissa = [epoch[key] for epoch in epochs]
                accuracy.plot(abscissa, [100 * epoch["val_accuracy"] for epoch in epochs], **style)
                loss.plot(abscissa, [epoch["train_loss"] for epoch in epochs], **style)
    axes[0][0].set(ylabel="validation accuracy (%)", title="against samples seen (the work done)")
    axes[0][1].set(title="against training wall-clock (time to accuracy)")
    axes[1][0].set(ylabel="training loss (epoch mean)",
                   xlabel="samples seen (all processes together)")
    axes[1][1].set(xlabel="training wall-clock (s, cumulative over epochs)")
    for axis in axes.flat:
        axis.grid(alpha=0.3)
    axes[0][1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.suptitle(f"{model.upper()}: learning curves, one point per epoch, "
                    "every repeat drawn (thin)")
    figure.tight_layout()
    return figure


def plot_scaling(groups, model):
    """Throughput, speedup and efficiency against world size, the ideal and the compute ceiling;
    speedup and efficiency pair each run with the single process of its round (results_folder)."""
    lines, singles = {}, next((runs for (_, series, _, _), runs in groups.items()
                               if series == "single"), None)
    for (_, series, world, _), runs in groups.items():
        if series != "single":
            speedups = [run["throughput_samples_per_s"] / single["throughput_samples_per_s"]
                        for run, single in paired(runs, singles or [])]
            lines.setdefault(series, {})[world] = (
                spread([run["throughput_samples_per_s"] for run in runs]), spread(speedups))
    if not singles or not lines:
        return None  # a speedup needs a single-process run and at least one other
    single, one = spread([run["throughput_samples_per_s"] for run in singles]), spread([1.0])
    worlds = sorted({1} | {world for points in lines.values() for world in points})
    figure, axes = plt.subplots(1, 3, figsize=(17, 5))
    for series in sorted(lines, key=series_rank):
        points = {1: (single, one), **lines[series]}  # every line starts from 1 process
        sizes = np.array(sorted(points))
        style = dict(color=colour(series), label=series, marker="o", capsize=3)
        if series == "ddp-no-sync":
            style.update(linestyle="--", label="ddp-no-sync: compute ceiling (no communication)")
        for axis, index, scale in zip(axes, (0, 1, 1), (1.0, 1.0, 1 / sizes)):
            values = [points[world][index] for world in sizes]
            axis.errorbar(sizes, medians(values, scale), yerr=errors(values, scale), **style)
    ideals = (single["median"] * np.array(worlds), worlds, [1] * len(worlds))
    ylabels = ("samples per second (all processes)", "speedup over 1 process",
               "efficiency (speedup / processes)")
    for axis, ideal, ylabel in zip(axes, ideals, ylabels):
        axis.plot(worlds, ideal, "k:", label="ideal (linear)")
        axis.set(xlabel="processes (world size)", ylabel=ylabel, xticks=worlds)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    cores = next(iter(groups.values()))[0]["environment"]["cores"]
    figure.suptitle(f"{model.upper()}: scaling, median of repeats (bars: slowest to fastest; "
                    f"speedup within each round), {cores} cores shared by every process")
    figure.tight_layout()
    return figure


def plot_projected_efficiency(groups):
    """Per model, one process's compute per step (median of repeats) over that compute plus one
    flat all-reduce of its gradients, against ranks, on each of cost_model's cluster links."""
    singles = {model: runs for (model, series, world, _), runs in groups.items()
               if (series, world) == ("single", 1) and "memory" in runs[0]}  # older: no bytes
    if not singles:
        return None
    figure, axes = plt.subplots(1, len(singles), figsize=(7 * len(singles), 5), squeeze=False)
    for axis, (model, runs) in zip(axes[0], sorted(singles.items())):
        compute = statistics.median(run["timing"]["across_ranks"]["compute"]["mean"]
                                    for run in runs)
        nbytes = runs[0]["memory"]["per_rank"][0]["gradients"]
        for index, gbit in enumerate(cost_model.CLUSTER_LINKS_GBIT):
            for algorithm, line in (("ring", "-"), ("halving-doubling", "--")):
                efficiency = [cost_model.project_layout(  # one flat all-reduce after backward
                    compute, 0.0, [nbytes], [], world, cost_model.CLUSTER_ALPHA_S,
                    cost_model.link_beta(gbit), overlap=False, algorithm=algorithm)["efficiency"]
                    for world in PROJECTED_WORLDS]
                axis.plot(PROJECTED_WORLDS, efficiency,
                          color=f"C{index}", linestyle=line, label=f"{gbit:g} Gbit/s, {algorithm}",
                          gid=f"{gbit:g}g {algorithm}")
        axis.set(xscale="log", ylim=(0, 1.02), xlabel="ranks", ylabel="projected efficiency",
                 title=f"{model.upper()}: {compute * 1e3:.3g} ms of compute, "
                       f"{nbytes / 1e6:.3g} MB of gradients a step")
        axis.set_xticks(PROJECTED_WORLDS, [str(world) for world in PROJECTED_WORLDS])
        axis.minorticks_off()
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("Projected efficiency: compute / (compute + one flat all-reduce after "
                    f"backward), α = {cost_model.CLUSTER_ALPHA_S * 1e6:g} µs a message step (§5.4)")
    figure.tight_layout()
    return figure


def plot_memory(path):
    """Per model, each level's median model states per rank (points) and its formula (lines)."""
    rows = load(path).get("measurements", []) if os.path.exists(path) else []
    models = sorted({row["model"] for row in rows}, reverse=True)  # the MLP first
    figure, axes = plt.subplots(1, len(models) or 1, figsize=(12, 4.5), squeeze=False)
    for axis, model in zip(axes[0], models):
        for index, level in enumerate(zero_formulas.LEVELS):
            mine = [row for row in rows if (row["model"], row["configuration"]) == (model, level)]
            worlds = sorted({row["world_size"] for row in mine})
            axis.plot(worlds, [zero_formulas.model_states(level, mine[0]["parameters"], world)
                               ["model_states"] / 1e6 for world in worlds], color=f"C{index}",
                      label="DDP" if index == 0 else f"ZeRO-{index}")
            axis.plot(worlds, [statistics.median(row["held_bytes"]["model_states"] / 1e6 for row
                               in mine if row["world_size"] == world) for world in worlds], "o",
                      color=f"C{index}")
        axis.set(title=f"{model.upper()}: lines the formulas, points counted", ylim=(0, None),
                 xlabel="ranks", ylabel="model states per rank (MB)", xticks=worlds)
        axis.legend(fontsize=8)
    figure.tight_layout()
    return figure if models else plt.close(figure)
