"""Per-step timing: where each step's wall-clock time went, and how long collectives were in flight.

Phases (host wall clock, one `mark` at the end of each):
  data       indexing the batch out of memory and moving it to the device
  forward    the forward pass and the loss
  backward   autograd; bucketed sync and DDP launch all-reduces from inside it
  sync       blocked after backward until every gradient is averaged (exposed communication)
  optimizer  the optimizer step and zeroing the gradients
Communication busy time is separate: each collective's launch-to-completion span, recorded
from its work object's future, so an all-reduce hidden behind backward still counts as busy.
On CUDA every mark synchronises the device first, so queued kernels are not taken as finished.
DDP blocks inside backward, so its exposed communication is estimated: the excess of each
step's backward over `backward_baseline`, the median backward of no_sync() calibration steps.
"""
import threading
import time

import torch

PHASES = ("data", "forward", "backward", "sync", "optimizer")
COMPUTE_PHASES = ("forward", "backward", "optimizer")


class CommRecorder:
    """Launch and completion times of the collectives of the current step."""

    def __init__(self):
        self.spans = []  # (name, launch, done); done is written from the backend's thread
        self._lock = threading.Lock()

    def launched(self, name):
        span = [name, time.perf_counter(), None]
        with self._lock:
            self.spans.append(span)
        return span

    @staticmethod
    def completed(span):
        span[2] = time.perf_counter()

    def track(self, name, launch):
        """Run `launch()` (which starts an async collective and returns its work object) and record
        it from before the call to completion; returns a future to wait on. The clock starts before
        the call because a collective may do part or all of its work inside it."""
        span = self.launched(name)
        work = launch()

        def done(future):
            CommRecorder.completed(span)
            return future.value()

        return work.get_future().then(done)

    def take(self):
        """This step's finished spans, and a fresh list for the next step."""
        with self._lock:
            spans, self.spans = self.spans, []
        return [tuple(span) for span in spans if span[2] is not None]


class StepTimer:
    """Accumulates phase times per step; keeps every step after the warm-up for the summary."""

    def __init__(self, device=torch.device("cpu"), warmup_steps=0, trace_window=0):
        self.cuda = device.type == "cuda"
        self.warmup_steps = warmup_steps
        self.trace_window = trace_window  # steps after warm-up whose spans are kept for a timeline
        self.comm = CommRecorder()
        self.steps_seen = 0
        self.steps = []   # one dict per measured step: phase -> seconds, plus comm_busy, step
        self.trace = []   # (step, name, start, end) for the first trace_window measured steps
        self.backward_baseline = None  # DDP: backward's time without communication, from no_sync() steps

    def now(self):
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def start_step(self):
        self.current = dict.fromkeys(PHASES, 0.0)
        self.step_start = self.last = self.now()
        self.spans = []

    def mark(self, phase):
        now = self.now()
        self.current[phase] += now - self.last
        self.spans.append((phase, self.last, now))
        self.last = now

    def end_step(self):
        comm_spans = self.comm.take()
        self.steps_seen += 1
        if self.steps_seen <= self.warmup_steps:
            return
        record = self.current
        if self.backward_baseline is not None:  # DDP waits for its buckets inside backward: that excess is exposed
            waited = max(0.0, record["backward"] - self.backward_baseline)
            record["backward"] -= waited
            record["sync"] += waited
        record["step"] = self.last - self.step_start
        record["comm_busy"] = sum(done - launch for _, launch, done in comm_spans)
        self.steps.append(record)
        if len(self.steps) <= self.trace_window:
            step = self.steps_seen - 1
            self.trace += [(step, name, start, end) for name, start, end in self.spans]
            self.trace += [(step, "all-reduce " + name, launch, done) for name, launch, done in comm_spans]

    def take_epoch(self):
        """The measured steps of the epoch just ended, and an empty list for the next."""
        steps, self.steps = self.steps, []
        return steps


def overlap(exposed, busy):
    """The share of communication hidden behind computation: 1 - exposed / busy (None without communication).
    Negative when the step waits longer than the collectives ran: copies into and out of buffers, a slower peer."""
    return 1 - exposed / busy if busy > 0 else None


def summarize(values):
    """mean, median and p95 of a list of seconds (all zero for an empty list)."""
    if not values:
        return {"mean": 0.0, "median": 0.0, "p95": 0.0}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return {"mean": sum(ordered) / len(ordered), "median": pick(0.5), "p95": pick(0.95)}


FIELDS = PHASES + ("comm_busy", "step")


def summarize_ranks(steps_per_rank):
    """Per-phase statistics per rank and across ranks, from each rank's list of step records.

    Across ranks, statistics pool every rank's steps; `slowest_rank_mean` is the largest
    per-rank mean, and `straggler` is the slowest rank's mean step time over the median rank's.
    """
    per_rank = [{field: summarize([s[field] for s in steps]) for field in FIELDS} for steps in steps_per_rank]
    pooled = {field: summarize([s[field] for steps in steps_per_rank for s in steps]) for field in FIELDS}
    for field in FIELDS:
        pooled[field]["slowest_rank_mean"] = max(rank[field]["mean"] for rank in per_rank)
    rank_means = sorted(rank["step"]["mean"] for rank in per_rank)
    median_rank = rank_means[(len(rank_means) - 1) // 2]
    return {
        "per_rank": per_rank,
        "across_ranks": pooled,
        "straggler": rank_means[-1] / median_rank if median_rank > 0 else 1.0,
    }


def chrome_trace(traces_per_rank):
    """A Chrome-trace document (chrome://tracing, ui.perfetto.dev): one process per rank, with a
    compute track (the phases) and a communication track (each collective from launch to completion).

    `traces_per_rank[r]` is (origin, spans): rank r's clock reading at a barrier all ranks
    passed together, and its (step, name, start, end) spans; times are shown from that barrier.
    """
    events = []
    for rank, (origin, spans) in enumerate(traces_per_rank):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        for track, label in ((0, "compute"), (1, "communication")):
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": track, "args": {"name": label}})
        for step, name, start, end in spans:
            events.append({"ph": "X", "name": name, "pid": rank, "tid": 1 if name.startswith("all-reduce") else 0,
                           "ts": (start - origin) * 1e6, "dur": (end - start) * 1e6, "args": {"step": step}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
