"""The buckets torch's DDP really sent (results/ddp-buckets.json, from benchmarks/ddp_buckets.py):
what §3.2 shows and every DDP prediction is built from, never a rule of torch's internals."""
import json
import os

FILE = "ddp-buckets.json"


def entries(results_dir):
    """The file's configurations, [{model, bucket_mb, history: [{from_step, bytes}]}], and its
    path; [] without the file."""
    path = os.path.join(results_dir, FILE)
    if not os.path.exists(path):
        return [], path
    with open(path) as file:
        return json.load(file)["layouts"], path


def ddp_layouts(results_dir):
    """{model: {bucket_mb: [bytes of each bucket, in launch order]}}: the layout DDP settled on
    (the last one the hook saw, after its rebuild); {} without the file."""
    layouts = {}
    for entry in entries(results_dir)[0]:
        layouts.setdefault(entry["model"], {})[entry["bucket_mb"]] = entry["history"][-1]["bytes"]
    return layouts


def field_of(model, bucket_mb, results_dir):
    """'file#field' of a steady layout, for the document's provenance."""
    configurations, path = entries(results_dir)
    index, entry = next((index, entry) for index, entry in enumerate(configurations)
                        if (entry["model"], entry["bucket_mb"]) == (model, bucket_mb))
    return f"{path}#layouts[{index}].history[{len(entry['history']) - 1}].bytes"
