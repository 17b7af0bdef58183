"""sweep.py plans the right runs, survives a failed one, and runs end to end on a tiny
configuration.

The real sweep runs in a child process in the submission's folder (grading/launch.py run_alone):
its runs are that folder's mlp_ddp.py, and its plots count the buckets of its models."""
import glob
import json
import os
import shlex
import sys

import pytest

from analysis import sweep
from grading.launch import run_alone
from runtime.options import MANUAL_CONFIGURATIONS
from runtime.results import validate

pytestmark = pytest.mark.rubric("core.end_to_end")

TINY = ["--models", "mlp", "--world-sizes", "1,2", "--strategies", "flat", "--bucket-mbs", "1",
        "--max-steps", "5", "--epochs", "1", "--train-samples", "1024", "--repeats", "1"]
MODES = ["ddp", "ddp-no-sync"] + [f"manual-{strategy}" for strategy in MANUAL_CONFIGURATIONS]


def dry_run(capsys, argv):
    """The sweep's commands, each split into its arguments."""
    assert sweep.main(["--dry-run"] + argv) == 0
    return [shlex.split(line) for line in capsys.readouterr().out.splitlines()]


def option(command, name):
    """The value of the last `name` in `command`: the last occurrence wins, as in argparse."""
    last = len(command) - 1 - command[::-1].index(name)
    return command[last + 1]


def test_dry_run_lists_single_then_every_mode_per_world_size_then_the_bucket_sweep_by_rounds(
        capsys):
    commands = dry_run(capsys, [])
    names = [option(command, "--run-name") for command in commands]
    once = [f"sweep-{model}-{mode}-w{world}" for model in ("mlp", "cnn")
            for world, world_modes in ((1, ["single"]), (2, MODES), (4, MODES))
            for mode in world_modes]
    once += [f"bucket-mlp-{mode}-{size}mb-w4" for size in ("0.25", "1", "4", "25")
             for mode in ("bucketed", "ddp")]
    # every configuration once per round, in an order shuffled anew each round, so no run
    # always follows the same one and no configuration always runs early
    rounds = [names[start:start + len(once)] for start in range(0, len(names), len(once))]
    assert len(rounds) == sweep.DEFAULT_REPEATS
    for repeat, round_names in enumerate(rounds, 1):
        assert sorted(round_names) == sorted(f"{name}-r{repeat}" for name in once)
    orders = [[name.rsplit("-r", 1)[0] for name in round_names] for round_names in rounds]
    assert len({tuple(order) for order in orders}) == len(orders) and orders[0] != once
    steps = {option(command, "--model"): option(command, "--max-steps") for command in commands}
    assert steps == {"mlp": str(sweep.DEFAULT_MLP_STEPS), "cnn": str(sweep.DEFAULT_CNN_STEPS)}


def test_the_order_of_each_round_is_seeded_and_recorded_in_the_results_folder(
        capsys, tmp_path, monkeypatch):
    names = [option(command, "--run-name") for command in dry_run(capsys, [])]
    # the same seed gives the same order, another seed another
    assert names == [option(command, "--run-name") for command in dry_run(capsys, [])]
    other = [option(command, "--run-name") for command in dry_run(capsys, ["--order-seed", "1"])]
    assert sorted(other) == sorted(names) and other != names
    # a sweep that runs writes the order it ran in, with its seed, before its first run
    monkeypatch.setattr(sweep, "run_all", lambda commands, results_dir: [])
    monkeypatch.setattr(sweep.plots, "main", lambda argv: [])
    assert sweep.main(["--order-seed", "1", "--results-dir", str(tmp_path)]) == 0
    with open(tmp_path / sweep.ORDER_FILE) as file:
        recorded = json.load(file)
    assert recorded["schema"] == sweep.ORDER_SCHEMA and recorded["order_seed"] == 1
    assert [f"{name}-r{repeat}" for repeat, order in enumerate(recorded["rounds"], 1)
            for name in order] == other


def test_ring_and_shm_are_the_flat_buffer_over_their_transport_the_others_over_the_library(
        capsys):
    commands = dry_run(capsys, ["--models", "mlp", "--world-sizes", "2", "--strategies",
                                "bucketed,flat-ring,flat-shm", "--bucket-mbs", "",
                                "--repeats", "1"])
    spelled = {option(command, "--run-name"): (option(command, "--sync"),
                                               option(command, "--transport"))
               for command in commands if "--sync" in command}
    assert spelled == {"sweep-mlp-manual-bucketed-w2-r1": ("bucketed", "library"),
                       "sweep-mlp-manual-flat-ring-w2-r1": ("flat", "ring"),
                       "sweep-mlp-manual-flat-shm-w2-r1": ("flat", "shm")}


def test_bucket_runs_set_their_bucket_size_and_extra_arguments_win(capsys):
    commands = dry_run(capsys, TINY + ["--extra", "--val-samples 256 --seed 3"])
    bucket_runs = [command for command in commands
                   if option(command, "--run-name").startswith("bucket-")]
    assert [option(command, "--bucket-mb") for command in bucket_runs] == ["1", "1"]
    for command in commands:
        assert option(command, "--val-samples") == "256" and option(command, "--seed") == "3"


@pytest.mark.parametrize("option, value", [("--world-sizes", "1,x"), ("--bucket-mbs", "1,big")])
def test_a_list_that_does_not_parse_is_one_usage_line_naming_it(capsys, option, value):
    with pytest.raises(SystemExit) as exit_info:
        sweep.main(["--dry-run", option, value])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {option}: expected" in error and repr(value) in error


def test_a_failed_run_is_reported_and_the_sweep_goes_on(tmp_path, capsys):
    commands = [("fails", [sys.executable, "-c", "raise SystemExit(3)"]),
                ("works", [sys.executable, "-c", "pass"])]
    assert sweep.run_all(commands, str(tmp_path)) == ["fails"]
    output = capsys.readouterr().out
    assert "[2/2] works" in output and "FAILED: fails (exit code 3)" in output
    assert "1 of 2 runs succeeded" in output


def test_the_sweep_exits_non_zero_when_any_run_failed(tmp_path, monkeypatch):
    def ddp_fails(command):
        """subprocess.call's exit code: 1 for the DDP runs."""
        return 1 if "ddp" in command else 0
    monkeypatch.setattr(sweep.subprocess, "call", ddp_fails)
    assert sweep.main(TINY + ["--results-dir", str(tmp_path)]) == 1


def test_a_tiny_sweep_writes_valid_results_and_the_plots(tmp_path, real_data):
    extra = (f"--val-samples 256 --test-samples 256 --warmup-steps 1 "
             f"--offline-data-dir {real_data} --data-dir {tmp_path / 'data'}")
    # the bucket sweep's two runs would double the test's time; the dry run covers them
    no_bucket_sweep = ["--bucket-mbs", ""]
    arguments = TINY + no_bucket_sweep + ["--extra", extra, "--results-dir", str(tmp_path)]
    assert run_alone(sweep.main, arguments) == 0
    documents = {}
    for path in glob.glob(str(tmp_path / "*.json")):
        with open(path) as file:
            documents[os.path.basename(path)] = json.load(file)
    assert sorted(documents) == ["sweep-mlp-ddp-no-sync-w2-r1.json", "sweep-mlp-ddp-w2-r1.json",
                                 "sweep-mlp-manual-flat-w2-r1.json",
                                 "sweep-mlp-single-w1-r1.json", sweep.ORDER_FILE]
    order = documents.pop(sweep.ORDER_FILE)
    assert sorted(order["rounds"][0]) == sorted(name.removesuffix("-r1.json")
                                                for name in documents)
    assert all(validate(document) == [] for document in documents.values())
    plots = sorted(os.listdir(tmp_path / "plots"))
    assert plots == ["curves-mlp.png", "efficiency-projected.png", "scaling-mlp.png",
                     "time-breakdown-mlp.png"]
