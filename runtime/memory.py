"""What a rank holds: the bytes of its parameters, gradients and optimizer state, counted from the
storage of the tensors themselves, and the process's peak resident memory as a cross-check.

Counted at two moments. Just before the optimizer step (a pre-step hook), after the gradients are
averaged, where all three exist at once: `parameters`, `gradients`, `optimizer_state`. And, for
the high-water mark `model_states_peak`, as each collective starts besides: where ZeRO-3 holds a
unit gathered whole with its gradients (and the next unit's gather in flight, prefetched), which
it frees before the step. A storage is counted once however many tensors view it (ZeRO-1's
parameters and its shards are views of one flat buffer). Communication buffers (DDP's buckets, a
collective's flat copy of its input) and activations are not model state: only the peak RSS sees
them.
"""
import resource

import torch

CATEGORIES = ("parameters", "gradients", "optimizer_state")


def storage_bytes(tensors):
    """The bytes of the distinct storages behind `tensors` (a storage shared by views counts once;
    an empty one, as a freed ZeRO-3 parameter's, counts nothing)."""
    seen = {}
    for tensor in tensors:
        if hasattr(tensor, "to_local"):  # a DTensor (fully_shard's): this rank's shard
            tensor = tensor.to_local()
        storage = tensor.untyped_storage()
        if storage.nbytes():
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_parameters(optimizer):
    return [param for group in optimizer.param_groups for param in group["params"]]


def held_bytes(model, optimizer):
    """{category: bytes} of CATEGORIES this rank holds now, for `model` (a runtime WrappedModel)
    and `optimizer` (a torch optimizer, manual_sharding.ShardedOptimizer or torch's
    ZeroRedundancyOptimizer)."""
    in_step_parameters, in_step_gradients = model.held_during_step()
    params = list(model.parameters()) + optimizer_parameters(optimizer) + in_step_parameters
    grads = [param.grad for param in params if param.grad is not None] + in_step_gradients
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's keeps the state
    state = [value for values in inner.state.values() for value in values.values()
             if torch.is_tensor(value) and value.dim() > 0]  # not the step counters
    return {"parameters": storage_bytes(params), "gradients": storage_bytes(grads),
            "optimizer_state": storage_bytes(state)}


def peak_resident_bytes():
    """The most resident memory this process has held so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MemoryWatch:
    """Counts held_bytes before the first COUNTED_STEPS optimizer steps and, given the run's
    timing.CommRecorder, as each of their collectives starts; then no more (a step's model states
    do not change after the first: the optimizer state has its full size from then on, and the
    timed steps pay nothing). `record()` gives the largest seen per category before the step, their
    sum, the largest sum at any moment counted (model_states_peak) and the peak RSS."""

    COUNTED_STEPS = 2

    def __init__(self, model, optimizer, recorder=None):
        self.model = model
        self.optimizer = optimizer
        self.largest = dict.fromkeys(CATEGORIES, 0)
        self.peak = 0
        self.counted = 0
        self.recorder = recorder
        if recorder is not None:
            recorder.at_start.append(self.count_peak)
        inner = getattr(optimizer, "optimizer", optimizer)  # ShardedOptimizer's torch optimizer
        self.hook = inner.register_step_pre_hook(self.count)

    def count_peak(self):
        held = held_bytes(self.model, self.optimizer)
        self.peak = max(self.peak, sum(held.values()))
        return held

    def count(self, *_):
        for category, nbytes in self.count_peak().items():
            self.largest[category] = max(self.largest[category], nbytes)
        self.counted += 1
        if self.counted == self.COUNTED_STEPS:
            self.hook.remove()
            if self.recorder is not None:
                self.recorder.at_start.remove(self.count_peak)

    def record(self):
        held = dict(self.largest)
        held["model_states"] = sum(held[category] for category in CATEGORIES)
        held["model_states_peak"] = self.peak
        held["peak_rss"] = peak_resident_bytes()
        return held
