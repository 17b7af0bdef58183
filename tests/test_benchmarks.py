"""Both benchmarks run end to end with tiny settings and write the JSON that benchmarks/README.md
documents.

Each runs as a user would, in a subprocess with real gloo processes, in the folder of the code
under test (grading/launch.py SANDBOX). No timing is asserted: figures from two iterations on a
shared machine say nothing; their arithmetic does. The option parsing and the step benchmark's
verdict, on hand-made numbers, are checked in this process: they run none of the code under test.
"""
import json

import pytest

from benchmarks import allreduce_bench, step_bench
from grading.launch import run_python
from runtime.options import MANUAL_CONFIGURATIONS
from runtime.timing import FIELDS

pytestmark = pytest.mark.rubric("core.end_to_end")

ALLREDUCE = "benchmarks.allreduce_bench"
STEP = "benchmarks.step_bench"


def run(module, *options, timeout=120):
    """Run a benchmark as a user would; its output, after checking it succeeded."""
    done = run_python(["-m", module, *options], timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("benchmark", [allreduce_bench, step_bench], ids=[ALLREDUCE, STEP])
def test_each_benchmark_explains_itself_with_help(benchmark, capsys):
    # in this process, as the other option tests: both also run end to end as `python -m` below
    with pytest.raises(SystemExit) as exit_:
        benchmark.parse_args(["--help"])
    assert exit_.value.code == 0
    assert "python -m benchmarks." in capsys.readouterr().out


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
    # the halves move whole chunks: 257 floats are 2 chunks of 128
    halves = document["halves"]
    assert sorted((row["bytes"], row["collective"], row["implementation"]) for row in halves) == \
        [(size, collective, name) for size in (1024, 65536)
         for collective in ("all-gather", "reduce-scatter") for name in ("gloo", "ring", "shm")]
    copies = {row["bytes"]: row for row in document["memory_copy"]}
    assert sorted(copies) == [1028, 65536]
    for row in rows + halves + document["memory_copy"]:
        world = row["world_size"]
        assert world == 2 and row["verified"] and row["iterations"] == 2
        assert 0 < row["median_s"] <= row["p95_s"]
        assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["median_s"] / 1e9)
        bus = {"all-reduce": 2 * (world - 1) / world, "memory-copy": 1}.get(row["collective"],
                                                                             (world - 1) / world)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * bus)
        # each as a fraction of a copy of the same buffer, measured in the same run
        copy = copies[1028 if row["bytes"] <= 1028 else 65536]
        assert row["fraction_of_copy"] == pytest.approx(copy["median_s"] / row["median_s"])
    busbw = {(row["collective"], row["bytes"], row["implementation"]): row["busbw_gbps"]
             for row in rows + halves}
    assert len(document["comparisons"]) == 12  # ring and shm of 3 collectives at 2 sizes
    for comparison in document["comparisons"]:
        key = comparison["collective"], comparison["bytes"]
        ratio = busbw[(*key, comparison["implementation"])] / busbw[(*key, "gloo")]
        assert comparison["busbw_ratio_to_gloo"] == pytest.approx(ratio)
    # nothing >= 4 MiB (the ring's target) or >= 1 MiB (shm's) was measured
    for target in ("target", "shm_target"):
        verdict = document[target]["per_world_size"]["2"]
        assert verdict == {"sizes_checked": 0, "worst_ratio": None, "holds": False}


def test_step_benchmark_times_every_configuration_against_ddp_in_each_repeat(tmp_path):
    output = tmp_path / "step.json"
    printed = run(STEP, "--models", "mlp", "--world-sizes", "2", "--steps", "2", "--warmup", "1",
                  "--batch-size", "16", "--repeats", "2", "--output", str(output))
    assert "verdict" in printed
    document = json.loads(output.read_text())
    assert document["schema"] == "step-bench/3"
    assert document["environment"]["data"] == "random tensors of MNIST shape"
    configurations = {"ddp", "ddp-shm", "ddp-no-sync", *MANUAL_CONFIGURATIONS}
    rows = {(row["repeat"], row["configuration"]): row for row in document["measurements"]}
    # every configuration once in each repeat
    assert set(rows) == {(repeat, name) for repeat in (1, 2) for name in configurations}
    for row in rows.values():
        assert row["world_size"] == 2 and row["model"] == "mlp"
        assert row["steps"] == 2 * 2  # steps x ranks
        # the ratio is to the DDP step of the same repeat
        ddp_step = rows[row["repeat"], "ddp"]["mean_step_s"]
        assert row["step_ratio_to_ddp"] == pytest.approx(row["mean_step_s"] / ddp_step)
        # means add up, and communication busy time never exceeds the step
        parts = row["mean_data_s"] + row["mean_compute_s"] + row["mean_comm_exposed_s"]
        assert parts == pytest.approx(row["mean_step_s"])
        assert 0 <= row["mean_comm_hidden_s"] <= row["mean_comm_busy_s"] <= row["mean_step_s"]
        if row["overlap"] is not None:
            hidden_share = row["mean_comm_hidden_s"] / row["mean_comm_busy_s"]
            assert row["overlap"] == pytest.approx(hidden_share)
    for repeat in (1, 2):
        no_sync = rows[repeat, "ddp-no-sync"]
        assert no_sync["mean_comm_busy_s"] == 0 and no_sync["overlap"] is None
        # launched after backward: nothing to hide behind
        assert rows[repeat, "flat"]["mean_comm_hidden_s"] == 0
    # the summary's spreads are those of the repeats' rows
    for entry in document["summary"]:
        steps = [rows[repeat, entry["configuration"]]["mean_step_s"] for repeat in (1, 2)]
        assert entry["repeats"] == 2 and entry["mean_step_s"]["per_repeat"] == steps
        assert (entry["mean_step_s"]["min"], entry["mean_step_s"]["max"]) == (min(steps),
                                                                             max(steps))
        assert entry["mean_step_s"]["median"] == pytest.approx(sum(steps) / 2)
    verdict, = document["verdict"]["per_world_size_and_model"]
    assert verdict["best_strategy"] in MANUAL_CONFIGURATIONS
    # the best strategy is also set against DDP on its own transport (flat-shm: the shm comm hook)
    same = "ddp-shm" if verdict["best_strategy"] == "flat-shm" else "ddp"
    assert verdict["against_same_transport_ddp"]["ddp"] == same
    ratios = [rows[repeat, verdict["best_strategy"]]["mean_step_s"]
              / rows[repeat, same]["mean_step_s"] for repeat in (1, 2)]
    assert verdict["against_same_transport_ddp"]["step_ratio"]["per_repeat"] == \
        pytest.approx(ratios)
    # two repeats declare nothing
    for side in ("against_ddp", "against_same_transport_ddp"):
        assert verdict[side]["verdict"] == "not enough repeats: 2 < 3"


def test_step_benchmark_refuses_fewer_than_one_repeat(capsys):
    with pytest.raises(SystemExit):
        step_bench.parse_args(["--repeats", "0"])
    assert "--repeats must be >= 1" in capsys.readouterr().err


def test_each_repeat_launches_the_world_sizes_in_the_reverse_order_of_the_one_before():
    assert step_bench.world_size_orders([2, 3, 4], 3) == [[2, 3, 4], [4, 3, 2], [2, 3, 4]]


def test_a_step_verdict_is_the_design_documents_rule_on_the_ratios_within_each_repeat():
    compare = step_bench.compare_with_ddp
    # fewer than 5 repeats: every ratio on one side of 1
    assert compare([0.7, 0.8, 0.95]) == "faster than DDP"
    assert compare([1.05, 1.2, 1.1]) == "slower than DDP"
    assert compare([0.7, 0.75, 1.01]) == "indistinguishable"
    # from 5: the bootstrap interval of the median, which one repeat of six above 1 does not reach
    assert compare([0.7, 0.72, 0.71, 0.69, 0.7, 1.05]) == "faster than DDP"
    assert compare([0.7, 1.3, 0.9, 1.1, 0.8, 1.2]) == "indistinguishable"
    # only two repeats
    assert compare([0.1, 0.2]) == "not enough repeats: 2 < 3"
    # against DDP on the same transport, the verdict names it
    assert compare([0.7, 0.8, 0.95], "ddp-shm") == "faster than ddp-shm"


def test_step_ratios_are_taken_within_a_repeat_never_across_repeats():
    # repeat 2 ran in a slow spell: every configuration twice as slow
    steps = {"ddp": [10.0, 20.0, 10.5], "ddp-shm": [9.0, 18.0, 9.5], "flat-shm": [8.0, 16.0, 8.5],
             "flat": [9.0, 18.0, 9.0]}
    rows = [{"repeat": repeat + 1, "world_size": 2, "model": "mlp", "configuration": name,
             **{f"mean_{field}_s": per_repeat[repeat] for field in FIELDS},
             "overlap": None, "step_ratio_to_ddp": per_repeat[repeat] / steps["ddp"][repeat]}
            for repeat in range(3) for name, per_repeat in steps.items()]
    summary = step_bench.summarize(rows)
    verdict, = step_bench.verdicts(summary)
    assert verdict["best_strategy"] == "flat-shm"
    # flat-shm at 0.8x DDP in every repeat, though the steps' ranges overlap
    assert verdict["against_ddp"]["step_ratio"]["per_repeat"] == pytest.approx([0.8, 0.8, 0.8095],
                                                                               rel=1e-3)
    assert verdict["against_ddp"]["verdict"] == "faster than DDP"
    assert verdict["against_same_transport_ddp"]["ddp"] == "ddp-shm"
    assert verdict["against_same_transport_ddp"]["step_ratio"]["median"] == pytest.approx(8 / 9)



def test_step_benchmark_sets_our_step_beside_a_plain_loop(tmp_path):
    output = tmp_path / "plain.json"
    printed = run(STEP, "--plain-loop", "--device", "cpu", "--models", "mlp", "--steps", "2",
                  "--warmup", "1", "--repeats", "2", "--output", str(output))
    assert "x plain" in printed and "device cpu" in printed
    document = json.loads(output.read_text())
    assert document["schema"] == "plain-loop/1" and document["environment"]["device"] == "cpu"
    rows = {row["configuration"]: row for row in document["rows"]}
    assert sorted(rows) == ["ddp", "manual", "plain", "single"]
    plain = rows["plain"]["median_step_s"]
    for row in rows.values():
        assert len(row["per_round_s"]) == 2
        assert row["min_step_s"] <= row["median_step_s"] <= row["max_step_s"]
        assert row["ratio_to_plain"] == pytest.approx(row["median_step_s"] / plain)
        assert row["samples_per_s"] == pytest.approx(64 / row["median_step_s"])

def test_a_benchmark_rank_that_raises_says_its_error(tmp_path):
    # a candidate ring that raises: the error's line, not only "rank 0 failed (exit code 1)"
    candidate = tmp_path / "candidate.py"
    candidate.write_text("def ring_all_reduce(tensor):\n"
                         "    raise RuntimeError('the candidate ring broke')\n")
    done = run_python(["-m", ALLREDUCE, "--sizes", "1K", "--iterations", "1", "--warmup", "0",
                       "--world-sizes", "2", "--candidate", str(candidate), "--output",
                       str(tmp_path / "out.json")], timeout=120)
    assert done.returncode == 1
    assert "RuntimeError: the candidate ring broke" in done.stderr
