"""Figures from results files: every plot a reader sees is drawn here, from results/*.json only.

    python -m analysis.plots [--results-dir results] [--out-dir results/plots]

Reads the folder with results.load_folder (training runs; the benchmarks' allreduce-bench/1 and
step-bench/2) and its trace-*.json timelines; other files are skipped with a note. Writes per model
time-breakdown-, curves- and scaling-<model>.png, then allreduce.png, bucket-sweep.png, step-bench.png
and timeline.png; a figure without data is skipped with a note.

What the numbers mean (timing.py measures them per step on every rank; its docstring is the reference):
  step          wall-clock of one training step = data + compute + comm exposed, exactly
  comm busy     time with at least one collective in flight (the union of their spans)
  comm hidden   the part of busy before compute ended: communication overlapped with backward
  comm exposed  the part after it: the time the step waited for communication
  overlap       hidden / busy, from 0 to 100%; none for a single process or ddp-no-sync (no communication)
DDP waits for its buckets inside backward, so there compute's end is estimated from backwards timed
without communication: DDP's exposed time is an estimate, and need not equal busy - hidden.

A run contributes its means per step over every measured step of every rank (results.per_step). Each
configuration (model, series, world size, bucket size) is repeated; figures show the median over the
repeats, with bars from the fastest to the slowest. A breakdown's compute is the median step minus the
medians of data and comm exposed, so the layers add up to the median step. Runs of bucketed or DDP with
a --bucket-mb other than the default appear only in bucket-sweep.png.
"""
import argparse
import functools
import glob
import inspect
import json
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis import cost_model  # noqa: E402
from manual_allreduce import (
    DEFAULT_BUCKET_MB,
    BucketedSync,  # noqa: E402
)
from runtime.models import build_model  # noqa: E402
from runtime.results import across_repeats, load_folder, repeats, spread  # noqa: E402

ALLREDUCE_SCHEMA = "allreduce-bench/1"
STEP_BENCH_SCHEMA = "step-bench/2"
MS = 1e3  # seconds to milliseconds: every step-time axis is in ms
TIMELINE_STEPS = 3  # steps of a trace drawn: enough to see the pattern repeat, few enough to read
SERIES_COLOURS = {"single": "black", "ddp-no-sync": "tab:gray", "ddp": "tab:blue",
                  "manual per-param": "tab:orange", "manual flat": "tab:green", "manual bucketed": "tab:red",
                  "manual ring": "tab:purple"}
SERIES_ORDER = tuple(SERIES_COLOURS)
PHASE_COLOURS = {"data": "tab:gray", "forward": "tab:blue", "backward": "tab:green", "sync": "tab:orange",
                 "optimizer": "tab:purple"}
LAYERS = (("compute", "compute (forward, backward, optimizer, gradient copies)", "tab:blue"),
          ("exposed", "comm exposed (the step waits for communication)", "tab:red"),
          ("data", "data", "tab:gray"))
DDP_NOTE = ("DDP waits for its buckets inside backward: its comm exposed is estimated as the last backward "
            "minus the median backward timed without communication (timing.py), so it need not equal "
            "busy - hidden.")


def plural(count, noun, ending="s"):
    return f"{count} {noun}" if count == 1 else f"{count} {noun}{ending}"


def processes(world):
    return plural(world, "process", "es")


def colour(series):
    """The same colour for a series in every figure; variants (fp16, ...) take one of three others."""
    return SERIES_COLOURS.get(series, ("tab:brown", "tab:olive", "tab:pink")[sum(map(ord, series)) % 3])


def series_rank(series):
    return (SERIES_ORDER.index(series) if series in SERIES_ORDER else len(SERIES_ORDER), series)


def order(item):
    """Sort key of a (configuration, runs) pair: model, world size, then the series in teaching order."""
    model, series, world, bucket_mb = item[0]
    return model, world, series_rank(series), bucket_mb


def uses_buckets(series):
    return series == "ddp" or series.startswith("manual bucketed")


def bucket_variant(configuration):
    _, series, _, bucket_mb = configuration
    return uses_buckets(series) and bucket_mb != DEFAULT_BUCKET_MB


def medians(spreads, scale=1.0):
    """The spreads' medians times `scale` (a number, or one per spread)."""
    return scale * np.array([s["median"] for s in spreads])


def errors(spreads, scale=1.0):
    """matplotlib's asymmetric error bars: from each spread's median down to its min and up to its max."""
    below = [s["median"] - s["min"] for s in spreads]
    above = [s["max"] - s["median"] for s in spreads]
    return scale * np.array([below, above])


# --- Where a step's time goes: time-breakdown-<model>.png and step-bench.png --------------------

def run_bar(configuration, runs):
    """A configuration's bar: medians over its repeats of the runs' per-step means."""
    _, series, world, _ = configuration
    spreads = across_repeats(runs)
    median = {field: value["median"] for field, value in spreads.items() if value}
    exposed = median["comm_exposed"]
    return {"label": f"{series}, {processes(world)}, {plural(len(runs), 'run')}", "step": spreads["step"],
            "compute": median["step"] - median["data"] - exposed, "exposed": exposed, "data": median["data"],
            "busy": median["comm_busy"], "hidden": median["comm_hidden"], "overlap": median.get("overlap")}


def step_bench_bar(row):
    """A step-bench/2 row's bar: one measurement, so no spread."""
    step = row["mean_step_s"]
    data = row["mean_data_s"]
    exposed = row["mean_comm_exposed_s"]
    return {"label": f"{row['configuration']}, {processes(row['world_size'])}", "step": spread([step]),
            "compute": step - data - exposed, "exposed": exposed, "data": data,
            "busy": row["mean_comm_busy_s"], "hidden": row["mean_comm_hidden_s"], "overlap": row["overlap"]}


def draw_breakdown(axis, bars, title):
    """Horizontal stacked bars (compute, comm exposed, data: they add up to the step) with the step's min-max
    over repeats; below each bar with communication, comm busy outlined with its hidden part hatched."""
    y = np.arange(len(bars))
    left = np.zeros(len(bars))
    for key, label, layer_colour in LAYERS:
        widths = np.array([MS * bar[key] for bar in bars])
        drawn = widths != 0  # a run without communication gets no exposed layer at all
        if drawn.any():
            axis.barh(y[drawn] - 0.1, widths[drawn], left=left[drawn], height=0.55, color=layer_colour,
                      label=label)
        left += widths
    steps = [bar["step"] for bar in bars]
    repeated = np.array([step["n"] > 1 for step in steps])
    if repeated.any():
        axis.errorbar(medians(steps, MS), y - 0.1, xerr=errors(steps, MS), fmt="none", ecolor="black",
                      capsize=3, label="step: fastest to slowest repeat")
    busy = np.array([MS * bar["busy"] for bar in bars])
    talking = busy > 0
    if talking.any():
        hidden = np.array([MS * bar["hidden"] for bar in bars])
        axis.barh(y[talking] + 0.3, busy[talking], height=0.22, fill=False, edgecolor="black",
                  label="comm busy (any collective in flight)")
        axis.barh(y[talking] + 0.3, hidden[talking], height=0.22, fill=False, hatch="////",
                  edgecolor="tab:green", label="comm hidden (busy while computing)")
    ends = np.maximum(busy, [MS * step["max"] for step in steps])
    for position, bar, end in zip(y, bars, ends):
        if bar["overlap"] is not None:
            axis.annotate(f"overlap {100 * bar['overlap']:.0f}%", (end, position), xytext=(6, 0),
                          textcoords="offset points", va="center", fontsize=8)
    axis.set_yticks(y, [bar["label"] for bar in bars], fontsize=8)
    axis.set_ylim(len(bars) - 0.4, -0.6)  # the first bar on top
    axis.set_xlim(0, 1.2 * max(ends))  # room for the overlap notes
    axis.set(xlabel="ms per step (mean over the steps and ranks of a run)", title=title)
    axis.grid(axis="x", alpha=0.3)


def breakdown_figure(panels, title):
    """One breakdown panel per (title, bars), stacked, with one legend and the note on DDP's estimate."""
    heights = [len(bars) + 1.5 for _, bars in panels]
    figure, axes = plt.subplots(len(panels), 1, figsize=(13, 0.45 * sum(heights) + 1.5), squeeze=False,
                                gridspec_kw={"height_ratios": heights})
    for axis, (panel_title, bars) in zip(axes[:, 0], panels):
        draw_breakdown(axis, bars, panel_title)
    legend = {}  # one entry per layer, whichever panels have it
    for axis in axes[:, 0]:
        handles, labels = axis.get_legend_handles_labels()
        legend.update(zip(labels, handles))
    axes[0][0].legend(legend.values(), legend.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.suptitle(title)
    figure.text(0.01, 0.01, DDP_NOTE, fontsize=8, wrap=True)
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    return figure


def plot_time_breakdown(groups, model):
    bars = [run_bar(configuration, runs) for configuration, runs in sorted(groups.items(), key=order)]
    return breakdown_figure([(f"{model.upper()}: where a training step's time goes", bars)],
                            "Median over repeats of each run's mean per step")


def bench_order(row):
    """Sort key of a step-bench row: world size, then its configuration in the order of the series."""
    configuration = row["configuration"]
    series = configuration if configuration.startswith("ddp") else "manual " + configuration
    return row["world_size"], series_rank(series)


def plot_step_bench(rows):
    """benchmarks/step_bench.py's configurations, one panel per model."""
    panels = []
    for model in sorted({row["model"] for row in rows}):
        model_rows = sorted((row for row in rows if row["model"] == model), key=bench_order)
        bars = [step_bench_bar(row) for row in model_rows]
        panels.append((f"{model.upper()}: one training step per configuration", bars))
    title = "Step benchmark: random data, every configuration interleaved in the same processes"
    return breakdown_figure(panels, title)


# --- Learning and scaling: curves-<model>.png and scaling-<model>.png ----------------------------

def plot_curves(groups, model):
    """Validation accuracy and training loss against samples seen and against training wall-clock."""
    figure, axes = plt.subplots(2, 2, figsize=(14, 8), sharex="col")
    worlds = sorted({world for _, _, world, _ in groups})
    for (_, series, world, _), runs in sorted(groups.items(), key=order):
        line_style = ("-", "--", ":", "-.")[worlds.index(world) % 4]
        style = dict(color=colour(series), linestyle=line_style, linewidth=1, marker=".")
        for index, run in enumerate(runs):
            label = f"{series}, {processes(world)}" if index == 0 else "_repeat"
            epochs = run["epochs"]
            for column, key in enumerate(("samples_seen", "elapsed_s")):
                x = [epoch[key] for epoch in epochs]
                accuracy = [100 * epoch["val_accuracy"] for epoch in epochs]
                axes[0][column].plot(x, accuracy, label=label, **style)
                axes[1][column].plot(x, [epoch["train_loss"] for epoch in epochs], label=label, **style)
    axes[0][0].set(ylabel="validation accuracy (%)", title="against samples seen (the work done)")
    axes[0][1].set(title="against training wall-clock (time to accuracy)")
    axes[1][0].set(ylabel="training loss (epoch mean)", xlabel="samples seen (all processes together)")
    axes[1][1].set(xlabel="training wall-clock (s, cumulative over epochs)")
    for axis in axes.flat:
        axis.grid(alpha=0.3)
    axes[0][1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.suptitle(f"{model.upper()}: learning curves, one point per epoch, every repeat drawn (thin)")
    figure.tight_layout()
    return figure


def plot_scaling(groups, model):
    """Throughput, speedup over the single-process run and efficiency against world size, with the ideal,
    and ddp-no-sync (no communication) as the ceiling that compute alone reaches on the shared cores."""
    lines = defaultdict(dict)  # series -> {world size: spread of throughput}
    for (_, series, world, _), runs in groups.items():
        lines[series][world] = spread([run["throughput_samples_per_s"] for run in runs])
    single = lines.pop("single", {}).get(1)
    if not single or not lines:
        return None  # a speedup needs a single-process run and at least one other
    worlds = sorted({1} | {world for points in lines.values() for world in points})
    figure, axes = plt.subplots(1, 3, figsize=(17, 5))
    for series, points in sorted(lines.items(), key=lambda item: series_rank(item[0])):
        sizes = np.array(sorted({1} | set(points)))
        values = [points.get(world, single) for world in sizes]  # every line starts from the one-process run
        style = dict(color=colour(series), label=series, marker="o", capsize=3)
        if series == "ddp-no-sync":
            style.update(linestyle="--", label="ddp-no-sync: compute ceiling (no communication)")
        for axis, scale in zip(axes, (1.0, 1 / single["median"], 1 / single["median"] / sizes)):
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
    figure.suptitle(f"{model.upper()}: scaling, median of repeats (bars: slowest to fastest), "
                    f"{cores} cores shared by every process")
    figure.tight_layout()
    return figure


# --- Communication: allreduce.png, bucket-sweep.png and timeline.png -----------------------------

def size_label(nbytes):
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def plot_allreduce(rows):
    """Median latency and bus bandwidth against message size (points), and the α-β model fitted to each
    implementation and world size (thin lines: solid gloo, dashed ring)."""
    groups = defaultdict(list)
    for row in rows:
        groups[(row["implementation"], row["world_size"])].append(row)
    worlds = sorted({world for _, world in groups})
    figure, (latency, bandwidth) = plt.subplots(1, 2, figsize=(15, 5.5))
    for (implementation, world), measured in sorted(groups.items()):
        measured.sort(key=lambda row: row["bytes"])
        sizes = np.array([row["bytes"] for row in measured], dtype=float)
        seconds = np.array([row["median_s"] for row in measured])
        style = dict(color=plt.get_cmap("tab10").colors[worlds.index(world) % 10])
        label = f"{implementation}, {processes(world)}"
        if len(measured) >= 2 and world > 1:
            fit = cost_model.fit_alpha_beta([world] * len(sizes), sizes, seconds)
            label += f" (α {fit.alpha * 1e6:.0f} µs, 1/β {fit.bandwidth_gbps:.2g} GB/s)"
            grid = np.geomspace(sizes[0], sizes[-1], 50)
            model = np.array([cost_model.allreduce_time(size, world, fit.alpha, fit.beta) for size in grid])
            line = dict(style, linewidth=0.8, linestyle="-" if implementation == "gloo" else "--")
            bus_gbps = grid / model * 2 * (world - 1) / world / 1e9  # as the benchmark defines busbw
            latency.plot(grid, MS * model, gid=f"fit {implementation} {world}", **line)
            bandwidth.plot(grid, bus_gbps, gid=f"fit {implementation} {world}", **line)
        marker = "o" if implementation == "gloo" else "s"
        latency.plot(sizes, MS * seconds, marker, fillstyle="none", label=label, **style)
        bandwidth.plot(sizes, [row["busbw_gbps"] for row in measured], marker, fillstyle="none", **style)
    latency.set(ylabel="median latency (ms)", title="all-reduce latency")
    bandwidth.set(ylabel="bus bandwidth (GB/s) = size / time x 2(n-1)/n", title="all-reduce bus bandwidth")
    ticks = sorted({row["bytes"] for row in rows})[::max(1, len({row["bytes"] for row in rows}) // 8)]
    for axis in (latency, bandwidth):
        axis.set(xscale="log", yscale="log", xlabel="message size")
        axis.set_xticks(ticks, [size_label(tick) for tick in ticks])
        axis.minorticks_off()
        axis.grid(alpha=0.3, which="both")
    latency.legend(fontsize=8)
    figure.suptitle("All-reduce: gloo's collective (circles, solid fit) vs the hand-written ring (squares, "
                    "dashed fit); lines: the fitted α-β model")
    figure.tight_layout()
    return figure


def first_bucket_mb():
    """BucketedSync's cap on its first bucket (MiB), or None: read from its signature, as the design
    document does."""
    option = inspect.signature(BucketedSync).parameters.get("first_bucket_mb")
    return option.default if option else None


@functools.lru_cache(maxsize=None)
def parameter_bytes(model):
    """Bytes of each trainable parameter of the model, in registration order: what gets bucketed."""
    return [p.numel() * p.element_size() for p in build_model(model).parameters() if p.requires_grad]


def bucket_count(model, series, bucket_mb):
    """How many all-reduces one step issues: cost_model's bucket layout of the model's parameters."""
    if series == "ddp":
        return len(cost_model.ddp_bucket_sizes(parameter_bytes(model), bucket_mb))
    return len(cost_model.bucket_sizes(parameter_bytes(model), bucket_mb, first_bucket_mb()))


def plot_bucket_sweep(groups):
    """Step time against bucket size, per series that buckets its gradients, where several sizes were run."""
    lines = defaultdict(dict)  # (model, series, world) -> {bucket MiB: spread of step}
    for (model, series, world, bucket_mb), runs in groups.items():
        if uses_buckets(series):
            lines[(model, series, world)][bucket_mb] = across_repeats(runs)["step"]
    lines = {key: points for key, points in lines.items() if len(points) > 1}
    if not lines:
        return None
    figure, axis = plt.subplots(figsize=(10, 5.5))
    for index, ((model, series, world), points) in enumerate(sorted(lines.items())):
        sizes = sorted(points)
        steps = [points[size] for size in sizes]
        axis.errorbar(sizes, medians(steps, MS), yerr=errors(steps, MS), marker="o", capsize=3,
                      color=colour(series), label=f"{model.upper()}, {series}, {processes(world)}")
        for size, step in zip(sizes, steps):
            text = plural(bucket_count(model, series, size), "bucket")
            axis.annotate(text, (size, MS * step["median"]), xytext=(5, 6 if index % 2 == 0 else -12),
                          textcoords="offset points", fontsize=7, color=colour(series))
    ticks = sorted({size for points in lines.values() for size in points})
    axis.set(xscale="log", xlabel="bucket size (MiB, --bucket-mb)",
             ylabel="ms per step (median of repeats; bars: min-max)",
             title="Step time against gradient bucket size, with each layout's bucket count")
    axis.set_xticks(ticks, [f"{tick:g}" for tick in ticks])
    axis.minorticks_off()
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


def complete_events(document):
    """A Chrome trace's complete ("X") events: the spans timing.chrome_trace writes."""
    return [event for event in document["traceEvents"] if event.get("ph") == "X"]


def read_traces(folder):
    """{file name: complete events} of the folder's trace-*.json, bucketed first (its all-reduces overlap
    backward); a note for each file skipped."""
    traces = {}
    paths = glob.glob(os.path.join(folder, "trace-*.json"))
    for path in sorted(paths, key=lambda path: ("bucketed" not in path, path)):
        name = os.path.basename(path)
        try:
            with open(path) as file:
                traces[name] = complete_events(json.load(file))
        except (OSError, ValueError, LookupError, TypeError, AttributeError) as error:
            print(f"note: skipped {name}: not a Chrome trace ({error!r})")
    return {name: events for name, events in traces.items() if events}


def draw_timeline(axis, events, title):
    """A Gantt chart of a trace's first steps: per rank a compute row and a communication row, where each
    bucket's all-reduce has its own lane (several can be in flight at once)."""
    steps = sorted({event["args"]["step"] for event in events})[:TIMELINE_STEPS]
    shown = [event for event in events if event["args"]["step"] in steps]
    origin = min(event["ts"] for event in shown)
    ranks = sorted({event["pid"] for event in shown})
    lanes = sorted({event["name"] for event in shown if event["tid"] == 1})
    names = [name for name in PHASE_COLOURS if any(e["name"] == name for e in shown)]
    names += sorted({event["name"] for event in shown if event["tid"] == 0} - set(names)) + lanes
    for name in names:
        mine = [event for event in shown if event["name"] == name]
        row = np.array([2 * ranks.index(event["pid"]) + event["tid"] for event in mine], dtype=float)
        height, fill = 0.8, PHASE_COLOURS.get(name, "tab:brown")
        if name in lanes:
            height = 0.8 / len(lanes)
            row += -0.4 + (lanes.index(name) + 0.5) * height
            fill = plt.get_cmap("Reds")(0.35 + 0.6 * lanes.index(name) / max(1, len(lanes) - 1))
        starts = [(event["ts"] - origin) / MS for event in mine]  # microseconds to ms
        axis.barh(row, [event["dur"] / MS for event in mine], left=starts, height=0.9 * height, color=fill,
                  label=name)
    labels = [f"rank {rank} {track}" for rank in ranks for track in ("compute", "communication")]
    axis.set_yticks(range(len(labels)), labels, fontsize=8)
    axis.set_ylim(len(labels) - 0.5, -0.5)
    axis.set(xlabel=f"ms since the start of step {steps[0]}", title=f"{title}: steps {steps[0]}-{steps[-1]}")
    axis.grid(axis="x", alpha=0.3)
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))


def plot_timeline(traces):
    """One panel per trace ({name: complete events})."""
    if not traces:
        return None
    ranks = [len({event["pid"] for event in events}) for events in traces.values()]
    height = sum(1.2 * count + 1.5 for count in ranks)
    figure, axes = plt.subplots(len(traces), 1, figsize=(14, height), squeeze=False,
                                gridspec_kw={"height_ratios": ranks})
    for axis, (name, events) in zip(axes[:, 0], traces.items()):
        draw_timeline(axis, events, name)
    figure.suptitle("Timeline of a few steps per rank: what the communication overlaps")
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
    groups = repeats(runs)
    written = []
    for model in sorted({configuration[0] for configuration in groups}):
        # one bucket size per strategy, so the bars and lines compare strategies
        model_groups = {c: r for c, r in groups.items() if c[0] == model and not bucket_variant(c)}
        for name, plot in (("time-breakdown", plot_time_breakdown), ("curves", plot_curves),
                           ("scaling", plot_scaling)):
            save(plot(model_groups, model) if model_groups else None, out_dir, f"{name}-{model}.png", written)
    for name, plot, schema in (("allreduce.png", plot_allreduce, ALLREDUCE_SCHEMA),
                               ("step-bench.png", plot_step_bench, STEP_BENCH_SCHEMA)):
        rows = benchmarks.get(schema)
        save(plot(rows) if rows else None, out_dir, name, written)
    save(plot_bucket_sweep(groups), out_dir, "bucket-sweep.png", written)
    save(plot_timeline(read_traces(args.results_dir)), out_dir, "timeline.png", written)
    for path in written:
        print(f"plot: {path}")
    return written


if __name__ == "__main__":
    main()
