"""How bytes move between processes: the collectives behind manual_allreduce.py, written by hand.

manual_allreduce.py decides what to reduce and when; this file is how a sum over the ranks is
made, continuing its lesson order:
  6. ring           `ring_all_reduce`: point-to-point messages around a ring; bandwidth-optimal
  7. shared memory  `SharedMemoryAllReduce`: the ranks of one host sum through one shared
                    segment, no bytes through a socket; between hosts, through the library
It imports only torch and the standard library.
"""
import os
import platform
import secrets
import socket
import tempfile
import time

import torch
import torch.distributed as dist


# --- 6. Replacing the collective itself: an all-reduce from point-to-point messages -----------
def ring_all_reduce(tensor):
    """Sum `tensor` over all ranks in place, with sends and receives around a ring.

    The buffer is cut into n chunks (n = world size; lengths differ by at most one, may be zero).
    Reduce-scatter: in n-1 steps every rank sends one chunk to its right neighbour and adds the
    chunk arriving from its left, after which rank r holds the complete sum of chunk (r+1) mod n.
    All-gather: n-1 more steps pass the finished chunks around the ring. Each rank sends 2(n-1)/n
    of the buffer, whatever n is: the bandwidth-optimal all-reduce (Patarasuk & Yuan 2009).
    """
    # BEGIN PROMPT
    # When it returns, `tensor` holds the sum over the ranks, in place, for any length (zero, or
    # fewer elements than ranks, included) and any world size; it returns `tensor`. Only
    # point-to-point messages (dist.isend, dist.recv, through _exchange), no collective.
    # HINTS outline
    # The docstring's two phases, each n-1 exchanges with the neighbours; receive into
    # receive_buffer's scratch tensor, not a new one per call.
    # HINTS steps
    # Chunk i is flat[len * i // n : len * (i + 1) // n]. Reduce-scatter step s (0 to n-2): send
    # chunk (r - s) mod n to the right, receive into the scratch from the left and add it into
    # chunk (r - s - 1) mod n. All-gather step s: send chunk (r + 1 - s) mod n, receive into
    # chunk (r - s) mod n.
    # END PROMPT
    # BEGIN SOLUTION Task 6: the ring all-reduce
    world, rank = dist.get_world_size(), dist.get_rank()
    if world == 1 or tensor.numel() == 0:
        return tensor
    flat = tensor.view(-1)
    bounds = [flat.numel() * i // world for i in range(world + 1)]
    chunks = [flat[bounds[i]:bounds[i + 1]] for i in range(world)]
    right, left = (rank + 1) % world, (rank - 1) % world
    incoming = receive_buffer(chunks[-1])  # the last chunk is the longest
    for step in range(world - 1):  # reduce-scatter
        send, receive = chunks[(rank - step) % world], chunks[(rank - step - 1) % world]
        _exchange(send, right, incoming[:receive.numel()], left)
        receive.add_(incoming[:receive.numel()])
    for step in range(world - 1):  # all-gather
        send, receive = chunks[(rank + 1 - step) % world], chunks[(rank - step) % world]
        _exchange(send, right, receive, left)
    return tensor
    # END SOLUTION


_receive_buffers = {}


def receive_buffer(like):
    """A scratch tensor the size of `like`, kept between calls: a buffer allocated afresh for
    each all-reduce pays its page faults again on every call."""
    key = (like.dtype, like.device)
    if key not in _receive_buffers or _receive_buffers[key].numel() < like.numel():
        _receive_buffers[key] = torch.empty(like.numel(), dtype=like.dtype, device=like.device)
    return _receive_buffers[key][:like.numel()]


def _exchange(send, right, receive, left):
    """Send to the right while receiving from the left; posting the send first keeps the ring
    from deadlocking. Both ends know when a chunk is empty, and skip it."""
    # BEGIN PROMPT
    # When it returns, `send` has been delivered to rank `right` and `receive` holds what rank
    # `left` sent; an empty chunk is neither sent nor received.
    # HINTS outline
    # Post the send without waiting, receive, then wait for the send.
    # END PROMPT
    # BEGIN SOLUTION Task 6: one exchange of the ring
    request = dist.isend(send, right) if send.numel() else None
    if receive.numel():
        dist.recv(receive, left)
    if request is not None:
        request.wait()
    # END SOLUTION


# --- 7. Within one host: an all-reduce through shared memory ----------------------------------
# gloo moves bytes between ranks of one machine over loopback TCP, at about 0.4 GB/s on a 2-core
# machine (`python -m benchmarks.allreduce_bench`). Ranks that share memory can sum at memory speed.
SHM_PREFIX = "mnist-ddp-shm-"  # every segment's name starts so (a test checks none is left over)
SLOT_BYTES = 8 * 2**20  # per rank; a larger tensor goes through in pieces of this size
HEADER_ROW = 8  # int64 per rank: arrivals, pid, pid namespace; 64 bytes, a cache line of its own
SPIN_S = 1e-3  # a wait this short only yields the core between polls; a longer one sleeps
LONGEST_NAP_S = 250e-6  # a waiting rank sleeps at most this long between polls
LIVENESS_EVERY_S = 0.05  # how often a waiting rank checks that the ranks it waits for still live
ORDERED_MACHINES = ("x86_64", "amd64", "i386", "i686")


def namespace_inode(kind):
    """The inode of this process's `kind` namespace ('net', 'pid'); 0 where /proc has none."""
    try:
        return os.stat(f"/proc/self/ns/{kind}").st_ino
    except OSError:
        return 0


def this_host():
    """What the ranks that can share memory have alike: the host's name and network namespace."""
    return f"{socket.gethostname()}/net:{namespace_inode('net')}"


def hosts_of_ranks(host=None):
    """Every rank's host (`host`, else this_host()), in rank order: a collective."""
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, host or this_host())
    return hosts


def is_alive(pid):
    """Whether process `pid` runs; one that exited but is not yet reaped (a zombie) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    try:
        with open(f"/proc/{pid}/stat") as status:
            state = status.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def group_timeout_s():
    """The default process group's timeout in seconds (`--timeout`): how long a rank waits."""
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        return backend.options._timeout.total_seconds()
    except (AttributeError, RuntimeError):  # private API: fall back to torch's default
        return dist.distributed_c10d.default_pg_timeout.total_seconds()


class SharedMemoryAllReduce:
    """All-reduce for CPU tensors through one shared-memory segment per host. Built by every rank
    at once (a collective); then `all_reduce(tensor)` sums in place, as dist.all_reduce does.

    Segment: a header row per local rank (its arrival counter, pid and pid namespace), a slot per
    local rank, and one result region. A call, per piece of at most `slot_bytes`:
        copy the piece into my slot; arrive; wait for all    (every slot written)
        sum chunk r of every slot into the result's chunk r  (reduce-scatter, one pass)
        arrive; wait for all                                 (every chunk summed)
        copy the whole result back into the piece            (all-gather)
    16-bit sums are accumulated in float32 and rounded once (gloo rounds after each addition):
    as exact as gloo's, or more.

    Why it is correct. Two barriers are enough, with no extra collective per call: a rank
    rewrites its slot or the result only after the next call's first barrier, which every rank
    reaches only once it has finished reading the last call's. A rank stores its arrival counter
    only after the torch ops that wrote its data have returned (every intra-op thread joined), and
    a peer loads the counter before it reads that data. x86-64 is TSO: stores become visible to
    other cores in program order and loads are not reordered with older loads, so a peer that sees
    the counter sees the data; an aligned 8-byte store is atomic. Weaker machines (ARM, POWER)
    need a fence between the two, which torch does not offer: the constructor refuses them.

    The same segment gives the two halves ZeRO needs, for the ranks of one host: `reduce_scatter`
    (each rank sums chunk r of every slot) and `all_gather` (each rank copies every slot).

    Several hosts: ranks share memory when they share the host's name and network namespace (two
    SLURM nodes emulated on one machine share the name only). Each host sums in shared memory,
    its lowest rank (the leader) all-reduces the host's sum with the other leaders through the
    library, then hands it to its host's ranks through the segment.
    """

    def __init__(self, slot_bytes=SLOT_BYTES, timeout_s=None, host=None):
        if platform.machine().lower() not in ORDERED_MACHINES:
            raise RuntimeError(f"the shared-memory all-reduce relies on x86's store ordering; on "
                               f"{platform.machine()} use another strategy (--sync flat or ring)")
        self.timeout_s = timeout_s or group_timeout_s()
        self.slot_bytes = slot_bytes - slot_bytes % 64
        world, rank = dist.get_world_size(), dist.get_rank()
        hosts = hosts_of_ranks(host)
        self.local_ranks = [other for other in range(world) if hosts[other] == hosts[rank]]
        self.local_rank = self.local_ranks.index(rank)
        self.local_world = len(self.local_ranks)
        distinct = list(dict.fromkeys(hosts))  # in the order of each host's first rank
        leaders = [hosts.index(each) for each in distinct]
        # every rank takes part in making a group, also one it is not in
        self.leaders = dist.new_group(leaders) if len(leaders) > 1 else None
        self.pid_namespace = namespace_inode("pid")  # a peer's pid means something only in ours
        header_bytes = -(-self.local_world * HEADER_ROW * 8 // 4096) * 4096  # page-aligned data
        size = header_bytes + (self.local_world + 1) * self.slot_bytes
        segment = self.map_segment(size, f"h{distinct.index(hosts[rank])}")
        self.data = segment[header_bytes:]
        self.arrivals = 0  # how many times this rank arrived; its counter in the header

    def map_segment(self, size, host_tag):
        """The segment mapped by every rank of this host, under a name no other run uses (a random
        token from rank 0), with `self.header` (a row of HEADER_ROW int64 per local rank) on it
        and this rank's row written. The file is unlinked as soon as every rank has mapped it,
        also after an error, so nothing is left in /dev/shm however the run ends."""
        token = [secrets.token_hex(8) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(token, 0)
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        path = os.path.join(folder, f"{SHM_PREFIX}{token[0]}-{host_tag}")
        self.path = path  # for the record: the name is unlinked before this returns
        created = False
        try:
            if self.local_rank == 0:
                descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                created = True
                try:
                    os.ftruncate(descriptor, size)
                finally:
                    os.close(descriptor)
            dist.barrier()  # the file exists before anyone maps it
            segment = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
            header = segment[:self.local_world * HEADER_ROW * 8].view(torch.int64)
            self.header = header.view(self.local_world, HEADER_ROW)
            self.header[self.local_rank, 1] = os.getpid()
            self.header[self.local_rank, 2] = self.pid_namespace
            dist.barrier()  # every rank has mapped it (and written its row): the name can go
        finally:
            if created:
                os.unlink(path)
        return segment

    def all_reduce(self, tensor):
        """Sum the contiguous CPU `tensor` over every rank, in place; returns it."""
        flat = tensor.view(-1)
        pieces = flat.split(self.slot_bytes // flat.element_size())
        if self.local_world > 1:
            for piece in pieces:
                self.sum_on_host(piece)
        if self.leaders is not None:
            if self.local_rank == 0:
                dist.all_reduce(tensor, group=self.leaders)
            if self.local_world > 1:
                for piece in pieces:
                    self.broadcast_on_host(piece)
        return tensor

    def reduce_scatter(self, output, tensor):
        """Chunk r of the sum over this host's ranks of `tensor` (n equal chunks) into rank r's
        `output`, as dist.reduce_scatter_single does: each rank writes its tensor to its slot,
        sums chunk r of every slot, and reads nothing else. One host only."""
        chunks = self.halves_on_one_host(tensor).view(self.local_world, -1)
        step = max(1, self.slot_bytes // (tensor.element_size() * self.local_world))
        for begin in range(0, chunks.shape[1], step):  # a column of every chunk per piece
            columns = chunks[:, begin:begin + step]
            width = columns.shape[1]
            self.region(self.local_rank, tensor.dtype, columns.numel()).view_as(
                columns).copy_(columns)
            self.arrive_and_wait()  # every slot written
            slots = self.data[:self.local_world * self.slot_bytes].view(tensor.dtype)
            mine = slots.view(self.local_world, -1)[:, :columns.numel()].view(
                self.local_world, self.local_world, width)[:, self.local_rank]  # chunk r of each
            accumulate = torch.float32 if tensor.element_size() < 4 else tensor.dtype
            output[begin:begin + width].copy_(mine.sum(dim=0, dtype=accumulate))
            self.arrive_and_wait()  # every rank has read: the next piece may overwrite
        return output

    def all_gather(self, output, shard):
        """Every rank's `shard` into chunk r of `output` on every rank of this host, as
        dist.all_gather_single does: each rank writes its shard to its slot and copies all of
        them. `shard` may be `output`'s own chunk r. One host only."""
        chunks = self.halves_on_one_host(output).view(self.local_world, -1)
        step = max(1, self.slot_bytes // shard.element_size())
        for begin in range(0, shard.numel(), step):
            piece = shard.view(-1)[begin:begin + step]
            self.region(self.local_rank, shard.dtype, piece.numel()).copy_(piece)
            self.arrive_and_wait()  # every slot written
            for index in range(self.local_world):
                chunks[index, begin:begin + piece.numel()].copy_(
                    self.region(index, shard.dtype, piece.numel()))
            self.arrive_and_wait()  # every rank has read
        return output

    def halves_on_one_host(self, tensor):
        """`tensor`, flat, where the halves can take it: every rank on this host."""
        if self.leaders is not None:
            raise RuntimeError("the shared-memory reduce-scatter and all-gather join the ranks of "
                               "one host; across hosts use the ring's or the library's")
        return tensor.view(-1)

    def own_slot(self, dtype, length):
        """This rank's slot as a tensor of `length` `dtype`s, for a caller that keeps its buffer
        there: writing the buffer then is writing the slot, and a call skips the first copy."""
        if length * dtype.itemsize > self.slot_bytes:
            raise ValueError(f"{length} {dtype} elements do not fit a slot of {self.slot_bytes} "
                             "bytes")
        return self.region(self.local_rank, dtype, length)

    def region(self, index, dtype, length):
        """Slot `index` (the result region: index = local world size) as `length` `dtype`s."""
        start = index * self.slot_bytes
        return self.data[start:start + length * dtype.itemsize].view(dtype)

    def sum_on_host(self, piece):
        """Sum `piece` over the ranks of this host, in place: reduce-scatter, then all-gather."""
        length = piece.numel()
        world = self.local_world
        slot = self.region(self.local_rank, piece.dtype, length)
        if slot.data_ptr() != piece.data_ptr():  # a buffer kept in the slot needs no copy
            slot.copy_(piece)
        self.arrive_and_wait()  # every slot written
        slots = self.data[:world * self.slot_bytes].view(piece.dtype).view(world, -1)
        result = self.region(world, piece.dtype, length)
        begin = length * self.local_rank // world
        end = length * (self.local_rank + 1) // world
        if end > begin and world == 2:  # one add: no reduction over a dimension of two rows
            torch.add(slots[0, begin:end], slots[1, begin:end], out=result[begin:end])
        elif end > begin:  # one pass over every slot's chunk, straight into the result
            torch.sum(slots[:, begin:end], dim=0, out=result[begin:end])
        self.arrive_and_wait()  # every chunk summed
        piece.copy_(result)

    def broadcast_on_host(self, piece):
        """The leader's `piece` to every rank of this host, through the result region."""
        result = self.region(self.local_world, piece.dtype, piece.numel())
        if self.local_rank == 0:
            result.copy_(piece)
        self.arrive_and_wait()  # the leader has written it
        if self.local_rank != 0:
            piece.copy_(result)
        self.arrive_and_wait()  # every rank has read it: the next piece may overwrite it

    def arrive_and_wait(self):
        """A barrier of this host's ranks: count my arrival, wait until every rank has arrived as
        often. Counters only grow, so no reset and no race between consecutive barriers."""
        self.arrivals += 1
        self.header[self.local_rank, 0] = self.arrivals  # after my data (see the class docstring)
        counters = self.header[:, 0]
        if counters.min().item() >= self.arrivals:
            return
        now = time.monotonic()
        deadline = now + self.timeout_s
        stop_spinning = now + SPIN_S
        next_check = now + LIVENESS_EVERY_S
        nap = 20e-6
        while counters.min().item() < self.arrivals:
            now = time.monotonic()
            if now < stop_spinning:  # a peer is about to arrive: give the core away, stay awake
                os.sched_yield()
                continue
            time.sleep(nap)  # a long wait: more ranks than cores must not spin the workers off
            nap = min(2 * nap, LONGEST_NAP_S)
            if now >= next_check:
                self.check_peers(now > deadline)
                next_check = now + LIVENESS_EVERY_S

    def check_peers(self, too_late):
        """Raise, with one line, if a rank this one waits for has exited or the deadline passed."""
        late = [index for index, arrived in enumerate(self.header[:, 0].tolist())
                if arrived < self.arrivals]
        for index in late:
            pid, namespace = self.header[index, 1:3].tolist()
            if namespace == self.pid_namespace and not is_alive(pid):
                raise RuntimeError(f"shared-memory all-reduce: rank {self.local_ranks[index]} "
                                   f"(pid {pid}) exited while rank "
                                   f"{self.local_ranks[self.local_rank]} waited for it")
        if too_late:
            ranks = [self.local_ranks[index] for index in late]
            raise RuntimeError(f"shared-memory all-reduce: rank(s) {ranks} did not arrive within "
                               f"{self.timeout_s:g} s (--timeout)")
