"""Where a step's time goes: time-breakdown-<model>.png. A bar stacks compute, comm exposed and
data (they add up to the step); below it, comm busy outlined with its hidden part hatched."""
import matplotlib.pyplot as plt
import numpy as np

from analysis.plot_common import MS, errors, medians, order, plural
from analysis.results_folder import across_repeats

LAYERS = (("compute", "compute (forward, backward, optimizer, gradient copies)", "tab:blue"),
          ("comm_exposed", "comm exposed (the step waits for communication)", "tab:red"),
          ("data", "data", "tab:gray"))
TIMING_NOTE = ("Compute ends when the step's last gradient is accumulated, for DDP too, which "
               "waits for its buckets inside backward (timing.py): in every run comm exposed = "
               "busy - hidden; the bars are medians over the repeats, which need not add up.")


def run_bar(configuration, runs):
    """A configuration's bar: medians over its repeats of the runs' per-step means."""
    _model, series, world, _bucket_mb = configuration
    spreads = across_repeats(runs)
    bar = {field: value["median"] for field, value in spreads.items() if value}
    # compute: the median step less the medians of data and comm exposed, so the layers add up
    bar.update(compute=bar["step"] - bar["data"] - bar["comm_exposed"], step=spreads["step"],
               label=f"{series}, {plural(world, 'process')}, {plural(len(runs), 'run')}")
    return bar


def plot_time_breakdown(groups, model):
    """A bar per configuration in the series' order, each with its step's spread and overlap."""
    bars = [run_bar(*item) for item in sorted(groups.items(), key=order)]
    rows = np.arange(len(bars))
    figure, axis = plt.subplots(figsize=(13, 0.45 * (len(bars) + 1.5) + 1.5))
    left = np.zeros(len(bars))
    for key, label, layer_colour in LAYERS:
        widths = np.array([MS * bar[key] for bar in bars])
        drawn = widths != 0  # a run without communication gets no exposed layer at all
        if drawn.any():
            axis.barh(rows[drawn] - 0.1, widths[drawn], left=left[drawn], height=0.55,
                      color=layer_colour, label=label)
        left += widths
    steps = [bar["step"] for bar in bars]
    if any(step["n"] > 1 for step in steps):
        axis.errorbar(medians(steps, MS), rows - 0.1, xerr=errors(steps, MS), fmt="none",
                      ecolor="black", capsize=3, label="step: fastest to slowest repeat")
    busy = np.array([MS * bar["comm_busy"] for bar in bars])
    talking = busy > 0
    if talking.any():
        hidden = np.array([MS * bar["comm_hidden"] for bar in bars])
        axis.barh(rows[talking] + 0.3, busy[talking], height=0.22, fill=False, edgecolor="black",
                  label="comm busy (any collective in flight)")
        axis.barh(rows[talking] + 0.3, hidden[talking], height=0.22, fill=False, hatch="////",
                  edgecolor="tab:green", label="comm hidden (busy while computing)")
    ends = np.maximum(busy, [MS * step["max"] for step in steps])
    for position, bar, end in zip(rows, bars, ends):
        if "overlap" in bar:
            axis.annotate(f"overlap {100 * bar['overlap']:.0f}%", (end, position), xytext=(6, 0),
                          textcoords="offset points", va="center", fontsize=8)
    axis.set_yticks(rows, [bar["label"] for bar in bars], fontsize=8)
    axis.set_ylim(len(bars) - 0.4, -0.6)  # the first bar on top
    axis.set_xlim(0, 1.2 * max(ends))  # room for the overlap notes
    axis.set(xlabel="ms per step (mean over the steps and ranks of a run)",
             title=f"{model.upper()}: where a training step's time goes")
    axis.grid(axis="x", alpha=0.3)
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.suptitle("Median over repeats of each run's mean per step")
    figure.text(0.01, 0.01, TIMING_NOTE, fontsize=8, wrap=True)
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    return figure
