"""The CUDA path: whole runs on one GPU, ranks sharing it, mixed precision and the CUDA-event
timing. Each test needs a GPU and is skipped without one (tests/test_device.py checks, on any
machine, how the device is chosen and refused)."""
import json
import math

import pytest
import torch

from grading.launch import run_cli, run_ok
from runtime.options import manual_arguments
from runtime.timing import FIELDS, StepTimer
from tests.harness import one_line_exit_2

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a GPU: torch.cuda.is_available() is False")

SMALL = ("--val-samples", 100, "--epochs", 1, "--warmup-steps", 1, "--max-steps", 12,
         "--dropout", 0)
# float32 on both, TF32 off (runtime/device.py), but the kernels sum in different orders, and
# Adam's first steps move a parameter whose gradient is near zero by up to the rate either way
ACROSS_DEVICES = dict(rtol=1e-3, atol=5e-4)


def train(tmp_path, name, *options):
    """A run's results and final parameters (on the CPU)."""
    model = tmp_path / f"{name}.pt"
    run_ok(*options, *SMALL, "--results-dir", tmp_path, "--run-name", name, "--save-model", model)
    document = json.loads((tmp_path / f"{name}.json").read_text())
    return document, torch.load(model, map_location="cpu", weights_only=True)


def assert_same_parameters(state, reference, **tolerance):
    for name, tensor in reference.items():
        torch.testing.assert_close(state[name], tensor, msg=name, **tolerance)


def test_single_manual_and_ddp_agree_on_one_gpu_and_with_the_cpu(tiny_data, tmp_path):
    data = ("--data-dir", tiny_data, "--batch-size", 16)
    single, single_state = train(tmp_path, "single", "--mode", "single", "--device", "cuda", *data)
    assert single["environment"]["device"] == "cuda:0" and single["environment"]["gpu"]
    for mode in ("manual", "ddp"):
        document, state = train(tmp_path, mode, "--mode", mode, "--world-size", 1, "--device",
                                "cuda", *data)
        assert document["environment"]["backend"] == "nccl"
        # one rank averages over one: the same arithmetic as one process
        assert_same_parameters(state, single_state, rtol=1e-6, atol=1e-7)
    _, on_cpu = train(tmp_path, "cpu", "--mode", "single", "--device", "cpu", *data)
    assert_same_parameters(single_state, on_cpu, **ACROSS_DEVICES)


@pytest.mark.parametrize("world_size, configuration", [(2, "flat-ring"), (2, "flat-shm"),
                                                       (4, "bucketed")])
def test_ranks_sharing_one_gpu_train_as_on_the_cpu(tiny_data, tmp_path, world_size, configuration):
    # more ranks than GPUs: gloo with CUDA tensors, the ring's and shared memory's messages staged
    # through the host
    options = (*manual_arguments(configuration), "--world-size", world_size, "--data-dir",
               tiny_data, "--batch-size", 8)
    shared, shared_state = train(tmp_path, "gpu", *options, "--device", "cuda")
    assert shared["environment"]["backend"] == "gloo"
    assert shared["environment"]["device"].startswith("cuda")
    _, on_cpu = train(tmp_path, "cpu", *options, "--device", "cpu")
    assert_same_parameters(shared_state, on_cpu, **ACROSS_DEVICES)


def test_ddp_with_four_ranks_on_one_gpu_runs_over_gloo(tiny_data, tmp_path):
    document, _ = train(tmp_path, "ddp4", "--mode", "ddp", "--world-size", 4, "--device", "cuda",
                        "--data-dir", tiny_data, "--batch-size", 8)
    assert document["environment"]["backend"] == "gloo"
    assert document["environment"]["world_size"] == 4


@pytest.mark.skipif(torch.cuda.device_count() != 1, reason="needs exactly one GPU")
def test_nccl_with_two_ranks_on_one_gpu_is_refused_naming_both_counts(tiny_data):
    done = run_cli("--mode", "ddp", "--backend", "nccl", "--world-size", 2, "--data-dir",
                   tiny_data, *SMALL)
    one_line_exit_2(done)
    assert "2 local ranks, 1 GPU" in done.stderr


def test_bf16_autocast_trains_on_the_gpu(tiny_data, tmp_path):
    document, state = train(tmp_path, "bf16", "--mode", "ddp", "--world-size", 1, "--device",
                            "cuda", "--amp", "bf16", "--data-dir", tiny_data, "--batch-size", 16)
    # the master weights stay float32 and finite, and the loss is a number
    assert all(tensor.dtype == torch.float32 and tensor.isfinite().all()
               for tensor in state.values())
    assert math.isfinite(document["epochs"][0]["train_loss"])


def test_cuda_event_timing_adds_up_on_a_real_gpu():
    timer = StepTimer(torch.device("cuda", 0))
    weights = torch.randn(512, 512, device="cuda")
    for _ in range(3):
        timer.start_step()
        product = weights @ weights
        timer.mark("data")
        for phase in ("forward", "backward", "sync", "optimizer"):
            product = product @ weights
            timer.mark(phase)
        timer.end_step()
    records = timer.take_epoch()
    assert len(records) == 3
    for record in records:
        assert set(FIELDS) <= set(record)
        assert record["step"] > 0 and all(record[field] >= 0 for field in FIELDS)
        assert record["data"] + record["compute"] + record["comm_exposed"] == \
            pytest.approx(record["step"])


def test_our_gpu_step_never_waits_for_the_gpu():
    from benchmarks.plain_loop import OurStep, random_data

    gpu = torch.device("cuda", 0)
    ours = OurStep("single", "mlp", random_data(1024, 0), 64, gpu, 0)
    batches = ours.trainer.epoch_batches(0)
    assert batches.device == gpu  # host indices would be copied from pageable memory each step
    ours(0, batches[0])  # the first step builds the optimizer's state
    # any operation that waits for the GPU (.item(), a blocking copy) raises inside the block
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(1, 4):
            ours(step, batches[step])
    finally:
        torch.cuda.set_sync_debug_mode("default")
