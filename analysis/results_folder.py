"""A folder of results files as the plots and the design document read it: the training runs
(results/<run>.json, checked by runtime/results.py) grouped by configuration over their repeats,
each run's means per step, and their spread (median, min, max) over the repeats."""
import glob
import json
import os
import statistics

from runtime.results import SCHEMA, overlap, validate
from runtime.timing import FIELDS

# each benchmark's schema -> (the command that writes it, the list of rows its figure draws)
BENCHMARKS = {"allreduce-bench/1": ("python -m benchmarks.allreduce_bench", "measurements"),
              "step-bench/3": ("python -m benchmarks.step_bench", "summary")}  # medians of repeats


def series_name(run):
    """How a run's synchronisation is named: 'single', 'ddp', 'ddp-no-sync', 'manual flat',
    '... fp16'."""
    config = run["config"]
    name = "manual " + config["sync"] if config["mode"] == "manual" else config["mode"]
    return name + (f" {config['compress']}" if config.get("compress") else "")


def configuration(run):
    """What a run measured, without its repeat: (model, series, world size, bucket MiB)."""
    config = run["config"]
    world_size = run["environment"]["world_size"]
    return config["model"], series_name(run), world_size, float(config["bucket_mb"])


def older_benchmark(schema):
    """The current schema of the benchmark that wrote `schema` if `schema` is an older version of
    it ('step-bench/2' -> 'step-bench/3'), else None."""
    name = str(schema).split("/")[0]
    current = [known for known in BENCHMARKS if known.split("/")[0] == name and known != schema]
    return current[0] if current else None


def load_folder(folder, note=print):
    """Training runs (valid documents of SCHEMA, each with its `path`) and each benchmark's rows
    by schema (BENCHMARKS: allreduce-bench's measurements, step-bench's summary), from the
    folder's *.json; `note` hears of each file skipped and why."""
    runs = []
    benchmarks = {schema: [] for schema in BENCHMARKS}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        name = os.path.basename(path)
        try:
            with open(path) as file:
                document = json.load(file)
        except (OSError, ValueError) as error:
            note(f"note: skipped {name}: not readable JSON ({error})")
            continue
        if isinstance(document, dict) and "traceEvents" in document:
            continue  # a --trace timeline: plots.py draws it from its own file
        schema = document.get("schema") if isinstance(document, dict) else None
        if schema == SCHEMA:
            problems = validate(document)
        else:
            problems = [f"no plot or table for schema {schema!r}"]
        current = older_benchmark(schema)
        if schema in BENCHMARKS:
            _command, rows = BENCHMARKS[schema]
            benchmarks[schema] += document.get(rows, [])
        elif current:
            command, _rows = BENCHMARKS[current]
            note(f"note: skipped {name}: schema {schema!r} is older than {current}: "
                 f"run {command} again")
        elif problems:
            note(f"note: skipped {name}: {problems[0]}")
        else:
            runs.append(dict(document, path=path))
    return runs, benchmarks


def repeats(runs):
    """{configuration: [runs, oldest first]}: the repeated runs of each configuration together."""
    grouped = {}
    for run in sorted(runs, key=lambda run: run.get("created", "")):
        grouped.setdefault(configuration(run), []).append(run)
    return grouped


def spread(values):
    """Median (of the two middle values on even counts), min and max of repeated measurements
    (None for none)."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def clearly_less(lower, higher):
    """Whether spread `lower` is below spread `higher` by more than either's own spread (max - min):
    only then is a difference between two configurations called real on a noisy machine."""
    gap = higher["median"] - lower["median"]
    return gap > lower["max"] - lower["min"] and gap > higher["max"] - higher["min"]


def per_step(run):
    """A run's mean seconds per step of each timed field, pooled over ranks (means add up: data +
    compute + comm_exposed == step), with overlap (hidden / busy), throughput and the straggler."""
    stats = run["timing"]["across_ranks"]
    means = {field: stats[field]["mean"] for field in FIELDS}
    means["overlap"] = overlap(means["comm_hidden"], means["comm_busy"])
    means["throughput"] = run["throughput_samples_per_s"]
    means["straggler"] = run["timing"]["straggler"]
    return means


def across_repeats(runs):
    """{field of per_step: spread over the runs} for the repeated runs of one configuration."""
    steps = [per_step(run) for run in runs]
    return {field: spread([step[field] for step in steps if step[field] is not None])
            for field in steps[0]}
