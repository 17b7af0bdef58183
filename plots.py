"""Figures from results files: every plot a reader sees is drawn here, from results/*.json only.

    python plots.py [--results-dir results] [--out-dir results/plots]

Reads every *.json in the folder: training runs (ddp-mnist-results/1) and, when present, the
benchmarks' allreduce-bench/1 and step-bench/1; skips other files with a note, and so a plot with
no data. Writes curves-, time-breakdown- and scaling-<model>.png per model, allreduce.png,
step-bench.png and bucket-sweep.png.

What the timing numbers mean (timing.py measures them per step on every rank):
  compute                forward + backward + optimizer
  exposed communication  the `sync` phase: time blocked after backward until gradients are averaged
  communication busy     launch-to-completion of every collective, summed per step (`comm_busy`)
  overlap                1 - exposed / busy (0 when busy is 0): the share of communication hidden
                         behind backward. Negative when exposed exceeds busy: exposed also counts
                         copying gradients into and out of buffers and waiting for the slowest rank.
For DDP the waiting happens inside backward (its hooks block there): the trainer counts as its
exposed communication each step's backward beyond the median backward of no_sync() calibration
steps; step_bench.py measures it the same way, interleaved.

Runs of bucketed or DDP with a --bucket-mb other than the default appear only in bucket-sweep.png,
so the other plots compare strategies at one bucket size. When several runs share a model, series
and world size, the newest (by `created`) is plotted.
"""
import argparse
import glob
import json
import os
import statistics
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from results import SCHEMA, validate  # noqa: E402
from timing import overlap  # noqa: E402

DEFAULT_BUCKET_MB = 25.0  # mlp_ddp.py's --bucket-mb default, which is also DDP's
BENCHMARK_SCHEMAS = ("allreduce-bench/1", "step-bench/1")  # written by benchmarks/*.py
SERIES_ORDER = ("single", "ddp", "manual per-param", "manual flat", "manual bucketed", "manual ring")
# Config keys that differ between otherwise identical runs without changing what is measured.
INCIDENTAL_KEYS = {"bucket_mb", "run_name", "results_dir", "data_dir", "offline_data_dir", "master_port",
                   "save_model", "world_size"}


def series_label(run):
    """How a run's synchronisation is named in legends: 'single', 'ddp', 'manual flat', '... fp16'."""
    config = run["config"]
    label = "manual " + config["sync"] if config["mode"] == "manual" else config["mode"]
    return label + (f" {config['compress']}" if config.get("compress") else "")


def world_size(run):
    return run["environment"]["world_size"]


def processes(world):
    return "1 process" if world == 1 else f"{world} processes"


def sort_key(label):
    return (SERIES_ORDER.index(label) if label in SERIES_ORDER else len(SERIES_ORDER), label)


def color_for(label):
    """The same colour for a series in every figure; other series (fp16, ...) share tab10's last four."""
    return plt.get_cmap("tab10").colors[sort_key(label)[0] + (0 if label in SERIES_ORDER else sum(map(ord, label)) % 4)]


def uses_buckets(run):
    config = run["config"]
    return config["mode"] == "ddp" or (config["mode"] == "manual" and config["sync"] == "bucketed")


def is_bucket_variant(run):
    return uses_buckets(run) and float(run["config"]["bucket_mb"]) != DEFAULT_BUCKET_MB


def load_folder(folder):
    """Training runs, and each benchmark's measurements by schema, from the folder's *.json (a note per skip)."""
    runs, benchmarks = [], {schema: [] for schema in BENCHMARK_SCHEMAS}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        name = os.path.basename(path)
        try:
            with open(path) as file:
                document = json.load(file)
        except (OSError, ValueError) as error:
            print(f"note: skipped {name}: not readable JSON ({error})")
            continue
        schema = document.get("schema") if isinstance(document, dict) else None
        problems = validate(document) if schema == SCHEMA else [f"no plot for schema {schema!r}"]
        if schema in benchmarks:
            benchmarks[schema] += document.get("measurements", [])
        elif problems:
            print(f"note: skipped {name}: {problems[0]}")
        else:
            runs.append(document)
    return runs, benchmarks


def newest_per_series(runs):
    """One run per (model, series, world size): the newest."""
    chosen = {}
    for run in sorted(runs, key=lambda run: run.get("created", "")):
        chosen[(run["config"]["model"], series_label(run), world_size(run))] = run
    return sorted(chosen.values(), key=lambda run: (world_size(run), sort_key(series_label(run))))


def plot_curves(runs, model):
    """Loss and accuracy, train and validation, per epoch: one line per series and world size."""
    figure, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    worlds = sorted({world_size(run) for run in runs})
    panels = [("train_loss", "training loss"), ("val_loss", "validation loss"),
              ("train_accuracy", "training accuracy (%)"), ("val_accuracy", "validation accuracy (%)")]
    for axis, (key, title) in zip(axes.flat, panels):
        scale = 100 if "accuracy" in key else 1
        for run in runs:
            epochs = run["epochs"]
            axis.plot([e["epoch"] for e in epochs], [scale * e[key] for e in epochs], fillstyle="none",
                      marker="os^vDx+*"[sort_key(series_label(run))[0]], color=color_for(series_label(run)),
                      linestyle=("-", "--", ":", "-.")[worlds.index(world_size(run)) % 4],
                      label=f"{series_label(run)}, {processes(world_size(run))}")
        axis.set(title=title, xlabel="epoch")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.suptitle(f"{model.upper()}: learning curves, one point per epoch (the global batch grows with the "
                    "processes; lines that coincide are identical numbers)")
    figure.tight_layout()
    return figure


def median_step(run, phase):
    return run["timing"]["across_ranks"][phase]["median"]


def overlap_text(busy, exposed):
    hidden = overlap(exposed, busy)
    return "" if hidden is None else f"overlap {100 * hidden:.0f}%"


def run_bar(run):
    """A training run's median seconds per step; overlap from the run's totals (DDP's exposed time is calibrated)."""
    busy, exposed = (sum(e[key] for e in run["epochs"]) for key in ("comm_busy_s", "comm_exposed_s"))
    note = "" if world_size(run) == 1 else overlap_text(busy, exposed)
    return {"label": f"{series_label(run)}\n{processes(world_size(run))}", "note": note,
            "compute": sum(median_step(run, phase) for phase in ("forward", "backward", "optimizer")),
            "exposed": median_step(run, "sync"), "data": median_step(run, "data"), "busy": median_step(run, "comm_busy")}


def step_bench_bar(row):
    """A step-bench configuration. DDP's exposed time is measured there (its backward minus ddp-no-sync's),
    so it is taken out of compute; for every other configuration exposed is the sync phase."""
    exposed, busy = row["median_exposed_comm_s"], row["median_comm_busy_s"]
    compute = sum(row[f"median_{phase}_s"] for phase in ("forward", "backward", "sync", "optimizer")) - exposed
    return {"label": f"{row['configuration']}\n{processes(row['world_size'])}", "note": overlap_text(busy, exposed),
            "compute": compute, "exposed": exposed, "data": 0.0, "busy": busy}


def draw_breakdown(axis, bars, title):
    """Stacked bars: compute, exposed communication, data (when any); communication busy as a black tick."""
    positions = range(len(bars))
    layers = [("compute", "compute (forward + backward + optimizer)", "tab:blue"),
              ("exposed", "exposed communication (waiting for gradients)", "tab:red"), ("data", "data", "tab:gray")]
    top = [0.0] * len(bars)
    for key, label, color in layers:
        heights = [bar[key] for bar in bars]
        if any(heights):
            axis.bar(positions, heights, bottom=top, label=label, color=color)
            top = [bottom + height for bottom, height in zip(top, heights)]
    axis.scatter(positions, [bar["busy"] for bar in bars], marker="_", s=400, color="black", zorder=3,
                 label="communication busy (in flight, may overlap compute)")
    for position, bar, height in zip(positions, bars, top):
        axis.annotate(bar["note"], (position, height), ha="center", va="bottom", fontsize=7)
    axis.set_xticks(list(positions), [bar["label"] for bar in bars], fontsize=8, rotation=30, ha="right")
    axis.set(ylabel="seconds per step (median over steps and ranks)", title=title)
    axis.grid(axis="y", alpha=0.3)


def plot_time_breakdown(runs, model):
    figure, axis = plt.subplots(figsize=(1.1 * len(runs) + 6, 5.5))
    draw_breakdown(axis, [run_bar(run) for run in runs], f"{model.upper()}: where a training step's time goes")
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    axis.text(1.02, 0, "DDP waits for its all-reduces inside\nbackward: its exposed communication\nis the excess of "
              "backward over\nno_sync() calibration steps.", transform=axis.transAxes, fontsize=8)
    figure.tight_layout()
    return figure


def plot_step_bench(rows):
    """benchmarks/step_bench.py's configurations side by side, one panel per model."""
    models = sorted({row["model"] for row in rows})
    figure, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 5.5), squeeze=False)
    for axis, model in zip(axes[0], models):
        bars = [step_bench_bar(row) for row in rows if row["model"] == model]
        draw_breakdown(axis, bars, f"{model.upper()}: one training step per configuration")
    figure.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8)
    figure.suptitle("Step benchmark (random data, every configuration interleaved in the same processes); "
                    "DDP's exposed time = its backward minus ddp-no-sync's", fontsize=10)
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    return figure


def plot_scaling(runs, model):
    """Throughput, speedup over the single-process run and efficiency against world size, with the ideal."""
    baseline = next((run["throughput_samples_per_s"] for run in runs if run["config"]["mode"] == "single"), None)
    lines = defaultdict(lambda: {1: baseline})  # every line starts from the one-process baseline
    for run in runs:
        if run["config"]["mode"] != "single":
            lines[series_label(run)][world_size(run)] = run["throughput_samples_per_s"]
    if not baseline or not lines:
        return None  # a speedup needs a single-process run and at least one other
    worlds = sorted({size for points in lines.values() for size in points})
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    for label, points in sorted(lines.items(), key=lambda item: sort_key(item[0])):
        sizes = sorted(points)
        speedup = [points[size] / baseline for size in sizes]
        for axis, values in zip(axes, ([points[size] for size in sizes], speedup,
                                       [s / size for s, size in zip(speedup, sizes)])):
            axis.plot(sizes, values, marker="o", color=color_for(label), label=label)
    ideals = ([baseline * size for size in worlds], worlds, [1] * len(worlds))
    ylabels = ("samples per second (all processes)", "speedup over 1 process", "efficiency (speedup / processes)")
    for axis, ideal, ylabel in zip(axes, ideals, ylabels):
        axis.plot(worlds, ideal, "k--", alpha=0.5, label="ideal (linear)")
        axis.set(xlabel="processes (world size)", ylabel=ylabel, xticks=worlds)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle(f"{model.upper()}: scaling with the number of processes "
                    f"({runs[0]['environment']['cores']} cores on the machine)")
    figure.tight_layout()
    return figure


def plot_allreduce(measurements):
    """Median latency and bus bandwidth against message size, gloo vs ring, one line per world size."""
    groups = defaultdict(list)
    for row in measurements:
        groups[(row["implementation"], row["world_size"])].append(row)
    worlds = sorted({world for _, world in groups})
    figure, (latency, bandwidth) = plt.subplots(1, 2, figsize=(13, 5))
    for (implementation, world), rows in sorted(groups.items()):
        rows.sort(key=lambda row: row["bytes"])
        style = dict(marker="o", color=plt.get_cmap("tab10").colors[worlds.index(world) % 10],
                     linestyle="-" if implementation == "gloo" else "--", label=f"{implementation}, {processes(world)}")
        sizes = [row["bytes"] for row in rows]
        latency.plot(sizes, [row["median_s"] for row in rows], **style)
        bandwidth.plot(sizes, [row["busbw_gbps"] for row in rows], **style)
    latency.set(ylabel="median latency (s)", title="all-reduce latency")
    bandwidth.set(ylabel="bus bandwidth (GB/s) = size / time x 2(n-1)/n", title="all-reduce bus bandwidth")
    for axis in (latency, bandwidth):
        axis.set(xscale="log", yscale="log", xlabel="message size (bytes)")
        axis.grid(alpha=0.3, which="both")
    latency.legend(fontsize=8)
    figure.suptitle("All-reduce: gloo's collective (solid) vs the hand-written ring (dashed)")
    figure.tight_layout()
    return figure


def plot_bucket_sweep(runs):
    """Median step time against bucket size, for runs that differ only in --bucket-mb."""
    groups = defaultdict(lambda: defaultdict(list))
    for run in runs:
        if uses_buckets(run):
            config = run["config"]
            key = json.dumps({k: v for k, v in config.items() if k not in INCIDENTAL_KEYS}, sort_keys=True)
            groups[(config["model"], series_label(run), world_size(run), key)][float(config["bucket_mb"])].append(
                median_step(run, "step"))
    groups = {key: sizes for key, sizes in groups.items() if len(sizes) > 1}
    if not groups:
        return None
    figure, axis = plt.subplots(figsize=(8, 5))
    for (model, label, world, _), sizes in sorted(groups.items()):
        buckets = sorted(sizes)
        axis.plot(buckets, [statistics.median(sizes[b]) for b in buckets], marker="o", color=color_for(label),
                  label=f"{model.upper()}, {label}, {processes(world)}")
    ticks = sorted({bucket for sizes in groups.values() for bucket in sizes})
    axis.set(xscale="log", xlabel="bucket size (MB, --bucket-mb)", ylabel="seconds per step (median)",
             title="Step time against gradient bucket size")
    axis.set_xticks(ticks, [f"{tick:g}" for tick in ticks])
    axis.minorticks_off()
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


def save(figure, out_dir, name, written):
    if figure is None:
        print(f"note: {name}: nothing to plot, skipped")
        return
    path = os.path.join(out_dir, name)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    written.append(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--out-dir", default=None, help="default: <results-dir>/plots")
    args = parser.parse_args(argv)
    out_dir = args.out_dir or os.path.join(args.results_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    runs, benchmarks = load_folder(args.results_dir)
    written = []
    main_runs = newest_per_series([run for run in runs if not is_bucket_variant(run)])
    for model in sorted({run["config"]["model"] for run in runs}):
        model_runs = [run for run in main_runs if run["config"]["model"] == model]
        for name, plot in (("curves", plot_curves), ("time-breakdown", plot_time_breakdown),
                           ("scaling", plot_scaling)):
            save(plot(model_runs, model) if model_runs else None, out_dir, f"{name}-{model}.png", written)
    for name, plot, schema in (("allreduce.png", plot_allreduce, "allreduce-bench/1"),
                               ("step-bench.png", plot_step_bench, "step-bench/1")):
        save(plot(benchmarks[schema]) if benchmarks[schema] else None, out_dir, name, written)
    save(plot_bucket_sweep(runs), out_dir, "bucket-sweep.png", written)
    for path in written:
        print(f"plot: {path}")
    return written


if __name__ == "__main__":
    main()
