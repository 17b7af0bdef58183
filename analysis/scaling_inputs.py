"""What the projections of §5 start from: when backward produces each gradient (its trace), the
buckets torch's DDP really sent (results/ddp-buckets.json) and the bytes each run all-reduced."""
import os

from analysis import cost_model, results_folder
from analysis.design_numbers import load
from runtime.options import configuration_name

DDP_BUCKETS = "ddp-buckets.json"  # made by benchmarks/ddp_buckets.py


def backward_events(results_dir, model):
    """['file#traceEvents'] of the model's traced backward, or [] if it was not made."""
    path = os.path.join(results_dir, f"backward-{model}.json")  # by make_reference_results.sh
    return [f"{path}#traceEvents"] if os.path.exists(path) else []


def grouped_runs(folder):
    """results_folder.repeats of the training runs in `folder`, without notes."""
    return results_folder.repeats(results_folder.load_folder(folder, note=lambda note: None)[0])


def runs_of(grouped, model, series, world, bucket_mb=None):
    """One configuration's runs, at `bucket_mb` or (None) at any bucket size; [] if none."""
    return next((runs for (run_model, run_series, run_world, run_mb), runs in grouped.items()
                 if (run_model, run_series, run_world) == (model, series, world)
                 and bucket_mb in (None, run_mb)), [])


def ddp_layouts(results_dir):
    """{model: {bucket_mb: bytes of each bucket, in launch order}} DDP settled on, the last seen."""
    path, layouts = os.path.join(results_dir, DDP_BUCKETS), {}
    for entry in load(path)["layouts"] if os.path.exists(path) else []:
        layouts.setdefault(entry["model"], {})[entry["bucket_mb"]] = entry["history"][-1]["bytes"]
    return layouts


def run_layout(run, param_bytes, ddp_sent):
    """Each all-reduce's bytes of a run's step: as recorded, else as its strategy sends; or None."""
    layouts = run["timing"].get("all_reduce_layouts")
    if layouts and layouts[-1]["bytes"]:
        return list(layouts[-1]["bytes"])
    config = run["config"]
    strategy = "ddp" if config["mode"] == "ddp" else configuration_name(config["sync"],
                                                                       config.get("transport"))
    bucket_mb = float(run["config"]["bucket_mb"])
    if strategy == "ddp" and bucket_mb not in ddp_sent:
        return None
    return cost_model.messages_per_step(strategy, param_bytes, bucket_mb,
                                        ddp_layout=ddp_sent.get(bucket_mb))
