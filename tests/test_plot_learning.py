"""plot_learning.py: learning curves against samples seen and wall-clock; scaling as the median of
repeats with min-max bars, the ideal line and the compute ceiling."""
import json

import pytest

from analysis.plot_learning import plot_curves, plot_memory, plot_scaling
from tests.plot_documents import containers, grouped, strategy_runs

pytestmark = pytest.mark.rubric("design.numbers")


def test_curves_plot_against_samples_seen_and_elapsed_time():
    figure = plot_curves(grouped(strategy_runs()), "mlp")
    by_samples = figure.axes[0]
    by_time = figure.axes[1]
    # one legend entry per configuration, in the order of the series
    _, labels = by_samples.get_legend_handles_labels()
    assert labels[:3] == ["single, 1 process", "ddp-no-sync, 2 processes", "ddp, 2 processes"]
    # three repeats of six configurations, each a line
    assert len(by_samples.get_lines()) == len(by_time.get_lines()) == 18
    four_processes = [line for line in by_samples.get_lines()
                      if line.get_label() == "ddp, 4 processes"][0]
    # x is the epochs' samples_seen on the left, their elapsed_s on the right, never the epoch
    assert list(four_processes.get_xdata()) == [640 * 4, 640 * 4 * 2]
    assert list(by_time.get_lines()[0].get_xdata()) == [1.5, 3.0]
    # validation accuracy in percent
    assert list(by_samples.get_lines()[0].get_ydata()) == pytest.approx([83.0, 88.0])


def test_scaling_is_the_median_of_repeats_with_min_max_bars_ideal_and_the_compute_ceiling():
    axis = plot_scaling(grouped(strategy_runs()), "mlp").axes[1]
    lines = containers(axis)
    ddp_line, _, (ddp_bars,) = lines["ddp"].lines
    # median speedups, starting from the single process
    assert list(ddp_line.get_ydata()) == pytest.approx([1.0, 1.6, 2.0])
    # speedup bars pair each run with the single process of its round: the repeats scale both
    # alike (0.9x to 1.1x), so every round's speedup is the same and the bars have no length; one
    # process over itself is 1 in every round
    segments = ddp_bars.get_segments()
    assert [low[1] for low, _ in segments] == pytest.approx([1.0, 1.6, 2.0])
    assert [high[1] for _, high in segments] == pytest.approx([1.0, 1.6, 2.0])
    # ddp-no-sync drawn dashed as the ceiling, and the ideal line
    ceiling, _, _ = lines["ddp-no-sync: compute ceiling (no communication)"].lines
    assert ceiling.get_linestyle() == "--"
    assert list(ceiling.get_ydata()) == pytest.approx([1.0, 1.9])
    ideal = [line for line in axis.get_lines() if line.get_label() == "ideal (linear)"][0]
    assert list(ideal.get_ydata()) == [1, 2, 4]


def test_memory_per_rank_draws_each_levels_formula_and_its_counted_median(tmp_path):
    # DDP's and ZeRO-3's model states as counted: ZeRO-3's one repeat at 2 ranks 10 bytes high
    rows = [{"model": "mlp", "configuration": level, "world_size": world, "parameters": 1e6,
             "held_bytes": {"model_states": 16e6 / (world if level == "zero3" else 1) + extra}}
            for level in ("ddp", "zero3") for world in (1, 2) for extra in (0, 10 * (world == 2))]
    path = tmp_path / "sharding.json"
    path.write_text(json.dumps({"measurements": rows}))
    axis = plot_memory(str(path)).axes[0]
    lines = {line.get_label(): line for line in axis.get_lines()}
    # the formulas: 16 bytes a parameter, ZeRO-3's over n; the points: the median of the repeats
    assert list(lines["DDP"].get_ydata()) == pytest.approx([16.0, 16.0])
    assert list(lines["ZeRO-3"].get_ydata()) == pytest.approx([16.0, 8.0])
    points = [line for line in axis.get_lines() if line.get_marker() == "o"]
    assert list(points[-1].get_ydata()) == pytest.approx([16.0, 8.000005])
    assert plot_memory(str(tmp_path / "missing.json")) is None
