"""Both benchmarks run end to end with tiny settings and write the JSON that benchmarks/README.md
documents.

Each runs as a user would, in a subprocess with real gloo processes, in the folder of the code
under test (tests/harness.py SANDBOX). No timing is asserted: figures from two iterations on a
shared machine say nothing; their arithmetic does. The option parsing is checked in this process:
it runs none of the code under test.
"""
import json

import pytest

from benchmarks import allreduce_bench
from runtime.options import STRATEGY_NAMES
from tests.grading.sandbox import run_python

ALLREDUCE = "benchmarks.allreduce_bench"
STEP = "benchmarks.step_bench"


def run(module, *options, timeout=120):
    """Run a benchmark as a user would; its output, after checking it succeeded."""
    done = run_python(["-m", module, *options], timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("script", [ALLREDUCE, STEP])
def test_each_benchmark_explains_itself_with_help(script):
    assert "python -m benchmarks." in run(script, "--help")


def test_allreduce_sizes_climb_from_min_to_max_by_the_factor():
    # 4 KiB .. 64 MiB
    assert allreduce_bench.parse_args([]).sizes == [4 * 2**10 * 4**power for power in range(8)]
    assert len(allreduce_bench.parse_args(["--factor", "2"]).sizes) == 15
    assert allreduce_bench.parse_args(["--sizes", "12,4KiB,1M"]).sizes == [12, 4096, 2**20]
    with pytest.raises(SystemExit):
        allreduce_bench.parse_args(["--sizes", "6"])  # not a whole number of float32 values


def test_allreduce_benchmark_writes_verified_measurements_with_nccl_tests_bandwidths(tmp_path):
    output = tmp_path / "allreduce.json"
    # 1028 bytes = 257 floats: the ring's two chunks differ in length
    printed = run(ALLREDUCE, "--sizes", "1028,64K", "--iterations", "2", "--warmup", "1",
                  "--world-sizes", "2", "--output", str(output))
    assert "target:" in printed and "world 2:" in printed
    document = json.loads(output.read_text())
    assert document["schema"] == "allreduce-bench/1"
    assert {"torch", "cores", "threads_per_rank", "backend"} <= set(document["environment"])
    assert document["config"]["sizes"] == [1028, 65536]
    rows = document["measurements"]
    assert sorted((row["bytes"], row["implementation"]) for row in rows) == \
        [(size, name) for size in (1028, 65536) for name in ("gloo", "ring", "shm")]
    for row in rows:
        world = row["world_size"]
        assert world == 2 and row["verified"] and row["iterations"] == 2
        assert 0 < row["median_s"] <= row["p95_s"]
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["median_s"] / 1e9)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * (world - 1) / world)
    busbw = {(row["bytes"], row["implementation"]): row["busbw_gbps"] for row in rows}
    for comparison in document["comparisons"]:
        size = comparison["bytes"]
        ratio = busbw[size, comparison["implementation"]] / busbw[size, "gloo"]
        assert comparison["busbw_ratio_to_gloo"] == pytest.approx(ratio)
    # nothing >= 4 MiB (the ring's target) or >= 1 MiB (shm's) was measured
    for target in ("target", "shm_target"):
        verdict = document[target]["per_world_size"]["2"]
        assert verdict == {"sizes_checked": 0, "worst_ratio": None, "holds": False}


def test_step_benchmark_times_every_configuration_against_ddp(tmp_path):
    output = tmp_path / "step.json"
    printed = run(STEP, "--models", "mlp", "--world-sizes", "2", "--steps", "2", "--warmup", "1",
                  "--batch-size", "16", "--output", str(output))
    assert "target:" in printed
    document = json.loads(output.read_text())
    assert document["schema"] == "step-bench/2"
    assert document["environment"]["data"] == "random tensors of MNIST shape"
    rows = {row["configuration"]: row for row in document["measurements"]}
    assert set(rows) == {"ddp", "ddp-shm", "ddp-no-sync", *STRATEGY_NAMES}
    ddp_step = rows["ddp"]["mean_step_s"]
    for row in rows.values():
        assert row["world_size"] == 2 and row["model"] == "mlp"
        assert row["steps"] == 2 * 2  # steps x ranks
        assert row["step_ratio_to_ddp"] == pytest.approx(row["mean_step_s"] / ddp_step)
        # means add up, and communication busy time never exceeds the step
        parts = row["mean_data_s"] + row["mean_compute_s"] + row["mean_comm_exposed_s"]
        assert parts == pytest.approx(row["mean_step_s"])
        assert 0 <= row["mean_comm_hidden_s"] <= row["mean_comm_busy_s"] <= row["mean_step_s"]
        if row["overlap"] is not None:
            hidden_share = row["mean_comm_hidden_s"] / row["mean_comm_busy_s"]
            assert row["overlap"] == pytest.approx(hidden_share)
    no_sync = rows["ddp-no-sync"]
    assert no_sync["mean_comm_busy_s"] == 0 and no_sync["overlap"] is None
    # launched after backward: nothing to hide behind
    assert rows["flat"]["mean_comm_hidden_s"] == 0
    verdict, = document["target"]["per_world_size_and_model"]
    assert verdict["best_strategy"] in STRATEGY_NAMES
    # the best strategy is also set against DDP on its own transport (shm: the shm comm hook)
    same = "ddp-shm" if verdict["best_strategy"] == "shm" else "ddp"
    assert verdict["same_transport_ddp"] == same
    assert verdict["step_ratio_to_same_transport_ddp"] == pytest.approx(
        rows[verdict["best_strategy"]]["mean_step_s"] / rows[same]["mean_step_s"])
