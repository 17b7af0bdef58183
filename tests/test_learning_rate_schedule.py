"""The learning-rate schedules (runtime/optimizers.py): one-cycle's shape at every run length, and
its per-step moves in a real run. Resuming under it: tests/test_reliability.py."""
import json
import math

import pytest

from grading.launch import run_ok
from runtime.optimizers import one_cycle


@pytest.mark.parametrize("total_steps", range(1, 13))
def test_one_cycle_rises_to_the_peak_then_falls_to_its_end_at_any_run_length(total_steps):
    factors = [one_cycle(total_steps)(step) for step in range(total_steps + 2)]
    assert all(math.isfinite(factor) and factor > 0 for factor in factors)
    peak = factors.index(max(factors))
    # the peak rate is reached, after a rise that never falls and before a fall that never rises
    assert max(factors) == pytest.approx(1)
    assert factors[:peak + 1] == sorted(factors[:peak + 1])
    assert factors[peak:total_steps] == sorted(factors[peak:total_steps], reverse=True)
    if total_steps > 1:
        # the last step of the run and every step after it sit at the end, peak / 25e4
        assert factors[total_steps - 1:] == pytest.approx([1 / 25e4] * 3)


def test_one_cycle_warms_up_over_the_first_quarter_from_a_25th_of_the_peak():
    factor = one_cycle(100)
    assert factor(0) == pytest.approx(1 / 25)
    assert factor(24) < factor(25) == 1
    assert factor(62) == pytest.approx((1 + 1 / 25e4) / 2, rel=0.02)  # halfway down


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_a_run_of_one_two_or_three_steps_trains_and_records_a_finite_rate(tiny_data, tmp_path,
                                                                          steps):
    # 3 steps is the length at which torch's OneCycleLR divided by zero
    run_ok("--mode", "single", "--data-dir", tiny_data, "--val-samples", 100, "--epochs", 1,
           "--batch-size", 16, "--max-steps", steps, "--lr-schedule", "onecycle",
           "--results-dir", tmp_path, "--run-name", "tiny")
    epochs = json.loads((tmp_path / "tiny.json").read_text())["epochs"]
    assert epochs[0]["steps"] == steps and math.isfinite(epochs[0]["train_loss"])
    assert epochs[0]["lr"] == pytest.approx(3e-3 / 25e4)


def test_onecycle_warms_up_then_decays_every_step_to_almost_nothing(tiny_data, tmp_path):
    run_ok("--mode", "single", "--data-dir", tiny_data, "--val-samples", 100, "--epochs", 2,
           "--batch-size", 50, "--lr-schedule", "onecycle", "--lr", 0.01, "--results-dir",
           tmp_path, "--run-name", "onecycle")
    epochs = json.loads((tmp_path / "onecycle.json").read_text())["epochs"]
    # stepped per optimizer step: halfway through the run the rate is past its peak, on its way
    # down (stepped per epoch, it would still be near its start, 0.01 / 25)
    assert 0.004 < epochs[0]["lr"] < 0.01
    # and at the end it is the peak / (25 x 1e4)
    assert math.isclose(epochs[1]["lr"], 0.01 / 25 / 1e4, rel_tol=1e-3)
