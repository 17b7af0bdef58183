"""`--shard`: manual_sharding.py's three levels behind the training loop's interface.

The wrappers of runtime/wrappers.py keep a whole model on every rank; these keep 1/n of it:
  optimizer    ZeRO-1: manual_sharding.ShardedOptimizer, each rank stepping its shard
  gradients    ZeRO-2: the same, each bucket's gradients reduce-scattered in backward and freed
  parameters   ZeRO-3 / FSDP: manual_sharding.FullyShardedModel, each layer gathered when used
Each is a runtime.wrapped_model.WrappedModel. What a run needs besides the lesson is here: the
collectives of --transport (runtime/transports.py) with the timing layer around them, each named
in the trace by the shard it carries; an optimizer that torch's learning-rate schedulers accept;
and the model and optimizer state gathered whole for a checkpoint (collectives: every rank takes
part), so that it loads at any world size (with the same --shard: the optimizer's state is per
flat shard, not per parameter). no_sync() changes nothing here: ZeRO-1 averages only in
`finish_gradient_synchronization()` anyway, and ZeRO-2 and ZeRO-3 average each backward into the
shards' gradients, which add up.
"""
from contextlib import contextmanager, nullcontext
from functools import partial

import torch
from torch import nn
from torch.utils._pytree import tree_map

from manual_allreduce import broadcast_parameters
from manual_sharding import FullyShardedModel, ShardedOptimizer
from runtime import transports
from runtime.collective_record import recorded
from runtime.dtypes import DTYPES
from runtime.timing import timed
from runtime.wrapped_model import WrappedModel


def collectives(name="auto", recorder=None, message="bucket", layers=(), record=None):
    """{"reduce_scatter": ..., "all_gather": ...} of --transport `name` (runtime/transports.py),
    inside `layers` (functions that take a collective and return one doing more around it, the
    first innermost) and, given a `recorder`, the timing layer outermost: messages named
    `message` and numbered in the order sent, unless labelled (`labelled`). Given a `record`
    (collective_record.Recorder), each call is kept there, innermost; a ring's messages are kept
    by the launcher's interception instead, at the lesson's own lines. A collective: every rank
    calls it."""
    transport = transports.TRANSPORTS[transports.resolve(name, "sharded")]
    carried = transport.make()
    made = {}
    for kind, collective in (("reduce-scatter", carried.reduce_scatter),
                             ("all-gather", carried.all_gather)):
        if record is not None and transport.carrier != "point-to-point":
            collective = recorded(collective, record, kind.replace("-", "_"))
        for layer in layers:
            collective = layer(collective)
        if recorder is not None:
            collective = timed(collective, recorder, kind, message, transport.carrier)
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

    def held_during_step(self):
        return [], [output for _, _, output in self.optimizer.pending]  # gradient shards in flight

    def optimizer_layout(self):
        level = "gradients" if self.options["shard_gradients"] else "optimizer"
        return layout(level, self.optimizer.shards)


# --- ZeRO-3 ---------------------------------------------------------------------------------------
class FullyShardedTraining(FullyShardedModel, WrappedModel):
    """ZeRO-3: manual_sharding.FullyShardedModel started from rank 0's parameters, with the
    optimizer built over its shards, the whole model and optimizer state gathered for checkpoints
    and each collective named by its unit in the trace; `compute_dtype`: `computing_in`'s."""

    def __init__(self, module, compute_dtype=None, prefetch=True, recorder=None, **collectives):
        broadcast_parameters(module)  # before the shards are cut from it
        self.recorder = recorder
        super().__init__(module, prefetch=prefetch, **collectives)
        if compute_dtype is not None:
            computing_in(self, compute_dtype)

    def start_gather(self, index, dtype=None):
        with labelled(self.recorder, f"unit {index}"):
            super().start_gather(index, dtype)

    def scatter_gradients(self, index):
        with labelled(self.recorder, f"unit {index}"):
            super().scatter_gradients(index)

    def make_optimizer(self, optimizer_class, **kwargs):
        return optimizer_class(self.module.parameters(), **kwargs)

    def held_during_step(self):
        """The units' whole parameters (empty unless gathered, their .grad with them), gathers in
        flight, and gradient shards in flight."""
        whole = [param for shard in self.shards for param in shard.params]
        gathering = [each[1] for each in self.gathering if each is not None]  # (future, flat)
        return whole + gathering, [output for _, _, output in self.pending]

    @contextmanager
    def whole(self):
        """Every parameter gathered whole in float32, and shown in the module, inside the block (a
        collective: every rank enters it)."""
        for index in range(len(self.units)):
            self.gather(index, torch.float32)
            self.show(index, True)
        try:
            yield self.module
        finally:
            for index in range(len(self.units)):
                self.show(index, False)
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
        """Take each unit's shard of a full state_dict (full_state_dict's), and the rest whole."""
        pieces = {piece for unit in self.pieces for piece in unit}
        named = list(self.module.named_parameters(remove_duplicate=False))
        name_of = {}
        for name, piece in named:
            if piece in pieces:
                name_of.setdefault(piece, name)  # a tied piece by its first name, as saved
        with torch.no_grad():
            for shard, unit, master in zip(self.shards, self.pieces, self.masters):
                values = [state[name_of[piece]] for piece in unit]
                master.copy_(shard.own(shard.flatten(values, torch.float32)))
            sharded = {name for name, param in named if param in pieces}
            own_state = self.module.state_dict()
            for name, value in state.items():  # buffers and whole parameters, alike everywhere
                if name in own_state and name not in sharded:
                    own_state[name].copy_(value)

    def optimizer_state_dict(self, optimizer):
        """`optimizer`'s state (an optimizer over the model's parameters, the pieces) gathered
        whole per unit, as one flat tensor per state key, the padding cut: loads at any world
        size."""
        with labelled(self.recorder, "state"):
            state = optimizer.state
            full = {"param_groups": optimizer.state_dict()["param_groups"], "state": {}}
            for index, (shard, pieces) in enumerate(zip(self.shards, self.pieces)):
                values = [state.get(piece, {}) for piece in pieces]
                full["state"][index] = {}
                for key, value in values[0].items():
                    if torch.is_tensor(value) and value.dim():
                        mine = value.new_zeros(shard.shard_numel)
                        for view, each in zip(shard.pieces(mine), values):
                            view.copy_(each[key].reshape(-1))
                        whole = value.new_empty(shard.padded_numel)
                        self.all_gather(whole, mine).wait()
                        value = whole[:shard.numel].clone()
                    full["state"][index][key] = value
            return full

    def load_optimizer_state_dict(self, optimizer, full):
        """Keep this rank's pieces of optimizer_state_dict()'s whole state."""
        number = {param: position for position, param in enumerate(
            param for group in optimizer.param_groups for param in group["params"])}
        local = {}
        for index, values in full["state"].items():
            shard, pieces = self.shards[int(index)], self.pieces[int(index)]
            for piece in pieces:
                local[number[piece]] = {}
            for key, value in values.items():
                if torch.is_tensor(value) and value.dim() == 1 and value.numel() == shard.numel:
                    padded = torch.nn.functional.pad(value, (0, shard.padded_numel - shard.numel))
                    cut = [view.clone() for view in shard.pieces(shard.own(padded))]
                else:
                    cut = [value.clone() if torch.is_tensor(value) else value for _ in pieces]
                for piece, each in zip(pieces, cut):
                    local[number[piece]][key] = each
        optimizer.load_state_dict({"param_groups": full["param_groups"], "state": local})

    def optimizer_layout(self):
        return layout("parameters", self.shards)


def computing_in(model, dtype):
    """`model` (a FullyShardedModel) computing in `dtype` (float16, bfloat16), as fully_shard's
    MixedPrecisionPolicy: each unit gathered, computed and reduce-scattered in it, its inputs cast
    to it; shards and optimizer state stay float32, and so do the output and a layer outside every
    unit (one of frozen parameters only)."""
    model.compute_dtype = dtype
    in_units = {id(each) for modules in model.units for each in modules}
    for each in model.module.modules():
        if id(each) in in_units:  # after the unit's own hook, which gathers it
            each.register_forward_pre_hook(partial(cast_inputs, dtype), with_kwargs=True)
        elif any(True for _ in each.parameters(recurse=False)):
            each.register_forward_pre_hook(partial(cast_inputs, torch.float32), with_kwargs=True)
    model.register_forward_hook(lambda _model, _args, output: cast_floats(output, torch.float32))
    return model


def cast_inputs(dtype, module, args, kwargs):
    """A forward pre-hook's: the module's floating inputs cast to `dtype`."""
    return cast_floats((args, kwargs), dtype)


def cast_floats(value, dtype):
    """`value` with every floating tensor in it (in tuples, lists, dicts) cast to `dtype`."""
    return tree_map(lambda each: each.to(dtype) if torch.is_tensor(each)
                    and each.is_floating_point() else each, value)


def layout(level, shards):
    """A checkpoint's optimizer state fits a run with the same level and the same flat shards
    (ZeRO-2's buckets follow --bucket-mb), at any world size."""
    return f"flat shards of {[shard.numel for shard in shards]} elements (--shard {level})"


def wrap_sharded(module, level, bucket_mb, compute_dtype="fp32", prefetch=True,
                 transport="auto", recorder=None, layers=(), record=None):
    """`module` wrapped for --shard `level` over --transport `transport`; `recorder` times every
    collective, inside which `layers` go, and `record` keeps each (as collectives' `layers` and
    `record`)."""
    if level in ("optimizer", "gradients"):
        made = collectives(transport, recorder, "bucket", layers, record)
        return ShardedOptimizerModel(module, level == "gradients", bucket_mb, made, recorder)
    if level == "parameters":
        made = collectives(transport, recorder, "unit", layers, record)
        mixed = None if compute_dtype == "fp32" else DTYPES[compute_dtype]  # fp32: no casts
        return FullyShardedTraining(module, mixed, prefetch, recorder, **made)
    raise ValueError(f"unknown --shard level {level!r}")
