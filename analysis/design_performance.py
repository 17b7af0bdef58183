"""What §4 of the design document measures: each configuration's median and spread over its repeats,
the verdicts between strategies, the compute baseline and the ceiling it puts on efficiency.

Every table reads the runs that results.load_folder finds, grouped by results.repeats (the plots read
the same); a strategy is called faster than another only where results.clearly_less holds.
"""
import os

from analysis import cost_model
from analysis.design_numbers import load, shown, table
from manual_allreduce import DEFAULT_BUCKET_MB
from runtime.timing import overlap

SERIES = ("single", "ddp-no-sync", "ddp", "manual per-param", "manual flat", "manual bucketed", "manual ring")
COMMUNICATING = SERIES[2:]
# (field of a run's timing.across_ranks, unit): the per-step means quoted, each as median (min–max) over repeats
STEP_FIELDS = {"step": "ms", "data": "ms", "compute": "ms", "backward": "ms", "comm_busy": "ms", "comm_hidden": "ms",
               "comm_exposed": "ms"}
PAIRS = (("manual flat", "manual per-param"), ("manual bucketed", "manual flat"), ("manual ring", "manual flat"),
         ("ddp", "manual bucketed"))
VERDICT_COLUMN = {"fastest": "smallest median", "indistinguishable": "indistinguishable", "slower": "slower"}


def slug(series):
    """The series' part of a number's name: 'manual flat' -> 'flat'."""
    return series.replace("manual ", "")


def key(model, series, world):
    return f"sweep.{model}.{slug(series)}.w{world}"


def sentence(a, b, verdict):
    """What the document claims about `a` against `b`, given their verdict."""
    if verdict == "faster":
        return f"{a} is faster than {b}"
    if verdict == "slower":
        return f"{b} is faster than {a}"
    return f"{a} and {b} are indistinguishable on this machine"


def register_run_spreads(n, prefix, runs):
    """The spreads over `runs` of every quoted field, under `prefix`."""
    for field, unit in STEP_FIELDS.items():
        n.over_repeats(f"{prefix}.{field}", runs, f"timing.across_ranks.{field}.mean", unit,
                       formula=f"the run's mean {field} per step")
    n.over_repeats(f"{prefix}.overlap", runs, ("timing.across_ranks.comm_hidden.mean", "timing.across_ranks.comm_busy.mean"),
                   "percent", combine=overlap, formula="comm_hidden / comm_busy (timing.overlap)")
    n.over_repeats(f"{prefix}.throughput", runs, "throughput_samples_per_s", "samples/s", formula="throughput")
    n.over_repeats(f"{prefix}.straggler", runs, "timing.straggler", "ratio", formula="the straggler figure")


def sweep_section(n, grouped, worlds):
    """Per model: every configuration's spreads, its efficiency, and its verdict against the fastest."""
    tables, pairs, top = {}, [], worlds[-1]
    first = lambda model, series, world: (grouped.get((model, series, world, DEFAULT_BUCKET_MB)) or [None])[0]
    anyone = first("mlp", "single", 1) or next(runs[0] for runs in grouped.values())
    n.measured("machine.cores", anyone["path"], "environment.cores", "count")
    n.measured("machine.torch", anyone["path"], "environment.torch", "name")
    largest = first("mlp", "ddp", top)
    n.measured("machine.threads_largest", largest and largest["path"], "environment.threads_per_rank", "count")
    for field in ("batch_size", "accum_steps", "val_samples", "warmup_steps", "epochs"):
        n.measured(f"config.{field}", anyone["path"], f"config.{field}", "count")
    n.stated("config.largest_world", top, "count", "code", "the largest world size among the runs")
    n.derived("config.global_batch_largest", lambda b, k, w: b * k * w,
              ["config.batch_size", "config.accum_steps", "config.largest_world"], "count",
              "per-rank batch x accumulation steps x ranks")
    for model in ("mlp", "cnn"):
        single = first(model, "single", 1)
        n.measured(f"config.{model}.max_steps", single and single["path"], "config.max_steps", "count")
        rows = []
        for series, world in [("single", 1)] + [(s, w) for w in worlds for s in SERIES[1:]]:
            runs, name = grouped.get((model, series, world, DEFAULT_BUCKET_MB), []), key(model, series, world)
            register_run_spreads(n, name, runs)
            n.derived(f"{name}.efficiency", lambda t, t1, w=world: t / (w * t1),
                      [f"{name}.throughput.median", f"{key(model, 'single', 1)}.throughput.median"], "percent",
                      "median throughput / (ranks x one process's median throughput)")
        for world in worlds:
            rows += world_rows(n, model, world, grouped)
            pairs += [pair_row(n, model, world, a, b) for a, b in PAIRS]
        tables[f"table.sweep.{model}"] = table(
            ["sync", "ranks", "runs", "step", "compute", "exposed comm", "busy comm", "overlap", "throughput",
             "efficiency", "straggler", "against the smallest median"],
            [row(n, model, "single", 1, "—")] + rows)
        tables[f"table.baseline.{model}"] = baseline_table(n, model, worlds)
        summary(n, model, top)
        reducer_check(n, model, top, grouped.get((model, "ddp", top, DEFAULT_BUCKET_MB), []))
        for alias, source in ((f"ceiling.{model}.largest", f"ceiling.{model}.w{top}"),
                              (f"ceiling.{model}.largest.reached", f"ceiling.{model}.w{top}.reached"),
                              (f"ddp_check.{model}.estimate", f"{key(model, 'ddp', top)}.comm_exposed.median"),
                              (f"ddp_check.{model}.reducer", f"{key(model, 'ddp', top)}.reducer_exposed.median")):
            n.derived(alias, lambda v: v, [source], n.entries.get(source, {}).get("unit", "ms"),
                      "at the largest world size")
    n.measured("config.calibrate_every", largest and largest["path"], "config.calibrate_every", "count")
    tables["table.pairs"] = table(["model", "ranks", "step of the first", "step of the second", "verdict"], pairs)
    tables["text.overlap_lesson"] = "; ".join(overlap_lesson(n, model, top) for model in ("mlp", "cnn"))
    counted = [name for name in n.entries if name.startswith("sweep.") and name.endswith(".step.n")]
    n.derived("sweep.fewest_repeats", lambda *counts: min(counts), counted, "count",
              "the fewest repeats of any measured configuration")
    return tables


def world_rows(n, model, world, grouped):
    """The rows of one world size, each communicating series with its verdict against the smallest median."""
    steps = {s: n.value(f"{key(model, s, world)}.step.median") for s in COMMUNICATING}
    fastest = min((s for s in steps if steps[s] is not None), key=steps.get, default=None)
    n.add(f"sweep.{model}.w{world}.fastest", fastest, "name", kind="derived",
          inputs=[f"{key(model, s, world)}.step.median" for s in COMMUNICATING],
          formula="the communicating series with the smallest median step")
    rows = [row(n, model, "ddp-no-sync", world, "compute baseline")]
    for series in COMMUNICATING:
        verdict = None
        if fastest and series != fastest:
            verdict = n.verdict(f"verdict.{model}.w{world}.{slug(series)}", key(model, series, world) + ".step",
                                key(model, fastest, world) + ".step")
        label = "—" if not fastest or steps[series] is None else VERDICT_COLUMN[verdict or "fastest"]
        rows.append(row(n, model, series, world, label))
    return rows


def row(n, model, series, world, against):
    name = key(model, series, world)
    quiet = series in ("single", "ddp-no-sync")  # no communication: comm fields are zero
    cells = [n.spread_text(f"{name}.{field}") for field in ("step", "compute")]
    cells += ["—"] * 3 if quiet else [n.spread_text(f"{name}.{field}") for field in ("comm_exposed", "comm_busy", "overlap")]
    return [series, world, n.text(f"{name}.step.n") if n.value(f"{name}.step.n") else "0"] + cells + [
        n.spread_text(f"{name}.throughput"), n.text(f"{name}.efficiency"), n.text(f"{name}.straggler.median"), against]


def pair_row(n, model, world, a, b):
    """One of the PAIRS compared at one world size: the claim results.clearly_less allows."""
    first, second = key(model, a, world) + ".step", key(model, b, world) + ".step"
    verdict = n.verdict(f"verdict.{model}.w{world}.{slug(a)}-vs-{slug(b)}", first, second)
    claim = sentence(a, b, verdict) if verdict else f"{a} or {b} not measured"
    return [model.upper(), world, n.spread_text(first), n.spread_text(second), claim]


def overlap_lesson(n, model, world):
    """What bucketed's overlap bought against flat at `world` ranks: hidden share, compute, busy time, verdict."""
    bucketed, flat = key(model, "manual bucketed", world), key(model, "manual flat", world)
    verdict = n.value(f"verdict.{model}.w{world}.bucketed-vs-flat")
    step = {"faster": "shorter than", "slower": "longer than"}.get(verdict, "indistinguishable from")
    return (f"for the {model.upper()} it hides {n.text(bucketed + '.overlap.median')} of its communication behind "
            f"backward, its compute is {n.text(bucketed + '.compute.median')} against flat's "
            f"{n.text(flat + '.compute.median')}, its busy time {n.text(bucketed + '.comm_busy.median')} against "
            f"{n.text(flat + '.comm_busy.median')}, and its step is {step} flat's")


def summary(n, model, top):
    """One sentence about the largest world size: the smallest median, and who is or is not distinguishable."""
    fastest = n.value(f"sweep.{model}.w{top}.fastest")
    verdicts = {s: n.value(f"verdict.{model}.w{top}.{slug(s)}") for s in COMMUNICATING if s != fastest}
    alike = [s for s, v in verdicts.items() if v == "indistinguishable"]
    slower = [s for s, v in verdicts.items() if v == "slower"]
    parts = [f"**{fastest}** has the smallest median step"] if fastest else []
    if alike:
        parts.append(f"{', '.join(alike)} {'is' if len(alike) == 1 else 'are'} indistinguishable from it on this machine")
    if slower:
        parts.append(f"{', '.join(slower)} {'is' if len(slower) == 1 else 'are'} slower than it beyond both spreads")
    n.add(f"sweep.{model}.summary", "; ".join(parts) or None, "name", kind="derived",
          inputs=[f"sweep.{model}.w{top}.fastest"] + [f"verdict.{model}.w{top}.{slug(s)}" for s in verdicts],
          formula="the verdicts against the smallest median at the largest world size")


def baseline_table(n, model, worlds):
    """Per world size: what sharing the cores costs (ddp-no-sync against one process) and the ceiling it sets."""
    single, rows = key(model, "single", 1), []
    for world in worlds:
        base, fastest = key(model, "ddp-no-sync", world), n.value(f"sweep.{model}.w{world}.fastest")
        n.derived(f"{base}.contention", lambda b, s: b / s, [f"{base}.compute.median", f"{single}.compute.median"],
                  "ratio", "ddp-no-sync's median compute / one process's")
        n.derived(f"ceiling.{model}.w{world}", lambda t, t1, w=world: t / (w * t1),
                  [f"{base}.throughput.median", f"{single}.throughput.median"], "percent",
                  "ddp-no-sync throughput / (ranks x one process's throughput): efficiency without communication")
        best = key(model, fastest, world) if fastest else None
        n.derived(f"ceiling.{model}.w{world}.reached", lambda t, b: t / b,
                  [f"{best}.throughput.median", f"{base}.throughput.median"] if best else [], "percent",
                  "the smallest median's throughput / ddp-no-sync's: what communication leaves of the ceiling")
        rows.append([world, n.spread_text(f"{base}.compute"), n.text(f"{base}.contention"),
                     n.spread_text(f"{base}.throughput"), n.text(f"ceiling.{model}.w{world}"),
                     fastest or "—", n.text(f"{best}.efficiency") if best else "—",
                     n.text(f"ceiling.{model}.w{world}.reached")])
    return table(["ranks", "ddp-no-sync compute", "× one process's compute", "ddp-no-sync throughput",
                  "ceiling", "smallest median", "its efficiency", "its share of the ceiling"], rows)


def reducer_check(n, model, world, runs):
    """DDP's estimated exposed communication against the reducer's own statistics (mean over ranks)."""
    mean = lambda *values: sum(values) / len(values)  # noqa: E731
    n.over_repeats(f"{key(model, 'ddp', world)}.reducer_exposed", runs,
                   [f"timing.ddp_runtime_statistics[{r}].exposed_s" for r in range(world)], "ms", combine=mean,
                   formula="the mean over ranks of the reducer's backward_comm - backward_overlap")


def prediction_section(n, layouts, worlds, fits, first):
    """Per model: the fitted model's busy communication per step against the sweep's measured busy time."""
    rows, ratios = [], []
    for model, sizes in layouts.items():
        for world in worlds:
            for series in COMMUNICATING:
                strategy = slug(series)
                name, measured = f"predict.{model}.{strategy}.w{world}", key(model, series, world)
                messages = cost_model.messages_per_step(strategy, sizes, DEFAULT_BUCKET_MB, first)
                fit = fits.for_world("ring" if strategy == "ring" else "gloo", world)
                n.derived(f"{name}.comm_s", lambda a, b, m=messages, w=world: cost_model.step_comm_time(m, w, a, b),
                          [f"{fit}.alpha_s", f"{fit}.beta_s_per_byte"], "ms",
                          f"cost_model.step_comm_time of {strategy}'s all-reduces with the fit {fit}")
                if n.derived(f"{name}.ratio", lambda m, p: m / p, [f"{measured}.comm_busy.median", f"{name}.comm_s"],
                             "ratio", "measured median busy / predicted") is not None:
                    ratios.append(f"{name}.ratio")
                rows.append([model.upper(), series, world, fit.split(".", 1)[1], n.text(f"{name}.comm_s"),
                             n.spread_text(f"{measured}.comm_busy"), n.text(f"{name}.ratio")])
    n.derived("predict.ratio_low", lambda *v: min(v), ratios, "ratio", "the smallest measured / predicted")
    n.derived("predict.ratio_high", lambda *v: max(v), ratios, "ratio", "the largest measured / predicted")
    return {"table.predict": table(["model", "sync", "ranks", "fit", "predicted busy", "measured busy",
                                    "measured / predicted"], rows)}


def bucket_sweep_section(n, grouped):
    """The MLP's step against the bucket size at the bucket runs' world size, with the best size's verdict."""
    runs = {k: v for k, v in grouped.items() if k[0] == "mlp" and k[1] in ("manual bucketed", "ddp")}
    worlds = [k[2] for k in runs if k[3] != DEFAULT_BUCKET_MB]  # the bucket sweep's runs
    sizes = sorted({k[3] for k in runs if k[2] == max(worlds)}) if worlds else []
    if len(sizes) < 2:
        n.add("bucket.world", None, "count")
        return {"table.bucket_sweep": "*No bucket sweep (bucket-*.json) in the results: run python -m analysis.sweep.*",
                "text.bucket_takeaway": "*No bucket sweep.*"}
    world = max(worlds)
    n.stated("bucket.world", world, "count", "code", "the world size of the bucket runs")
    rows, takeaways = [], []
    for mb in sizes:
        for series in ("manual bucketed", "ddp"):
            register_run_spreads(n, f"bucket.{slug(series)}.{mb:g}", runs.get(("mlp", series, world, mb), []))
        rows.append([f"{mb:g} MiB"] + [n.spread_text(f"bucket.{slug(s)}.{mb:g}.step") for s in ("manual bucketed", "ddp")])
    for series in ("manual bucketed", "ddp"):
        medians = {mb: n.value(f"bucket.{slug(series)}.{mb:g}.step.median") for mb in sizes}
        best = min((mb for mb in sizes if medians[mb] is not None), key=medians.get, default=None)
        n.add(f"bucket.{slug(series)}.best_mb", best, "MiB", kind="derived", formula="the size of the smallest median",
              inputs=[f"bucket.{slug(series)}.{mb:g}.step.median" for mb in sizes])
        if best is None or best == DEFAULT_BUCKET_MB:
            takeaways.append(f"{series}: the default {DEFAULT_BUCKET_MB:g} MiB has the smallest median" if best else "")
            continue
        verdict = n.verdict(f"bucket.{slug(series)}.best_vs_default", f"bucket.{slug(series)}.{best:g}.step",
                            f"bucket.{slug(series)}.{DEFAULT_BUCKET_MB:g}.step")
        takeaways.append(sentence(f"{series} at {best:g} MiB", f"{series} at {DEFAULT_BUCKET_MB:g} MiB", verdict))
    return {"table.bucket_sweep": table(["--bucket-mb", "manual bucketed: step", "torch DDP: step"], rows),
            "text.bucket_takeaway": "; ".join(t for t in takeaways if t) + "."}


STEP_BENCH_FIELDS = {"mean_step_s": "ms", "mean_compute_s": "ms", "mean_comm_exposed_s": "ms",
                     "mean_comm_busy_s": "ms", "overlap": "percent", "step_ratio_to_ddp": "ratio"}


def step_bench_section(n, results_dir):
    """benchmarks/step_bench.py's table (schema step-bench/2): every configuration in the same processes."""
    path = os.path.join(results_dir, "step-bench.json")
    document = load(path) if os.path.exists(path) else {}
    if document.get("schema") != "step-bench/2":
        found = f"{shown(path)} has schema {document.get('schema')!r}" if document else f"no {shown(path)}"
        return {"table.step_bench": f"*{found}, not step-bench/2: run python -m benchmarks.step_bench.*"}
    rows = []
    for i, m in enumerate(document.get("measurements", [])):
        name = f"stepbench.{m['model']}.w{m['world_size']}.{m['configuration']}"
        for field, unit in STEP_BENCH_FIELDS.items():
            n.measured(f"{name}.{field}", path, f"measurements[{i}].{field}", unit)
        rows.append([m["model"], m["world_size"], m["configuration"], m.get("steps", "—")]
                    + ["—" if m.get(field) is None else n.text(f"{name}.{field}") for field in STEP_BENCH_FIELDS])
    return {"table.step_bench": table(["model", "ranks", "configuration", "steps", "mean step", "compute",
                                       "exposed comm", "busy comm", "overlap", "× DDP"], rows)}
