"""The two networks: an MLP built from nn.Linear layers, and a small CNN."""
from torch import nn


class MLP(nn.Module):
    """784 -> hidden... -> 10, ReLU and dropout after every hidden layer, Glorot-initialised."""

    def __init__(self, hidden_sizes=(512, 256, 128), dropout=0.2, in_features=784, classes=10):
        super().__init__()
        # BEGIN PROMPT
        # Build self.layers, an nn.Sequential: flatten, then per hidden size Linear, ReLU, Dropout,
        # then a Linear to the classes; initialise each Linear's weight Glorot-uniform, bias zero.
        # END PROMPT
        # BEGIN SOLUTION Task 1: the MLP's layers
        layers = [nn.Flatten()]
        width = in_features
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), nn.ReLU(), nn.Dropout(dropout)]
            width = size
        layers.append(nn.Linear(width, classes))
        self.layers = nn.Sequential(*layers)
        for layer in self.layers:
            if isinstance(layer, nn.Linear):
                # keeps the activations' variance steady through the ReLU stack
                nn.init.xavier_uniform_(layer.weight)
                nn.init.zeros_(layer.bias)
        # END SOLUTION

    def forward(self, images):
        """Logits of a batch of N x 1 x 28 x 28 images."""
        # BEGIN PROMPT
        # Run the images through the layers.
        # END PROMPT
        # BEGIN SOLUTION Task 1: the MLP's forward
        return self.layers(images)
        # END SOLUTION


class CNN(nn.Module):
    """conv 32 -> conv 64 -> max-pool -> dropout -> fc 128 -> dropout -> fc 10 (pytorch/examples'
    MNIST net)."""

    def __init__(self, dropout=(0.25, 0.5), classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3), nn.ReLU(),
            nn.Conv2d(32, 64, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(dropout[0]), nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(64 * 12 * 12, 128), nn.ReLU(), nn.Dropout(dropout[1]),
            nn.Linear(128, classes),
        )

    def forward(self, images):
        """Logits of a batch of N x 1 x 28 x 28 images."""
        return self.classifier(self.features(images))


def build_model(name, hidden_sizes=(512, 256, 128), dropout=None):
    """The --model network; `dropout=None` keeps its default rates, a number sets every dropout
    layer's (0 turns them off)."""
    if name == "mlp":
        return MLP(hidden_sizes, 0.2 if dropout is None else dropout)
    if name == "cnn":
        return CNN((0.25, 0.5) if dropout is None else (dropout, dropout))
    raise ValueError(f"unknown model {name!r}")


def count_parameters(model):
    """The number of trainable values."""
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
