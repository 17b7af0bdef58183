"""Loss and accuracy: an epoch's running training sums, and evaluation over a whole split."""
import torch
from torch.nn.functional import cross_entropy

from runtime.across_ranks import sum_over_ranks
from runtime.data import eval_range


class TrainingSums:
    """An epoch's training loss and correct predictions, summed on the device: no host sync per
    step."""

    def __init__(self, device):
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.correct = torch.zeros((), dtype=torch.int64, device=device)
        self.losses = []  # every micro-batch's mean loss, for TensorBoard's curve of steps

    def add(self, loss, logits, labels):
        """One micro-batch's mean loss and its logits."""
        loss = loss.detach()
        self.loss_sum += loss * len(labels)
        self.correct += (logits.detach().argmax(1) == labels).sum()
        self.losses.append(loss)

    def step_losses(self, micro_batches):
        """Each step's loss (the mean of its micro-batches'), copied off the device."""
        if not self.losses:
            return []
        return torch.stack(self.losses).view(-1, micro_batches).mean(1).tolist()


@torch.no_grad()
def evaluate(model, split, rank, world_size, device, batch_size=1000):
    """Loss and accuracy over the whole split: each rank scores a disjoint slice, the sums are
    reduced. Every rank runs as many batches as the largest slice needs, the last ones perhaps
    empty: a forward may be a collective (--shard parameters gathers each layer in it)."""
    model.eval()
    part = eval_range(len(split), rank, world_size)
    images = split.images[part]
    labels = split.labels[part]
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    slices = [range(len(split))[eval_range(len(split), other, world_size)]
              for other in range(world_size)]
    largest = max(len(each) for each in slices)
    for start in range(0, largest, batch_size):
        batch_images = images[start:start + batch_size].to(device, non_blocking=True)
        batch_labels = labels[start:start + batch_size].to(device, non_blocking=True)
        logits = model(batch_images)
        loss_sum += cross_entropy(logits, batch_labels, reduction="sum")
        correct += (logits.argmax(1) == batch_labels).sum()
    own = {"loss_sum": loss_sum.item(), "correct": correct.item(), "samples": len(labels)}
    total = sum_over_ranks(own, device)
    return total["loss_sum"] / total["samples"], total["correct"] / total["samples"]
