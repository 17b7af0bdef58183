"""A gloo process group that reports every operation it carries: the integrity checks' view from
below torch.distributed's Python names, which a strategy can go around (a saved reference, the
group's own methods, torch's DDP). Made by the test harness before any student code is imported
(`run_in_processes(..., recorded=True)`), it tells LISTENERS each operation, then forwards it to a
gloo group of its own. It runs in the process it watches: code that digs out that gloo group, or
makes its own, still sends unseen (grading/launch.py run_counting_bytes counts those bytes).
"""
import torch.distributed as dist

NAME = "recorded_gloo"
# Called as listener(operation, tensors, peer) before each operation; a list shared by every group
# of this kind in the process, so a group a strategy makes for itself is watched too.
LISTENERS = []


def register():
    """Make NAME a backend of this process (a child of the harness): init_process_group(NAME)."""
    dist.Backend.register_backend(NAME, RecordedGloo, devices=["cpu"])
    return NAME


def report(operation, tensors, peer=None):
    """Tell every listener about one operation."""
    for listener in LISTENERS:
        listener(operation, tensors, peer)


class RecordedGloo(dist.ProcessGroup):
    """gloo, reporting each operation: its name as the backend knows it, the tensors it sends
    (or, for a receive, fills), and the peer of a point-to-point message."""

    def __init__(self, store, rank, world_size, timeout):
        super().__init__(rank, world_size)
        self._gloo = dist.ProcessGroupGloo(store, rank, world_size, timeout)

    def getBackendName(self):
        """What torch asks of a backend."""
        return NAME


def first(args):
    return args[0]


def second(args):
    return args[1]


def second_alone(args):
    return [args[1]]


def second_flattened(args):
    return [tensor for group in args[1] for tensor in group]


# Each method torch calls: the operation reported, the tensors it sends, and gloo's method where
# its name differs (torch 2.13 calls the *_single ones).
OPERATIONS = {
    "allreduce": ("allreduce", first), "allreduce_coalesced": ("allreduce", first),
    "broadcast": ("broadcast", first), "reduce": ("reduce", first),
    "send": ("send", first), "recv": ("recv", first),
    "allgather": ("allgather", second), "_allgather_base": ("allgather", second_alone),
    "all_gather_single": ("allgather", second_alone, "_allgather_base"),
    "reduce_scatter": ("reduce_scatter", second_flattened),
    "_reduce_scatter_base": ("reduce_scatter", second_alone),
    "reduce_scatter_single": ("reduce_scatter", second_alone, "_reduce_scatter_base"),
    "gather": ("gather", second), "scatter": ("scatter", second_flattened),
    "alltoall_base": ("alltoall", second_alone),
    "all_to_all_single": ("alltoall", second_alone, "alltoall_base"),
    "barrier": ("barrier", lambda args: []),
}


def forwarding(operation, sent, method):
    """A method that reports `operation` and then calls gloo's `method`."""
    def forward(self, *args):
        report(operation, sent(args), args[1] if operation in ("send", "recv") else None)
        return getattr(self._gloo, method)(*args)
    return forward


for name, (operation, sent, *gloo_name) in OPERATIONS.items():
    setattr(RecordedGloo, name, forwarding(operation, sent, (gloo_name or [name])[0]))
