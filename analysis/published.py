"""Published figures the design document's projections are compared with (§5.6): each with its
source, as numbers.json records it."""
from typing import NamedTuple

FIGURES = {  # name -> (value, source)
    "ddp_gpus": (256, "Li et al., PyTorch Distributed, VLDB 2020: "
                      "near-linear scaling up to this many GPUs"),
    "ddp_bucket_speed_factor": (2, "Li et al. 2020: the bucket size alone can change the speed "
                                   "by more than this factor"),
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
    """A published model's keys in FIGURES: its parameters, the images per second measured and on
    how many GPUs (None: one), and its scaling efficiency at Horovod's 512 GPUs."""
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


def step_seconds(images_per_s, batch, gpus=1):
    """One GPU's step: the batch of each of `gpus` GPUs over the images per second of them all."""
    return batch * gpus / images_per_s


def compute_per_byte(parameters, images_per_s, batch, gpus=1):
    """Seconds of one GPU's step per byte of its fp32 gradient (4 bytes per parameter)."""
    return step_seconds(images_per_s, batch, gpus) / (4 * parameters)
