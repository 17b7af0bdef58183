"""One device for every rank of a run: how --device and --backend are resolved, refused, said and
recorded. These run on any machine; tests/test_cuda.py has the ones that need a GPU."""
import json
import time

import pytest
import torch

from grading.launch import run_cli, run_ok
from runtime import device
from runtime.launch import LaunchError
from tests.harness import one_line_exit_2

SMALL = ("--val-samples", 100, "--epochs", 1, "--warmup-steps", 1, "--batch-size", 16)
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a GPU")


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_auto_picks_the_gpu_for_every_world_size_when_there_is_one(world_size):
    # one GPU: world size 1 and 4 alike compute on it (4 share it over gloo)
    chosen = device.plan("auto", "auto", world_size, gpus=1)
    assert chosen.kind == "cuda"
    assert chosen.backend == ("nccl" if world_size == 1 else "gloo")


def test_auto_picks_the_cpu_and_gloo_without_a_gpu():
    assert device.plan("auto", "auto", 4, gpus=0) == device.DevicePlan("cpu", "gloo", 0)


def test_a_gpu_per_rank_gets_nccl():
    assert device.plan("cuda", "auto", 2, gpus=2).backend == "nccl"


def test_nccl_with_fewer_gpus_than_ranks_is_refused_naming_both_counts():
    with pytest.raises(LaunchError, match="2 local ranks, 1 GPU"):
        device.plan("cuda", "nccl", 2, gpus=1)


@pytest.mark.parametrize("requested, backend, match", [
    ("cuda", "auto", "--device cuda: torch sees no GPU"),
    ("auto", "nccl", "--backend nccl needs GPUs"),
    ("cpu", "nccl", "not with --device cpu"),
])
def test_gpu_options_on_a_machine_without_one_are_refused(requested, backend, match):
    with pytest.raises(LaunchError, match=match):
        device.plan(requested, backend, 2, gpus=0)


def test_cpu_tensors_go_straight_to_the_collective():
    # staging is for GPU tensors under gloo only: a CPU tensor reaches the collective untouched
    seen = []

    def collective(tensor):
        seen.append(tensor)
        return "its own future"

    tensor = torch.ones(3)
    assert device.staged_through_host(collective)(tensor) == "its own future"
    assert seen[0] is tensor


@NO_GPU
def test_nccl_on_a_machine_without_a_gpu_is_refused_at_once(tiny_data):
    started = time.monotonic()
    done = run_cli("--mode", "ddp", "--backend", "nccl", "--world-size", 2, "--data-dir",
                   tiny_data, *SMALL, timeout=60)
    one_line_exit_2(done)
    assert "--backend nccl needs GPUs" in done.stderr
    assert time.monotonic() - started < 30  # not the process group's 120 s wait


@NO_GPU
def test_device_cuda_on_a_machine_without_a_gpu_is_refused(tiny_data):
    done = run_cli("--mode", "single", "--device", "cuda", "--data-dir", tiny_data, *SMALL)
    one_line_exit_2(done)
    assert "torch sees no GPU" in done.stderr


def test_the_device_is_said_first_and_recorded(tiny_data, tmp_path):
    done = run_ok("--mode", "manual", "--world-size", 2, "--device", "cpu", "--data-dir",
                  tiny_data, *SMALL, "--results-dir", tmp_path, "--run-name", "on-cpu")
    first = done.stdout.splitlines()[0]
    assert first.startswith("run: --mode manual") and "2 ranks, device cpu, backend gloo" in first
    document = json.loads((tmp_path / "on-cpu.json").read_text())
    assert document["config"]["device"] == "cpu"
    assert document["environment"]["device"] == "cpu"
    assert document["environment"]["gpu"] is None
