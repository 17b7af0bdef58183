"""A gloo process group that reports every operation it carries: the integrity checks' view from
below torch.distributed's Python names.

The integrity checks watch torch.distributed's functions by name. A strategy can go around a
name: a reference saved under another one, the group object's own methods
(`dist.group.WORLD.allreduce`), or torch's DDP, whose reducer calls the group from C++. Each of
those still reaches the process group itself. This one is made by the test harness before any
student code is imported (`run_in_processes(..., recorded=True)`); it forwards each operation to
a gloo group of its own and first tells LISTENERS what it carries.

It runs in the same process as the code it watches, so it proves what a strategy does, not that
nobody tampered with it: code that looks for the gloo group inside this object, or makes a gloo
group of its own by name, can still send unseen (only the transport measured from outside the
process would see that).
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

    def allreduce(self, tensors, *options):
        report("allreduce", tensors)
        return self._gloo.allreduce(tensors, *options)

    def allreduce_coalesced(self, tensors, *options):
        report("allreduce", tensors)
        return self._gloo.allreduce_coalesced(tensors, *options)

    def broadcast(self, tensors, *options):
        report("broadcast", tensors)
        return self._gloo.broadcast(tensors, *options)

    def reduce(self, tensors, *options):
        report("reduce", tensors)
        return self._gloo.reduce(tensors, *options)

    def send(self, tensors, peer, tag):
        report("send", tensors, peer)
        return self._gloo.send(tensors, peer, tag)

    def recv(self, tensors, peer, tag):
        report("recv", tensors, peer)
        return self._gloo.recv(tensors, peer, tag)

    def allgather(self, outputs, inputs, *options):
        report("allgather", inputs)
        return self._gloo.allgather(outputs, inputs, *options)

    def _allgather_base(self, output, input, *options):
        report("allgather", [input])
        return self._gloo._allgather_base(output, input, *options)

    def all_gather_single(self, output, input, *options):
        """What dist.all_gather_into_tensor calls from torch 2.13 on."""
        report("allgather", [input])
        return self._gloo._allgather_base(output, input, *options)

    def reduce_scatter(self, outputs, inputs, *options):
        report("reduce_scatter", [tensor for group in inputs for tensor in group])
        return self._gloo.reduce_scatter(outputs, inputs, *options)

    def _reduce_scatter_base(self, output, input, *options):
        report("reduce_scatter", [input])
        return self._gloo._reduce_scatter_base(output, input, *options)

    def reduce_scatter_single(self, output, input, *options):
        """What dist.reduce_scatter_tensor calls from torch 2.13 on."""
        report("reduce_scatter", [input])
        return self._gloo._reduce_scatter_base(output, input, *options)

    def gather(self, outputs, inputs, *options):
        report("gather", inputs)
        return self._gloo.gather(outputs, inputs, *options)

    def scatter(self, outputs, inputs, *options):
        report("scatter", [tensor for group in inputs for tensor in group])
        return self._gloo.scatter(outputs, inputs, *options)

    def alltoall_base(self, output, input, *options):
        report("alltoall", [input])
        return self._gloo.alltoall_base(output, input, *options)

    def all_to_all_single(self, output, input, *options):
        """What dist.all_to_all_single calls from torch 2.13 on."""
        report("alltoall", [input])
        return self._gloo.alltoall_base(output, input, *options)

    def barrier(self, *options):
        report("barrier", [])
        return self._gloo.barrier(*options)
