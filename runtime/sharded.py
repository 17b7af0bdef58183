"""`--shard`: manual_sharding.py's three levels behind the training loop's interface.

The wrappers of runtime/wrappers.py keep a whole model on every rank; these keep 1/n of it:
  optimizer    ZeRO-1: manual_sharding.ShardedOptimizer, each rank stepping its shard
  gradients    ZeRO-2: the same, each bucket's gradients reduce-scattered in backward and freed
  parameters   ZeRO-3 / FSDP: manual_sharding.FullyShardedModel, each layer gathered when used
Each is a runtime.wrappers.WrappedModel. What a run needs besides the lesson is here: the
library's collectives (or the lesson's ring) with the timing layer around them, each named in the
trace by the shard it carries; an optimizer that torch's learning-rate schedulers accept; and the
model and optimizer state gathered whole for a checkpoint (collectives: every rank takes part), so
that it loads at any world size (with the same --shard: the optimizer's state is per flat shard,
not per parameter). no_sync() changes nothing here: ZeRO-1 averages only in
`finish_gradient_synchronization()` anyway, and ZeRO-2 and ZeRO-3 average each backward into the
shards' gradients, which add up.
"""
import threading
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch import nn

from manual_allreduce import broadcast_parameters
from manual_sharding import (
    FullyShardedModel,
    ShardedOptimizer,
    all_gather_by_ring,
    reduce_scatter_by_ring,
)
from runtime.timing import timed
from runtime.wrappers import WrappedModel

COMPUTE_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}  # --compute-dtype


# --- The collectives: (output, input) in, a future out, as manual_sharding calls them ------------
def reduce_scatter(output, tensor):
    """The library's reduce-scatter (gloo or NCCL), started without waiting."""
    return future_of(dist.reduce_scatter_single(output, tensor, async_op=True), output)


def all_gather(output, shard):
    """The library's all-gather, started without waiting."""
    return dist.all_gather_single(output, shard, async_op=True).get_future()


def future_of(work, result):
    """A future completed with `result` when the library's `work` is: gloo's reduce-scatter offers
    none of its own, so a thread waits for it (and completes the future as it ends)."""
    try:
        return work.get_future()
    except RuntimeError:
        pass
    future = torch.futures.Future()

    def wait():
        try:
            work.wait()
            future.set_result(result)
        except Exception as error:  # noqa: BLE001 - the collective's error, raised where waited
            future.set_exception(error)

    threading.Thread(target=wait, daemon=True).start()
    return future


COLLECTIVES = {"library": (reduce_scatter, all_gather),
               "ring": (reduce_scatter_by_ring, all_gather_by_ring)}  # --collectives


def collectives(name="library", recorder=None, message="bucket", layers=()):
    """{"reduce_scatter": ..., "all_gather": ...} for --collectives `name`, inside `layers`
    (functions that take a collective and return one doing more around it, the first innermost)
    and, given a `recorder`, the timing layer outermost: messages named `message` and numbered in
    the order sent, unless labelled (`labelled`)."""
    made = {}
    for kind, collective in zip(("reduce-scatter", "all-gather"), COLLECTIVES[name]):
        for layer in layers:
            collective = layer(collective)
        if recorder is not None:
            collective = timed(collective, recorder, kind, message)
        made[kind.replace("-", "_")] = collective
    return made


def labelled(recorder, label):
    """A context in which the collectives are named as sending `label` in the trace."""
    return recorder.labelled(label) if recorder is not None else nullcontext()


# --- The optimizer state, gathered whole for a checkpoint and cut again -------------------------
def gather_state(shards, state_dict, all_gather_shard):
    """`state_dict` (an optimizer's, over one tensor per FlatShard) with every per-element tensor
    gathered whole and cut to the shard's real length, so it loads at any world size."""
    full = {"param_groups": state_dict["param_groups"], "state": {}}
    for index, values in state_dict["state"].items():
        shard = shards[index]
        full["state"][index] = {}
        for key, value in values.items():
            if torch.is_tensor(value) and value.dim() == 1 and value.numel() == shard.shard_numel:
                whole = value.new_empty(shard.padded_numel)
                all_gather_shard(whole, value.contiguous()).wait()
                value = whole[:shard.numel].clone()
            full["state"][index][key] = value
    return full


def scatter_state(shards, full):
    """gather_state's inverse on one rank: each per-element tensor padded and cut to this rank's
    shard."""
    local = {"param_groups": full["param_groups"], "state": {}}
    for index, values in full["state"].items():
        shard = shards[int(index)]
        local["state"][int(index)] = {
            key: shard.own(torch.nn.functional.pad(value, (0, shard.padded_numel - shard.numel)))
            .clone() if torch.is_tensor(value) and value.dim() == 1 and value.numel() == shard.numel
            else value
            for key, value in values.items()}
    return local


# --- ZeRO-1 and ZeRO-2 ----------------------------------------------------------------------------
class TorchShardedOptimizer(ShardedOptimizer, torch.optim.Optimizer):
    """manual_sharding.ShardedOptimizer as torch's optimizers are seen from outside: a
    torch.optim.Optimizer (learning-rate schedulers take only those) with the inner optimizer's
    groups, defaults and state, and a state_dict() gathered whole (a collective: every rank calls
    it), keyed as the inner optimizer's, which loads at any world size. `recorder`: the timing
    layer's, which names each reduce-scatter by its bucket."""

    def __init__(self, params, optimizer_class, recorder=None, **options):
        self.recorder = recorder
        super().__init__(params, optimizer_class, **options)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def defaults(self):
        return self.optimizer.defaults

    @property
    def state(self):
        return self.optimizer.state

    def start_reduce_scatter(self, index, grad_flat):
        with labelled(self.recorder, f"bucket {index}"):
            super().start_reduce_scatter(index, grad_flat)

    def state_dict(self):
        with labelled(self.recorder, "state"):
            return gather_state(self.shards, self.optimizer.state_dict(), self.all_gather)

    def load_state_dict(self, full):
        """Keep this rank's shard of `state_dict()`'s whole state."""
        self.optimizer.load_state_dict(scatter_state(self.shards, full))


class ShardedOptimizerModel(WrappedModel, nn.Module):
    """ZeRO-1 (`shard_gradients=False`) or ZeRO-2: the whole model on every rank, its optimizer a
    ShardedOptimizer that the sync phase asks to average the gradients into the shards."""

    def __init__(self, module, shard_gradients, bucket_mb, collectives, recorder=None):
        super().__init__()
        self.module = module
        broadcast_parameters(module)  # the shards must start from the same model
        self.recorder = recorder
        self.options = dict(shard_gradients=shard_gradients, bucket_mb=bucket_mb, **collectives)
        self.optimizer = None

    def make_optimizer(self, optimizer_class, **kwargs):
        self.optimizer = TorchShardedOptimizer(self.module.parameters(), optimizer_class,
                                               self.recorder, **self.options, **kwargs)
        return self.optimizer

    def finish_gradient_synchronization(self):
        self.optimizer.reduce_gradients()

    def optimizer_layout(self):
        level = "gradients" if self.options["shard_gradients"] else "optimizer"
        return layout(level, self.optimizer.shards)


# --- ZeRO-3 ---------------------------------------------------------------------------------------
class FullyShardedTraining(FullyShardedModel, WrappedModel):
    """ZeRO-3: manual_sharding.FullyShardedModel started from rank 0's parameters, with the
    optimizer built over its shards, the whole model and optimizer state gathered for checkpoints
    and each collective named by its unit in the trace."""

    def __init__(self, module, compute_dtype=None, prefetch=True, recorder=None, **collectives):
        broadcast_parameters(module)  # before the shards are cut from it
        self.recorder = recorder
        super().__init__(module, compute_dtype=compute_dtype, prefetch=prefetch, **collectives)

    def start_gather(self, index, dtype=None):
        with labelled(self.recorder, f"unit {index}"):
            super().start_gather(index, dtype)

    def scatter_gradients(self, index):
        with labelled(self.recorder, f"unit {index}"):
            super().scatter_gradients(index)

    def make_optimizer(self, optimizer_class, **kwargs):
        return optimizer_class(self.sharded_parameters(), **kwargs)

    @contextmanager
    def whole(self):
        """Every parameter gathered whole in float32 inside the block (a collective: every rank
        enters it)."""
        for index in range(len(self.units)):
            self.gather(index, torch.float32)
        try:
            yield self.module
        finally:
            for index in range(len(self.units)):
                self.free(index)

    @contextmanager
    def replicated(self):
        with self.whole() as module:
            yield list(module.named_parameters())

    def full_state_dict(self):
        """The whole model's state_dict in float32, on every rank (a collective)."""
        with self.whole() as module:
            return {key: value.clone() for key, value in module.state_dict().items()}

    def load_full_state_dict(self, state):
        """Take each unit's shard of a full state_dict (full_state_dict's)."""
        names = {param: name for name, param in self.module.named_parameters()}
        with torch.no_grad():
            for shard, master in zip(self.shards, self.masters):
                values = [state[names[param]] for param in shard.params]
                master.copy_(shard.own(shard.flatten(values, torch.float32)))
            own_state = self.module.state_dict()
            for name, value in state.items():  # buffers and frozen parameters, whole everywhere
                if name in own_state and own_state[name].numel():
                    own_state[name].copy_(value)

    def optimizer_state_dict(self, optimizer):
        """`optimizer`'s state (an optimizer over sharded_parameters()) gathered whole: loads at any
        world size."""
        with labelled(self.recorder, "state"):
            return gather_state(self.shards, optimizer.state_dict(), self.all_gather)

    def load_optimizer_state_dict(self, optimizer, full):
        optimizer.load_state_dict(scatter_state(self.shards, full))

    def optimizer_layout(self):
        return layout("parameters", self.shards)


def layout(level, shards):
    """A checkpoint's optimizer state fits a run with the same level and the same flat shards
    (ZeRO-2's buckets follow --bucket-mb), at any world size."""
    return f"flat shards of {[shard.numel for shard in shards]} elements (--shard {level})"


def wrap_sharded(module, level, bucket_mb, compute_dtype="fp32", prefetch=True,
                 collective_name="library", recorder=None, layers=()):
    """`module` wrapped for --shard `level`; `recorder` times every collective, inside which
    `layers` go (as collectives' `layers`)."""
    if level in ("optimizer", "gradients"):
        made = collectives(collective_name, recorder, "bucket", layers)
        return ShardedOptimizerModel(module, level == "gradients", bucket_mb, made, recorder)
    if level == "parameters":
        made = collectives(collective_name, recorder, "unit", layers)
        return FullyShardedTraining(module, COMPUTE_DTYPES[compute_dtype], prefetch, recorder,
                                    **made)
    raise ValueError(f"unknown --shard level {level!r}")

