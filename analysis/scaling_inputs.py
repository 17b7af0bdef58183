"""What the projections of §5 and projection.png start from: each model's gradients and when
backward produces them (results/backward-<model>.json), the buckets torch's DDP really sent
(results/ddp-buckets.json), the bytes each run all-reduced per step, and the gloo fits."""
import json
import os

from analysis import cost_model, results_folder
from analysis.traces import gradient_readiness, load_trace
from runtime.models import build_model

BACKWARD_TRACE = "backward-{model}.json"  # made by analysis/make_reference_results.sh
DDP_BUCKETS = "ddp-buckets.json"  # made by benchmarks/ddp_buckets.py


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
    """{parameter: median share of backward elapsed when its gradient was accumulated}, or None
    without a trace holding every parameter."""
    path = backward_trace(results_dir, model)
    if path is None:
        return None
    shares = gradient_readiness(load_trace(path))
    names = [name for name, _ in parameters(model)]
    return {name: shares[name] for name in names} if set(names) <= set(shares) else None


def grouped_runs(folder):
    """results_folder.repeats of the training runs in `folder`, without notes."""
    if not os.path.isdir(folder):
        return {}
    runs, _ = results_folder.load_folder(folder, note=lambda note: None)
    return results_folder.repeats(runs)


def runs_of(grouped, model, series, world, bucket_mb=None):
    """One configuration's runs, at `bucket_mb` or (None) at any bucket size; [] if none."""
    return next((runs for (run_model, run_series, run_world, run_mb), runs in grouped.items()
                 if (run_model, run_series, run_world) == (model, series, world)
                 and bucket_mb in (None, run_mb)), [])


def ddp_entries(results_dir):
    """ddp-buckets.json's [{model, bucket_mb, history: [{from_step, bytes}]}] and its path."""
    path = os.path.join(results_dir, DDP_BUCKETS)
    if not os.path.exists(path):
        return [], path
    with open(path) as file:
        return json.load(file)["layouts"], path


def ddp_layouts(results_dir):
    """{model: {bucket_mb: bytes of each bucket, in launch order}}: the layout DDP settled on
    (the last the hook saw); {} without the file."""
    layouts = {}
    for entry in ddp_entries(results_dir)[0]:
        layouts.setdefault(entry["model"], {})[entry["bucket_mb"]] = entry["history"][-1]["bytes"]
    return layouts


def ddp_layout_field(model, bucket_mb, results_dir):
    """'file#field' of a settled DDP layout, for the document's provenance."""
    entries, path = ddp_entries(results_dir)
    index, entry = next((index, entry) for index, entry in enumerate(entries)
                        if (entry["model"], entry["bucket_mb"]) == (model, bucket_mb))
    return f"{path}#layouts[{index}].history[{len(entry['history']) - 1}].bytes"


def run_layout(run, param_bytes, ddp_sent):
    """The bytes of each all-reduce of a run's step: the last layout it recorded, else what its
    strategy sends (DDP's from `ddp_sent`); None if neither is known."""
    layouts = run["timing"].get("all_reduce_layouts")
    recorded = list(layouts[-1]["bytes"]) if layouts else None
    if recorded:
        return recorded
    config = run["config"]
    strategy = "ddp" if config["mode"] == "ddp" else config["sync"]
    bucket_mb = float(config["bucket_mb"])
    if strategy == "ddp" and bucket_mb not in ddp_sent:
        return None
    return cost_model.messages_per_step(strategy, param_bytes, bucket_mb,
                                        ddp_layout=ddp_sent.get(bucket_mb))


def gloo_fit(path, world, draws=0):
    """(alpha, beta, `draws` bootstrap resamples) of the fit to the verified gloo rows at `world`
    ranks of an all-reduce benchmark; None without two such rows."""
    if not os.path.exists(path):
        return None
    with open(path) as file:
        rows = [row for row in json.load(file)["measurements"]
                if row["implementation"] == "gloo" and row["world_size"] == world
                and row.get("verified", True)]
    if len(rows) < 2:
        return None
    points = [[row[field] for row in rows] for field in ("world_size", "bytes", "median_s")]
    fit = cost_model.fit_alpha_beta(*points)
    return fit.alpha, fit.beta, cost_model.bootstrap_fits(*points, draws=draws) if draws else None
