"""How the tests reach one piece of the lesson at a time, as Stanford CS336's tests/adapters.py
does: a strategy of manual_allreduce.py driven alone, the way ManualDDP drives it, so that its
tests need neither ManualDDP nor another strategy; and a strategy of the tests' own, so that
ManualDDP's tests need no strategy of the lesson. Used inside the tests' child processes."""
import torch.distributed as dist


class StrategyAlone:
    """`module` whose gradients the lesson's strategy `strategy` averages, driven as ManualDDP
    drives it: autograd's hook reports each final gradient to `grad_ready`, and
    `finish_gradient_synchronization()` calls `finish()`. Unlike ManualDDP it broadcasts nothing
    (every rank must build the same model), and has no buffers, no no_sync() and no unused
    parameters."""

    def __init__(self, module, strategy, bucket_mb=25.0, layers=()):
        from manual_allreduce import STRATEGIES, call_when_ready
        from runtime.manual_ddp import trainable_parameters

        self.module = module
        params = trainable_parameters(module)
        self.sync = STRATEGIES[strategy](params, bucket_mb, layers)
        call_when_ready(params, self.sync.grad_ready)

    def __call__(self, *args):
        return self.module(*args)

    def finish_gradient_synchronization(self):
        self.sync.finish()


class AverageEachAfterBackward:
    """The tests' own strategy, with the lesson's constructor and methods: after backward, each
    gradient summed by dist.all_reduce and divided (the six lines that open the lesson)."""

    def __init__(self, params, bucket_mb=None, layers=()):
        self.params = params

    def grad_ready(self, param):
        """Nothing before backward is over."""

    def finish(self):
        for param in self.params:
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()
