"""`WrappedModel`: what the training loop and the checkpoints expect of a model wrapped for any
--mode, in a module of its own so that every wrapper (runtime/wrappers.py, manual_ddp.py,
sharded.py) can derive from it without importing the others."""
from contextlib import contextmanager, nullcontext

PER_PARAMETER = "tensors per parameter (--mode single, ddp or manual)"  # a torch optimizer's


class WrappedModel:
    """The interface, with the defaults of a whole model on every rank (`self.module`, optimized
    by a torch optimizer). Every --mode wrapper derives from it; the sharded ones override what
    sharding changes."""

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def no_sync(self):
        """A context whose backward passes only accumulate local gradients."""
        return nullcontext()

    def finish_gradient_synchronization(self):
        """After backward, before the optimizer step: every gradient averaged over the ranks."""

    def make_optimizer(self, optimizer_class, **options):
        """The optimizer over what this rank steps."""
        return optimizer_class(self.module.parameters(), **options)

    def full_state_dict(self):
        """The whole model's state_dict, unwrapped (no `module.` prefix); a collective where the
        model is sharded: every rank calls it."""
        return self.module.state_dict()

    def load_full_state_dict(self, state):
        """Take a full_state_dict()."""
        self.module.load_state_dict(state)

    def optimizer_state_dict(self, optimizer):
        """`optimizer`'s whole state (a collective where it is sharded)."""
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, optimizer, state):
        """Take an optimizer_state_dict() (each rank its shard, where it is sharded)."""
        optimizer.load_state_dict(state)

    def optimizer_layout(self):
        """How the optimizer's state is laid out: a checkpoint resumes only into the same."""
        return PER_PARAMETER

    def held_during_step(self):
        """(parameters, gradients): model state held only during part of a step, beyond the
        module's parameters and their .grad (runtime/memory.py counts its high-water mark)."""
        return [], []

    @contextmanager
    def replicated(self):
        """The (name, tensor) pairs every rank holds alike after a step, for the check that the
        ranks have not drifted apart (guards.check_in_sync); a collective where it gathers."""
        yield list(self.module.named_parameters())
