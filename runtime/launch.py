"""Where the processes come from and how they find each other; process-group set-up in one place.

Three launchers, recognised from the environment:
  local     `--world-size N`: this script starts N processes on a free port it finds
  torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
  slurm     one `srun` task per rank: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and the
            master is the first host of SLURM_JOB_NODELIST
"""
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist
from torch import multiprocessing

from runtime import collective_record, emulated_network, shaped_links, torch_compat


class LaunchError(Exception):
    """A launch environment or option that cannot work; reported as one line."""


@dataclass
class Placement:
    """Who this process is in the job and where the master listens."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    launcher: str = "single"


TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
SLURM_VARS = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST")


def detect_launcher(environ=os.environ):
    """'torchrun', 'slurm' or None (started by hand). torchrun's workers inside a SLURM job are
    torchrun's."""
    # MASTER_* alone does not count: any sbatch script may set them.
    if any(name in environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return "torchrun"
    # SLURM_STEP_ID: a task of `srun`, not the batch script
    if "SLURM_STEP_ID" in environ and "SLURM_PROCID" in environ:
        return "slurm"
    return None


def placement_from_environment(launcher, environ=os.environ):
    """This process's Placement, read from the variables torchrun or srun set."""
    names = TORCHRUN_VARS if launcher == "torchrun" else SLURM_VARS
    missing = [name for name in names if name not in environ]
    if missing:
        raise LaunchError(f"incomplete {launcher} environment: {', '.join(missing)} not set")
    try:
        if launcher == "torchrun":
            world = int(environ["WORLD_SIZE"])
            return Placement(int(environ["RANK"]), world, int(environ["LOCAL_RANK"]),
                             int(environ.get("LOCAL_WORLD_SIZE", world)), environ["MASTER_ADDR"],
                             int(environ["MASTER_PORT"]), launcher)
        tasks_here = environ.get("SLURM_STEP_TASKS_PER_NODE",
                                 environ.get("SLURM_TASKS_PER_NODE", "1"))
        return Placement(int(environ["SLURM_PROCID"]), int(environ["SLURM_NTASKS"]),
                         int(environ["SLURM_LOCALID"]), int(re.match(r"\d+", tasks_here).group()),
                         first_host(environ["SLURM_JOB_NODELIST"]),
                         int(environ.get("MASTER_PORT", 29500)), launcher)
    except ValueError as error:
        raise LaunchError(f"malformed {launcher} environment: {error}") from None


def first_host(nodelist):
    """The first host name of a SLURM node list such as 'node[03-05,07],gpu1'."""
    try:
        hosts = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                               text=True, check=True, timeout=30).stdout.split()
        if hosts:
            return hosts[0]
    except (OSError, subprocess.SubprocessError):
        pass
    # without scontrol: the prefix and the start of the first range
    first = re.match(r"([^,\[]+)(?:\[([^,\-\]]+))?", nodelist)
    return first.group(1) + (first.group(2) or "")


def first_line(error):
    """An error's first line: torch's distributed errors go on for pages of C++ frames."""
    return (str(error).strip().splitlines() or [""])[0]


def last_line(traceback_text):
    """A traceback's last line: the exception's type and message."""
    return (traceback_text.strip().splitlines() or [""])[-1]


def free_port():
    """A TCP port no one listens on now, for a local master."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def port_is_free(port):
    """Whether `port` can be bound on this host."""
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
            return True
        except OSError:
            return False


def host_name():
    """The node's name as the job knows it (SLURM's, where several slurmd share one machine), else
    the host's."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def threads_per_rank(requested, local_world_size):
    """Cores available to this process divided among the ranks of this node, so they do not
    oversubscribe."""
    if requested:
        return requested
    return max(1, len(os.sched_getaffinity(0)) // local_world_size)


@contextmanager
def process_group(placement, backend, timeout_s, record=False):
    """Join the job's process group for the duration of the block (none for one process). With
    `record`, this rank's collectives are recorded (runtime/collective_record.py), for the
    verdict of a hang. Yields the collective_record.Recorder, or None."""
    if placement.launcher == "single":
        yield None
        return
    address = f"{placement.master_addr}:{placement.master_port}"
    if placement.rank != 0:
        wait_for_master(placement.master_addr, placement.master_port, timeout_s)
    try:
        if placement.launcher == "torchrun":
            # torchrun's store outlives a restart, and a restarted worker writes the same keys the
            # dead attempt did: a key prefix per attempt keeps it from reading a dead peer's
            # address.
            store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
            attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            dist.init_process_group(backend, store=dist.PrefixStore(f"attempt-{attempt}", store),
                                    rank=placement.rank, world_size=placement.world_size,
                                    timeout=timedelta(seconds=timeout_s))
        else:
            dist.init_process_group(backend, init_method=f"tcp://{address}",
                                    rank=placement.rank, world_size=placement.world_size,
                                    timeout=timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as error:
        raise LaunchError(f"rank {placement.rank} could not join the process group at {address} "
                          f"within {timeout_s:g} s: {first_line(error)}") from None
    recorder = None
    if record and placement.world_size > 1:  # the run's one interception, said first
        recorder = collective_record.install(collective_record.run_folder(), placement.rank)
        if placement.rank == 0:
            print(collective_record.INTERCEPTION, flush=True)
    try:
        yield recorder
    finally:
        torch_compat.destroy_process_group()


def wait_for_master(host, port, timeout_s):
    """Knock on the master's port with growing pauses until it answers: a master still starting is
    a passing failure; one that never listens ends with the address that was tried."""
    deadline = time.monotonic() + timeout_s
    pause = 0.1
    attempts = 0
    while True:
        attempts += 1
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout_s)):
                return
        except OSError as error:
            if time.monotonic() + pause > deadline:
                raise LaunchError(f"no master listening at {host}:{port} after {attempts} attempts "
                                  f"in {timeout_s:g} s ({error.strerror or error}); is rank 0 "
                                  "running, and MASTER_ADDR/MASTER_PORT right?") from None
        time.sleep(pause)
        pause = min(pause * 2, 5.0)


def launch_local(worker, world_size, args, port=None, fork=False):
    """Run `worker(placement, args)` in `world_size` fresh processes; returns (failed rank, exit
    code) or None.

    fork=True forks the ranks from this process instead of starting new interpreters: each starts
    without importing torch again (a second of CPU; a 4-rank start on 2 cores takes 3 s instead of
    5.5). Only for a caller that has run no tensor operation (OpenMP's threads do not survive a
    fork) and not initialised CUDA, on Linux (macOS's system libraries are not fork-safe).

    When one rank fails the others are terminated rather than left blocked in a collective. With
    args.emulate_link the ranks run on an emulated network (runtime/shaped_links.py), made
    before they start and removed after they end, whichever way they end.
    """
    try:
        with emulated_network.for_local_ranks(args, world_size) as network:
            return _launch_local(worker, world_size, args, port, network, fork)
    except shaped_links.NetworkUnavailable as error:
        raise LaunchError(str(error)) from None


def _launch_local(worker, world_size, args, port, network, fork):
    # We say which rank failed ourselves.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    port = port or free_port()
    master = network.address(0) if network else "127.0.0.1"
    placements = [Placement(rank, world_size, rank, world_size, master, port, "local")
                  for rank in range(world_size)]
    # A signal while the ranks start would leave the started ones without a handle to stop them,
    # and the interpreter's exit would then wait for them forever: hold SIGINT/SIGTERM until every
    # rank has a handle.
    stops = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        context = multiprocessing.start_processes(_run_placed,
                                                  args=(worker, placements, args, network),
                                                  nprocs=world_size, join=False,
                                                  start_method="fork" if fork else "spawn")
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
    try:
        while not context.join():
            pass
    except multiprocessing.ProcessExitedException as failure:
        return failure.error_index, failure.exit_code
    except multiprocessing.ProcessRaisedException as failure:
        # a worker that let its exception out (a benchmark's): else no one would say what it was
        print(f"error: rank {failure.error_index}: {last_line(failure.msg)}", file=sys.stderr,
              flush=True)
        return failure.error_index, 1
    finally:  # on Ctrl-C or SIGTERM too: no rank outlives the launcher
        stop_all(context.processes)
    return None


def stop_all(processes, grace_s=5.0):
    """Terminate every process still running, wait for all of them against one deadline, then
    kill the rest."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()


def _run_placed(index, worker, placements, args, network=None):
    # A forked rank has the launcher's signal handlers: a fresh interpreter's instead. The launcher
    # held SIGINT and SIGTERM while it started the ranks, and the ranks inherited that too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if network:  # before any socket: the process group must start inside the rank's node
        network.enter(emulated_network.host_of(index, args))
    worker(placements[index], args)
    # Leave without interpreter teardown, as mlp_ddp.exit_now does: gloo's threads can abort the
    # process there (SIGABRT, pytorch/pytorch#179291), which would read as this rank failing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
