"""benchmarks/time_to_accuracy.py: the time-to-target arithmetic (accuracy_curve.py,
time_to_accuracy_summary.py) and a tiny run end to end (and resumed). No speed is asserted.
One-cycle: test_learning_rate_schedule.py."""
import json

import pytest

from analysis import design_numbers
from analysis.design_end_to_end import time_to_accuracy_section
from analysis.design_numbers import Numbers
from benchmarks import time_to_accuracy as tta
from benchmarks.accuracy_curve import evaluation_steps, time_to_target
from benchmarks.time_to_accuracy_summary import median_or_none
from grading.launch import run_python, without_offline_data


def curve(*points):
    """A curve from (time_s, accuracy) pairs, 100 samples apart."""
    return [{"time_s": time, "samples": 100 * (index + 1), "test_accuracy": accuracy}
            for index, (time, accuracy) in enumerate(points)]


def test_time_to_target_is_the_first_evaluation_at_or_above_it():
    points = curve((1.0, 0.95), (2.0, 0.99), (3.0, 0.98), (4.0, 0.995))
    # 0.99 is reached at the second point, not at the later, higher one
    assert time_to_target(points, 0.99) == (2.0, 200)
    # a target met exactly counts as reached
    assert time_to_target(points, 0.95) == (1.0, 100)


def test_a_target_never_reached_has_no_time_and_a_median_of_such_repeats_is_none():
    assert time_to_target(curve((1.0, 0.5)), 0.99) == (None, None)
    # one repeat of three never reached: it counts as slowest, the median is the other two's max
    assert median_or_none([3.0, None, 1.0]) == 3.0
    assert median_or_none([None, None, 1.0]) is None
    assert median_or_none([]) is None


def test_evaluations_are_evenly_spaced_and_the_last_ends_the_epoch():
    assert evaluation_steps(100, 4) == {25, 50, 75, 100}
    assert evaluation_steps(3, 4) == {1, 2, 3}  # fewer steps than evaluations: each step


def run_benchmark(*options):
    """The benchmark as a user runs it; its output, after checking it succeeded."""
    done = run_python(["-m", "benchmarks.time_to_accuracy", *options], timeout=120,
                      env=without_offline_data())
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_tiny_run_writes_curves_times_to_target_and_ratios_and_resumes(tiny_data, tmp_path):
    output = tmp_path / "tta.json"
    options = ("--data-dir", tiny_data, "--models", "mlp", "--world-sizes", "1,2", "--repeats", 1,
               "--mlp-target", 0.3, "--classic-epochs", 1, "--evals-per-epoch", 2,
               "--mlp-options", "--batch-size 32 --epochs 2 --lr-schedule onecycle",
               "--output", output)
    printed = run_benchmark(*options)
    assert "target:" in printed
    document = json.loads(output.read_text())
    assert document["schema"] == tta.SCHEMA and document["targets"]["mlp"] == 0.3
    runs = {(run["name"], run["world_size"]): run for run in document["runs"]}
    # the recipe, one process of ours, and the default config at 2 ranks
    assert set(runs) == {("classic", 1), ("single", 1), ("flat-shm", 2)}
    for run in runs.values():
        times = [point["time_s"] for point in run["curve"]]
        assert times == sorted(times) and run["evaluation_s"] > 0 and run["setup_s"] > 0
        # the time to target is the curve's first crossing (the learnable tiny data passes 30 %)
        first = next(point for point in run["curve"] if point["test_accuracy"] >= 0.3)
        assert run["time_to_target_s"]["mlp"] == first["time_s"]
        assert run["samples_to_target"]["mlp"] == first["samples"]
    # ours' samples: the global batch (32) per step, whatever the world size
    assert runs[("flat-shm", 2)]["curve"][0]["samples"] % 32 == 0
    summary = {(row["name"], row["world_size"]): row for row in document["summary"]}
    classic = summary[("classic", 1)]["median_time_to_target_s"]
    ours = summary[("flat-shm", 2)]
    assert ours["ratio_to_classic"] == pytest.approx(ours["median_time_to_target_s"] / classic)
    # resumed: every run is kept, none runs again
    assert run_benchmark(*options, "--resume").count("kept from") == 3
    assert len(json.loads(output.read_text())["runs"]) == 3


BAD_OPTIONS = {
    "unknown model": ("--models", "rnn"),
    "config without a name": ("--configs", "--mode ddp"),
    "bad training option": ("--cnn-options", "--lr-schedule cosine"),
    "global batch not divisible": ("--world-sizes", "3", "--models", "mlp"),
    "no repeats": ("--repeats", "0"),
}


@pytest.mark.parametrize("options", BAD_OPTIONS.values(), ids=BAD_OPTIONS.keys())
def test_bad_options_exit_2_with_one_line(options, capsys):
    with pytest.raises(SystemExit) as exit_:
        tta.parse_args(list(options))
    assert exit_.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_design_document_pairs_each_time_to_target_with_ours_alone_in_the_same_repeat(
        tmp_path):
    # repeat 2 ran in a slow spell, every run twice as long: only ratios within a repeat hold
    runs = []
    for repeat in range(6):
        slow = 2.0 if repeat == 1 else 1.0 + repeat / 100
        runs.append({"model": None, "name": "classic", "world_size": 1, "repeat": repeat,
                     "time_to_target_s": {"mlp": 30 * slow, "cnn": 120 * slow}})
        for model, alone in (("mlp", 5.0), ("cnn", 80.0)):
            runs += [{"model": model, "name": name, "world_size": world, "repeat": repeat,
                      "time_to_target_s": {model: alone * factor * slow}}
                     for name, world, factor in (("single", 1, 1.0), ("flat-shm", 2, 0.8),
                                                 ("flat-shm", 4, 1.5))]
    document = {"schema": tta.SCHEMA, "config": {"repeats": 6}, "targets": tta.TARGETS,
                "runs": runs}
    (tmp_path / "time-to-accuracy.json").write_text(json.dumps(document))
    design_numbers.loaded.clear()
    numbers = Numbers()
    shown = time_to_accuracy_section(numbers, str(tmp_path))["table.time_to_accuracy"]
    assert numbers.value("tta.cnn.flat-shm.w2.vs_single.median") == pytest.approx(0.8)
    assert numbers.value("tta.cnn.flat-shm.w2.vs_single.verdict") == "faster"
    assert numbers.value("tta.mlp.flat-shm.w4.vs_single.verdict") == "slower"
    assert numbers.value("tta.mlp.classic.w1.vs_single.median") == pytest.approx(6.0)
    assert "| CNN to 99.0% | ours, 2 processes, flat-shm | 66.2 s (64.0–128) | " \
           "0.800× (0.800–0.800), faster |" in shown
    # without the file: the command to run, and every quoted number "not measured"
    design_numbers.loaded.clear()
    numbers = Numbers()
    missing = time_to_accuracy_section(numbers, str(tmp_path / "none"))
    assert "run python -m benchmarks.time_to_accuracy" in missing["table.time_to_accuracy"]
    assert "tta.cnn.flat-shm.w2.vs_single.median" in numbers.absent
