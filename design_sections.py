"""What each section of the design document says: its numbers and tables, from the results files.

Each function registers its numbers with a `design_numbers.Numbers` and returns the tables and texts
it fills in; build_design_doc.py renders them into the templates.
"""
import glob
import os

import cost_model as cm
from design_numbers import BuildError, load, lookup, show_bytes, shown, table
from timing import overlap

STRATEGIES = ("per-param", "flat", "bucketed", "ring")
DEFAULT_BUCKET_MB = 25.0  # mlp_ddp.py's --bucket-mb, DDP's bucket_cap_mb
LINKS = {"fitted": None, **{f"{gbit}g": gbit for gbit in cm.CLUSTER_LINKS_GBIT}}  # projection scenarios
LINK_NAMES = ["this machine's fit"] + [f"{gbit:g} Gbit/s" for gbit in cm.CLUSTER_LINKS_GBIT]
FIGURES = ("curves-mlp", "curves-cnn", "time-breakdown-mlp", "time-breakdown-cnn", "scaling-mlp", "scaling-cnn",
           "allreduce", "step-bench", "bucket-sweep")


def load_runs(results_dir, pattern):
    """{(model, series, world size[, bucket MiB]): path of the newest run} of the files matching `pattern`."""
    runs, created = {}, {}
    for path in sorted(glob.glob(os.path.join(results_dir, pattern))):
        run = load(path)
        config = run.get("config", {})
        series = (config.get("sync") if config.get("mode") == "manual" else config.get("mode")) or "?"
        series += f"-{config['compress']}" if config.get("compress") else ""
        key = (config.get("model"), series, lookup(run, "environment.world_size"))
        key += (float(config.get("bucket_mb", DEFAULT_BUCKET_MB)),) if "bucket" in pattern else ()
        if run.get("created", "") >= created.get(key, ""):
            runs[key], created[key] = path, run.get("created", "")
    return runs


# --- What each section quotes ------------------------------------------------------------------------

def model_facts(n):
    """{model: gradient bytes of each trainable tensor}; registers the models', the data's and the dtypes' numbers."""
    import torch
    from data import DATASETS
    from models import build_model, count_parameters  # torch only here: the rest of the build is plain Python
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
    """BucketedSync's cap on its first bucket in MiB (None without one): the layouts here follow the code."""
    import inspect
    from manual_allreduce import BucketedSync
    option = inspect.signature(BucketedSync).parameters.get("first_bucket_mb")
    cap = option.default if option else None
    n.stated("code.bucketed_first_bucket_mb", cap, "MiB", "code", "manual_allreduce.BucketedSync(first_bucket_mb=...)")
    return cap


def sweep_section(n, runs, worlds):
    """Per model: the measured table (one row per series and world size) and the headlines at the largest size."""
    tables, top = {}, worlds[-1]
    any_run = runs.get(("mlp", "single", 1)) or next(iter(runs.values()))
    n.measured("machine.cores", any_run, "environment.cores", "count")
    n.measured("machine.torch", any_run, "environment.torch", "name")
    n.measured("machine.threads_largest", runs.get(("mlp", "ddp", top)), "environment.threads_per_rank", "count")
    for model in ("mlp", "cnn"):
        rows, single = [], f"sweep.{model}.single.w1"
        for field in ("val_samples", "warmup_steps", "max_steps", "epochs"):
            n.measured(f"{single}.{field}", runs.get((model, "single", 1)), f"config.{field}", "count")
        for series, world in [("single", 1)] + [(s, w) for w in worlds for s in ("ddp",) + STRATEGIES]:
            key, path = f"sweep.{model}.{series}.w{world}", runs.get((model, series, world))
            for column, phase in (("step", "step"), ("exposed", "sync"), ("busy", "comm_busy"), ("backward", "backward")):
                n.measured(f"{key}.{column}_s", path, f"timing.across_ranks.{phase}.median", "ms")
            phases = [f"{path}#timing.across_ranks.{p}.median" for p in ("forward", "backward", "optimizer")]
            n.derived(f"{key}.compute_s", lambda *v: sum(v), phases if path else [], "ms", "forward + backward + optimizer")
            n.measured(f"{key}.batch", path, "config.batch_size", "count")
            n.measured(f"{key}.throughput", path, "throughput_samples_per_s", "samples/s")
            n.derived(f"{key}.overlap", overlap, [f"{key}.exposed_s", f"{key}.busy_s"],
                      "percent", "1 - exposed / busy")
            n.derived(f"{key}.comm_share", lambda e, s: e / s, [f"{key}.exposed_s", f"{key}.step_s"], "percent",
                      "exposed / step")
            n.derived(f"{key}.speedup", lambda t, t1: t / t1, [f"{key}.throughput", f"{single}.throughput"], "ratio",
                      "throughput / one process's throughput")
            n.derived(f"{key}.efficiency", lambda s, w=world: s / w, [f"{key}.speedup"], "percent", "speedup / ranks")
            text = n.text
            rows.append([series if series in ("single", "ddp") else f"manual {series}", world, text(f"{key}.step_s"),
                         text(f"{key}.compute_s"),
                         "—" if series == "single" else text(f"{key}.exposed_s"),
                         "—" if series == "single" else text(f"{key}.busy_s"),
                         "—" if series == "single" else text(f"{key}.overlap"),
                         text(f"{key}.throughput"), text(f"{key}.efficiency")])
        tables[f"table.sweep.{model}"] = table(["sync", "ranks", "median step", "compute", "exposed comm", "busy comm",
                                                "overlap", "throughput", "efficiency"], rows)
        n.measured(f"sweep.{model}.largest_world", next(p for k, p in runs.items() if k[2] == top),
                   "environment.world_size", "count")
        for series in STRATEGIES:
            n.derived(f"sweep.{model}.largest.{series}.comm_share", lambda v: v,
                      [f"sweep.{model}.{series}.w{top}.comm_share"], "percent", "at the largest world size")
        n.derived(f"sweep.{model}.largest.compute_ratio", lambda c, c1: c / c1,
                  [f"sweep.{model}.flat.w{top}.compute_s", f"{single}.compute_s"], "ratio",
                  "flat's compute at the largest world size / one process's")
        steps = {s: n.value(f"sweep.{model}.{s}.w{top}.step_s") for s in ("ddp",) + STRATEGIES}
        fastest = min((s for s in steps if steps[s] is not None), key=steps.get, default=None)
        n.add(f"sweep.{model}.fastest", fastest, "name", kind="derived", inputs=[f"sweep.{model}.{s}.w{top}.step_s"
              for s in steps], formula="the series with the smallest median step at the largest world size")
        for field, unit in (("step_s", "ms"), ("speedup", "ratio"), ("efficiency", "percent")):
            n.derived(f"sweep.{model}.fastest_{field}", lambda v: v,
                      [f"sweep.{model}.{fastest}.w{top}.{field}"] if fastest else [], unit, "of the fastest series")
    return tables


def allreduce_section(n, bench):
    """The alpha-beta fits of gloo and of the ring; per world size, a latency table with the fit's predictions."""
    rows = [(i, m) for i, m in enumerate(load(bench).get("measurements", [])) if m.get("verified", True)]
    n.measured("bench.iterations", bench, "config.iterations", "count")
    n.measured("bench.load_average", bench, "environment.load_average_1min_at_start", "number")
    worlds = sorted({m["world_size"] for _, m in rows})
    for name, world in zip(("smallest", "largest"), (worlds[:1] + worlds[-1:]) if worlds else ()):
        first = next(i for i, m in rows if m["world_size"] == world)
        n.measured(f"bench.{name}_world", bench, f"measurements[{first}].world_size", "count")
    fits, tables = {}, []
    for implementation in ("gloo", "ring"):
        points = [(m["world_size"], m["bytes"], m["median_s"]) for _, m in rows if m["implementation"] == implementation]
        if len(points) < 2:
            raise BuildError(f"{bench} has fewer than two verified {implementation} measurements: no fit possible")
        fit = fits[implementation] = cm.fit_alpha_beta(*zip(*points))
        for name, value, unit in (("alpha_s", fit.alpha, "us"), ("beta_s_per_byte", fit.beta, "ns/byte"),
                                  ("bandwidth", fit.bandwidth_gbps if fit.beta > 0 else None, "GB/s"),
                                  ("r2", fit.r2, "number"),
                                  ("median_relative_error", fit.median_relative_error, "percent"),
                                  ("max_relative_error", fit.max_relative_error, "percent"),
                                  ("points", fit.points, "count")):
            n.add(f"fit.{implementation}.{name}", value, unit, kind="fit", file=bench, implementation=implementation,
                  formula=f"cost_model.fit_alpha_beta(world_size, bytes, median_s) of the verified {implementation} rows")
    for world in worlds:
        lines = []
        for size in sorted({m["bytes"] for _, m in rows if m["world_size"] == world}):
            cells = [show_bytes(size)]
            for implementation in fits:
                index = next((i for i, m in rows if (m["world_size"], m["bytes"], m["implementation"])
                              == (world, size, implementation)), None)
                key = f"allreduce.w{world}.{implementation}.{size}"
                for column, unit in (("median_s", "s"), ("busbw_gbps", "GB/s")):
                    n.measured(f"{key}.{column}", bench if index is not None else None,
                               f"measurements[{index}].{column}", unit)
                n.derived(f"{key}.model_s", lambda a, b, s=size, w=world: cm.allreduce_time(s, w, a, b),
                          [f"fit.{implementation}.alpha_s", f"fit.{implementation}.beta_s_per_byte"], "s",
                          f"a*alpha + b*N*beta, N = {size} bytes, n = {world}")
                cells += [n.text(f"{key}.median_s"), n.text(f"{key}.model_s"), n.text(f"{key}.busbw_gbps")]
            lines.append(cells)
        tables.append(f"**{world} ranks**\n\n" + table(["size", "gloo median", "gloo model", "gloo busbw",
                                                          "ring median", "ring model", "ring busbw"], lines))
    return fits, {"table.allreduce": "\n\n".join(tables)}


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
            key, messages = f"comm.{model}.{strategy}", cm.messages_per_step(strategy, sizes, DEFAULT_BUCKET_MB, first)
            n.add(f"{key}.collectives", 1 if strategy == "ring" else len(messages), "count", kind="model",
                  formula=f"cost_model.messages_per_step('{strategy}', tensor bytes, {DEFAULT_BUCKET_MB:g} MiB)")
            cells = [strategy, n.text(f"{key}.collectives")]
            for world in worlds:
                a, b = cm.ring_coefficients(world)
                n.add(f"{key}.w{world}.message_steps", int(a) * len(messages), "count", kind="model",
                      formula="2(n-1) per all-reduce")
                n.add(f"{key}.w{world}.bytes_per_rank", float(b) * sum(messages), "bytes", kind="model",
                      formula="2(n-1)/n x the bytes all-reduced")
                cells += [n.text(f"{key}.w{world}.message_steps"), n.text(f"{key}.w{world}.bytes_per_rank")]
            rows.append(cells + [ISSUED[strategy]])
        for mb in bucket_mbs:
            for series, layout in (("bucketed", cm.bucket_sizes(sizes, mb, first)), ("ddp", cm.ddp_bucket_sizes(sizes, mb))):
                formula = f"cost_model's layout of {series} buckets at {mb:g} MiB, in launch order"
                n.add(f"buckets.{model}.{series}.{mb:g}", layout, "bytes-list", kind="model", formula=formula)
                n.add(f"buckets.{model}.{series}.{mb:g}.count", len(layout), "count", kind="model", formula=formula)
            layout_rows.append([f"{mb:g} MiB", n.text(f"buckets.{model}.bucketed.{mb:g}"),
                                n.text(f"buckets.{model}.ddp.{mb:g}")])
        columns = [h for w in worlds for h in (f"message steps, n = {w}", f"bytes sent per rank, n = {w}")]
        tables[f"table.comm.{model}"] = table(["strategy", "all-reduces per step"] + columns + ["issued"], rows)
        tables[f"table.buckets.{model}"] = table(["--bucket-mb", "manual bucketed: buckets", "torch DDP: buckets"],
                                                 layout_rows)
    return tables


def prediction_section(n, layouts, worlds, runs, fits, first):
    """Per model: the fitted model's communication per step against the sweep's measured busy time."""
    tables = {}
    for model, sizes in layouts.items():
        rows = []
        for world in worlds:
            for strategy in ("ddp",) + STRATEGIES:
                key, path = f"predict.{model}.{strategy}.w{world}", runs.get((model, strategy, world))
                bucket_mb = lookup(load(path), "config.bucket_mb") if path else DEFAULT_BUCKET_MB
                messages = cm.messages_per_step(strategy, sizes, bucket_mb, first)
                fit = "ring" if strategy == "ring" else "gloo"  # the hand-written ring has its own fit
                n.derived(f"{key}.comm_s", lambda a, b: cm.step_comm_time(messages, world, a, b),
                          [f"fit.{fit}.alpha_s", f"fit.{fit}.beta_s_per_byte"], "ms",
                          f"cost_model.step_comm_time of {strategy}'s all-reduces ({bucket_mb:g} MiB buckets), {fit} fit")
                measured = f"sweep.{model}.{strategy}.w{world}"
                n.derived(f"{key}.ratio", lambda m, p: m / p, [f"{measured}.busy_s", f"{key}.comm_s"], "ratio",
                          "measured busy / predicted")
                rows.append([strategy, world, n.text(f"{key}.comm_s"), n.text(f"{measured}.busy_s"),
                             "in backward" if strategy == "ddp" else n.text(f"{measured}.exposed_s"),
                             n.text(f"{key}.ratio")])
        tables[f"table.predict.{model}"] = table(["sync", "ranks", "predicted comm", "measured busy",
                                                  "measured exposed", "measured / predicted"], rows)
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


def step_bench_section(n, results_dir):
    """benchmarks/step_bench.py's table, where DDP's exposed communication is measured."""
    path, fields = os.path.join(results_dir, "step-bench.json"), {
        "median_step_s": "ms", "median_backward_s": "ms", "median_exposed_comm_s": "ms", "median_comm_busy_s": "ms",
        "overlap": "percent", "step_ratio_to_ddp": "ratio"}
    if not os.path.exists(path):
        return {"table.step_bench": f"*No step benchmark in {shown(results_dir)}: run python benchmarks/step_bench.py.*"}
    rows = []
    for i, m in enumerate(load(path).get("measurements", [])):
        key = f"stepbench.{m['model']}.w{m['world_size']}.{m['configuration']}"
        for field, unit in fields.items():
            n.measured(f"{key}.{field}", path, f"measurements[{i}].{field}", unit)
        rows.append([m["model"], m["world_size"], m["configuration"]]
                    + ["—" if m.get(field) is None else n.text(f"{key}.{field}") for field in fields])
    return {"table.step_bench": table(["model", "ranks", "configuration", "median step", "backward", "exposed comm",
                                       "busy comm", "overlap", "× DDP"], rows)}


def bucket_sweep_section(n, runs):
    """The MLP's median step against the bucket size, at the largest world size of the bucket runs."""
    runs = {key: path for key, path in runs.items() if key[0] == "mlp"}
    if not runs:
        n.add("bucket.world", None, "count")
        return {"table.bucket_sweep": "*No bucket sweep (bucket-*.json) in the results: run python sweep.py.*"}
    top = max(key[2] for key in runs)
    n.measured("bucket.world", next(p for key, p in runs.items() if key[2] == top), "environment.world_size", "count")
    rows = []
    for mb in sorted({key[3] for key in runs}):
        for series in ("bucketed", "ddp"):
            n.measured(f"bucket.{series}.{mb:g}.step_s", runs.get(("mlp", series, top, mb)),
                       "timing.across_ranks.step.median", "ms")
        rows.append([f"{mb:g} MiB", n.text(f"bucket.bucketed.{mb:g}.step_s"), n.text(f"bucket.ddp.{mb:g}.step_s")])
    return {"table.bucket_sweep": table(["--bucket-mb", "manual bucketed: median step", "torch DDP: median step"],
                                        rows)}


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


def register_assumptions(n):
    """The projections' stated assumptions and the published figures, all from cost_model.py."""
    n.stated("assume.alpha_s", cm.CLUSTER_ALPHA_S, "us", "assumption", "cost_model.CLUSTER_ALPHA_S")
    for name, value in (("reference_world", cm.REFERENCE_WORLD_SIZE), ("batch_factor", cm.LARGER_BATCH_FACTOR),
                        ("smallest_world", min(cm.PROJECTED_WORLD_SIZES)),
                        ("largest_world", max(cm.PROJECTED_WORLD_SIZES))):
        n.stated(f"assume.{name}", value, "count", "assumption", "cost_model.py")
    n.stated("assume.buckets", list(cm.BUCKET_CANDIDATES_MB), "MiB-list", "assumption", "cost_model.BUCKET_CANDIDATES_MB")
    n.stated("assume.reference_link", cm.REFERENCE_LINK_GBIT, "Gbit/s", "assumption", "cost_model.REFERENCE_LINK_GBIT")
    for link, gbit in LINKS.items():
        if gbit:
            n.stated(f"assume.link.{link}", gbit, "Gbit/s", "assumption", "cost_model.CLUSTER_LINKS_GBIT")
            n.stated(f"assume.beta.{link}", cm.link_beta(gbit), "ns/byte", "assumption", "8 bits per byte / link speed")
    for key, (value, source) in cm.PUBLISHED.items():
        unit = "round-percent" if isinstance(value, float) else "round-ratio" if "factor" in key else "count"
        n.stated(f"published.{key}", value, unit, "publication", source)
    n.derived("technique.latency_per_allreduce", lambda a: float(cm.ring_coefficients(cm.REFERENCE_WORLD_SIZE)[0]) * a,
              ["assume.alpha_s"], "ms", "2(n-1) x alpha at the reference world size")


TECHNIQUES = {"flat": ("one all-reduce after backward (flat)", False, 1.0, 1),  # (text, buckets?, wire, batch x)
              "bucketed": ("buckets overlapping backward (best size)", True, 1.0, 1),
              "compressed": ("… and gradients sent as fp16/bf16", True, 0.5, 1),
              "larger_batch": ("… and a larger per-rank batch", True, 0.5, cm.LARGER_BATCH_FACTOR)}


def projection_section(n, layouts):
    """Projected step, efficiency and best bucket per world size and link; crossovers; what each technique buys."""
    register_assumptions(n)
    cost = {link: ["fit.gloo.alpha_s", "fit.gloo.beta_s_per_byte"] if link == "fitted"
            else ["assume.alpha_s", f"assume.beta.{link}"] for link in LINKS}
    tables, crossover = {}, []
    for model, sizes in layouts.items():
        single = f"sweep.{model}.single.w1"
        base = [f"{single}.compute_s", f"{single}.backward_s"]
        n.derived(f"project.{model}.per_sample_s", lambda c, b: c / b, [base[0], f"{single}.batch"], "s",
                  "compute / batch")
        n.derived(f"project.{model}.backward_share", lambda c, b: b / c, base, "percent", "backward / compute")

        def projected(compute, backward, alpha, beta, world, buckets=True, wire=1.0, factor=1):
            if not buckets:
                return cm.project_step(compute * factor, backward * factor, sizes, world, alpha, beta, None, wire)
            mb, projection = cm.best_bucket(compute * factor, backward * factor, sizes, world, alpha, beta,
                                            wire_fraction=wire)
            return dict(projection, bucket_mb=mb)
        rows = []
        for world in cm.PROJECTED_WORLD_SIZES:
            for link in LINKS:
                n.derived_fields(f"project.{model}.{link}.n{world}", lambda *v: projected(*v, world), base + cost[link],
                                 {"step_s": "ms", "efficiency": "percent", "bucket_mb": "MiB"},
                                 f"cost_model.best_bucket over assume.buckets, {world} ranks")
            rows.append([world] + [" · ".join(n.text(f"project.{model}.{link}.n{world}.{field}")
                                              for field in ("step_s", "efficiency", "bucket_mb")) for link in LINKS])
        tables[f"table.project.{model}"] = table(["ranks"] + LINK_NAMES, rows)
        for link in LINKS:
            n.derived(f"crossover.{model}.{link}", lambda c, a, b: cm.crossover_world_size(c, sum(sizes), a, b) or 0,
                      base[:1] + cost[link], "ranks", "cost_model.crossover_world_size (flat ring, no overlap)")
        crossover.append([model.upper()] + [n.text(f"crossover.{model}.{link}") for link in LINKS])
        rows, link = [], f"{cm.REFERENCE_LINK_GBIT}g"
        for label, (text, buckets, wire, factor) in TECHNIQUES.items():
            key, units = f"technique.{model}.{label}", {"step_s": "ms", "exposed_s": "ms", "efficiency": "percent"}
            n.derived_fields(key, lambda *v: projected(*v, cm.REFERENCE_WORLD_SIZE, buckets, wire, factor),
                             base + cost[link], dict(units, **({"bucket_mb": "MiB"} if buckets else {})),
                             f"cost_model projection of '{label}' at the reference world size and link")
            rows.append([text, n.text(f"{key}.bucket_mb") if buckets else "—"] + [n.text(f"{key}.{f}") for f in units])
        tables[f"table.techniques.{model}"] = table(["what the step does", "best bucket", "step", "exposed comm",
                                                     "efficiency"], rows)
    tables["table.crossover"] = table(["model"] + LINK_NAMES, crossover)
    return tables


def figures(results_dir, out_dir):
    """A Markdown image per plot of results/plots (linked relative to the document), or what to run."""
    links = {}
    for stem in FIGURES:
        path = os.path.join(results_dir, "plots", stem + ".png")
        relative = os.path.relpath(path, out_dir).replace(os.sep, "/")
        links[f"figure.{stem}"] = (f"![{stem}]({relative})" if os.path.exists(path) else f"*Figure {stem}.png is "
                                   f"not in {shown(results_dir)}/plots: run python plots.py, then rebuild.*")
    return links


# --- Build, check, write -------------------------------------------------------------------------------
