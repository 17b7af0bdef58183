"""Timing semantics on a fake clock: compute, exposed and busy communication, overlap, the trace."""
import json

import pytest
import torch

import manual_allreduce
from runtime import timing
from tests.harness import run_cli


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


def one_step(timer, clock, forward, backward, comm_busy, exposed, optimizer=0.01, data=0.002):
    """A step whose bucket all-reduce starts in backward, runs `comm_busy` seconds and is
    waited for `exposed` seconds after backward."""
    timer.start_step()
    clock.advance(data)
    timer.mark("data")
    clock.advance(forward)
    timer.mark("forward")
    clock.advance(backward - comm_busy + exposed)  # started this long before backward ends
    span = timer.comm.started("bucket 0")
    clock.advance(comm_busy - exposed)
    timer.mark("backward")
    clock.advance(exposed)
    timer.comm.finished(span)  # completes now: the rest of the step no longer waits
    timer.mark("sync")
    clock.advance(optimizer)
    timer.mark("optimizer")
    timer.end_step()


def assert_invariants(step):
    """What every step record satisfies, whatever the strategy (timing.py's docstring)."""
    assert 0 <= step["comm_hidden"] <= step["comm_busy"] <= step["step"] + 1e-12
    assert step["comm_exposed"] <= step["step"]
    assert step["data"] + step["compute"] + step["comm_exposed"] == pytest.approx(step["step"])


def test_phases_busy_hidden_and_exposed_communication_follow_their_definitions(clock):
    timer = timing.StepTimer()
    one_step(timer, clock, forward=0.010, backward=0.030, comm_busy=0.020, exposed=0.005)
    (step,) = timer.take_epoch()
    assert step["forward"] == pytest.approx(0.010) and step["backward"] == pytest.approx(0.030)
    assert step["sync"] == pytest.approx(0.005)
    # busy: launch to completion; 15 ms of it lie inside backward (hidden), 5 ms after it (exposed)
    assert step["comm_busy"] == pytest.approx(0.020)
    assert step["comm_hidden"] == pytest.approx(0.015)
    assert step["comm_exposed"] == pytest.approx(0.005)
    assert step["step"] == pytest.approx(0.002 + 0.010 + 0.030 + 0.005 + 0.010)
    assert step["compute"] == pytest.approx(0.010 + 0.030 + 0.010)
    assert timing.overlap(step["comm_hidden"], step["comm_busy"]) == pytest.approx(0.75)
    assert_invariants(step)


def test_two_collectives_in_flight_together_count_once(clock):
    # Bucket 1 is launched while bucket 0 is still in flight and queues behind it: summing the two
    # spans (40 ms) would exceed the 30 ms step; the union is the 25 ms during which either ran.
    timer = timing.StepTimer()
    timer.start_step()
    timer.mark("data")
    clock.advance(0.005)
    first = timer.comm.started("bucket 0")
    clock.advance(0.005)
    second = timer.comm.started("bucket 1")
    clock.advance(0.010)
    timer.comm.finished(first)
    timer.mark("backward")
    clock.advance(0.010)
    timer.comm.finished(second)
    timer.mark("sync")
    timer.end_step()
    (step,) = timer.take_epoch()
    assert step["step"] == pytest.approx(0.030)
    assert step["comm_busy"] == pytest.approx(0.025)  # not 0.015 + 0.025 = 0.040
    assert step["comm_hidden"] == pytest.approx(0.015)
    assert step["comm_exposed"] == pytest.approx(0.010)
    assert_invariants(step)


def test_the_union_of_intervals_merges_overlaps_and_clips_to_the_window():
    assert timing.union_length([(0, 2), (1, 3), (5, 6)], 0, 10) == 3 + 1
    assert timing.union_length([(0, 2), (1, 3), (5, 6)], 1.5, 5.5) == pytest.approx(1.5 + 0.5)
    assert timing.union_length([(2, 3), (0, 10)], 0, 10) == 10
    assert timing.union_length([], 0, 1) == 0


def test_overlap_is_the_hidden_share_and_none_without_communication():
    assert timing.overlap(0.0, 0.0) is None
    assert timing.overlap(0.01, 0.01) == 1.0
    assert timing.overlap(0.0, 0.01) == 0.0


def test_a_collective_finished_inside_its_launch_call_still_counts_as_busy_and_exposed(clock):
    timer = timing.StepTimer()
    timer.start_step()
    timer.mark("backward")
    span = timer.comm.started("ring")
    clock.advance(0.004)  # the whole all-reduce runs inside the call, as the ring's does
    timer.comm.finished(span)
    timer.mark("sync")
    timer.end_step()
    (step,) = timer.take_epoch()
    assert step["comm_busy"] == pytest.approx(0.004)
    assert step["comm_exposed"] == pytest.approx(0.004)


@pytest.fixture
def pending_all_reduce(monkeypatch):
    """dist.all_reduce(async_op=True) as seen by start_all_reduce, completing when the test says."""
    work = FakeWork()
    monkeypatch.setattr(manual_allreduce.dist, "all_reduce", lambda tensor, async_op: work)
    return work


def test_an_asynchronous_all_reduce_is_recorded_until_its_future_completes(clock,
                                                                           pending_all_reduce):
    timer = timing.StepTimer()
    timer.start_step()
    timer.mark("backward")
    done = manual_allreduce.start_all_reduce(torch.zeros(1), "bucket 0", timer.comm)
    clock.advance(0.004)
    pending_all_reduce.future.set_result([torch.zeros(1)])  # on the backend's thread, really
    done.wait()
    clock.advance(0.001)
    timer.mark("sync")
    timer.end_step()
    (step,) = timer.take_epoch()
    assert step["comm_busy"] == pytest.approx(0.004)
    assert step["comm_exposed"] == pytest.approx(0.004)


def test_a_failed_asynchronous_all_reduce_raises_where_it_is_waited_for(pending_all_reduce):
    done = manual_allreduce.start_all_reduce(torch.zeros(1), "bucket 0", timing.CommRecorder())
    pending_all_reduce.future.set_exception(RuntimeError("a peer went away"))
    with pytest.raises(RuntimeError, match="a peer went away"):
        done.wait()


def test_without_communication_busy_hidden_and_exposed_are_exactly_zero(clock):
    timer = timing.StepTimer()
    timer.start_step()
    for phase in timing.PHASES:
        clock.advance(0.003)
        timer.mark(phase)
    timer.end_step()
    (step,) = timer.take_epoch()
    assert (step["comm_busy"], step["comm_hidden"], step["comm_exposed"]) == (0.0, 0.0, 0.0)
    assert step["own_work"] == step["step"]


def test_ddp_backward_beyond_the_calibrated_baseline_counts_as_exposed(clock):
    # DDP's backward (40 ms) waits for its bucket inside; without communication it takes 25 ms.
    timer = timing.StepTimer()
    timer.backward_baseline = 0.025
    one_step(timer, clock, forward=0.010, backward=0.040, comm_busy=0.030, exposed=0.0)
    (step,) = timer.take_epoch()
    assert step["comm_exposed"] == pytest.approx(0.015)
    # the bucket ran from 10 ms into backward to its end; 15 ms of that lie before the estimated
    # end of compute
    assert step["comm_hidden"] == pytest.approx(0.015) and step["comm_busy"] == pytest.approx(0.030)
    assert step["compute"] == pytest.approx(0.010 + 0.025 + 0.010)
    assert_invariants(step)


def test_ddp_estimate_is_not_clamped_so_its_mean_stays_unbiased(clock):
    # A backward that happens to run faster than the baseline gives a negative estimate for that
    # step,
    # which cancels the positive noise of others instead of biasing the mean upwards.
    timer = timing.StepTimer()
    timer.backward_baseline = 0.025
    one_step(timer, clock, forward=0.010, backward=0.024, comm_busy=0.0, exposed=0.0)
    (step,) = timer.take_epoch()
    assert step["comm_exposed"] == pytest.approx(-0.001)
    assert_invariants(step)


def test_warm_up_steps_are_left_out(clock):
    timer = timing.StepTimer(warmup_steps=2)
    for _ in range(5):
        one_step(timer, clock, forward=0.01, backward=0.02, comm_busy=0.01, exposed=0.0)
    assert len(timer.take_epoch()) == 3


def test_the_straggler_compares_own_work_not_steps_that_waiting_made_equal():
    # Three ranks whose steps all last 10 ms (blocking collectives); rank 2 works 9 ms of them,
    # the others 6 ms and then wait 4 ms for it. Step times say 1.0; own work says 1.5.
    def steps(own_work):
        record = dict.fromkeys(timing.FIELDS, 0.0)
        record.update(step=0.010, own_work=own_work, comm_exposed=0.010 - own_work)
        return [record] * 3
    summary = timing.summarize_ranks([steps(0.006), steps(0.006), steps(0.009)])
    assert summary["across_ranks"]["step"]["slowest_rank_mean"] == pytest.approx(0.010)
    assert summary["straggler"] == pytest.approx(0.009 / 0.006)


def test_ranks_are_summarised_per_rank_and_across():
    def steps(seconds):
        return [dict.fromkeys(timing.FIELDS, value) for value in seconds]

    summary = timing.summarize_ranks([steps([1.0, 1.0, 1.0]), steps([1.0, 2.0, 3.0]),
                                      steps([4.0, 4.0, 4.0])])
    assert [rank["step"]["mean"] for rank in summary["per_rank"]] == [1.0, 2.0, 4.0]
    assert summary["across_ranks"]["step"]["median"] == 2.0
    assert summary["across_ranks"]["step"]["slowest_rank_mean"] == 4.0


def test_the_trace_has_one_track_per_rank_and_every_phase(tiny_data, tmp_path):
    trace = tmp_path / "trace.json"
    done = run_cli("--data-dir", tiny_data, "--mode", "manual", "--sync", "bucketed",
                   "--bucket-mb", 0.25, "--world-size", 2, "--val-samples", 100, "--epochs", 1,
                   "--batch-size", 16, "--warmup-steps", 2, "--trace", trace, "--trace-steps", 3,
                   "--results-dir", tmp_path)
    assert done.returncode == 0, done.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [event for event in events if event["ph"] == "X"]
    assert {span["pid"] for span in spans} == {0, 1}
    for rank in (0, 1):
        names = {span["name"] for span in spans if span["pid"] == rank}
        assert {"data", "forward", "backward", "sync", "optimizer"} <= names
        assert any(name.startswith("all-reduce bucket") for name in names)
    assert all(span["dur"] >= 0 and span["ts"] >= 0 for span in spans)
    steps = {span["args"]["step"] for span in spans}
    assert steps == {2, 3, 4}  # the first three steps after the warm-up
    processes = {event["args"]["name"] for event in events if event["name"] == "process_name"}
    assert processes == {"rank 0", "rank 1"}


def test_tensorboard_without_its_package_is_one_clear_line():
    try:
        import tensorboard  # noqa: F401 (only whether it imports)
        pytest.skip("the tensorboard package is installed here")
    except ImportError:
        pass
    done = run_cli("--tensorboard", "runs/x")
    assert done.returncode == 2 and "pip install tensorboard" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


class FakeCudaEvent:
    """A CUDA event on a fake device clock: `record()` reads the test's clock; `elapsed_time` is
    in ms."""

    clock = None

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.time = None

    def record(self):
        self.time = FakeCudaEvent.clock()

    def elapsed_time(self, later):
        return (later.time - self.time) * 1e3


def test_on_cuda_marks_are_events_read_once_per_epoch_not_a_synchronize_per_mark(clock,
                                                                                 monkeypatch):
    synchronized = []
    FakeCudaEvent.clock = clock
    monkeypatch.setattr(timing.torch.cuda, "Event", FakeCudaEvent)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: synchronized.append(clock()))
    timer = timing.StepTimer(torch.device("cuda", 0))
    one_step(timer, clock, forward=0.010, backward=0.030, comm_busy=0.020, exposed=0.005)
    assert synchronized == []  # nothing waits for the device while the step runs
    (step,) = timer.take_epoch()
    assert synchronized  # the events are read after the epoch
    assert step["step"] == pytest.approx(0.057) and step["comm_busy"] == pytest.approx(0.020)
    assert step["comm_hidden"] == pytest.approx(0.015)
    assert step["comm_exposed"] == pytest.approx(0.005)
