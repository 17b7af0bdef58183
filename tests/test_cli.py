"""mlp_ddp.py from the outside: whole runs, their results files, and one clear line for bad
input."""
import json
import os

import pytest
import torch

import mlp_ddp
from grading.launch import run_cli, run_ok
from runtime import results
from tests.harness import SHARDING_ONLY, one_line_exit_2

SMALL = ("--val-samples", 100, "--epochs", 1, "--warmup-steps", 1)


@pytest.mark.rubric("core.end_to_end")
def test_manual_mode_on_two_processes_writes_results_that_pass_the_schema(tiny_data, tmp_path):
    done = run_ok("--mode", "manual", "--world-size", 2, "--data-dir", tiny_data, *SMALL,
                  "--epochs", 2, "--batch-size", 16, "--results-dir", tmp_path / "results",
                  "--run-name", "e2e")
    document = json.loads((tmp_path / "results" / "e2e.json").read_text())
    assert results.validate(document) == []
    assert document["environment"]["world_size"] == 2 and len(document["epochs"]) == 2
    assert [line.startswith("epoch") for line in done.stdout.splitlines()].count(True) == 2
    assert "compute" in done.stdout and "comm" in done.stdout
    assert os.listdir(tmp_path / "results") == ["e2e.json"]  # no temporary file left behind


@pytest.mark.rubric("core.end_to_end")
def test_the_schema_check_finds_what_is_missing_or_out_of_range(tiny_data, tmp_path):
    run_ok("--mode", "single", "--data-dir", tiny_data, *SMALL, "--results-dir", tmp_path,
           "--run-name", "one")
    document = json.loads((tmp_path / "one.json").read_text())
    assert results.validate(document) == []
    del document["epochs"][0]["val_loss"]
    document["test"]["accuracy"] = 1.5
    document["timing"]["per_rank"].append(document["timing"]["per_rank"][0])
    problems = results.validate(document)
    assert "epochs[0].val_loss missing" in problems
    assert "test.accuracy is not a fraction" in problems
    assert "timing.per_rank does not have one entry per rank" in problems


def trained_parameters(tmp_path, name, tiny_data, *args):
    """The parameters after 4 deterministic SGD steps with `args`."""
    path = tmp_path / f"{name}.pt"
    run_ok("--data-dir", tiny_data, *SMALL, "--dropout", 0, "--optimizer", "sgd", "--lr", 0.05,
           "--max-steps", 4, "--results-dir", tmp_path, "--run-name", name, "--save-model", path,
           *args)
    return torch.load(path)


def assert_same_parameters(left, right):
    """Equal up to float32 rounding."""
    assert left.keys() == right.keys()
    for key in left:
        torch.testing.assert_close(left[key], right[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.rubric("core.minibatch")
def test_gradient_accumulation_equals_one_step_on_the_larger_batch(tiny_data, tmp_path):
    larger_batch = trained_parameters(tmp_path, "single", tiny_data, *SHARDING_ONLY,
                                      "--mode", "single", "--batch-size", 32)
    accumulated = trained_parameters(tmp_path, "accumulated", tiny_data, *SHARDING_ONLY,
                                     "--mode", "ddp", "--world-size", 2, "--batch-size", 8,
                                     "--accum-steps", 2)
    assert_same_parameters(accumulated, larger_batch)


@pytest.mark.rubric("core.end_to_end")
def test_the_mlp_reaches_96_percent_on_real_mnist_after_one_epoch_in_one_process(
        tmp_path, real_data):
    run_ok("--mode", "single", "--epochs", 1, "--data-dir", tmp_path / "data",
           "--results-dir", tmp_path, "--run-name", "real", env={"OFFLINE_DATA_DIR": real_data},
           timeout=300)
    document = json.loads((tmp_path / "real.json").read_text())
    assert document["test"]["accuracy"] >= 0.96


BAD_INPUT = {
    "world size 0": ("--world-size", 0),
    "batch size 0": ("--batch-size", 0),
    "negative batch size": ("--batch-size", -3),
    "non-numeric epochs": ("--epochs", "two"),
    "unknown mode": ("--mode", "magic"),
    "unknown model": ("--model", "transformer"),
    "unknown dataset": ("--dataset", "cifar10"),
    "unknown strategy": ("--sync", "tree"),
    "unknown transport": ("--transport", "pigeon"),
    "a transport in one process": ("--mode", "single", "--transport", "ring"),
    "naive over the ring": ("--sync", "naive", "--transport", "ring"),
    "naive compressed": ("--sync", "naive", "--compress", "fp16"),
    "single mode on several processes": ("--mode", "single", "--world-size", 2),
    "dropout of 1": ("--dropout", 1),
    "hidden sizes not numbers": ("--hidden-sizes", "512,x"),
}


def test_bad_options_exit_2_with_one_line_and_no_traceback_from_the_command_line():
    one_line_exit_2(run_cli("--batch-size", 0))


@pytest.mark.parametrize("args", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_options_exit_2_with_one_line_and_no_traceback(args, capsys):
    # in this process: the options are checked before anything starts (a process costs 1.5 s)
    with pytest.raises(SystemExit) as exit_:
        mlp_ddp.main([str(arg) for arg in args])
    assert exit_.value.code == 2
    said = capsys.readouterr().err
    assert len(said.strip().splitlines()) == 1 and "Traceback" not in said, said


REPLACED = {  # what was written before --transport -> what the one line must name instead
    ("--sync", "ring"): "--sync flat --transport ring",
    ("--mode", "manual", "--sync=shm"): "--sync flat --transport shm",
    ("--mode", "ddp", "--comm-hook", "shm"): "--transport",
    ("--mode", "sharded", "--collectives", "library"): "--transport",
}


@pytest.mark.parametrize("args", REPLACED, ids=[" ".join(args) for args in REPLACED])
def test_a_replaced_spelling_exits_2_with_one_line_naming_the_new_one(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        mlp_ddp.main(list(args))
    assert exit_.value.code == 2
    said = capsys.readouterr().err
    assert len(said.strip().splitlines()) == 1 and f"use {REPLACED[args]}" in said, said


NAMED = {  # options -> how the default run name starts, before -wN-time
    ("--mode", "manual", "--sync", "naive"): "mlp-mnist-manual-naive",
    ("--mode", "manual", "--sync", "flat", "--transport", "ring"): "mlp-mnist-manual-flat-ring",
    ("--mode", "ddp", "--transport", "shm"): "mlp-mnist-ddp-shm",
    ("--mode", "sharded", "--shard", "optimizer"): "mlp-mnist-sharded-optimizer",
    ("--mode", "single",): "mlp-mnist-single",
}


@pytest.mark.parametrize("args", NAMED, ids=NAMED.values())
def test_the_default_run_name_says_the_sync_or_shard_and_a_transport_asked_for(args):
    from runtime.options import parse_args

    name = mlp_ddp.default_run_name(parse_args(list(args)), 2)
    assert name.startswith(NAMED[args] + "-w2-") and name.count("-") == NAMED[args].count("-") + 3


@pytest.mark.rubric("core.end_to_end")
def test_sync_naive_runs_average_gradients_and_trains_as_one_process(tiny_data, tmp_path):
    # the global batch of 32 split over 2 ranks, averaged by the lesson's first function
    naive = trained_parameters(tmp_path, "naive", tiny_data, *SHARDING_ONLY, "--mode", "manual",
                               "--sync", "naive", "--world-size", 2, "--batch-size", 16)
    single = trained_parameters(tmp_path, "single", tiny_data, *SHARDING_ONLY,
                                "--mode", "single", "--batch-size", 32)
    assert_same_parameters(naive, single)
    document = json.loads((tmp_path / "naive.json").read_text())
    assert (document["config"]["sync"], document["config"]["transport"]) == ("naive", "auto")


def test_missing_data_offline_names_the_folder_and_the_option(tmp_path):
    done = run_cli("--data-dir", tmp_path / "data", "--offline-data-dir", tmp_path / "nothing-here")
    one_line_exit_2(done)
    assert "nothing-here" in done.stderr and "--offline-data-dir" in done.stderr


@pytest.mark.rubric("core.minibatch")
def test_a_global_batch_larger_than_the_training_set_is_refused(tiny_data):
    done = run_cli("--data-dir", tiny_data, *SMALL, "--batch-size", 400, "--world-size", 2)
    assert done.returncode == 2 and "larger than the training set" in done.stderr
    assert "Traceback" not in done.stderr
