"""Test accuracy against training time, the clock paused while the test split is scored: what
every run of time_to_accuracy.py records (ours and the classic recipe alike), and the time to a
target read from it."""
import time

import torch

from runtime.metrics import evaluate
from runtime.results import write_json_atomic


class Curve:
    """Test accuracy against training time: the clock runs only between evaluations."""

    def __init__(self, model, test, placement, target, samples_per_step):
        self.model = model
        self.test = test
        self.placement = placement
        self.target = target
        self.samples_per_step = samples_per_step
        self.points = []
        self.steps = 0
        self.training_s = 0.0
        self.evaluation_s = 0.0
        self.reached = False  # whether the last evaluation reached the target
        self.started = time.perf_counter()

    def step_done(self):
        self.steps += 1

    def evaluate(self, epoch):
        """Pause the clock, score the test split, restart; returns whether the target is reached
        (the accuracy is reduced over ranks, so every rank answers the same)."""
        device = next(self.model.parameters()).device
        if device.type == "cuda":  # the steps queued on the GPU are training time
            torch.cuda.synchronize(device)
        paused = time.perf_counter()
        self.training_s += paused - self.started
        _, accuracy = evaluate(self.model, self.test, self.placement.rank,
                               self.placement.world_size, device)
        self.model.train()
        self.points.append({"time_s": self.training_s,
                            "samples": self.steps * self.samples_per_step,
                            "epoch": epoch,
                            "test_accuracy": accuracy})
        self.started = time.perf_counter()
        self.evaluation_s += self.started - paused
        self.reached = accuracy >= self.target
        return self.reached


def evaluation_steps(steps, per_epoch):
    """The steps of an epoch (1-based) after which the test split is scored: `per_epoch` evenly
    spaced, the last one at the epoch's end."""
    return {round(steps * index / per_epoch) for index in range(1, per_epoch + 1)} - {0}


def write_part(path, curve, setup_s):
    """The run's measurements, for the launcher to read (rank 0 writes them)."""
    write_json_atomic(path, {"curve": curve.points,
                             "evaluation_s": curve.evaluation_s,
                             "setup_s": setup_s,
                             "threads_per_rank": torch.get_num_threads()})


def time_to_target(curve, target):
    """The first point of `curve` ([{"time_s", "samples", "test_accuracy"}, ...], in order) whose
    accuracy reaches `target`: (time_s, samples), or (None, None) when none does."""
    for point in curve:
        if point["test_accuracy"] >= target:
            return point["time_s"], point["samples"]
    return None, None
