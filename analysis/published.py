"""Published figures the projections are compared with (§5.6), each with its source, and the
table that sets Horovod's models and ours against the α-β model by compute per gradient byte
(one flat ring all-reduce after backward, no overlap: a lower bound), with a TCP and an RDMA α."""
import functools
from typing import NamedTuple

from analysis import cost_model
from analysis.design_numbers import table

FIGURES = {  # name -> (value, source)
    "ddp_gpus": (256, "Li et al., PyTorch Distributed, VLDB 2020: "
                      "near-linear scaling up to this many GPUs"),
    "horovod_gpus_high": (512, "Sergeev & Del Balso 2018, Horovod: "
                               "largest GPU count of that efficiency"),
    "horovod_link_gbit": (25, "Horovod docs/benchmarks.rst: 128 servers of 4 Pascal GPUs, "
                              "RoCE-capable 25 Gbit/s"),
    "horovod_batch": (64, "Horovod docs/benchmarks.rst: "
                          "tf_cnn_benchmarks --batch_size 64 per GPU"),
    "horovod_inception_v3_efficiency": (0.90, "Horovod docs/benchmarks.rst: "
                                              "Inception V3 at 512 GPUs"),
    "horovod_resnet101_efficiency": (0.90, "Horovod docs/benchmarks.rst: "
                                           "ResNet-101 at 512 GPUs"),
    "horovod_vgg16_efficiency": (0.68, "Horovod docs/benchmarks.rst: VGG-16 at 512 GPUs"),
    "inception_v3_parameters": (23_851_784, "Keras Applications table: InceptionV3 parameters"),
    "resnet101_parameters": (44_707_176, "Keras Applications: ResNet101 parameters "
                                         "(model.summary())"),
    "vgg16_parameters": (138_357_544, "Keras Applications table: VGG16 parameters"),
    "p100_inception_v3_images_per_s": (142, "TensorFlow r1 performance benchmarks, DGX-1, "
                                            "one P100, synthetic data, batch 64: InceptionV3"),
    "p100_vgg16_images_per_s": (154, "TensorFlow r1 performance benchmarks, DGX-1, one P100, "
                                     "synthetic data, batch 64: VGG16"),
    # TensorFlow's single-GPU table has no ResNet-101; Horovod's page prints one run's output
    "horovod_resnet101_images_per_s": (1656.82, "Horovod docs/benchmarks.rst: the example's "
                                                "'total images/sec' of resnet101, batch 64, "
                                                "16 GPUs (4 servers x 4)"),
    "horovod_example_gpus": (16, "Horovod docs/benchmarks.rst: the example's "
                                 "horovodrun -np 16"),
}


class PublishedModel(NamedTuple):
    """A model's keys in FIGURES; `gpus` None: the images per second were measured on one."""
    parameters: str
    images_per_s: str
    gpus: str | None
    efficiency: str


# The published models whose compute per gradient byte is compared with ours.
MODELS = {"Inception V3": PublishedModel("inception_v3_parameters",
                                         "p100_inception_v3_images_per_s", None,
                                         "horovod_inception_v3_efficiency"),
          "ResNet-101": PublishedModel("resnet101_parameters", "horovod_resnet101_images_per_s",
                                       "horovod_example_gpus", "horovod_resnet101_efficiency"),
          "VGG-16": PublishedModel("vgg16_parameters", "p100_vgg16_images_per_s", None,
                                   "horovod_vgg16_efficiency")}


ALPHAS = ("assume.alpha_s", "assume.rdma_alpha_s")  # registered by design_scaling.py
NO_OVERLAP = "compute / (compute + one flat ring all-reduce), no overlap"


def step_seconds(images_per_s, batch, gpus=1):
    """One GPU's step: the batch of each of `gpus` GPUs over the images per second of them all."""
    return batch * gpus / images_per_s


def compute_per_byte(parameters, images_per_s, batch, gpus=1):
    """Seconds of one GPU's step per byte of its fp32 gradient (4 bytes per parameter)."""
    return step_seconds(images_per_s, batch, gpus) / (4 * parameters)


def flat_step_efficiency(total_bytes, world, compute, alpha, beta):
    """compute / (compute + one flat ring all-reduce of the gradient): no overlap."""
    return compute / (compute + cost_model.allreduce_time(total_bytes, world, alpha, beta))


def modelled_cells(numbers, name, efficiency, inputs):
    """`name.modelled.<alpha>` with each of ALPHAS after `inputs`; their texts."""
    cells = []
    for alpha in ALPHAS:
        slug = alpha.removeprefix("assume.")
        numbers.derived(f"{name}.modelled.{slug}", efficiency,
                        inputs + [alpha, "published.horovod_beta"], "percent", NO_OVERLAP)
        cells.append(numbers.text(f"{name}.modelled.{slug}"))
    return cells


def published_table(numbers, layouts):
    """Compute per gradient byte of Horovod's models and ours, with the published efficiency
    and the modelled one at Horovod's GPU count and link."""
    world = FIGURES["horovod_gpus_high"][0]
    numbers.stated("published.horovod_beta", cost_model.link_beta(FIGURES["horovod_link_gbit"][0]),
                   "ns/byte", "assumption", "8 bits per byte / Horovod's link")
    rows = []
    for label, keys in MODELS.items():
        name = f"published.{keys.parameters.removesuffix('_parameters')}"
        measured = [f"published.{keys.images_per_s}", "published.horovod_batch"]
        if keys.gpus:
            measured.append(f"published.{keys.gpus}")
        numbers.derived(f"{name}.step_s", step_seconds, measured, "s",
                        "batch x GPUs / images per second")
        numbers.derived(f"{name}.per_byte", lambda step, parameters: step / (4 * parameters),
                        [f"{name}.step_s", f"published.{keys.parameters}"], "ns/byte",
                        "step / gradient bytes")
        cells = modelled_cells(
            numbers, name, lambda step, parameters, alpha, beta: flat_step_efficiency(
                4 * parameters, world, step, alpha, beta),
            [f"{name}.step_s", f"published.{keys.parameters}"])
        rows.append([label, numbers.text(f"{name}.step_s"), numbers.text(f"{name}.per_byte"),
                     numbers.text(f"published.{keys.efficiency}"), *cells])
    for model, sizes in layouts.items():
        name = f"published.ours.{model}"
        compute = f"sweep.{model}.single.w1.compute.median"
        total = sum(sizes)
        numbers.derived(f"{name}.per_byte", lambda seconds, total=total: seconds / total,
                        [compute], "ns/byte", "compute / gradient bytes")
        cells = modelled_cells(numbers, name,
                               functools.partial(flat_step_efficiency, sum(sizes), world),
                               [compute])
        rows.append([f"our {model.upper()} (one process here)", numbers.text(compute),
                     numbers.text(f"{name}.per_byte"), "—", *cells])
    return table(["model", "compute per step", "compute per gradient byte",
                  "published efficiency", "modelled: α of TCP", "modelled: α of RDMA"], rows)
