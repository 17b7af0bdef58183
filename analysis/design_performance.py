"""What §4.1-§4.3 of the design document measure: each configuration's median and spread over its
repeats, the verdicts between strategies, the compute baseline and the ceiling it puts on
efficiency.

Every table reads the runs that results_folder.load_folder finds, grouped by
results_folder.repeats (the plots read the same); a strategy is called faster than another only
where results_folder.clearly_less holds.
"""
import functools

from analysis.design_numbers import mean, ratio, smallest, table, unchanged
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
VERDICT_COLUMN = {"fastest": "smallest median", "indistinguishable": "indistinguishable",
                  "slower": "slower"}
SWEEP_COLUMNS = ["sync", "ranks", "runs", "step", "compute", "exposed comm", "busy comm",
                 "overlap", "throughput", "efficiency", "straggler", "against the smallest median"]
BASELINE_COLUMNS = ["ranks", "ddp-no-sync compute", "× one process's compute",
                    "ddp-no-sync throughput", "ceiling", "smallest median", "its efficiency",
                    "its share of the ceiling"]


def slug(series):
    """The series' part of a number's name: 'manual flat' -> 'flat'."""
    return series.replace("manual ", "")


def key(model, series, world):
    """The prefix of a configuration's numbers: 'sweep.mlp.flat.w4'."""
    return f"sweep.{model}.{slug(series)}.w{world}"


def sentence(first, second, verdict):
    """What the document claims about `first` against `second`, given their verdict."""
    if verdict == "faster":
        return f"{first} is faster than {second}"
    if verdict == "slower":
        return f"{second} is faster than {first}"
    return f"{first} and {second} are indistinguishable on this machine"


def scaling_efficiency(world, throughput, single_throughput):
    """Throughput over `world` single processes' throughput."""
    return throughput / (world * single_throughput)


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
    if there is one); returns the largest world size's DDP run, or None."""
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
    return largest_ddp


def register_aliases(numbers, model, top):
    """Names for the largest world size's ceiling and DDP check, as the text quotes them."""
    ddp = key(model, "ddp", top)
    aliases = ((f"ceiling.{model}.largest", f"ceiling.{model}.w{top}"),
               (f"ceiling.{model}.largest.reached", f"ceiling.{model}.w{top}.reached"),
               (f"ddp_check.{model}.estimate", f"{ddp}.comm_exposed.median"),
               (f"ddp_check.{model}.reducer", f"{ddp}.reducer_exposed.median"))
    for alias, source in aliases:
        unit = numbers.entries.get(source, {}).get("unit", "ms")
        numbers.derived(alias, unchanged, [source], unit, "at the largest world size")


def sweep_section(numbers, grouped, worlds):
    """Per model: every configuration's spreads, its efficiency, and its verdict against the
    fastest."""
    tables = {}
    pairs = []
    top = worlds[-1]
    largest_ddp = register_machine(numbers, grouped, top)
    for model in ("mlp", "cnn"):
        single = first_run(grouped, model, "single", 1)
        numbers.measured(f"config.{model}.max_steps", path_of(single), "config.max_steps",
                         "count")
        configurations = [("single", 1)]
        configurations += [(series, world) for world in worlds for series in SERIES
                           if series != "single"]
        for series, world in configurations:
            runs = grouped.get((model, series, world, DEFAULT_BUCKET_MB), [])
            name = key(model, series, world)
            register_run_spreads(numbers, name, runs)
            numbers.derived(f"{name}.efficiency", functools.partial(scaling_efficiency, world),
                            [f"{name}.throughput.median",
                             f"{key(model, 'single', 1)}.throughput.median"], "percent",
                            "median throughput / (ranks x one process's median throughput)")
        rows = []
        for world in worlds:
            rows += world_rows(numbers, model, world)
            pairs += [pair_row(numbers, model, world, first, second) for first, second in PAIRS]
        tables[f"table.sweep.{model}"] = table(SWEEP_COLUMNS,
                                               [row(numbers, model, "single", 1, "—")] + rows)
        tables[f"table.baseline.{model}"] = baseline_table(numbers, model, worlds)
        summary(numbers, model, top)
        reducer_check(numbers, model, top,
                      grouped.get((model, "ddp", top, DEFAULT_BUCKET_MB), []))
        register_aliases(numbers, model, top)
    numbers.measured("config.calibrate_every", path_of(largest_ddp), "config.calibrate_every",
                     "count")
    tables["table.pairs"] = table(["model", "ranks", "step of the first", "step of the second",
                                   "verdict"], pairs)
    lessons = [overlap_lesson(numbers, model, top) for model in ("mlp", "cnn")]
    tables["text.overlap_lesson"] = "; ".join(lessons)
    counted = [name for name in numbers.entries
               if name.startswith("sweep.") and name.endswith(".step.n")]
    numbers.derived("sweep.fewest_repeats", smallest, counted, "count",
                    "the fewest repeats of any measured configuration")
    return tables


def world_rows(numbers, model, world):
    """The rows of one world size, each communicating series with its verdict against the
    smallest median."""
    steps = {series: numbers.value(f"{key(model, series, world)}.step.median")
             for series in COMMUNICATING}
    measured = [series for series in steps if steps[series] is not None]
    fastest = min(measured, key=steps.get, default=None)
    numbers.add(f"sweep.{model}.w{world}.fastest", fastest, "name", kind="derived",
                inputs=[f"{key(model, series, world)}.step.median" for series in COMMUNICATING],
                formula="the communicating series with the smallest median step")
    rows = [row(numbers, model, "ddp-no-sync", world, "compute baseline")]
    for series in COMMUNICATING:
        verdict = None
        if fastest and series != fastest:
            verdict = numbers.verdict(f"verdict.{model}.w{world}.{slug(series)}",
                                      key(model, series, world) + ".step",
                                      key(model, fastest, world) + ".step")
        label = "—"
        if fastest and steps[series] is not None:
            label = VERDICT_COLUMN[verdict or "fastest"]
        rows.append(row(numbers, model, series, world, label))
    return rows


def row(numbers, model, series, world, against):
    """A configuration's row of the sweep table: its spreads, efficiency and verdict."""
    name = key(model, series, world)
    cells = [numbers.spread_text(f"{name}.{field}") for field in ("step", "compute")]
    if series in QUIET:
        cells += ["—"] * 3
    else:
        cells += [numbers.spread_text(f"{name}.{field}")
                  for field in ("comm_exposed", "comm_busy", "overlap")]
    runs = numbers.text(f"{name}.step.n") if numbers.value(f"{name}.step.n") else "0"
    return [series, world, runs] + cells + [
        numbers.spread_text(f"{name}.throughput"), numbers.text(f"{name}.efficiency"),
        numbers.text(f"{name}.straggler.median"), against]


def pair_row(numbers, model, world, first, second):
    """One of the PAIRS compared at one world size: the claim results_folder.clearly_less allows."""
    first_step = key(model, first, world) + ".step"
    second_step = key(model, second, world) + ".step"
    verdict = numbers.verdict(f"verdict.{model}.w{world}.{slug(first)}-vs-{slug(second)}",
                              first_step, second_step)
    claim = sentence(first, second, verdict) if verdict else f"{first} or {second} not measured"
    return [model.upper(), world, numbers.spread_text(first_step),
            numbers.spread_text(second_step), claim]


def overlap_lesson(numbers, model, world):
    """What bucketed's overlap bought against flat at `world` ranks: hidden share, compute, busy
    time, verdict."""
    bucketed = key(model, "manual bucketed", world)
    flat = key(model, "manual flat", world)
    verdict = numbers.value(f"verdict.{model}.w{world}.bucketed-vs-flat")
    step = {"faster": "shorter than", "slower": "longer than"}.get(verdict,
                                                                   "indistinguishable from")
    return (f"for the {model.upper()} it hides {numbers.text(bucketed + '.overlap.median')} "
            f"of its communication behind backward, its compute is "
            f"{numbers.text(bucketed + '.compute.median')} against flat's "
            f"{numbers.text(flat + '.compute.median')}, its busy time "
            f"{numbers.text(bucketed + '.comm_busy.median')} against "
            f"{numbers.text(flat + '.comm_busy.median')}, and its step is {step} flat's")


def is_or_are(names):
    """The names joined, with the verb that agrees with them."""
    return f"{', '.join(names)} {'is' if len(names) == 1 else 'are'}"


def summary(numbers, model, top):
    """One sentence about the largest world size: the smallest median, and who is or is not
    distinguishable."""
    fastest = numbers.value(f"sweep.{model}.w{top}.fastest")
    verdicts = {series: numbers.value(f"verdict.{model}.w{top}.{slug(series)}")
                for series in COMMUNICATING if series != fastest}
    alike = [series for series, verdict in verdicts.items() if verdict == "indistinguishable"]
    slower = [series for series, verdict in verdicts.items() if verdict == "slower"]
    parts = [f"**{fastest}** has the smallest median step"] if fastest else []
    if alike:
        parts.append(f"{is_or_are(alike)} indistinguishable from it on this machine")
    if slower:
        parts.append(f"{is_or_are(slower)} slower than it beyond both spreads")
    inputs = [f"sweep.{model}.w{top}.fastest"]
    inputs += [f"verdict.{model}.w{top}.{slug(series)}" for series in verdicts]
    numbers.add(f"sweep.{model}.summary", "; ".join(parts) or None, "name", kind="derived",
                inputs=inputs,
                formula="the verdicts against the smallest median at the largest world size")


def baseline_table(numbers, model, worlds):
    """Per world size: what sharing the cores costs (ddp-no-sync against one process) and the
    ceiling it sets."""
    single = key(model, "single", 1)
    rows = []
    for world in worlds:
        base = key(model, "ddp-no-sync", world)
        fastest = numbers.value(f"sweep.{model}.w{world}.fastest")
        ceiling = f"ceiling.{model}.w{world}"
        numbers.derived(f"{base}.contention", ratio,
                        [f"{base}.compute.median", f"{single}.compute.median"], "ratio",
                        "ddp-no-sync's median compute / one process's")
        numbers.derived(ceiling, functools.partial(scaling_efficiency, world),
                        [f"{base}.throughput.median", f"{single}.throughput.median"], "percent",
                        "ddp-no-sync throughput / (ranks x one process's throughput): "
                        "efficiency without communication")
        best = key(model, fastest, world) if fastest else None
        reached = [f"{best}.throughput.median", f"{base}.throughput.median"] if best else []
        numbers.derived(f"{ceiling}.reached", ratio, reached, "percent",
                        "the smallest median's throughput / ddp-no-sync's: "
                        "what communication leaves of the ceiling")
        rows.append([world, numbers.spread_text(f"{base}.compute"),
                     numbers.text(f"{base}.contention"), numbers.spread_text(f"{base}.throughput"),
                     numbers.text(ceiling), fastest or "—",
                     numbers.text(f"{best}.efficiency") if best else "—",
                     numbers.text(f"{ceiling}.reached")])
    return table(BASELINE_COLUMNS, rows)


def reducer_check(numbers, model, world, runs):
    """DDP's estimated exposed communication against the reducer's own statistics (mean over
    ranks)."""
    fields = [f"timing.ddp_runtime_statistics[{rank}].exposed_s" for rank in range(world)]
    numbers.over_repeats(f"{key(model, 'ddp', world)}.reducer_exposed", runs, fields, "ms",
                         combine=mean,
                         formula="the mean over ranks of the reducer's "
                                 "backward_comm - backward_overlap")
