"""Communication: allreduce.png (latency and bus bandwidth against message size, with the fitted
α-β model) and bucket-sweep.png (step time against --bucket-mb, with the buckets each run sent)."""
import matplotlib.pyplot as plt
import numpy as np

from analysis import cost_model
from analysis.plot_common import MS, colour, errors, medians, plural, uses_buckets
from analysis.results_folder import across_repeats

MOST_SIZE_TICKS = 8  # message sizes labelled on the all-reduce axes; more would overlap
MARKERS = {"gloo": "o", "ring": "s", "shm": "^"}  # each all-reduce implementation's points
LINE_STYLES = {"gloo": "-", "ring": "--", "shm": ":"}  # and its fitted line


def size_label(nbytes):
    """'4 KiB', '64 MiB', '12 B': a message size as its axis shows it."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def draw_fit(axes, sizes, seconds, implementation, world, style):
    """The α-β fit of one implementation at one world size, thin on both axes; its legend note."""
    fit = cost_model.fit_alpha_beta([world] * len(sizes), sizes, seconds)
    grid = np.geomspace(sizes[0], sizes[-1], 50)
    model = np.array([cost_model.allreduce_time(size, world, fit.alpha, fit.beta) for size in grid])
    bus_gbps = grid / model * 2 * (world - 1) / world / 1e9  # as the benchmark defines busbw
    line = dict(style, linewidth=0.8, linestyle=LINE_STYLES.get(implementation, "--"))
    for axis, values in zip(axes, (MS * model, bus_gbps)):
        axis.plot(grid, values, gid=f"fit {implementation} {world}", **line)
    return f" (α {fit.alpha * 1e6:.0f} µs, 1/β {fit.bandwidth_gbps:.2g} GB/s)"


def plot_allreduce(rows):
    """Median latency and bus bandwidth against message size, with the α-β fits."""
    groups = {}  # (implementation, world size) -> its rows, smallest message first
    for row in sorted(rows, key=lambda row: row["bytes"]):
        groups.setdefault((row["implementation"], row["world_size"]), []).append(row)
    worlds = sorted({world for _, world in groups})
    figure, (latency, bandwidth) = plt.subplots(1, 2, figsize=(15, 5.5))
    for (implementation, world), measured in sorted(groups.items()):
        sizes = np.array([row["bytes"] for row in measured], dtype=float)
        seconds = np.array([row["median_s"] for row in measured])
        style = dict(color=f"C{worlds.index(world) % 10}")  # one of tab10's colours per world size
        label = f"{implementation}, {plural(world, 'process')}"
        if len(measured) >= 2 and world > 1:
            label += draw_fit((latency, bandwidth), sizes, seconds, implementation, world, style)
        points = dict(marker=MARKERS.get(implementation, "s"), linestyle="", fillstyle="none")
        latency.plot(sizes, MS * seconds, label=label, **points, **style)
        bandwidth.plot(sizes, [row["busbw_gbps"] for row in measured], **points, **style)
    latency.set(ylabel="median latency (ms)", title="all-reduce latency")
    bandwidth.set(ylabel="bus bandwidth (GB/s) = size / time x 2(n-1)/n",
                  title="all-reduce bus bandwidth")
    every_size = sorted({row["bytes"] for row in rows})
    ticks = every_size[::max(1, len(every_size) // MOST_SIZE_TICKS)]
    for axis in (latency, bandwidth):
        axis.set(xscale="log", yscale="log", xlabel="message size")
        axis.set_xticks(ticks, [size_label(tick) for tick in ticks])
        axis.minorticks_off()
        axis.grid(alpha=0.3, which="both")
    latency.legend(fontsize=8)
    figure.suptitle("All-reduce: gloo's collective (circles, solid fit), the hand-written ring "
                    "(squares, dashed) and shared memory (triangles, dotted); lines: α-β fits")
    figure.tight_layout()
    return figure


def plot_bucket_sweep(groups):
    """Step time against bucket size of each bucketing series run at several sizes."""
    lines = {}  # (model, series, world) -> {bucket MiB: (spread of step, buckets sent)}
    for (model, series, world, bucket_mb), runs in groups.items():
        if uses_buckets(series):
            sent = runs[-1]["timing"]["all_reduce_layouts"][-1]["bytes"]  # the latest run's layout
            step = across_repeats(runs)["step"]
            lines.setdefault((model, series, world), {})[bucket_mb] = step, len(sent)
    lines = {key: points for key, points in lines.items() if len(points) > 1}
    if not lines:
        return None
    figure, axis = plt.subplots(figsize=(10, 5.5))
    for index, ((model, series, world), points) in enumerate(sorted(lines.items())):
        sizes = sorted(points)
        steps, buckets = zip(*(points[size] for size in sizes))
        label = f"{model.upper()}, {series}, {plural(world, 'process')}"
        axis.errorbar(sizes, medians(steps, MS), yerr=errors(steps, MS), marker="o", capsize=3,
                      color=colour(series), label=label)
        offset = 6 if index % 2 == 0 else -12  # alternate lines' notes above and below
        for size, step, count in zip(sizes, steps, buckets):
            axis.annotate(plural(count, "bucket"), (size, MS * step["median"]), xytext=(5, offset),
                          textcoords="offset points", fontsize=7, color=colour(series))
    ticks = sorted({size for points in lines.values() for size in points})
    axis.set(xscale="log", xlabel="bucket size (MiB, --bucket-mb)",
             ylabel="ms per step (median of repeats; bars: min-max)",
             title="Step time against gradient bucket size, with the buckets each run sent")
    axis.set_xticks(ticks, [f"{tick:g}" for tick in ticks])
    axis.minorticks_off()
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure
