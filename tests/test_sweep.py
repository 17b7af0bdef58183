"""sweep.py plans the right runs, survives a failed one, and runs end to end on a tiny configuration."""
import glob
import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from analysis import sweep
from runtime.results import validate

TINY = ["--models", "mlp", "--world-sizes", "1,2", "--strategies", "flat", "--bucket-mbs", "1", "--max-steps", "5",
        "--epochs", "1", "--train-samples", "1024", "--repeats", "1"]


def dry_run(capsys, argv):
    assert sweep.main(["--dry-run"] + argv) == 0
    return [shlex.split(line) for line in capsys.readouterr().out.splitlines()]


def option(command, name):
    return command[len(command) - 1 - command[::-1].index(name) + 1]  # the last occurrence wins, as in argparse


def test_dry_run_lists_single_then_every_mode_per_world_size_then_the_bucket_sweep_in_interleaved_rounds(capsys):
    commands = dry_run(capsys, [])
    names = [option(command, "--run-name") for command in commands]
    modes = ["ddp", "ddp-no-sync", "manual-per-param", "manual-flat", "manual-bucketed", "manual-ring"]
    once = [f"sweep-{model}-{mode}-w{world}" for model in ("mlp", "cnn")
            for world, world_modes in ((1, ["single"]), (2, modes), (4, modes)) for mode in world_modes]
    once += [f"bucket-mlp-{mode}-{size}mb-w4" for size in ("0.25", "1", "4", "25") for mode in ("bucketed", "ddp")]
    # every configuration once per round; every other round in reverse, so no run always follows the same one
    rounds = [once, once[::-1], once]
    assert names == [f"{name}-r{r}" for r, round_names in enumerate(rounds, 1) for name in round_names]
    steps = {option(command, "--model"): option(command, "--max-steps") for command in commands}
    assert steps == {"mlp": str(sweep.DEFAULT_MLP_STEPS), "cnn": str(sweep.DEFAULT_CNN_STEPS)}


def test_bucket_runs_set_their_bucket_size_and_extra_arguments_win(capsys):
    commands = dry_run(capsys, TINY + ["--extra", "--val-samples 256 --seed 3"])
    bucket_runs = [command for command in commands if option(command, "--run-name").startswith("bucket-")]
    assert [option(command, "--bucket-mb") for command in bucket_runs] == ["1", "1"]
    assert all(option(command, "--val-samples") == "256" and option(command, "--seed") == "3" for command in commands)


def test_a_failed_run_is_reported_and_the_sweep_goes_on(tmp_path, capsys):
    commands = [("fails", [sys.executable, "-c", "raise SystemExit(3)"]), ("works", [sys.executable, "-c", "pass"])]
    assert sweep.run_all(commands, str(tmp_path)) == ["fails"]
    output = capsys.readouterr().out
    assert "[2/2] works" in output and "FAILED: fails (exit code 3)" in output and "1 of 2 runs succeeded" in output


def test_the_sweep_exits_non_zero_when_any_run_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep.subprocess, "call", lambda command: 1 if "ddp" in command else 0)
    assert sweep.main(TINY + ["--results-dir", str(tmp_path)]) == 1


def test_a_tiny_sweep_writes_valid_results_and_the_plots(tmp_path, real_data):
    extra = f"--val-samples 256 --test-samples 256 --warmup-steps 1 --offline-data-dir {real_data} " \
            f"--data-dir {tmp_path / 'data'}"
    no_bucket_sweep = ["--bucket-mbs", ""]  # its two runs would double the test's time; the dry run covers them
    assert sweep.main(TINY + no_bucket_sweep + ["--extra", extra, "--results-dir", str(tmp_path)]) == 0
    documents = {os.path.basename(path): json.load(open(path)) for path in glob.glob(str(tmp_path / "*.json"))}
    assert sorted(documents) == ["sweep-mlp-ddp-no-sync-w2-r1.json", "sweep-mlp-ddp-w2-r1.json",
                                 "sweep-mlp-manual-flat-w2-r1.json", "sweep-mlp-single-w1-r1.json"]
    assert all(validate(document) == [] for document in documents.values())
    plots = sorted(os.listdir(tmp_path / "plots"))
    assert plots == ["curves-mlp.png", "scaling-mlp.png", "time-breakdown-mlp.png"]
