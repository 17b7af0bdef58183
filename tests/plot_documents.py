"""Small, schema-valid synthetic results documents for the plot tests; helpers to read figures.

Training runs are summarised by runtime.timing.summarize_ranks and the trace laid out by its
chrome_trace, and the bucket sweep counts buckets of the models' parameters (runtime.models): task
code, which the process that decides the tests never runs. So those documents and layouts are made
in a child process with the code under test (grading/launch.py run_alone), once per session, and the
tests plot them in their own process. The make_* functions run in the child and import the task
code there."""
import copy
import functools
import json

from analysis import cost_model, results_folder
from analysis.plot_common import bucket_variant
from analysis.plot_timeline import complete_events, plot_timeline
from grading.launch import run_alone
from runtime.results import SCHEMA
from runtime.timing import FIELDS

ALPHA, BETA = 50e-6, 1e-9  # the all-reduce documents are generated exactly from this α-β model
# (throughput scale, extra compute seconds) of each of the three repeats
REPEATS = ((1.0, 0.0), (0.9, 0.002), (1.1, -0.001))
STRATEGY_CONFIGURATIONS = (("single", 1, 1000.0), ("ddp-no-sync", 2, 1900.0), ("ddp", 2, 1600.0),
                           ("manual", 2, 1400.0), ("ddp", 4, 2000.0), ("manual", 4, 1800.0))


def step_record(data=0.001, compute=0.007, hidden=0.002, exposed=0.003, busy=None):
    """One step with every timing field, consistent: data + compute + exposed == step,
    hidden <= busy."""
    record = dict.fromkeys(FIELDS, 0.0)
    busy = hidden + exposed if busy is None else busy
    record.update(data=data, forward=0.002, backward=compute - 0.003, optimizer=0.001,
                  compute=compute, comm_busy=busy, comm_hidden=hidden, comm_exposed=exposed,
                  step=data + compute + exposed)
    record["own_work"] = record["step"] - exposed
    return record


def epoch_record(epoch, world, throughput):
    """One epoch's entry of a results document."""
    return {"epoch": epoch, "steps": 20, "train_loss": 1.0 / epoch,
            "train_accuracy": 0.8 + 0.05 * epoch, "val_loss": 1.1 / epoch,
            "val_accuracy": 0.78 + 0.05 * epoch, "epoch_time_s": 1.0, "data_s": 0.02,
            "compute_s": 0.14, "comm_busy_s": 0.1, "comm_hidden_s": 0.04, "comm_exposed_s": 0.06,
            "samples_seen": 640 * world * epoch, "elapsed_s": 1.5 * epoch / world,
            "samples_per_s": throughput, "lr": 0.001}


def made(maker, **options):
    """What the function named `maker` returns for `options`, made in a child; a copy, which the
    caller may change."""
    return copy.deepcopy(made_once(maker, tuple(sorted(options.items()))))


@functools.cache
def made_once(maker, options):
    """made()'s launch, once per session for each (maker, options)."""
    return run_alone(make, maker, dict(options))


def make(maker, options):
    """The function named `maker`, called with `options`. Run in a child: a name, not the function,
    crosses to it, so that it is looked up in the child's copy of this module."""
    return globals()[maker](**options)


def training_run(**options):
    """make_training_run(**options), made in a child."""
    return made("make_training_run", **options)


def strategy_runs():
    """make_strategy_runs(), made in a child."""
    return made("make_strategy_runs")


def bucket_runs():
    """make_bucket_runs(), made in a child."""
    return made("make_bucket_runs")


def trace():
    """make_trace(), made in a child."""
    return made("make_trace")


def make_training_run(model="mlp", mode="manual", sync="flat", world=2, bucket_mb=25.0,
                      throughput=1000.0, repeat=1, sent=(1024,), **step):
    """A results document (schema 2) with every field results.validate asks for; single processes
    communicate nothing, so all their communication fields are 0."""
    from runtime.timing import summarize_ranks

    if world == 1 or mode == "ddp-no-sync":
        step.update(hidden=0.0, exposed=0.0, busy=0.0)
        sent = ()
    record = step_record(**step)
    return {
        "schema": SCHEMA,
        "run_name": f"{model}-{mode}-{sync}-w{world}-{bucket_mb}mb-r{repeat}",
        "created": f"2026-01-01T00:00:0{repeat}",
        "config": {"mode": mode, "sync": sync, "bucket_mb": bucket_mb, "compress": None,
                   "model": model, "world_size": world, "run_name": None,
                   "results_dir": "results"},
        "environment": {"torch": "2.13.0+cpu", "python": "3.11", "backend": "gloo",
                        "device": "cpu", "launcher": "local", "world_size": world,
                        "hosts": ["vm"], "cores": 2, "threads_per_rank": 1,
                        "parameters": 567434},
        "epochs": [epoch_record(epoch, world, throughput) for epoch in (1, 2)],
        "test": {"loss": 0.4, "accuracy": 0.9},
        "timing": {**summarize_ranks([[record] * 3 for _ in range(world)]),
                   "all_reduce_layouts": [{"from_step": 0, "bytes": list(sent)}] if sent else []},
        "throughput_samples_per_s": throughput,
    }


def make_strategy_runs():
    """Three repeats of each configuration; the repeats differ in throughput and in compute time."""
    runs = []
    for repeat, (scale, extra) in enumerate(REPEATS, start=1):
        for mode, world, throughput in STRATEGY_CONFIGURATIONS:
            runs.append(make_training_run(mode=mode, world=world, throughput=scale * throughput,
                                          repeat=repeat, compute=0.007 + extra))
    return runs


# all-reduces per step the bucket runs record sending, per mode and bucket size
BUCKETS_SENT = {"manual": {0.25: 4, 1.0: 2, 4.0: 2}, "ddp": {0.25: 2, 1.0: 1, 4.0: 1}}


def make_bucket_runs():
    """Two repeats each of bucketed and DDP at three bucket sizes; exposed time grows with the
    size."""
    return [make_training_run(mode=mode, sync="bucketed", world=4, bucket_mb=size, repeat=repeat,
                              exposed=size / 100, sent=[1024] * BUCKETS_SENT[mode][size])
            for mode in ("manual", "ddp") for size in (0.25, 1.0, 4.0) for repeat in (1, 2)]


def allreduce_row(world, size, implementation):
    """One allreduce-bench/1 measurement, exactly as the α-β model predicts it."""
    seconds = cost_model.allreduce_time(size, world, ALPHA, BETA)
    return {"world_size": world, "bytes": size, "implementation": implementation,
            "median_s": seconds, "p95_s": seconds, "algbw_gbps": size / seconds / 1e9,
            "busbw_gbps": size / seconds * 2 * (world - 1) / world / 1e9, "verified": True}


def allreduce_bench():
    """benchmarks/allreduce_bench.py's allreduce-bench/1 output: two world sizes, four sizes."""
    rows = [allreduce_row(world, size, implementation)
            for world in (2, 4) for implementation in ("gloo", "ring")
            for size in (4096, 65536, 1048576, 16777216)]
    return {"schema": "allreduce-bench/1", "measurements": rows}


# how much longer than the pattern each traced step runs: step 2 is the median-length one
STEP_STRETCHES = (3.0, 1.0, 2.0, 2.5)


def make_trace():
    """Two ranks, four steps each, each step the same pattern stretched by STEP_STRETCHES: backward
    from 2 to 6 ms, bucket 0's all-reduce from 4 to 7 ms (overlapping backward), bucket 1's from 6
    to 8 ms, the optimizer after, to 9 ms."""
    from runtime.timing import chrome_trace

    phases = (("data", 0, 0.001), ("forward", 0.001, 0.002), ("backward", 0.002, 0.006),
              ("sync", 0.006, 0.008), ("optimizer", 0.008, 0.009),
              ("all-reduce bucket 0", 0.004, 0.007), ("all-reduce bucket 1", 0.006, 0.008))
    spans = []
    start = 0.0
    for step, stretch in enumerate(STEP_STRETCHES):
        spans += [(step, name, start + stretch * begin, start + stretch * end)
                  for name, begin, end in phases]
        start += stretch * 0.009
    return chrome_trace([(0.0, spans), (-0.0005, spans)])  # rank 1's clock: half a ms later


def grouped(runs):
    """The runs by configuration, as plots.main passes them to the strategy figures."""
    groups = results_folder.repeats(runs).items()
    return {configuration: group for configuration, group in groups
            if not bucket_variant(configuration)}


def containers(axis):
    """{label: container} of an axis' bars and error bars."""
    return {container.get_label(): container for container in axis.containers}


def write_folder(folder, documents):
    """Each document as folder/run-<index>.json."""
    for index, document in enumerate(documents):
        (folder / f"run-{index}.json").write_text(json.dumps(document))


def timeline():
    """timeline.png's figure of the synthetic trace."""
    return plot_timeline({"trace-bucketed-w2.json": complete_events(trace()["traceEvents"])})
