"""The classic MNIST recipe (pytorch/examples mnist/main.py), as usually written, for
time_to_accuracy.py to race against: its Net (conv 32, conv 64, max-pool, dropout 0.25, fc 128,
dropout 0.5, fc 10, log-softmax: the same layers as our CNN), Adadelta lr 1.0, StepLR gamma 0.7
every epoch, batch 64, a torchvision DataLoader with ToTensor and Normalize((0.1307,),
(0.3081,)), in one process.

The loader shuffles, as main.py's does on a GPU (on a CPU main.py leaves shuffle off, a quirk not
copied), and has no worker processes on a CPU, one and pinned memory on a GPU, as main.py's. Its
test accuracy is scored as ours is (accuracy_curve.py), on the in-memory test split normalised as
Normalize does.
"""
import time

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.accuracy_curve import Curve, evaluation_steps, write_part
from runtime import data
from runtime import device as devices
from runtime.launch import Placement, threads_per_rank

CLASSIC = "classic"  # the recipe's runs' name in the results
BATCH_SIZE = 64


class ClassicNet(nn.Module):
    """pytorch/examples mnist/main.py's Net, as written there."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def classic_rank(placement, job):
    """The recipe in one process, until job.target or the end of job.epochs; writes the run's part
    to job.part_path. (`placement` is the launcher's; the recipe needs none.)"""
    begun = time.perf_counter()
    torchvision = data.import_torchvision()
    transforms = torchvision.transforms
    torch.set_num_threads(threads_per_rank(0, 1))
    torch.manual_seed(job.seed)
    device = devices.plan(getattr(job, "device", "cpu"), "auto", 1).for_rank(0)
    transform = transforms.Compose([transforms.ToTensor(),
                                    transforms.Normalize((0.1307,), (0.3081,))])
    train_set = torchvision.datasets.MNIST(job.data_dir, train=True, download=False,
                                           transform=transform)
    # main.py's loader on a GPU: one worker, pinned memory
    on_gpu = {"num_workers": 1, "pin_memory": True} if device.type == "cuda" else {}
    loader = torch.utils.data.DataLoader(train_set, batch_size=BATCH_SIZE, shuffle=True, **on_gpu)
    test = data.load("mnist", job.data_dir, 0, 0, job.test_samples, job.seed).test
    model = ClassicNet().to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    evaluate_after = evaluation_steps(len(loader), job.evals_per_epoch)
    curve = Curve(model, test, Placement(), job.target, BATCH_SIZE)
    setup_s = time.perf_counter() - begun
    curve.started = time.perf_counter()
    model.train()
    for epoch in range(job.epochs):
        for step, (images, labels) in enumerate(loader, 1):
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(images), labels)
            loss.backward()
            optimizer.step()
            curve.step_done()
            if step in evaluate_after and curve.evaluate(epoch + step / len(loader)):
                write_part(job.part_path, curve, setup_s)
                return
        scheduler.step()
    write_part(job.part_path, curve, setup_s)
