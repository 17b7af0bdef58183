"""`ManualDDP`: the hand-written strategies of manual_allreduce.py behind the interface of torch's
DistributedDataParallel, so the training loop cannot tell the two apart.

The lesson is manual_allreduce.py; this module adds what a wrapper around a real model needs:
buffers kept equal across ranks, gradient accumulation (`no_sync()`), parameters that a step
does not use, and the errors DDP raises where a training loop misuses it.
"""
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves

from manual_allreduce import (
    DEFAULT_BUCKET_MB,
    BucketedSync,
    FlatSync,
    PerParameterSync,
    RingSync,
    SharedMemorySync,
    broadcast_parameters,
)

AFTER_BACKWARD = {"per-param": PerParameterSync, "flat": FlatSync, "ring": RingSync,
                  "shm": SharedMemorySync}


def make_sync(strategy, params, bucket_mb=DEFAULT_BUCKET_MB, compress=None, recorder=None):
    """The strategy named `strategy` (one of manual_allreduce.STRATEGIES) for `params`."""
    if strategy == "bucketed":
        return BucketedSync(params, bucket_mb, compress, recorder)
    return AFTER_BACKWARD[strategy](params, compress, recorder)


def trainable_parameters(module):
    """The parameters to synchronise: a tied (shared) one listed once, frozen ones left alone."""
    return [param for param in module.parameters() if param.requires_grad]


def parameters_reached(output):
    """The leaf tensors a backward from `output` will reach: a walk of the autograd graph, as DDP
    does after forward with find_unused_parameters=True (a parameter not reached gets no
    gradient in this step)."""
    tensors = [leaf for leaf in tree_leaves(output) if isinstance(leaf, torch.Tensor)]
    stack = [tensor.grad_fn for tensor in tensors if tensor.grad_fn is not None]
    seen = set()
    reached = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # an AccumulateGrad node: it writes a leaf's .grad
            reached.add(node.variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return reached


class ManualDDP(nn.Module):
    """`ManualDDP(model, "bucketed")` where code says `DistributedDataParallel(model)`, with DDP's
    keyword arguments, defaults and semantics.

    The constructor broadcasts rank 0's parameters and buffers; with `broadcast_buffers` (the
    default) `forward` broadcasts rank 0's buffers again before each forward that follows a
    training forward, so BatchNorm statistics stay equal across ranks. `no_sync()` skips
    communication for gradient accumulation. The training loop calls
    `finish_gradient_synchronization()` after backward and before the optimizer step. As in DDP:
      - every backward outside no_sync() is averaged: a second forward and backward before
        finishing first completes the previous one, so both backwards' averaged gradients add up;
      - a gradient reported twice between two forwards is an error;
      - a parameter that gets no gradient is an error, unless `find_unused_parameters=True`: then
        each forward walks the autograd graph, unreached parameters send zeros at once (their
        buckets are not held back), and one parameter unused on every rank keeps `.grad is None`.
    """

    def __init__(self, module, strategy="bucketed", bucket_mb=DEFAULT_BUCKET_MB, compress=None,
                 recorder=None, broadcast_buffers=True, find_unused_parameters=False):
        super().__init__()
        self.module = module
        broadcast_parameters(module)
        params = trainable_parameters(module)
        self.names = {param: name for name, param in module.named_parameters()}
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_buffer_sync = True  # as DDP: a forward after a training forward broadcasts
        self.ready = set()  # parameters whose gradient arrived since the last forward
        self.unused = set()  # parameters this forward's graph does not reach (find_unused)
        # Registered before the strategy's own hooks, so a second gradient is refused first.
        for param in params:
            param.register_post_accumulate_grad_hook(self._grad_ready)
        self.sync = make_sync(strategy, params, bucket_mb, compress, recorder)

    def _grad_ready(self, param):
        """Autograd's hook: note `param`'s gradient, refusing a second one before a forward."""
        if self.sync.accumulating:
            return
        if param in self.ready or param in self.unused:
            raise RuntimeError("Expected to mark a variable ready only once: parameter "
                               f"'{self.names[param]}' got a second gradient in this backward "
                               "(a second backward needs a new forward)")
        self.ready.add(param)

    def forward(self, *args, **kwargs):
        """The module's forward, after finishing a pending backward and broadcasting buffers."""
        syncing = torch.is_grad_enabled() and not self.sync.accumulating
        if syncing and (self.ready or self.unused):
            self._finish_backward()  # a second forward and backward before finishing
        # BEGIN PROMPT
        # With broadcast_buffers, where require_buffer_sync says so: rank 0's buffers to every rank.
        # END PROMPT
        # BEGIN SOLUTION Task 3: the buffers' broadcast
        if self.broadcast_buffers and self.require_buffer_sync:
            with torch.no_grad():
                for buffer in self.module.buffers():
                    dist.broadcast(buffer, 0)
        # END SOLUTION
        output = self.module(*args, **kwargs)
        self.require_buffer_sync = syncing
        if syncing and self.find_unused_parameters:
            reached = parameters_reached(output)
            unused = [param for param in self.sync.params if param not in reached]
            self.unused = set(unused)
            if isinstance(self.sync, BucketedSync):  # they send zeros: count them ready now
                for param in unused:
                    self.sync.grad_ready(param)
        return output

    @contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate local gradients, as DDP's `no_sync()`."""
        # BEGIN PROMPT
        # Set the strategy's `accumulating` flag for the block's duration, even if it raises.
        # END PROMPT
        # BEGIN SOLUTION Task 3: no_sync
        self.sync.accumulating = True
        try:
            yield
        finally:
            self.sync.accumulating = False
        # END SOLUTION

    def finish_gradient_synchronization(self):
        """After backward, before the optimizer step: every gradient averaged over the ranks."""
        if self.ready or self.unused:
            self._finish_backward()

    def wire_overflowed(self):
        """Whether a gradient overflowed float16 on the wire since the last call (a host sync:
        call it per step only where no loss scaler would catch the inf)."""
        overflowed = bool(self.sync.overflowed)
        self.sync.overflowed.zero_()
        return overflowed

    def _finish_backward(self):
        """Average the gradients of the backward(s) since the last forward; the next backward
        starts afresh."""
        missing = [param for param in self.sync.params
                   if param not in self.ready and param not in self.unused]
        if missing and not self.find_unused_parameters:
            names = ", ".join(self.names[param] for param in missing)
            raise RuntimeError(f"parameters that received no gradient in this step: {names}. "
                               "If your model leaves parameters unused in forward, pass "
                               "find_unused_parameters=True to ManualDDP (as to "
                               "DistributedDataParallel)")
        unused_everywhere = []
        if self.find_unused_parameters:
            unused_everywhere = self._unused_on_every_rank(missing)
        self.sync.finish()
        # No rank computed a gradient for these: leave them None, so no optimizer moves them.
        for param in unused_everywhere:
            if param in self.sync.zero_filled:
                param.grad = None
        self.sync.zero_filled.clear()
        self.ready = set()
        self.unused = set()

    def _unused_on_every_rank(self, missing):
        """The parameters no rank used in this step: one flag per parameter, summed over ranks."""
        locally_unused = set(missing) | self.unused
        flags = [param not in locally_unused for param in self.sync.params]
        used = torch.tensor(flags, dtype=torch.int32, device=self.sync.params[0].device)
        dist.all_reduce(used)
        return [param for param, count in zip(self.sync.params, used.tolist()) if count == 0]
