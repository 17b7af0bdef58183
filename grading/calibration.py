"""How much slower this grading machine is, now, than the one the budget and timeouts were set on.

grade.py times the tests' kind of work in a fresh interpreter (import torch, a few hundred small
MLP steps on one thread) and stretches the budget and every timeout by how much longer it took
than REFERENCE_S, within [1, MAX_STRETCH] (inside Gradescope's 10 minutes).

    python -m grading.calibration      # this machine's time and stretch
"""
import subprocess
import sys
import time

# Seconds the workload took on the 2-core machine where BUDGET_S was set, quiet: the median of
# 5 measure()s, 3.14-3.60 s (2026-11-24).
REFERENCE_S = 3.2
MAX_STRETCH = 1.8  # 300 s of budget at most 540 s: inside Gradescope's default 10 minutes
WORKLOAD = """
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                      nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
optimizer = torch.optim.Adam(model.parameters())
images, labels = torch.randn(64, 784), torch.randint(0, 10, (64,))
for _ in range(300):
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(images), labels).backward()
    optimizer.step()
"""


def measure():
    """Seconds the workload takes here, now: the faster of two runs (one may meet a load spike
    that the tests will not)."""
    times = []
    for _ in range(2):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", WORKLOAD], check=True, timeout=120,
                       stdin=subprocess.DEVNULL, capture_output=True)
        times.append(time.perf_counter() - started)
    return min(times)


def stretch(measured_s):
    """The factor for the budget and the timeouts: measured against the reference, within
    [1, MAX_STRETCH]."""
    return min(MAX_STRETCH, max(1.0, measured_s / REFERENCE_S))


if __name__ == "__main__":
    seconds = measure()
    print(f"workload: {seconds:.2f} s here, {REFERENCE_S:g} s on the reference machine: "
          f"budget and timeouts x{stretch(seconds):.2f}")
