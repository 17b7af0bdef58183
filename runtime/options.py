"""mlp_ddp.py's command line: every option, its range, and the checks made before any training.

A bad option is one line on stderr and exit code 2, never a traceback or a usage block.
"""
import argparse
import os
import sys
import tempfile

from manual_allreduce import DEFAULT_BUCKET_MB, STRATEGIES
from manual_sharding import LEVELS
from runtime import emulated_network
from runtime.data import DATASETS
from runtime.device import DEVICES
from runtime.dtypes import DTYPES
from runtime.optimizers import SCHEDULES
from runtime.transports import NAMES as TRANSPORT_NAMES

MODES = ("single", "ddp", "manual", "ddp-no-sync", "sharded")  # runtime/wrappers.py
COMMUNICATING = ("manual", "ddp", "sharded")  # the modes --transport applies to
STRATEGY_NAMES = tuple(STRATEGIES)  # --sync
# The manual configurations that the sweep, the benchmarks and the design document compare, by the
# names they go by there: (--sync, --transport). Each strategy over the library, named by its
# --sync; the flat buffer over each hand-written transport, named <sync>-<transport>.
MANUAL_CONFIGURATIONS = {"per-param": ("per-param", "library"), "flat": ("flat", "library"),
                         "bucketed": ("bucketed", "library"), "flat-ring": ("flat", "ring"),
                         "flat-shm": ("flat", "shm")}
SIXTEEN_BIT = tuple(name for name in DTYPES if name != "fp32")  # --compress and --amp
# Spellings that --transport replaced: (option, value or None for any) -> the new spelling
REPLACED = {("--sync", "ring"): "--sync flat --transport ring",
            ("--sync", "shm"): "--sync flat --transport shm",
            ("--comm-hook", None): "--transport (--comm-hook none: library, shm: shm)",
            ("--collectives", None): "--transport (the same values)"}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad option is one line on stderr (no usage block) and exit code 2."""

    def error(self, message):
        """Leave with `message` alone."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def bounded(kind, low=None, high=None, low_open=False):
    """An argparse type: `kind` within [low, high] (low excluded when low_open)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            expected = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and value > high
        if value != value or too_low or too_high:  # value != value: NaN
            bound = f"> {low}" if low_open else f">= {low}"
            if high is not None:
                bound += f" and <= {high}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value
    return parse


def comma_list(kind):
    """An argparse type: 'a,b,c' as a list of `kind`, empty items left out ('' is no item)."""
    def parse(text):
        try:
            return [kind(item) for item in text.split(",") if item.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {kind.__name__} values separated by commas, got {text!r}") from None
    return parse


def hidden_sizes(text):
    """An argparse type: positive layer widths separated by commas, e.g. 512,256,128."""
    try:
        sizes = tuple(int(size) for size in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"expected positive integers separated by commas, got {text!r}")
    return sizes


def build_parser(description):
    """Every option of mlp_ddp.py, in the order --help shows them."""
    parser = OneLineParser(description=description,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--mode", choices=MODES, default="manual",
        help="how gradients are synchronised (ddp-no-sync: not at all, the compute baseline "
             "for benchmarks; sharded: ZeRO, see --shard)")
    add("--sync", choices=STRATEGY_NAMES, default="bucketed",
        help="--mode manual: how gradients are grouped and when they are sent: naive (the "
             "lesson's average_gradients: the library's all-reduce per tensor, called directly, "
             "so neither timed nor compressed), per-param (one all-reduce per tensor after "
             "backward), flat (one of a packed buffer after backward), bucketed (buckets "
             "during backward, as DDP)")
    add("--transport", choices=TRANSPORT_NAMES, default=None,
        help="what carries the bytes, in modes manual, ddp and sharded: library (gloo's or "
             "NCCL's collectives), ring (the hand-written ring of point-to-point messages), shm "
             "(shared memory, the ranks of one host; CPU tensors); auto, the default: library "
             "for manual and ddp, and for sharded shm where every rank shares this host on gloo, "
             "else library")
    add("--shard", choices=LEVELS, default=None,
        help="what --mode sharded splits over the ranks: optimizer (ZeRO-1: its state), "
             "gradients (ZeRO-2: and the gradients), parameters (ZeRO-3 / FSDP: and the "
             "parameters, each layer gathered when used; the default)")
    add("--compute-dtype", choices=tuple(DTYPES), default=None,
        help="--shard parameters: gather, compute and reduce-scatter in this dtype, the "
             "optimizer's shards staying float32 (default fp32)")
    add("--no-prefetch", dest="prefetch", action="store_false", default=None,
        help="--shard parameters: gather each layer only when it is needed, not the next one "
             "early")
    add("--bucket-mb", type=bounded(float, 0, low_open=True), default=DEFAULT_BUCKET_MB,
        help="bucket size (bucketed, DDP's, and --shard gradients')")
    add("--compress", choices=("none", *SIXTEEN_BIT), default="none",
        help="gradient dtype on the wire")
    add("--amp", choices=("none", *SIXTEEN_BIT), default="none",
        help="mixed precision: autocast (fp16 with loss scaling)")
    add("--accum-steps", type=bounded(int, 1), default=1,
        help="micro-batches per optimizer step (no_sync on all but the last)")
    add("--model", choices=("mlp", "cnn"), default="mlp")
    add("--hidden-sizes", type=hidden_sizes, default=(512, 256, 128),
        help="MLP hidden layer widths, e.g. 512,256,128")
    add("--dropout", type=bounded(float, 0, 0.99), default=None,
        help="every dropout layer's rate (default: the model's own)")
    add("--dataset", choices=tuple(DATASETS), default="mnist")
    add("--data-dir", default="data", help="where the dataset is kept (fetched if missing)")
    add("--offline-data-dir", default=os.environ.get("OFFLINE_DATA_DIR"),
        help="read-only folder with <Dataset>/raw/*.gz to copy from instead of downloading "
             "(env OFFLINE_DATA_DIR)")
    add("--train-samples", type=bounded(int, 0), default=0,
        help="use only this many training samples (0: all)")
    add("--val-samples", type=bounded(int, 0), default=5000,
        help="held out of the training split for validation")
    add("--test-samples", type=bounded(int, 0), default=0,
        help="use only this many test samples (0: all)")
    add("--epochs", type=bounded(int, 1), default=5,
        help="5 with the one-cycle defaults passes 98%% test accuracy with the MLP (StepLR: "
             "--lr-schedule step --lr 1e-3 --epochs 15)")
    add("--batch-size", type=bounded(int, 1), default=64,
        help="per process; the global batch is this x world size")
    add("--max-steps", type=bounded(int, 0), default=0,
        help="stop each epoch after this many steps (0: whole epoch)")
    add("--optimizer", choices=("adam", "sgd"), default="adam")
    add("--lr", type=bounded(float, 0, low_open=True), default=3e-3,
        help="the peak of the one-cycle schedule, or StepLR's starting rate")
    add("--momentum", type=bounded(float, 0, 1), default=0.9, help="SGD momentum")
    add("--lr-schedule", choices=SCHEDULES, default="onecycle",
        help="onecycle: warm-up to --lr over the first quarter of the run, then cosine decay, "
             "per step; step: StepLR per epoch (--lr-step, --lr-gamma)")
    add("--lr-step", type=bounded(int, 0), default=5,
        help="StepLR: decay every this many epochs (0: constant)")
    add("--lr-gamma", type=bounded(float, 0, 1, low_open=True), default=0.3,
        help="StepLR decay factor")
    add("--seed", type=bounded(int, 0), default=0)
    add("--warmup-steps", type=bounded(int, 0), default=5,
        help="first steps left out of the timing statistics")
    add("--world-size", type=bounded(int, 1), default=None,
        help="start this many local processes (not under torchrun/srun)")
    add("--device", choices=DEVICES, default="auto",
        help="where every rank computes: auto = cuda if torch sees a GPU, else cpu; cuda with "
             "more local ranks than GPUs shares them over gloo (runtime/device.py)")
    add("--backend", choices=("auto", "gloo", "nccl"), default="auto",
        help="auto: NCCL when each local rank has a GPU of its own, else gloo")
    add("--timeout", type=bounded(float, 0, low_open=True), default=120.0,
        help="seconds a collective may wait for a peer")
    add("--check-sync-every", type=bounded(int, 0), default=None, metavar="N",
        help="compare a fingerprint of every rank's parameters every N steps and at the end, "
             "stopping at the first that differs (0: never; default 100 in modes manual and "
             "sharded, else 0)")
    add("--hang-timeout", type=bounded(float, 0), default=30.0,
        help="seconds a collective may be in flight before the rank stops, naming the line "
             "each rank waits at and where the ranks part ways (0: never; "
             "runtime/hang_verdict.py)")
    add("--threads", type=bounded(int, 0), default=0,
        help="torch threads per rank (0: cores / local ranks)")
    add("--master-port", type=bounded(int, 1, 65535), default=None,
        help="port for a local launch (default: a free one)")
    emulated_network.add_options(parser)  # --emulate-link RATE, --ranks-per-node K
    add("--results-dir", default="results")
    add("--run-name", default=None,
        help="results file name (default: model-dataset-mode[-sync or -shard][-transport]-wN-"
             "time, the transport if one other than auto is given)")
    add("--save-model", default=None, metavar="PATH",
        help="rank 0 saves the final state_dict here")
    add("--checkpoint-dir", default=None, help="rank 0 saves a checkpoint here after every epoch")
    add("--checkpoint-every", type=bounded(int, 0), default=0,
        help="also every this many steps (0: epochs only)")
    add("--keep-checkpoints", type=bounded(int, 1), default=3,
        help="how many of the newest checkpoints to keep")
    add("--resume", action="store_true",
        help="continue from the newest valid checkpoint in --checkpoint-dir, if any")
    add("--progress-every", type=bounded(float, 0, low_open=True), default=10.0,
        help="seconds between progress lines")
    add("--trace", default=None, metavar="PATH",
        help="write a Chrome-trace timeline of --trace-steps steps")
    add("--trace-steps", type=bounded(int, 1), default=20,
        help="steps after the warm-up shown in the trace")
    add("--tensorboard", default=None, metavar="DIR",
        help="also log scalars for TensorBoard (needs the tensorboard package)")
    # Fault injection for the tests (runtime/faults.py), hidden from --help.
    add("--debug-exit-rank", type=bounded(int, 0), default=0, help=argparse.SUPPRESS)
    add("--debug-exit-step", type=bounded(int, 0), default=None, help=argparse.SUPPRESS)
    add("--debug-slow-rank", type=bounded(int, 0), default=None, help=argparse.SUPPRESS)
    add("--debug-skip-all-reduce", type=bounded(int, 1), default=None, help=argparse.SUPPRESS)
    add("--debug-unsynced-parameter", default=None, help=argparse.SUPPRESS)
    return parser


def manual_arguments(configuration):
    """mlp_ddp.py's arguments for a name of MANUAL_CONFIGURATIONS."""
    sync, transport = MANUAL_CONFIGURATIONS[configuration]
    return ["--mode", "manual", "--sync", sync, "--transport", transport]


def configuration_name(sync, transport):
    """The name of MANUAL_CONFIGURATIONS for (--sync, --transport), auto read as the library;
    "sync over transport" for a pair without one."""
    transport = "library" if transport in (None, "auto") else transport
    names = {pair: name for name, pair in MANUAL_CONFIGURATIONS.items()}
    return names.get((sync, transport), f"{sync} over {transport}")


def parse_args(argv=None, description=None):
    """The options, checked together and against the file system before any training."""
    parser = build_parser(description)
    argv = sys.argv[1:] if argv is None else argv
    refuse_replaced_spellings(parser, argv)
    args = parser.parse_args(argv)
    args.compress = None if args.compress == "none" else args.compress
    args.amp = None if args.amp == "none" else args.amp
    if args.check_sync_every is None:
        args.check_sync_every = 100 if args.mode in ("manual", "sharded") else 0
    if args.mode == "single" and (args.world_size or 1) > 1:
        parser.error("--mode single runs one process; use --mode ddp or manual with "
                     "--world-size > 1")
    if args.emulate_link and (args.world_size or 1) < 2:
        parser.error("--emulate-link is for a local launch of --world-size 2 or more")
    emulated_network.check_options(parser, args)
    check_transport(parser, args)
    check_sharding(parser, args)
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


def refuse_replaced_spellings(parser, argv):
    """One line naming the new spelling for an option that --transport replaced."""
    for index, token in enumerate(argv):
        option, equals, value = str(token).partition("=")
        if not equals and index + 1 < len(argv):
            value = str(argv[index + 1])
        for (old, old_value), new in REPLACED.items():
            if option == old and old_value in (None, value):
                spelled = f"{old} {old_value}" if old_value else old
                parser.error(f"{spelled} has been replaced: use {new}")


def check_transport(parser, args):
    """--transport only where ranks communicate (default auto there, None elsewhere), and not
    with --sync naive, which calls the library's all-reduce itself."""
    if args.mode not in COMMUNICATING:
        if args.transport is not None:
            parser.error(f"--transport applies to modes {', '.join(COMMUNICATING)}, not "
                         f"--mode {args.mode}")
        return
    args.transport = args.transport or "auto"
    if args.mode == "manual" and args.sync == "naive":
        if args.transport not in ("auto", "library"):
            parser.error(f"--sync naive calls the library's all-reduce itself: --transport "
                         f"{args.transport} needs --sync per-param, flat or bucketed")
        if args.compress:
            parser.error("--sync naive calls the library's all-reduce itself, which --compress "
                         "cannot wrap: use --sync per-param, flat or bucketed")


def check_sharding(parser, args):
    """The sharding options: only with --mode sharded, the parameters level's only with it, and
    what sharding cannot be combined with. Sets the defaults of those that apply (the others stay
    None, so that a run's config says which applied)."""
    given = [option for option, value in (("--shard", args.shard),
                                          ("--compute-dtype", args.compute_dtype),
                                          ("--no-prefetch", args.prefetch))
             if value is not None]
    if args.mode != "sharded":
        if given:
            parser.error(f"{given[0]} applies to --mode sharded")
        return
    if args.compress:
        parser.error("--compress is for all-reduces, not --mode sharded (16-bit collectives: "
                     "--shard parameters --compute-dtype bf16)")
    if args.amp == "fp16":
        parser.error("--amp fp16 is refused with --mode sharded: the loss scaler's inf check "
                     "would see only this rank's shard of the gradients, so ranks could disagree "
                     "on skipping a step (use --amp bf16, or --compute-dtype bf16)")
    args.shard = args.shard or "parameters"
    if args.shard != "parameters":
        for option in ("--compute-dtype", "--no-prefetch"):
            if option in given:
                parser.error(f"{option} applies to --shard parameters (ZeRO-3), not --shard "
                             f"{args.shard}")
        return
    args.compute_dtype = args.compute_dtype or "fp32"
    args.prefetch = args.prefetch is not False


def writable(folder):
    """Whether files can be created in `folder` (made if missing)."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False
