"""The two networks: their shapes, sizes and initialisation, and that the MLP learns."""
import torch
from torch import nn
from torch.nn.functional import cross_entropy

from runtime.models import CNN, MLP, build_model, count_parameters


def test_the_mlp_is_784_512_256_128_10_with_relu_and_dropout():
    linears = [layer for layer in MLP().layers if isinstance(layer, nn.Linear)]
    shapes = [(linear.in_features, linear.out_features) for linear in linears]
    assert shapes == [(784, 512), (512, 256), (256, 128), (128, 10)]
    assert sum(isinstance(layer, nn.ReLU) for layer in MLP().layers) == 3
    assert [layer.p for layer in MLP().layers if isinstance(layer, nn.Dropout)] == [0.2, 0.2, 0.2]
    assert count_parameters(MLP()) == 567_434


def test_hidden_sizes_are_configurable():
    model = build_model("mlp", hidden_sizes=(64, 32), dropout=0.0)
    assert model(torch.zeros(5, 1, 28, 28)).shape == (5, 10)
    assert count_parameters(model) == 784 * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10


def test_weights_are_glorot_uniform_and_biases_zero():
    torch.manual_seed(0)
    first = MLP().layers[1]
    bound = (6 / (784 + 512)) ** 0.5
    assert first.weight.abs().max() <= bound and first.weight.abs().max() > 0.9 * bound
    assert torch.all(first.bias == 0)


def test_the_cnn_has_two_convolutions_a_pool_and_two_linear_layers():
    model = CNN()
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    kinds = [type(layer).__name__ for layer in list(model.features) + list(model.classifier)]
    assert kinds == ["Conv2d", "ReLU", "Conv2d", "ReLU", "MaxPool2d", "Dropout", "Flatten",
                     "Linear", "ReLU", "Dropout", "Linear"]
    assert count_parameters(model) == 1_199_882


def test_dropout_zero_turns_every_dropout_layer_off():
    for name in ("mlp", "cnn"):
        model = build_model(name, dropout=0.0).train()
        x = torch.randn(4, 1, 28, 28)
        assert torch.equal(model(x), model(x))


def test_the_mlp_fits_a_small_labelled_set_with_minibatch_adam():
    torch.manual_seed(0)
    images = torch.randn(256, 1, 28, 28)
    labels = torch.randint(0, 10, (256,))
    model = MLP(dropout=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(30):  # epochs
        for start in range(0, 256, 32):
            cross_entropy(model(images[start:start + 32]), labels[start:start + 32]).backward()
            optimizer.step()
            optimizer.zero_grad()
    assert (model(images).argmax(1) == labels).float().mean() == 1.0
