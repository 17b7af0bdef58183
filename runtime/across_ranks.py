"""The few collectives around training besides the gradients' own: sums and gathers of small values.

Both work unchanged in one process, where there is no process group.
"""
import torch
import torch.distributed as dist

from runtime.collective_record import kept


def sum_over_ranks(values, device):
    """{name: value summed over ranks} for a dict of numbers (as floats: one float64 all-reduce)."""
    tensor = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    if dist.is_initialized():
        with kept("all_reduce", tensor):
            dist.all_reduce(tensor)
    return dict(zip(values, tensor.tolist(), strict=True))


def gather(value):
    """Every rank's `value` (any picklable object), in rank order."""
    if not dist.is_initialized():
        return [value]
    gathered = [None] * dist.get_world_size()
    with kept("all_gather_object"):
        dist.all_gather_object(gathered, value)
    return gathered
