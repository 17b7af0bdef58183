"""results/<run>.json: written atomically, and checked against the schema the README documents;
and the overlap every writer and reader of results derives the same way. analysis/results_folder.py
reads a folder of them for the plots and the design document."""
import json

from runtime.atomic import write_atomic
from runtime.memory import CATEGORIES
from runtime.timing import FIELDS

# 2: comm busy as a union, hidden and exposed split at compute's end; 3: compute ends at the last
# gradient's accumulation for DDP too (no estimate), and timing.all_reduce_layouts. `memory` and
# `timing.bytes_sent` came later, optional (the committed files have none), checked where present.
SCHEMA = "ddp-mnist-results/3"

PHASE_STATS = ("mean", "median", "p95")
TIMED_FIELDS = FIELDS  # timing.py: the phases, compute, comm busy/hidden/exposed, own work, step
EPOCH_FIELDS = ("epoch", "steps", "train_loss", "train_accuracy", "val_loss", "val_accuracy",
                "epoch_time_s", "data_s", "compute_s", "comm_busy_s", "comm_hidden_s",
                "comm_exposed_s", "samples_seen", "elapsed_s", "samples_per_s", "lr")
MEMORY_FIELDS = CATEGORIES + ("model_states", "peak_rss")  # bytes, runtime/memory.py
# and model_states_peak, in the results of runs since memory.py has counted it
BYTES_SENT_FIELDS = ("transport", "measured_per_step", "ring_formula_per_step")  # timing.py's
ENVIRONMENT_FIELDS = ("torch", "python", "backend", "device", "launcher", "world_size", "hosts",
                      "cores", "threads_per_rank", "parameters")


def overlap(hidden, busy):
    """The share of communication hidden behind computation (comm_hidden / comm_busy), in [0, 1];
    None without any. Here, not in timing.py, a task module: the analysis runs it in the process
    that grades the tests, where a task module's code may not run (grading/judge_guard.py)."""
    return hidden / busy if busy > 0 else None


def current_options(config):
    """A results file's `config` in today's option names, the measurements untouched: runs made
    before --transport recorded --sync ring or shm (the flat buffer over that transport),
    --comm-hook none or shm (mode ddp) and --collectives (mode sharded). A config already in
    today's names comes back as it is."""
    if "comm_hook" not in config and "collectives" not in config:
        return config
    current = {key: value for key, value in config.items()
               if key not in ("comm_hook", "collectives")}
    transport = {"manual": "auto", "ddp": "auto", "sharded": config.get("collectives")}
    current["transport"] = transport.get(config["mode"])
    if config["mode"] == "manual" and config.get("sync") in ("ring", "shm"):
        current.update(sync="flat", transport=config["sync"])
    if config["mode"] == "ddp" and config.get("comm_hook") == "shm":
        current["transport"] = "shm"
    return current


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
    if need(timing, ("per_rank", "across_ranks", "straggler", "all_reduce_layouts"), "timing"):
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
        if "bytes_sent" in timing:
            problems += bytes_sent_problems(timing["bytes_sent"], world)
    if "memory" in document:
        problems += memory_problems(document["memory"], document["environment"].get("world_size"))
    return problems


def per_rank_problems(container, where, world_size, entry_problems):
    """What is wrong with `container` ({"per_rank": [one entry per rank]}, found at `where`):
    its shape, then `entry_problems(entry, where_the_entry_is)` of each entry."""
    if not isinstance(container, dict) or not isinstance(container.get("per_rank"), list):
        return [f"{where}.per_rank is not a list"]
    problems = []
    if len(container["per_rank"]) != world_size:
        problems.append(f"{where}.per_rank does not have one entry per rank")
    for rank, entry in enumerate(container["per_rank"]):
        problems += entry_problems(entry, f"{where}.per_rank[{rank}]")
    return problems


def byte_counts_problems(entry, fields, where):
    """Each of `fields` of `entry` that is not a whole number of bytes."""
    return [f"{where}.{field} is not a number of bytes" for field in fields
            if not isinstance(entry[field], int) or isinstance(entry[field], bool)
            or entry[field] < 0]


def memory_problems(memory, world_size):
    """What is wrong with a `memory` object: {"per_rank": [bytes of each of MEMORY_FIELDS]}, one
    entry per rank."""
    def held_problems(held, where):
        if not isinstance(held, dict):
            return [f"{where} is not an object"]
        fields = MEMORY_FIELDS + (("model_states_peak",) if "model_states_peak" in held else ())
        return byte_counts_problems({field: held.get(field) for field in fields}, fields, where)

    return per_rank_problems(memory, "memory", world_size, held_problems)


def bytes_sent_problems(sent, world_size):
    """What is wrong with a `timing.bytes_sent` object: {"per_rank": [StepTimer.bytes_sent()]},
    one entry per rank."""
    def entry_problems(entry, where):
        if not isinstance(entry, dict) or any(field not in entry for field in BYTES_SENT_FIELDS):
            return [f"{where} lacks one of {', '.join(BYTES_SENT_FIELDS)}"]
        problems = []
        if not (entry["transport"] is None or isinstance(entry["transport"], str)):
            problems.append(f"{where}.transport is not a name")
        return problems + byte_counts_problems(entry, BYTES_SENT_FIELDS[1:], where)

    return per_rank_problems(sent, "timing.bytes_sent", world_size, entry_problems)


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
        if not isinstance(value, (int, float)) or value < 0:
            problems.append(f"{where}.{key} is not a non-negative number")
    for key in ("train_accuracy", "val_accuracy"):
        if not 0 <= epoch[key] <= 1:
            problems.append(f"{where}.{key} is not a fraction")
    return problems

