"""Reading the Chrome traces of `mlp_ddp.py --trace`: the typical step (the timeline figure's
and §3.3's) and when each gradient became ready within backward (the projections' readiness)."""
import statistics

COMPUTE_TRACK, COMMUNICATION_TRACK = 0, 1  # the trace's tids: phases and gradients; all-reduces


def complete_events(events):
    """The spans (phases and all-reduces): "X" events."""
    return [event for event in events if event.get("ph") == "X"]


def typical_step(events, rank=0):
    """The traced step of `rank` of the median length (phases' span; the lower middle if even)."""
    phases = {}
    for event in complete_events(events):
        if event["pid"] == rank and event["tid"] == COMPUTE_TRACK:
            phases.setdefault(event["args"]["step"], []).append(event)
    lengths = {step: max(event["ts"] + event["dur"] for event in spans)
               - min(event["ts"] for event in spans) for step, spans in sorted(phases.items())}
    middle = statistics.median_low(lengths.values())
    return next(step for step in lengths if lengths[step] == middle)


def gradient_readiness(events, rank=0):
    """{parameter: median share of backward elapsed when its gradient was accumulated}."""
    backward = {event["args"]["step"]: event for event in complete_events(events)
                if event["pid"] == rank and event["name"] == "backward"}
    shares = {}
    for event in events:
        if event.get("ph") == "i" and event["pid"] == rank:
            span = backward.get(event["args"]["step"])
            if span and span["dur"] > 0:
                name = event["name"].removeprefix("gradient ")
                shares.setdefault(name, []).append((event["ts"] - span["ts"]) / span["dur"])
    return {name: statistics.median(values) for name, values in shares.items()}
