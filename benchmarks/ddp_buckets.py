"""The buckets torch's DDP really sends, as its communication hook sees them, for each model and
--bucket-mb: the layouts §3.2 of the design document shows and every DDP prediction is built from.

    python -m benchmarks.ddp_buckets                 # -> results/ddp-buckets.json, ~15 s
    python -m benchmarks.ddp_buckets --output /tmp/b.json --steps 4

DDP assigns parameters to buckets when it is built, then rebuilds the buckets after the first
backward in the order the gradients became ready, and with `bucket_cap_mb` given (the trainer always
gives it) the rebuilt first bucket is capped at the cap, not at DDP's 1 MiB default. Which layout
results is torch's business and changes between versions, so it is not computed from a rule here:
two gloo ranks train a few steps of each configuration through runtime/wrappers.py's HookedDDP, and
the timing layer's byte log (timing.LayoutLog) keeps every layout with the step it first went out.
tests/test_design_doc.py probes again on the installed torch and compares with the document.
"""
import argparse
import os
import platform
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.functional import cross_entropy

from benchmarks.common import run_world_sizes
from runtime import torch_compat
from runtime.models import build_model
from runtime.results import write_json_atomic
from runtime.timing import CommRecorder, LayoutLog
from runtime.wrappers import SyncOptions, wrap_model

SCHEMA = "ddp-buckets/2"  # 2: a list of configurations (a key "0.25" cannot be a JSON path)
MODELS = ("mlp", "cnn")
BUCKET_MBS = (25.0, 4.0, 1.0, 0.25)  # the bucket sweep's --bucket-mb values


def layouts_of(model_name, bucket_mb, steps):
    """The layouts DDP sent over `steps` steps of `model_name` at `bucket_mb` (a collective)."""
    torch.manual_seed(0)
    model = build_model(model_name)
    recorder = CommRecorder()
    wrapped = wrap_model(model, SyncOptions("ddp", bucket_mb=bucket_mb), recorder)
    log = LayoutLog()
    images, labels = torch.randn(2, 1, 28, 28), torch.tensor([0, 1])
    for step in range(steps):
        cross_entropy(wrapped(images), labels).backward()
        model.zero_grad(set_to_none=True)
        _spans, sizes, _gradients = recorder.take()
        log.add(step, sizes)
    return log.layouts


def probe(models=MODELS, bucket_mbs=BUCKET_MBS, steps=3):
    """{model: {"<bucket_mb>": layouts}} on this rank (2 ranks are enough: the layout does not
    depend on the world size)."""
    return {model: {f"{bucket_mb:g}": layouts_of(model, bucket_mb, steps)
                    for bucket_mb in bucket_mbs} for model in models}


def probe_rank(placement, args):
    """One rank: the process group, the probe; rank 0 writes it to args.part_path."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{placement.master_port}",
                            rank=placement.rank, world_size=placement.world_size)
    try:
        layouts = probe(args.models, args.bucket_mbs, args.steps)
        if placement.rank == 0:
            write_json_atomic(args.part_path, layouts)
    finally:
        torch_compat.destroy_process_group()


def probed(models=MODELS, bucket_mbs=BUCKET_MBS, steps=3):
    """The probe run on 2 local gloo ranks; None if a rank failed."""
    args = argparse.Namespace(models=list(models), bucket_mbs=list(bucket_mbs), steps=steps,
                              world_sizes=[2], emulate_link=None)
    # Forked: neither caller (main, the design document's test in a child) has run a tensor
    # operation. DDP's constructor imports torch._dynamo, two seconds of CPU: once here.
    import torch._dynamo  # noqa: F401
    parts = run_world_sizes(probe_rank, args, fork=True)
    return None if parts is None else parts[2]


def main(argv=None):
    """Probe, print each final layout, write the results file; 1 if a rank failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="steps per configuration (>= 2)")
    parser.add_argument("--output", default=os.path.join("results", "ddp-buckets.json"))
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2: DDP rebuilds its buckets after the first")
    layouts = probed(steps=args.steps)
    if layouts is None:
        return 1
    for model, per_cap in layouts.items():
        for bucket_mb, history in per_cap.items():
            print(f"{model} --bucket-mb {bucket_mb}: " + " then ".join(
                f"from step {layout['from_step']}: {layout['bytes']}" for layout in history))
    write_json_atomic(args.output, {
        "schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "environment": {"torch": torch.__version__, "python": platform.python_version(),
                        "backend": "gloo", "world_size": 2},
        "config": {"steps": args.steps, "bucket_mbs": list(BUCKET_MBS)},
        "layouts": [{"model": model, "bucket_mb": float(bucket_mb), "history": history}
                    for model, per_cap in layouts.items()
                    for bucket_mb, history in per_cap.items()]})
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
