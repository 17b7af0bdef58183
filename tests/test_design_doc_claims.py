"""The design document's claims, recomputed from the synthetic results rather than only checked to
exist: the verdicts between strategies, efficiency, ceiling and overlap, and the α-β fits. The
claims are read from the build's numbers and its tables (design_doc_results.SHOWN), not from the
student's prose; the cost model, whose derivations are the student's, runs in a child
(tests/harness.py)."""
import json
import os
import re

import pytest

from analysis import results_folder
from tests.design_doc_results import (
    ALPHAS,
    BETA,
    REPEATS,
    build_synthetic,
    no_notes,
    numbers_of,
    spreads_from,
)
from tests.harness import run_alone

PAIR_ROW = re.compile(r"^\| (MLP|CNN) \| (\d+) \| [^|]+ \| [^|]+ \| (.+) \|$")
INDISTINGUISHABLE = " are indistinguishable on this machine"


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


def test_a_strategy_is_called_faster_only_where_clearly_less_holds_and_indistinguishable_otherwise(
        synthetic):
    spreads = spreads_from(synthetic.folder)
    claims = [PAIR_ROW.match(line).groups() for line in synthetic.shown["table.pairs"].splitlines()
              if PAIR_ROW.match(line)]
    # the CNN's ring
    unmeasured = [claim for _, _, claim in claims if claim.endswith("not measured")]
    assert unmeasured == ["manual ring or manual flat not measured"]
    claims = [(model, world, claim) for model, world, claim in claims
              if not claim.endswith("not measured")]
    assert len(claims) == 2 * 2 * 4 - 1  # models x world sizes x pairs, less the CNN's ring
    said = {"faster": 0, "indistinguishable": 0}
    for model, world, claim in claims:
        steps = steps_at(spreads, model.lower(), int(world))
        if " is faster than " in claim:
            faster, slower = claim.split(" is faster than ")
            # the claim is made only where the gap of medians exceeds both spreads
            assert results_folder.clearly_less(steps[faster], steps[slower]), claim
            said["faster"] += 1
        else:
            first, second = claim.removesuffix(INDISTINGUISHABLE).split(" and ")
            # indistinguishable: neither is clearly less than the other
            assert not results_folder.clearly_less(steps[first], steps[second]), claim
            assert not results_folder.clearly_less(steps[second], steps[first]), claim
            said["indistinguishable"] += 1
    # the synthetic results exercise both verdicts
    assert said["faster"] and said["indistinguishable"]


def test_the_verdicts_against_the_smallest_median_follow_the_spreads(synthetic):
    spreads = spreads_from(synthetic.folder)
    numbers = numbers_of(synthetic.documents)
    for model in ("mlp", "cnn"):
        for world in (2, 4):
            steps = steps_at(spreads, model, world)
            del steps["ddp-no-sync"]  # the compute baseline has no verdict
            fastest = min(steps, key=lambda series: steps[series]["median"])
            assert numbers[f"sweep.{model}.w{world}.fastest"]["value"] == fastest
            for series, step in steps.items():
                if series == fastest:
                    continue
                slug = series.replace("manual ", "")
                verdict = numbers[f"verdict.{model}.w{world}.{slug}"]["value"]
                slower = results_folder.clearly_less(steps[fastest], step)
                assert verdict == ("slower" if slower else "indistinguishable")


def test_efficiency_ceiling_and_overlap_are_recomputed_from_the_results(synthetic):
    spreads = spreads_from(synthetic.folder)
    numbers = numbers_of(synthetic.documents)

    def value(name):
        return numbers[name]["value"]
    for model in ("mlp", "cnn"):
        single = spreads[(model, "single", 1)]["throughput"]["median"]
        for world in (2, 4):
            base = spreads[(model, "ddp-no-sync", world)]
            # ceiling: the compute baseline's throughput over n single processes'
            ceiling = base["throughput"]["median"] / (world * single)
            assert value(f"ceiling.{model}.w{world}") == pytest.approx(ceiling)
            for series in ("ddp", "manual flat", "manual bucketed"):
                measured = spreads[(model, series, world)]
                name = f"sweep.{model}.{series.replace('manual ', '')}.w{world}"
                efficiency = measured["throughput"]["median"] / (world * single)
                assert value(f"{name}.efficiency") == pytest.approx(efficiency)
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


def modelled_times(points):
    """cost_model.allreduce_time of each (bytes, world size, alpha, beta). Run in a child."""
    from analysis import cost_model

    return [cost_model.allreduce_time(*point) for point in points]


def test_the_appendix_shows_every_benchmark_point_with_its_relative_error(synthetic):
    numbers = numbers_of(synthetic.documents)
    with open(os.path.join(synthetic.folder, "allreduce-bench.json")) as file:
        rows = json.load(file)["measurements"]
    # the fit of all world sizes
    points = [(row["bytes"], row["world_size"],
               numbers[f"fit.{row['implementation']}.alpha_s"]["value"],
               numbers[f"fit.{row['implementation']}.beta_s_per_byte"]["value"]) for row in rows]
    for row, model in zip(rows, run_alone(modelled_times, points)):
        name = f"allreduce.w{row['world_size']}.{row['implementation']}.{row['bytes']}"
        error = (model - row["median_s"]) / row["median_s"]
        assert numbers[f"{name}.all_error"]["value"] == pytest.approx(error)
        assert numbers[f"{name}.all_error"]["text"] in synthetic.shown["table.allreduce"]
