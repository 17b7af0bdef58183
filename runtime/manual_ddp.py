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
    STRATEGIES,
    BucketedSync,
    FlatSync,
    broadcast_parameters,
    call_when_ready,
    trainable_parameters,
)
from runtime import transports
from runtime.collective_record import kept
from runtime.wrapped_model import WrappedModel


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


def build_strategy(params, strategy, bucket_mb=DEFAULT_BUCKET_MB, layers=(), transport="library"):
    """The strategy `strategy` (a name of the lesson's STRATEGIES, or a class with their
    constructor and methods) over `params`, given the all-reduce of --transport `transport`
    (runtime/transports.py; a collective for shm: every rank calls it) inside `layers`: functions
    that each take an all-reduce and return one doing more around it (compression, timing), the
    first innermost."""
    strategy_class = STRATEGIES[strategy] if isinstance(strategy, str) else strategy
    buffer_bytes = sum(param.numel() * param.element_size() for param in params)
    carried = transports.collectives(transport, "manual", buffer_bytes)
    collective = carried.all_reduce
    for layer in layers:
        collective = layer(collective)
    options = {"bucket_mb": bucket_mb} if issubclass(strategy_class, BucketedSync) else {}
    sync = strategy_class(params, collective, **options)
    # the flat buffer kept in this rank's slot, packing writing the slot; not a GPU's gradients
    if carried.shared is not None and isinstance(sync, FlatSync) and not params[0].is_cuda:
        sync.buffer = carried.shared.own_slot(sync.buffer.dtype, sync.buffer.numel())
    return sync


class ManualDDP(WrappedModel, nn.Module):
    """`ManualDDP(model, "bucketed")` where code says `DistributedDataParallel(model)`, with DDP's
    keyword arguments, defaults and semantics; `layers` go around the all-reduce of `transport`
    that the strategy sums with (manual_allreduce.compressed, runtime/timing.py's timed: see
    build_strategy).

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
    The strategy sees only what the lesson defines: `grad_ready(param)` once per parameter and
    step (every parameter holding a gradient by then), and `finish()`.
    """

    def __init__(self, module, strategy="bucketed", bucket_mb=DEFAULT_BUCKET_MB, layers=(),
                 broadcast_buffers=True, find_unused_parameters=False, transport="library"):
        super().__init__()
        self.module = module
        broadcast_parameters(module)
        self.params = trainable_parameters(module.parameters())
        self.names = {param: name for name, param in module.named_parameters()}
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.require_buffer_sync = True  # as DDP: a forward after a training forward broadcasts
        self.accumulating = False  # inside no_sync(): backward keeps its local gradients
        self.ready = set()  # parameters whose gradient arrived since the last forward
        self.unused = set()  # parameters this forward's graph does not reach (find_unused)
        self.zero_filled = set()  # parameters given zeros to send in this step
        self.sync = build_strategy(self.params, strategy, bucket_mb, layers, transport)
        call_when_ready(self.params, self._grad_ready)

    def _grad_ready(self, param):
        """Autograd's hook: pass `param`'s gradient on, refusing a second one before a forward."""
        if self.accumulating:
            return
        if param in self.ready or param in self.unused:
            raise RuntimeError("Expected to mark a variable ready only once: parameter "
                               f"'{self.names[param]}' got a second gradient in this backward "
                               "(a second backward needs a new forward)")
        self.ready.add(param)
        self.sync.grad_ready(param)

    def forward(self, *args, **kwargs):
        """The module's forward, after finishing a pending backward and broadcasting buffers."""
        syncing = torch.is_grad_enabled() and not self.accumulating
        if syncing and (self.ready or self.unused):
            self._finish_backward()  # a second forward and backward before finishing
        # BEGIN PROMPT
        # With broadcast_buffers, where require_buffer_sync says so: rank 0's buffers to every rank.
        # END PROMPT
        # BEGIN SOLUTION Task 8: the buffers' broadcast
        if self.broadcast_buffers and self.require_buffer_sync:
            with torch.no_grad():
                for buffer in self.module.buffers():
                    dist.broadcast(buffer, 0)
        # END SOLUTION
        output = self.module(*args, **kwargs)
        self.require_buffer_sync = syncing
        if syncing and self.find_unused_parameters:
            reached = parameters_reached(output)
            self.unused = {param for param in self.params if param not in reached}
            self._send_zeros([param for param in self.params if param in self.unused])
        return output

    @contextmanager
    def no_sync(self):
        """Backward passes inside only accumulate local gradients, as DDP's `no_sync()`."""
        # BEGIN PROMPT
        # Set `accumulating` for the block's duration, even if it raises.
        # END PROMPT
        # BEGIN SOLUTION Task 8: no_sync
        self.accumulating = True
        try:
            yield
        finally:
            self.accumulating = False
        # END SOLUTION

    def finish_gradient_synchronization(self):
        """After backward, before the optimizer step: every gradient averaged over the ranks."""
        if self.ready or self.unused:
            self._finish_backward()

    def _send_zeros(self, params):
        """Report `params` ready with a zero gradient where they have none (they took no part in
        this rank's backward), so that every rank sends the same tensors."""
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
                self.zero_filled.add(param)
            self.sync.grad_ready(param)

    def _finish_backward(self):
        """Average the gradients of the backward(s) since the last forward; the next backward
        starts afresh."""
        missing = [param for param in self.params
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
        self._send_zeros(missing)
        self.sync.finish()
        # No rank computed a gradient for these: leave them None, so no optimizer moves them.
        for param in unused_everywhere:
            if param in self.zero_filled:
                param.grad = None
        self.zero_filled.clear()
        self.ready = set()
        self.unused = set()

    def _unused_on_every_rank(self, missing):
        """The parameters no rank used in this step: one flag per parameter, summed over ranks."""
        locally_unused = set(missing) | self.unused
        flags = [param not in locally_unused for param in self.params]
        used = torch.tensor(flags, dtype=torch.int32, device=self.params[0].device)
        with kept("all_reduce", used):
            dist.all_reduce(used)
        return [param for param, count in zip(self.params, used.tolist()) if count == 0]
