"""The torch a cluster already has: the names this project uses that older releases lack, taken
from the older name where the newer one is missing. Supported: torch 2.6 to 2.15.
(`.ci/test_oldest_torch.sh` runs the suite's core on the oldest.)
"""
import torch.distributed as dist


def either(module, newer, older):
    """`module.newer` where this torch has it, else `module.older`, which takes the same
    arguments."""
    return getattr(module, newer, None) or getattr(module, older)


# torch 2.13 has both names; 2.6 and 2.11 only the older ones. Looked up at each call, so that a
# watch on torch.distributed's names (the integrity tests') sees them called.
def reduce_scatter_single(*args, **kwargs):
    return either(dist, "reduce_scatter_single", "reduce_scatter_tensor")(*args, **kwargs)


def all_gather_single(*args, **kwargs):
    return either(dist, "all_gather_single", "all_gather_into_tensor")(*args, **kwargs)

_KEPT_ALIVE = []  # process groups whose destructor must never run (destroy_process_group)


def destroy_process_group():
    """dist.destroy_process_group(), safe on every supported torch. Before ProcessGroup.shutdown
    (torch 2.6), the group's destructor joins gloo's threads while holding the GIL, and a thread
    finishing a future's Python callback waits for the GIL: the process hung. There the group is
    kept referenced, so it is never destroyed before the process exits."""
    if not hasattr(dist.ProcessGroup, "shutdown"):
        _KEPT_ALIVE.append(dist.group.WORLD)
    dist.destroy_process_group()
