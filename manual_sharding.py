"""Beyond data parallelism's copies: optimizer state, gradients and parameters sharded over the
ranks (ZeRO, Rajbhandari et al. 2020; torch's FSDP), written by hand, with torch's interfaces.

manual_allreduce.py keeps a whole model on every rank: with Adam in float32, 16 bytes per
parameter whatever the number of ranks n. Its ring all-reduce is a reduce-scatter (rank r then
holds the sum of chunk r) followed by an all-gather; ZeRO keeps the halves apart, each rank owning
one chunk between them:
  1. halves   `ring_reduce_scatter`, `ring_all_gather` from point-to-point messages
  2. shard    parameters end to end in one flat buffer, padded and cut in n: rank r owns shard r
  3. ZeRO-1   `ShardedOptimizer(params, optimizer_class, **defaults)`, ZeroRedundancyOptimizer's
              interface: gradients reduce-scattered, each rank steps its shard, all-gathered back
  4. ZeRO-2   `shard_gradients=True`: each bucket reduce-scattered as backward makes it, then freed
  5. ZeRO-3   `FullyShardedModel`, fully_shard's interface: the parameters too, each layer
              gathered just before its forward and its backward and freed after
Bytes sent per rank and step (P the parameter bytes): DDP 2P(n-1)/n; ZeRO-1 and 2 the same;
ZeRO-3 3P(n-1)/n (a second all-gather, for backward). runtime/sharded.py adds what a run needs:
the library's collectives, timed; mixed precision; state gathered for checkpoints.
"""
import itertools
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._pytree import tree_leaves

from manual_allreduce import DEFAULT_BUCKET_MB, bucket_layout, completed, trainable_parameters


# --- 1. The ring's two halves ------------------------------------------------------------------
def ring_reduce_scatter(output, tensor):
    """Chunk r of the sum over the ranks of `tensor` (n equal chunks) into rank r's `output`, as
    dist.reduce_scatter_single, around a ring (`tensor` is scratch): each chunk travels the ring
    once, summed on the way, ending on its owner: (n-1)/n of the tensor sent per rank."""
    # BEGIN PROMPT
    # When it returns, rank r's `output` holds chunk r (tensor.view(n, -1)[r]) of the sum over the
    # ranks, as dist.reduce_scatter_single gives, and it returns `output`. Only point-to-point
    # messages, no collective: each rank sends n-1 chunks, all to rank (r + 1) mod n.
    # HINTS outline
    # n-1 steps around the ring: send a chunk right, add the chunk that comes from the left into
    # the one you send next. Each partial sum gains one rank per step and ends whole on its owner.
    # HINTS steps
    # Chunk i is tensor.view(n, -1)[i]. At step s (0 to n-2) rank r sends chunk (r - s - 1) mod n
    # to rank (r + 1) mod n with dist.isend (no waiting yet), receives from rank (r - 1) mod n into
    # a scratch tensor of a chunk's size with dist.recv, waits for its send, and adds what came
    # into chunk (r - s - 2) mod n. Chunk r then holds the whole sum: copy it into output, and
    # return output.
    # END PROMPT
    # BEGIN SOLUTION Task 10: the ring reduce-scatter
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = tensor.view(world, -1)  # row r: chunk r
    incoming = torch.empty_like(chunks[0])
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        request = dist.isend(chunks[(rank - step - 1) % world], right)
        dist.recv(incoming, left)
        request.wait()
        chunks[(rank - step - 2) % world].add_(incoming)
    output.copy_(chunks[rank])
    return output
    # END SOLUTION


def ring_all_gather(output, shard):
    """Every rank's `shard` into chunk r of `output` on every rank, as dist.all_gather_single,
    around the ring: (n-1)/n of `output` sent per rank. `shard` may be `output`'s chunk r."""
    # BEGIN PROMPT
    # When it returns, chunk i of `output` (output.view(n, -1)[i]) holds rank i's `shard` on every
    # rank, as dist.all_gather_single gives, and it returns `output`; `shard` may already be
    # output's chunk r. Only point-to-point messages: n-1 chunks sent, all to rank (r + 1) mod n.
    # HINTS outline
    # Your shard goes into chunk r; then n-1 steps, each passing on to the right the chunk that
    # arrived last (your own first) while the next arrives from the left.
    # HINTS steps
    # Chunk i is output.view(n, -1)[i]. Copy your shard into chunk r; at step s (0 to n-2) send
    # chunk (r - s) mod n to rank (r + 1) mod n with dist.isend, receive chunk (r - s - 1) mod n
    # from rank (r - 1) mod n with dist.recv, then wait for the send. Return output.
    # END PROMPT
    # BEGIN SOLUTION Task 10: the ring all-gather
    world, rank = dist.get_world_size(), dist.get_rank()
    chunks = output.view(world, -1)
    if shard.data_ptr() != chunks[rank].data_ptr():
        chunks[rank].copy_(shard.view(-1))
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        request = dist.isend(chunks[(rank - step) % world], right)
        dist.recv(chunks[(rank - step - 1) % world], left)
        request.wait()
    return output
    # END SOLUTION


# The classes' collectives: (output, input) in, a future out; the ring's by default, blocking.
def reduce_scatter_by_ring(output, tensor):
    return completed(ring_reduce_scatter(output, tensor))


def all_gather_by_ring(output, shard):
    return completed(ring_all_gather(output, shard))


# --- 2. The shard: rank r owns one equal, contiguous piece of the flat parameters ---------------
class FlatShard:
    """`params` end to end, padded with zeros to a multiple of n and cut into n equal shards: rank r
    owns elements [r S, (r+1) S), S = ceil(numel / n)."""

    def __init__(self, params):
        self.params = params
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(param.numel() for param in params)
        self.shard_numel = -(-self.numel // self.world)
        self.padded_numel = self.shard_numel * self.world
        self.shapes = [param.shape for param in params]  # kept: a freed parameter has none
        self.offsets = [0] + list(itertools.accumulate(param.numel() for param in params))

    def flatten(self, tensors, dtype=None):
        """A new padded flat buffer of `tensors` end to end (one per parameter; None as zeros)."""
        first = self.params[0]
        flat = torch.zeros(self.padded_numel, dtype=dtype or first.dtype, device=first.device)
        for tensor, start, end in zip(tensors, self.offsets, self.offsets[1:]):
            if tensor is not None:
                flat[start:end].copy_(tensor.detach().reshape(-1))
        return flat

    def views(self, flat):
        """Each parameter's piece of the flat buffer `flat`, in its shape."""
        return [flat[start:end].view(shape)
                for shape, start, end in zip(self.shapes, self.offsets, self.offsets[1:])]

    def pieces(self, shard):
        """Each parameter's part of this rank's shard `shard`, a view (empty where it misses)."""
        low = self.rank * self.shard_numel
        return [shard[min(max(start - low, 0), self.shard_numel):
                      min(max(end - low, 0), self.shard_numel)]
                for start, end in zip(self.offsets, self.offsets[1:])]

    def own(self, flat):
        """This rank's shard of the padded flat buffer `flat`: a view."""
        return flat[self.rank * self.shard_numel:(self.rank + 1) * self.shard_numel]


# --- 3 and 4. ZeRO-1: each rank steps only its shard; ZeRO-2: and keeps only its gradients ------
class ShardedOptimizer:
    """`ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)` where code says
    `ZeroRedundancyOptimizer(...)`: any torch.optim class, stepping this rank's shard only (1/n of
    the state), on a plain model whose ranks start equal: `step()` also averages the gradients (a
    reduce-scatter) and all-gathers the updated parameters, so no DDP goes around it. (torch's
    all-reduces every gradient, then broadcasts each whole parameter from its owner: more bytes.)

    The parameters become views of one flat buffer, their gradients of another (DDP's
    gradient_as_bucket_view), reduce-scattered in place: zero_grad() after every step. ZeRO-2
    (`shard_gradients=True`) keeps no gradient: each bucket of up to `bucket_mb` MiB is
    reduce-scattered as soon as backward has made it, then freed."""

    def __init__(self, params, optimizer_class, *, shard_gradients=False,
                 bucket_mb=DEFAULT_BUCKET_MB, reduce_scatter=reduce_scatter_by_ring,
                 all_gather=all_gather_by_ring, **defaults):
        params = list(params)
        if any(isinstance(param, dict) for param in params):
            raise TypeError("ShardedOptimizer takes parameters, not parameter groups: one flat "
                            "buffer is stepped with one set of options")
        params = trainable_parameters(params)
        if any(getattr(param, "freed_by_sharding", False) for param in params):
            raise ValueError("ShardedOptimizer got parameters FullyShardedModel freed")
        if not params:
            raise ValueError("ShardedOptimizer got no parameter that requires a gradient")
        self.shard_gradients = shard_gradients
        # ZeRO-2's buckets are DDP's, without the small first one
        groups = bucket_layout(params, bucket_mb, bucket_mb) if shard_gradients else [params]
        self.shards = [FlatShard(group) for group in groups]
        self.reduce_scatter, self.all_gather = reduce_scatter, all_gather
        self.flat_params, self.flat_grads = [], []
        for shard in self.shards:
            flat = shard.flatten(shard.params)
            for param, view in zip(shard.params, shard.views(flat)):
                param.data = view  # the parameter now lives in the flat buffer
            self.flat_params.append(flat)
            if not shard_gradients:
                grads = torch.zeros_like(flat)
                for param, view in zip(shard.params, shard.views(grads)):
                    param.grad = view
                self.flat_grads.append(grads)
        # the optimizer's parameters: this rank's shard of each flat buffer, a view (no copy)
        self.masters = [nn.Parameter(shard.own(flat), requires_grad=False)
                        for shard, flat in zip(self.shards, self.flat_params)]
        self.optimizer = optimizer_class(self.masters, **defaults)
        self.pending = []  # (shard index, future, its output) of reduce-scatters in flight
        self.reduced = False  # whether this step's gradients are already in the masters' .grad
        if shard_gradients:
            self.ready = [0] * len(self.shards)
            self.shard_of = {param: index for index, shard in enumerate(self.shards)
                             for param in shard.params}
            for param in params:
                param.register_post_accumulate_grad_hook(self._grad_ready)

    def start_reduce_scatter(self, index, grad_flat):
        """Divide shard `index`'s flat gradient (before the sum, as DDP), start its reduce-scatter:
        ZeRO-1 in place, into its own shard; ZeRO-2 into a new tensor, the bucket then freed."""
        # BEGIN PROMPT
        # When it returns, the reduce-scatter of grad_flat, divided by the world size, is started
        # (not waited for) into `output`, this rank's averaged shard to come, and (index, future,
        # output) is in self.pending. self.reduce_scatter(output, tensor) returns a future.
        # HINTS outline
        # Average before the sum, as DDP does. ZeRO-1 reduces into its own shard of grad_flat, in
        # place; ZeRO-2, whose bucket is freed after, into a tensor of its own.
        # HINTS steps
        # Divide grad_flat by the world size in place. The output: ZeRO-1 (not
        # self.shard_gradients) this rank's own shard of grad_flat (FlatShard.own), ZeRO-2 a new
        # tensor of the shard's shard_numel elements (self.shards[index]). Start
        # self.reduce_scatter into it; append (index, future, output) to self.pending.
        # END PROMPT
        # BEGIN SOLUTION Task 11: starting a gradient's reduce-scatter
        shard = self.shards[index]
        grad_flat.div_(shard.world)
        output = (grad_flat.new_empty(shard.shard_numel) if self.shard_gradients
                  else shard.own(grad_flat))
        self.pending.append((index, self.reduce_scatter(output, grad_flat), output))
        # END SOLUTION

    def _grad_ready(self, param):
        """ZeRO-2's hook: once a bucket's every gradient is accumulated, send it."""
        index = self.shard_of[param]
        self.ready[index] += 1
        if self.ready[index] == len(self.shards[index].params):
            self.send_bucket(index)

    def send_bucket(self, index):
        """ZeRO-2: start bucket `index`'s reduce-scatter (a missing gradient as zeros); free it."""
        shard = self.shards[index]
        self.ready[index] = 0
        self.start_reduce_scatter(index, shard.flatten([param.grad for param in shard.params]))
        for param in shard.params:
            param.grad = None

    def reduce_gradients(self):
        """Every shard's averaged gradient into its master's `.grad`, after backward (the training
        loop's sync phase; `step()` calls it if not called)."""
        # BEGIN PROMPT
        # When it returns, every master shard's .grad holds its averaged gradient (added to one
        # already there), every bucket's included, and self.pending is empty.
        # HINTS outline
        # ZeRO-1 starts a reduce-scatter per flat gradient buffer here; ZeRO-2's hooks started
        # most during backward: start only the buckets a gradient of which never came. Then wait
        # for each in order.
        # HINTS steps
        # ZeRO-1 (not self.shard_gradients): start_reduce_scatter of each flat gradient buffer,
        # self.flat_grads[index]. ZeRO-2: each bucket's hook (_grad_ready) has started it, unless
        # a gradient of the bucket never came (self.ready[index] is not 0) or none did (no entry
        # of the bucket in self.pending): start those here with self.send_bucket(index).
        # Then wait for every pending reduce-scatter in order, add its output to its master's
        # .grad (set it where that is None), and empty self.pending.
        # END PROMPT
        # BEGIN SOLUTION Task 11: averaging the gradients into the shards
        if self.shard_gradients:
            started = {index for index, _, _ in self.pending}
            for index in range(len(self.shards)):
                if self.ready[index] or index not in started:  # a gradient never came
                    self.send_bucket(index)
        else:  # the buffer is consumed: a ring leaves partial sums in it, zero_grad clears them
            for index, grads in enumerate(self.flat_grads):
                self.start_reduce_scatter(index, grads)
        for index, future, output in self.pending:
            future.wait()
            master = self.masters[index]
            master.grad = output if master.grad is None else master.grad.add_(output)
        self.pending = []
        # END SOLUTION
        self.reduced = True

    @torch.no_grad()
    def step(self, closure=None):
        """Average the gradients (unless done), step this rank's shards, and all-gather them."""
        if closure is not None:
            raise ValueError("ShardedOptimizer.step takes no closure")
        if not self.reduced:
            self.reduce_gradients()
        # BEGIN PROMPT
        # When it returns, the inner optimizer has stepped this rank's shards, and every rank's
        # flat parameter buffers hold every rank's updated shard.
        # HINTS outline
        # A step, then an all-gather per flat buffer, each waited for.
        # HINTS steps
        # Step the inner optimizer (self.optimizer), then all-gather each master shard (detached)
        # into its flat parameter buffer, self.flat_params[index], waiting for each.
        # END PROMPT
        # BEGIN SOLUTION Task 11: stepping the shards
        self.optimizer.step()
        for master, flat in zip(self.masters, self.flat_params):
            self.all_gather(flat, master.detach()).wait()
        # END SOLUTION
        self.reduced = False

    def zero_grad(self, set_to_none=True):
        """ZeRO-1's flat gradient buffers zeroed (.grad are views of them), the others freed."""
        for grads in self.flat_grads:
            grads.zero_()
        for param in self.shard_of if self.shard_gradients else ():
            param.grad = None
        for master in self.masters:
            master.grad = None


# --- 5. ZeRO-3 / FSDP: parameters sharded too, gathered per layer as they are needed -------------
class FullyShardedModel(nn.Module):
    """`module` with each unit's parameters sharded, as torch's fully_shard: its parameters become
    this rank's pieces of the unit's float32 flat shard, under the same names; build the optimizer
    over `model.parameters()`; finish_gradient_synchronization() averages their gradients. A unit
    is a layer (tied ones merged), and the module shows its whole parameters only around its use:
      forward   gather; the unit's forward; free             (and start the next unit's gather)
      backward  gather; its backward; reduce-scatter its gradients; free  (and the previous one's)
    Trainable parameters in no unit make a last unit, as fully_shard(model) at the root holds
    what no layer's took."""

    def __init__(self, module, units=None, prefetch=True,
                 reduce_scatter=reduce_scatter_by_ring, all_gather=all_gather_by_ring):
        super().__init__()
        self.module, self.prefetch = module, prefetch
        self.compute_dtype = None  # float32; runtime/sharded.py's mixed precision sets another
        self.reduce_scatter, self.all_gather = reduce_scatter, all_gather
        refuse_freed_from_now_on()
        units = units if units is not None else layer_units(module)
        listed = {param for modules in units for each in modules for param in each.parameters()}
        rest = [each for each in module.modules() if any(  # the modules holding the others
            param.requires_grad and param not in listed for param in each.parameters(False))]
        self.units = units + [rest] if rest else units
        self.shards, self.masters, self.pieces, self.shown = [], [], [], []
        taken = set()  # a parameter goes to the first unit that holds it
        for index, modules in enumerate(self.units):
            params = [param for param in trainable_parameters(
                param for each in modules for param in each.parameters()) if param not in taken]
            taken.update(params)
            shard = FlatShard(params)  # of the whole parameters: what forward and backward use
            master = shard.own(shard.flatten(params, torch.float32)).clone()
            pieces = [nn.Parameter(view) for view in shard.pieces(master)]  # share its storage
            self.shards.append(shard), self.masters.append(master), self.pieces.append(pieces)
            piece_of = {param: piece for param, piece in zip(params, pieces)}
            # (module, name, whole, piece): what the module's registry shows, swapped around use
            self.shown.append([(each, name, param, piece_of[param]) for each in modules
                               for name, param in each._parameters.items() if param in piece_of])
            for each in modules:
                each.register_forward_pre_hook(partial(self.before_forward, index))
                each.register_forward_hook(partial(self.after_forward, index))
            for param in params:
                param.freed_by_sharding = True  # an optimizer over it is refused
                param.register_post_accumulate_grad_hook(partial(self.after_backward, index))
        self.gathering = [None] * len(self.units)  # per unit: the future of a gather in flight
        self.ready = [0] * len(self.units)  # per unit: gradients accumulated this backward
        self.pending = []  # (unit, future, output) of reduce-scatters in flight
        for index in range(len(self.units)):
            self.free(index)
            self.show(index, False)

    def forward(self, *args, **kwargs):
        self.backward_started = [False] * len(self.units)
        return self.module(*args, **kwargs)

    def start_gather(self, index, dtype=None):
        """Start the all-gather of unit `index` into a new flat buffer, unless one is in flight or
        it is whole already."""
        # BEGIN PROMPT
        # When it returns, unit `index` is whole, or an all-gather of its master shard in `dtype`
        # into a new padded flat buffer is in flight, kept as (future, buffer) in
        # self.gathering[index]; never two at once.
        # HINTS outline
        # free() leaves a unit's parameters without elements: that tells a freed unit from a whole
        # one.
        # HINTS steps
        # Nothing to do if self.gathering[index] is set or the unit is whole (its first parameter
        # has elements: free() leaves none). Otherwise: a new flat buffer of the shard's
        # padded_numel elements in `dtype` (default: self.compute_dtype, else float32) on the
        # master's device; start self.all_gather into it of the master shard, detached and cast
        # to that dtype; keep (future, buffer) in self.gathering[index].
        # END PROMPT
        # BEGIN SOLUTION Task 12: starting a unit's all-gather
        shard = self.shards[index]
        if self.gathering[index] is not None or shard.params[0].numel():
            return
        dtype = dtype or self.compute_dtype or torch.float32
        flat = torch.empty(shard.padded_numel, dtype=dtype, device=self.masters[index].device)
        mine = self.masters[index].detach().to(dtype)
        self.gathering[index] = (self.all_gather(flat, mine), flat)
        # END SOLUTION

    def gather(self, index, dtype=None):
        """Unit `index`'s parameters whole: wait for its gather (starting it if need be) and point
        every parameter at its piece of the gathered buffer."""
        # BEGIN PROMPT
        # When it returns, every parameter of unit `index` is whole (its .data a view of the
        # gathered buffer) and self.gathering[index] is None.
        # HINTS outline
        # Start the gather unless one is in flight, wait for it, point each parameter at its
        # piece of the buffer.
        # HINTS steps
        # start_gather; if no gather is then in flight, the unit was whole: return. Otherwise wait
        # for the future, set each parameter's .data to its view of the buffer (FlatShard.views),
        # and set self.gathering[index] back to None.
        # END PROMPT
        # BEGIN SOLUTION Task 12: a unit made whole
        self.start_gather(index, dtype)
        if self.gathering[index] is None:
            return
        future, flat = self.gathering[index]
        future.wait()
        shard = self.shards[index]
        for param, view in zip(shard.params, shard.views(flat)):
            param.data = view
        self.gathering[index] = None
        # END SOLUTION

    def free(self, index):
        """Unit `index`'s parameters emptied; autograd keeps each object, which a gather refills."""
        for param in self.shards[index].params:
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)

    def show(self, index, whole):
        """The module's registry holds unit `index`'s whole parameters (`whole`) or its pieces."""
        for module, name, param, piece in self.shown[index]:
            module._parameters[name] = param if whole else piece

    # -- the hooks, each bound to its unit's index
    def before_forward(self, index, module, args):
        self.gather(index)
        self.show(index, True)
        if self.prefetch and index + 1 < len(self.units):
            self.start_gather(index + 1)

    def after_forward(self, index, module, args, output):
        self.show(index, False)
        self.free(index)
        for tensor in tree_leaves(output):
            if torch.is_tensor(tensor) and tensor.requires_grad:
                tensor.register_hook(partial(self.before_backward, index))

    def before_backward(self, index, grad):
        """The first of the unit's outputs' gradients: its backward starts."""
        if not self.backward_started[index]:
            self.backward_started[index] = True
            self.gather(index)
            if self.prefetch and index > 0 and not self.backward_started[index - 1]:
                self.start_gather(index - 1)  # unless done: a gather then would outlive the step

    def after_backward(self, index, param):
        """One more of the unit's gradients accumulated: the last sends them."""
        self.ready[index] += 1
        if self.ready[index] == len(self.shards[index].params):
            self.ready[index] = 0
            self.scatter_gradients(index)

    def scatter_gradients(self, index):
        """Unit `index`'s backward is done: average its gradients into a shard (a reduce-scatter
        started without waiting), and free the unit's gradients and parameters."""
        # BEGIN PROMPT
        # When it returns, the reduce-scatter of the unit's averaged gradients (in the compute
        # dtype, float32 without one) into a new tensor of a shard's size is started, (index,
        # future, output) is in self.pending, and the unit's gradients and parameters are freed.
        # HINTS outline
        # Average before the sum; free without waiting for the reduce-scatter, so that it
        # overlaps the rest of backward.
        # HINTS steps
        # Flatten the unit's gradients (FlatShard.flatten, in the compute dtype, float32 without
        # one), divide by the world size, start self.reduce_scatter into a new tensor of the
        # shard's shard_numel elements, and append (index, future, output) to self.pending; then
        # set each parameter's .grad to None and free the unit.
        # END PROMPT
        # BEGIN SOLUTION Task 12: a unit's gradients reduce-scattered
        shard = self.shards[index]
        flat = shard.flatten([param.grad for param in shard.params],
                             self.compute_dtype or torch.float32).div_(shard.world)
        output = flat.new_empty(shard.shard_numel)
        self.pending.append((index, self.reduce_scatter(output, flat), output))
        for param in shard.params:
            param.grad = None
        self.free(index)
        # END SOLUTION

    def finish_gradient_synchronization(self):
        """After backward: each averaged shard added to its pieces' .grad, in float32. A unit with
        a gradient missing is sent now, zeros for it; one whose backward never ran gets none."""
        for index in range(len(self.units)):
            if self.ready[index]:
                self.ready[index] = 0
                self.scatter_gradients(index)
        for index, future, output in self.pending:
            future.wait()
            grads = self.shards[index].pieces(output.to(torch.float32))
            for piece, grad in zip(self.pieces[index], grads):
                piece.grad = grad if piece.grad is None else piece.grad.add_(grad)
        self.pending = []


def refuse_freed(optimizer, args, kwargs):
    """Before every optimizer's step: parameters FullyShardedModel freed would step nothing."""
    if any(getattr(param, "freed_by_sharding", False) for group in optimizer.param_groups
           for param in group["params"]):
        raise ValueError("the optimizer holds parameters FullyShardedModel freed: build it over "
                         "model.parameters() after wrapping the model")


_REFUSING = []  # the handle of refuse_freed's registration, once a model has freed parameters


def refuse_freed_from_now_on():
    """Have every optimizer run refuse_freed before its step, from the first FullyShardedModel
    on: torch offers no hook on the optimizers over given parameters, and importing this module
    must leave torch's optimizers as they are."""
    if not _REFUSING:
        _REFUSING.append(register_optimizer_step_pre_hook(refuse_freed))


def layer_units(module):
    """FSDP's default wrapping, per layer: each submodule holding trainable parameters of its own,
    in the order the module lists them; submodules that share a parameter merged into one unit."""
    units, owner = [], {}  # owner: parameter -> its unit's index
    for each in module.modules():
        params = [param for param in each.parameters(recurse=False) if param.requires_grad]
        shared = [owner[param] for param in params if param in owner]
        if params and not shared:
            units.append([])
        index = min(shared, default=len(units) - 1)
        if params:
            units[index].append(each)
            owner.update(dict.fromkeys(params, index))
    return units


LEVELS = ("optimizer", "gradients", "parameters")  # ZeRO-1, ZeRO-2, ZeRO-3: --shard
