r"""Data-parallel training of an MLP or CNN on MNIST / FashionMNIST, with gradients averaged by
torch's DistributedDataParallel or by hand (manual_allreduce.py).

One process, the baseline:
    python mlp_ddp.py --mode single
Four local processes, gradients averaged by hand-written all-reduce (the main job):
    python mlp_ddp.py --mode manual --world-size 4
    python mlp_ddp.py --mode manual --sync bucketed --bucket-mb 1 --world-size 4
    python mlp_ddp.py --mode manual --sync naive --world-size 4        (average_gradients itself)
    python mlp_ddp.py --mode manual --sync flat --transport ring --world-size 4
    python mlp_ddp.py --mode ddp --model cnn --world-size 2
Beyond copies of the model: the optimizer state, gradients and parameters sharded (ZeRO, by hand):
    python mlp_ddp.py --mode sharded --shard optimizer --world-size 4       (ZeRO-1; gradients: 2)
    python mlp_ddp.py --mode sharded --compute-dtype bf16 --world-size 4    (ZeRO-3 / FSDP)
Under torchrun, on one node or on each of two nodes:
    torchrun --nproc-per-node=4 mlp_ddp.py --mode ddp
    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \
        mlp_ddp.py --mode manual
On a SLURM cluster, one srun task per rank (see run_slurm.sh):
    sbatch run_slurm.sh --mode manual --sync bucketed
Offline, with the raw .gz files in DIR/MNIST/raw:
    python mlp_ddp.py --offline-data-dir DIR        (or OFFLINE_DATA_DIR=DIR)
Every run writes results/<run-name>.json; the schema is in the README.
"""
import os
import platform
import signal
import sys
import tempfile
import time

import torch

from runtime import checkpoint, collective_record, data, device, faults, hang_verdict
from runtime.across_ranks import gather, sum_over_ranks
from runtime.guards import TrainingDiverged
from runtime.launch import (
    LaunchError,
    Placement,
    detect_launcher,
    first_line,
    free_port,
    host_name,
    launch_local,
    placement_from_environment,
    port_is_free,
    process_group,
    threads_per_rank,
)
from runtime.models import build_model, count_parameters
from runtime.optimizers import build_optimizer, steps_per_epoch
from runtime.options import parse_args
from runtime.results import SCHEMA, write_json_atomic
from runtime.timing import StepTimer
from runtime.trainer import Trainer
from runtime.wrappers import SyncOptions, wrap_model


def main(argv=None):
    """Parse the options and start the ranks: under torchrun or srun this process is one of them;
    started by hand, it is the only one, or the launcher of --world-size local ones. Returns the
    exit code."""
    args = parse_args(argv, description=__doc__.split("\n\n")[0])
    for signum in (signal.SIGINT, signal.SIGTERM):  # the local launcher's clean-up runs on either
        signal.signal(signum, stop_on_signal)
    try:
        launcher = detect_launcher()
        if launcher:
            if args.world_size is not None:
                raise LaunchError(f"--world-size is for a local launch; under {launcher} the "
                                  "launcher sets it")
            run_rank(placement_from_environment(launcher), args)
            return 0
        world_size = args.world_size or 1
        plan = device.plan(args.device, args.backend, world_size)  # refused before any data
        print(first_line_of_run(args, world_size, plan, world_size), flush=True)
        data.fetch(args.dataset, args.data_dir, args.offline_data_dir)  # once, before any rank
        if world_size == 1:
            launcher = "single" if args.mode == "single" else "local"
            port = args.master_port or free_port()
            run_rank(Placement(master_port=port, launcher=launcher), args)
            return 0
        if args.master_port and not port_is_free(args.master_port):
            raise LaunchError(f"--master-port {args.master_port} is already in use; choose "
                              "another or omit it")
        # This process has only imported torch: on Linux the ranks can be forked from it, with
        # what each would import when it builds its optimizer (a second of CPU per rank). Not
        # where they use a GPU: asking for the GPUs above started CUDA, which a fork cannot use.
        fork = sys.platform == "linux" and plan.kind == "cpu"
        if fork:
            import torch._dynamo  # noqa: F401

        with tempfile.TemporaryDirectory(prefix="collective-record-") as record:
            os.environ[collective_record.FOLDER_VARIABLE] = record  # the ranks inherit it
            failure = launch_local(run_rank, world_size, args, args.master_port, fork=fork)
            verdict = hang_verdict.verdict_once(record) if failure else ""
    except (data.DataError, LaunchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Stopped as stop:
        print(f"interrupted ({stop}): every rank stopped", file=sys.stderr)
        return stop.exit_code
    if failure:
        rank, code = failure
        if code != 2:  # a rank that exits 2 has already said what was wrong with the input
            print(f"error: rank {rank} failed (exit code {code}); the other ranks were stopped",
                  file=sys.stderr)
        print(verdict, file=sys.stderr, end="")
        return code if code and code > 0 else 1
    return 0


def run_rank(placement, args):
    """The whole life of one rank; errors end it with one line and exit code 2 (input) or 1
    (runtime).

    A local launch's ranks keep the default SIGTERM (the launcher's terminate() ends them at
    once, even inside a collective); under torchrun or srun, main() has made SIGINT and SIGTERM
    raise Stopped here."""
    try:
        train_rank(placement, args)
        if placement.launcher in ("torchrun", "slurm"):  # a local launch removes its folder
            collective_record.discard()
        if placement.launcher != "single":
            exit_now(0, placement)
    except (data.DataError, LaunchError) as error:
        if placement.local_rank == 0:  # every rank sees the same problem: one line per node
            print(f"error: {error}", file=sys.stderr, flush=True)
        else:  # the first rank to end stops the others: let the one that says why end first
            time.sleep(1)
        exit_now(2, placement)
    except (Stopped, KeyboardInterrupt) as stop:
        exit_now(getattr(stop, "exit_code", 130), placement)
    except TrainingDiverged as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        exit_now(1, placement)
    except Exception as error:  # a peer that died, a timeout: the first line says which
        print(f"error: rank {placement.rank}: {type(error).__name__}: {first_line(error)}",
              file=sys.stderr, flush=True)
        exit_now(1, placement)


def train_rank(placement, args):
    """One rank's run: join the process group, load the data, build and wrap the model, train,
    and (rank 0) write the results."""
    plan = device.plan(args.device, args.backend, placement.local_world_size)
    backend = plan.backend
    if placement.rank == 0 and placement.launcher in ("torchrun", "slurm"):
        print(first_line_of_run(args, placement.world_size, plan, placement.local_world_size),
              flush=True)
    torch.set_num_threads(threads_per_rank(args.threads, placement.local_world_size))
    # The ranks start different; the wrapper's broadcast makes them agree.
    torch.manual_seed(args.seed + placement.rank)
    sync_options = SyncOptions.from_args(args)
    if backend == "nccl" and sync_options.through_shared_memory:
        raise LaunchError("--transport shm sums CPU tensors; NCCL takes only GPU ones (--backend "
                          "gloo stages them through the host)")
    rank_device = plan.for_rank(placement.local_rank)  # before NCCL starts: its GPU
    with process_group(placement, backend, args.timeout, record=True) as record:
        dataset = prepare_data(placement, args, rank_device)
        record_collectives(record, placement, args)  # from here on: a download is no hang
        model = build_model(args.model, args.hidden_sizes, args.dropout).to(rank_device)
        parameters = count_parameters(model)  # before a sharded wrapper cuts it up
        timer = StepTimer(rank_device, args.warmup_steps, args.trace_steps if args.trace else 0)
        device_ids = [rank_device.index] if rank_device.type == "cuda" else None
        wrapped = wrap_model(model, sync_options, timer.comm, device_ids, record)
        if args.debug_unsynced_parameter:
            faults.leave_out_of_sync(wrapped, args.debug_unsynced_parameter)
        steps = steps_per_epoch(len(dataset.train), args, placement.world_size)
        optimizer, schedule = build_optimizer(wrapped, args, steps)
        started = time.perf_counter()
        trainer = Trainer(wrapped, optimizer, schedule, dataset, args, placement, timer)
        outcome = trainer.fit()
        hosts = sorted(set(gather(host_name())))
        # every rank: a sharded model is gathered whole
        final_state = wrapped.full_state_dict() if args.save_model else None
        if placement.rank == 0:
            environment = describe_environment(placement, backend, rank_device, hosts, parameters)
            write_results(args, environment, outcome, time.perf_counter() - started)
            if args.save_model:
                checkpoint.save_atomic(final_state, args.save_model)


def record_collectives(record, placement, args):
    """A collective in `record` (runtime/collective_record.py, the launcher's) in flight for
    longer than --hang-timeout ends the run with the records' verdict (runtime/hang_verdict.py)."""
    if record is None:
        return
    hang_verdict.watch_from_now_on(record, args.hang_timeout)
    if args.debug_skip_all_reduce and placement.rank == args.debug_exit_rank:
        faults.skip_an_all_reduce(args.debug_skip_all_reduce, placement.rank)


def prepare_data(placement, args, rank_device):
    """One process per machine fetches and verifies the data, and every rank learns whether that
    worked (over `rank_device`: NCCL sums only GPU tensors); then each rank loads it into
    memory."""
    problem = None
    if placement.local_rank == 0:
        try:
            data.fetch(args.dataset, args.data_dir, args.offline_data_dir)
        except data.DataError as error:
            problem = str(error)
    failures = 0
    if placement.world_size > 1:  # the all-reduce doubles as the barrier the other ranks wait at
        failed = {"failures": problem is not None}
        failures = sum_over_ranks(failed, rank_device)["failures"]
    if problem or failures:
        raise data.DataError(problem or "preparing the data failed on another node (see its log)")
    dataset = data.load(args.dataset, args.data_dir, args.val_samples, args.train_samples,
                        args.test_samples, args.seed)
    global_batch = args.batch_size * args.accum_steps * placement.world_size
    if global_batch > len(dataset.train):
        raise data.DataError(f"the global batch ({global_batch}) is larger than the training set "
                             f"({len(dataset.train)} samples)")
    return dataset


def first_line_of_run(args, world_size, plan, local_world_size):
    """What the run is and where it computes, before anything else it says."""
    ranks = "1 rank" if world_size == 1 else f"{world_size} ranks"
    return (f"run: --mode {args.mode}, {args.model} on {args.dataset}, {ranks}, "
            + plan.describe(local_world_size))


def describe_environment(placement, backend, rank_device, hosts, parameters):
    """The results' `environment`: software, placement, hardware and the model's size."""
    on_gpu = rank_device.type == "cuda"
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "backend": backend,
        "device": str(rank_device),
        "gpu": torch.cuda.get_device_name(rank_device) if on_gpu else None,
        "float32": device.PRECISION if on_gpu else "float32",
        "launcher": placement.launcher,
        "world_size": placement.world_size,
        "hosts": hosts,
        "cores": os.cpu_count(),
        "threads_per_rank": torch.get_num_threads(),
        "parameters": parameters,
        "platform": platform.platform(),
    }


def write_results(args, environment, outcome, total_time):
    """results/<run-name>.json: the options, the environment, the epochs, the test score and the
    timing (the schema is in the README)."""
    run_name = args.run_name or default_run_name(args, environment["world_size"])
    config = {key: value for key, value in vars(args).items() if not key.startswith("debug")}
    epochs = outcome["epochs"]
    document = {
        "schema": SCHEMA,
        "run_name": run_name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": config,
        "environment": environment,
        **outcome,
        "throughput_samples_per_s": sum(epoch["samples_per_s"] for epoch in epochs) / len(epochs),
        "total_time_s": total_time,
    }
    path = os.path.join(args.results_dir, run_name + ".json")
    write_json_atomic(path, document)
    print(f"results: {path}", flush=True)


def default_run_name(args, world_size):
    """model-dataset-mode[-sync or -shard][-transport]-wN-time; the transport where one other than
    auto was asked for."""
    how = {"manual": [args.sync], "sharded": [args.shard]}.get(args.mode, [])
    how += [args.transport] if args.transport not in (None, "auto") else []
    return "-".join([args.model, args.dataset, args.mode, *how, f"w{world_size}",
                     time.strftime("%Y%m%d-%H%M%S")])


class Stopped(Exception):
    """SIGINT or SIGTERM arrived; the exit code is 128 + the signal's number, as a shell reports
    it."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def stop_on_signal(signum, frame):
    """The signal handler: raise Stopped wherever the main thread is."""
    raise Stopped(signum)


def exit_now(code, placement):
    """Leave without interpreter teardown where gloo's threads may be alive: they can release
    Python objects there and abort or hang the process (SIGABRT; pytorch/pytorch#179291). Output
    is flushed first."""
    if placement.launcher == "single":
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    # Without interpreter teardown: torch's takes half a second and frees nothing the OS would not.
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
