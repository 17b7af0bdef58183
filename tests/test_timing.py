"""Timing semantics on a fake clock: compute, exposed and busy communication, overlap, the trace.

Each scenario runs in a child process (grading/launch.py run_alone) on a fake clock and returns
its step records; the tests check them here. The code under test is imported inside those
functions, never at the top, as this module is also imported by the process that decides the
tests (grading/judge.py). results.overlap is not task code: it is checked here."""
import contextlib
import json

import pytest
import torch

from grading.launch import run_alone, run_cli
from runtime.results import overlap
from runtime.timing import FIELDS

pytestmark = pytest.mark.rubric("core.timing")


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


@contextlib.contextmanager
def fake_clock():
    """In a child: the timer's host clock replaced by a FakeClock, which the scenario advances."""
    from runtime import timing

    clock = FakeClock()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timing.time, "perf_counter", clock)
        yield clock


def plain(records):
    """Step records as plain floats, which come back from a child (numpy's would not)."""
    return [{field: float(value) for field, value in record.items()} for record in records]


def one_step(timer, clock, forward, backward, comm_busy, exposed, optimizer=0.01, data=0.002,
             waited_inside=0.0):
    """A step whose bucket all-reduce starts in backward, runs `comm_busy` seconds and is
    waited for `exposed` seconds after backward; with `waited_inside` (DDP), the last gradient is
    accumulated that long before backward returns, and backward waits for the bucket inside."""
    timer.start_step()
    clock.advance(data)
    timer.mark("data")
    clock.advance(forward)
    timer.mark("forward")
    clock.advance(backward - comm_busy + exposed)  # started this long before backward ends
    span = timer.comm.started("bucket 0", 4096)
    clock.advance(comm_busy - exposed - waited_inside)
    timer.comm.gradient_ready("weight")
    clock.advance(waited_inside)
    timer.mark("backward")
    clock.advance(exposed)
    timer.comm.finished(span)  # completes now: the rest of the step no longer waits
    timer.mark("sync")
    clock.advance(optimizer)
    timer.mark("optimizer")
    timer.end_step()


def time_steps(step, steps, warmup_steps):
    """The records of `steps` one_step(**step) timed by StepTimer(warmup_steps=...)."""
    from runtime import timing

    with fake_clock() as clock:
        timer = timing.StepTimer(warmup_steps=warmup_steps)
        for _ in range(steps):
            one_step(timer, clock, **step)
        return plain(timer.take_epoch())


def measured_steps(steps=1, warmup_steps=0, **step):
    """time_steps in a child: the step records of `steps` steps shaped by one_step's options."""
    return run_alone(time_steps, step, steps, warmup_steps)


def assert_invariants(step):
    """What every step record satisfies, whatever the strategy (timing.py's docstring)."""
    assert 0 <= step["comm_hidden"] <= step["comm_busy"] <= step["step"] + 1e-12
    assert step["comm_exposed"] <= step["step"]
    assert step["data"] + step["compute"] + step["comm_exposed"] == pytest.approx(step["step"])


def test_phases_busy_hidden_and_exposed_communication_follow_their_definitions():
    (step,) = measured_steps(forward=0.010, backward=0.030, comm_busy=0.020, exposed=0.005)
    assert step["forward"] == pytest.approx(0.010) and step["backward"] == pytest.approx(0.030)
    assert step["sync"] == pytest.approx(0.005)
    # busy: launch to completion; 15 ms of it lie inside backward (hidden), 5 ms after it (exposed)
    assert step["comm_busy"] == pytest.approx(0.020)
    assert step["comm_hidden"] == pytest.approx(0.015)
    assert step["comm_exposed"] == pytest.approx(0.005)
    assert step["step"] == pytest.approx(0.002 + 0.010 + 0.030 + 0.005 + 0.010)
    assert step["compute"] == pytest.approx(0.010 + 0.030 + 0.010)
    assert overlap(step["comm_hidden"], step["comm_busy"]) == pytest.approx(0.75)
    assert_invariants(step)


def two_collectives_in_flight():
    # Bucket 1 is launched while bucket 0 is still in flight and queues behind it.
    from runtime import timing

    with fake_clock() as clock:
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
        return plain(timer.take_epoch())


def test_two_collectives_in_flight_together_count_once():
    # Summing the two spans (40 ms) would exceed the 30 ms step; the union is the 25 ms during
    # which either ran.
    (step,) = run_alone(two_collectives_in_flight)
    assert step["step"] == pytest.approx(0.030)
    assert step["comm_busy"] == pytest.approx(0.025)  # not 0.015 + 0.025 = 0.040
    assert step["comm_hidden"] == pytest.approx(0.015)
    assert step["comm_exposed"] == pytest.approx(0.010)
    assert_invariants(step)


def union_lengths(calls):
    """timing.union_length(intervals, low, high) for each argument tuple."""
    from runtime import timing

    return [timing.union_length(*call) for call in calls]


def test_the_union_of_intervals_merges_overlaps_and_clips_to_the_window():
    merged, clipped, nested, empty = run_alone(union_lengths, [
        ([(0, 2), (1, 3), (5, 6)], 0, 10), ([(0, 2), (1, 3), (5, 6)], 1.5, 5.5),
        ([(2, 3), (0, 10)], 0, 10), ([], 0, 1)])
    assert merged == 3 + 1
    assert clipped == pytest.approx(1.5 + 0.5)
    assert nested == 10
    assert empty == 0


def test_overlap_is_the_hidden_share_and_none_without_communication():
    # results.overlap is not task code (the analysis runs it in this process), so it runs here
    assert overlap(0.0, 0.0) is None
    assert overlap(0.01, 0.01) == 1.0
    assert overlap(0.0, 0.01) == 0.0


def collective_finished_inside_its_launch_call():
    from runtime import timing

    with fake_clock() as clock:
        timer = timing.StepTimer()
        timer.start_step()
        timer.mark("backward")
        span = timer.comm.started("ring")
        clock.advance(0.004)  # the whole all-reduce runs inside the call, as the ring's does
        timer.comm.finished(span)
        timer.mark("sync")
        timer.end_step()
        return plain(timer.take_epoch())


def test_a_collective_finished_inside_its_launch_call_still_counts_as_busy_and_exposed():
    (step,) = run_alone(collective_finished_inside_its_launch_call)
    assert step["comm_busy"] == pytest.approx(0.004)
    assert step["comm_exposed"] == pytest.approx(0.004)


@contextlib.contextmanager
def pending_all_reduce():
    """In a child: dist.all_reduce(async_op=True) as seen by the lesson's all_reduce, completing
    when the scenario says."""
    import manual_allreduce

    work = FakeWork()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(manual_allreduce.dist, "all_reduce", lambda tensor, async_op: work)
        yield work


def asynchronous_all_reduce():
    import manual_allreduce
    from runtime import timing

    with fake_clock() as clock, pending_all_reduce() as pending:
        timer = timing.StepTimer()
        timer.start_step()
        timer.mark("backward")
        timed_all_reduce = timing.timed(manual_allreduce.all_reduce, timer.comm)
        done = timed_all_reduce(torch.zeros(1))
        clock.advance(0.004)
        pending.future.set_result([torch.zeros(1)])  # on the backend's thread, really
        done.wait()
        clock.advance(0.001)
        timer.mark("sync")
        timer.end_step()
        return plain(timer.take_epoch())


def test_an_asynchronous_all_reduce_is_recorded_until_its_future_completes():
    (step,) = run_alone(asynchronous_all_reduce)
    assert step["comm_busy"] == pytest.approx(0.004)
    assert step["comm_exposed"] == pytest.approx(0.004)


def failed_asynchronous_all_reduce():
    """The RuntimeError that waiting for a failed all-reduce raises, as its message; None if
    waiting raises none."""
    import manual_allreduce
    from runtime import timing

    with pending_all_reduce() as pending:
        timed_all_reduce = timing.timed(manual_allreduce.all_reduce, timing.CommRecorder())
        done = timed_all_reduce(torch.zeros(1))
        pending.future.set_exception(RuntimeError("a peer went away"))
        try:
            done.wait()
        except RuntimeError as error:
            return str(error)
    return None


def test_a_failed_asynchronous_all_reduce_raises_where_it_is_waited_for():
    message = run_alone(failed_asynchronous_all_reduce)
    assert message is not None, "waiting did not raise"
    assert "a peer went away" in message


def step_without_communication():
    from runtime import timing

    with fake_clock() as clock:
        timer = timing.StepTimer()
        timer.start_step()
        for phase in timing.PHASES:
            clock.advance(0.003)
            timer.mark(phase)
        timer.end_step()
        return plain(timer.take_epoch())


def test_without_communication_busy_hidden_and_exposed_are_exactly_zero():
    (step,) = run_alone(step_without_communication)
    assert (step["comm_busy"], step["comm_hidden"], step["comm_exposed"]) == (0.0, 0.0, 0.0)
    assert step["own_work"] == step["step"]


def test_ddp_waiting_inside_backward_counts_as_exposed_from_the_last_gradient_on():
    # DDP's backward (40 ms) waits for its bucket inside: its last gradient was accumulated 15 ms
    # before backward returned.
    (step,) = measured_steps(forward=0.010, backward=0.040, comm_busy=0.030, exposed=0.0,
                             waited_inside=0.015)
    assert step["comm_exposed"] == pytest.approx(0.015)
    # the bucket ran from 10 ms into backward to its end; 15 ms of that lie before compute ended
    assert step["comm_hidden"] == pytest.approx(0.015) and step["comm_busy"] == pytest.approx(0.030)
    assert step["compute"] == pytest.approx(0.010 + 0.025 + 0.010)
    assert_invariants(step)


def layouts_over_steps():
    # Two steps of one 8 kB bucket, then a rebuild into two buckets, as DDP does after step 0.
    from runtime import timing

    timer = timing.StepTimer(warmup_steps=1)
    for sizes in ([8192], [8192], [4096, 4096], [4096, 4096]):
        timer.start_step()
        for size in sizes:
            timer.comm.finished(timer.comm.started("bucket", size))
        timer.mark("backward")
        timer.end_step()
    return timer.layouts.layouts


def test_the_layout_log_keeps_each_layout_from_the_step_it_first_went_over_the_wire():
    assert run_alone(layouts_over_steps) == [{"from_step": 0, "bytes": [8192]},
                                             {"from_step": 2, "bytes": [4096, 4096]}]


def test_warm_up_steps_are_left_out():
    records = measured_steps(steps=5, warmup_steps=2, forward=0.01, backward=0.02, comm_busy=0.01,
                             exposed=0.0)
    assert len(records) == 3


def summarize_ranks(steps_per_rank):
    from runtime import timing

    return timing.summarize_ranks(steps_per_rank)


def waiting_steps(own_work):
    """Three steps of 10 ms (blocking collectives) of which the rank works `own_work` seconds and
    waits for its peers the rest."""
    record = dict.fromkeys(FIELDS, 0.0)
    record.update(step=0.010, own_work=own_work, comm_exposed=0.010 - own_work)
    return [record] * 3


def steps_lasting(seconds):
    """One step record per value, every field that value."""
    return [dict.fromkeys(FIELDS, value) for value in seconds]


def test_the_straggler_compares_own_work_not_steps_that_waiting_made_equal():
    # Three ranks whose steps all last 10 ms; rank 2 works 9 ms of them, the others 6 ms and then
    # wait 4 ms for it. Step times say 1.0; own work says 1.5.
    ranks = [waiting_steps(0.006), waiting_steps(0.006), waiting_steps(0.009)]
    summary = run_alone(summarize_ranks, ranks)
    assert summary["across_ranks"]["step"]["slowest_rank_mean"] == pytest.approx(0.010)
    assert summary["straggler"] == pytest.approx(0.009 / 0.006)


def test_with_an_even_count_of_ranks_the_straggler_is_over_the_lower_middle_rank():
    # Own work 6, 7, 8 and 12 ms: the median rank is the 7 ms one, a rank's own figure (not 7.5)
    ranks = [waiting_steps(0.006), waiting_steps(0.008), waiting_steps(0.012), waiting_steps(0.007)]
    summary = run_alone(summarize_ranks, ranks)
    assert summary["straggler"] == pytest.approx(0.012 / 0.007)


def test_ranks_are_summarised_per_rank_and_across():
    summary = run_alone(summarize_ranks, [steps_lasting([1.0, 1.0, 1.0]),
                                          steps_lasting([1.0, 2.0, 3.0]),
                                          steps_lasting([4.0, 4.0, 4.0])])
    assert [rank["step"]["mean"] for rank in summary["per_rank"]] == [1.0, 2.0, 4.0]
    assert summary["across_ranks"]["step"]["median"] == 2.0
    assert summary["across_ranks"]["step"]["slowest_rank_mean"] == 4.0


def test_the_median_of_an_even_count_of_steps_is_the_mean_of_the_two_middle_ones():
    summary = run_alone(summarize_ranks, [steps_lasting([1.0, 2.0]), steps_lasting([4.0, 3.0])])
    # each rank's two steps: 1.5 and 3.5; the four pooled (1, 2, 3, 4): 2.5, as statistics.median
    assert [rank["step"]["median"] for rank in summary["per_rank"]] == [1.5, 3.5]
    assert summary["across_ranks"]["step"]["median"] == 2.5
    # p95 is the step at rank int(0.95 n) in ascending order: the slowest of four
    assert summary["across_ranks"]["step"]["p95"] == 4.0


@pytest.mark.rubric("core.end_to_end")
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


@pytest.mark.rubric()
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


def one_step_on_a_fake_cuda_device():
    """When torch.cuda.synchronize was called (clock readings) while the step ran and once its
    records were taken, and the records."""
    from runtime import timing

    synchronized = []
    with fake_clock() as clock, pytest.MonkeyPatch.context() as patch:
        FakeCudaEvent.clock = clock
        patch.setattr(timing.torch.cuda, "Event", FakeCudaEvent)
        patch.setattr(timing.torch.cuda, "synchronize", lambda: synchronized.append(clock()))
        timer = timing.StepTimer(torch.device("cuda", 0))
        one_step(timer, clock, forward=0.010, backward=0.030, comm_busy=0.020, exposed=0.005)
        during_the_step = list(synchronized)
        records = plain(timer.take_epoch())
    return {"during_the_step": during_the_step, "after_the_epoch": synchronized,
            "records": records}


def test_on_cuda_marks_are_events_read_once_per_epoch_not_a_synchronize_per_mark():
    timed = run_alone(one_step_on_a_fake_cuda_device)
    assert timed["during_the_step"] == []  # nothing waits for the device while the step runs
    (step,) = timed["records"]
    assert timed["after_the_epoch"]  # the events are read after the epoch
    assert step["step"] == pytest.approx(0.057) and step["comm_busy"] == pytest.approx(0.020)
    assert step["comm_hidden"] == pytest.approx(0.015)
    assert step["comm_exposed"] == pytest.approx(0.005)


def time_a_ring_without_the_interception():
    """What timing a hand-written collective's bytes says in a process that counts no send."""
    from runtime import timing

    try:
        timing.timed(lambda tensor: tensor, timing.CommRecorder(), transport="point-to-point")
    except RuntimeError as error:
        return str(error)
    return "timed, its bytes counted as 0"


def test_timing_a_ring_where_no_send_is_counted_is_refused_rather_than_counted_as_zero():
    # run_alone: a fresh process, where no launcher has installed the interception
    said = run_alone(time_a_ring_without_the_interception)
    assert "none is installed in this process" in said, said
