"""Where a run computes: one device for every rank, the backend that fits it, and the GPU's
float32 policy, all decided before training so that every comparison is made on one device.

  --device auto   the GPU where torch sees one, else the CPU: the same for every world size
  --device cuda   local rank r on GPU r mod (GPUs): ranks beyond the GPUs share them, over gloo
                  (NCCL refuses two ranks on one GPU)
  --device cpu    the CPU, over gloo
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist

from runtime.launch import LaunchError

DEVICES = ("auto", "cpu", "cuda")
# TF32 rounds a float32 product's inputs to 10 bits of mantissa: a CNN on the GPU then leaves the
# CPU's results by more than the tests' parity tolerances. Full float32 on every device.
PRECISION = "float32 matmuls and convolutions (TF32 off)"


@dataclass(frozen=True)
class DevicePlan:
    """The run's device kind ('cpu' or 'cuda'), its backend, and the GPUs this host has."""

    kind: str
    backend: str
    gpus: int

    def for_rank(self, local_rank):
        """This rank's device: a GPU shared round-robin by the local ranks, or the CPU."""
        if self.kind == "cpu":
            return torch.device("cpu")
        index = local_rank % self.gpus
        torch.cuda.set_device(index)
        use_full_float32()
        return torch.device("cuda", index)

    def describe(self, local_world_size):
        """The run's first line's account of where it computes."""
        if self.kind == "cpu":
            return f"device cpu, backend {self.backend}"
        shared = (f", {local_world_size} local ranks sharing {self.gpus} GPU(s)"
                  if local_world_size > self.gpus else "")
        return (f"device cuda ({torch.cuda.get_device_name(0)}){shared}, backend {self.backend}, "
                f"{PRECISION}")


def gpus_here():
    """How many GPUs torch sees (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan(device, backend, local_world_size, gpus=None):
    """The DevicePlan for --device `device` and --backend `backend` with `local_world_size` ranks
    on this host, or LaunchError naming what cannot work. `gpus` stands for gpus_here() in tests;
    --device cpu without NCCL asks nothing of CUDA (a process that asked cannot fork ranks)."""
    if device == "cpu":
        if backend == "nccl":
            raise LaunchError("--backend nccl computes on GPUs: not with --device cpu")
        return DevicePlan("cpu", "gloo", 0)
    gpus = gpus_here() if gpus is None else gpus
    kind = "cuda" if gpus or device == "cuda" else "cpu"
    if kind == "cuda" and not gpus:
        raise LaunchError("--device cuda: torch sees no GPU on this machine "
                          f"(torch {torch.__version__}, CUDA {torch.version.cuda or 'not built'})")
    if backend == "nccl":
        if not gpus:
            raise LaunchError("--backend nccl needs GPUs and torch sees none on this machine; "
                              "use --backend gloo (or auto)")
        if gpus < local_world_size:
            raise LaunchError(f"--backend nccl needs a GPU per rank: {local_world_size} local "
                              f"ranks, {gpus} GPU(s) (NCCL refuses two ranks on one GPU; "
                              "--backend gloo shares them)")
    if backend == "auto":
        backend = "nccl" if kind == "cuda" and gpus >= local_world_size else "gloo"
    return DevicePlan(kind, backend, gpus)


def use_full_float32():
    """PRECISION, set once for the process. The legacy flags: torch 2.6 lacks the newer
    fp32_precision ones, and setting both kinds makes torch refuse to read them."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def staged_through_host(collective):
    """`collective` (its result tensor first: an all-reduce's, a reduce-scatter's or all-gather's
    output; a future out) run on host copies of CUDA tensors under gloo, the result copied back:
    gloo's point-to-point messages of CUDA tensors kill a rank, and shared memory holds CPU
    tensors. Blocking where it stages: the future is complete when it returns."""
    def on_host(*tensors):
        if not (tensors[0].is_cuda and dist.get_backend() == "gloo"):
            return collective(*tensors)
        copies = [tensor.cpu() for tensor in tensors]
        collective(*copies).wait()
        tensors[0].copy_(copies[0])
        future = torch.futures.Future()
        future.set_result(tensors[0])
        return future

    return on_host
