"""The design document's claims, recomputed from the synthetic results rather than only checked to
exist: the verdicts between strategies, efficiency, ceiling and overlap, and the α-β fits. The
claims are read from the build's numbers and its tables (design_doc_results.SHOWN), not from the
student's prose; the cost model, whose derivations are the student's, runs in a child
(grading/launch.py)."""
import re

import pytest

from analysis import results_folder
from tests.design_doc_results import (
    ALPHAS,
    BETA,
    LATE_RANK_S,
    REPEATS,
    build_synthetic,
    no_notes,
    numbers_of,
    spreads_from,
)

pytestmark = pytest.mark.rubric("design.numbers")

# | MLP | 4 | flat | per-param | 0.317× (0.305–0.317), faster |
PAIR_ROW = re.compile(r"^\| (MLP|CNN) \| (\d+) \| ([\w-]+) \| ([\w-]+) \| (.+) \|$")


def full_name(slug):
    """A series as results_folder names it: 'flat' -> 'manual flat'."""
    return slug if slug in ("ddp", "single", "ddp-no-sync") else f"manual {slug}"


def throughputs_by_round(folder, model, series, world):
    """The throughput of each repeat of a configuration, oldest first (one per round)."""
    runs, _ = results_folder.load_folder(folder, note=no_notes)
    grouped = results_folder.repeats(runs, "sweep")
    return [run["throughput_samples_per_s"] for run in grouped[(model, series, world, 25.0)]]


def per_round_median(mine, theirs, scale=1.0):
    """The median over rounds of scale x mine / theirs, each pair from one round."""
    return results_folder.spread([scale * a / b for a, b in zip(mine, theirs)])["median"]


def steps_at(spreads, model, world):
    """{series: step spread} of one model at one world size."""
    return {series: spread["step"] for (run_model, series, run_world), spread in spreads.items()
            if (run_model, run_world) == (model, world)}


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """The SyntheticBuild of the synthetic results, made in a child."""
    return build_synthetic(tmp_path_factory)


def test_the_synthetic_steps_add_up_as_timing_records_do(synthetic):
    runs, _ = results_folder.load_folder(synthetic.folder, note=no_notes)
    for run in runs:
        means = results_folder.per_step(run)
        # data + compute + exposed == step, and 0 <= hidden <= busy <= step, as
        # timing.step_record makes them
        assert means["data"] + means["compute"] + means["comm_exposed"] == pytest.approx(
            means["step"])
        assert 0 <= means["comm_hidden"] <= means["comm_busy"] <= means["step"]
        if results_folder.series_name(run) in ("single", "ddp-no-sync"):
            assert means["comm_busy"] == 0 and means["overlap"] is None
    # at least three repeats of every configuration, the compute baseline included
    grouped = results_folder.repeats(runs)
    counts = {configuration: len(group) for configuration, group in grouped.items()}
    assert min(counts.values()) >= REPEATS
    assert any(series == "ddp-no-sync" for _, series, _, _ in counts)


def steps_by_round(folder, model, series, world):
    """{round: the run's mean step} of one configuration of the strategy sweep."""
    runs, _ = results_folder.load_folder(folder, note=no_notes)
    grouped = results_folder.repeats(runs, "sweep")
    return {int(run["path"].removesuffix(".json").rsplit("-r", 1)[1]):
            run["timing"]["across_ranks"]["step"]["mean"]
            for run in grouped.get((model, series, world, 25.0), [])}


def expected_verdict(mine, theirs):
    """The document's rule with fewer than five rounds: faster or slower only where every ratio
    of the same round agrees."""
    ratios = [mine[round_] / theirs[round_] for round_ in mine if round_ in theirs]
    assert len(ratios) == REPEATS
    if all(ratio < 1 for ratio in ratios):
        return "faster"
    if all(ratio > 1 for ratio in ratios):
        return "slower"
    return "indistinguishable"


def test_a_strategy_is_faster_or_slower_only_where_every_ratio_within_a_round_agrees(synthetic):
    claims = [PAIR_ROW.match(line).groups() for line in synthetic.shown["table.pairs"].splitlines()
              if PAIR_ROW.match(line)]
    # the CNN's ring at the largest world size
    assert [claim for *_, claim in claims if claim == "not measured"] == ["not measured"]
    claims = [claim for claim in claims if claim[-1] != "not measured"]
    assert len(claims) == 2 * 4 - 1  # models x pairs at the largest world size, less the CNN's ring
    said = set()
    for model, world, first, second, claim in claims:
        mine, theirs = (steps_by_round(synthetic.folder, model.lower(), full_name(series),
                                       int(world)) for series in (first, second))
        # the claim quotes the paired ratios' spread, then the verdict they allow
        assert claim.endswith(", " + expected_verdict(mine, theirs)), claim
        said.add(claim.rsplit(", ", 1)[1])
    # the synthetic results exercise a verdict and its absence
    assert "indistinguishable" in said and said - {"indistinguishable"}


def test_the_verdicts_against_flat_pair_each_round_with_flats(synthetic):
    numbers = numbers_of(synthetic.documents)
    for model in ("mlp", "cnn"):
        for world in (2, 4):
            flat = steps_by_round(synthetic.folder, model, "manual flat", world)
            for series in ("ddp", "manual per-param", "manual bucketed", "manual flat-ring"):
                mine = steps_by_round(synthetic.folder, model, series, world)
                if not mine:  # the run the synthetic sweep leaves out
                    continue
                slug = series.replace("manual ", "")
                verdict = numbers[f"verdict.{model}.w{world}.{slug}.verdict"]["value"]
                assert verdict == expected_verdict(mine, flat), (model, world, series)


def test_the_verdict_rule_reads_every_pair_below_five_rounds_and_a_bootstrap_from_five():
    # three rounds: one ratio on the other side of 1 is enough to withhold a verdict
    assert results_folder.verdict(*results_folder.interval([0.9, 0.95, 1.01])) == \
        "indistinguishable"
    assert results_folder.verdict(*results_folder.interval([0.9, 0.95, 0.99])) == "faster"
    assert results_folder.verdict(*results_folder.interval([1.1, 1.2, 1.3])) == "slower"
    # eight rounds, one outlier: the bootstrap interval of the median still excludes 1
    low, high = results_folder.interval([0.8, 0.82, 0.81, 0.79, 0.83, 0.8, 0.81, 1.05])
    assert high < 1 and results_folder.verdict(low, high) == "faster"


def test_runs_of_two_sweeps_are_never_pooled_and_pair_by_round(synthetic):
    runs, _ = results_folder.load_folder(synthetic.folder, note=no_notes)
    # the bucket sweep's 25 MiB DDP is the strategy sweep's DDP configuration: apart, REPEATS each
    for sweep in ("sweep", "bucket"):
        grouped = results_folder.repeats(runs, sweep)
        assert len(grouped[("mlp", "ddp", 4, 25.0)]) == REPEATS
    grouped = results_folder.repeats(runs, "sweep")
    mine, theirs = grouped[("mlp", "ddp", 4, 25.0)], grouped[("mlp", "single", 1, 25.0)]
    for run, other in results_folder.paired(list(reversed(mine)), theirs):
        assert results_folder.round_of(run) == results_folder.round_of(other)


def test_efficiency_ceiling_and_overlap_are_recomputed_from_the_results_round_by_round(synthetic):
    spreads = spreads_from(synthetic.folder)
    numbers = numbers_of(synthetic.documents)

    def value(name):
        return numbers[name]["value"]
    for model in ("mlp", "cnn"):
        single = throughputs_by_round(synthetic.folder, model, "single", 1)
        for world in (2, 4):
            base = throughputs_by_round(synthetic.folder, model, "ddp-no-sync", world)
            # ceiling: the compute baseline's throughput over n single processes', round by round
            assert value(f"ceiling.{model}.w{world}.median") == pytest.approx(
                per_round_median(base, single, 1 / world))
            for series in ("ddp", "manual flat", "manual bucketed"):
                measured = spreads[(model, series, world)]
                name = f"sweep.{model}.{series.replace('manual ', '')}.w{world}"
                mine = throughputs_by_round(synthetic.folder, model, series, world)
                assert value(f"{name}.efficiency.median") == pytest.approx(
                    per_round_median(mine, single, 1 / world))
                assert value(f"{name}.overlap.median") == pytest.approx(
                    measured["overlap"]["median"])
                assert value(f"{name}.step.min") == measured["step"]["min"]


def test_the_build_fits_each_world_size_alone_and_recovers_its_alpha(synthetic):
    numbers = numbers_of(synthetic.documents)
    for world, alpha in ALPHAS.items():
        assert numbers[f"fit.gloo.w{world}.alpha_s"]["value"] == pytest.approx(alpha, rel=1e-6)
        beta = numbers[f"fit.gloo.w{world}.beta_s_per_byte"]["value"]
        assert beta == pytest.approx(BETA, rel=1e-6)
        ring_alpha = numbers[f"fit.ring.w{world}.alpha_s"]["value"]
        assert ring_alpha == pytest.approx(1.3 * alpha, rel=1e-6)
    # One fit of every world size cannot follow a growing alpha: its residuals say so, the
    # per-world ones are zero.
    assert numbers["fit.gloo.max_relative_error"]["value"] > 0.01
    assert numbers["fit.gloo.w4.max_relative_error"]["value"] < 1e-6
    # The projections start from the smallest world size's fit.
    assert numbers["fit.projection.alpha_s"]["value"] == pytest.approx(ALPHAS[2], rel=1e-6)


def test_the_traced_steps_exposed_time_tells_waiting_for_a_late_peer_from_transfer(synthetic):
    numbers = numbers_of(synthetic.documents)

    def value(name):
        return numbers[name]["value"]  # trace times are in µs
    # rank 1 begins every step LATE_RANK_S after rank 0, so it launches its last bucket that long
    # after rank 0's backward ended: rank 0 waits for it before any transfer can finish
    assert value("trace.late_start") == pytest.approx(LATE_RANK_S * 1e6)
    assert value("trace.peer_wait") == pytest.approx(LATE_RANK_S * 1e6)
    # the exposed time is the wait plus what is left for the transfer, which the document says
    assert value("trace.peer_wait") + value("trace.transfer") == pytest.approx(
        value("trace.last_done_after_backward_end"))
    assert 0 < value("trace.transfer") < value("trace.last_done_after_backward_end")


def test_bucket_sizes_that_send_the_same_buckets_are_one_layout_never_a_win_over_each_other(
        synthetic):
    numbers = numbers_of(synthetic.documents)
    layouts = {size: numbers[f"buckets.mlp.bucketed.{size:g}"]["value"] for size in (0.25, 1, 25)}
    # the synthetic MLP sends the same two buckets at 1 and 25 MiB, four at 0.25 MiB
    assert layouts[1] == layouts[25] != layouts[0.25]
    same = numbers["bucket.bucketed.same_layout"]["value"]
    # the fastest size is named with every size that sends its buckets, and with no other
    assert same == [size for size, layout in layouts.items() if layout == layouts[same[0]]]
    takeaway = synthetic.shown["text.bucket_takeaway"]
    if len(same) > 1:
        assert "send the same buckets" in takeaway
    # sizes of one layout are never compared with each other
    assert not [name for name in numbers if re.match(r"bucket\.bucketed\.(1|25)-vs-(1|25)\.", name)]
