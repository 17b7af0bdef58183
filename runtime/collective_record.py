"""Every rank's collectives, kept where a hang can be read back, and where the ranks part ways.

Each rank writes every collective it starts (the library's and the hand-written ones'
point-to-point messages alike, called through torch.distributed) into the last RING entries of a
file mapped into memory, FOLDER/rank-R.record: its number, operation, elements, dtype, peer, and
when it started and finished. The file outlives a rank that is killed or stuck in C++, so the
records can be compared whenever a run fails: the first collective where the ranks disagree, or
wait, is the verdict, as in

    collective #7: rank 0 waits in recv (1,024 float32 from rank 1); rank 1 waits in
    reduce_scatter_tensor (3,072 float32)

A thread of each rank watches its own record: a collective in flight for longer than the hang
timeout ends the rank (exit code 4) with the verdict of the records it can see, instead of a wait
until the process group's timeout. Point-to-point messages are compared by operation only (a
ring's chunks differ in size from rank to rank); collectives by operation, elements and dtype.

    python -m runtime.collective_record FOLDER   # the verdict of the records in FOLDER
"""
import contextlib
import functools
import glob
import os
import stat
import sys
import tempfile
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

RING = 256  # entries kept per rank: the verdict needs the last few
HUNG_EXIT_CODE = 4
FOLDER_VARIABLE = "COLLECTIVE_RECORD_DIR"  # set by a local launch for its ranks
OPERATIONS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
              "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
              "reduce_scatter_single", "all_to_all", "all_to_all_single", "gather", "scatter",
              "barrier", "all_gather_object", "broadcast_object_list", "send", "recv", "isend",
              "irecv")
RECORDER = None  # this process's, once installed
POINT_TO_POINT = {"send", "recv", "isend", "irecv"}
DTYPES = (None, torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
          torch.int32, torch.int8, torch.uint8, torch.bool)
HEADER = np.dtype([("rank", "<i8"), ("count", "<i8")])
ENTRY = np.dtype([("number", "<i8"), ("operation", "<i2"), ("dtype", "<i2"), ("peer", "<i4"),
                  ("elements", "<i8"), ("started", "<f8"), ("finished", "<f8")])


class Recorder:
    """This rank's record: a ring of ENTRY in a file mapped into memory."""

    def __init__(self, folder, rank):
        self.path = os.path.join(folder, f"rank-{rank}.record")
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(descriptor, HEADER.itemsize + RING * ENTRY.itemsize)  # no bytes written
        os.close(descriptor)
        self.header = np.memmap(self.path, HEADER, "r+", shape=(1,))
        self.entries = np.memmap(self.path, ENTRY, "r+", offset=HEADER.itemsize, shape=(RING,))
        self.header[0] = (rank, 0)
        self.lock = threading.Lock()
        self.inside = threading.local()  # a recorded call's own collectives are not recorded
        self.enabled = True  # off: every call goes straight through (the step benchmark's)

    def start(self, operation, tensor, peer):
        """Record the start of a collective; returns its slot."""
        with self.lock:
            number = int(self.header[0]["count"])
            self.header[0]["count"] = number + 1
        dtype = DTYPES.index(tensor.dtype) if tensor is not None and tensor.dtype in DTYPES else 0
        elements = tensor.numel() if tensor is not None else 0
        slot = number % RING
        self.entries[slot] = (number, OPERATIONS.index(operation), dtype,
                              -1 if peer is None else peer, elements, time.time(), 0.0)
        return slot

    def finish(self, slot):
        self.entries[slot]["finished"] = time.time()

    def oldest_in_flight(self):
        """How long the collective in flight the longest has been, in seconds; None if none is."""
        started = self.entries["started"][(self.entries["finished"] == 0)
                                          & (self.entries["started"] > 0)]
        return time.time() - started.min() if started.size else None


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


def install(folder, rank, hang_timeout_s=None):
    """Record every collective this process starts from now on, in `folder`; with
    `hang_timeout_s`, end the rank when one is in flight for longer. Returns the Recorder."""
    global RECORDER
    recorder = RECORDER = Recorder(folder, rank)
    for operation in OPERATIONS:
        if hasattr(dist, operation):
            setattr(dist, operation, recorded(recorder, operation, getattr(dist, operation)))
    if hang_timeout_s:
        threading.Thread(target=watch, args=(recorder, folder, rank, hang_timeout_s),
                         daemon=True, name="collective-record-watch").start()
    return recorder


def recorded(recorder, operation, function):
    """`function` (torch.distributed's `operation`), recording each call made outside another."""
    if getattr(function, "recorded_by", None) is not None:
        function = function.__wrapped__  # installed before: record once

    @functools.wraps(function)
    def call(*args, **kwargs):
        if not recorder.enabled or getattr(recorder.inside, "depth", 0):
            return function(*args, **kwargs)
        slot = recorder.start(operation, first_tensor(args, kwargs), peer_of(operation, args,
                                                                              kwargs))
        recorder.inside.depth = 1
        try:
            result = function(*args, **kwargs)
        finally:
            recorder.inside.depth = 0
        if result is None or operation in ("isend", "send"):
            recorder.finish(slot)  # done, or a send that needs nobody to wait
        else:
            finish_when_done(recorder, slot, result)
        return result

    call.recorded_by = recorder
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


def watch(recorder, folder, rank, hang_timeout_s):
    """End this rank once a collective has been in flight for longer than `hang_timeout_s`."""
    while True:
        time.sleep(min(1.0, hang_timeout_s / 4))
        waited = recorder.oldest_in_flight()
        if waited is not None and waited > hang_timeout_s:
            print(f"error: rank {rank}: a collective has waited {waited:.0f} s (--hang-timeout "
                  f"{hang_timeout_s:g}): the ranks took different paths", file=sys.stderr)
            print(verdict_once(folder) or "", file=sys.stderr, end="", flush=True)
            os._exit(HUNG_EXIT_CODE)


def verdict_once(folder):
    """The verdict of the records in `folder` as a line, for the first process to ask; else ""."""
    try:
        os.close(os.open(os.path.join(folder, "verdict-given"), os.O_CREAT | os.O_EXCL))
    except OSError:
        return ""
    verdict = compare(read_records(folder))
    return f"{verdict}\n" if verdict else ""


def discard():
    """After a clean end: this rank's record, and its folder once empty, are not needed."""
    if RECORDER is not None:
        with contextlib.suppress(OSError):
            os.unlink(RECORDER.path)
            os.rmdir(os.path.dirname(RECORDER.path))


def read_records(folder):
    """{rank: [entries in order]} of the records in `folder`."""
    records = {}
    size = HEADER.itemsize + RING * ENTRY.itemsize
    for path in glob.glob(os.path.join(folder, "rank-*.record")):
        try:  # a regular file only, read without blocking: a test reads its children's records
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                    continue
                data = os.read(descriptor, size)
            finally:
                os.close(descriptor)
            header = np.frombuffer(data, HEADER, count=1)[0]
            entries = np.frombuffer(data, ENTRY, offset=HEADER.itemsize)
        except (OSError, IndexError, ValueError):
            continue
        count = int(header["count"])
        kept = sorted((entry for entry in entries if entry["started"] > 0
                       and count - RING <= entry["number"] < count
                       and 0 <= entry["operation"] < len(OPERATIONS)
                       and 0 <= entry["dtype"] < len(DTYPES)), key=lambda entry: entry["number"])
        records[int(header["rank"])] = kept
    return records


def compare(records):
    """Where the ranks' records first disagree, or wait, in a line; None when they agree and
    nothing waits."""
    if not records:
        return None
    ranks = sorted(records)
    by_number = {rank: {int(entry["number"]): entry for entry in records[rank]}
                 for rank in ranks}
    # from the first number every rank still keeps
    first = max(min(numbers, default=0) for numbers in by_number.values())
    for number in sorted({number for numbers in by_number.values() for number in numbers}):
        if number < first:
            continue
        entries = [by_number[rank].get(number) for rank in ranks]
        if all(entry is not None and entry["finished"] > 0 for entry in entries) and \
                len({signature(entry) for entry in entries}) == 1:
            continue
        states = "; ".join(state(rank, entry, by_number[rank])
                           for rank, entry in zip(ranks, entries))
        return f"collective #{number}: {states}"
    return None


def signature(entry):
    """What must match across ranks: the operation, and for a collective its size and dtype."""
    operation = OPERATIONS[entry["operation"]]
    if operation in POINT_TO_POINT:
        return operation.lstrip("i")  # isend and send are one message
    return operation, int(entry["elements"]), int(entry["dtype"])


def state(rank, entry, numbers):
    """'rank 0 waits in recv (1,024 float32 from rank 1)', or where a rank without it stands."""
    if entry is None:
        done = max(numbers, default=None)
        after = "" if done is None else f" after {OPERATIONS[numbers[done]['operation']]} #{done}"
        return f"rank {rank} started no collective{after}"
    verb = "waits in" if entry["finished"] == 0 else "did"
    return f"rank {rank} {verb} {OPERATIONS[entry['operation']]} ({describe(entry)})"


def describe(entry):
    """'1,024 float32 from rank 1'."""
    dtype = DTYPES[entry["dtype"]]
    text = f"{int(entry['elements']):,} {str(dtype).removeprefix('torch.')}" if dtype else "-"
    if entry["peer"] >= 0:
        way = "from" if OPERATIONS[entry["operation"]] in ("recv", "irecv") else "to"
        text += f" {way} rank {int(entry['peer'])}"
    return text


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: python -m runtime.collective_record FOLDER")
    print(compare(read_records(sys.argv[1])) or "the records agree and nothing waits")
