"""Figures from results files: every plot a reader sees is drawn here, from results/*.json only.

    python -m analysis.plots [--results-dir results] [--out-dir results/plots]

Writes time-breakdown-, curves- and scaling-<model>.png, efficiency-projected.png, allreduce.png,
bucket-sweep.png, timeline.png and memory-per-rank.png (plot_*.py); a figure without data is
skipped with a note.
Runs at a non-default --bucket-mb appear only in bucket-sweep.png.
"""
import argparse
import os

import matplotlib.pyplot as plt

from analysis import results_folder
from analysis.plot_breakdown import plot_time_breakdown
from analysis.plot_common import bucket_variant
from analysis.plot_communication import plot_allreduce, plot_bucket_sweep
from analysis.plot_learning import plot_curves, plot_memory, plot_projected_efficiency, plot_scaling
from analysis.plot_timeline import plot_timeline, read_traces

PER_MODEL = {"time-breakdown": plot_time_breakdown, "curves": plot_curves, "scaling": plot_scaling}


def save(figure, out_dir, name, written):
    """Write `figure` as out_dir/name; a note if it is None."""
    if figure is None:
        print(f"note: {name}: nothing to plot, skipped")
        return
    path = os.path.join(out_dir, name)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    written.append(path)


def of_sweep(runs, sweep):
    """The runs of one sweep grouped over their rounds (all runs if none names one)."""
    if any(results_folder.sweep_of(run) == sweep for run in runs):
        return results_folder.repeats(runs, sweep)
    return results_folder.repeats(runs)


def main(argv=None):
    """Draw every figure the results folder has data for; returns the paths written."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--out-dir", default=None, help="default: <results-dir>/plots")
    args = parser.parse_args(argv)
    out_dir = args.out_dir or os.path.join(args.results_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    runs, benchmarks = results_folder.load_folder(args.results_dir)
    groups = of_sweep(runs, "sweep")
    written = []
    for model in sorted({model for model, _, _, _ in groups}):
        # the model's configurations at the default bucket size: the figures compare strategies
        model_groups = {configuration: group for configuration, group in groups.items()
                        if configuration[0] == model and not bucket_variant(configuration)}
        for name, plot in PER_MODEL.items():
            figure = plot(model_groups, model) if model_groups else None
            save(figure, out_dir, f"{name}-{model}.png", written)
    save(plot_projected_efficiency(groups), out_dir, "efficiency-projected.png", written)
    allreduce = benchmarks[results_folder.ALLREDUCE_SCHEMA]
    save(plot_allreduce(allreduce) if allreduce else None, out_dir, "allreduce.png", written)
    save(plot_bucket_sweep(of_sweep(runs, "bucket")), out_dir, "bucket-sweep.png", written)
    save(plot_timeline(read_traces(args.results_dir)), out_dir, "timeline.png", written)
    save(plot_memory(os.path.join(args.results_dir, "sharding.json")), out_dir,
         "memory-per-rank.png", written)
    for path in written:
        print(f"plot: {path}")
    return written


if __name__ == "__main__":
    main()
