"""A folder of results files as the plots and the design document read it: the training runs
grouped by sweep and configuration over rounds, their spread, and the one faster/slower rule."""
import glob
import json
import os
import random
import re
import statistics

from runtime.options import configuration_name
from runtime.results import SCHEMA, current_options, overlap, validate
from runtime.timing import FIELDS

# each benchmark's schema -> (the command that writes it, the list of rows load_folder returns)
ALLREDUCE_SCHEMA, STEP_BENCH_SCHEMA = "allreduce-bench/1", "step-bench/3"
BENCHMARKS = {ALLREDUCE_SCHEMA: ("python -m benchmarks.allreduce_bench", "measurements"),
              STEP_BENCH_SCHEMA: ("python -m benchmarks.step_bench", "summary")}  # of repeats

# analysis/sweep.py names a run <sweep>-<model>-...-r<round> (bucket-mlp-ddp-25mb-w4-r1). Two
# sweeps' runs are never pooled, not even the bucket sweep's 25 MiB DDP with the strategy sweep's.
RUN_NAME = re.compile(r"^(?P<sweep>[a-z]+)-(?:mlp|cnn)-.*?(?:-r(?P<round>\d+))?$")

# The document's one verdict rule (§4.1): of ratios taken within each round, faster (below 1) or
# slower only where all agree or, from BOOTSTRAP_FROM rounds, the median's 95 % interval excludes 1.
BOOTSTRAP_FROM, BOOTSTRAP_SAMPLES = 5, 2000


def series_name(run):
    """A run's series: 'single', 'ddp-no-sync', 'ddp over shm', 'manual flat-ring', '... fp16'."""
    config = current_options(run["config"])
    name = config["mode"]
    if name == "manual":
        name += " " + configuration_name(config["sync"], config.get("transport"))
    elif name == "ddp" and config.get("transport") in ("ring", "shm"):
        name += " over " + config["transport"]
    return name + (f" {config['compress']}" if config.get("compress") else "")


def load_folder(folder, note=print):
    """Training runs (valid documents of SCHEMA, each with its `path`) and each benchmark's rows
    by schema (BENCHMARKS), from the folder's *.json; `note` hears of each file skipped and why."""
    runs, benchmarks = [], {schema: [] for schema in BENCHMARKS}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        name = os.path.basename(path)
        try:
            with open(path) as file:
                document = json.load(file)
        except (OSError, ValueError) as error:
            note(f"note: skipped {name}: not readable JSON ({error})")
            continue
        document = document if isinstance(document, dict) else {}
        if "traceEvents" in document:
            continue  # a --trace timeline: plots.py draws it from its own file
        schema = document.get("schema")
        newer = [known for known in BENCHMARKS if known.split("/")[0] == str(schema).split("/")[0]]
        if schema in BENCHMARKS:
            benchmarks[schema] += document.get(BENCHMARKS[schema][1], [])
        elif newer:  # the same benchmark's schema, of another version than the one read
            note(f"note: skipped {name}: schema {schema!r} is older than {newer[0]}: "
                 f"run {BENCHMARKS[newer[0]][0]} again")
        elif schema != SCHEMA:
            note(f"note: skipped {name}: no plot or table for schema {schema!r}")
        elif problems := validate(document):
            note(f"note: skipped {name}: {problems[0]}")
        else:  # recorded in today's option names
            runs.append(dict(document, config=current_options(document["config"]), path=path))
    return runs, benchmarks


def name_part(run, part):
    """RUN_NAME's `part` of a run's name (its results file's, else as recorded), or None."""
    name = os.path.splitext(os.path.basename(run["path"]))[0] if run.get("path") \
        else run.get("run_name") or ""
    match = RUN_NAME.match(name)
    return match.group(part) if match else None


def sweep_of(run):
    """The sweep that made a run ('sweep', 'bucket', 'slurm'), or '' for a run named otherwise."""
    return name_part(run, "sweep") or ""


def round_of(run):
    """The round of its sweep a run belongs to (the -r<round> of its name), or None."""
    found = name_part(run, "round")
    return int(found) if found else None


def repeats(runs, sweep=None):
    """{what runs measured, (model, series_name, world size, bucket MiB): [its repeats, by round
    then oldest first]}, of `sweep` (sweep_of) if given; of one round of a sweep, the newest run."""
    grouped = {}
    chosen = [run for run in runs if sweep is None or sweep_of(run) == sweep]
    for run in sorted(chosen, key=lambda run: (round_of(run) or 0, run.get("created", ""))):
        config = run["config"]
        measured = (config["model"], series_name(run), run["environment"]["world_size"],
                    float(config["bucket_mb"]))
        same = grouped.setdefault(measured, [])
        if same and round_of(run) is not None and \
                (sweep_of(same[-1]), round_of(same[-1])) == (sweep_of(run), round_of(run)):
            same.pop()  # a round run again, under another name too (renamed): never pooled twice
        same.append(run)
    return grouped


def paired(runs, others):
    """[(run, other)] of the same round: by round number, else in order (both oldest first)."""
    rounds = {round_of(other): other for other in others}
    if None in rounds or any(round_of(run) is None for run in runs):
        return list(zip(runs, others))
    return [(run, rounds[round_of(run)]) for run in runs if round_of(run) in rounds]


def interval(ratios):
    """(low, high) for the verdict: the ratios' range, or their bootstrap median's central 95 %."""
    if len(ratios) < BOOTSTRAP_FROM:
        return min(ratios), max(ratios)
    draw = random.Random(0)  # a fixed seed: the build is reproducible
    medians = sorted(statistics.median(draw.choices(ratios, k=len(ratios)))
                     for _ in range(BOOTSTRAP_SAMPLES))
    return medians[int(0.025 * BOOTSTRAP_SAMPLES)], medians[int(0.975 * BOOTSTRAP_SAMPLES) - 1]


def verdict(low, high):
    """'faster', 'slower' or 'indistinguishable' from the interval of the ratios first / second."""
    return "faster" if high < 1 else "slower" if low > 1 else "indistinguishable"


def spread(values):
    """Median, min, max and count of repeated measurements (None for none)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)} if values else None


def per_step(run):
    """Mean seconds per step of each timed field, over ranks; overlap, throughput, straggler."""
    means = {field: run["timing"]["across_ranks"][field]["mean"] for field in FIELDS}
    return dict(means, overlap=overlap(means["comm_hidden"], means["comm_busy"]),
                throughput=run["throughput_samples_per_s"], straggler=run["timing"]["straggler"])


def across_repeats(runs):
    """{field of per_step: spread over the runs} for the repeated runs of one configuration."""
    steps = [per_step(run) for run in runs]
    return {field: spread([step[field] for step in steps if step[field] is not None])
            for field in steps[0]}
