"""The timing definitions hold on real runs: every strategy and DDP at 2 and 4 ranks, one process,
a deliberately slow rank, DDP's calibration, and every results file committed under results/.

The runs and the benchmark start as fresh processes in the folder of the code under test
(grading/launch.py SANDBOX), whose committed results files are read from there too."""
import glob
import json
import os

import pytest

from analysis.results_folder import series_name
from grading.launch import SANDBOX, run_cli, run_ok, run_python
from runtime import results
from runtime.models import build_model
from runtime.options import MANUAL_CONFIGURATIONS, manual_arguments

pytestmark = pytest.mark.rubric("core.end_to_end")

SMALL = ("--val-samples", 100, "--test-samples", 100, "--epochs", 1, "--warmup-steps", 2,
         "--batch-size", 16)
MODES = {"ddp": ("--mode", "ddp"), "per-param": ("--mode", "manual", "--sync", "per-param"),
         "flat": ("--mode", "manual", "--sync", "flat"),
         "bucketed": ("--mode", "manual", "--sync", "bucketed", "--bucket-mb", 0.25),
         "flat-ring": manual_arguments("flat-ring")}


def run(tmp_path, tiny_data, name, *args):
    """A small run with `args`; returns its results document."""
    run_ok("--data-dir", tiny_data, *SMALL, "--results-dir", tmp_path, "--run-name", name, *args)
    return json.loads((tmp_path / f"{name}.json").read_text())


def assert_timing_invariants(document, where):
    """timing.py's invariants on each rank's summary, DDP's included: means add up exactly; busy,
    hidden, exposed and the step are ordered step by step, so their means and medians are
    ordered too."""
    for rank, stats in enumerate(document["timing"]["per_rank"]):
        for statistic in ("mean", "median"):
            value = {field: stats[field][statistic] for field in stats}
            context = (where, rank, statistic)
            assert 0 <= value["comm_hidden"] <= value["comm_busy"], context
            assert value["comm_busy"] <= value["step"] * (1 + 1e-9), context
            assert 0 <= value["comm_exposed"] <= value["comm_busy"] * (1 + 1e-9), context
        mean = {field: stats[field]["mean"] for field in stats}
        parts = mean["data"] + mean["compute"] + mean["comm_exposed"]
        assert parts == pytest.approx(mean["step"]), (where, rank)
    for epoch in document["epochs"]:
        assert epoch["comm_hidden_s"] <= epoch["comm_busy_s"] * (1 + 1e-9), where


def test_busy_hidden_and_exposed_keep_their_invariants_for_every_strategy_and_ddp_at_2_and_4_ranks(
        tmp_path):
    # One launch per world size: the step benchmark trains DDP and every strategy side by side
    # with the trainer's timer (real gloo processes) and reports each one's means. DDP's compute
    # ends at its last gradient, as every mode's does: its exposed time can never exceed its busy.
    output = tmp_path / "step.json"
    command = ["-m", "benchmarks.step_bench", "--models", "mlp", "--world-sizes", "2,4",
               "--steps", "3", "--warmup", "1", "--batch-size", "16", "--repeats", "1",
               "--output", output]
    done = run_python(command, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads(output.read_text())["measurements"]
    assert {(row["world_size"], row["configuration"]) for row in rows} == \
        {(world, name) for world in (2, 4)
         for name in ("ddp", "ddp-shm", "ddp-no-sync", *MANUAL_CONFIGURATIONS)}
    for row in rows:
        where = f"{row['configuration']} at {row['world_size']} ranks"
        fields = ("data", "compute", "comm_busy", "comm_hidden", "comm_exposed", "step")
        mean = {field: row[f"mean_{field}_s"] for field in fields}
        assert 0 <= mean["comm_hidden"] <= mean["comm_busy"] <= mean["step"], where
        assert 0 <= mean["comm_exposed"] <= mean["comm_busy"] * (1 + 1e-9), where
        parts = mean["data"] + mean["compute"] + mean["comm_exposed"]
        assert parts == pytest.approx(mean["step"]), where
        # launched after backward: nothing can hide
        if row["configuration"] in ("flat", "per-param", "flat-ring", "flat-shm"):
            assert mean["comm_hidden"] == 0, where
        if row["configuration"] != "ddp-no-sync":
            assert mean["comm_busy"] > 0, where


def test_a_results_file_keeps_the_invariants_per_rank_in_its_means_and_medians(tiny_data, tmp_path):
    document = run(tmp_path, tiny_data, "run", "--world-size", 4, *MODES["bucketed"])
    assert_timing_invariants(document, "bucketed at 4 ranks")
    # launched from hooks during backward
    assert document["timing"]["across_ranks"]["comm_hidden"]["mean"] > 0


def test_a_single_process_reports_no_communication_at_all(tiny_data, tmp_path):
    document = run(tmp_path, tiny_data, "single", "--mode", "single")
    for field in ("comm_busy", "comm_hidden", "comm_exposed"):
        assert document["timing"]["across_ranks"][field] == {"mean": 0.0, "median": 0.0, "p95": 0.0,
                                                             "slowest_rank_mean": 0.0}
    assert [epoch["comm_exposed_s"] for epoch in document["epochs"]] == [0.0]
    assert document["timing"]["all_reduce_layouts"] == []


def test_a_slow_rank_shows_as_a_straggler_although_every_step_lasts_as_long(tiny_data, tmp_path):
    # Rank 1 sleeps 10 ms per step. Blocking collectives make rank 0 wait for it, so both ranks'
    # steps are equally long; their own work (step minus waiting) is not. Half the sleep is the
    # margin: on 2 busy cores the other rank's compute stretches while rank 1 sleeps.
    document = run(tmp_path, tiny_data, "slow", "--world-size", 2, *MODES["flat"],
                   "--debug-slow-rank", 1)
    per_rank = document["timing"]["per_rank"]
    own_work = [rank["own_work"]["mean"] for rank in per_rank]
    assert own_work[1] > own_work[0] + 0.005
    assert document["timing"]["straggler"] == pytest.approx(own_work[1] / own_work[0])
    assert per_rank[0]["step"]["mean"] == pytest.approx(per_rank[1]["step"]["mean"], rel=0.1)
    exposed = [rank["comm_exposed"]["mean"] for rank in per_rank]
    assert exposed[0] > exposed[1] + 0.005  # rank 0 waited


def test_the_slow_rank_option_is_hidden_from_help():
    assert "debug-slow-rank" not in run_cli("--help").stdout


def test_ddp_is_measured_as_every_mode_and_records_the_buckets_it_sent(tiny_data, tmp_path):
    document = run(tmp_path, tiny_data, "ddp", "--world-size", 2, "--mode", "ddp")
    assert_timing_invariants(document, "ddp at 2 ranks")
    timing = document["timing"]
    # one bucket (the MLP's 2.27 MB under the 25 MiB cap), after DDP's rebuild as before it
    layouts = timing["all_reduce_layouts"]
    assert layouts[-1]["bytes"] == [4 * sum(p.numel() for p in build_model("mlp").parameters())]
    assert "exposed_method" not in timing and "calibration" not in timing


def test_the_compute_baseline_mode_runs_ddp_without_communicating(tiny_data, tmp_path):
    document = run(tmp_path, tiny_data, "nosync", "--world-size", 2, "--mode", "ddp-no-sync")
    assert document["timing"]["across_ranks"]["comm_busy"]["mean"] == 0
    assert series_name(document) == "ddp-no-sync"


@pytest.mark.rubric("design.numbers")
def test_every_committed_results_file_satisfies_the_timing_invariants_ddp_included():
    paths = glob.glob(os.path.join(SANDBOX, "results", "**", "*.json"), recursive=True)
    documents = {path: json.loads(open(path).read()) for path in paths}
    runs = [path for path, document in documents.items()
            if document.get("schema", "").startswith("ddp-mnist-results")]
    assert runs, "no training results committed under results/"
    for path in runs:
        document = documents[path]
        assert document["schema"] == results.SCHEMA, \
            f"{path} was written before the current timing definitions"
        assert results.validate(document) == [], path
        assert_timing_invariants(document, os.path.relpath(path, SANDBOX))
    bench = json.loads(open(os.path.join(SANDBOX, "results", "step-bench.json")).read())
    for row in bench["measurements"]:
        where = f"step-bench.json: {row['configuration']} at {row['world_size']} ranks"
        assert 0 <= row["mean_comm_hidden_s"] <= row["mean_comm_busy_s"] * (1 + 1e-9), where
        assert 0 <= row["mean_comm_exposed_s"] <= row["mean_comm_busy_s"] * (1 + 1e-9), where
