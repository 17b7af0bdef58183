"""Faults injected on purpose, for the tests: a rank that dies, a rank that lags.

The options are hidden from --help: --debug-exit-rank with --debug-exit-step, and
--debug-slow-rank.
"""
import os
import sys
import time


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
