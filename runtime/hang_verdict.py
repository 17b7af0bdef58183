"""When the ranks hang: the watch that ends a rank whose collective waits too long, and the
verdict of the ranks' records (runtime/collective_record.py), where they first part ways:

    collective #7: rank 0 waits in recv (1,024 float32 from rank 1) at ring_all_gather
    (manual_sharding.py:73); rank 1 waits in all_reduce (3,072 float32) at finish (...)
    the ranks took different paths

Each rank is named at the line that started its collective. Where every rank waits to receive,
the second line says they wait for each other in a cycle (a ring that receives before it sends)
instead. Point-to-point messages are compared by operation only (a ring's chunks differ in size
from rank to rank); collectives by operation, elements and dtype.

    python -m runtime.hang_verdict FOLDER   # the verdict of the records in FOLDER
"""
import glob
import os
import stat
import sys
import threading
import time

import numpy as np

from runtime.collective_record import DTYPES, ENTRY, HEADER, OPERATIONS, POINT_TO_POINT, RING

HUNG_EXIT_CODE = 4
RECEIVES = {"recv", "irecv"}
CYCLE = "every rank waits to receive: the ranks wait for each other in a cycle"
DIFFERENT_PATHS = "the ranks took different paths"


def watch_from_now_on(recorder, hang_timeout_s):
    """With `hang_timeout_s` (not 0 or None), a thread that ends this rank once a collective in
    `recorder` has been in flight for longer (`watch`)."""
    if hang_timeout_s:
        threading.Thread(target=watch, args=(recorder, hang_timeout_s), daemon=True,
                         name="collective-record-watch").start()


def watch(recorder, hang_timeout_s):
    """End this rank once a collective has been in flight for longer than `hang_timeout_s`,
    naming the line that waits and the verdict of the records."""
    while True:
        time.sleep(min(1.0, hang_timeout_s / 4))
        oldest = recorder.oldest_in_flight()
        if oldest is not None and oldest[0] > hang_timeout_s:
            waited, where = oldest
            print(f"error: rank {recorder.rank}: a collective has waited {waited:.0f} s "
                  f"(--hang-timeout {hang_timeout_s:g}) at {where or 'an unknown line'}",
                  file=sys.stderr)
            print(verdict_once(recorder.folder) or "", file=sys.stderr, end="", flush=True)
            os._exit(HUNG_EXIT_CODE)


def verdict_once(folder):
    """The verdict of the records in `folder` as lines, for the first process to ask; else ""."""
    try:
        os.close(os.open(os.path.join(folder, "verdict-given"), os.O_CREAT | os.O_EXCL))
    except OSError:
        return ""
    verdict = compare(read_records(folder))
    return f"{verdict}\n" if verdict else ""


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
    """Where the ranks' records first disagree, or wait, in a line naming each rank's operation
    and line, and what that means on a second; None when they agree and nothing waits."""
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
        return f"collective #{number}: {states}\n{meaning(entries)}"
    return None


def meaning(entries):
    """What the ranks' entries at the first place they part ways say: a cycle where every rank
    waits to receive (each from a rank that waits too), else different paths."""
    if all(entry is not None and entry["finished"] == 0
           and OPERATIONS[entry["operation"]] in RECEIVES for entry in entries):
        return CYCLE
    return DIFFERENT_PATHS


def signature(entry):
    """What must match across ranks: the operation, and for a collective its size and dtype."""
    operation = OPERATIONS[entry["operation"]]
    if operation in POINT_TO_POINT:
        return operation.lstrip("i")  # isend and send are one message
    return operation, int(entry["elements"]), int(entry["dtype"])


def state(rank, entry, numbers):
    """'rank 0 waits in recv (1,024 float32 from rank 1) at ring_all_gather
    (manual_sharding.py:73)', or where a rank without it stands."""
    if entry is None:
        done = max(numbers, default=None)
        after = "" if done is None else f" after {OPERATIONS[numbers[done]['operation']]} #{done}"
        return f"rank {rank} started no collective{after}"
    verb = "waits in" if entry["finished"] == 0 else "did"
    where = entry["where"].decode(errors="replace")
    return (f"rank {rank} {verb} {OPERATIONS[entry['operation']]} ({describe(entry)})"
            + (f" at {where}" if where else ""))


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
        sys.exit("usage: python -m runtime.hang_verdict FOLDER")
    print(compare(read_records(sys.argv[1])) or "the records agree and nothing waits")
