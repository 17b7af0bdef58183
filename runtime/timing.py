"""Per-step timing: where each step's wall-clock time went, and how long communication ran.

Phases, one `mark` at the end of each:
  data       indexing the batch out of memory and moving it to the device
  forward    the forward pass and the loss
  backward   autograd; bucketed sync and DDP launch all-reduces from inside it
  sync       after backward, until every gradient is averaged (packing, waiting, copying back)
  optimizer  the optimizer step and zeroing the gradients
Communication, per step and rank, from each collective's span (from before its launch call, since a
collective may do part or all of its work inside it, to its completion):
  comm_busy     the length of the union of the spans: time with at least one collective in flight
  comm_hidden   the part of that union before compute ended
  comm_exposed  the part after it: the step could not end until that communication had
  compute       step - data - comm_exposed (forward, backward, optimizer, and sync's copies)
  own_work      step - comm_exposed: the rank's own work, without the time it waited for peers
Compute ends when the step's last gradient has been accumulated: a post-accumulate-grad hook on
every parameter (`watch_gradients`) stamps each one, for every mode alike. That matters for DDP,
which waits for its buckets inside backward: the end of backward is not the end of its compute.
So 0 <= comm_hidden <= comm_busy <= step, comm_exposed <= comm_busy, and
data + compute + comm_exposed == step, exactly.
The recorder also keeps the bytes of each collective, so a run records the bucket layout that
actually went over the wire (DDP rebuilds its buckets after the first step; see `LayoutLog`), and
the bytes that left the rank, counted where they are sent (`SENT_BY_LIBRARY`, `timed`).
On CUDA the stamps are CUDA events on the current stream, read after the epoch: no device-wide
synchronize per mark, which would also wait for the communication streams.
"""
import statistics
import threading
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from runtime.collective_record import counting_sends, intercepting

PHASES = ("data", "forward", "backward", "sync", "optimizer")
# A trace span's name starts with its collective, then what it sends: "all-reduce bucket 0"
COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather")
COMM_FIELDS = ("comm_busy", "comm_hidden", "comm_exposed")
FIELDS = PHASES + ("compute",) + COMM_FIELDS + ("own_work", "step")

# Bytes that leave a rank in one collective of B bytes (an all-reduce's buffer, a reduce-scatter's
# input, an all-gather's output) over n ranks, in units of B(n-1)/n. A bandwidth-optimal ring sends
# RING_SENT; the library's process group sends SENT_BY_LIBRARY, gloo's algorithms in torch 2.13:
# all_reduce is a ring; reduce_scatter_single is a clone plus a whole all-reduce, so it sends an
# all-reduce's bytes, twice a ring's (torch.profiler shows gloo:all_reduce, not a reduce-scatter,
# under c10d::_reduce_scatter_base_); all_gather_single is gloo:all_gather, a ring. The library's
# sends happen inside the process group, out of Python's sight: they are counted by this table at
# the launch. The hand-written collectives' point-to-point messages are counted at each send
# (`timed`), so they are measured, not predicted.
RING_SENT = {"all-reduce": 2, "reduce-scatter": 1, "all-gather": 1}
SENT_BY_LIBRARY = {"all-reduce": 2, "reduce-scatter": 2, "all-gather": 1}
# What carries a timed collective's bytes (`timed`'s transport) is a carrier of
# runtime/transports.py's table; shared memory's bytes are counted at sends as the ring's: none
# within a host (between hosts, its library all-reduce is not counted).


class HostClock:
    """Stamps are perf_counter() readings."""

    def stamp(self):
        """Now, in seconds."""
        return time.perf_counter()

    def seconds(self, stamps):
        """The stamps in seconds: they already are."""
        return stamps


class CudaClock:
    """Stamps are CUDA events on the current stream; turned into seconds once the epoch is done."""

    def stamp(self):
        """An event recorded on the current stream, with the host's time beside it."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return (time.perf_counter(), event)

    def seconds(self, stamps):
        """Host seconds of the first stamp, plus each event's device time after the first event."""
        torch.cuda.synchronize()
        host, origin = stamps[0]
        return [host + origin.elapsed_time(event) / 1e3 for _, event in stamps]


class CommRecorder:
    """Start and end stamps and the bytes of the collectives of the current step, reported by the
    `timed` layer around the all-reduce of every mode that communicates, and the stamp of each
    gradient as it is accumulated (`watch_gradients`)."""

    def __init__(self, clock=None):
        self.clock = clock or HostClock()
        self.spans = []  # [name, start, end]; end is written from the backend's thread
        self.sizes = []  # bytes of each collective started this step, in launch order
        self.gradients = []  # (parameter name, stamp) as each gradient was accumulated
        self.sent = {}  # per collective: how many it has started this step
        self.label = None  # what the collectives started now send, where the runtime says so
        self.outgoing = []  # (transport, bytes that left the rank, a ring's) per collective
        self.at_start = []  # called just before each collective starts (memory.MemoryWatch)
        self._lock = threading.Lock()

    @contextmanager
    def labelled(self, label):
        """Inside the block, collectives are named as sending `label` ("unit 3")."""
        self.label = label
        try:
            yield
        finally:
            self.label = None

    def next_name(self, collective, message):
        """The trace's name for the next `collective` ("all-gather"): what it sends, as labelled,
        else `message` numbered in the order of this step's calls ("bucket 2")."""
        with self._lock:
            number = self.sent.get(collective, 0)
            self.sent[collective] = number + 1
        return f"{collective} {self.label or f'{message} {number}'}"

    def started(self, name, nbytes=0):
        """Called just before a collective of `nbytes` starts; returns its span, for
        `finished`."""
        for callback in self.at_start:
            callback()
        span = [name, self.clock.stamp(), None]
        with self._lock:
            self.spans.append(span)
            self.sizes.append(nbytes)
        return span

    def left_rank(self, transport, nbytes, ring_bytes):
        """Called once a collective carried by `transport` has sent `nbytes` from this rank, where
        a ring would have sent `ring_bytes`."""
        with self._lock:
            self.outgoing.append((transport, nbytes, ring_bytes))

    def take_outgoing(self):
        """(transport, bytes sent, a ring's bytes) of each collective since the last call."""
        with self._lock:
            outgoing, self.outgoing = self.outgoing, []
        return outgoing

    def finished(self, span):
        """Called once the collective is complete (on CUDA, ordered after it on the stream)."""
        span[2] = self.clock.stamp()

    def gradient_ready(self, name):
        """Called as parameter `name`'s gradient has been accumulated."""
        self.gradients.append((name, self.clock.stamp()))

    def take(self):
        """This step's finished spans, its collectives' bytes and its gradient stamps; fresh
        lists for the next step (the bytes sent too: `take_outgoing` first to keep them)."""
        with self._lock:
            spans, self.spans = self.spans, []
            sizes, self.sizes = self.sizes, []
            self.sent = {}
            self.outgoing = []
        gradients, self.gradients = self.gradients, []
        return [tuple(span) for span in spans if span[2] is not None], sizes, gradients


def watch_gradients(model, recorder):
    """Stamps each parameter's gradient in `recorder` once autograd has accumulated it. Called
    before the model is wrapped, so the stamp comes before the wrapper's own hooks (DDP's reducer,
    a bucketed strategy's launch): a bucket launched by the last gradient starts after compute."""
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            parameter.register_post_accumulate_grad_hook(
                lambda _parameter, name=name: recorder.gradient_ready(name))


class LayoutLog:
    """The bytes of each step's collectives, kept whenever they differ from the step before: the
    layout that went over the wire, and the step from which it did (DDP builds its buckets from
    the parameters' order, then rebuilds them after the first step from the gradients' order)."""

    def __init__(self):
        self.layouts = []  # {"from_step": step, "bytes": [bytes of each collective, in order]}

    def add(self, step, sizes):
        """Step `step`'s collectives' bytes."""
        if sizes and (not self.layouts or self.layouts[-1]["bytes"] != sizes):
            self.layouts.append({"from_step": step, "bytes": list(sizes)})


def bytes_sent(table, kind, nbytes, world):
    """Bytes a rank sends in a `kind` of `nbytes` over `world` ranks, by `table` (RING_SENT,
    SENT_BY_LIBRARY)."""
    return table[kind] * nbytes * (world - 1) // world


def timed(collective, recorder, kind="all-reduce", message="message", transport="library"):
    """A layer around a collective called with tensors and returning a future (manual_allreduce's
    all-reduce, manual_sharding's reduce-scatter and all-gather): each call's span goes to
    `recorder`, from just before the call (a collective may do its work inside it) to its
    completion, with the bytes of its largest tensor (the buffer all-reduced, a reduce-scatter's
    input, an all-gather's output), named `kind` and what it sends (CommRecorder.next_name), and
    the bytes that left the rank: the library's by SENT_BY_LIBRARY, a "point-to-point" one's
    counted at its sends, all of which happen inside the call (a hand-written ring blocks), by
    the interception the launcher installs (collective_record.counting_sends)."""
    if transport == "point-to-point" and not intercepting():
        raise RuntimeError("a point-to-point collective's bytes are counted at its sends, by the "
                           "interception a launcher installs (collective_record.intercept): "
                           "none is installed in this process")

    def timed_collective(*tensors):
        nbytes = max(tensor.numel() * tensor.element_size() for tensor in tensors)
        span = recorder.started(recorder.next_name(kind, message), nbytes)

        def record_end(done):
            recorder.finished(span)
            return done.value()  # raises the collective's error again, if it failed

        world = dist.get_world_size() if dist.is_initialized() else 1
        ring = bytes_sent(RING_SENT, kind, nbytes, world)
        if transport == "library":
            recorder.left_rank(transport, bytes_sent(SENT_BY_LIBRARY, kind, nbytes, world), ring)
            return collective(*tensors).then(record_end)
        with counting_sends() as sent:
            try:
                future = collective(*tensors)
            finally:
                recorder.left_rank(transport, sent.total, ring)
        return future.then(record_end)

    return timed_collective


def union_length(intervals, low, high):
    """The length of the union of `intervals` ((start, end) pairs) inside [low, high]."""
    # BEGIN PROMPT
    # Overlapping intervals count once: sweep them in order of start, clipped to [low, high].
    # END PROMPT
    # BEGIN SOLUTION Task 9: the length of a union of intervals
    total = 0.0
    reach = low  # the union so far ends here
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, high)
        if end > start:
            total += end - start
            reach = end
    return total
    # END SOLUTION


def step_record(marks, spans, compute_end=None):
    """One step's fields (see the module docstring) from its marks and its collectives' spans.

    `marks` are (phase, time) with a ("start", time) first; `spans` are (name, start, end).
    `compute_end`: when the step's last gradient was accumulated; None (no gradient stamped)
    takes the end of the last backward.
    """
    # BEGIN PROMPT
    # Return a dict with every field of FIELDS as the module docstring defines it.
    # HINTS outline
    # The phases summed from the marks; busy, hidden and exposed communication as union_length of
    # the spans, split where compute ended.
    # END PROMPT
    # BEGIN SOLUTION Task 9: one step's timing record
    record = dict.fromkeys(PHASES, 0.0)
    start, end = marks[0][1], marks[-1][1]
    backward_end = start
    for (_, before), (phase, after) in zip(marks, marks[1:]):
        record[phase] += after - before
        if phase == "backward":
            backward_end = after
    if compute_end is None:
        compute_end = backward_end
    intervals = [(begin, finish) for _, begin, finish in spans]
    exposed = union_length(intervals, compute_end, end)
    record["step"] = end - start
    record["comm_busy"] = union_length(intervals, start, end)
    record["comm_hidden"] = union_length(intervals, start, compute_end)
    record["comm_exposed"] = exposed
    record["compute"] = record["step"] - record["data"] - exposed
    record["own_work"] = record["step"] - exposed
    return record
    # END SOLUTION


class StepTimer:
    """Stamps each step's phases, collectives and gradients; turns them into step records per
    epoch."""

    def __init__(self, device=None, warmup_steps=0, trace_window=0):
        on_cuda = device is not None and device.type == "cuda"
        self.clock = CudaClock() if on_cuda else HostClock()
        self.warmup_steps = warmup_steps
        self.trace_window = trace_window  # steps after warm-up whose spans are kept for a timeline
        self.comm = CommRecorder(self.clock)
        self.layouts = LayoutLog()  # every step's, warm-up included: DDP rebuilds after the first
        self.steps_seen = 0
        self.measured = 0
        self.pending = []  # (step, marks, spans, gradients) of the epoch's measured steps, stamps
        self.trace = []  # (step, name, start, end) for the first trace_window measured steps
        self.sent_per_step = []  # (bytes that left the rank, a ring's) in each measured step
        self.transports = set()  # what carried them

    def start_step(self):
        """Stamp the start of a step."""
        self.marks = [("start", self.clock.stamp())]

    def mark(self, phase):
        """Stamp the end of `phase` (one of PHASES)."""
        self.marks.append((phase, self.clock.stamp()))

    def end_step(self):
        """Close the step: keep its marks, collectives and gradient stamps unless it is a warm-up
        step."""
        outgoing = self.comm.take_outgoing()
        spans, sizes, gradients = self.comm.take()
        self.layouts.add(self.steps_seen, sizes)
        self.steps_seen += 1
        if self.steps_seen > self.warmup_steps:
            self.pending.append((self.steps_seen - 1, self.marks, spans, gradients))
            self.sent_per_step.append((sum(sent for _, sent, _ in outgoing),
                                       sum(ring for _, _, ring in outgoing)))
            self.transports.update(transport for transport, _, _ in outgoing)

    def bytes_sent(self):
        """What left this rank per measured step, the median over the steps, beside what a ring
        would have sent for the same collectives (RING_SENT: the formula's 2P(n-1)/n for DDP,
        ZeRO-1 and ZeRO-2, 3P(n-1)/n for ZeRO-3): {"transport", "measured_per_step",
        "ring_formula_per_step"}; the transport None if nothing was sent."""
        steps = self.sent_per_step or [(0, 0)]
        return {"transport": "+".join(sorted(self.transports)) or None,
                "measured_per_step": statistics.median_low(sent for sent, _ in steps),
                "ring_formula_per_step": statistics.median_low(ring for _, ring in steps)}

    def take_epoch(self):
        """The step records of the epoch's measured steps, and an empty list for the next epoch."""
        records = []
        for step, marks, spans, gradients in self.pending:
            mark_stamps = [stamp for _, stamp in marks]
            span_stamps = [stamp for _, start, end in spans for stamp in (start, end)]
            gradient_stamps = [stamp for _, stamp in gradients]
            # in the same order
            seconds = iter(self.clock.seconds(mark_stamps + span_stamps + gradient_stamps))
            marks = [(phase, next(seconds)) for phase, _ in marks]
            spans = [(name, next(seconds), next(seconds)) for name, _, _ in spans]
            gradients = [(name, next(seconds)) for name, _ in gradients]
            compute_end = max((stamp for _, stamp in gradients), default=None)
            records.append(step_record(marks, spans, compute_end))
            self.measured += 1
            if self.measured <= self.trace_window:
                self.trace += [(step, phase, before, after)
                               for (_, before), (phase, after) in zip(marks, marks[1:])]
                self.trace += [(step, name, start, end) for name, start, end in spans]
                self.trace += [(step, "gradient " + name, stamp, stamp)
                               for name, stamp in gradients]
        self.pending = []
        return records


def summarize(values):
    """mean, median (of the two middle values on even counts) and p95 (the value at rank
    int(0.95 n) in ascending order) of a list of seconds; all zero for an empty list."""
    if not values:
        return {"mean": 0.0, "median": 0.0, "p95": 0.0}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return {"mean": sum(ordered) / len(ordered), "median": statistics.median(ordered), "p95": p95}


def summarize_ranks(steps_per_rank):
    """Per-field statistics per rank and across ranks, from each rank's list of step records.

    Across ranks, statistics pool every rank's steps; `slowest_rank_mean` is the largest per-rank
    mean. `straggler` compares the ranks' own work (step minus the time waiting for peers, which
    blocking collectives make equal to the slowest rank's step): the slowest rank's mean over the
    median rank's, the lower middle one on an even count (a rank's own figure, not an average of
    two). 1.0 means balanced.
    """
    per_rank = [{field: summarize([step[field] for step in steps]) for field in FIELDS}
                for steps in steps_per_rank]
    pooled = {field: summarize([step[field] for steps in steps_per_rank for step in steps])
              for field in FIELDS}
    for field in FIELDS:
        pooled[field]["slowest_rank_mean"] = max(rank[field]["mean"] for rank in per_rank)
    own_work = [rank["own_work"]["mean"] for rank in per_rank]
    median_rank = statistics.median_low(own_work)
    return {
        "per_rank": per_rank,
        "across_ranks": pooled,
        "straggler": max(own_work) / median_rank if median_rank > 0 else 1.0,
    }


def chrome_trace(traces_per_rank):
    """A Chrome-trace document (chrome://tracing, ui.perfetto.dev): one process per rank, with a
    compute track (the phases, and an instant as each gradient is accumulated) and a
    communication track (each collective, start to end).

    `traces_per_rank[r]` is (origin, spans): rank r's clock reading at a barrier all ranks
    passed together, and its (step, name, start, end) spans; times are shown from that barrier.
    """
    events = []
    for rank, (origin, spans) in enumerate(traces_per_rank):
        events.append({"ph": "M", "name": "process_name", "pid": rank,
                       "args": {"name": f"rank {rank}"}})
        for track, label in ((0, "compute"), (1, "communication")):
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": track,
                           "args": {"name": label}})
        for step, name, start, end in spans:
            track = 1 if name.startswith(COLLECTIVES) else 0
            event = {"ph": "X", "name": name, "pid": rank, "tid": track,
                     "ts": (start - origin) * 1e6, "dur": (end - start) * 1e6,
                     "args": {"step": step}}
            if name.startswith("gradient "):
                event.update(ph="i", s="t")
                del event["dur"]
            events.append(event)
    return {"traceEvents": events, "displayTimeUnit": "ms"}
