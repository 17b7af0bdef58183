"""The sharding benchmark runs end to end with tiny settings, and its figures keep the invariants
they are defined by: timing.py's (exposed <= busy <= step), the ring's bytes (each collective's
recorded size times 2(n-1)/n or (n-1)/n, adding up to k P(n-1)/n at the padded size: k = 2 for
DDP, ZeRO-1 and ZeRO-2, 3 for ZeRO-3), and the memory of each ZeRO level (its shards 1/n of DDP's
plus the padding).

As tests/test_benchmarks.py: the benchmark runs as a user would, in a subprocess with real gloo
processes; no timing is asserted, their arithmetic is. One launch, world sizes 1 and 2, the MLP.
"""
import json

import pytest

from benchmarks import sharding_bench
from grading.launch import run_python

# ZeRO over shared memory (zero3-no-prefetch over gloo, where a prefetch can overlap)
OURS = ("ddp", "zero1", "zero2", "zero3", "zero3-no-prefetch")
TORCH = ("torch-zero1", "torch-fully-shard")  # torch's ZeroRedundancyOptimizer and fully_shard
OVER = ("zero2-library", "zero3-library", "zero1-ring", "zero3-ring")  # the other transports
CONFIGURATIONS = OURS + TORCH + OVER
WORLDS = (1, 2)
TIMING = ("step", "comm_busy", "comm_hidden", "comm_exposed")


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    """results of a tiny run: the MLP at 1 and 2 ranks, every configuration, one measured step."""
    output = tmp_path_factory.mktemp("sharding") / "sharding.json"
    done = run_python(["-m", "benchmarks.sharding_bench", "--models", "mlp", "--world-sizes",
                       "1,2", "--configurations", ",".join(CONFIGURATIONS), "--steps", "1",
                       "--warmup", "1", "--repeats", "1", "--batch-size", "16",
                       "--output", str(output)], timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "x ddp" in done.stdout  # the side-by-side table
    return json.loads(output.read_text())


def rows_of(document):
    return {(row["world_size"], row["configuration"]): row for row in document["measurements"]}


def padded_bytes(row):
    """4 x the padded elements of the row's flat shards (the unpadded parameters for DDP)."""
    if not row["shards"]:
        return row["parameter_bytes"]
    return 4 * sum(shard["padded_numel"] for shard in row["shards"])


@pytest.mark.rubric("core.end_to_end")
def test_every_configuration_runs_once_at_every_world_size_and_the_run_is_recorded(document):
    assert document["schema"] == "sharding-bench/2"
    assert document["command"].startswith("python -m benchmarks.sharding_bench --models mlp")
    assert {"torch", "cores", "threads_per_rank", "backend"} <= set(document["environment"])
    assert document["config"]["world_sizes"] == list(WORLDS)
    rows = rows_of(document)
    assert set(rows) == {(world, name) for world in WORLDS for name in CONFIGURATIONS}
    for (world, _), row in rows.items():
        assert row["model"] == "mlp" and row["repeat"] == 1 and row["steps_per_rank"] == 1
        assert len(row["per_rank"]) == world


@pytest.mark.rubric("core.end_to_end")
def test_communication_never_exceeds_the_step_and_exposed_never_exceeds_busy(document):
    for row in document["measurements"]:
        # the medians over steps keep the per-step order: exposed, hidden <= busy <= step
        medians = [{field: row[f"median_{field}_s"] for field in TIMING}]
        medians += [rank["median_s"] for rank in row["per_rank"]]
        for median in medians:
            assert 0 <= median["comm_exposed"] <= median["comm_busy"] <= median["step"]
            assert 0 <= median["comm_hidden"] <= median["comm_busy"]


@pytest.mark.rubric("core.end_to_end")
def test_bytes_per_step_are_the_rings_bytes_of_the_recorded_collectives(document):
    for (world, name), row in rows_of(document).items():
        if name in TORCH:  # torch's own collectives: out of the timing layer's sight
            assert row["bytes_sent_per_step"] is None and row["bytes_measured_per_step"] is None
            continue
        sizes = {"all-reduce": 0, "reduce-scatter": 0, "all-gather": 0}
        for collective in row["collectives"]:
            sizes[collective["kind"]] += collective["bytes"]
        # a ring all-reduce of B bytes sends 2B(n-1)/n per rank, the two halves B(n-1)/n each
        sent = (2 * sizes["all-reduce"] + sizes["reduce-scatter"] + sizes["all-gather"]) \
            * (world - 1) / world
        assert row["bytes_sent_per_step"] == pytest.approx(sent, rel=1e-12, abs=0)
        assert row["same_collectives_every_step"]
        padded = padded_bytes(row)
        if name == "ddp":  # the gradients all-reduced once: 2P(n-1)/n
            assert sizes == {"all-reduce": row["parameter_bytes"], "reduce-scatter": 0,
                             "all-gather": 0}
        elif row["level"] != "zero3":  # reduce-scatter the gradients, gather the parameters
            assert sizes == {"all-reduce": 0, "reduce-scatter": padded, "all-gather": padded}
        else:  # ZeRO-3 gathers every parameter twice, for forward and for backward: 3P(n-1)/n
            assert sizes == {"all-reduce": 0, "reduce-scatter": padded, "all-gather": 2 * padded}
        factor = 3 if row["level"] == "zero3" else 2
        assert row["bytes_sent_per_step"] == pytest.approx(factor * padded * (world - 1) / world)
        # one rank sends nothing
        assert world > 1 or row["bytes_sent_per_step"] == 0


@pytest.mark.rubric("core.end_to_end")
def test_bytes_measured_are_what_each_transport_sends(document):
    for (world, name), row in rows_of(document).items():
        if name in TORCH:
            continue
        padded = padded_bytes(row)
        transport = "library" if name == "ddp" else sharding_bench.SHARDING[name][2]
        if transport == "library":
            # gloo's all-reduce and all-gather are rings; its reduce-scatter a whole all-reduce
            reduce_scatter, gathers = {"ddp": (0, 0), "zero3": (2, 2)}.get(row["level"], (2, 1))
            expected = 2 * padded if name == "ddp" else (reduce_scatter + gathers) * padded
            assert row["transport"] == "library"
            assert row["bytes_measured_per_step"] == expected * (world - 1) // world
            # higher than the ring's wherever ZeRO scatters
            assert (row["bytes_measured_per_step"] > row["bytes_sent_per_step"]) == (
                world > 1 and name != "ddp")
        elif transport == "ring":  # the hand-written ring sends the formula's bytes
            assert row["transport"] == "point-to-point"
            assert row["bytes_measured_per_step"] == row["bytes_sent_per_step"]
        else:  # the default on one host: through shared memory, not one byte through a socket
            assert row["transport"] == "shared-memory" if world > 1 else row["transport"]
            assert row["bytes_measured_per_step"] == 0


@pytest.mark.rubric("core.end_to_end")
def test_zero_3_holds_most_with_a_unit_whole_and_the_others_at_the_step(document):
    rows = rows_of(document)
    for (world, name), row in rows.items():
        held = row["held_bytes"]
        if name in TORCH:  # counted as collectives start: torch's are unseen
            assert held["model_states_peak"] is None
        elif row["level"] == "zero3":
            # at its most a unit is whole with its whole gradients, where at the step a rank holds
            # the gradients' shards: the largest unit's bytes more, at least
            largest = 4 * max(shard["numel"] for shard in row["shards"])
            assert held["model_states_peak"] >= held["model_states"] + largest
        elif row["level"] == "zero2":  # each bucket's gradients whole until reduce-scattered
            assert held["model_states"] <= held["model_states_peak"] <= rows[
                world, "zero1"]["held_bytes"]["model_states"]
        else:  # all a rank holds meets at the step
            assert held["model_states_peak"] == held["model_states"]


@pytest.mark.rubric("core.end_to_end")
def test_each_level_holds_its_shards_one_nth_of_ddps_plus_the_padding(document):
    rows = rows_of(document)
    for world in WORLDS:
        ddp = rows[world, "ddp"]
        parameters = ddp["parameters"]
        # DDP: float32 parameters and gradients, AdamW's two moments, on every rank
        assert ddp["held_bytes"] == {"parameters": 4 * parameters, "gradients": 4 * parameters,
                                     "optimizer_state": 8 * parameters,
                                     "model_states": 16 * parameters,
                                     "model_states_peak": 16 * parameters}
        for name in OURS[1:]:
            row = rows[world, name]
            held = row["held_bytes"]
            shard = padded_bytes(row) / world  # one rank's 4-byte elements of the flat shards
            padding = padded_bytes(row) - 4 * parameters
            assert 0 <= padding <= 4 * (world - 1) * len(row["shards"])
            assert held["optimizer_state"] == 2 * shard  # every level shards the state
            if name.startswith("zero3"):
                assert held["parameters"] == shard
                assert held["parameters"] == pytest.approx(ddp["held_bytes"]["parameters"] / world,
                                                           abs=padding / world)
            if name != "zero1":
                assert held["gradients"] == shard
            assert held["model_states"] == sum(held[category] for category in
                                               ("parameters", "gradients", "optimizer_state"))


@pytest.mark.rubric("core.end_to_end")
def test_the_summary_sets_each_configuration_beside_the_papers_formulas(document):
    for entry in document["summary"]:
        world, parameters = entry["world_size"], entry["parameters"]
        # torch's configurations beside the formulas of their level: ZeRO-1 and ZeRO-3
        sharded = {"ddp": 16, "zero1": 8 + 8 / world, "zero2": 4 + 12 / world}.get(
            entry["level"], 16 / world)
        formula = entry["formula"]
        assert formula["held_bytes"]["model_states"] == pytest.approx(sharded * parameters)
        factor = 3 if entry["level"] == "zero3" else 2
        assert formula["bytes_sent_per_step"] == pytest.approx(
            factor * 4 * parameters * (world - 1) / world)
        # one repeat: the spread is that repeat's value
        assert entry["repeats"] == 1
        assert entry["median_step_s"]["min"] == entry["median_step_s"]["max"]


@pytest.mark.rubric("core.end_to_end")
def test_torchs_zero_1_and_fully_shard_run_beside_ours_and_shard_what_they_claim(document):
    rows = rows_of(document)
    for world in WORLDS:
        ddp = rows[world, "ddp"]["held_bytes"]
        zero1, fully_shard = (rows[world, name]["held_bytes"] for name in TORCH)
        if world == 1:  # one rank holds it all
            for category in ("parameters", "gradients", "optimizer_state"):
                assert zero1[category] == ddp[category] == fully_shard[category]
            continue
        # ZeroRedundancyOptimizer: whole parameters' state to each rank, so less than DDP's
        # but not 1/n of it; fully_shard: 1/n of every model state, as ours
        assert zero1["parameters"] == ddp["parameters"]
        assert 0 < zero1["optimizer_state"] < ddp["optimizer_state"]
        for category in ("parameters", "gradients", "optimizer_state"):
            assert fully_shard[category] == pytest.approx(ddp[category] / world, rel=1e-3)


def test_bad_options_are_one_line_and_exit_code_2(capsys):
    for argv in (["--steps", "0"], ["--configurations", "zero4"], ["--world-sizes", "0,2"]):
        with pytest.raises(SystemExit) as leaving:
            sharding_bench.parse_args(argv)
        assert leaving.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.rubric("core.end_to_end")
def test_each_repeat_runs_every_configuration_in_an_order_shuffled_from_the_seed():
    names = [f"c{index}" for index in range(8)]
    orders = sharding_bench.configuration_orders(names, 6, seed=3)
    # every configuration once per repeat; the orders differ, and the seed fixes them
    assert all(sorted(order) == names for order in orders)
    assert len({tuple(order) for order in orders}) == 6
    assert orders == sharding_bench.configuration_orders(names, 6, seed=3)
    assert orders != sharding_bench.configuration_orders(names, 6, seed=4)


def test_each_level_is_compared_with_the_ddp_of_its_own_transport_in_the_same_repeat():
    def row(configuration, step, repeat=1):
        return {"repeat": repeat, "world_size": 4, "model": "mlp",
                "configuration": configuration, "median_step_s": step,
                "held_bytes": {"model_states": 16.0}}
    rows = [row("ddp", 2.0), row("ddp-shm", 1.0), row("ddp-ring", 4.0), row("zero1", 1.5),
            row("zero1-ring", 2.0), row("zero1-library", 3.0), row("zero1", 9.0, repeat=2)]
    sharding_bench.add_ratios_to_ddp(rows)
    same = {(entry["configuration"], entry["repeat"]): entry["step_ratio_to_same_transport_ddp"]
            for entry in rows}
    # shared memory's ZeRO over shared memory's DDP, the ring's over the ring's, gloo's over gloo's
    assert same[("zero1", 1)] == 1.5 and same[("zero1-ring", 1)] == 0.5
    assert same[("zero1-library", 1)] == 1.5
    # against torch's DDP over gloo, whatever the transport: the old ratio, kept
    assert [entry["step_ratio_to_ddp"] for entry in rows[3:6]] == [0.75, 1.0, 1.5]
    # a repeat without its DDP compares with nothing
    assert same[("zero1", 2)] is None
