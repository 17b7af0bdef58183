"""The shared-memory all-reduce (manual_collectives.py, section 7): it sums as dist.all_reduce does
for awkward lengths, dtypes and world sizes, on one host or several; DDP through its comm hook
trains as DDP over its own all-reduce, and so does DDP over the hand-written ring (--transport
ring); a rank that dies or stalls ends the others within the timeout; and no segment is left in
/dev/shm. One launch of processes per world size runs every case of that size.

The code under test is imported inside the functions that run in the child processes, never at the
top: this module is also imported by the process that decides the tests (grading/judge.py).
"""
import os
import signal
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import multiprocessing, nn

from grading import sandbox
from grading.launch import START_METHOD, launch_once, run_in_processes
from runtime.launch import free_port
from tests.differences import assert_none, difference_message

SLOT_BYTES = 64 * 2**10  # small slots, so that the large prime goes through in several pieces
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def lengths_for(world_size):
    return sorted({0, 1, max(world_size - 1, 0), world_size + 1, 100_003})


def layouts(world_size):
    """Host names for each rank: one host, and from 3 ranks also two hosts (the hierarchical
    path): the ranks of each host consecutive at 3 and 5, interleaved at 4."""
    chosen = {"one host": None}
    if world_size == 4:
        chosen["two hosts, interleaved"] = [f"host{rank % 2}" for rank in range(world_size)]
    elif world_size >= 3:
        chosen["two hosts"] = [f"host{rank * 2 // world_size}" for rank in range(world_size)]
    return chosen


def compare_with_library(rank, world_size):
    """{layout: [(dtype, length, data, what differs)]} for every case, and the segments' paths."""
    from manual_collectives import SharedMemoryAllReduce

    mismatches = {}
    paths = []
    for layout, hosts in layouts(world_size).items():
        shared = SharedMemoryAllReduce(SLOT_BYTES, host=None if hosts is None else hosts[rank])
        paths.append(shared.path)
        found = mismatches.setdefault(layout, [])
        for dtype in DTYPES:
            for length in lengths_for(world_size):
                generator = torch.Generator().manual_seed(rank * 1000 + length)
                # Small integers: every partial sum is exact in every dtype, so any order of
                # addition gives the same bits as the library.
                integers = torch.randint(-8, 9, (length,), generator=generator).to(dtype)
                library = integers.clone()
                dist.all_reduce(library)
                mine = shared.all_reduce(integers.clone())
                if not torch.equal(mine, library):
                    found.append((str(dtype), length, "integers", "differs from dist.all_reduce"))
                # Random values: 16-bit sums are made in float32 and rounded once, so they are
                # within one rounding of the exact sum (the library rounds at each addition).
                values = torch.randn(length, generator=generator).to(dtype)
                exact = values.double()
                dist.all_reduce(exact)
                magnitude = values.double().abs()
                dist.all_reduce(magnitude)
                mine = shared.all_reduce(values.clone()).double()
                # float32's roundings at each addition, then (16-bit) one rounding of the result
                # on one host; between hosts the library adds the hosts' rounded sums
                bound = world_size * torch.finfo(torch.float32).eps * magnitude
                if dtype != torch.float32:
                    roundings = 1 if hosts is None else world_size
                    bound += roundings * torch.finfo(dtype).eps * magnitude
                if length and ((mine - exact).abs() > bound).any():
                    worst = (mine - exact).abs().max().item()
                    found.append((str(dtype), length, "random", f"off by {worst}"))
    return mismatches, paths


def compare_halves_with_library(rank, world_size):
    """What differs (difference_message's lines) of the shared-memory reduce-scatter and
    all-gather against the library's, on one host, for chunks that fit a slot and chunks that take
    several pieces; and what the halves say across two hosts."""
    from manual_collectives import SharedMemoryAllReduce
    from runtime.torch_compat import all_gather_single, reduce_scatter_single

    shared = SharedMemoryAllReduce(SLOT_BYTES)
    found = []
    for dtype in DTYPES:
        for chunk in (1, 7, 20_011):
            where = f"rank {rank}, chunks of {chunk} {dtype}"
            generator = torch.Generator().manual_seed(rank * 1000 + chunk)
            # small integers: every order of addition gives the library's bits
            tensor = torch.randint(-8, 9, (chunk * world_size,), generator=generator).to(dtype)
            library = tensor.new_empty(chunk)
            reduce_scatter_single(library, tensor.clone())
            found.append(difference_message(shared.reduce_scatter(tensor.new_empty(chunk), tensor),
                                            library, f"{where}: reduce_scatter's output"))
            shard = torch.randn(chunk, generator=generator).to(dtype)
            library = shard.new_empty(chunk * world_size)
            all_gather_single(library, shard)
            found.append(difference_message(shared.all_gather(shard.new_empty(chunk * world_size),
                                                              shard),
                                            library, f"{where}: all_gather's output", chunk=chunk))
            in_place = shard.new_zeros(chunk * world_size)
            own = in_place.view(world_size, -1)[rank]
            own.copy_(shard)
            found.append(difference_message(shared.all_gather(in_place, own), library,
                                            f"{where}: all_gather's output, the shard in place",
                                            chunk=chunk))
    two_hosts = SharedMemoryAllReduce(SLOT_BYTES, host=f"host{rank % 2}")
    try:
        two_hosts.all_gather(torch.empty(world_size), torch.ones(1))
        found.append(f"rank {rank}: all_gather took ranks of two hosts")
    except RuntimeError as error:
        if "one host" not in str(error):
            found.append(f"rank {rank}: all_gather across two hosts: {error}")
    return [line for line in found if line]


def all_cases(rank, world_size):
    """Every case of one world size, in one launch: the sums, the paths, the halves (from 2 ranks)
    and at 3 ranks DDP."""
    mismatches, paths = compare_with_library(rank, world_size)
    halves = compare_halves_with_library(rank, world_size) if world_size > 1 else []
    ddp = train_ddp(rank, world_size) if world_size == DDP_WORLD_SIZE else None
    return mismatches, paths, ddp, halves


@launch_once
def outcomes(world_size):
    return run_in_processes(world_size, all_cases, timeout_s=60)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_shm_all_reduce_equals_dist_all_reduce_for_awkward_lengths_dtypes_and_hosts(world_size):
    for rank, (mismatches, _, _, _) in enumerate(outcomes(world_size)):
        for layout, found in mismatches.items():
            # each case as dist.all_reduce (integers), within one rounding (random values)
            assert found == [], f"rank {rank}, {layout}: (dtype, length, data, problem) {found}"


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_shm_reduce_scatter_and_all_gather_equal_the_librarys_on_one_host_only(world_size):
    for _, _, _, halves in outcomes(world_size):
        # to the bit (integer sums; an all-gather only copies), in one piece or several; two
        # hosts refused in one line
        assert_none(halves)


@pytest.mark.parametrize("world_size", [2, 3])
def test_no_segment_is_left_in_dev_shm_after_the_collective_is_set_up(world_size):
    for _, paths, _, _ in outcomes(world_size):
        # unlinked once every rank had mapped it: nothing to clean up, however the run ends
        assert paths and not any(os.path.exists(path) for path in paths), paths


# --- DDP through the comm hook -----------------------------------------------------------------
DDP_WORLD_SIZE = 3


def train_ddp(rank, world_size):
    """Three SGD steps of DDP over each --transport (library: DDP's own all-reduce); the
    parameters after each, per transport."""
    from runtime.timing import CommRecorder
    from runtime.wrappers import SyncOptions, wrap_model

    histories = {}
    for transport in ("library", "shm", "ring"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        options = SyncOptions("ddp", bucket_mb=0.001, transport=transport)
        wrapped = wrap_model(model, options, CommRecorder())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        history = []
        for step in range(3):
            generator = torch.Generator().manual_seed(100 * step + rank)
            inputs = torch.randn(4, 8, generator=generator)
            labels = torch.randint(0, 4, (4,), generator=generator)
            F.cross_entropy(wrapped(inputs), labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            history.append(torch.cat([param.detach().view(-1) for param in model.parameters()]))
        histories[transport] = history
    return histories


@pytest.mark.parametrize("transport", ["shm", "ring"])
def test_ddp_over_a_hand_written_transport_trains_exactly_as_ddp(transport):
    for rank, (_, _, histories, _) in enumerate(outcomes(DDP_WORLD_SIZE)):
        for step, (theirs, mine) in enumerate(zip(histories["library"], histories[transport])):
            # float32 sums of 3 values in different orders: a few roundings apart at most
            torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7,
                                       msg=f"rank {rank} step {step}")


# --- Failures: a stalled rank, a killed rank ---------------------------------------------------
KILLED = 2  # the rank that dies
TIMEOUT_S = 1.0


def failing_rank(rank, world_size, port, folder, child):
    """Phase 1: rank KILLED arrives late, so the others time out (and so does it, afterwards).
    Phase 2, a new segment: rank KILLED is SIGKILLed in the middle of the calls. Each survivor
    writes what it saw. Started without the harness (a rank dies here), so it enters the sandbox
    itself, as the harness's children do, before importing the code under test."""
    sandbox.enter(child)
    from manual_collectives import SharedMemoryAllReduce

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=30))
    seen = {}
    shared = SharedMemoryAllReduce(SLOT_BYTES, timeout_s=TIMEOUT_S)
    if rank == KILLED:
        time.sleep(2 * TIMEOUT_S)
    began = time.monotonic()
    try:
        shared.all_reduce(torch.ones(1000))
    except RuntimeError as error:
        seen["stalled"] = (str(error), time.monotonic() - began)
    shared = SharedMemoryAllReduce(SLOT_BYTES, timeout_s=30)  # ranks meet again in gloo
    seen["path"] = shared.path
    began = time.monotonic()
    try:
        for call in range(50):
            if rank == KILLED and call == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            shared.all_reduce(torch.ones(1000))
    except RuntimeError as error:
        seen["killed"] = (str(error), time.monotonic() - began)
    torch.save(seen, os.path.join(folder, f"{rank}.pt"))
    os._exit(0)  # no teardown: the process group has lost a rank


def test_a_stalled_rank_times_out_and_a_killed_rank_ends_the_others_at_once():
    with sandbox.fresh_folder() as folder:  # the ranks may run as another user: they write there
        context = multiprocessing.start_processes(
            failing_rank, args=(3, free_port(), folder, sandbox.identity()), nprocs=3,
            join=False, start_method=START_METHOD)
        for process in context.processes:
            process.join(60)
        assert not any(process.is_alive() for process in context.processes), "a rank hung"
        sandbox.settle()
        survivors = [torch.load(os.path.join(folder, f"{rank}.pt"), weights_only=True)
                     for rank in (0, 1)]
    for seen in survivors:
        message, seconds = seen["stalled"]
        # the deadline, not gloo's 30 s, ended the wait, with one line naming the late rank
        assert f"[{KILLED}] did not arrive within" in message and "\n" not in message
        assert TIMEOUT_S <= seconds < TIMEOUT_S + 1.5, seconds
        message, seconds = seen["killed"]
        # the dead peer's pid is noticed within a fraction of the 30 s timeout
        assert f"rank {KILLED} (pid" in message and "exited" in message, message
        assert seconds < 5, seconds
        assert not os.path.exists(seen["path"])  # nothing left in /dev/shm after a SIGKILL
