"""What the design document's §1-§3 and its index say: the models, the communication each strategy
issues, a traced step, the main job, the reference commands and the figures.

The measured tables of §4 are in design_performance.py, the cost model's fits and projections (§4.4,
§5) in design_scaling.py. Each function registers its numbers with a `design_numbers.Numbers` and
returns the tables and texts it fills in; build_design_doc.py renders them into the templates.
"""
import glob
import os
import re

from analysis import cost_model
from analysis.design_numbers import REPO, load, shown, table
from manual_allreduce import DEFAULT_BUCKET_MB, STRATEGIES

FIGURES = ("curves-mlp", "curves-cnn", "time-breakdown-mlp", "time-breakdown-cnn", "scaling-mlp", "scaling-cnn",
           "allreduce", "step-bench", "bucket-sweep", "timeline")
REFERENCE_SCRIPT = os.path.join(REPO, "analysis", "make_reference_results.sh")


# --- What each section quotes ------------------------------------------------------------------------

def model_facts(n):
    """{model: gradient bytes of each trainable tensor}; registers the models', the data's and the dtypes' numbers."""
    import torch

    from runtime.data import DATASETS
    from runtime.models import (  # torch only here: the rest of the build is plain Python
        build_model,
        count_parameters,
    )
    layouts = {}
    for model in ("mlp", "cnn"):
        built, where = build_model(model), f"models.py: build_model('{model}'), the default architecture"
        sizes = layouts[model] = [p.numel() * p.element_size() for p in built.parameters() if p.requires_grad]
        n.stated(f"model.{model}.parameters", count_parameters(built), "count", "model", where)
        n.stated(f"model.{model}.tensors", len(sizes), "count", "model", where + ": trainable tensors")
        n.stated(f"model.{model}.bytes", sum(sizes), "bytes", "model", where + ": fp32 gradient bytes")
        n.stated(f"model.{model}.smallest_bytes", min(sizes), "bytes", "model", where + ": the smallest tensor")
        n.stated(f"model.{model}.largest_share", max(sizes) / sum(sizes), "percent", "model",
                 where + ": the largest tensor's share of the bytes")
        n.stated(f"comm.{model}.compressed_bytes", sum(sizes) // 2, "bytes", "model", where + ": bytes in fp16")
    for index, name in ((1, "mean"), (2, "std")):
        n.stated(f"data.mnist.{name}", DATASETS["mnist"][index], "exact", "code", "data.DATASETS['mnist']")
    for dtype in ("float16", "bfloat16"):
        n.stated(f"precision.{dtype}", torch.finfo(getattr(torch, dtype)).eps / 2, "exponent", "code",
                 f"torch.finfo(torch.{dtype}).eps / 2, the unit roundoff")
    n.stated("precision.float16_max", torch.finfo(torch.float16).max, "number", "code", "torch.finfo(torch.float16).max")
    return layouts


def bucketed_first_bucket_mb(n):
    """BucketedSync's cap on its first bucket in MiB: the layouts and projections here follow the code."""
    import inspect

    from manual_allreduce import BucketedSync
    option = inspect.signature(BucketedSync).parameters.get("first_bucket_mb")
    cap = option.default if option else None
    n.stated("code.bucketed_first_bucket_mb", cap, "MiB", "code", "manual_allreduce.BucketedSync(first_bucket_mb=...)")
    n.stated("code.ddp_first_bucket_mb", cost_model.DDP_FIRST_BUCKET_MB, "MiB", "code", "cost_model.DDP_FIRST_BUCKET_MB, "
             "checked against torch's _compute_bucket_assignment_by_size by tests/test_design_doc.py")
    return cap


ISSUED = {"per-param": "after backward, one blocking all-reduce per tensor",
          "flat": "after backward, one all-reduce of a packed buffer",
          "bucketed": "during backward, each bucket as soon as it is full",
          "ring": "after backward, 2(n−1) blocking send/receive exchanges",
          "ddp": "during backward, from autograd hooks, per bucket"}


def communication_section(n, layouts, worlds, bucket_mbs, first):
    """Per model: all-reduces, message steps and bytes each rank sends per step; the bucket layouts."""
    tables = {}
    for model, sizes in layouts.items():
        rows, layout_rows = [], []
        for strategy in STRATEGIES + ("ddp",):
            key, messages = f"comm.{model}.{strategy}", cost_model.messages_per_step(strategy, sizes, DEFAULT_BUCKET_MB, first)
            n.add(f"{key}.collectives", 1 if strategy == "ring" else len(messages), "count", kind="model",
                  formula=f"cost_model.messages_per_step('{strategy}', tensor bytes, {DEFAULT_BUCKET_MB:g} MiB)")
            cells = [strategy, n.text(f"{key}.collectives")]
            for world in worlds:
                a, b = cost_model.ring_coefficients(world)
                n.add(f"{key}.w{world}.message_steps", int(a) * len(messages), "count", kind="model",
                      formula="2(n-1) per all-reduce")
                n.add(f"{key}.w{world}.bytes_per_rank", float(b) * sum(messages), "bytes", kind="model",
                      formula="2(n-1)/n x the bytes all-reduced")
                cells += [n.text(f"{key}.w{world}.message_steps"), n.text(f"{key}.w{world}.bytes_per_rank")]
            rows.append(cells + [ISSUED[strategy]])
        for mb in bucket_mbs:
            for series, layout in (("bucketed", cost_model.bucket_sizes(sizes, mb, first)), ("ddp", cost_model.ddp_bucket_sizes(sizes, mb))):
                formula = f"cost_model's layout of {series} buckets at {mb:g} MiB (first bucket capped), in launch order"
                n.add(f"buckets.{model}.{series}.{mb:g}", layout, "bytes-list", kind="model", formula=formula)
                n.add(f"buckets.{model}.{series}.{mb:g}.count", len(layout), "count", kind="model", formula=formula)
            layout_rows.append([f"{mb:g} MiB", n.text(f"buckets.{model}.bucketed.{mb:g}"),
                                n.text(f"buckets.{model}.ddp.{mb:g}")])
        columns = [h for w in worlds for h in (f"message steps, n = {w}", f"bytes sent per rank, n = {w}")]
        tables[f"table.comm.{model}"] = table(["strategy", "all-reduces per step"] + columns + ["issued"], rows)
        tables[f"table.buckets.{model}"] = table(["--bucket-mb", "manual bucketed: buckets", "torch DDP: buckets"],
                                                 layout_rows)
    return tables


def trace_section(n, results_dir):
    """One step of rank 0 from a Chrome trace in the results (a bucketed one if there is one)."""
    paths = sorted(glob.glob(os.path.join(results_dir, "trace-*.json")), key=lambda p: ("bucketed" not in p, p))
    events = load(paths[0]).get("traceEvents", []) if paths else []
    spans = [(i, e) for i, e in enumerate(events) if e.get("ph") == "X" and e.get("pid") == 0]
    headlines = {"first_launch_before_backward_end": "trace_us", "last_done_after_backward_end": "trace_us",
                 "allreduces": "count"}
    n.add("trace.file", os.path.basename(paths[0]) if spans else None, "name", kind="file", file=spans and paths[0])
    if not spans:
        for name in ["trace.step"] + [f"trace.{field}" for field in headlines]:
            n.add(name, None, "count")
        return {"table.trace": f"*No trace in {shown(results_dir)}, so the numbers around this note are not measured: "
                               "make one (the command is in the index), then rebuild.*"}
    path, steps = paths[0], sorted({e["args"]["step"] for _, e in spans})
    mine = sorted(((i, e) for i, e in spans if e["args"]["step"] == steps[len(steps) // 2]), key=lambda ie: ie[1]["ts"])
    event = lambda i, field: f"{path}#traceEvents[{i}].{field}"  # noqa: E731
    n.measured("trace.step", path, f"traceEvents[{mine[0][0]}].args.step", "count")
    rows = []
    for i, e in mine:
        n.derived(f"trace.event{i}.start", lambda t, t0: t - t0, [event(i, "ts"), event(mine[0][0], "ts")],
                  "trace_us", "ts - the step's first ts")
        n.measured(f"trace.event{i}.duration", path, f"traceEvents[{i}].dur", "trace_us")
        rows.append(["communication" if e["tid"] else "compute", e["name"], n.text(f"trace.event{i}.start"),
                     n.text(f"trace.event{i}.duration")])
    backward = [i for i, e in mine if e["name"] == "backward"]
    comm = [i for i, e in mine if e["name"].startswith("all-reduce")]

    def summary(backward_start, backward_duration, *spans):
        starts, ends = spans[0::2], [start + duration for start, duration in zip(spans[0::2], spans[1::2])]
        backward_end = backward_start + backward_duration
        return {"first_launch_before_backward_end": backward_end - min(starts),
                "last_done_after_backward_end": max(ends) - backward_end, "allreduces": len(starts)}
    inputs = [event(backward[0], "ts"), event(backward[0], "dur")] + [event(i, f) for i in comm for f in ("ts", "dur")]
    n.derived_fields("trace", summary, inputs if backward and comm else [], headlines,
                     "from rank 0's events of the step: backward's end, each all-reduce's span")
    return {"table.trace": table(["track", "event", "starts at", "lasts"], rows)}


def reference_commands(n):
    """The commands of make_reference_results.sh as the index shows them, and the trace's own command."""
    with open(REFERENCE_SCRIPT) as file:
        script = file.read()
    commands, pending = [], ""
    for line in script.splitlines():  # a command ends at a line without a trailing backslash
        if pending or line.startswith('"$PYTHON" '):
            pending += line.replace('"$PYTHON" ', "python ", 1).strip() if not pending else " " + line.strip()
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
            else:
                commands.append(re.sub(r"\s+#.*$", "", pending))
                pending = ""
    duration = re.search(r"^#\s+\./analysis/make_reference_results\.sh\s+#\s*(.+)$", script, flags=re.M)
    n.stated("reference.duration", duration.group(1) if duration else None, "name", "code",
             "make_reference_results.sh: the comment after its first usage line")
    trace = next((c for c in commands if "--trace " in c), None)
    return {"text.reference_commands": "```\n" + "\n".join(commands) + "\n```",
            "text.trace_command": f"`{trace}`" if trace else "*make_reference_results.sh makes no trace*"}


def main_job_section(n, results_dir):
    """The README's main job (make_reference_results.sh) and the in-memory data path against a DataLoader."""
    main = os.path.join(results_dir, "main", "mlp-manual-bucketed-w4.json")
    main = main if os.path.exists(main) else None
    for name, field, unit in (("main.test_accuracy", "test.accuracy", "percent"), ("main.epochs", "config.epochs", "count"),
                              ("main.world", "environment.world_size", "count"), ("main.sync", "config.sync", "name"),
                              ("main.total_time", "total_time_s", "s"), ("main.throughput", "throughput_samples_per_s",
                                                                          "samples/s")):
        n.measured(name, main, field, unit)
    loader = os.path.join(results_dir, "dataloader-bench.json")
    loader = loader if os.path.exists(loader) else None
    n.measured("loader.in_memory_s", loader, "median_seconds.in_memory", "s")
    n.measured("loader.dataloader_s", loader, "median_seconds.dataloader", "s")
    n.measured("loader.ratio", loader, "ratio", "ratio")
    return {}


def figures(results_dir, out_dir):
    """A Markdown image per plot of results/plots (linked relative to the document), or what to run."""
    links = {}
    for stem in FIGURES:
        path = os.path.join(results_dir, "plots", stem + ".png")
        relative = os.path.relpath(path, out_dir).replace(os.sep, "/")
        links[f"figure.{stem}"] = (f"![{stem}]({relative})" if os.path.exists(path) else f"*Figure {stem}.png is "
                                   f"not in {shown(results_dir)}/plots: run python -m analysis.plots, then rebuild.*")
    return links


# --- Build, check, write -------------------------------------------------------------------------------
