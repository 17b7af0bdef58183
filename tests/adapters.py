"""How the tests reach one piece of the lesson at a time, as Stanford CS336's tests/adapters.py
does: a strategy of manual_allreduce.py driven alone, the way ManualDDP drives it, so that its
tests need neither ManualDDP nor another strategy; and a strategy of the tests' own, so that
ManualDDP's tests need no strategy of the lesson; and a model of the tests' own, so that no test
but the MLP's needs Task 1. Used inside the tests' child processes."""
import torch
import torch.distributed as dist
from torch import nn

from runtime.options import MANUAL_CONFIGURATIONS

# What the tests train the strategies with, by name: (--sync, --transport). naive calls the
# library's all-reduce itself, so it has no other transport and takes no compression layer.
SYNCED = {"naive": ("naive", "library"), **MANUAL_CONFIGURATIONS}


class StrategyAlone:
    """`module` whose gradients the lesson's strategy `strategy` averages over `transport`
    (runtime/transports.py), driven as ManualDDP drives it: autograd's hook reports each final
    gradient to `grad_ready`, and `finish_gradient_synchronization()` calls `finish()`. Unlike
    ManualDDP it broadcasts nothing (every rank must build the same model), and has no buffers,
    no no_sync() and no unused parameters."""

    def __init__(self, module, strategy, bucket_mb=25.0, layers=(), transport="library"):
        from manual_allreduce import call_when_ready, trainable_parameters
        from runtime.manual_ddp import build_strategy

        self.module = module
        params = trainable_parameters(module.parameters())
        self.sync = build_strategy(params, strategy, bucket_mb, layers, transport)
        call_when_ready(params, self.sync.grad_ready)

    def __call__(self, *args):
        return self.module(*args)

    def finish_gradient_synchronization(self):
        self.sync.finish()


class AverageEachAfterBackward:
    """The tests' own strategy, with the lesson's constructor and methods, by another road than
    the lesson's: after backward every rank gathers every rank's gradient and takes their mean.
    Slower than an all-reduce, and not what the lesson asks for."""

    def __init__(self, params, all_reduce=None):
        self.params = params

    def grad_ready(self, param):
        """Nothing before backward is over."""

    def finish(self):
        for param in self.params:
            gathered = [torch.empty_like(param.grad) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, param.grad)
            param.grad.copy_(torch.stack(gathered).mean(dim=0))


def small_mlp():
    """The tests' own MLP for MNIST-shaped images: no dropout, so each rank computes exactly what
    one process would."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                         nn.Linear(32, 10))
