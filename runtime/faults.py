"""Faults injected on purpose, for the tests: a rank that dies, a rank that lags, a rank that
skips an all-reduce.

The options are hidden from --help: --debug-exit-rank with --debug-exit-step, --debug-slow-rank,
--debug-skip-all-reduce N with --debug-exit-rank, and --debug-unsynced-parameter NAME.
"""
import itertools
import os
import sys
import time

import torch
import torch.distributed as dist


class FaultInjection:
    """The faults the hidden --debug-* options ask of this rank."""

    def __init__(self, exit_rank, exit_step, slow_rank, rank):
        self.rank = rank
        self.exit_step = exit_step if rank == exit_rank else None
        self.slow = slow_rank == rank

    def exit_if_due(self, global_step):
        """Die here, as a crashed worker would: exit code 3 at the chosen step, on the first attempt
        only (a worker torchrun restarted runs on)."""
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if global_step == self.exit_step and first_attempt:
            print(f"rank {self.rank}: exiting at step {global_step} (--debug-exit-step)",
                  file=sys.stderr, flush=True)
            os._exit(3)

    def slow_down(self):
        """On the slow rank, 10 ms more work per micro-batch: a straggler the timing must show."""
        if self.slow:
            time.sleep(0.010)


def skip_an_all_reduce(number, rank):
    """From now on, this rank's `number`-th call of dist.all_reduce sends nothing and returns at
    once, as a strategy that forgot one on one rank would."""
    original = dist.all_reduce
    calls = itertools.count(1)

    def all_reduce(tensor, *args, **kwargs):
        if next(calls) != number:
            return original(tensor, *args, **kwargs)
        print(f"rank {rank}: skipping all_reduce #{number} (--debug-skip-all-reduce)",
              file=sys.stderr, flush=True)
        if not kwargs.get("async_op"):
            return None
        done = torch.futures.Future()
        done.set_result([tensor])
        return Skipped(done)

    dist.all_reduce = all_reduce


class Skipped:
    """The work of an all-reduce that was skipped: done at once."""

    def __init__(self, future):
        self.future = future

    def wait(self, timeout=None):
        return True

    def get_future(self):
        return self.future


def leave_out_of_sync(model, name):
    """From now on the parameter `name` keeps each rank's own gradient, as a synchronisation that
    forgot it would: its gradient is put back after every sync (a strategy that sums after
    backward, such as --sync per-param or flat)."""
    param = dict(model.module.named_parameters())[name]
    synchronize = model.finish_gradient_synchronization

    def synchronize_all_but_it():
        own = param.grad.clone()
        synchronize()
        param.grad.copy_(own)

    model.finish_gradient_synchronization = synchronize_all_but_it
