"""results/<run>.json: written atomically, and checked against the schema the README documents."""
import json
import os
import tempfile

SCHEMA = "ddp-mnist-results/1"

PHASE_STATS = ("mean", "median", "p95")
TIMED_FIELDS = ("data", "forward", "backward", "sync", "optimizer", "comm_busy", "step")
EPOCH_FIELDS = ("epoch", "steps", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "epoch_time_s",
                "data_s", "compute_s", "comm_exposed_s", "comm_busy_s", "samples_per_s", "lr")
ENVIRONMENT_FIELDS = ("torch", "python", "backend", "device", "launcher", "world_size", "hosts", "cores",
                      "threads_per_rank", "parameters")


def write_json_atomic(path, document):
    """Write to a temporary file in the same folder, flush it to disk, then rename: never half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)  # mkstemp's 0600 would hide results from other users
    try:
        with os.fdopen(handle, "w") as file:
            json.dump(document, file, indent=1)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def validate(document):
    """Return a list of what is wrong with a results document (empty when it is valid)."""
    problems = []

    def need(mapping, keys, where):
        if not isinstance(mapping, dict):
            problems.append(f"{where} is not an object")
            return False
        missing = [key for key in keys if key not in mapping]
        problems.extend(f"{where}.{key} missing" for key in missing)
        return not missing

    if not need(document, ("schema", "run_name", "config", "environment", "epochs", "test", "timing",
                           "throughput_samples_per_s"), "results"):
        return problems
    if document["schema"] != SCHEMA:
        problems.append(f"schema is {document['schema']!r}, expected {SCHEMA!r}")
    if need(document["environment"], ENVIRONMENT_FIELDS, "environment"):
        environment = document["environment"]
        if not (isinstance(environment["world_size"], int) and environment["world_size"] >= 1):
            problems.append("environment.world_size is not a positive integer")
        if not (isinstance(environment["hosts"], list) and environment["hosts"]):
            problems.append("environment.hosts is not a non-empty list")
    if not isinstance(document["epochs"], list) or not document["epochs"]:
        problems.append("epochs is not a non-empty list")
    else:
        for index, epoch in enumerate(document["epochs"]):
            if need(epoch, EPOCH_FIELDS, f"epochs[{index}]"):
                for key in EPOCH_FIELDS:
                    if not isinstance(epoch[key], (int, float)) or epoch[key] < 0:
                        problems.append(f"epochs[{index}].{key} is not a non-negative number")
                for key in ("train_accuracy", "val_accuracy"):
                    if not 0 <= epoch[key] <= 1:
                        problems.append(f"epochs[{index}].{key} is not a fraction")
    if need(document["test"], ("loss", "accuracy"), "test") and not 0 <= document["test"]["accuracy"] <= 1:
        problems.append("test.accuracy is not a fraction")
    timing = document["timing"]
    if need(timing, ("per_rank", "across_ranks", "straggler"), "timing"):
        world = document["environment"].get("world_size")
        if isinstance(timing["per_rank"], list) and len(timing["per_rank"]) != world:
            problems.append("timing.per_rank does not have one entry per rank")
        for where, stats in [("timing.across_ranks", timing["across_ranks"])] + \
                [(f"timing.per_rank[{r}]", s) for r, s in enumerate(timing["per_rank"])]:
            if need(stats, TIMED_FIELDS, where):
                for field in TIMED_FIELDS:
                    need(stats[field], PHASE_STATS, f"{where}.{field}")
    return problems
