"""What the projections of §5 start from, read from a results folder: each model's gradients and
when backward produces them (results/backward-<model>.json, a traced single process), the bytes
each run all-reduced per step, the runs of the emulated network, and the gloo fits the projection
figure draws with.

The design document registers these values with their provenance (design_scaling.py,
design_emulated.py); plot_projection.py draws from them. Nothing here writes a file.
"""
import json
import os

from analysis import cost_model, results_folder
from analysis.traces import gradient_readiness, load_trace
from runtime.models import build_model

BACKWARD_TRACE = "backward-{model}.json"  # made by analysis/make_reference_results.sh


def parameters(model):
    """[(name, gradient bytes)] of the model's trainable parameters, in registration order."""
    return [(name, parameter.numel() * parameter.element_size())
            for name, parameter in build_model(model).named_parameters()
            if parameter.requires_grad]


def backward_trace(results_dir, model):
    """The path of the model's traced backward, or None if it was not made."""
    path = os.path.join(results_dir, BACKWARD_TRACE.format(model=model))
    return path if os.path.exists(path) else None


def readiness(results_dir, model):
    """{parameter: the share of backward elapsed when its gradient was accumulated} (median over
    the traced steps), or None without a trace holding every parameter."""
    path = backward_trace(results_dir, model)
    if path is None:
        return None
    shares = gradient_readiness(load_trace(path))
    names = [name for name, _ in parameters(model)]
    return {name: shares[name] for name in names} if set(names) <= set(shares) else None


def ignore(note):
    """results_folder.load_folder's notes of skipped files: traces sit beside the runs."""


def grouped_runs(folder):
    """results_folder.repeats of the valid training runs in `folder` (none without the folder)."""
    if not os.path.isdir(folder):
        return {}
    runs, _ = results_folder.load_folder(folder, note=ignore)
    return results_folder.repeats(runs)


def recorded_layout(run):
    """The bytes of each all-reduce of the run's steady step, as it recorded them (the last
    layout of timing.all_reduce_layouts), or None if it recorded none."""
    layouts = run["timing"].get("all_reduce_layouts") or []
    return list(layouts[-1]["bytes"]) if layouts else None


def run_layout(run, param_bytes, ddp_sent):
    """The bytes of each all-reduce of a run's step: what it recorded, else what its strategy
    sends (cost_model.messages_per_step; DDP's from `ddp_sent`, {bucket_mb: layout}, as
    ddp_layouts.ddp_layouts reads results/ddp-buckets.json); None if neither is known."""
    recorded = recorded_layout(run)
    if recorded:
        return recorded
    config = run["config"]
    strategy = "ddp" if config["mode"] == "ddp" else config["sync"]
    bucket_mb = float(config["bucket_mb"])
    if strategy == "ddp" and bucket_mb not in ddp_sent:
        return None
    return cost_model.messages_per_step(strategy, param_bytes, bucket_mb,
                                        ddp_layout=ddp_sent.get(bucket_mb))


def gloo_points(path, world):
    """(world sizes, sizes, median seconds) of the verified gloo rows of an all-reduce benchmark
    at `world` ranks; None without the file or with fewer than two rows."""
    if not os.path.exists(path):
        return None
    with open(path) as file:
        rows = [row for row in json.load(file)["measurements"]
                if row["implementation"] == "gloo" and row["world_size"] == world
                and row.get("verified", True)]
    if len(rows) < 2:
        return None
    return ([row["world_size"] for row in rows], [row["bytes"] for row in rows],
            [row["median_s"] for row in rows])
