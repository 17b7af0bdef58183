"""The design document is built from the results files, every number in it can be traced back to one,
and the cost model behind its analysis recovers what it is given."""
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch.distributed as dist

from analysis import build_design_doc as builder
from analysis import cost_model
from manual_allreduce import STRATEGIES
from runtime import results
from runtime.models import build_model
from runtime.results import SCHEMA, validate
from runtime.timing import FIELDS, chrome_trace, summarize_ranks

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = ("README.md", "1-architecture.md", "2-data-flow.md", "3-communication.md", "4-performance.md",
            "5-scalability.md", "6-appendix.md")
ALPHAS, BETA = {2: 40e-6, 3: 55e-6, 4: 80e-6}, 0.6e-9  # the synthetic all-reduce benchmark: alpha grows with n
MISSING_RUN = ("cnn", "ring", 4)  # the synthetic sweep leaves this run out


# --- A small, complete results folder, written by the test ------------------------------------------

REPEATS = 3
# Mean seconds per step of each series' compute and communication, relative to the MLP's single process. The
# repeats' noise is small against flat's and per-param's gap (a verdict) and large against bucketed's and
# ddp's (indistinguishable).
SERIES = {"single": (1.0, 0.0, 0.0), "ddp-no-sync": (1.3, 0.0, 0.0), "ddp": (1.3, 0.35, 0.1),
          "per-param": (1.3, 0.9, 0.9), "flat": (1.3, 0.35, 0.35), "bucketed": (1.3, 0.35, 0.12),
          "ring": (1.3, 0.45, 0.45)}  # (compute, comm busy, comm exposed) x the base
BASE = {"mlp": 0.008, "cnn": 0.09}


def step_records(model, series, world, rng, steps=12):
    """Per rank, step records whose fields agree as timing.step_record's do."""
    run_factor = rng.uniform(0.97, 1.03)  # the machine's mood during this run: the spread over repeats
    compute, busy, exposed = (BASE[model] * factor * run_factor for factor in SERIES[series])
    per_rank = []
    for _ in range(world):
        records = []
        for _ in range(steps):
            jitter = rng.uniform(0.99, 1.01)
            record = {"data": 1e-4, "forward": 0.35 * compute * jitter, "backward": 0.5 * compute * jitter,
                      "optimizer": 0.15 * compute * jitter, "comm_busy": busy * jitter, "comm_exposed": exposed * jitter}
            record["sync"] = 0.0 if series in ("single", "ddp", "ddp-no-sync") else record["comm_exposed"]
            record["comm_hidden"] = record["comm_busy"] - record["comm_exposed"]
            record["compute"] = record["forward"] + record["backward"] + record["optimizer"]
            record["step"] = record["data"] + record["compute"] + record["comm_exposed"]
            record["own_work"] = record["step"] - record["comm_exposed"]
            records.append(record)
        per_rank.append(records)
    return per_rank


def run_document(model, series, world, seed, bucket_mb=25.0):
    """A results file as mlp_ddp.py writes it (it passes results.validate), summarised by timing.summarize_ranks."""
    rng = np.random.default_rng(seed)
    per_rank = step_records(model, series, world, rng)
    timing = summarize_ranks(per_rank)
    step = timing["across_ranks"]["step"]["mean"]
    mode, sync = ("manual", series) if series in STRATEGIES else (series, "per-param")
    throughput = 64 * world / step
    mean = lambda field: timing["across_ranks"][field]["mean"] * 20  # noqa: E731
    epoch = {"epoch": 1, "steps": 20, "train_loss": 0.5, "train_accuracy": 0.8, "val_loss": 0.4, "val_accuracy": 0.85,
             "epoch_time_s": 20 * step, "data_s": mean("data"), "compute_s": mean("compute"),
             "comm_busy_s": mean("comm_busy"), "comm_hidden_s": mean("comm_hidden"),
             "comm_exposed_s": mean("comm_exposed"), "samples_seen": 20 * 64 * world, "elapsed_s": 20 * step,
             "samples_per_s": throughput, "lr": 0.001}
    if series == "ddp":
        timing["ddp_runtime_statistics"] = [{"backward_compute_s": 0.004, "backward_comm_s": 0.003,
                                             "backward_overlap_s": 0.002, "exposed_s": 0.001}] * world
    return {"schema": SCHEMA, "run_name": f"{model}-{series}-w{world}", "created": f"2025-01-01T00:{seed // 60:02d}:{seed % 60:02d}",
            "config": {"mode": mode, "sync": sync, "bucket_mb": bucket_mb, "compress": None, "model": model,
                       "batch_size": 64, "accum_steps": 1, "calibrate_every": 25, "val_samples": 2000, "warmup_steps": 5, "max_steps": 20,
                       "epochs": 1},
            "environment": {"torch": "2.13.0+cpu", "python": "3.11", "backend": "gloo", "device": "cpu",
                            "launcher": "local", "world_size": world, "hosts": ["vm"], "cores": 2,
                            "threads_per_rank": max(1, 2 // world), "parameters": 1},
            "epochs": [epoch], "test": {"loss": 0.4, "accuracy": 0.85}, "throughput_samples_per_s": throughput,
            "timing": timing, "total_time_s": 1.0}


def allreduce_bench(noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for world in (2, 3, 4):
        for size in (4096 * 4**k for k in range(7)):
            for implementation in ("gloo", "ring"):
                time = cost_model.allreduce_time(size, world, ALPHAS[world], BETA) * (1.3 if implementation == "ring" else 1.0)
                time *= 1 + noise * rng.standard_normal()
                algbw = size / time / 1e9
                rows.append({"world_size": world, "bytes": size, "implementation": implementation, "iterations": 20,
                             "median_s": time, "p95_s": time * 1.2, "algbw_gbps": algbw,
                             "busbw_gbps": algbw * 2 * (world - 1) / world, "verified": True})
    return {"schema": "allreduce-bench/1", "created": "2025-01-01T00:00:00", "config": {"iterations": 20},
            "environment": {"load_average_1min_at_start": 0.5}, "measurements": rows}


def step_bench():
    rows = []
    for i, name in enumerate(["ddp", "ddp-no-sync", "per-param", "flat", "bucketed", "ring"]):
        row = {"world_size": 2, "model": "mlp", "configuration": name, "steps": 60,
               **{f"mean_{field}_s": 0.001 * (i + 1) for field in FIELDS}, "overlap": None if i == 1 else 0.5,
               "step_ratio_to_ddp": 1 + 0.1 * i}
        rows.append(row)
    return {"schema": "step-bench/2", "created": "2025-01-01T00:00:00", "measurements": rows}


def trace():
    spans = []
    for step in (5, 6, 7):
        t = step * 0.02
        for name, start, end in (("data", 0, 1), ("forward", 1, 4), ("backward", 4, 9), ("sync", 9, 11), ("optimizer", 11, 12)):
            spans.append((step, name, t + start * 1e-3, t + end * 1e-3))
        spans += [(step, "all-reduce bucket 0", t + 6e-3, t + 8e-3), (step, "all-reduce bucket 1", t + 9e-3, t + 11e-3)]
    return chrome_trace([(0.0, spans), (0.0, spans)])


def write(path, document):
    with open(path, "w") as file:
        json.dump(document, file)


def make_results(folder, bench=True):
    """Every configuration REPEATS times, interleaved as sweep.py runs them, named as it names them."""
    os.makedirs(folder, exist_ok=True)
    seed = 0
    for repeat in range(1, REPEATS + 1):
        for model in ("mlp", "cnn"):
            for series, world in [("single", 1)] + [(s, w) for w in (2, 4) for s in SERIES if s != "single"]:
                if (model, series, world) != MISSING_RUN:
                    seed += 1
                    name = f"sweep-{model}-{'manual-' if series in STRATEGIES else ''}{series}-w{world}-r{repeat}"
                    write(os.path.join(folder, name + ".json"), run_document(model, series, world, seed))
        for mb in (0.25, 1.0, 25.0):
            for series in ("bucketed", "ddp"):
                seed += 1
                write(os.path.join(folder, f"bucket-mlp-{series}-{mb:g}mb-w4-r{repeat}.json"),
                      run_document("mlp", series, 4, seed, bucket_mb=mb))
    if bench:
        write(os.path.join(folder, "allreduce-bench.json"), allreduce_bench())
    write(os.path.join(folder, "step-bench.json"), step_bench())
    write(os.path.join(folder, "trace-bucketed-w2.json"), trace())
    return folder


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """(results folder, {file name: text}) of a build from the synthetic results."""
    folder = make_results(str(tmp_path_factory.mktemp("results")))
    return folder, builder.build(folder, os.path.join(REPO, "design_doc"))


def build_cli(*args):
    return subprocess.run([sys.executable, "-m", "analysis.build_design_doc", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


# --- The build --------------------------------------------------------------------------------------

def test_the_synthetic_results_are_valid_results_files(synthetic):
    folder, _ = synthetic
    for name in os.listdir(folder):
        if name.startswith(("sweep-", "bucket-")):
            with open(os.path.join(folder, name)) as file:
                assert validate(json.load(file)) == [], name


def test_every_section_exists_with_its_tables_and_numbers(synthetic):
    _, documents = synthetic
    assert set(SECTIONS) | {"numbers.json"} <= set(documents)
    numbers = json.loads(documents["numbers.json"])["numbers"]
    text = lambda name: numbers[name]["text"]
    architecture, flow, comm, performance, scaling, appendix = (documents[name] for name in SECTIONS[1:])
    assert text("model.mlp.parameters") == "567,434" and text("model.mlp.bytes") == "2.27 MB"
    assert numbers["model.cnn.parameters"]["value"] == sum(p.numel() for p in build_model("cnn").parameters())
    assert "```mermaid" in architecture and "torchrun" in architecture and "SLURM_PROCID" in architecture
    assert "shard_indices" in flow and "```mermaid" in flow
    per_param_row = next(line for line in comm.splitlines() if line.startswith("| per-param |"))
    assert per_param_row.split(" | ")[1] == str(len(list(build_model("mlp").parameters())))
    assert "| ring | 1 | 2 |" in comm  # one all-reduce, 2(n-1) = 2 message steps at n = 2
    assert text("comm.mlp.flat.w4.bytes_per_rank") in comm and "all-reduce bucket 0" in comm
    for name in ("fit.gloo.w2.alpha_s", "fit.gloo.alpha_s", "fit.ring.bandwidth"):
        assert text(name) in performance, name
    assert text("sweep.mlp.flat.w4.step.median") in performance
    assert "| manual ring | 4 |" in performance and "not measured" in performance  # the CNN's ring at 4 ranks
    for link in ("10 Gbit/s", "25 Gbit/s", "100 Gbit/s"):
        assert link in scaling
    assert text("project.cnn.100g.n256.efficiency") in scaling and text("published.ddp_gpus") == "256"
    assert not any(re.search(r"\{\{", documents[name].replace("`{{ name }}`", "")) for name in SECTIONS)


def test_a_missing_run_is_not_measured_and_listed_as_such(synthetic):
    _, documents = synthetic
    absent = json.loads(documents["numbers.json"])["not_measured"]
    model, series, world = MISSING_RUN
    assert f"sweep.{model}.{series}.w{world}.step.median" in absent
    row = next(line for line in documents["4-performance.md"].split("**CNN** (")[1].splitlines()
               if line.startswith(f"| manual {series} | {world} |"))
    assert row.count("not measured") >= 5


def resolve(field_path, data):
    """An independent reading of 'a.b[3].c' paths."""
    for part in field_path.replace("[", ".[").split("."):
        data = data[int(part[1:-1])] if part.startswith("[") else data[part]
    return data


def assert_traceable(numbers_json, base):
    numbers = numbers_json["numbers"]
    kinds = {entry["kind"] for entry in numbers.values()}
    assert {"measured", "derived", "fit", "model", "assumption", "publication"} <= kinds
    for name, entry in numbers.items():
        if entry["kind"] == "measured":
            with open(os.path.join(base, entry["file"])) as file:
                assert resolve(entry["field"], json.load(file)) == entry["value"], name
        elif entry["kind"] == "derived":
            for source in entry["inputs"]:
                if "#" in source:
                    path, field = source.split("#")
                    with open(os.path.join(base, path)) as file:
                        resolve(field, json.load(file))
                else:
                    assert source in numbers or source in numbers_json["not_measured"], f"{name}: unknown input {source}"
        elif entry["kind"] == "fit":
            with open(os.path.join(base, entry["file"])) as file:
                rows = [m for m in json.load(file)["measurements"]
                        if m["implementation"] == entry["implementation"] and m["verified"]
                        and m["world_size"] == entry.get("world_size", m["world_size"])]
            fit = cost_model.fit_alpha_beta(*zip(*[(m["world_size"], m["bytes"], m["median_s"]) for m in rows]))
            field = {"alpha_s": "alpha", "beta_s_per_byte": "beta", "bandwidth": "bandwidth_gbps",
                     "median_relative_error": "median_relative_error", "max_relative_error": "max_relative_error",
                     "r2": "r2", "points": "points"}[name.split(".")[-1]]
            assert getattr(fit, field) == pytest.approx(entry["value"], rel=1e-9), name
        elif entry["kind"] == "file":
            assert os.path.exists(os.path.join(base, entry["file"])), name
        else:
            assert entry["kind"] in ("model", "code", "assumption", "publication") and (
                entry.get("source") or entry.get("formula")), name


def test_every_number_traces_to_a_field_of_its_results_file(synthetic):
    _, documents = synthetic
    assert_traceable(json.loads(documents["numbers.json"]), REPO)


COMMITTED = os.path.join(REPO, "design_doc", "numbers.json")
RESULTS = os.path.join(REPO, "results")
HAVE_RESULTS = os.path.exists(os.path.join(RESULTS, "allreduce-bench.json")) and any(
    name.startswith("sweep-") for name in (os.listdir(RESULTS) if os.path.isdir(RESULTS) else []))


@pytest.mark.skipif(not HAVE_RESULTS, reason="no results/sweep-*.json and results/allreduce-bench.json yet")
def test_the_committed_document_is_exactly_what_the_build_makes_from_the_committed_results():
    completed = build_cli("--check")
    assert completed.returncode == 0, completed.stderr  # a stale or missing document: python -m analysis.build_design_doc
    with open(COMMITTED) as file:
        assert_traceable(json.load(file), REPO)


def test_check_reports_a_stale_document_in_one_line_and_exits_1(synthetic, tmp_path):
    folder, _ = synthetic
    out = str(tmp_path / "doc")
    assert build_cli("--results-dir", folder, "--out-dir", out).returncode == 0
    assert build_cli("--results-dir", folder, "--out-dir", out, "--check").returncode == 0
    with open(os.path.join(out, "4-performance.md"), "a") as file:
        file.write("a hand edit\n")
    completed = build_cli("--results-dir", folder, "--out-dir", out, "--check")
    assert completed.returncode == 1
    assert completed.stderr.count("\n") == 1 and "4-performance.md (1 lines)" in completed.stderr


@pytest.mark.parametrize("remove, message", [
    ("allreduce-bench.json", "allreduce-bench.json not found"),
    ("sweep-", "no training runs with more than one rank"),
    ("everything", "not found"),
])
def test_a_missing_results_file_is_one_clear_line_not_a_traceback(tmp_path, remove, message):
    folder = make_results(str(tmp_path / "results"))
    for name in os.listdir(folder):
        if name.startswith(remove):
            os.remove(os.path.join(folder, name))
    if remove == "sweep-":  # the bucket runs are training runs too
        for name in os.listdir(folder):
            if name.startswith("bucket-"):
                os.remove(os.path.join(folder, name))
    if remove == "everything":
        folder = str(tmp_path / "nowhere")
    completed = build_cli("--results-dir", folder, "--out-dir", str(tmp_path / "doc"))
    assert completed.returncode == 2 and message in completed.stderr
    assert completed.stderr.count("\n") == 1 and "Traceback" not in completed.stderr


def test_a_placeholder_the_build_does_not_define_fails_the_build(synthetic, tmp_path, monkeypatch):
    folder, _ = synthetic
    (tmp_path / "bad.md").write_text("S = {{ model.mlp.bytes }}, T = {{ a.number.nobody.made }}\n")
    monkeypatch.setattr(builder, "TEMPLATES", str(tmp_path))
    with pytest.raises(builder.BuildError, match="a.number.nobody.made"):
        builder.build(folder, str(tmp_path))


NUMBER_WITH_UNIT = re.compile(r"\d[\d,.]*\s*(?:%|ms|µs|s\b|kB|MB|GB|Gbit|samples|ranks|GPUs|×)")


@pytest.mark.parametrize("template", SECTIONS)
def test_no_template_types_a_measured_number_by_hand(template):
    with open(os.path.join(builder.TEMPLATES, template)) as file:
        prose = file.read()
    prose = re.sub(r"```.*?```", "", prose, flags=re.S)  # code and diagrams: commands and schematic units
    prose = re.sub(r"`[^`]*`|\{\{[^}]*\}\}|\[[^\]]*\]\([^)]*\)|§[\d.]+|^#+ [\d.]+", "", prose, flags=re.M)
    assert NUMBER_WITH_UNIT.findall(prose) == []
    assert re.findall(r"\b\d+\.\d+\b", prose) == []


# --- The claims: recomputed from the results, not only checked to exist ------------------------------

def spreads_from(folder):
    """{(model, series, world): the step spread over repeats}, by the loader the plots use."""
    runs, _ = results.load_folder(folder, note=lambda line: None)
    return {config[:3]: results.across_repeats(group) for config, group in results.repeats(runs).items()
            if config[3] == 25.0}


def test_the_synthetic_steps_add_up_as_timing_records_do(synthetic):
    folder, _ = synthetic
    runs, _ = results.load_folder(folder, note=lambda line: None)
    for run in runs:
        means = results.per_step(run)
        # data + compute + exposed == step, and 0 <= hidden <= busy <= step, as timing.step_record makes them
        assert means["data"] + means["compute"] + means["comm_exposed"] == pytest.approx(means["step"])
        assert 0 <= means["comm_hidden"] <= means["comm_busy"] <= means["step"]
        if results.series_name(run) in ("single", "ddp-no-sync"):
            assert means["comm_busy"] == 0 and means["overlap"] is None
    # at least three repeats of every configuration, the compute baseline included
    counts = {config: len(group) for config, group in results.repeats(runs).items()}
    assert min(counts.values()) >= REPEATS and any(config[1] == "ddp-no-sync" for config in counts)


PAIR_ROW = re.compile(r"^\| (MLP|CNN) \| (\d+) \| [^|]+ \| [^|]+ \| (.+) \|$")


def test_a_strategy_is_called_faster_only_where_clearly_less_holds_and_indistinguishable_otherwise(synthetic):
    folder, documents = synthetic
    spreads, performance = spreads_from(folder), documents["4-performance.md"]
    claims = [PAIR_ROW.match(line).groups() for line in performance.splitlines() if PAIR_ROW.match(line)]
    assert [claim for _, _, claim in claims].count("manual ring or manual flat not measured") == 1  # the CNN's ring
    claims = [claim for claim in claims if not claim[2].endswith("not measured")]
    assert len(claims) == 2 * 2 * 4 - 1  # models x world sizes x pairs, less the CNN's missing ring
    said = {"faster": 0, "indistinguishable": 0}
    for model, world, claim in claims:
        step = lambda series: spreads[(model.lower(), series, int(world))]["step"]  # noqa: E731
        if " is faster than " in claim:
            faster, slower = claim.split(" is faster than ")
            # the claim is made only where the gap of medians exceeds both spreads
            assert results.clearly_less(step(faster), step(slower)), claim
            said["faster"] += 1
        else:
            first, second = claim.removesuffix(" are indistinguishable on this machine").split(" and ")
            # indistinguishable: neither is clearly less than the other
            assert not results.clearly_less(step(first), step(second)), claim
            assert not results.clearly_less(step(second), step(first)), claim
            said["indistinguishable"] += 1
    assert said["faster"] and said["indistinguishable"]  # the synthetic results exercise both verdicts


def test_the_verdicts_against_the_smallest_median_and_the_summary_follow_the_spreads(synthetic):
    folder, documents = synthetic
    spreads, numbers = spreads_from(folder), json.loads(documents["numbers.json"])["numbers"]
    for model in ("mlp", "cnn"):
        for world in (2, 4):
            mine = {s: v["step"] for (m, s, w), v in spreads.items() if (m, w) == (model, world)
                    and s not in ("ddp-no-sync",)}
            fastest = min(mine, key=lambda s: mine[s]["median"])
            assert numbers[f"sweep.{model}.w{world}.fastest"]["value"] == fastest
            for series, step in mine.items():
                if series != fastest:
                    verdict = numbers[f"verdict.{model}.w{world}.{series.replace('manual ', '')}"]["value"]
                    assert verdict == ("slower" if results.clearly_less(mine[fastest], step) else "indistinguishable")
        summary = numbers[f"sweep.{model}.summary"]["text"]
        assert summary in documents["README.md"] and summary in documents["4-performance.md"]


def test_efficiency_ceiling_and_overlap_are_recomputed_from_the_results(synthetic):
    folder, documents = synthetic
    spreads, numbers = spreads_from(folder), json.loads(documents["numbers.json"])["numbers"]
    value = lambda name: numbers[name]["value"]  # noqa: E731
    for model in ("mlp", "cnn"):
        single = spreads[(model, "single", 1)]["throughput"]["median"]
        for world in (2, 4):
            base = spreads[(model, "ddp-no-sync", world)]
            # ceiling: the compute baseline's throughput over n single processes'
            assert value(f"ceiling.{model}.w{world}") == pytest.approx(base["throughput"]["median"] / (world * single))
            for series in ("ddp", "manual flat", "manual bucketed"):
                measured, name = spreads[(model, series, world)], f"sweep.{model}.{series.replace('manual ', '')}.w{world}"
                assert value(f"{name}.efficiency") == pytest.approx(measured["throughput"]["median"] / (world * single))
                assert value(f"{name}.overlap.median") == pytest.approx(measured["overlap"]["median"])
                assert value(f"{name}.step.min") == measured["step"]["min"]


# --- The cost model ---------------------------------------------------------------------------------

def synthetic_points(alpha, beta, noise, seed=0):
    rng = np.random.default_rng(seed)
    worlds, sizes = np.meshgrid([2, 3, 4, 8], 4096 * 4.0 ** np.arange(8))
    worlds, sizes = worlds.ravel(), sizes.ravel()
    times = np.array([cost_model.allreduce_time(s, w, alpha, beta) for s, w in zip(sizes, worlds)])
    return worlds, sizes, times * (1 + noise * rng.standard_normal(len(times)))


def test_the_fit_recovers_alpha_and_beta_exactly_from_exact_data():
    fit = cost_model.fit_alpha_beta(*synthetic_points(25e-6, 0.8e-9, noise=0.0))
    assert fit.alpha == pytest.approx(25e-6, rel=1e-9) and fit.beta == pytest.approx(0.8e-9, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0) and fit.median_relative_error < 1e-9
    assert fit.bandwidth_gbps == pytest.approx(1 / 0.8e-9 / 1e9)


@pytest.mark.parametrize("seed", range(3))
def test_the_fit_recovers_alpha_and_beta_within_a_few_percent_under_small_noise(seed):
    fit = cost_model.fit_alpha_beta(*synthetic_points(25e-6, 0.8e-9, noise=0.02, seed=seed))
    assert fit.alpha == pytest.approx(25e-6, rel=0.05) and fit.beta == pytest.approx(0.8e-9, rel=0.05)
    assert fit.r2 > 0.99 and 0 < fit.median_relative_error < 0.05


def test_the_fit_never_returns_a_negative_latency_or_bandwidth():
    worlds, sizes, _ = synthetic_points(0, 1e-9, noise=0.0)
    times = 2 * (worlds - 1) / worlds * sizes * 1e-9 - 1e-7  # below a pure-bandwidth line: alpha would go negative
    fit = cost_model.fit_alpha_beta(worlds, sizes, np.abs(times))
    assert fit.alpha >= 0 and fit.beta > 0


def test_the_build_fits_each_world_size_alone_and_recovers_its_alpha(synthetic):
    _, documents = synthetic
    numbers = json.loads(documents["numbers.json"])["numbers"]
    for world, alpha in ALPHAS.items():
        assert numbers[f"fit.gloo.w{world}.alpha_s"]["value"] == pytest.approx(alpha, rel=1e-6)
        assert numbers[f"fit.gloo.w{world}.beta_s_per_byte"]["value"] == pytest.approx(BETA, rel=1e-6)
        assert numbers[f"fit.ring.w{world}.alpha_s"]["value"] == pytest.approx(1.3 * alpha, rel=1e-6)
    # One fit of every world size cannot follow a growing alpha: its residuals say so, the per-world ones are zero.
    assert numbers["fit.gloo.max_relative_error"]["value"] > 0.01
    assert numbers["fit.gloo.w4.max_relative_error"]["value"] < 1e-6
    # The projections start from the smallest world size's fit.
    assert numbers["fit.projection.alpha_s"]["value"] == pytest.approx(ALPHAS[2], rel=1e-6)


def test_the_appendix_shows_every_benchmark_point_with_its_relative_error(synthetic):
    folder, documents = synthetic
    numbers = json.loads(documents["numbers.json"])["numbers"]
    with open(os.path.join(folder, "allreduce-bench.json")) as file:
        rows = json.load(file)["measurements"]
    for m in rows:
        name = f"allreduce.w{m['world_size']}.{m['implementation']}.{m['bytes']}"
        fit = lambda field: numbers[f"fit.{m['implementation']}.{field}"]["value"]  # noqa: E731 (all world sizes)
        model = cost_model.allreduce_time(m["bytes"], m["world_size"], fit("alpha_s"), fit("beta_s_per_byte"))
        assert numbers[f"{name}.all_error"]["value"] == pytest.approx((model - m["median_s"]) / m["median_s"])
        assert numbers[f"{name}.all_error"]["text"] in documents["6-appendix.md"]


@pytest.mark.parametrize("model", ["mlp", "cnn"])
@pytest.mark.parametrize("bucket_mb", [0.25, 1, 4, 25])
def test_bucket_layouts_are_those_of_bucketed_sync_and_of_torch_ddp(model, bucket_mb):
    from manual_allreduce import BucketedSync
    params = list(build_model(model).parameters())
    sizes = [p.numel() * p.element_size() for p in params]
    limits = [int(cost_model.DDP_FIRST_BUCKET_MB * 2**20), int(bucket_mb * 2**20)]
    groups, _ = dist._compute_bucket_assignment_by_size(params, limits, [False] * len(params))
    assert cost_model.ddp_bucket_sizes(sizes, bucket_mb) == [sum(sizes[i] for i in group) for group in reversed(groups)]
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        buckets = BucketedSync(params, bucket_mb).buckets
    finally:
        dist.destroy_process_group()
    first = builder.bucketed_first_bucket_mb(builder.Numbers())  # the cap BucketedSync has, if any
    assert cost_model.bucket_sizes(sizes, bucket_mb, first) == [b.buffer.numel() * b.buffer.element_size() for b in buckets]


def test_overlap_hides_all_but_what_is_left_after_backward():
    # One bucket: nothing overlaps. Two equal buckets, instant compute of the first half: the first hides.
    assert cost_model.exposed_after_backward(1.0, [100], [0.3]) == pytest.approx(0.3)
    assert cost_model.exposed_after_backward(1.0, [50, 50], [0.3, 0.3]) == pytest.approx(0.3)
    assert cost_model.exposed_after_backward(1.0, [50, 50], [0.8, 0.3]) == pytest.approx(0.6)  # the first runs past backward
    flat = cost_model.project_step(0.01, 0.005, [10**6] * 4, 16, 25e-6, 1e-9)
    assert flat["exposed_s"] == pytest.approx(cost_model.allreduce_time(4 * 10**6, 16, 25e-6, 1e-9))
    assert flat["efficiency"] == pytest.approx(0.01 / (0.01 + flat["exposed_s"]))


@pytest.mark.parametrize("world, steps", [(2, 2), (4, 4), (5, 6), (256, 16)])
def test_halving_doubling_pays_2_log2_n_message_steps_and_the_rings_bandwidth_term(world, steps):
    ring_a, ring_b = cost_model.ring_coefficients(world)
    a, b = cost_model.halving_doubling_coefficients(world)
    assert a == steps and b == pytest.approx(ring_b)
    # with no latency the two cost the same; with latency halving-doubling is never slower
    assert cost_model.allreduce_time(10**6, world, 0, 1e-9, "halving-doubling") == pytest.approx(cost_model.allreduce_time(10**6, world, 0, 1e-9))
    assert cost_model.allreduce_time(10**6, world, 25e-6, 1e-9, "halving-doubling") <= cost_model.allreduce_time(10**6, world, 25e-6, 1e-9)


def test_projections_lay_out_buckets_as_the_code_does():
    import inspect

    from manual_allreduce import BucketedSync
    # the cost model's default first bucket is BucketedSync's, so every projection uses the layout training uses
    assert inspect.signature(BucketedSync).parameters["first_bucket_mb"].default == cost_model.FIRST_BUCKET_MB
    sizes = [p.numel() * p.element_size() for p in build_model("mlp").parameters()]
    assert cost_model.bucket_sizes(sizes, 25)[0] <= cost_model.FIRST_BUCKET_MB * 2**20 or len(cost_model.bucket_sizes(sizes, 25)) == 1


def test_published_figures_carry_their_source_and_compute_per_byte_is_step_over_bytes():
    for name, (value, source) in cost_model.PUBLISHED.items():
        assert source and value > 0, name
    assert cost_model.PUBLISHED["horovod_vgg16_efficiency"][0] == 0.68
    assert cost_model.published_compute_per_byte(10**6, 100, 50) == pytest.approx(0.5 / (4 * 10**6))


def test_communication_dominates_from_the_first_world_size_where_the_all_reduce_outlasts_compute():
    n = cost_model.crossover_world_size(1e-3, 10**6, 25e-6, 1e-9)
    assert cost_model.allreduce_time(10**6, n, 25e-6, 1e-9) >= 1e-3 > cost_model.allreduce_time(10**6, n - 1, 25e-6, 1e-9)
    assert cost_model.crossover_world_size(1.0, 10**6, 0.0, 1e-9) is None  # without latency the ring never catches up
    assert math.isclose(cost_model.link_beta(10), 0.8e-9)
