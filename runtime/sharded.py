"""`--shard`: manual_sharding.py's three levels behind the training loop's interface.

The wrappers of runtime/wrappers.py keep a whole model on every rank; these keep 1/n of it:
  optimizer    ZeRO-1: manual_sharding.ShardedOptimizer, each rank stepping its shard
  gradients    ZeRO-2: the same, each bucket's gradients reduce-scattered in backward and freed
  parameters   ZeRO-3 / FSDP: manual_sharding.FullyShardedModel, each layer gathered when used
Each has the wrappers' `forward`, `no_sync()` and `finish_gradient_synchronization()`, and besides:
  make_optimizer(optimizer_class, **kwargs)  the optimizer over what this rank owns
  full_state_dict()                          the whole model, gathered (a collective)
  optimizer_state_dict() / load_...          the optimizer's state gathered whole and cut again
  optimizer_layout()                         how that state is laid out: the level and its shards
so that a checkpoint holds the whole model and optimizer, and loads at any world size (with the
same --shard: the optimizer's state is per flat shard, not per parameter). No_sync()
changes nothing here: ZeRO-1 averages only in `finish_gradient_synchronization()` anyway, and
ZeRO-2 and ZeRO-3 average each backward into the shards' gradients, which add up.
"""
from contextlib import nullcontext

import torch
from torch import nn

from manual_allreduce import broadcast_parameters
from manual_sharding import FullyShardedModel, ShardedOptimizer

COMPUTE_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}  # --compute-dtype


class ShardedOptimizerModel(nn.Module):
    """ZeRO-1 (`shard_gradients=False`) or ZeRO-2: the whole model on every rank, its optimizer a
    ShardedOptimizer that the sync phase asks to average the gradients into the shards."""

    def __init__(self, module, shard_gradients, bucket_mb, collectives, layers):
        super().__init__()
        self.module = module
        broadcast_parameters(module)  # the shards must start from the same model
        self.options = dict(shard_gradients=shard_gradients, bucket_mb=bucket_mb,
                            collectives=collectives, layers=layers)
        self.optimizer = None

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def no_sync(self):
        return nullcontext()

    def make_optimizer(self, optimizer_class, **kwargs):
        self.optimizer = ShardedOptimizer(self.module.parameters(), optimizer_class,
                                          **self.options, **kwargs)
        return self.optimizer

    def finish_gradient_synchronization(self):
        self.optimizer.reduce_gradients()

    def full_state_dict(self):
        return self.module.state_dict()

    def load_full_state_dict(self, state):
        self.module.load_state_dict(state)

    def optimizer_state_dict(self, optimizer):
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer, state):
        optimizer.load_state_dict(state)

    def optimizer_layout(self):
        level = "gradients" if self.options["shard_gradients"] else "optimizer"
        return layout(level, self.optimizer.shards)


class FullyShardedTraining(FullyShardedModel):
    """ZeRO-3: manual_sharding.FullyShardedModel, with the optimizer built over its shards."""

    def __init__(self, module, compute_dtype, prefetch, collectives, layers):
        broadcast_parameters(module)  # before the shards are cut from it
        super().__init__(module, compute_dtype=compute_dtype, prefetch=prefetch,
                         collectives=collectives, layers=layers)

    def make_optimizer(self, optimizer_class, **kwargs):
        return optimizer_class(self.sharded_parameters(), **kwargs)

    def optimizer_layout(self):
        return layout("parameters", self.shards)


def layout(level, shards):
    """A checkpoint's optimizer state fits a run with the same level and the same flat shards
    (ZeRO-2's buckets follow --bucket-mb), at any world size."""
    return f"flat shards of {[shard.numel for shard in shards]} elements (--shard {level})"


def wrap_sharded(module, level, bucket_mb, compute_dtype="fp32", prefetch=True,
                 collectives="library", layers=()):
    """`module` wrapped for --shard `level`; `layers` go around every collective (timing)."""
    if level in ("optimizer", "gradients"):
        return ShardedOptimizerModel(module, level == "gradients", bucket_mb, collectives, layers)
    if level == "parameters":
        return FullyShardedTraining(module, COMPUTE_DTYPES[compute_dtype], prefetch, collectives,
                                    layers)
    raise ValueError(f"unknown --shard level {level!r}")
