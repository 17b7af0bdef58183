"""Every rank's collectives, kept where a hang can be read back (runtime/hang_verdict.py).

Each rank writes every collective it starts into the last RING entries of a file mapped into
memory, FOLDER/rank-R.record: its number, operation, elements, dtype, peer, when it started and
finished, and the line that started it (`where_called`). The file outlives a rank that is killed
or stuck in C++. Nothing is replaced when a module is imported; collectives come in three ways:
  - `recorded`, a layer the runtime composes around each collective it hands a strategy (the
    library's, shared memory's), as it composes timing and compression around them;
  - `kept`, around the runtime's own few (sums and gathers of small values, a barrier);
  - `intercept`, the one interception, which the launcher installs as it starts a rank
    (`install`) and says so (INTERCEPTION): torch.distributed's send, isend, recv and irecv
    wrapped, for the messages of hand-written collectives (the ring). torch 2.13 records them
    nowhere on gloo: its Flight Recorder keeps what ProcessGroupGloo::enqueue queues, with the
    Python stack, but send and recv are not queued ("p2p does not call enqueue"). The same
    interception counts the bytes sent (`counting_sends`, for the timing layer). The tests'
    launcher intercepts every operation, since a test calls the library itself.
"""
import contextlib
import functools
import os
import sys
import sysconfig
import tempfile
import threading
import time
import types

import numpy as np
import torch
import torch.distributed as dist

RING = 256  # entries kept per rank: the verdict needs the last few
FOLDER_VARIABLE = "COLLECTIVE_RECORD_DIR"  # set by a local launch for its ranks
OPERATIONS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
              "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
              "reduce_scatter_single", "all_to_all", "all_to_all_single", "gather", "scatter",
              "barrier", "all_gather_object", "broadcast_object_list", "send", "recv", "isend",
              "irecv")
RECORDER = None  # this process's, once installed
POINT_TO_POINT = ("send", "recv", "isend", "irecv")
INTERCEPTION = ("collective record: torch.distributed's send, isend, recv and irecv are wrapped "
                "in every rank, to record and count the point-to-point messages torch does not "
                "record on gloo (runtime/collective_record.py)")
DTYPES = (None, torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
          torch.int32, torch.int8, torch.uint8, torch.bool)
HEADER = np.dtype([("rank", "<i8"), ("count", "<i8")])
ENTRY = np.dtype([("number", "<i8"), ("operation", "<i2"), ("dtype", "<i2"), ("peer", "<i4"),
                  ("elements", "<i8"), ("started", "<f8"), ("finished", "<f8"),
                  ("where", "S160")])
RUNTIME_FOLDER = os.path.dirname(os.path.abspath(__file__))
PROJECT_FOLDER = os.path.dirname(RUNTIME_FOLDER)
# frames that only carry a collective, this module's among them: the line that matters called them
CARRIERS = (os.path.dirname(torch.__file__) + os.sep, sysconfig.get_paths()["stdlib"] + os.sep,
            os.path.abspath(__file__))


class Recorder:
    """This rank's record: a ring of ENTRY in a file mapped into memory."""

    def __init__(self, folder, rank):
        self.folder, self.rank = folder, rank
        self.path = os.path.join(folder, f"rank-{rank}.record")
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(descriptor, HEADER.itemsize + RING * ENTRY.itemsize)  # no bytes written
        os.close(descriptor)
        self.header = np.memmap(self.path, HEADER, "r+", shape=(1,))
        self.entries = np.memmap(self.path, ENTRY, "r+", offset=HEADER.itemsize, shape=(RING,))
        self.header[0] = (rank, 0)
        self.lock = threading.Lock()
        self.calls = threading.local()  # .depth: recorded calls in progress in this thread
        self.enabled = True  # off: every call goes straight through (the step benchmark's)

    def busy(self):
        """Whether this thread is inside a recorded call, whose own collectives are not kept."""
        return getattr(self.calls, "depth", 0) > 0

    @contextlib.contextmanager
    def inside(self):
        """A recorded call in progress in this thread."""
        self.calls.depth = getattr(self.calls, "depth", 0) + 1
        try:
            yield
        finally:
            self.calls.depth -= 1

    def start(self, operation, tensor, peer=None):
        """Record the start of a collective, at the line that called it; returns its slot."""
        with self.lock:
            number = int(self.header[0]["count"])
            self.header[0]["count"] = number + 1
        dtype = DTYPES.index(tensor.dtype) if tensor is not None and tensor.dtype in DTYPES else 0
        elements = tensor.numel() if tensor is not None else 0
        slot = number % RING
        self.entries[slot] = (number, OPERATIONS.index(operation), dtype,
                              -1 if peer is None else peer, elements, time.time(), 0.0,
                              where_called().encode(errors="replace")[:ENTRY["where"].itemsize])
        return slot

    def finish(self, slot):
        self.entries[slot]["finished"] = time.time()

    def oldest_in_flight(self):
        """(seconds, where) of the collective in flight the longest; None if none is."""
        waiting = (self.entries["finished"] == 0) & (self.entries["started"] > 0)
        if not waiting.any():
            return None
        oldest = self.entries[waiting][self.entries["started"][waiting].argmin()]
        return time.time() - oldest["started"], oldest["where"].decode(errors="replace")


def where_called():
    """'ring_all_gather (manual_sharding.py:73)': the innermost frame of this thread outside torch,
    the standard library and this runtime, short of the entry script (for the runtime's own
    collectives, the runtime's own line is the better one); "" if there is none."""
    frame, innermost = sys._getframe(1), None
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(CARRIERS):
            innermost = innermost or frame
            if not path.startswith(RUNTIME_FOLDER + os.sep):
                entry = frame.f_globals.get("__name__") in ("__main__", "__mp_main__")
                return described(innermost if entry else frame)
        frame = frame.f_back
    return described(innermost) if innermost else ""


def described(frame):
    """'function (path:line)', the path relative to the project where it is inside it."""
    path = os.path.abspath(frame.f_code.co_filename)
    if path.startswith(PROJECT_FOLDER + os.sep):
        path = os.path.relpath(path, PROJECT_FOLDER)
    return f"{frame.f_code.co_name} ({path}:{frame.f_lineno})"


def run_folder():
    """The folder this job's ranks on this host keep their records in: the local launch's, else
    one per torchrun or srun job step."""
    if os.environ.get(FOLDER_VARIABLE):
        return os.environ[FOLDER_VARIABLE]
    job = os.environ.get("TORCHELASTIC_RUN_ID") or "-".join(
        os.environ[name] for name in ("SLURM_JOB_ID", "SLURM_STEP_ID") if name in os.environ)
    folder = os.path.join(tempfile.gettempdir(), f"collective-record-{job or os.getppid()}")
    os.makedirs(folder, exist_ok=True)
    return folder


def install(folder, rank, operations=POINT_TO_POINT):
    """Record this rank's collectives in `folder` from now on: those the layers `recorded` make
    carry, the runtime's own (`kept`), and `operations` of torch.distributed, intercepted
    (`intercept`). For a launcher to call as it starts a rank. Returns the Recorder."""
    global RECORDER
    recorder = RECORDER = Recorder(folder, rank)
    intercept(recorder, operations)
    return recorder


@contextlib.contextmanager
def kept(operation, tensor=None):
    """The runtime's own collective in the block (a sum, a gather, a barrier around training),
    kept in this process's record where one is installed."""
    recorder = RECORDER
    if recorder is None or not recorder.enabled or recorder.busy():
        yield
        return
    slot = recorder.start(operation, tensor)
    with recorder.inside():
        yield
    recorder.finish(slot)  # not on an error: the collective never completed


def recorded(collective, recorder, operation):
    """A layer around a collective called with tensors and returning a future (the ones the
    runtime hands a strategy): each call recorded in `recorder` as `operation`, with its
    largest tensor, from the call to the future's completion."""
    def recorded_collective(*tensors):
        if not recorder.enabled or recorder.busy():
            return collective(*tensors)
        slot = recorder.start(operation, max(tensors, key=torch.Tensor.numel))

        def finish(done):
            recorder.finish(slot)
            return done.value()  # raises the collective's error again, if it failed

        with recorder.inside():
            return collective(*tensors).then(finish)

    return recorded_collective


SENDING = threading.local()  # .count: what counting_sends yielded, in this thread


@contextlib.contextmanager
def counting_sends():
    """Count the bytes this thread sends point-to-point inside the block, in `.total` of what it
    yields (counted by the interception: 0 where none is installed)."""
    SENDING.count = count = types.SimpleNamespace(total=0)
    try:
        yield count
    finally:
        SENDING.count = None


def intercept(recorder=None, operations=POINT_TO_POINT):
    """Wrap torch.distributed's `operations` so that the bytes of each send are counted
    (`counting_sends`) and, given a `recorder`, each call is recorded there: once, replacing an
    earlier interception. The runtime's launcher intercepts the point-to-point messages only, which
    no layer sees (say so: INTERCEPTION); the tests' launcher every operation, since a test calls
    the library directly."""
    for operation in operations:
        if hasattr(dist, operation):
            function = getattr(dist, operation)
            function = getattr(function, "intercepted", function)  # torch's own, not ours again
            setattr(dist, operation, intercepted(recorder, operation, function))


def intercepting():
    """Whether this process's point-to-point messages are intercepted (counted, maybe recorded)."""
    return all(hasattr(getattr(dist, operation), "intercepted") for operation in POINT_TO_POINT)


def intercepted(recorder, operation, function):
    """torch.distributed's `function` (`operation`), each send counted and each call made outside
    another recorded."""
    @functools.wraps(function)
    def call(*args, **kwargs):
        count = getattr(SENDING, "count", None)
        if count is not None and operation in ("send", "isend"):
            sent = first_tensor(args, kwargs)
            count.total += sent.numel() * sent.element_size()
        if recorder is None or not recorder.enabled or recorder.busy():
            return function(*args, **kwargs)
        slot = recorder.start(operation, first_tensor(args, kwargs),
                              peer_of(operation, args, kwargs))
        with recorder.inside():
            result = function(*args, **kwargs)
        if result is None or operation in ("isend", "send"):
            recorder.finish(slot)  # done, or a send that needs nobody to wait
        else:
            finish_when_done(recorder, slot, result)
        return result

    call.intercepted = function
    return call


def finish_when_done(recorder, slot, work):
    """An asynchronous collective is finished when its future completes."""
    try:
        work.get_future().add_done_callback(lambda _: recorder.finish(slot))
    except (AttributeError, RuntimeError):  # no future for this work: taken as done
        recorder.finish(slot)


def first_tensor(args, kwargs):
    """The first tensor among a call's arguments (the one sent, for most)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return value[0]
    return None


def peer_of(operation, args, kwargs):
    """The other rank of a point-to-point message (None for a collective, or any source)."""
    if operation not in POINT_TO_POINT:
        return None
    peer = kwargs.get("dst", kwargs.get("src", args[1] if len(args) > 1 else None))
    return peer if isinstance(peer, int) else None


def discard():
    """After a clean end: this rank's record, and its folder once empty, are not needed."""
    if RECORDER is not None:
        with contextlib.suppress(OSError):
            os.unlink(RECORDER.path)
            os.rmdir(os.path.dirname(RECORDER.path))
