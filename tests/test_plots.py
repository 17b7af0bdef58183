"""plots.py draws every figure from a folder of small, schema-valid synthetic results documents."""
import json

import pytest

from analysis import cost_model, plots
from manual_allreduce import DEFAULT_BUCKET_MB
from runtime import results
from runtime.results import SCHEMA, validate
from runtime.timing import FIELDS, chrome_trace, summarize_ranks

ALPHA, BETA = 50e-6, 1e-9  # the all-reduce documents are generated exactly from this α-β model


def step_record(data=0.001, compute=0.007, hidden=0.002, exposed=0.003, busy=None):
    """One step with every timing field, consistent: data + compute + exposed == step, hidden <= busy."""
    record = dict.fromkeys(FIELDS, 0.0)
    busy = hidden + exposed if busy is None else busy
    record.update(data=data, forward=0.002, backward=compute - 0.003, optimizer=0.001, compute=compute,
                  comm_busy=busy, comm_hidden=hidden, comm_exposed=exposed, step=data + compute + exposed)
    record["own_work"] = record["step"] - exposed
    return record


def training_run(model="mlp", mode="manual", sync="flat", world=2, bucket_mb=25.0, throughput=1000.0,
                 repeat=1, **step):
    """A results document (schema 2) with every field results.validate asks for; single processes communicate
    nothing, so all their communication fields are 0."""
    if world == 1 or mode == "ddp-no-sync":
        step.update(hidden=0.0, exposed=0.0, busy=0.0)
    record = step_record(**step)
    epochs = [{"epoch": epoch, "steps": 20, "train_loss": 1.0 / epoch, "train_accuracy": 0.8 + 0.05 * epoch,
               "val_loss": 1.1 / epoch, "val_accuracy": 0.78 + 0.05 * epoch, "epoch_time_s": 1.0,
               "data_s": 0.02, "compute_s": 0.14, "comm_busy_s": 0.1, "comm_hidden_s": 0.04,
               "comm_exposed_s": 0.06, "samples_seen": 640 * world * epoch, "elapsed_s": 1.5 * epoch / world,
               "samples_per_s": throughput, "lr": 0.001} for epoch in (1, 2)]
    return {
        "schema": SCHEMA, "run_name": f"{model}-{mode}-{sync}-w{world}-{bucket_mb}mb-r{repeat}",
        "created": f"2026-01-01T00:00:0{repeat}",
        "config": {"mode": mode, "sync": sync, "bucket_mb": bucket_mb, "compress": None, "model": model,
                   "world_size": world, "run_name": None, "results_dir": "results"},
        "environment": {"torch": "2.13.0+cpu", "python": "3.11", "backend": "gloo", "device": "cpu",
                        "launcher": "local", "world_size": world, "hosts": ["vm"], "cores": 2,
                        "threads_per_rank": 1, "parameters": 567434},
        "epochs": epochs,
        "test": {"loss": 0.4, "accuracy": 0.9},
        "timing": summarize_ranks([[record] * 3 for _ in range(world)]),
        "throughput_samples_per_s": throughput,
    }


def strategy_runs():
    """Three repeats of each configuration; the repeats differ in throughput and in compute time."""
    configurations = (("single", 1, 1000.0), ("ddp-no-sync", 2, 1900.0), ("ddp", 2, 1600.0),
                      ("manual", 2, 1400.0), ("ddp", 4, 2000.0), ("manual", 4, 1800.0))
    runs = []
    for repeat, (scale, extra) in enumerate(((1.0, 0.0), (0.9, 0.002), (1.1, -0.001)), start=1):
        for mode, world, throughput in configurations:
            runs.append(training_run(mode=mode, world=world, throughput=scale * throughput, repeat=repeat,
                                     compute=0.007 + extra))
    return runs


def bucket_runs():
    """Two repeats each of bucketed and DDP at three bucket sizes; exposed time grows with the size."""
    return [training_run(mode=mode, sync="bucketed", world=4, bucket_mb=size, repeat=repeat,
                         exposed=size / 100)
            for mode in ("manual", "ddp") for size in (0.25, 1.0, 4.0) for repeat in (1, 2)]


def allreduce_bench():
    rows = []
    for world in (2, 4):
        for implementation in ("gloo", "ring"):
            for size in (4096, 65536, 1048576, 16777216):
                seconds = cost_model.allreduce_time(size, world, ALPHA, BETA)
                rows.append({"world_size": world, "bytes": size, "implementation": implementation,
                             "median_s": seconds, "p95_s": seconds, "algbw_gbps": size / seconds / 1e9,
                             "busbw_gbps": size / seconds * 2 * (world - 1) / world / 1e9, "verified": True})
    return {"schema": "allreduce-bench/1", "measurements": rows}


def step_bench():
    """Three configurations of benchmarks/step_bench.py's step-bench/2 output (mean seconds per step)."""
    rows = []
    for configuration, hidden, exposed in (("flat", 0, 0.004), ("ddp", 0.003, 0.001), ("ddp-no-sync", 0, 0)):
        record = step_record(hidden=hidden, exposed=exposed)
        overlap = hidden / record["comm_busy"] if record["comm_busy"] else None
        row = {"world_size": 2, "model": "mlp", "configuration": configuration, "steps": 30,
               "overlap": overlap, "step_ratio_to_ddp": 1.0}
        row.update({f"mean_{field}_s": value for field, value in record.items()})
        rows.append(row)
    return {"schema": "step-bench/2", "measurements": rows}


def trace():
    """Two ranks, four steps each: backward from 2 to 6 ms of every step, bucket 0's all-reduce from 4 to 7
    ms (overlapping backward), bucket 1's from 6 to 8 ms, the optimizer after."""
    spans = []
    for step in range(4):
        start = 0.01 * step
        phases = (("data", 0, 0.001), ("forward", 0.001, 0.002), ("backward", 0.002, 0.006),
                  ("sync", 0.006, 0.008), ("optimizer", 0.008, 0.009), ("all-reduce bucket 0", 0.004, 0.007),
                  ("all-reduce bucket 1", 0.006, 0.008))
        spans += [(step, name, start + begin, start + end) for name, begin, end in phases]
    return chrome_trace([(0.0, spans), (-0.0005, spans)])  # rank 1's clock: half a ms later


def grouped(runs):
    return {c: r for c, r in results.repeats(runs).items() if not plots.bucket_variant(c)}


def containers(axis):
    return {container.get_label(): container for container in axis.containers}


def write_folder(folder, documents):
    for index, document in enumerate(documents):
        (folder / f"run-{index}.json").write_text(json.dumps(document))


def timeline():
    return plots.plot_timeline({"trace-bucketed-w2.json": plots.complete_events(trace())})


def test_the_synthetic_documents_are_valid_results():
    # the fixtures are what results.py accepts, so the figures are drawn from real-shaped documents
    for document in strategy_runs() + bucket_runs():
        assert validate(document) == []


def test_main_writes_every_plot_from_a_results_folder(tmp_path, capsys):
    write_folder(tmp_path, strategy_runs() + bucket_runs() + [training_run(model="cnn", world=2)])
    (tmp_path / "allreduce-bench.json").write_text(json.dumps(allreduce_bench()))
    (tmp_path / "step-bench.json").write_text(json.dumps(step_bench()))
    (tmp_path / "trace-bucketed-w2.json").write_text(json.dumps(trace()))
    written = plots.main(["--results-dir", str(tmp_path)])
    # every figure, per model where it is per model
    names = sorted(path.split("/")[-1] for path in written)
    assert names == ["allreduce.png", "bucket-sweep.png", "curves-cnn.png", "curves-mlp.png",
                     "scaling-mlp.png", "step-bench.png", "time-breakdown-cnn.png", "time-breakdown-mlp.png",
                     "timeline.png"]
    # no single-process baseline for the CNN, so no speedup
    assert "scaling-cnn.png: nothing to plot" in capsys.readouterr().out
    for path in written:
        with open(path, "rb") as file:
            assert file.read(8) == b"\x89PNG\r\n\x1a\n"


def test_other_schemas_broken_files_and_missing_data_are_notes_not_errors(tmp_path, capsys):
    (tmp_path / "other.json").write_text(json.dumps({"schema": "something-else/1"}))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "invalid.json").write_text(json.dumps({"schema": SCHEMA}))
    (tmp_path / "old.json").write_text(json.dumps(dict(training_run(), schema="ddp-mnist-results/1")))
    (tmp_path / "trace-empty.json").write_text(json.dumps({"traceEvents": []}))
    (tmp_path / "trace-broken.json").write_text("[1, 2]")
    assert plots.main(["--results-dir", str(tmp_path), "--out-dir", str(tmp_path / "out")]) == []
    output = capsys.readouterr().out
    # a note for each file skipped and each figure without data
    for expected in ("skipped other.json", "skipped broken.json", "skipped invalid.json", "skipped old.json",
                     "skipped trace-broken.json", "allreduce.png: nothing to plot",
                     "step-bench.png: nothing to plot", "bucket-sweep.png: nothing to plot",
                     "timeline.png: nothing to plot"):
        assert expected in output


def test_every_step_time_axis_is_in_milliseconds():
    groups = grouped(strategy_runs())
    figures = [plots.plot_time_breakdown(groups, "mlp"), plots.plot_step_bench(step_bench()["measurements"]),
               plots.plot_bucket_sweep(results.repeats(bucket_runs())), timeline()]
    labels = [figure.axes[0].get_xlabel() + figure.axes[0].get_ylabel() for figure in figures]
    # the breakdowns, the bucket sweep and the timeline in ms, the all-reduce latency too
    assert all("ms " in label for label in labels)
    assert "(ms)" in plots.plot_allreduce(allreduce_bench()["measurements"]).axes[0].get_ylabel()


def test_breakdown_layers_add_up_to_the_median_step_and_a_single_process_has_no_exposed_layer():
    axis = plots.plot_time_breakdown(grouped(strategy_runs()), "mlp").axes[0]
    labels = [label.get_text() for label in axis.get_yticklabels()]
    # one bar per configuration, the single process on top, each saying how many repeats it summarises
    assert labels[:2] == ["single, 1 process, 3 runs", "ddp-no-sync, 2 processes, 3 runs"]
    bars = containers(axis)
    compute, exposed, data = (bars[plots.LAYERS[index][1]] for index in range(3))
    # median compute of the repeats (7, 9, 6 ms) is 7 ms; data 1 ms everywhere
    assert [bar.get_width() for bar in compute] == pytest.approx([7.0] * 6)
    assert [bar.get_width() for bar in data] == pytest.approx([1.0] * 6)
    # exposed only for the four runs that communicate: not on the single process or ddp-no-sync rows
    assert [round(bar.get_y() + bar.get_height() / 2) for bar in exposed] == [2, 3, 4, 5]
    assert [bar.get_width() for bar in exposed] == pytest.approx([3.0] * 4)
    # the stack ends at the median step of the repeats: 8 ms without communication, 11 ms with
    ends = [bar.get_x() + bar.get_width() for bar in data]
    assert ends == pytest.approx([8.0, 8.0, 11.0, 11.0, 11.0, 11.0])


def test_overlap_notes_are_hidden_over_busy_and_absent_without_communication():
    runs = strategy_runs() + [training_run(world=8, hidden=0.001, exposed=0.004, busy=0.006)]
    axis = plots.plot_time_breakdown(grouped(runs), "mlp").axes[0]
    notes = [text.get_text() for text in axis.texts]
    # hidden 2 ms of busy 5 ms for the 2- and 4-process runs; 1 of 6 ms for the 8-process one
    assert notes == ["overlap 40%"] * 4 + ["overlap 17%"]
    # the hatched hidden part beside each bar is the hidden time itself
    hatched = containers(axis)["comm hidden (busy while computing)"]
    assert [bar.get_width() for bar in hatched] == pytest.approx([2.0] * 4 + [1.0])


def test_breakdown_error_bars_span_the_fastest_to_the_slowest_repeat():
    axis = plots.plot_time_breakdown(grouped(strategy_runs()), "mlp").axes[0]
    error_bar = containers(axis)["step: fastest to slowest repeat"]
    segments = error_bar.lines[2][0].get_segments()
    # steps of the repeats: 11, 13 and 10 ms with communication; 8, 10 and 7 ms without
    assert [start[0] for start, _ in segments] == pytest.approx([7] * 2 + [10] * 4)
    assert [end[0] for _, end in segments] == pytest.approx([10] * 2 + [13] * 4)


def test_step_bench_is_the_same_breakdown_without_error_bars():
    axis = plots.plot_step_bench(step_bench()["measurements"]).axes[0]
    # rows in the order of the series, whatever the benchmark's order
    assert [label.get_text() for label in axis.get_yticklabels()] == [
        "ddp-no-sync, 2 processes", "ddp, 2 processes", "flat, 2 processes"]
    bars = containers(axis)
    # exposed layers in ms, none for ddp-no-sync; one measurement per row, so no error bars
    assert [bar.get_width() for bar in bars[plots.LAYERS[1][1]]] == pytest.approx([1.0, 4.0])
    assert "step: fastest to slowest repeat" not in bars
    assert [text.get_text() for text in axis.texts] == ["overlap 75%", "overlap 0%"]


def test_timeline_has_a_compute_and_a_communication_row_per_rank_and_shows_the_overlap():
    axis = timeline().axes[0]
    # two rows per rank, compute above communication
    assert [label.get_text() for label in axis.get_yticklabels()] == [
        "rank 0 compute", "rank 0 communication", "rank 1 compute", "rank 1 communication"]
    bars = containers(axis)
    backward = [bar for bar in bars["backward"] if bar.get_y() < 0.5]  # rank 0's compute row
    bucket = [bar for bar in bars["all-reduce bucket 0"] if 0.5 < bar.get_y() < 1.5]  # its communication row
    # the first three of four steps, in ms from the first event: backward 2-6, 12-16, 22-26; bucket 0 4-7, ...
    assert [bar.get_x() for bar in backward] == pytest.approx([2, 12, 22])
    assert [bar.get_x() for bar in bucket] == pytest.approx([4, 14, 24])
    assert [bar.get_width() for bar in bucket] == pytest.approx([3, 3, 3])
    # each bucket's all-reduce starts while backward is still running
    for all_reduce, compute in zip(bucket, backward):
        assert compute.get_x() < all_reduce.get_x() < compute.get_x() + compute.get_width()


def test_curves_plot_against_samples_seen_and_elapsed_time():
    figure = plots.plot_curves(grouped(strategy_runs()), "mlp")
    by_samples, by_time = figure.axes[0], figure.axes[1]
    # one legend entry per configuration, in the order of the series
    assert by_samples.get_legend_handles_labels()[1][:3] == ["single, 1 process", "ddp-no-sync, 2 processes",
                                                             "ddp, 2 processes"]
    # three repeats of six configurations, each a line
    assert len(by_samples.get_lines()) == len(by_time.get_lines()) == 18
    four_processes = [line for line in by_samples.get_lines() if line.get_label() == "ddp, 4 processes"][0]
    # x is the epochs' samples_seen on the left, their elapsed_s on the right, never the epoch number
    assert list(four_processes.get_xdata()) == [640 * 4, 640 * 4 * 2]
    assert list(by_time.get_lines()[0].get_xdata()) == [1.5, 3.0]
    # validation accuracy in percent
    assert list(by_samples.get_lines()[0].get_ydata()) == pytest.approx([83.0, 88.0])


def test_scaling_is_the_median_of_repeats_with_min_max_bars_ideal_and_the_compute_ceiling():
    axis = plots.plot_scaling(grouped(strategy_runs()), "mlp").axes[1]
    lines = containers(axis)
    # median speedups, starting from the single process
    assert list(lines["ddp"].lines[0].get_ydata()) == pytest.approx([1.0, 1.6, 2.0])
    # speedup bars: throughput repeats of 0.9x to 1.1x over the median single process
    segments = lines["ddp"].lines[2][0].get_segments()
    assert [low[1] for low, _ in segments] == pytest.approx([0.9, 1.44, 1.8])
    assert [high[1] for _, high in segments] == pytest.approx([1.1, 1.76, 2.2])
    # ddp-no-sync drawn dashed as the ceiling, and the ideal line
    ceiling = lines["ddp-no-sync: compute ceiling (no communication)"].lines[0]
    assert ceiling.get_linestyle() == "--" and list(ceiling.get_ydata()) == pytest.approx([1.0, 1.9])
    ideal = [line for line in axis.get_lines() if line.get_label() == "ideal (linear)"][0]
    assert list(ideal.get_ydata()) == [1, 2, 4]


def test_allreduce_model_line_passes_through_data_generated_from_alpha_and_beta():
    figure = plots.plot_allreduce(allreduce_bench()["measurements"])
    latency = figure.axes[0]
    labels = latency.get_legend_handles_labels()[1]
    # one entry per implementation and world size, with the fitted α and 1/β
    assert [label.split(" (")[0] for label in labels] == [
        "gloo, 2 processes", "gloo, 4 processes", "ring, 2 processes", "ring, 4 processes"]
    assert "α 50 µs, 1/β 1 GB/s" in labels[0]
    # the model line is the α-β prediction that generated the data, in ms, across the measured sizes
    fit = [line for line in latency.get_lines() if line.get_gid() == "fit ring 4"][0]
    sizes, milliseconds = fit.get_xdata(), fit.get_ydata()
    assert sizes[0] == 4096 and sizes[-1] == 16777216
    expected = [1e3 * cost_model.allreduce_time(size, 4, ALPHA, BETA) for size in sizes]
    assert list(milliseconds) == pytest.approx(expected, rel=1e-6)
    assert latency.get_xscale() == latency.get_yscale() == "log"


def test_bucket_sweep_annotates_each_point_with_the_cost_model_bucket_count():
    axis = plots.plot_bucket_sweep(results.repeats(bucket_runs() + strategy_runs())).axes[0]
    lines = containers(axis)
    # one line per bucketing series; the flat runs and the single process have no bucket size to vary
    assert sorted(lines) == ["MLP, ddp, 4 processes", "MLP, manual bucketed, 4 processes"]
    manual = lines["MLP, manual bucketed, 4 processes"].lines[0]
    assert list(manual.get_xdata()) == [0.25, 1.0, 4.0]
    assert list(manual.get_ydata()) == pytest.approx([8 + 2.5, 8 + 10, 8 + 40])  # the other phases + exposed
    layout = plots.parameter_bytes("mlp")
    first = plots.first_bucket_mb()
    # DDP's line also has the strategy runs' default 25 MiB
    expected = [len(cost_model.ddp_bucket_sizes(layout, size)) for size in (0.25, 1.0, 4.0, 25.0)]
    expected += [len(cost_model.bucket_sizes(layout, size, first)) for size in (0.25, 1.0, 4.0)]
    assert [text.get_text() for text in axis.texts] == [f"{count} buckets" for count in expected]
    # worked by hand from the MLP's layers and the 1 MiB first buckets
    assert expected == [3, 2, 2, 2, 4, 2, 2]
    assert axis.get_xscale() == "log" and "MiB" in axis.get_xlabel()


def test_only_bucketed_and_ddp_runs_at_another_bucket_size_stay_out_of_the_strategy_plots():
    assert plots.bucket_variant(("mlp", "ddp", 4, 1.0))
    assert plots.bucket_variant(("mlp", "manual bucketed", 4, 0.25))
    assert not plots.bucket_variant(("mlp", "manual bucketed", 4, DEFAULT_BUCKET_MB))
    # the bucket size does not change what flat or ddp-no-sync send
    assert not plots.bucket_variant(("mlp", "manual flat", 2, 1.0))
    assert not plots.bucket_variant(("mlp", "ddp-no-sync", 2, 1.0))
