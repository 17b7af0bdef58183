"""The buckets torch's DDP really sent (results/ddp-buckets.json, from benchmarks/ddp_buckets.py):
what §3.2 shows and every DDP prediction is built from, never a rule of torch's internals."""
import json
import os

FILE = "ddp-buckets.json"


def ddp_layouts(results_dir):
    """{model: {bucket_mb: [bytes of each bucket, in launch order]}}: the layout DDP settled on
    (the last one the hook saw, after its rebuild); {} without the file."""
    path = os.path.join(results_dir, FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as file:
        layouts = json.load(file)["layouts"]
    return {model: {float(mb): history[-1]["bytes"] for mb, history in per_cap.items()}
            for model, per_cap in layouts.items()}


def field_of(model, bucket_mb, results_dir):
    """'file#field' of a steady layout, for the document's provenance."""
    path = os.path.join(results_dir, FILE)
    with open(path) as file:
        history = json.load(file)["layouts"][model][f"{bucket_mb:g}"]
    return f"{path}#layouts.{model}.{bucket_mb:g}[{len(history) - 1}].bytes"
