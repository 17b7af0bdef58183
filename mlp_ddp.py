"""Data-parallel training of an MLP or CNN on MNIST / FashionMNIST, with gradients averaged by
torch's DistributedDataParallel or by hand (manual_allreduce.py).

One process, the baseline:
    python mlp_ddp.py --mode single
Four local processes, gradients averaged by hand-written all-reduce (the main job):
    python mlp_ddp.py --mode manual --world-size 4
    python mlp_ddp.py --mode manual --sync bucketed --bucket-mb 1 --world-size 4
    python mlp_ddp.py --mode ddp --model cnn --world-size 2
Under torchrun, on one node or on each of two nodes:
    torchrun --nproc-per-node=4 mlp_ddp.py --mode ddp
    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 mlp_ddp.py --mode manual
On a SLURM cluster, one srun task per rank (see run_slurm.sh):
    sbatch run_slurm.sh --mode manual --sync bucketed
Offline, with the raw .gz files in DIR/MNIST/raw:
    python mlp_ddp.py --offline-data-dir DIR        (or OFFLINE_DATA_DIR=DIR)
Every run writes results/<run-name>.json; the schema is in the README.
"""
import argparse
import os
import platform
import signal
import sys
import tempfile
import time

import torch

from manual_allreduce import DEFAULT_BUCKET_MB, STRATEGIES
from runtime import checkpoint, data
from runtime.launch import (
    LaunchError,
    Placement,
    choose_backend,
    detect_launcher,
    device_for,
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
from runtime.modes import wrap_model
from runtime.results import SCHEMA, write_json_atomic
from runtime.timing import StepTimer
from runtime.trainer import Trainer, TrainingDiverged, all_reduce_sum, gather


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad option is one line on stderr (no usage block) and exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def bounded(kind, low=None, high=None, low_open=False):
    """An argparse type: `kind` within [low, high] (low excluded when low_open)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if value != value or (low is not None and (value <= low if low_open else value < low)) \
                or (high is not None and value > high):
            bound = f"> {low}" if low_open else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}{f' and <= {high}' if high is not None else ''}, got {text}")
        return value
    return parse


def hidden_sizes(text):
    try:
        sizes = tuple(int(size) for size in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return sizes


def parse_args(argv=None):
    parser = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--mode", choices=("single", "ddp", "manual", "ddp-no-sync"), default="manual",
        help="how gradients are synchronised (ddp-no-sync: not at all, the compute baseline for benchmarks)")
    add("--sync", choices=STRATEGIES, default="bucketed", help="hand-written strategy for --mode manual")
    add("--bucket-mb", type=bounded(float, 0, low_open=True), default=DEFAULT_BUCKET_MB, help="bucket size (bucketed, and DDP's)")
    add("--compress", choices=("none", "fp16", "bf16"), default="none", help="gradient dtype on the wire")
    add("--amp", choices=("none", "bf16", "fp16"), default="none", help="mixed precision: autocast (fp16 with loss scaling)")
    add("--accum-steps", type=bounded(int, 1), default=1, help="micro-batches per optimizer step (no_sync on all but the last)")
    add("--model", choices=("mlp", "cnn"), default="mlp")
    add("--hidden-sizes", type=hidden_sizes, default=(512, 256, 128), help="MLP hidden layer widths, e.g. 512,256,128")
    add("--dropout", type=bounded(float, 0, 0.99), default=None, help="every dropout layer's rate (default: the model's own)")
    add("--dataset", choices=tuple(data.DATASETS), default="mnist")
    add("--data-dir", default="data", help="where the dataset is kept (fetched if missing)")
    add("--offline-data-dir", default=os.environ.get("OFFLINE_DATA_DIR"),
        help="read-only folder with <Dataset>/raw/*.gz to copy from instead of downloading (env OFFLINE_DATA_DIR)")
    add("--train-samples", type=bounded(int, 0), default=0, help="use only this many training samples (0: all)")
    add("--val-samples", type=bounded(int, 0), default=5000, help="held out of the training split for validation")
    add("--test-samples", type=bounded(int, 0), default=0, help="use only this many test samples (0: all)")
    add("--epochs", type=bounded(int, 1), default=15, help="15 with the StepLR defaults passes 98%% test accuracy with the MLP")
    add("--batch-size", type=bounded(int, 1), default=64, help="per process; the global batch is this x world size")
    add("--max-steps", type=bounded(int, 0), default=0, help="stop each epoch after this many steps (0: whole epoch)")
    add("--optimizer", choices=("adam", "sgd"), default="adam")
    add("--lr", type=bounded(float, 0, low_open=True), default=1e-3)
    add("--momentum", type=bounded(float, 0, 1), default=0.9, help="SGD momentum")
    add("--lr-step", type=bounded(int, 0), default=5, help="StepLR: decay every this many epochs (0: constant)")
    add("--lr-gamma", type=bounded(float, 0, 1, low_open=True), default=0.3, help="StepLR decay factor")
    add("--seed", type=bounded(int, 0), default=0)
    add("--warmup-steps", type=bounded(int, 0), default=5, help="first steps left out of the timing statistics")
    add("--calibrate-every", type=bounded(int, 0), default=25,
        help="ddp: time a backward without communication every this many steps (0: never; see timing.py)")
    add("--world-size", type=bounded(int, 1), default=None, help="start this many local processes (not under torchrun/srun)")
    add("--backend", choices=("auto", "gloo", "nccl"), default="auto", help="auto: NCCL when each local rank has a GPU")
    add("--timeout", type=bounded(float, 0, low_open=True), default=120.0, help="seconds a collective may wait for a peer")
    add("--threads", type=bounded(int, 0), default=0, help="torch threads per rank (0: cores / local ranks)")
    add("--master-port", type=bounded(int, 1, 65535), default=None, help="port for a local launch (default: a free one)")
    add("--results-dir", default="results")
    add("--run-name", default=None, help="results file name (default: model-dataset-mode[-sync]-wN-time)")
    add("--save-model", default=None, metavar="PATH", help="rank 0 saves the final state_dict here")
    add("--checkpoint-dir", default=None, help="rank 0 saves a checkpoint here after every epoch")
    add("--checkpoint-every", type=bounded(int, 0), default=0, help="also every this many steps (0: epochs only)")
    add("--keep-checkpoints", type=bounded(int, 1), default=3, help="how many of the newest checkpoints to keep")
    add("--resume", action="store_true", help="continue from the newest valid checkpoint in --checkpoint-dir, if any")
    add("--progress-every", type=bounded(float, 0, low_open=True), default=10.0, help="seconds between progress lines")
    add("--trace", default=None, metavar="PATH", help="write a Chrome-trace timeline of --trace-steps steps")
    add("--trace-steps", type=bounded(int, 1), default=20, help="steps after the warm-up shown in the trace")
    add("--tensorboard", default=None, metavar="DIR", help="also log scalars for TensorBoard (needs the tensorboard package)")
    add("--debug-exit-rank", type=bounded(int, 0), default=0, help=argparse.SUPPRESS)
    add("--debug-exit-step", type=bounded(int, 0), default=None, help=argparse.SUPPRESS)
    add("--debug-slow-rank", type=bounded(int, 0), default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.compress = None if args.compress == "none" else args.compress
    args.amp = None if args.amp == "none" else args.amp
    if args.mode == "single" and (args.world_size or 1) > 1:
        parser.error("--mode single runs one process; use --mode ddp or manual with --world-size > 1")
    if args.resume and not args.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir")
    if args.tensorboard:
        try:
            import torch.utils.tensorboard  # noqa: F401
        except ImportError:
            parser.error("--tensorboard needs the tensorboard package: pip install tensorboard")
    for option in ("results_dir", "checkpoint_dir"):
        folder = getattr(args, option)
        if folder and not writable(folder):
            parser.error(f"--{option.replace('_', '-')} {folder} is not a writable folder")
    return args


def writable(folder):
    """Whether files can be created in `folder` (made if missing): checked before any training is spent."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


class Stopped(Exception):
    """SIGINT or SIGTERM arrived; the exit code is 128 + the signal's number, as a shell reports it."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def stop_on_signal(signum, frame):
    raise Stopped(signum)


def exit_now(code, placement):
    """Leave without interpreter teardown where gloo's threads may be alive: they can release Python objects
    there and abort or hang the process (SIGABRT; pytorch/pytorch#179291). Output is flushed first."""
    if placement.launcher == "single":
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_rank(placement, args):
    """The whole life of one rank; errors end it with one line and exit code 2 (input) or 1 (runtime).

    A local launch's ranks keep the default SIGTERM (the launcher's terminate() ends them at once, even inside
    a collective); under torchrun or srun, main() has made SIGINT and SIGTERM raise Stopped here."""
    try:
        train_rank(placement, args)
        if placement.launcher != "single":
            exit_now(0, placement)
    except (data.DataError, LaunchError) as error:
        if placement.local_rank == 0:  # every rank sees the same problem: one line per node, not per rank
            print(f"error: {error}", file=sys.stderr, flush=True)
        exit_now(2, placement)
    except (Stopped, KeyboardInterrupt) as stop:
        exit_now(getattr(stop, "exit_code", 130), placement)
    except TrainingDiverged as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        exit_now(1, placement)
    except Exception as error:  # a peer that died, a timeout: the first line says which
        print(f"error: rank {placement.rank}: {type(error).__name__}: {first_line(error)}", file=sys.stderr, flush=True)
        exit_now(1, placement)


def prepare_data(placement, args):
    """One process per machine fetches and verifies the data; every rank learns whether that worked."""
    problem = None
    if placement.local_rank == 0:
        try:
            data.fetch(args.dataset, args.data_dir, args.offline_data_dir)
        except data.DataError as error:
            problem = str(error)
    failures = all_reduce_sum([problem is not None], torch.device("cpu"))[0] if placement.world_size > 1 else 0
    if problem or failures:  # the all-reduce doubles as the barrier the other ranks wait at
        raise data.DataError(problem or "preparing the data failed on another node (see its log)")


def train_rank(placement, args):
    backend = choose_backend(args.backend, placement.local_world_size)
    torch.set_num_threads(threads_per_rank(args.threads, placement.local_world_size))
    torch.manual_seed(args.seed + placement.rank)  # ranks start different; the wrapper's broadcast makes them agree
    with process_group(placement, backend, args.timeout):
        device = device_for(backend, placement.local_rank)
        prepare_data(placement, args)
        dataset = data.load(args.dataset, args.data_dir, args.val_samples, args.train_samples,
                            args.test_samples, args.seed)
        global_batch = args.batch_size * args.accum_steps * placement.world_size
        if global_batch > len(dataset.train):
            raise data.DataError(f"the global batch ({global_batch}) is larger than the training set "
                                 f"({len(dataset.train)} samples)")
        model = build_model(args.model, args.hidden_sizes, args.dropout).to(device)
        timer = StepTimer(device, args.warmup_steps, args.trace_steps if args.trace else 0)
        wrapped = wrap_model(model, args.mode, timer.comm, args.sync, args.bucket_mb, args.compress,
                             [device.index] if device.type == "cuda" else None)
        # fused: one kernel for all parameters; the default per-tensor loop took a third of an MLP step on CPU.
        if args.optimizer == "adam":
            optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)
        else:
            optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, fused=True)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, args.lr_step, args.lr_gamma) if args.lr_step else None
        start = time.perf_counter()
        tensorboard = None
        if args.tensorboard and placement.rank == 0:
            from torch.utils.tensorboard import SummaryWriter
            tensorboard = SummaryWriter(args.tensorboard)
        outcome = Trainer(wrapped, optimizer, scheduler, dataset, args, placement, device, timer, tensorboard).fit()
        if tensorboard is not None:
            tensorboard.close()
        hosts = sorted(set(gather(host_name())))
        if placement.rank == 0:
            write_results(args, placement, backend, device, hosts, model, outcome, time.perf_counter() - start)
            if args.save_model:
                checkpoint.save_atomic(model.state_dict(), args.save_model)


def write_results(args, placement, backend, device, hosts, model, outcome, total_time):
    run_name = args.run_name or "-".join(
        [args.model, args.dataset, args.mode] + ([args.sync] if args.mode == "manual" else [])
        + [f"w{placement.world_size}", time.strftime("%Y%m%d-%H%M%S")])
    config = {key: value for key, value in vars(args).items() if not key.startswith("debug")}
    document = {
        "schema": SCHEMA,
        "run_name": run_name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": config,
        "environment": {
            "torch": torch.__version__, "python": platform.python_version(), "backend": backend,
            "device": str(device), "launcher": placement.launcher, "world_size": placement.world_size,
            "hosts": hosts, "cores": os.cpu_count(), "threads_per_rank": torch.get_num_threads(),
            "parameters": count_parameters(model), "platform": platform.platform(),
        },
        **outcome,
        "throughput_samples_per_s": sum(e["samples_per_s"] for e in outcome["epochs"]) / len(outcome["epochs"]),
        "total_time_s": total_time,
    }
    path = os.path.join(args.results_dir, run_name + ".json")
    write_json_atomic(path, document)
    print(f"results: {path}", flush=True)


def main(argv=None):
    args = parse_args(argv)
    for signum in (signal.SIGINT, signal.SIGTERM):  # the local launcher's clean-up runs on either
        signal.signal(signum, stop_on_signal)
    try:
        launcher = detect_launcher()
        if launcher:
            if args.world_size is not None:
                raise LaunchError(f"--world-size is for a local launch; under {launcher} the launcher sets it")
            run_rank(placement_from_environment(launcher), args)
            return 0
        data.fetch(args.dataset, args.data_dir, args.offline_data_dir)  # once, before any rank starts
        world_size = args.world_size or 1
        if world_size == 1:
            launcher = "single" if args.mode == "single" else "local"
            run_rank(Placement(master_port=args.master_port or free_port(), launcher=launcher), args)
            return 0
        if args.master_port and not port_is_free(args.master_port):
            raise LaunchError(f"--master-port {args.master_port} is already in use; choose another or omit it")
        failure = launch_local(run_rank, world_size, args, args.master_port)
    except (data.DataError, LaunchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Stopped as stop:
        print(f"interrupted ({stop}): every rank stopped", file=sys.stderr)
        return stop.exit_code
    if failure:
        rank, code = failure
        if code != 2:  # a rank that exits 2 has already said what was wrong with the input
            print(f"error: rank {rank} failed (exit code {code}); the other ranks were stopped", file=sys.stderr)
        return code if code and code > 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
