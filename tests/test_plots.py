"""plots.py draws every figure from a folder of small, schema-valid synthetic results documents."""
import json

import pytest

import plots
from results import SCHEMA, validate
from timing import summarize_ranks


def training_run(model="mlp", mode="manual", sync="flat", world=2, bucket_mb=25.0, throughput=1000.0,
                 created="2026-01-01T00:00:00", max_steps=20, step=None):
    """A results document with every field results.validate asks for; timings are fixed per phase."""
    step = {"data": 0.001, "forward": 0.002, "backward": 0.004, "sync": 0.003, "optimizer": 0.001,
            "comm_busy": 0.005, **(step or {})}
    step["step"] = sum(value for key, value in step.items() if key != "comm_busy")
    epochs = [{"epoch": epoch, "steps": max_steps, "train_loss": 1.0 / epoch, "train_accuracy": 0.8 + 0.05 * epoch,
               "val_loss": 1.1 / epoch, "val_accuracy": 0.78 + 0.05 * epoch, "epoch_time_s": 1.0, "data_s": 0.02,
               "compute_s": 0.14, "comm_exposed_s": 0.06, "comm_busy_s": 0.1, "samples_per_s": throughput,
               "lr": 0.001} for epoch in (1, 2)]
    return {
        "schema": SCHEMA, "run_name": f"{model}-{mode}-{sync}-w{world}-{bucket_mb}", "created": created,
        "config": {"mode": mode, "sync": sync, "bucket_mb": bucket_mb, "compress": None, "model": model,
                   "max_steps": max_steps, "world_size": world, "run_name": None, "results_dir": "results"},
        "environment": {"torch": "2.13.0+cpu", "python": "3.11", "backend": "gloo", "device": "cpu",
                        "launcher": "local", "world_size": world, "hosts": ["vm"], "cores": 2,
                        "threads_per_rank": 1, "parameters": 567434},
        "epochs": epochs,
        "test": {"loss": 0.4, "accuracy": 0.9},
        "timing": summarize_ranks([[step] * 3 for _ in range(world)]),
        "throughput_samples_per_s": throughput,
    }


def allreduce_bench():
    rows = [{"world_size": world, "bytes": size, "implementation": implementation, "median_s": size / 1e9,
             "p95_s": size / 8e8, "algbw_gbps": 1.0, "busbw_gbps": 1.0 * (world - 1) / world}
            for world in (2, 4) for implementation in ("gloo", "ring") for size in (4096, 65536, 1048576)]
    return {"schema": "allreduce-bench/1", "measurements": rows}


def step_bench():
    """Two configurations of benchmarks/step_bench.py's output; DDP's exposed time hides inside its backward."""
    common = {"world_size": 2, "model": "mlp", "median_forward_s": 0.002, "median_optimizer_s": 0.001}
    rows = [dict(common, configuration="ddp", median_backward_s=0.009, median_sync_s=0.0,
                 median_exposed_comm_s=0.004, median_comm_busy_s=0.005),
            dict(common, configuration="flat", median_backward_s=0.005, median_sync_s=0.006,
                 median_exposed_comm_s=0.006, median_comm_busy_s=0.003)]
    return {"schema": "step-bench/1", "measurements": rows}


def strategy_runs():
    return [training_run(mode="single", sync="per-param", world=1, throughput=1000.0),
            training_run(mode="ddp", world=2, throughput=1600.0), training_run(world=2, throughput=1400.0),
            training_run(mode="ddp", world=4, throughput=2000.0), training_run(world=4, throughput=1800.0)]


def bucket_runs():
    return [training_run(mode=mode, sync="bucketed", world=4, bucket_mb=size, step=dict(sync=size / 100))
            for mode in ("manual", "ddp") for size in (1.0, 4.0, 25.0)]


def write_folder(folder, documents):
    for index, document in enumerate(documents):
        (folder / f"run-{index}.json").write_text(json.dumps(document))


def legend_labels(axis):
    return axis.get_legend_handles_labels()[1]


def test_the_synthetic_documents_are_valid_results():
    for document in strategy_runs() + bucket_runs():
        assert validate(document) == []


def test_main_writes_every_plot_from_a_results_folder(tmp_path, capsys):
    write_folder(tmp_path, strategy_runs() + bucket_runs() + [training_run(model="cnn", world=2)])
    (tmp_path / "allreduce-bench.json").write_text(json.dumps(allreduce_bench()))
    (tmp_path / "step-bench.json").write_text(json.dumps(step_bench()))
    written = plots.main(["--results-dir", str(tmp_path)])
    names = sorted(path.split("/")[-1] for path in written)
    assert names == ["allreduce.png", "bucket-sweep.png", "curves-cnn.png", "curves-mlp.png", "scaling-mlp.png",
                     "step-bench.png", "time-breakdown-cnn.png", "time-breakdown-mlp.png"]
    assert "scaling-cnn.png: nothing to plot" in capsys.readouterr().out  # no single-process baseline for the CNN
    for path in written:
        with open(path, "rb") as file:
            assert file.read(8) == b"\x89PNG\r\n\x1a\n"


def test_other_schemas_broken_files_and_missing_data_are_notes_not_errors(tmp_path, capsys):
    (tmp_path / "other.json").write_text(json.dumps({"schema": "something-else/1"}))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "invalid.json").write_text(json.dumps({"schema": SCHEMA}))
    assert plots.main(["--results-dir", str(tmp_path), "--out-dir", str(tmp_path / "out")]) == []
    output = capsys.readouterr().out
    for expected in ("skipped other.json", "skipped broken.json", "skipped invalid.json",
                     "allreduce.png: nothing to plot", "step-bench.png: nothing to plot",
                     "bucket-sweep.png: nothing to plot"):
        assert expected in output


def test_curves_have_one_line_per_strategy_and_world_size():
    figure = plots.plot_curves(plots.newest_per_series(strategy_runs()), "mlp")
    assert legend_labels(figure.axes[0]) == ["single, 1 process", "ddp, 2 processes", "manual flat, 2 processes",
                                             "ddp, 4 processes", "manual flat, 4 processes"]
    assert [line.get_ydata()[-1] for line in figure.axes[3].get_lines()] == pytest.approx([88.0] * 5)


def test_time_breakdown_stacks_compute_then_exposed_communication_then_data():
    runs = plots.newest_per_series(strategy_runs())
    axis = plots.plot_time_breakdown(runs, "mlp").axes[0]
    compute, exposed, data = ([bar.get_height() for bar in container] for container in axis.containers)
    assert compute == pytest.approx([0.007] * 5)  # forward + backward + optimizer
    assert exposed == pytest.approx([0.003] * 5)
    assert data == pytest.approx([0.001] * 5)
    overlaps = [text.get_text() for text in axis.texts if text.get_text().startswith("overlap")]  # none for 1 process
    assert overlaps == ["overlap 40%"] * 4  # 1 - 0.06 / 0.1, DDP included: its exposed time is calibrated


def test_scaling_lines_start_at_the_single_process_baseline_and_show_the_ideal():
    figure = plots.plot_scaling(plots.newest_per_series(strategy_runs()), "mlp")
    speedup = {line.get_label(): list(line.get_ydata()) for line in figure.axes[1].get_lines()}
    assert speedup["ddp"] == pytest.approx([1.0, 1.6, 2.0])
    assert speedup["manual flat"] == pytest.approx([1.0, 1.4, 1.8])
    assert speedup["ideal (linear)"] == [1, 2, 4]
    efficiency = {line.get_label(): list(line.get_ydata()) for line in figure.axes[2].get_lines()}
    assert efficiency["ddp"] == pytest.approx([1.0, 0.8, 0.5])


def test_allreduce_has_one_line_per_implementation_and_world_size_on_log_axes():
    figure = plots.plot_allreduce(allreduce_bench()["measurements"])
    assert legend_labels(figure.axes[0]) == ["gloo, 2 processes", "gloo, 4 processes", "ring, 2 processes",
                                             "ring, 4 processes"]
    assert figure.axes[0].get_xscale() == figure.axes[1].get_yscale() == "log"


def test_step_bench_moves_ddps_measured_waiting_out_of_compute_and_shows_negative_overlap():
    axis = plots.plot_step_bench(step_bench()["measurements"]).axes[0]
    compute, exposed = ([bar.get_height() for bar in container] for container in axis.containers)
    assert compute == pytest.approx([0.002 + 0.009 + 0.001 - 0.004, 0.002 + 0.005 + 0.001])
    assert exposed == pytest.approx([0.004, 0.006])
    assert [text.get_text() for text in axis.texts] == ["overlap 20%", "overlap -100%"]  # 1 - 6 / 3


def test_bucket_sweep_groups_runs_that_differ_only_in_bucket_size():
    lone = training_run(world=4, sync="bucketed", bucket_mb=2.0, max_steps=99)  # differs in max_steps too
    axis = plots.plot_bucket_sweep(bucket_runs() + strategy_runs() + [lone]).axes[0]
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in axis.get_lines()}
    assert sorted(lines) == ["MLP, ddp, 4 processes", "MLP, manual bucketed, 4 processes"]
    buckets, step_times = lines["MLP, manual bucketed, 4 processes"]
    assert buckets == [1.0, 4.0, 25.0]
    assert step_times == pytest.approx([0.008 + 0.01, 0.008 + 0.04, 0.008 + 0.25])  # the other phases + sync


def test_bucket_size_variants_stay_out_of_the_strategy_plots_and_the_newest_run_wins():
    newer = training_run(world=2, throughput=1500.0, created="2026-02-01T00:00:00")
    runs = [run for run in strategy_runs() + bucket_runs() + [newer] if not plots.is_bucket_variant(run)]
    chosen = plots.newest_per_series(runs)
    assert [(plots.series_label(run), plots.world_size(run)) for run in chosen] == [
        ("single", 1), ("ddp", 2), ("manual flat", 2), ("ddp", 4), ("manual flat", 4), ("manual bucketed", 4)]
    assert chosen[2]["throughput_samples_per_s"] == 1500.0


def test_the_default_bucket_size_is_mlp_ddps():
    import mlp_ddp
    assert plots.DEFAULT_BUCKET_MB == mlp_ddp.parse_args([]).bucket_mb
