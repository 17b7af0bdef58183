"""results/<run>.json: written atomically, and checked against the schema the README documents."""
import glob
import json
import os

from runtime.atomic import write_atomic
from runtime.timing import FIELDS

SCHEMA = "ddp-mnist-results/2"  # 2: comm busy as a union, hidden and exposed split at compute's end

PHASE_STATS = ("mean", "median", "p95")
TIMED_FIELDS = FIELDS  # timing.py: the phases, compute, comm busy/hidden/exposed, own work, step
EPOCH_FIELDS = ("epoch", "steps", "train_loss", "train_accuracy", "val_loss", "val_accuracy",
                "epoch_time_s", "data_s", "compute_s", "comm_busy_s", "comm_hidden_s",
                "comm_exposed_s", "samples_seen", "elapsed_s", "samples_per_s", "lr")
# DDP's exposed time is an unclamped estimate (timing.py): a noisy epoch can sum below 0.
SIGNED_FIELDS = ("comm_exposed_s",)
ENVIRONMENT_FIELDS = ("torch", "python", "backend", "device", "launcher", "world_size", "hosts",
                      "cores", "threads_per_rank", "parameters")


def write_json_atomic(path, document):
    """Write `document` as indented JSON, whole or not at all (runtime/atomic.py)."""
    write_atomic(path, lambda file: json.dump(document, file, indent=1))


def validate(document):
    """Return a list of what is wrong with a results document (empty when it is valid)."""
    problems = []

    def need(mapping, keys, where):
        """Whether `mapping` is an object holding every key; notes each one missing."""
        if not isinstance(mapping, dict):
            problems.append(f"{where} is not an object")
            return False
        missing = [key for key in keys if key not in mapping]
        problems.extend(f"{where}.{key} missing" for key in missing)
        return not missing

    top_level = ("schema", "run_name", "config", "environment", "epochs", "test", "timing",
                 "throughput_samples_per_s")
    if not need(document, top_level, "results"):
        return problems
    if document["schema"] != SCHEMA:
        problems.append(f"schema is {document['schema']!r}, expected {SCHEMA!r}")
    if need(document["environment"], ENVIRONMENT_FIELDS, "environment"):
        problems += environment_problems(document["environment"])
    if not isinstance(document["epochs"], list) or not document["epochs"]:
        problems.append("epochs is not a non-empty list")
    else:
        for index, epoch in enumerate(document["epochs"]):
            if need(epoch, EPOCH_FIELDS, f"epochs[{index}]"):
                problems += epoch_problems(epoch, f"epochs[{index}]")
    test = document["test"]
    if need(test, ("loss", "accuracy"), "test") and not 0 <= test["accuracy"] <= 1:
        problems.append("test.accuracy is not a fraction")
    timing = document["timing"]
    if need(timing, ("per_rank", "across_ranks", "straggler"), "timing"):
        world = document["environment"].get("world_size")
        if isinstance(timing["per_rank"], list) and len(timing["per_rank"]) != world:
            problems.append("timing.per_rank does not have one entry per rank")
        summaries = [("timing.across_ranks", timing["across_ranks"])]
        summaries += [(f"timing.per_rank[{rank}]", stats)
                      for rank, stats in enumerate(timing["per_rank"])]
        for where, stats in summaries:
            if need(stats, TIMED_FIELDS, where):
                for field in TIMED_FIELDS:
                    need(stats[field], PHASE_STATS, f"{where}.{field}")
    return problems


def environment_problems(environment):
    """What is wrong with the values of a complete `environment` object."""
    problems = []
    if not (isinstance(environment["world_size"], int) and environment["world_size"] >= 1):
        problems.append("environment.world_size is not a positive integer")
    if not (isinstance(environment["hosts"], list) and environment["hosts"]):
        problems.append("environment.hosts is not a non-empty list")
    return problems


def epoch_problems(epoch, where):
    """What is wrong with the values of a complete epoch record."""
    problems = []
    for key in EPOCH_FIELDS:
        value = epoch[key]
        if not isinstance(value, (int, float)) or (value < 0 and key not in SIGNED_FIELDS):
            problems.append(f"{where}.{key} is not a non-negative number")
    for key in ("train_accuracy", "val_accuracy"):
        if not 0 <= epoch[key] <= 1:
            problems.append(f"{where}.{key} is not a fraction")
    return problems


# --- Reading a results folder: the one loader behind every plot and every table -----------------

BENCHMARK_SCHEMAS = ("allreduce-bench/1", "step-bench/2")  # written by benchmarks/*.py


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


def load_folder(folder, note=print):
    """Training runs (valid documents of SCHEMA, each with its `path`) and each benchmark's
    measurements by schema, from the folder's *.json; `note` hears of each file skipped and why."""
    runs = []
    benchmarks = {schema: [] for schema in BENCHMARK_SCHEMAS}
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
        if schema in benchmarks:
            benchmarks[schema] += document.get("measurements", [])
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
    """Median, min and max of repeated measurements (None for none)."""
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        median = ordered[middle]
    else:
        median = (ordered[middle - 1] + ordered[middle]) / 2
    return {"median": median, "min": ordered[0], "max": ordered[-1], "n": len(ordered)}


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
    busy = means["comm_busy"]
    means["overlap"] = means["comm_hidden"] / busy if busy > 0 else None
    means["throughput"] = run["throughput_samples_per_s"]
    means["straggler"] = run["timing"]["straggler"]
    return means


def across_repeats(runs):
    """{field of per_step: spread over the runs} for the repeated runs of one configuration."""
    steps = [per_step(run) for run in runs]
    return {field: spread([step[field] for step in steps if step[field] is not None])
            for field in steps[0]}
