"""A small, complete results folder for the design-document tests, written by the tests: every
configuration of the sweep repeated, the bucket sweep, both benchmarks and a trace; the emulated
network's all-reduce and SLURM runs (§5.6).

The files are written, and the document built, in a child process with the code under test
(grading/launch.py run_alone): the benchmark's times come from the cost model and the build reads
the models and the cost model's derivations, all task code, never run by the process that decides
the tests. The build renders the submission's templates, whose prose is the student's, and also
templates of the tests' own (SHOWN: one placeholder each), so that the tests read the build's tables
and texts whatever the prose around them."""
import json
import os
from typing import NamedTuple

import numpy as np

from analysis import build_design_doc as builder
from analysis import results_folder
from grading.launch import SANDBOX, run_alone
from runtime.options import MANUAL_CONFIGURATIONS
from runtime.results import SCHEMA
from runtime.timing import FIELDS

SECTIONS = ("README.md", "1-architecture.md", "2-data-flow.md", "3-communication.md",
            "4-performance.md", "5-scalability.md", "6-appendix.md", "7-sharding.md")
# the synthetic all-reduce benchmark: alpha grows with n
ALPHAS = {2: 40e-6, 3: 55e-6, 4: 80e-6}
BETA = 0.6e-9
MISSING_RUN = ("cnn", "flat-ring", 4)  # the synthetic sweep leaves this run out
REPEATS = 3
# Mean seconds per step of each series' compute and communication, relative to the MLP's single
# process. The repeats' noise is small against flat's and per-param's gap (a verdict) and large
# against bucketed's and ddp's (indistinguishable).
SERIES = {"single": (1.0, 0.0, 0.0), "ddp-no-sync": (1.3, 0.0, 0.0), "ddp": (1.3, 0.35, 0.1),
          "per-param": (1.3, 0.9, 0.9), "flat": (1.3, 0.35, 0.35), "bucketed": (1.3, 0.35, 0.12),
          "flat-ring": (1.3, 0.45, 0.45), "flat-shm": (1.3, 0.1, 0.1)}
# (compute, comm busy, comm exposed) x the base
LINK_BETA = 8e-9  # the emulated 1 Gbit/s link's seconds per byte
EMULATED_ALPHA = 300e-6
BASE = {"mlp": 0.008, "cnn": 0.09}
STEPS_PER_EPOCH = 20
BATCH = 64
# The tables and texts the tests read, each rendered alone from a template of the tests' own.
SHOWN = ("table.comm.mlp", "table.comm.cnn", "table.buckets.mlp", "table.fits",
         "table.sweep.mlp", "table.sweep.cnn", "table.pairs", "table.scenarios",
         "table.crossover", "table.emulated.training.mlp",
         "table.emulated.training.cnn", "text.bucket_takeaway")


class SyntheticBuild(NamedTuple):
    """What the `synthetic` fixtures return: a build from the synthetic results."""
    folder: str  # the results folder
    documents: dict  # {file name: text} of the submission's templates, and numbers.json
    shown: dict  # {placeholder of SHOWN: what the build renders for it}


def step_records(model, series, world, rng, steps=12):
    """Per rank, step records whose fields agree as timing.step_record's do."""
    run_factor = rng.uniform(0.97, 1.03)  # the machine's mood during this run: the spread
    compute, busy, exposed = (BASE[model] * factor * run_factor for factor in SERIES[series])
    per_rank = []
    for _ in range(world):
        records = []
        for _ in range(steps):
            jitter = rng.uniform(0.99, 1.01)
            record = {"data": 1e-4, "forward": 0.35 * compute * jitter,
                      "backward": 0.5 * compute * jitter, "optimizer": 0.15 * compute * jitter,
                      "comm_busy": busy * jitter, "comm_exposed": exposed * jitter}
            quiet = series in ("single", "ddp", "ddp-no-sync")  # no sync phase of their own
            record["sync"] = 0.0 if quiet else record["comm_exposed"]
            record["comm_hidden"] = record["comm_busy"] - record["comm_exposed"]
            record["compute"] = record["forward"] + record["backward"] + record["optimizer"]
            record["step"] = record["data"] + record["compute"] + record["comm_exposed"]
            record["own_work"] = record["step"] - record["comm_exposed"]
            records.append(record)
        per_rank.append(records)
    return per_rank


def epoch_record(timing, step, world, throughput):
    """The run's one epoch, its phase totals from the mean step."""
    def total(field):
        return timing["across_ranks"][field]["mean"] * STEPS_PER_EPOCH
    return {"epoch": 1, "steps": STEPS_PER_EPOCH, "train_loss": 0.5, "train_accuracy": 0.8,
            "val_loss": 0.4, "val_accuracy": 0.85, "epoch_time_s": STEPS_PER_EPOCH * step,
            "data_s": total("data"), "compute_s": total("compute"),
            "comm_busy_s": total("comm_busy"), "comm_hidden_s": total("comm_hidden"),
            "comm_exposed_s": total("comm_exposed"),
            "samples_seen": STEPS_PER_EPOCH * BATCH * world,
            "elapsed_s": STEPS_PER_EPOCH * step, "samples_per_s": throughput, "lr": 0.001}


def run_document(model, series, world, seed, bucket_mb=25.0):
    """A results file as mlp_ddp.py writes it (it passes results.validate), summarised by
    timing.summarize_ranks."""
    from runtime.timing import summarize_ranks

    rng = np.random.default_rng(seed)
    timing = summarize_ranks(step_records(model, series, world, rng))
    step = timing["across_ranks"]["step"]["mean"]
    mode, (sync, transport) = ("manual", MANUAL_CONFIGURATIONS[series]) \
        if series in MANUAL_CONFIGURATIONS else (series, ("per-param", None))
    throughput = BATCH * world / step
    quiet = world == 1 or series == "ddp-no-sync"
    timing["all_reduce_layouts"] = [] if quiet else [{"from_step": 0, "bytes": [4096]}]
    return {"schema": SCHEMA, "run_name": f"{model}-{series}-w{world}",
            "created": f"2025-01-01T00:{seed // 60:02d}:{seed % 60:02d}",
            "config": {"mode": mode, "sync": sync, "transport": transport, "bucket_mb": bucket_mb,
                       "compress": None, "model": model, "batch_size": BATCH, "accum_steps": 1,
                       "val_samples": 2000, "warmup_steps": 5,
                       "max_steps": STEPS_PER_EPOCH, "epochs": 1},
            "environment": {"torch": "2.13.0+cpu", "python": "3.11", "backend": "gloo",
                            "device": "cpu", "launcher": "local", "world_size": world,
                            "hosts": ["vm"], "cores": 2, "threads_per_rank": max(1, 2 // world),
                            "parameters": 1},
            "epochs": [epoch_record(timing, step, world, throughput)],
            "test": {"loss": 0.4, "accuracy": 0.85}, "throughput_samples_per_s": throughput,
            "timing": timing, "total_time_s": 1.0}


def allreduce_row(world, size, implementation, time):
    """One allreduce-bench/1 measurement of `time` seconds."""
    algbw = size / time / 1e9
    return {"world_size": world, "bytes": size, "implementation": implementation,
            "iterations": 20, "median_s": time, "p95_s": time * 1.2, "algbw_gbps": algbw,
            "busbw_gbps": algbw * 2 * (world - 1) / world, "verified": True}


def allreduce_bench(noise=0.0, seed=0, alphas=ALPHAS, beta=BETA):
    """The α-β model's times at `alphas` (per world size) and `beta` for gloo, 1.3x those for
    the ring. Run in a child: the cost model is task code."""
    from analysis import cost_model

    rng = np.random.default_rng(seed)
    rows = []
    for world in alphas:
        for size in (4096 * 4**power for power in range(7)):
            for implementation in ("gloo", "ring"):
                time = cost_model.allreduce_time(size, world, alphas[world], beta)
                time *= 1.3 if implementation == "ring" else 1.0
                time *= 1 + noise * rng.standard_normal()
                rows.append(allreduce_row(world, size, implementation, time))
    return {"schema": "allreduce-bench/1", "created": "2025-01-01T00:00:00",
            "config": {"iterations": 20},
            "environment": {"load_average_1min_at_start": 0.5}, "measurements": rows}


# the step benchmark's mean step of each configuration, in ms at 2 ranks: flat-shm is the best
# strategy, clearly faster than ddp and ddp-shm; bucketed is within ddp's noise
STEP_BENCH_MS = {"ddp": 1.0, "ddp-shm": 0.9, "ddp-no-sync": 0.6, "per-param": 1.6, "flat": 1.2,
                 "bucketed": 1.02, "flat-ring": 1.4, "flat-shm": 0.7}
STEP_BENCH_WORLDS = {2: 1.0, 4: 1.5}  # world size -> how much longer every step is
STEP_BENCH_NOISE = (0.0, 0.03, -0.02, 0.01, -0.03)  # relative, cycled over the configurations


def step_bench_rows(repeat, world):
    """One repeat's step-bench/3 measurements at `world` ranks: every field the mean step, each
    ratio to this repeat's ddp."""
    steps = {}
    for index, name in enumerate(STEP_BENCH_MS):
        noise = STEP_BENCH_NOISE[(repeat + index) % len(STEP_BENCH_NOISE)]
        steps[name] = 1e-3 * STEP_BENCH_MS[name] * STEP_BENCH_WORLDS[world] * (1 + noise)
    rows = []
    for name, step in steps.items():
        row = {"repeat": repeat, "world_size": world, "model": "mlp", "parameters": 567434,
               "configuration": name, "steps": 60}
        row.update({f"mean_{field}_s": step for field in FIELDS})
        row.update(p95_step_s=1.2 * step, step_ratio_to_ddp=step / steps["ddp"],
                   overlap=None if name == "ddp-no-sync" else 0.5)
        rows.append(row)
    return rows


def step_bench():
    """benchmarks/step_bench.py's step-bench/3 output: the MLP at 2 and 4 ranks, REPEATS repeats
    of every configuration; its summary and verdict are step_bench.py's own, from these rows. Run
    in a child (write_results): step_bench.py is task code."""
    from benchmarks import step_bench as bench

    rows = [row for repeat in range(1, REPEATS + 1) for world in STEP_BENCH_WORLDS
            for row in step_bench_rows(repeat, world)]
    summary = bench.summarize(rows)
    verdict = {"rule": bench.VERDICT_RULE, "minimum_repeats": bench.MIN_REPEATS,
               "per_world_size_and_model": bench.verdicts(summary)}
    return {"schema": bench.SCHEMA, "created": "2025-01-01T00:00:00",
            "config": {"repeats": REPEATS}, "measurements": rows, "summary": summary,
            "verdict": verdict}


# DDP's buckets as benchmarks/ddp_buckets.py records them: {model: {bucket MiB: layouts}}
DDP_BUCKETS = {"mlp": {"25": [[2269736]], "4": [[2269736]], "1": [[2269736]],
                       "0.25": [[2269736], [662056, 1607680]]},
               "cnn": {"25": [[4799528]], "4": [[4799528], [4724264, 75264]],
                       "1": [[4799528], [4724264, 75264]], "0.25": [[4799528], [4724264, 75264]]}}


def ddp_buckets():
    """results/ddp-buckets.json (ddp-buckets/2): each layout from the step it was first sent."""
    layouts = [{"model": model, "bucket_mb": float(cap),
                "history": [{"from_step": step, "bytes": sizes}
                            for step, sizes in enumerate(history)]}
               for model, per_cap in DDP_BUCKETS.items() for cap, history in per_cap.items()]
    return {"schema": "ddp-buckets/2", "environment": {"torch": "2.13.0+cpu"},
            "layouts": layouts}


LATE_RANK_S = 1e-3  # how much later than rank 0 the synthetic trace's rank 1 starts each step


def trace():
    """Two ranks, steps 5-7: the phases, and two buckets' all-reduces, one overlapping backward;
    rank 1 LATE_RANK_S behind rank 0."""
    from runtime.timing import chrome_trace

    phases = (("data", 0, 1), ("forward", 1, 4), ("backward", 4, 9), ("sync", 9, 11),
              ("optimizer", 11, 12))
    spans = []
    for step in (5, 6, 7):
        start = step * 0.02
        for name, begin, end in phases:
            spans.append((step, name, start + begin * 1e-3, start + end * 1e-3))
        spans += [(step, "all-reduce bucket 0", start + 6e-3, start + 8e-3),
                  (step, "all-reduce bucket 1", start + 9e-3, start + 11e-3)]
    return chrome_trace([(0.0, spans), (-LATE_RANK_S, spans)])  # rank 1 starts every step late


def write(path, document):
    """`document` as JSON at `path` (its folder made if missing)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as file:
        json.dump(document, file)


def nudge_allreduce_times(folder, change, rows=slice(None)):
    """Apply `change` to the times of the all-reduce benchmark in `folder` (the fits' input), to
    its measurements `rows`."""
    path = os.path.join(folder, "allreduce-bench.json")
    with open(path) as file:
        bench = json.load(file)
    for row in bench["measurements"][rows]:
        row["median_s"] = change(row["median_s"])
    write(path, bench)


def sweep_configurations():
    """(series, world) of the sweep: the single process, then every series at 2 and 4 ranks."""
    return [("single", 1)] + [(series, world) for world in (2, 4) for series in SERIES
                              if series not in ("single", "flat-shm")]  # flat-shm: the step bench


def make_results(folder, bench=True, noise=0.0):
    """write_results(folder, bench, noise) in a child; returns `folder`."""
    return run_alone(write_results, folder, bench, noise)


def write_results(folder, bench=True, noise=0.0):
    """Every configuration REPEATS times, interleaved as sweep.py runs them, named as it names
    them; the all-reduce benchmark's times with relative Gaussian `noise`."""
    os.makedirs(folder, exist_ok=True)
    seed = 0
    for repeat in range(1, REPEATS + 1):
        for model in ("mlp", "cnn"):
            for series, world in sweep_configurations():
                if (model, series, world) == MISSING_RUN:
                    continue
                seed += 1
                manual = "manual-" if series in MANUAL_CONFIGURATIONS else ""
                name = f"sweep-{model}-{manual}{series}-w{world}-r{repeat}"
                write(os.path.join(folder, name + ".json"),
                      run_document(model, series, world, seed))
        for size in (0.25, 1.0, 25.0):
            for series in ("bucketed", "ddp"):
                seed += 1
                write(os.path.join(folder, f"bucket-mlp-{series}-{size:g}mb-w4-r{repeat}.json"),
                      run_document("mlp", series, 4, seed, bucket_mb=size))
    if bench:
        write(os.path.join(folder, "allreduce-bench.json"), allreduce_bench(noise=noise))
    emulated_results(folder)
    write(os.path.join(folder, "step-bench.json"), step_bench())
    write(os.path.join(folder, "ddp-buckets.json"), ddp_buckets())
    write(os.path.join(folder, "trace-bucketed-w2.json"), trace())
    for model in ("mlp", "cnn"):
        write(os.path.join(folder, f"backward-{model}.json"), backward_trace(model))
    return folder


def backward_trace(model):
    """A traced single process of `model` (results/backward-<model>.json): steps 5-7, each a 10 ms
    backward whose gradients arrive last parameter first, each at its backward_share."""
    from runtime.models import build_model
    from runtime.timing import chrome_trace

    names = [name for name, parameter in build_model(model).named_parameters()
             if parameter.requires_grad]
    spans = []
    for step in (5, 6, 7):
        start = step * 0.1
        spans.append((step, "backward", start, start + 0.01))
        for index, name in enumerate(reversed(names)):
            ready = start + 0.01 * backward_share(index, len(names))
            spans.append((step, f"gradient {name}", ready, ready))
    return chrome_trace([(0.0, spans)])


def backward_share(index, count):
    """The share of backward at which the `index`-th of `count` gradients is ready, in the order
    backward produces them: evenly, the last at backward's end."""
    return (index + 1) / count


def emulated_results(folder):
    """§5.6's inputs: the all-reduce on shaped links (gloo exactly the α-β model at the link's β),
    and the SLURM runs of 2 nodes x 1 and x 2, repeated."""
    emulated = os.path.join(folder, "emulated")
    alphas = {2: EMULATED_ALPHA, 4: 2 * EMULATED_ALPHA}
    write(os.path.join(emulated, "allreduce-1gbit.json"),
          allreduce_bench(alphas=alphas, beta=LINK_BETA))
    write(os.path.join(emulated, "allreduce-1gbit-2pn.json"),
          allreduce_bench(alphas={4: EMULATED_ALPHA}, beta=LINK_BETA))
    seed = 1000
    for repeat in range(1, REPEATS + 1):
        for model in ("mlp", "cnn"):
            for series in ("ddp", "per-param", "flat", "bucketed"):
                for world in (2, 4):
                    seed += 1
                    write(os.path.join(folder, "slurm", "link-1gbit",
                                       f"slurm-{model}-{series}-w{world}-r{repeat}.json"),
                          run_document(model, series, world, seed))


def write_and_build(folder, out_dir, shown_dir):
    """write_results(folder), then the document built from it for `out_dir`, and SHOWN rendered
    from templates written to `shown_dir`: (documents, shown). Run in a child."""
    write_results(folder)
    documents = builder.build(folder, out_dir)
    os.makedirs(shown_dir, exist_ok=True)
    for name in SHOWN:
        with open(os.path.join(shown_dir, f"{name}.md"), "w") as file:
            file.write(f"{{{{ {name} }}}}\n")
    builder.TEMPLATES = shown_dir
    builder.DATA_TABLES = {}  # the tables as Markdown, whatever the document links as CSV
    shown = builder.build(folder, out_dir)
    return documents, {name: shown[f"{name}.md"] for name in SHOWN}


BUILT = {}  # the session's temporary folder -> its SyntheticBuild, which no test changes


def build_synthetic(tmp_path_factory):
    """The SyntheticBuild that the `synthetic` fixtures return: built once per session."""
    session = str(tmp_path_factory.getbasetemp())
    if session not in BUILT:
        folder = str(tmp_path_factory.mktemp("results"))
        shown_dir = str(tmp_path_factory.mktemp("shown"))
        # the document's place in the submission: its figure links are relative to it
        documents, shown = run_alone(write_and_build, folder,
                                     os.path.join(SANDBOX, "design_doc"), shown_dir)
        BUILT[session] = SyntheticBuild(folder, documents, shown)
    return BUILT[session]


def no_notes(note):
    """results_folder.load_folder's notes, unwanted here."""


def spreads_from(folder):
    """{(model, series, world): the step spread over repeats}, by the loader the plots use."""
    runs, _ = results_folder.load_folder(folder, note=no_notes)
    spreads = {}
    for configuration, group in results_folder.repeats(runs, "sweep").items():
        model, series, world, bucket_mb = configuration
        if bucket_mb == 25.0:
            spreads[(model, series, world)] = results_folder.across_repeats(group)
    return spreads


def numbers_of(documents):
    """numbers.json's registry of a build."""
    return json.loads(documents["numbers.json"])["numbers"]
