"""§4: the strategy sweep (spreads over rounds, results_folder's verdicts between strategies, the
compute baseline and its ceiling) and the MLP's step per bucket size; ratios within one round."""
from analysis.design_numbers import table, unchanged
from analysis.scaling_inputs import runs_of
from runtime.options import DEFAULT_BUCKET_MB
from runtime.results import overlap

QUIET = ("single", "ddp-no-sync")  # no communication: their comm fields are zero
COMMUNICATING = ("ddp", "manual per-param", "manual flat", "manual bucketed", "manual flat-ring")
# of a run's timing.across_ranks, in ms; a run's data time and straggler figure are not quoted
STEP_FIELDS = ("step", "compute", "backward", "comm_busy", "comm_hidden", "comm_exposed")
PAIRS = (("manual flat", "manual per-param"), ("manual bucketed", "manual flat"),
         ("manual flat-ring", "manual flat"), ("ddp", "manual bucketed"))
REFERENCE = "manual flat"  # what every other strategy is compared with: one all-reduce, no overlap
BUCKETING = ("manual bucketed", "ddp")  # the series whose step depends on --bucket-mb
THROUGHPUT = "throughput_samples_per_s"
# a run's figures besides STEP_FIELDS: (its fields, unit, how they combine, formula)
RUN_FIELDS = {"overlap": (("timing.across_ranks.comm_hidden.mean",
                           "timing.across_ranks.comm_busy.mean"), "percent", overlap,
                          "comm_hidden / comm_busy (results.overlap)"),
              "throughput": (THROUGHPUT, "samples/s", unchanged, "throughput")}
STEP = "timing.across_ranks.step.mean"
VERDICT_WORDS = {"faster": "faster than", "indistinguishable": "indistinguishable from",
                 "slower": "slower than"}


def slug(series):
    return series.replace("manual ", "")  # 'manual flat' -> 'flat'


def key(model, series, world):
    return f"sweep.{model}.{slug(series)}.w{world}"  # 'sweep.mlp.flat.w4'


def at_default(grouped, model, series, world):
    return runs_of(grouped, model, series, world, DEFAULT_BUCKET_MB)


def register_run_spreads(numbers, prefix, runs, fields=(*STEP_FIELDS, "overlap", "throughput")):
    """The spreads over `runs` of each of `fields` (STEP_FIELDS or RUN_FIELDS'), under `prefix`."""
    for field in fields:
        source, unit, combine, formula = RUN_FIELDS.get(field, (
            f"timing.across_ranks.{field}.mean", "ms", unchanged,
            f"the run's mean {field} per step"))
        numbers.over_repeats(f"{prefix}.{field}", runs, source, unit, combine, formula)


def compare(numbers, name, runs, others):
    """`name` (runs over others, paired within each round) and `name.verdict`; the claim shown."""
    numbers.paired_ratio(name, runs, others, STEP, formula="the first's mean step / the second's",
                         verdict=f"{name}.verdict")
    return numbers.claim(name, f"{name}.verdict")


def sweep_section(numbers, grouped, worlds):
    """What all runs share; per model each configuration's spreads, efficiency, verdict vs flat."""
    tables, pairs, lessons, top = {}, [], [], worlds[-1]
    anyone = (at_default(grouped, "mlp", "single", 1) or next(iter(grouped.values())))[0]["path"]
    numbers.measured("machine.cores", anyone, "environment.cores", "count")
    numbers.measured("machine.torch", anyone, "environment.torch", "name")
    for field in ("batch_size", "accum_steps", "val_samples"):
        numbers.measured(f"config.{field}", anyone, f"config.{field}", "count")
    numbers.stated("config.largest_world", top, "count", "code",
                   "the largest world size among the runs")
    numbers.derived("config.global_batch_largest", lambda batch, steps, n: batch * steps * n,
                    ["config.batch_size", "config.accum_steps", "config.largest_world"], "count",
                    "per-rank batch x accumulation steps x ranks")
    configurations = [("single", 1)] + [(series, world) for world in worlds
                                        for series in ("ddp-no-sync", *COMMUNICATING)]
    for model in ("mlp", "cnn"):
        single_runs = at_default(grouped, model, "single", 1)
        numbers.measured(f"config.{model}.max_steps",
                         single_runs[0]["path"] if single_runs else None, "config.max_steps",
                         "count")
        for series, world in configurations:
            runs, name = at_default(grouped, model, series, world), key(model, series, world)
            register_run_spreads(numbers, name, runs)
            numbers.paired_ratio(f"{name}.efficiency", runs, single_runs, THROUGHPUT, "percent",
                                 scale=1 / world,
                                 formula="throughput / (ranks x one process's throughput)")
            numbers.paired_ratio(f"{name}.speedup", runs, single_runs, THROUGHPUT,
                                 formula="throughput / one process's throughput")
        rows = [row(numbers, grouped, model, series, world) for series, world in configurations]
        for first, second in PAIRS:
            claim = compare(numbers, f"verdict.{model}.w{top}.{slug(first)}-vs-{slug(second)}",
                            at_default(grouped, model, first, top),
                            at_default(grouped, model, second, top))
            pairs.append([model.upper(), top, slug(first), slug(second), claim])
        tables[f"table.sweep.{model}"] = table(["configuration", "step", "exposed comm", "overlap",
                                                "efficiency", "step against flat"], rows)
        tables[f"table.baseline.{model}"] = baseline_table(numbers, model, worlds, grouped)
        speedup = key(model, "ddp", top) + ".speedup"  # throughput over one process's
        low, high = (numbers.value(f"{speedup}.{end}") or 1 for end in ("low", "high"))
        said = "slower than" if high < 1 else "faster than" if low > 1 else "not told apart from"
        tables[f"text.speedup.{model}"] = f"{numbers.spread_text(speedup)} its throughput: {said}"
        lessons.append(at_largest(numbers, model, top))
    counted = [name for name in numbers.entries
               if name.startswith("sweep.") and name.endswith(".step.n")]
    numbers.derived("sweep.fewest_repeats", lambda *counts: min(counts), counted, "count",
                    "the fewest repeats of any measured configuration")
    return {**tables, "table.pairs": table(["model", "ranks", "first", "second",
                                            "first's step / second's, per round"], pairs),
            "text.overlap_lesson": ". Bucketed sync ".join(lessons)}


def row(numbers, grouped, model, series, world):
    """The sweep table's row: step, exposed comm, overlap, efficiency, the step over flat's."""
    name = key(model, series, world)
    cells = [numbers.spread_text(f"{name}.step")]
    cells += ["—", "—"] if series in QUIET else [
        numbers.spread_text(f"{name}.{field}") for field in ("comm_exposed", "overlap")]
    against = "—"
    if series in COMMUNICATING and series != REFERENCE:
        against = compare(numbers, f"verdict.{model}.w{world}.{slug(series)}",
                          at_default(grouped, model, series, world),
                          at_default(grouped, model, REFERENCE, world))
    efficiency = "—" if world == 1 else numbers.spread_text(f"{name}.efficiency")
    return [f"{slug(series)}, {world} rank{'s' if world > 1 else ''}", *cells, efficiency, against]


def at_largest(numbers, model, top):
    """The largest world size: verdicts against flat, ceiling, what bucketed's overlap bought."""
    verdicts = {slug(series): numbers.value(f"verdict.{model}.w{top}.{slug(series)}.verdict")
                for series in COMMUNICATING if series != REFERENCE}
    parts = []
    for verdict, said in VERDICT_WORDS.items():
        names = [name for name, found in verdicts.items() if found == verdict]
        if names:  # 'ddp is indistinguishable from flat', then 'per-param and ring are slower'
            listed = " and ".join([", ".join(names[:-1]), names[-1]] if names[1:] else names)
            said = f"{said} flat" if not parts else said.split()[0]
            parts.append(f"{listed} {'are' if names[1:] else 'is'} {said}")
    numbers.add(f"sweep.{model}.summary", f"For the {model.upper()}, " + ", and ".join(parts)
                + "." if parts else None, "name", kind="derived",
                inputs=[f"verdict.{model}.w{top}.{name}.verdict" for name in verdicts],
                formula="the verdicts against flat at the largest world size")
    for suffix in ("", ".reached"):
        numbers.derived(f"ceiling.{model}.largest{suffix}", unchanged,
                        [f"ceiling.{model}.w{top}{suffix}.median"], "percent",
                        "at the largest world size")
    bucketed, flat = key(model, "manual bucketed", top), key(model, "manual flat", top)
    step = {"faster": "shorter than", "slower": "longer than"}.get(verdicts["bucketed"],
                                                                   "indistinguishable from")
    return (f"hides {numbers.text(bucketed + '.overlap.median')} of the {model.upper()}'s "
            f"communication, but is busy {numbers.text(bucketed + '.comm_busy.median')} against "
            f"flat's {numbers.text(flat + '.comm_busy.median')}: its step is {step} flat's")


def baseline_table(numbers, model, worlds, grouped):
    """Per world size: what sharing the cores costs (ddp-no-sync / one process), the ceiling set."""
    single, single_runs = key(model, "single", 1), at_default(grouped, model, "single", 1)
    rows = []
    for world in worlds:
        base, ceiling = key(model, "ddp-no-sync", world), f"ceiling.{model}.w{world}"
        no_sync = at_default(grouped, model, "ddp-no-sync", world)
        numbers.derived(f"{base}.contention", lambda mine, theirs: mine / theirs,
                        [f"{base}.compute.median", f"{single}.compute.median"], "ratio",
                        "ddp-no-sync's median compute / one process's")
        numbers.paired_ratio(ceiling, no_sync, single_runs, THROUGHPUT, "percent", scale=1 / world,
                             formula="ddp-no-sync throughput / (ranks x one process's): "
                                     "efficiency without communication")
        numbers.paired_ratio(f"{ceiling}.reached", at_default(grouped, model, REFERENCE, world),
                             no_sync, THROUGHPUT, "percent",
                             formula="flat's throughput / ddp-no-sync's: what communication "
                                     "leaves of the ceiling")
        rows.append([world, numbers.spread_text(f"{base}.compute"),
                     numbers.text(f"{base}.contention"), numbers.spread_text(ceiling),
                     numbers.spread_text(f"{ceiling}.reached")])
    return table(["ranks", "compute, no communication", "× one process's compute", "ceiling",
                  "flat's share of it"], rows)


def bucket_sweep_section(numbers, grouped):
    """The MLP's step per bucket size, at the bucket runs' world size; which size is best."""
    runs = {configuration: found for configuration, found in grouped.items()
            if configuration[0] == "mlp" and configuration[1] in BUCKETING}
    world = max((world for _, _, world, _ in runs), default=None)
    sizes = sorted({bucket_mb for _, _, run_world, bucket_mb in runs if run_world == world})
    if len(sizes) < 2:
        numbers.add("bucket.world", None, "count")
        return {"table.bucket_sweep": "*No bucket sweep (bucket-*.json) in the results: "
                                      "run python -m analysis.sweep.*",
                "text.bucket_takeaway": "*No bucket sweep.*"}
    numbers.stated("bucket.world", world, "count", "code", "the world size of the bucket runs")
    rows = []
    for size in sizes:
        for series in BUCKETING:
            register_run_spreads(numbers, f"bucket.{slug(series)}.{size:g}",
                                 runs.get(("mlp", series, world, size), []), ("step",))
        rows.append([f"{size:g} MiB"] + [numbers.spread_text(f"bucket.{slug(series)}.{size:g}.step")
                                         for series in BUCKETING])
    takeaways = [best_size(numbers, runs, world, series, sizes) for series in BUCKETING]
    return {"table.bucket_sweep": table(["--bucket-mb", "manual bucketed: step",
                                         "torch DDP: step"], rows),
            "text.bucket_takeaway": ". ".join(filter(None, takeaways)) + "."}


def best_size(numbers, runs, world, series, sizes):
    """The sizes that send the fastest size's buckets (caps that send the same buckets measure one
    layout more than once: never a win of one over another) and the sizes each of them beats."""
    name, layouts = f"bucket.{slug(series)}", {size: f"buckets.mlp.{slug(series)}.{size:g}"
                                               for size in sizes}  # as §3.2 registered them
    medians = {size: numbers.value(f"{name}.{size:g}.step.median") for size in sizes}
    best = min((size for size in sizes if medians[size] is not None), key=medians.get, default=None)
    same = [size for size in sizes if best is not None
            and numbers.value(layouts[size]) == numbers.value(layouts[best])]
    numbers.derived(f"{name}.same_layout", lambda *_: same, [layouts[size] for size in same] + [
        f"{name}.{size:g}.step.median" for size in sizes if medians[size]], "MiB-list",
        "the sizes sending the layout of the smallest median step")
    beaten = []
    for size in [size for size in sizes if size not in same and medians[size] is not None]:
        # every size of the fastest layout against `size`, round by round
        if {numbers.paired_ratio(f"{name}.{mine:g}-vs-{size:g}", runs.get((
                "mlp", series, world, mine), []), runs.get(("mlp", series, world, size), []), STEP,
                formula="the step at one size / another",
                verdict=f"{name}.{mine:g}-vs-{size:g}.verdict") for mine in same} == {"faster"}:
            beaten.append(f"{size:g}")
    told = f"faster than {', '.join(beaten)} MiB" if beaten else "not told apart from the others"
    return same and f"With {slug(series)}, {numbers.text(f'{name}.same_layout')} " + (
        f"is {told}" if len(same) == 1 else f"send the same buckets "
        f"({numbers.text(layouts[best])}), each {told}")
