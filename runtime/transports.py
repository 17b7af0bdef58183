"""--transport: what carries the bytes of every collective a mode makes, in one table.

  library  gloo's or NCCL's own collectives
  ring     point-to-point messages around a ring: manual_collectives.ring_all_reduce, and
           manual_sharding's ring reduce-scatter and all-gather
  shm      manual_collectives.SharedMemoryAllReduce: the ranks of one host through one shared
           segment, no bytes through a socket (CPU tensors; between hosts, the library's)
  auto     `resolve`: the library's for --mode manual and ddp; for --mode sharded shared memory
           where every rank shares this host on gloo (it copies each byte once, where gloo's
           reduce-scatter is a whole all-reduce), else the library's
Each entry makes a `Collectives`: an all-reduce as manual_allreduce's strategies call it (a tensor
summed in place, a future returned) and a reduce-scatter and an all-gather as manual_sharding's
classes call them ((output, input), a future returned). The hand-written ones block, so their
futures are complete when they return.
"""
from typing import Callable, NamedTuple

import torch.distributed as dist

from manual_allreduce import completed
from manual_collectives import SLOT_BYTES, SharedMemoryAllReduce, hosts_of_ranks, ring_all_reduce
from manual_sharding import all_gather_by_ring, reduce_scatter_by_ring

NAMES = ("auto", "library", "ring", "shm")  # --transport


class Collectives(NamedTuple):
    """One transport's collectives."""
    all_reduce: Callable
    reduce_scatter: Callable
    all_gather: Callable
    shared: SharedMemoryAllReduce | None = None  # shm's segment, for a buffer kept in its slot


# --- The library's, started without waiting ------------------------------------------------------
def library_all_reduce(tensor):
    """The library's all-reduce: manual_allreduce.all_reduce, written again so that the reference
    mode (ddp) runs none of the lesson's code it is compared with."""
    return dist.all_reduce(tensor, async_op=True).get_future()


def library_reduce_scatter(output, tensor):
    """The library's reduce-scatter (gloo or NCCL)."""
    return future_of(dist.reduce_scatter_single(output, tensor, async_op=True), output)


def library_all_gather(output, shard):
    """The library's all-gather."""
    return dist.all_gather_single(output, shard, async_op=True).get_future()


def future_of(work, result):
    """A future of `result`, complete when the library's `work` is. gloo's reduce-scatter offers
    none of its own: then one that waits for `work` when waited on, in the caller's thread. A thread
    waiting for it instead could outlive the process group and abort the process at its exit."""
    try:
        return work.get_future()
    except RuntimeError:
        return WaitedFuture(lambda: (work.wait(), result)[1])


class WaitedFuture:
    """The part of torch.futures.Future that the lesson and the timing layer use (wait, value,
    then, done), computed by `compute()` when first waited on. A timed span around it ends there:
    at most the collective's time plus the compute it overlapped."""

    def __init__(self, compute):
        self.compute = compute
        self.result = None
        self.finished = False

    def wait(self):
        if not self.finished:
            self.result = self.compute()
            self.finished = True
        return self.result

    value = wait

    def done(self):
        return self.finished

    def then(self, callback):
        # waited first: the timing layer's callback stamps the end of a collective that is over
        return WaitedFuture(lambda: (self.wait(), callback(self))[1])


# --- The table ------------------------------------------------------------------------------------
def library(buffer_bytes=0):
    return Collectives(library_all_reduce, library_reduce_scatter, library_all_gather)


def ring(buffer_bytes=0):
    return Collectives(lambda tensor: completed(ring_all_reduce(tensor)),
                       reduce_scatter_by_ring, all_gather_by_ring)


def shared_memory(buffer_bytes=0):
    """A collective: every rank calls it. Its slots hold at least `buffer_bytes` (rounded up to
    64-byte lines), so that a flat buffer can be kept in one (see Collectives.shared)."""
    shared = SharedMemoryAllReduce(slot_bytes=max(SLOT_BYTES, -(-buffer_bytes // 64) * 64))
    return Collectives(lambda tensor: completed(shared.all_reduce(tensor)),
                       lambda output, tensor: completed(shared.reduce_scatter(output, tensor)),
                       lambda output, shard: completed(shared.all_gather(output, shard)),
                       shared)


class Transport(NamedTuple):
    """A --transport: what timing.py calls the carrier of its bytes, and its collectives."""
    carrier: str  # "library", "point-to-point" (counted at each send) or "shared-memory"
    make: Callable  # (buffer_bytes) -> Collectives


TRANSPORTS = {"library": Transport("library", library), "ring": Transport("point-to-point", ring),
              "shm": Transport("shared-memory", shared_memory)}


def resolve(name, mode):
    """The transport --transport `name` means for `mode` (see the module's docstring); for auto
    in --mode sharded a collective: every rank calls it."""
    if name != "auto":
        return name
    if mode == "sharded" and dist.get_backend() == "gloo" and len(set(hosts_of_ranks())) == 1:
        return "shm"
    return "library"


def collectives(name, mode, buffer_bytes=0):
    """The Collectives of --transport `name` in `mode` (a collective, as resolve and shm are)."""
    return TRANSPORTS[resolve(name, mode)].make(buffer_bytes)
