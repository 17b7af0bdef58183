"""Timing semantics on a fake clock: compute, exposed and busy communication, overlap, and the trace."""
import json

import pytest
import torch

import timing
from conftest import run_cli


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


class FakeWork:
    """An async collective whose completion the test decides."""

    def __init__(self):
        self.future = torch.futures.Future()

    def get_future(self):
        return self.future


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", fake)
    return fake


def one_step(timer, clock, forward, backward, comm_busy_during_backward, exposed, optimizer=0.01, data=0.002):
    """A step whose bucket all-reduce starts in backward, runs `comm_busy...` seconds and is waited for `exposed`."""
    timer.start_step()
    clock.advance(data)
    timer.mark("data")
    clock.advance(forward)
    timer.mark("forward")
    clock.advance(backward - comm_busy_during_backward + exposed)  # launched this long before backward ends
    work = FakeWork()
    waited = timer.comm.track("bucket 0", lambda: work)
    clock.advance(comm_busy_during_backward - exposed)
    timer.mark("backward")
    clock.advance(exposed)
    work.future.set_result([torch.zeros(1)])  # completes now: the rest of the step no longer waits
    waited.wait()
    timer.mark("sync")
    clock.advance(optimizer)
    timer.mark("optimizer")
    timer.end_step()


def test_phases_busy_and_exposed_communication_follow_their_definitions(clock):
    timer = timing.StepTimer()
    one_step(timer, clock, forward=0.010, backward=0.030, comm_busy_during_backward=0.020, exposed=0.005)
    (step,) = timer.take_epoch()
    assert step["forward"] == pytest.approx(0.010) and step["backward"] == pytest.approx(0.030)
    assert step["sync"] == pytest.approx(0.005)  # exposed: blocked after backward
    assert step["comm_busy"] == pytest.approx(0.020)  # busy: launch to completion, partly hidden in backward
    assert step["step"] == pytest.approx(0.002 + 0.010 + 0.030 + 0.005 + 0.010)
    assert timing.overlap(step["sync"], step["comm_busy"]) == pytest.approx(1 - 0.005 / 0.020)


def test_overlap_is_none_without_communication_and_negative_when_waiting_exceeds_it():
    assert timing.overlap(0.0, 0.0) is None
    assert timing.overlap(0.0, 0.01) == 1.0
    assert timing.overlap(0.02, 0.01) == pytest.approx(-1.0)


def test_a_collective_finished_inside_its_launch_call_still_counts_as_busy(clock):
    timer = timing.StepTimer()
    timer.start_step()

    def launch_that_blocks():
        clock.advance(0.004)  # the whole all-reduce runs inside the call
        work = FakeWork()
        work.future.set_result(None)
        return work

    timer.comm.track("flat", launch_that_blocks).wait()
    timer.mark("sync")
    timer.end_step()
    assert timer.take_epoch()[0]["comm_busy"] == pytest.approx(0.004)


def test_ddp_backward_beyond_the_no_sync_calibration_counts_as_exposed(clock):
    timer = timing.StepTimer()
    timer.backward_baseline = 0.025
    one_step(timer, clock, forward=0.010, backward=0.040, comm_busy_during_backward=0.0, exposed=0.0)
    (step,) = timer.take_epoch()
    assert step["backward"] == pytest.approx(0.025) and step["sync"] == pytest.approx(0.015)


def test_warm_up_steps_are_left_out(clock):
    timer = timing.StepTimer(warmup_steps=2)
    for _ in range(5):
        one_step(timer, clock, forward=0.01, backward=0.02, comm_busy_during_backward=0.01, exposed=0.0)
    assert len(timer.take_epoch()) == 3


def test_ranks_are_summarised_per_rank_and_across_with_the_straggler():
    steps = lambda seconds: [dict.fromkeys(timing.FIELDS, s) for s in seconds]
    summary = timing.summarize_ranks([steps([1.0, 1.0, 1.0]), steps([1.0, 2.0, 3.0]), steps([4.0, 4.0, 4.0])])
    assert [rank["step"]["mean"] for rank in summary["per_rank"]] == [1.0, 2.0, 4.0]
    assert summary["across_ranks"]["step"]["median"] == 2.0
    assert summary["across_ranks"]["step"]["slowest_rank_mean"] == 4.0
    assert summary["straggler"] == 2.0  # slowest rank's mean / median rank's mean


def test_the_trace_has_one_track_per_rank_and_every_phase(tiny_data, tmp_path):
    trace = tmp_path / "trace.json"
    done = run_cli("--data-dir", tiny_data, "--mode", "manual", "--sync", "bucketed", "--bucket-mb", 0.25,
                   "--world-size", 2, "--val-samples", 100, "--epochs", 1, "--batch-size", 16, "--warmup-steps", 2,
                   "--trace", trace, "--trace-steps", 3, "--results-dir", tmp_path)
    assert done.returncode == 0, done.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    for rank in (0, 1):
        names = {e["name"] for e in spans if e["pid"] == rank}
        assert {"data", "forward", "backward", "sync", "optimizer"} <= names
        assert any(name.startswith("all-reduce bucket") for name in names)
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    assert {e["args"]["step"] for e in spans} == {2, 3, 4}  # the first three steps after the warm-up
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {"rank 0", "rank 1"}


def test_tensorboard_without_its_package_is_one_clear_line():
    try:
        import tensorboard  # noqa: F401 (only whether it imports)
        pytest.skip("the tensorboard package is installed here")
    except ImportError:
        pass
    done = run_cli("--tensorboard", "runs/x")
    assert done.returncode == 2 and "pip install tensorboard" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
