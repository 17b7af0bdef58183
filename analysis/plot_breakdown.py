"""Where a step's time goes: time-breakdown-<model>.png from the training runs, step-bench.png from
benchmarks/step_bench.py. A bar stacks compute, comm exposed and data (they add up to the step);
beside it, comm busy outlined with its hidden part hatched, and the overlap (hidden / busy)."""
import matplotlib.pyplot as plt
import numpy as np

from analysis.plot_common import MS, errors, medians, order, plural, processes, series_rank
from analysis.results_folder import across_repeats

LAYERS = (("compute", "compute (forward, backward, optimizer, gradient copies)", "tab:blue"),
          ("exposed", "comm exposed (the step waits for communication)", "tab:red"),
          ("data", "data", "tab:gray"))
DDP_NOTE = ("DDP waits for its buckets inside backward: its comm exposed is estimated as the last "
            "backward minus the median backward timed without communication (timing.py), so it "
            "need not equal busy - hidden.")


def bar(label, step, median, overlap):
    """A bar: compute is the median step less the medians of data and comm exposed."""
    return {"label": label, "step": step, "overlap": overlap,
            "compute": step["median"] - median["data"] - median["comm_exposed"],
            "exposed": median["comm_exposed"], "data": median["data"],
            "busy": median["comm_busy"], "hidden": median["comm_hidden"]}


def run_bar(configuration, runs):
    """A configuration's bar: medians over its repeats of the runs' per-step means."""
    _model, series, world, _bucket_mb = configuration
    spreads = across_repeats(runs)
    median = {field: value["median"] for field, value in spreads.items() if value}
    return bar(f"{series}, {processes(world)}, {plural(len(runs), 'run')}", spreads["step"],
               median, median.get("overlap"))


def step_bench_bar(entry):
    """A step-bench summary entry's bar: medians over its repeats, the step's min-max."""
    step = entry["mean_step_s"]
    return bar(f"{entry['configuration']}, {processes(entry['world_size'])}, "
               f"{plural(entry['repeats'], 'repeat')}",
               {"median": step["median"], "min": step["min"], "max": step["max"],
                "n": entry["repeats"]}, entry["median_of_means_s"], entry["median_overlap"])


def draw_breakdown(axis, bars, title):
    """Stacked bars (compute, comm exposed, data) with the step's min-max over repeats; below
    each bar with communication, comm busy outlined with its hidden part hatched."""
    rows = np.arange(len(bars))
    left = np.zeros(len(bars))
    for key, label, layer_colour in LAYERS:
        widths = np.array([MS * bar[key] for bar in bars])
        drawn = widths != 0  # a run without communication gets no exposed layer at all
        if drawn.any():
            axis.barh(rows[drawn] - 0.1, widths[drawn], left=left[drawn], height=0.55,
                      color=layer_colour, label=label)
        left += widths
    steps = [bar["step"] for bar in bars]
    repeated = np.array([step["n"] > 1 for step in steps])
    if repeated.any():
        axis.errorbar(medians(steps, MS), rows - 0.1, xerr=errors(steps, MS), fmt="none",
                      ecolor="black", capsize=3, label="step: fastest to slowest repeat")
    busy = np.array([MS * bar["busy"] for bar in bars])
    talking = busy > 0
    if talking.any():
        hidden = np.array([MS * bar["hidden"] for bar in bars])
        axis.barh(rows[talking] + 0.3, busy[talking], height=0.22, fill=False, edgecolor="black",
                  label="comm busy (any collective in flight)")
        axis.barh(rows[talking] + 0.3, hidden[talking], height=0.22, fill=False, hatch="////",
                  edgecolor="tab:green", label="comm hidden (busy while computing)")
    ends = np.maximum(busy, [MS * step["max"] for step in steps])
    for position, bar, end in zip(rows, bars, ends):
        if bar["overlap"] is not None:
            axis.annotate(f"overlap {100 * bar['overlap']:.0f}%", (end, position), xytext=(6, 0),
                          textcoords="offset points", va="center", fontsize=8)
    axis.set_yticks(rows, [bar["label"] for bar in bars], fontsize=8)
    axis.set_ylim(len(bars) - 0.4, -0.6)  # the first bar on top
    axis.set_xlim(0, 1.2 * max(ends))  # room for the overlap notes
    axis.set(xlabel="ms per step (mean over the steps and ranks of a run)", title=title)
    axis.grid(axis="x", alpha=0.3)


def breakdown_figure(panels, title):
    """One panel per (title, bars), stacked, with one legend and the note on DDP's estimate."""
    heights = [len(bars) + 1.5 for _, bars in panels]
    figure, axes = plt.subplots(len(panels), 1, figsize=(13, 0.45 * sum(heights) + 1.5),
                                squeeze=False, gridspec_kw={"height_ratios": heights})
    for axis, (panel_title, bars) in zip(axes[:, 0], panels):
        draw_breakdown(axis, bars, panel_title)
    legend = {}  # one entry per layer, whichever panels have it
    for axis in axes[:, 0]:
        handles, labels = axis.get_legend_handles_labels()
        legend.update(zip(labels, handles))
    axes[0][0].legend(legend.values(), legend.keys(), fontsize=8, loc="upper left",
                      bbox_to_anchor=(1.01, 1))
    figure.suptitle(title)
    figure.text(0.01, 0.01, DDP_NOTE, fontsize=8, wrap=True)
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    return figure


def plot_time_breakdown(groups, model):
    """time-breakdown-<model>.png: one bar per configuration, in the order of the series."""
    ordered = sorted(groups.items(), key=order)
    bars = [run_bar(configuration, runs) for configuration, runs in ordered]
    return breakdown_figure([(f"{model.upper()}: where a training step's time goes", bars)],
                            "Median over repeats of each run's mean per step")


def bench_order(entry):
    """Sort key of a step-bench entry: world size, then the series' order."""
    configuration = entry["configuration"]
    series = configuration if configuration.startswith("ddp") else "manual " + configuration
    return entry["world_size"], series_rank(series)


def plot_step_bench(summary):
    """benchmarks/step_bench.py's summary: a bar per configuration, a panel per model."""
    panels = []
    for model in sorted({entry["model"] for entry in summary}):
        entries = sorted((entry for entry in summary if entry["model"] == model), key=bench_order)
        bars = [step_bench_bar(entry) for entry in entries]
        panels.append((f"{model.upper()}: one training step per configuration", bars))
    title = ("Step benchmark: random data, every configuration interleaved in the same processes;"
             " median over repeats of each repeat's mean per step")
    return breakdown_figure(panels, title)
