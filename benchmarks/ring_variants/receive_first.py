"""The ring of manual_collectives.py with one change: each exchange posts its receive before its
send, both without waiting (dist.irecv, dist.isend), then waits for both. An experiment for the
all-reduce benchmark, measured against the lesson's ring under the same conditions:

    python -m benchmarks.allreduce_bench --emulate-link 1gbit --world-sizes 2,4 \
        --candidate benchmarks/ring_variants/receive_first.py \
        --output results/emulated/ring-receive-first-1gbit.json

On links shaped by tc (design_doc §5.6) the lesson's ring gets about half of the link at 2 ranks,
where both neighbours are the same peer; this variant tests whether the order of the two calls is
the reason.
"""
import torch.distributed as dist

import manual_collectives


def _exchange_receive_first(send, right, receive, left):
    """Post the receive, then the send, without waiting; then wait for both."""
    requests = []
    if receive.numel():
        requests.append(dist.irecv(receive, left))
    if send.numel():
        requests.append(dist.isend(send, right))
    for request in requests:
        request.wait()


def ring_all_reduce(tensor):
    """manual_collectives.ring_all_reduce, its exchanges posting the receive first: the lesson's
    ring looks `_exchange` up when it runs, so it is swapped for the call and put back."""
    lesson_exchange = manual_collectives._exchange
    manual_collectives._exchange = _exchange_receive_first
    try:
        return manual_collectives.ring_all_reduce(tensor)
    finally:
        manual_collectives._exchange = lesson_exchange
