"""timeline.png: a Gantt chart of one typical step per rank (traces.typical_step, the step §3.3
lists) from the --trace files, showing what the communication overlaps."""
import glob
import json
import os

import matplotlib.pyplot as plt
import numpy as np

from analysis.plot_common import MS
from analysis.traces import COMMUNICATION_TRACK, COMPUTE_TRACK, complete_events, typical_step

PHASE_COLOURS = {"data": "tab:gray", "forward": "tab:blue", "backward": "tab:green",
                 "sync": "tab:orange", "optimizer": "tab:purple"}


def read_traces(folder):
    """{file name: complete events} of the folder's trace-*.json, bucketed's first: it overlaps."""
    traces = {}
    paths = glob.glob(os.path.join(folder, "trace-*.json"))
    for path in sorted(paths, key=lambda path: ("bucketed" not in path, path)):
        name = os.path.basename(path)
        try:
            with open(path) as file:
                traces[name] = complete_events(json.load(file)["traceEvents"])
        except (OSError, ValueError, LookupError, TypeError, AttributeError) as error:
            print(f"note: skipped {name}: not a Chrome trace ({error!r})")
    return {name: events for name, events in traces.items() if events}


def draw_timeline(axis, events, title):
    """A trace's typical step: per rank a compute row and a communication row, each bucket's
    all-reduce in a lane of its own (several can be in flight at once)."""
    step = typical_step(events)
    drawn = [event for event in events if event["args"]["step"] == step]
    origin = min(event["ts"] for event in drawn)
    ranks = sorted({event["pid"] for event in drawn})
    lanes = sorted({event["name"] for event in drawn if event["tid"] == COMMUNICATION_TRACK})
    compute = {event["name"] for event in drawn if event["tid"] == COMPUTE_TRACK}
    # the phases in their order, any other compute span by name, then the all-reduce lanes
    names = [name for name in PHASE_COLOURS if name in compute]
    names += sorted(compute - set(names)) + lanes
    for name in names:
        mine = [event for event in drawn if event["name"] == name]
        row = np.array([2 * ranks.index(event["pid"]) + event["tid"] for event in mine], float)
        height, fill = 0.8, PHASE_COLOURS.get(name, "tab:brown")
        if name in lanes:  # a lane of the row per bucket, a darker red for each later one
            height = 0.8 / len(lanes)
            row += -0.4 + (lanes.index(name) + 0.5) * height
            fill = plt.get_cmap("Reds")(0.35 + 0.6 * lanes.index(name) / max(1, len(lanes) - 1))
        axis.barh(row, [event["dur"] / MS for event in mine], height=0.9 * height, color=fill,
                  left=[(event["ts"] - origin) / MS for event in mine], label=name)  # µs to ms
    labels = [f"rank {rank} {track}" for rank in ranks for track in ("compute", "communication")]
    axis.set_yticks(range(len(labels)), labels, fontsize=8)
    axis.set_ylim(len(labels) - 0.5, -0.5)
    axis.set(xlabel=f"ms since the start of step {step}",
             title=f"{title}: step {step}, the median-length traced step")
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
    figure.suptitle("Timeline of a typical step per rank: what the communication overlaps")
    figure.tight_layout()
    return figure
