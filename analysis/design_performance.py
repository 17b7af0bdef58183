"""What §4.1-§4.3 of the design document measure: each configuration's median and spread over its
repeats, the verdicts between strategies, the compute baseline and the ceiling it puts on
efficiency. Every ratio is taken within one round of the sweep (Numbers.paired_ratio) and shown
with its spread over the rounds.

Every table reads the strategy sweep's runs that results_folder.load_folder finds, grouped by
results_folder.repeats (the plots read the same); a strategy is called faster than another only
by results_folder.verdict over ratios paired within each round.
"""

from analysis.design_numbers import ratio, smallest, table, unchanged
from runtime.options import DEFAULT_BUCKET_MB
from runtime.results import overlap

QUIET = ("single", "ddp-no-sync")  # no communication: their comm fields are zero
COMMUNICATING = ("ddp", "manual per-param", "manual flat", "manual bucketed", "manual ring")
SERIES = QUIET + COMMUNICATING
# (field of a run's timing.across_ranks, unit): the per-step means quoted, each as median
# (min–max) over repeats
STEP_FIELDS = {"step": "ms", "data": "ms", "compute": "ms", "backward": "ms", "comm_busy": "ms",
               "comm_hidden": "ms", "comm_exposed": "ms"}
PAIRS = (("manual flat", "manual per-param"), ("manual bucketed", "manual flat"),
         ("manual ring", "manual flat"), ("ddp", "manual bucketed"))
REFERENCE = "manual flat"  # what every other strategy is compared with: one all-reduce, no overlap
SWEEP_COLUMNS = ["configuration", "step", "exposed comm", "overlap", "efficiency",
                 "step against flat"]
BASELINE_COLUMNS = ["ranks", "compute, no communication", "× one process's compute",
                    "ceiling", "flat's share of it"]


def slug(series):
    """The series' part of a number's name: 'manual flat' -> 'flat'."""
    return series.replace("manual ", "")


def key(model, series, world):
    """The prefix of a configuration's numbers: 'sweep.mlp.flat.w4'."""
    return f"sweep.{model}.{slug(series)}.w{world}"


def joined(names):
    """'a', 'a and b', 'a, b and c'."""
    names = list(names)
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def compare(numbers, name, runs, others, field="timing.across_ranks.step.mean", what="step"):
    """`name` (the paired ratio of `field`, runs over others, within each round) and
    `name.verdict`; returns the claim a table shows."""
    numbers.paired_ratio(name, runs, others, field, formula=f"the first's mean {what} / the "
                         "second's")
    numbers.verdict(f"{name}.verdict", name)
    return numbers.claim(name, f"{name}.verdict")


def label(series, world):
    """A configuration as a table's first column shows it: 'flat, 4 ranks'."""
    return f"{slug(series)}, {world} rank{'s' if world > 1 else ''}"


def global_batch(batch_size, accum_steps, world):
    """Samples per optimizer step over all ranks."""
    return batch_size * accum_steps * world


def first_run(grouped, model, series, world):
    """The oldest run of a configuration at the default bucket size, or None."""
    runs = grouped.get((model, series, world, DEFAULT_BUCKET_MB))
    return runs[0] if runs else None


def path_of(run):
    """A run's results file, or None without a run."""
    return run["path"] if run else None


def register_run_spreads(numbers, prefix, runs):
    """The spreads over `runs` of every quoted field, under `prefix`."""
    for field, unit in STEP_FIELDS.items():
        numbers.over_repeats(f"{prefix}.{field}", runs, f"timing.across_ranks.{field}.mean", unit,
                             formula=f"the run's mean {field} per step")
    numbers.over_repeats(f"{prefix}.overlap", runs,
                         ("timing.across_ranks.comm_hidden.mean",
                          "timing.across_ranks.comm_busy.mean"),
                         "percent", combine=overlap,
                         formula="comm_hidden / comm_busy (results.overlap)")
    numbers.over_repeats(f"{prefix}.throughput", runs, "throughput_samples_per_s", "samples/s",
                         formula="throughput")
    numbers.over_repeats(f"{prefix}.straggler", runs, "timing.straggler", "ratio",
                         formula="the straggler figure")


def register_machine(numbers, grouped, top):
    """The machine and the configuration every run shares, from one run (the MLP's single process
    if there is one)."""
    anyone = first_run(grouped, "mlp", "single", 1) or next(runs[0] for runs in grouped.values())
    numbers.measured("machine.cores", anyone["path"], "environment.cores", "count")
    numbers.measured("machine.torch", anyone["path"], "environment.torch", "name")
    largest_ddp = first_run(grouped, "mlp", "ddp", top)
    numbers.measured("machine.threads_largest", path_of(largest_ddp),
                     "environment.threads_per_rank", "count")
    for field in ("batch_size", "accum_steps", "val_samples", "warmup_steps", "epochs"):
        numbers.measured(f"config.{field}", anyone["path"], f"config.{field}", "count")
    numbers.stated("config.largest_world", top, "count", "code",
                   "the largest world size among the runs")
    numbers.derived("config.global_batch_largest", global_batch,
                    ["config.batch_size", "config.accum_steps", "config.largest_world"], "count",
                    "per-rank batch x accumulation steps x ranks")


def register_aliases(numbers, model, top):
    """Names for the largest world size's ceiling, as the text quotes it."""
    aliases = ((f"ceiling.{model}.largest", f"ceiling.{model}.w{top}.median"),
               (f"ceiling.{model}.largest.reached", f"ceiling.{model}.w{top}.reached.median"))
    for alias, source in aliases:
        numbers.derived(alias, unchanged, [source], "percent", "at the largest world size")


def sweep_section(numbers, grouped, worlds):
    """Per model: every configuration's spreads, its efficiency, and its verdict against the
    fastest."""
    tables = {}
    pairs = []
    top = worlds[-1]
    register_machine(numbers, grouped, top)
    for model in ("mlp", "cnn"):
        single = first_run(grouped, model, "single", 1)
        numbers.measured(f"config.{model}.max_steps", path_of(single), "config.max_steps",
                         "count")
        configurations = [("single", 1)]
        configurations += [(series, world) for world in worlds for series in SERIES
                           if series != "single"]
        single_runs = grouped.get((model, "single", 1, DEFAULT_BUCKET_MB), [])
        for series, world in configurations:
            runs = grouped.get((model, series, world, DEFAULT_BUCKET_MB), [])
            name = key(model, series, world)
            register_run_spreads(numbers, name, runs)
            numbers.paired_ratio(f"{name}.efficiency", runs, single_runs,
                                 "throughput_samples_per_s", "percent", scale=1 / world,
                                 formula="throughput / (ranks x one process's throughput)")
        rows = [row(numbers, grouped, model, "single", 1)]
        for world in worlds:
            rows += [row(numbers, grouped, model, series, world)
                     for series in SERIES if series != "single"]
        pairs += [pair_row(numbers, grouped, model, top, first, second)
                  for first, second in PAIRS]
        tables[f"table.sweep.{model}"] = table(SWEEP_COLUMNS, rows)
        tables[f"table.baseline.{model}"] = baseline_table(numbers, model, worlds, grouped)
        summary(numbers, model, top)
        register_aliases(numbers, model, top)
    tables["table.pairs"] = table(["model", "ranks", "first", "second",
                                   "first's step / second's, per round"], pairs)
    lessons = [overlap_lesson(numbers, model, top) for model in ("mlp", "cnn")]
    tables["text.overlap_lesson"] = "; it ".join(lessons)
    counted = [name for name in numbers.entries
               if name.startswith("sweep.") and name.endswith(".step.n")]
    numbers.derived("sweep.fewest_repeats", smallest, counted, "count",
                    "the fewest repeats of any measured configuration")
    return tables


def runs_of(grouped, model, series, world):
    """The strategy sweep's runs of one configuration at the default bucket size."""
    return grouped.get((model, series, world, DEFAULT_BUCKET_MB), [])


def row(numbers, grouped, model, series, world):
    """A configuration's row of the sweep table: its step, exposed communication and overlap,
    its efficiency and its step over flat's at the same world size, paired within each round
    (compute, busy time, throughput and the straggler are in numbers.json and the figures)."""
    name = key(model, series, world)
    cells = [numbers.spread_text(f"{name}.step")]
    if series in QUIET:
        cells += ["—", "—"]
    else:
        cells += [numbers.spread_text(f"{name}.{field}") for field in ("comm_exposed", "overlap")]
    against = "—"
    if series in COMMUNICATING and series != REFERENCE:
        against = compare(numbers, f"verdict.{model}.w{world}.{slug(series)}",
                          runs_of(grouped, model, series, world),
                          runs_of(grouped, model, REFERENCE, world))
    efficiency = "—" if world == 1 else numbers.spread_text(f"{name}.efficiency")
    return [label(series, world)] + cells + [efficiency, against]


def pair_row(numbers, grouped, model, world, first, second):
    """One of the PAIRS compared at one world size: the step ratio within each round and the
    verdict."""
    claim = compare(numbers, f"verdict.{model}.w{world}.{slug(first)}-vs-{slug(second)}",
                    runs_of(grouped, model, first, world), runs_of(grouped, model, second, world))
    return [model.upper(), world, slug(first), slug(second), claim]


def overlap_lesson(numbers, model, world):
    """What bucketed's overlap bought against flat at `world` ranks: hidden share, compute, busy
    time, verdict."""
    bucketed = key(model, "manual bucketed", world)
    flat = key(model, "manual flat", world)
    verdict = numbers.value(f"verdict.{model}.w{world}.bucketed-vs-flat.verdict")
    step = {"faster": "shorter than", "slower": "longer than"}.get(verdict,
                                                                   "indistinguishable from")
    return (f"hides {numbers.text(bucketed + '.overlap.median')} of the {model.upper()}'s "
            f"communication, but is busy {numbers.text(bucketed + '.comm_busy.median')} against "
            f"flat's {numbers.text(flat + '.comm_busy.median')}: its step is {step} flat's")


def summary(numbers, model, top):
    """One sentence about the largest world size: each strategy's verdict against flat."""
    verdicts = {series: numbers.value(f"verdict.{model}.w{top}.{slug(series)}.verdict")
                for series in COMMUNICATING if series != REFERENCE}
    groups = {verdict: [slug(series) for series, said in verdicts.items() if said == verdict]
              for verdict in ("faster", "indistinguishable", "slower")}
    parts = [f"{joined(names)} {'is' if len(names) == 1 else 'are'} "
             f"{'indistinguishable from' if verdict[0] == 'i' else verdict + ' than'} flat"
             for verdict, names in groups.items() if names]
    numbers.add(f"sweep.{model}.summary", "; ".join(parts) or None, "name", kind="derived",
                inputs=[f"verdict.{model}.w{top}.{slug(series)}.verdict" for series in verdicts],
                formula="the verdicts against flat at the largest world size")


def baseline_table(numbers, model, worlds, grouped):
    """Per world size: what sharing the cores costs (ddp-no-sync against one process) and the
    ceiling it sets; each ratio within a round."""
    single = key(model, "single", 1)
    single_runs = grouped.get((model, "single", 1, DEFAULT_BUCKET_MB), [])
    rows = []
    for world in worlds:
        base = key(model, "ddp-no-sync", world)
        base_runs = grouped.get((model, "ddp-no-sync", world, DEFAULT_BUCKET_MB), [])
        flat_runs = grouped.get((model, REFERENCE, world, DEFAULT_BUCKET_MB), [])
        ceiling = f"ceiling.{model}.w{world}"
        numbers.derived(f"{base}.contention", ratio,
                        [f"{base}.compute.median", f"{single}.compute.median"], "ratio",
                        "ddp-no-sync's median compute / one process's")
        numbers.paired_ratio(ceiling, base_runs, single_runs, "throughput_samples_per_s",
                             "percent", scale=1 / world,
                             formula="ddp-no-sync throughput / (ranks x one process's): "
                                     "efficiency without communication")
        numbers.paired_ratio(f"{ceiling}.reached", flat_runs, base_runs,
                             "throughput_samples_per_s", "percent",
                             formula="flat's throughput / ddp-no-sync's: what communication "
                                     "leaves of the ceiling")
        rows.append([world, numbers.spread_text(f"{base}.compute"),
                     numbers.text(f"{base}.contention"), numbers.spread_text(ceiling),
                     numbers.spread_text(f"{ceiling}.reached")])
    return table(BASELINE_COLUMNS, rows)
