"""One rank of the clean-exit test (tests/test_sharding_interfaces.py):
`python -m tests.sharding_exit_rank RANK PORT` trains FullyShardedModel 3 steps through the
library's collectives, destroys the process group right after the last step and returns, so the
interpreter's own exit runs. It imports only torch, the lesson and runtime/sharded.py."""
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def main(rank, port):
    from manual_sharding import FullyShardedModel
    from runtime.sharded import collectives

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3))
    model = FullyShardedModel(net, **collectives("library"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(3):
        inputs, labels = torch.randn(4, 6, generator=generator), torch.randint(0, 3, (4,))
        F.cross_entropy(model(inputs), labels).backward()
        model.finish_gradient_synchronization()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
