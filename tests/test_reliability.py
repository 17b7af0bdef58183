"""What happens when things go wrong: restarts, dead ranks, signals, divergence, bad input.

Every run is a fresh process in the folder of the code under test (grading/sandbox.py)."""
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from grading.launch import run_cli, run_ok, without_offline_data
from grading.sandbox import MNIST_FILES, child_process
from tests.harness import SHARDING_ONLY, one_line_exit_2

RUN = ("--val-samples", 100, "--warmup-steps", 1, "--batch-size", 16, "--progress-every", 1000,
       "--epochs", 1)
FLAT = ("--mode", "manual", "--sync", "flat", "--world-size", 2)
EXACT = (*FLAT, *RUN, "--max-steps", 6)


def assert_identical(left, right):
    """Bit for bit."""
    assert left.keys() == right.keys()
    for key in left:
        assert torch.equal(left[key], right[key]), key


@pytest.fixture
def uninterrupted(tiny_data, tmp_path):
    """Three epochs in one go under the default one-cycle schedule, dropout on (so the RNG state
    must be restored too)."""
    run_ok("--data-dir", tiny_data, *EXACT, "--epochs", 3, "--results-dir", tmp_path,
           "--save-model", tmp_path / "a.pt")
    return torch.load(tmp_path / "a.pt")


def test_a_run_stopped_after_an_epoch_and_resumed_ends_with_the_same_parameters(
        tiny_data, tmp_path):
    # StepLR: its rate does not depend on the run's length, so a 1-epoch run is a 3-epoch run cut
    step_lr = (*EXACT, "--lr-schedule", "step", "--lr-step", 1, "--results-dir", tmp_path)
    run_ok("--data-dir", tiny_data, *step_lr, "--epochs", 3, "--save-model", tmp_path / "a.pt")
    checkpoints = tmp_path / "ckpt"
    run_ok("--data-dir", tiny_data, *step_lr, "--epochs", 1, "--checkpoint-dir", checkpoints)
    done = run_ok("--data-dir", tiny_data, *step_lr, "--epochs", 3, "--checkpoint-dir",
                  checkpoints, "--resume", "--save-model", tmp_path / "b.pt")
    assert "resumed from" in done.stdout
    assert_identical(torch.load(tmp_path / "b.pt"), torch.load(tmp_path / "a.pt"))


def test_a_one_cycle_run_resumed_for_more_epochs_stretches_the_schedule_to_its_new_end(
        tiny_data, tmp_path):
    options = ("--data-dir", tiny_data, *EXACT, "--results-dir", tmp_path, "--checkpoint-dir",
               tmp_path / "ckpt")
    run_ok(*options, "--epochs", 1)
    run_ok(*options, "--epochs", 3, "--resume", "--run-name", "longer")
    epochs = json.loads((tmp_path / "longer.json").read_text())["epochs"]
    # torch's OneCycleLR kept the first run's length and stepped past its end here
    assert [epoch["epoch"] for epoch in epochs] == [1, 2, 3]
    assert epochs[-1]["lr"] == pytest.approx(3e-3 / 25e4)


def test_a_rank_killed_mid_epoch_under_torchrun_restarts_from_the_checkpoint(
        tiny_data, tmp_path, uninterrupted):
    # one-cycle: the checkpoint after step 8 holds the schedule's step, and it goes on from there
    options = ("--data-dir", tiny_data, *FLAT[:4], *RUN, "--max-steps", 6, "--epochs", 3,
               "--results-dir", tmp_path, "--checkpoint-dir", tmp_path / "ckpt",
               "--checkpoint-every", 4, "--resume", "--save-model", tmp_path / "c.pt",
               "--debug-exit-rank", 1, "--debug-exit-step", 9)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
               "--max-restarts=1", "--standalone", "mlp_ddp.py", *map(str, options)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240,
                          **child_process(without_offline_data()))
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert done.returncode == 0, "\n".join(errors)
    assert "exiting at step 9" in done.stderr and "resumed from" in done.stdout
    assert_identical(torch.load(tmp_path / "c.pt"), uninterrupted)


def test_a_ddp_checkpoint_loads_in_manual_and_single_mode_and_corrupt_ones_are_skipped(
        tiny_data, tmp_path):
    checkpoints = tmp_path / "ckpt"
    common = ("--data-dir", tiny_data, *RUN, "--max-steps", 3, "--results-dir", tmp_path,
              "--checkpoint-dir", checkpoints)
    run_ok(*common, "--mode", "ddp", "--world-size", 2, "--epochs", 2, "--keep-checkpoints", 2)
    names = sorted(os.listdir(checkpoints))
    assert len(names) == 2, names  # epochs 1 and 2; older ones pruned
    state = torch.load(checkpoints / names[-1])
    assert not any(key.startswith("module.") for key in state["model"])
    (checkpoints / names[-1]).write_bytes(b"truncated")  # the newest is now unreadable
    done = run_ok(*common, "--mode", "single", "--epochs", 3, "--resume")
    assert "skipping unreadable checkpoint" in done.stderr and names[0] in done.stdout
    run_ok(*common, "--mode", "manual", "--world-size", 2, "--epochs", 3, "--resume")


@pytest.mark.rubric("core.minibatch")
def test_the_same_seed_gives_identical_metrics_and_parameters(tiny_data, tmp_path):
    documents = []
    # one in a fresh interpreter, one forked from the tests' warm server: two hash seeds, as two
    # users' runs would have
    for name, fresh in (("first", True), ("second", False)):
        run_ok("--data-dir", tiny_data, *RUN, "--max-steps", 6, *SHARDING_ONLY, "--mode", "ddp",
               "--world-size", 2, "--epochs", 2, "--results-dir", tmp_path, "--run-name", name,
               "--save-model", tmp_path / f"{name}.pt", fresh_interpreter=fresh)
        documents.append(json.loads((tmp_path / f"{name}.json").read_text()))
    keys = ("train_loss", "train_accuracy", "val_loss", "val_accuracy")
    first, second = ([[epoch[key] for key in keys] for epoch in document["epochs"]]
                     for document in documents)
    assert first == second
    assert_identical(torch.load(tmp_path / "first.pt"), torch.load(tmp_path / "second.pt"))


@pytest.mark.rubric("core.minibatch")
def test_world_sizes_1_2_and_4_with_the_same_global_batch_give_the_same_parameters(
        tiny_data, tmp_path):
    results = []
    for world_size in (1, 2, 4):
        mode = ("--mode", "ddp", "--world-size", world_size)
        if world_size == 1:
            mode = ("--mode", "single")
        # 3 steps: by the fifth, float32 rounding (which differs with the batch split) flips a ReLU
        # on this data at 4 ranks and the difference jumps from 1e-8 to 5e-5: real, but not the
        # sharding under test
        run_ok("--data-dir", tiny_data, *SHARDING_ONLY, *mode, "--epochs", 1,
               "--val-samples", 100, "--batch-size", 32 // world_size, "--dropout", 0,
               "--optimizer", "sgd", "--lr", 0.05, "--max-steps", 3, "--results-dir", tmp_path,
               "--save-model", tmp_path / f"w{world_size}.pt")
        results.append(torch.load(tmp_path / f"w{world_size}.pt"))
    for other in results[1:]:
        for key in results[0]:
            torch.testing.assert_close(other[key], results[0][key], rtol=1e-5, atol=1e-6,
                                       msg=key)


@pytest.mark.rubric("core.minibatch")
def test_uneven_data_drops_the_last_partial_global_batch_and_counts_each_sample_once(
        tiny_data, tmp_path):
    # 500 training samples, global batch 3 x 16 = 48: 10 steps use 480 samples; 20 are left for
    # the next shuffle.
    run_ok("--data-dir", tiny_data, *SHARDING_ONLY, "--mode", "ddp", "--world-size", 3,
           "--val-samples", 100, "--batch-size", 16, "--epochs", 1, "--results-dir", tmp_path,
           "--run-name", "uneven", "--test-samples", 101)
    document = json.loads((tmp_path / "uneven.json").read_text())
    assert document["epochs"][0]["steps"] == 10
    correct = document["test"]["accuracy"] * 101  # 101 test samples over 3 ranks: 33, 34, 34
    assert abs(correct - round(correct)) < 1e-9


def start_group(*args):
    """The launcher in a process group of its own, so the test can find every process it
    started."""
    return subprocess.Popen([sys.executable, "mlp_ddp.py", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **child_process(without_offline_data()))


def group_alive(pgid, within_s=15):
    """The processes of the group still running after up to `within_s` seconds (multiprocessing's
    resource tracker notices its parent's exit a moment later)."""
    deadline = time.monotonic() + within_s
    while True:
        pgrep = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True)
        found = pgrep.stdout.split()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def test_a_dead_rank_ends_the_job_quickly_and_keeps_what_was_written(tiny_data, tmp_path):
    (tmp_path / "earlier.json").write_text('{"kept": true}')
    begun = time.monotonic()
    launcher = start_group("--data-dir", tiny_data, "--mode", "manual", "--world-size", 3, *RUN,
                           "--epochs", 3, "--results-dir", tmp_path,
                           "--checkpoint-dir", tmp_path / "ckpt",
                           "--debug-exit-rank", 1, "--debug-exit-step", 15)
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode != 0 and time.monotonic() - begun < 90
    assert "rank 1 failed (exit code 3)" in stderr
    assert json.loads((tmp_path / "earlier.json").read_text()) == {"kept": True}
    # epoch 1 (10 steps) finished before the crash
    assert os.listdir(tmp_path / "ckpt") == ["ckpt-e0001-s00000000.pt"]
    assert group_alive(launcher.pid) == []


@pytest.fixture
def cpu_hog():
    """A process spinning beside the test, as on a busy machine: start-up and shutdown slow down."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    burner.kill()
    burner.wait()


def wait_for_training(launcher, timeout_s=60):
    """Read the launcher's output until rank 0 reports training (so every rank is past start-up);
    a launcher that says nothing for `timeout_s` has its process group killed and fails the
    test."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if select.select([launcher.stdout], [], [], 1.0)[0]:
            line = launcher.stdout.readline()
            if not line:
                pytest.fail(f"the launcher ended before training: {launcher.communicate()[1]}")
            if " step " in line or line.startswith("epoch "):  # a progress line, or an epoch end
                return
    os.killpg(launcher.pid, signal.SIGKILL)
    pytest.fail(f"no training step within {timeout_s} s")


# A race shows only in some attempts: every one must pass. One each here; SIGNAL_ATTEMPTS=20 for a
# stress run.
@pytest.mark.parametrize("attempt", range(int(os.environ.get("SIGNAL_ATTEMPTS", 1))))
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_local_launcher_stops_every_rank_within_10_s(
        tiny_data, cpu_hog, stop, attempt):
    launcher = start_group("--data-dir", tiny_data, "--mode", "manual", "--world-size", 2, *RUN,
                           "--epochs", 1000, "--progress-every", 0.2,
                           "--results-dir", os.path.join(tiny_data, "results"))
    wait_for_training(launcher)
    os.kill(launcher.pid, stop)
    sent = time.monotonic()
    try:
        launcher.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        pytest.fail(f"the launcher was still running 10 s after {stop.name}")
    assert time.monotonic() - sent < 10
    assert launcher.returncode == 128 + stop  # 130 for SIGINT, 143 for SIGTERM, as a shell says
    assert group_alive(launcher.pid) == []


def test_a_loss_that_becomes_infinite_stops_with_the_step_and_keeps_the_last_good_checkpoint(
        tiny_data, tmp_path):
    done = run_cli("--data-dir", tiny_data, "--mode", "manual", "--world-size", 2, *RUN,
                   "--optimizer", "sgd", "--lr", 1e12, "--epochs", 2,
                   "--checkpoint-dir", tmp_path / "ckpt", "--checkpoint-every", 1,
                   "--results-dir", tmp_path)
    assert done.returncode == 1
    assert "NaN or infinite at step" in done.stderr and "last good checkpoint" in done.stderr
    for name in os.listdir(tmp_path / "ckpt"):  # whatever was kept is loadable and finite
        state = torch.load(tmp_path / "ckpt" / name)
        assert all(torch.isfinite(tensor).all() for tensor in state["model"].values())


@pytest.mark.parametrize("strategy", ["flat", "bucketed"])
def test_a_gradient_that_overflows_float16_on_the_wire_stops_the_step_in_one_line(
        tiny_data, tmp_path, strategy):
    # A learning rate of 1e6 makes the weights, then the gradients, far larger than float16's
    # 65504 while float32 still holds them: only the wire overflows.
    done = run_cli("--data-dir", tiny_data, "--mode", "manual", "--sync", strategy,
                   "--world-size", 2, *RUN, "--optimizer", "sgd", "--lr", 1e6, "--compress", "fp16",
                   "--results-dir", tmp_path)
    assert done.returncode == 1
    said = [line for line in done.stderr.strip().splitlines()
            if "overflowed float16 on the wire at step" in line and "bf16" in line]
    assert said, done.stderr


def test_rendezvous_with_no_master_gives_up_after_the_timeout_naming_the_address(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    begun = time.monotonic()
    torchrun_rank_1 = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    done = run_cli("--data-dir", tmp_path, "--timeout", 3, env=torchrun_rank_1)
    one_line_exit_2(done)
    assert time.monotonic() - begun < 60
    assert f"127.0.0.1:{port}" in done.stderr


def test_an_incomplete_torchrun_environment_is_one_clear_error():
    done = run_cli(env={"RANK": "0"})
    one_line_exit_2(done)
    assert "WORLD_SIZE" in done.stderr


def test_a_master_port_already_in_use_is_one_clear_error(tiny_data):
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        done = run_cli("--data-dir", tiny_data, "--world-size", 2,
                       "--master-port", busy.getsockname()[1])
    one_line_exit_2(done)
    assert "already in use" in done.stderr


def test_an_unwritable_results_or_checkpoint_folder_is_refused_before_training(tiny_data, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for option in ("--results-dir", "--checkpoint-dir"):
        done = run_cli("--data-dir", tiny_data, option, blocker / "sub")
        one_line_exit_2(done)
        assert option in done.stderr


def test_a_world_size_the_training_set_cannot_feed_is_one_clear_error(tiny_data):
    done = run_cli("--data-dir", tiny_data, "--world-size", 4, "--val-samples", 100,
                   "--train-samples", 100, "--batch-size", 32)
    one_line_exit_2(done)
    assert "larger than the training set" in done.stderr


def test_a_corrupt_data_file_is_one_clear_error(tmp_path):
    raw = tmp_path / "offline" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES:
        (raw / name).write_bytes(b"\x1f\x8b truncated")
    done = run_cli("--data-dir", tmp_path / "data", "--offline-data-dir", tmp_path / "offline")
    one_line_exit_2(done)
    assert "corrupt or truncated" in done.stderr
