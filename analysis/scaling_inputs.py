"""What the projections of §5 start from: each model's gradients, the trace of when backward
produces them (results/backward-<model>.json), the buckets torch's DDP really sent
(results/ddp-buckets.json) and the bytes each run all-reduced per step."""
import json
import os

from analysis import cost_model, results_folder
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
