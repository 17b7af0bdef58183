"""Published figures the design document's projections are compared with (§5.6): each with its
source, as numbers.json records it."""

FIGURES = {  # name -> (value, source)
    "ddp_gpus": (256, "Li et al., PyTorch Distributed, VLDB 2020: "
                      "near-linear scaling up to this many GPUs"),
    "ddp_bucket_speed_factor": (2, "Li et al. 2020: the bucket size alone can change the speed "
                                   "by more than this factor"),
    "horovod_efficiency_low": (0.88, "Sergeev & Del Balso 2018, Horovod: "
                                     "scaling efficiency, lower end"),
    "horovod_efficiency_high": (0.90, "Sergeev & Del Balso 2018, Horovod: "
                                      "scaling efficiency, upper end"),
    "horovod_gpus_low": (128, "Sergeev & Del Balso 2018, Horovod: "
                              "smallest GPU count of that efficiency"),
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
    "vgg16_parameters": (138_357_544, "Keras Applications table: VGG16 parameters"),
    "p100_inception_v3_images_per_s": (142, "TensorFlow r1 performance benchmarks, DGX-1, "
                                            "one P100, synthetic data, batch 64: InceptionV3"),
    "p100_vgg16_images_per_s": (154, "TensorFlow r1 performance benchmarks, DGX-1, one P100, "
                                     "synthetic data, batch 64: VGG16"),
}
# The published models whose compute per gradient byte is compared with ours: the prefix of their
# parameters and images/s keys, and the key of their published efficiency.
MODELS = {"Inception V3": ("inception_v3", "horovod_inception_v3_efficiency"),
          "VGG-16": ("vgg16", "horovod_vgg16_efficiency")}


def compute_per_byte(parameters, images_per_s, batch):
    """Seconds of one GPU's step (batch / images per second) per byte of fp32 gradient."""
    return batch / images_per_s / (4 * parameters)
