"""plots.py draws every figure from a folder of small, schema-valid synthetic results documents;
what the figures share: step times in ms, and which runs the strategy figures leave out. The
documents come from a child with the code under test (plot_documents.py). The figures are drawn
here, but for those that rest on the cost model (allreduce.png's fit and bucket-sweep.png's bucket
counts: the student's derivations) and on the models' layouts, which are drawn in a child too.
Under the figures, analysis/results_folder.py: repeats grouped, each run's means per step, their
median and spread."""
import contextlib
import io
import json

import pytest

from analysis import plots
from analysis.plot_breakdown import plot_time_breakdown
from analysis.plot_common import bucket_variant
from analysis.results_folder import load_folder, per_step, repeats, spread
from grading.launch import run_alone
from runtime.options import DEFAULT_BUCKET_MB
from runtime.results import SCHEMA, validate
from runtime.timing import FIELDS
from tests.plot_documents import (
    bucket_runs,
    grouped,
    made,
    strategy_runs,
    timeline,
    trace,
    training_run,
    write_folder,
)

pytestmark = pytest.mark.rubric("design.numbers")


def test_the_synthetic_documents_are_valid_results():
    # the fixtures are what results.py accepts, so the figures are drawn from real-shaped documents
    for document in strategy_runs() + bucket_runs():
        assert validate(document) == []


def plots_main(argv):
    """plots.main(argv) and what it printed. Run in a child: allreduce.png and bucket-sweep.png
    rest on the cost model and the models."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        written = plots.main(argv)
    return written, printed.getvalue()


def test_main_writes_every_plot_from_a_results_folder(tmp_path):
    cnn = training_run(model="cnn", world=2)
    write_folder(tmp_path, strategy_runs() + bucket_runs() + [cnn])
    # the α-β model's times, made in a child (the cost model is the code under test)
    (tmp_path / "allreduce-bench.json").write_text(json.dumps(made("allreduce_bench")))
    (tmp_path / "trace-bucketed-w2.json").write_text(json.dumps(trace()))
    written, printed = run_alone(plots_main, ["--results-dir", str(tmp_path)])
    # every figure, per model where it is per model
    names = sorted(path.split("/")[-1] for path in written)
    assert names == ["allreduce.png", "bucket-sweep.png", "curves-cnn.png", "curves-mlp.png",
                     "scaling-mlp.png", "time-breakdown-cnn.png", "time-breakdown-mlp.png",
                     "timeline.png"]
    # no single-process baseline for the CNN, so no speedup
    assert "scaling-cnn.png: nothing to plot" in printed
    for path in written:
        with open(path, "rb") as file:
            assert file.read(8) == b"\x89PNG\r\n\x1a\n"


def test_other_schemas_broken_files_and_missing_data_are_notes_not_errors(tmp_path, capsys):
    old = dict(training_run(), schema="ddp-mnist-results/1")
    (tmp_path / "other.json").write_text(json.dumps({"schema": "something-else/1"}))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "invalid.json").write_text(json.dumps({"schema": SCHEMA}))
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "trace-empty.json").write_text(json.dumps({"traceEvents": []}))
    (tmp_path / "trace-broken.json").write_text("[1, 2]")
    out_dir = str(tmp_path / "out")
    assert plots.main(["--results-dir", str(tmp_path), "--out-dir", out_dir]) == []
    output = capsys.readouterr().out
    # a note for each file skipped and each figure without data
    for expected in ("skipped other.json", "skipped broken.json", "skipped invalid.json",
                     "skipped old.json", "skipped trace-broken.json",
                     "allreduce.png: nothing to plot", "bucket-sweep.png: nothing to plot",
                     "timeline.png: nothing to plot"):
        assert expected in output


def test_a_step_bench_file_of_an_older_schema_is_skipped_with_the_command_to_rerun(tmp_path):
    (tmp_path / "step-bench.json").write_text(json.dumps({"schema": "step-bench/2",
                                                          "measurements": []}))
    notes = []
    _runs, benchmarks = load_folder(str(tmp_path), note=notes.append)
    # nothing to draw from it, and the note says how to write it again
    assert benchmarks["step-bench/3"] == []
    assert notes == ["note: skipped step-bench.json: schema 'step-bench/2' is older than "
                     "step-bench/3: run python -m benchmarks.step_bench again"]


def cost_model_axes():
    """(the bucket sweep's axis labels, the all-reduce latency's y label). Run in a child: both
    figures rest on the cost model."""
    from analysis.plot_communication import plot_allreduce, plot_bucket_sweep
    from tests.plot_documents import allreduce_bench, make_bucket_runs

    sweep = plot_bucket_sweep(repeats(make_bucket_runs())).axes[0]
    latency = plot_allreduce(allreduce_bench()["measurements"]).axes[0]
    return sweep.get_xlabel() + sweep.get_ylabel(), latency.get_ylabel()


def test_every_step_time_axis_is_in_milliseconds():
    figures = [plot_time_breakdown(grouped(strategy_runs()), "mlp"), timeline()]
    labels = [figure.axes[0].get_xlabel() + figure.axes[0].get_ylabel() for figure in figures]
    sweep_labels, latency_label = run_alone(cost_model_axes)
    # the breakdown, the bucket sweep and the timeline in ms, the all-reduce latency too
    assert all("ms " in label for label in labels + [sweep_labels])
    assert "(ms)" in latency_label


def test_only_bucketed_and_ddp_runs_at_another_bucket_size_stay_out_of_the_strategy_plots():
    assert bucket_variant(("mlp", "ddp", 4, 1.0))
    assert bucket_variant(("mlp", "manual bucketed", 4, 0.25))
    assert not bucket_variant(("mlp", "manual bucketed", 4, DEFAULT_BUCKET_MB))
    # the bucket size does not change what flat or ddp-no-sync send
    assert not bucket_variant(("mlp", "manual flat", 2, 1.0))
    assert not bucket_variant(("mlp", "ddp-no-sync", 2, 1.0))


def timed_run(sync="flat", world=2, created="2026-01-01", step=0.010, hidden=0.002, busy=0.005,
              transport="auto"):
    """The parts of a results document that results_folder reads."""
    means = dict.fromkeys(FIELDS, 0.0)
    means.update(step=step, comm_hidden=hidden, comm_busy=busy)
    return {"config": {"mode": "manual", "sync": sync, "transport": transport, "model": "mlp",
                       "bucket_mb": 25},
            "environment": {"world_size": world}, "created": created,
            "timing": {"across_ranks": {field: {"mean": value} for field, value in means.items()},
                       "straggler": 1.1},
            "throughput_samples_per_s": 1000.0}


def test_the_median_of_an_even_count_of_repeats_is_the_mean_of_the_two_middle_ones():
    # statistics.median, as timing.summarize takes it
    assert spread([0.4, 0.1, 0.3, 0.2]) == {"median": 0.25, "min": 0.1, "max": 0.4, "n": 4}
    assert spread([0.3, 0.1, 0.2])["median"] == 0.2
    assert spread([]) is None


def test_a_runs_overlap_is_hidden_over_busy_and_none_without_communication():
    assert per_step(timed_run(hidden=0.002, busy=0.005))["overlap"] == pytest.approx(0.4)
    assert per_step(timed_run(hidden=0.0, busy=0.0))["overlap"] is None
    # the means of every timed field, with the throughput and the straggler beside them
    means = per_step(timed_run())
    assert means["step"] == 0.010 and means["straggler"] == 1.1


def test_repeats_are_grouped_by_configuration_oldest_first():
    runs = [timed_run(created="2026-01-03"), timed_run(transport="ring"), timed_run(),
            timed_run(created="2026-01-02"), timed_run(world=4)]
    by_configuration = repeats(runs)
    assert sorted(by_configuration) == [("mlp", "manual flat", 2, 25.0),
                                        ("mlp", "manual flat", 4, 25.0),
                                        ("mlp", "manual flat-ring", 2, 25.0)]
    flat = by_configuration[("mlp", "manual flat", 2, 25.0)]
    assert [repeat["created"] for repeat in flat] == ["2026-01-01", "2026-01-02", "2026-01-03"]


def test_a_round_run_again_under_another_name_replaces_the_older_run_never_pools_with_it():
    # the flat buffer over the ring, round 1, written under its old and its new run name
    old, new, other = (dict(timed_run(transport="ring", created=created), path=f"{name}.json")
                       for created, name in (("2026-01-01", "sweep-mlp-manual-ring-w2-r1"),
                                             ("2026-01-05", "sweep-mlp-manual-flat-ring-w2-r1"),
                                             ("2026-01-02", "sweep-mlp-manual-ring-w2-r2")))
    grouped = repeats([new, other, old], "sweep")
    assert grouped == {("mlp", "manual flat-ring", 2, 25.0): [new, other]}
    # rounds of another sweep are its own
    bucket = dict(old, path="bucket-mlp-manual-ring-w2-r1.json")
    assert len(repeats([new, bucket])[("mlp", "manual flat-ring", 2, 25.0)]) == 2


OLD_CONFIGS = {  # as runs made before --transport recorded them -> (sync, transport) today
    "manual flat-ring": ({"mode": "manual", "sync": "ring", "comm_hook": "none"}, ("flat", "ring")),
    "manual flat-shm": ({"mode": "manual", "sync": "shm", "comm_hook": "none"}, ("flat", "shm")),
    "manual bucketed": ({"mode": "manual", "sync": "bucketed", "comm_hook": "none"},
                        ("bucketed", "auto")),
    "ddp over shm": ({"mode": "ddp", "sync": "bucketed", "comm_hook": "shm"}, ("bucketed", "shm")),
    "sharded": ({"mode": "sharded", "sync": "bucketed", "comm_hook": "none",
                 "collectives": "ring"}, ("bucketed", "ring")),
    "single": ({"mode": "single", "sync": "bucketed", "comm_hook": "none"}, ("bucketed", None)),
}


@pytest.mark.parametrize("series", OLD_CONFIGS, ids=OLD_CONFIGS)
def test_runs_recorded_with_the_replaced_options_are_read_in_todays_names(series):
    from analysis.results_folder import series_name
    from runtime.results import current_options

    old, (sync, transport) = OLD_CONFIGS[series]
    current = current_options(dict(old, model="mlp", bucket_mb=25))
    assert (current["sync"], current["transport"]) == (sync, transport)
    assert "comm_hook" not in current and "collectives" not in current
    assert current["model"] == "mlp" and current["bucket_mb"] == 25  # the rest as recorded
    # and named as the sweep and the document name them
    assert series_name({"config": old}) == series


def test_a_pair_without_a_configuration_name_is_named_by_both_options():
    from analysis.results_folder import series_name

    config = {"mode": "manual", "sync": "bucketed", "transport": "ring"}
    assert series_name({"config": config}) == "manual bucketed over ring"


def test_a_config_in_todays_names_is_read_as_it_is():
    from runtime.results import current_options

    config = {"mode": "manual", "sync": "flat", "transport": "ring", "model": "mlp"}
    assert current_options(config) is config


def projected_ring_line():
    """(ranks, efficiency) of the projected figure's 25 Gbit/s ring line for a synthetic single
    process, and whether a folder without one is skipped. In a child: it rests on the cost model."""
    from analysis.plot_learning import plot_projected_efficiency

    single = {"timing": {"across_ranks": {"compute": {"mean": 0.004}}},
              "memory": {"per_rank": [{"gradients": 2_000_000}]}}
    figure = plot_projected_efficiency({("mlp", "single", 1, 25.0): [single] * 3,
                                        ("mlp", "manual flat", 2, 25.0): [timed_run()]})
    line, = [line for line in figure.axes[0].lines if line.get_gid() == "25g ring"]
    skipped = plot_projected_efficiency({("mlp", "manual flat", 2, 25.0): [timed_run()]}) is None
    return [list(map(float, values)) for values in line.get_data()], skipped


def test_the_projected_efficiency_is_compute_over_compute_and_one_flat_ring_all_reduce():
    (ranks, efficiency), skipped = run_alone(projected_ring_line)
    # at 64 ranks: 2(n-1) message steps of 25 µs, 2(n-1)/n of the bytes at 25 Gbit/s
    comm = 2 * 63 * 25e-6 + 2 * 63 / 64 * 2_000_000 * 8 / 25e9
    assert efficiency[ranks.index(64)] == pytest.approx(0.004 / (0.004 + comm))
    assert skipped
