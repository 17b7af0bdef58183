"""The two networks: their shapes, sizes and initialisation, and that the MLP learns.

The models are built in a child process (grading/launch.py run_alone), which returns what the tests
check as plain data: the code under test is imported inside those functions, never at the top,
as this module is also imported by the process that decides the tests (grading/judge.py)."""
import pytest
import torch
from torch import nn
from torch.nn.functional import cross_entropy

from grading.launch import run_alone

pytestmark = pytest.mark.rubric("core.mlp")


def describe_mlp():
    """The default MLP's linear layers (in, out), its ReLUs, dropout rates and parameter count."""
    from runtime.models import MLP, count_parameters

    layers = MLP().layers
    return {"shapes": [(layer.in_features, layer.out_features) for layer in layers
                       if isinstance(layer, nn.Linear)],
            "relus": sum(isinstance(layer, nn.ReLU) for layer in layers),
            "dropouts": [float(layer.p) for layer in layers if isinstance(layer, nn.Dropout)],
            "parameters": count_parameters(MLP())}


def test_the_mlp_is_784_512_256_128_10_with_relu_and_dropout():
    mlp = run_alone(describe_mlp)
    assert [tuple(shape) for shape in mlp["shapes"]] == [(784, 512), (512, 256), (256, 128),
                                                         (128, 10)]
    assert mlp["relus"] == 3
    assert mlp["dropouts"] == [0.2, 0.2, 0.2]
    assert mlp["parameters"] == 567_434


def small_mlp_output_and_size():
    from runtime.models import build_model, count_parameters

    model = build_model("mlp", hidden_sizes=(64, 32), dropout=0.0)
    return {"shape": tuple(model(torch.zeros(5, 1, 28, 28)).shape),
            "parameters": count_parameters(model)}


def test_hidden_sizes_are_configurable():
    model = run_alone(small_mlp_output_and_size)
    assert tuple(model["shape"]) == (5, 10)
    assert model["parameters"] == 784 * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10


def first_layer_after_seed_0():
    from runtime.models import MLP

    torch.manual_seed(0)
    first = MLP().layers[1]
    return {"weight": first.weight.detach(), "bias": first.bias.detach()}


def test_weights_are_glorot_uniform_and_biases_zero():
    first = run_alone(first_layer_after_seed_0)
    bound = (6 / (784 + 512)) ** 0.5
    assert first["weight"].abs().max() <= bound and first["weight"].abs().max() > 0.9 * bound
    assert torch.all(first["bias"] == 0)


def describe_cnn():
    from runtime.models import CNN, count_parameters

    model = CNN()
    return {"shape": tuple(model(torch.zeros(3, 1, 28, 28)).shape),
            "kinds": [type(layer).__name__
                      for layer in list(model.features) + list(model.classifier)],
            "parameters": count_parameters(model)}


@pytest.mark.rubric()
def test_the_cnn_has_two_convolutions_a_pool_and_two_linear_layers():
    model = run_alone(describe_cnn)
    assert tuple(model["shape"]) == (3, 10)
    assert model["kinds"] == ["Conv2d", "ReLU", "Conv2d", "ReLU", "MaxPool2d", "Dropout",
                              "Flatten", "Linear", "ReLU", "Dropout", "Linear"]
    assert model["parameters"] == 1_199_882


def two_training_mode_outputs_without_dropout():
    """Each model with dropout 0, in training mode: two outputs for one input."""
    from runtime.models import build_model

    outputs = {}
    for name in ("mlp", "cnn"):
        model = build_model(name, dropout=0.0).train()
        x = torch.randn(4, 1, 28, 28)
        outputs[name] = (model(x).detach(), model(x).detach())
    return outputs


def test_dropout_zero_turns_every_dropout_layer_off():
    for name, (first, second) in run_alone(two_training_mode_outputs_without_dropout).items():
        assert torch.equal(first, second), name


def fit_small_labelled_set():
    """30 epochs of minibatch Adam on 256 random images; the predictions and the labels."""
    from runtime.models import MLP

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
    return {"predicted": model(images).argmax(1), "labels": labels}


def test_the_mlp_fits_a_small_labelled_set_with_minibatch_adam():
    fitted = run_alone(fit_small_labelled_set)
    assert (fitted["predicted"] == fitted["labels"]).float().mean() == 1.0


def one_epoch_on_mnist(data_dir, offline_dir):
    """Test accuracy of the default MLP after one epoch of mini-batch Adam with a one-cycle
    schedule, as mlp_ddp.py trains it, on the real MNIST (read by the given runtime/data.py; no
    sharding, no timing, no wrapper)."""
    from runtime.data import fetch, load
    from runtime.models import MLP

    fetch("mnist", data_dir, offline_dir)
    data = load("mnist", data_dir)
    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    batches = torch.randperm(len(data.train)).split(64)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3,
                                                   total_steps=len(batches))
    for batch in batches:
        cross_entropy(model(data.train.images[batch]), data.train.labels[batch]).backward()
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
    model.eval()
    with torch.no_grad():
        predicted = model(data.test.images).argmax(1)
    return (predicted == data.test.labels).float().mean().item()


def test_the_mlp_reaches_96_percent_on_real_mnist_after_one_epoch(tmp_path, real_data):
    accuracy = run_alone(one_epoch_on_mnist, str(tmp_path / "data"), real_data)
    assert accuracy >= 0.96, f"test accuracy {accuracy:.4f} after one epoch, below 0.96"
