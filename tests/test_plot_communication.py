"""plot_communication.py and plot_timeline.py: the all-reduce figure's model line, the bucket
sweep's bucket counts, and the timeline's rows showing the overlap. The documents and the models'
layouts come from a child with the code under test (plot_documents.py); the figures are drawn
here."""
import pytest

from analysis import cost_model, results_folder
from analysis.cost_model import FIRST_BUCKET_MB
from analysis.plot_communication import plot_allreduce, plot_bucket_sweep
from tests.plot_documents import (
    ALPHA,
    BETA,
    allreduce_bench,
    bucket_runs,
    containers,
    layouts_of_the_code,
    strategy_runs,
    timeline,
)


def test_timeline_has_a_compute_and_a_communication_row_per_rank_and_shows_the_overlap():
    axis = timeline().axes[0]
    # two rows per rank, compute above communication
    assert [label.get_text() for label in axis.get_yticklabels()] == [
        "rank 0 compute", "rank 0 communication", "rank 1 compute", "rank 1 communication"]
    bars = containers(axis)
    backward = [bar for bar in bars["backward"] if bar.get_y() < 0.5]  # rank 0's compute row
    # rank 0's communication row
    bucket = [bar for bar in bars["all-reduce bucket 0"] if 0.5 < bar.get_y() < 1.5]
    # the first three of four steps, in ms from the first event: backward 2-6, 12-16, 22-26;
    # bucket 0 4-7, ...
    assert [bar.get_x() for bar in backward] == pytest.approx([2, 12, 22])
    assert [bar.get_x() for bar in bucket] == pytest.approx([4, 14, 24])
    assert [bar.get_width() for bar in bucket] == pytest.approx([3, 3, 3])
    # each bucket's all-reduce starts while backward is still running
    for all_reduce, compute in zip(bucket, backward):
        assert compute.get_x() < all_reduce.get_x() < compute.get_x() + compute.get_width()


def test_allreduce_model_line_passes_through_data_generated_from_alpha_and_beta():
    figure = plot_allreduce(allreduce_bench()["measurements"])
    latency = figure.axes[0]
    _, labels = latency.get_legend_handles_labels()
    # one entry per implementation and world size, with the fitted α and 1/β
    assert [label.split(" (")[0] for label in labels] == [
        "gloo, 2 processes", "gloo, 4 processes", "ring, 2 processes", "ring, 4 processes"]
    assert "α 50 µs, 1/β 1 GB/s" in labels[0]
    # the model line is the α-β prediction that generated the data, in ms, across the sizes
    fit = [line for line in latency.get_lines() if line.get_gid() == "fit ring 4"][0]
    sizes = fit.get_xdata()
    milliseconds = fit.get_ydata()
    assert sizes[0] == 4096 and sizes[-1] == 16777216
    expected = [1e3 * cost_model.allreduce_time(size, 4, ALPHA, BETA) for size in sizes]
    assert list(milliseconds) == pytest.approx(expected, rel=1e-6)
    assert latency.get_xscale() == latency.get_yscale() == "log"


def test_bucket_sweep_annotates_each_point_with_the_cost_model_bucket_count(monkeypatch):
    layouts = layouts_of_the_code(monkeypatch)
    axis = plot_bucket_sweep(results_folder.repeats(bucket_runs() + strategy_runs())).axes[0]
    lines = containers(axis)
    # one line per bucketing series; the flat runs and the single process have no bucket size
    assert sorted(lines) == ["MLP, ddp, 4 processes", "MLP, manual bucketed, 4 processes"]
    manual, _, _ = lines["MLP, manual bucketed, 4 processes"].lines
    assert list(manual.get_xdata()) == [0.25, 1.0, 4.0]
    # the other phases + exposed
    assert list(manual.get_ydata()) == pytest.approx([8 + 2.5, 8 + 10, 8 + 40])
    layout = layouts["mlp"]
    # DDP's line also has the strategy runs' default 25 MiB
    expected = [len(cost_model.ddp_bucket_sizes(layout, size)) for size in (0.25, 1.0, 4.0, 25.0)]
    expected += [len(cost_model.bucket_sizes(layout, size, FIRST_BUCKET_MB))
                 for size in (0.25, 1.0, 4.0)]
    assert [text.get_text() for text in axis.texts] == [f"{count} buckets" for count in expected]
    # worked by hand from the MLP's layers and the 1 MiB first buckets
    assert expected == [3, 2, 2, 2, 4, 2, 2]
    assert axis.get_xscale() == "log" and "MiB" in axis.get_xlabel()
