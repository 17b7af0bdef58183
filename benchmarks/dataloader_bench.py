"""One training epoch fed from in-memory tensors (as mlp_ddp.py does) against the same epoch fed by
a torchvision DataLoader with ToTensor()/Normalize, in one run, alternating, at world size 1.

    python -m benchmarks.dataloader_bench --offline-data-dir DIR   # MNIST from DIR/MNIST/raw
    python -m benchmarks.dataloader_bench --repeats 3 --output results/dataloader-bench.json

Both feed the same MLP, Adam and batch size for one full epoch of the 55,000 training images;
the in-memory side uses data.load + data.shard_indices exactly as the trainer does. Printed:
each epoch's seconds, the medians, and in-memory / DataLoader.
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from runtime import data
from runtime.models import MLP
from runtime.results import write_json_atomic

MNIST_TRAIN = 60000  # images in MNIST's training file
VAL_SAMPLES = 5000  # data.load's default validation split, left out of training as it does


def train_epoch(batches):
    """Seconds of one epoch of the MLP with Adam over `batches` of (images, labels)."""
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)  # as mlp_ddp.py
    start = time.perf_counter()
    for images, labels in batches:
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def in_memory_batches(split, batch_size, epoch):
    """The trainer's batches: slices of the in-memory tensors by data.shard_indices."""
    for batch in data.shard_indices(len(split), batch_size, 0, 1, epoch, seed=0):
        yield split.images[batch], split.labels[batch]


def dataloader_batches(data_dir, train_indices, batch_size):
    """The usual alternative: torchvision's MNIST decoded and normalised per sample by a
    DataLoader."""
    torchvision = data.import_torchvision()
    _folder, mean, std = data.DATASETS["mnist"]
    transform = torchvision.transforms.Compose([torchvision.transforms.ToTensor(),
                                                torchvision.transforms.Normalize((mean,), (std,))])
    mnist = torchvision.datasets.MNIST(data_dir, train=True, transform=transform)
    dataset = torch.utils.data.Subset(mnist, train_indices)
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True)


def main():
    """Time both, alternating; print each epoch and the medians; write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--offline-data-dir", default=os.environ.get("OFFLINE_DATA_DIR"))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="epochs of each, alternating")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--output", default="results/dataloader-bench.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data.fetch("mnist", args.data_dir, args.offline_data_dir)
    split = data.load("mnist", args.data_dir).train
    # data.load's training split: a seeded permutation without its first VAL_SAMPLES
    order = torch.randperm(MNIST_TRAIN, generator=torch.Generator().manual_seed(0))
    train_indices = order[VAL_SAMPLES:]
    times = {"in_memory": [], "dataloader": []}
    for repeat in range(args.repeats):
        in_memory = in_memory_batches(split, args.batch_size, repeat)
        times["in_memory"].append(train_epoch(in_memory))
        loader = dataloader_batches(args.data_dir, train_indices, args.batch_size)
        times["dataloader"].append(train_epoch(loader))
        print(f"repeat {repeat + 1}: in-memory {times['in_memory'][-1]:.1f} s, "
              f"DataLoader {times['dataloader'][-1]:.1f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["in_memory"] / medians["dataloader"]
    print(f"median epoch: in-memory {medians['in_memory']:.1f} s, "
          f"DataLoader {medians['dataloader']:.1f} s; "
          f"in-memory / DataLoader = {ratio:.2f} (target <= 0.33)")
    environment = {"torch": torch.__version__, "cores": os.cpu_count(),
                   "threads": torch.get_num_threads()}
    write_json_atomic(args.output, {
        "schema": "dataloader-bench/1", "environment": environment, "config": vars(args),
        "epoch_seconds": times, "median_seconds": medians, "ratio": ratio})


if __name__ == "__main__":
    main()
