"""Reading the Chrome traces of `mlp_ddp.py --trace`: the typical step (the timeline figure's
and §3.3's) and when each gradient became ready within backward (the projections' readiness)."""
import statistics

COMPUTE_TRACK = 0  # the trace's tid of the phases and gradients; all-reduces are on tid 1
COMMUNICATION_TRACK = 1


def complete_events(events):
    """The spans (phases and all-reduces): "X" events."""
    return [event for event in events if event.get("ph") == "X"]


def step_length(events, rank, step):
    """Microseconds from the first phase of `step` on `rank` to the end of its last."""
    phases = [event for event in events if event.get("ph") == "X" and event["pid"] == rank
              and event["tid"] == COMPUTE_TRACK and event["args"]["step"] == step]
    return (max(event["ts"] + event["dur"] for event in phases)
            - min(event["ts"] for event in phases))


def typical_step(events, rank=0):
    """The traced step of `rank` of the median length (the lower middle on an even count)."""
    steps = sorted({event["args"]["step"] for event in complete_events(events)
                    if event["pid"] == rank})
    lengths = {step: step_length(events, rank, step) for step in steps}
    middle = statistics.median_low(lengths.values())
    return next(step for step in steps if lengths[step] == middle)


def gradient_readiness(events, rank=0):
    """{parameter: median over the traced steps of the share of backward elapsed when its
    gradient was accumulated}."""
    backward = {event["args"]["step"]: event for event in complete_events(events)
                if event["pid"] == rank and event["name"] == "backward"}
    shares = {}
    for event in events:
        if event.get("ph") != "i" or event["pid"] != rank:
            continue
        span = backward.get(event["args"]["step"])
        if span and span["dur"] > 0:
            name = event["name"].removeprefix("gradient ")
            shares.setdefault(name, []).append((event["ts"] - span["ts"]) / span["dur"])
    return {name: statistics.median(values) for name, values in shares.items()}
