"""The backbones a job can fine-tune: every Keras application, named in snake case, and the ResNet
depths of MXNet's built-in algorithm that Keras lacks (built here: model/resnets.py), with what each needs
around it. No TensorFlow here: the config checks a job's backbone and image size against this table
before anything is built, and the docs' table is made from it.

Each family scales its input its own way, and the model holds that scaling (model/classifier.py), so the
exported model takes plain [0, 255] RGB and serving cannot drift from training:
  builtin  the application scales [0, 255] itself (include_preprocessing, or always for EfficientNet)
  tf       to [-1, 1] (Keras' preprocess_input mode "tf")
  caffe    RGB to BGR, minus the ImageNet mean ("caffe")
  torch    to [0, 1], minus the ImageNet mean, over its standard deviation ("torch")
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Backbone:
    name: str  # the hyperparameter's value
    application: str  # the keras.applications constructor (keras_pipe_train.model.resnets' where built_here)
    family: str
    preprocessing: str  # builtin, tf, caffe or torch
    min_size: int  # the smallest image_size the application accepts
    default_size: int  # the size its ImageNet weights were trained at (built here: the size it is designed for)
    # Whether it takes include_preprocessing (else its builtin scaling is always there)
    include_preprocessing: bool = False
    # Whether a weights *file* (weights=pretrained, or a path) restores it exactly. EfficientNet
    # (B0-B7) builds one more scaling layer only when asked for weights="imagenet" (Keras divides by
    # the square root of the ImageNet deviation once more there): a backbone built for a file lacks
    # it, and its weights would see inputs at about half the scale they were trained on. Its ImageNet
    # weights come through weights=imagenet (downloaded, or baked into the image) instead.
    loads_weight_files: bool = True
    # Not a Keras application: built here, from plain Keras layers (model/resnets.py)
    built_here: bool = False
    # Where weights=imagenet comes from: "keras" (its application), "gluon" (MXNet Gluon's model zoo,
    # converted: model/gluon_weights.py), or None (no public ImageNet weights)
    imagenet_from: str | None = "keras"

    @property
    def imagenet_weights(self) -> bool:
        """Whether weights=imagenet gives it pretrained weights."""
        return self.imagenet_from is not None


def _family(family: str, preprocessing: str, min_size: int, members: dict[str, tuple[str, int]],
            **options) -> list[Backbone]:
    return [Backbone(name, application, family, preprocessing, min_size, size, **options)
            for name, (application, size) in members.items()]


BACKBONES: dict[str, Backbone] = {b.name: b for b in [
    *_family("MobileNetV3", "builtin", 32, {"mobilenet_v3_small": ("MobileNetV3Small", 224),
                                            "mobilenet_v3_large": ("MobileNetV3Large", 224)},
             include_preprocessing=True),
    *_family("MobileNet", "tf", 32, {"mobilenet": ("MobileNet", 224), "mobilenet_v2": ("MobileNetV2", 224)}),
    *_family("EfficientNetV2", "builtin", 32, {
        "efficientnet_v2_b0": ("EfficientNetV2B0", 224), "efficientnet_v2_b1": ("EfficientNetV2B1", 240),
        "efficientnet_v2_b2": ("EfficientNetV2B2", 260), "efficientnet_v2_b3": ("EfficientNetV2B3", 300),
        "efficientnet_v2_s": ("EfficientNetV2S", 384), "efficientnet_v2_m": ("EfficientNetV2M", 480),
        "efficientnet_v2_l": ("EfficientNetV2L", 480)}, include_preprocessing=True),
    *_family("EfficientNet", "builtin", 32, {
        f"efficientnet_b{i}": (f"EfficientNetB{i}", size)
        for i, size in enumerate((224, 240, 260, 300, 380, 456, 528, 600))}, loads_weight_files=False),
    *_family("ResNet", "caffe", 32, {"resnet50": ("ResNet50", 224), "resnet101": ("ResNet101", 224),
                                     "resnet152": ("ResNet152", 224)}),
    # MXNet's other ResNet depths, built here (model/resnets.py says after which paper and implementation). Their
    # input scaling is "torch": RGB minus the ImageNet mean, over its deviation. That is how MXNet normalises
    # for its ResNets: its image-classification training subtracts the RGB mean (123.68, 116.78, 103.94 =
    # 255 x (0.485, 0.456, 0.406): example/image-classification/common/data.py) and its Gluon model zoo's
    # pretrained ResNets, whose weights ResNet-18 and 34 take (model/gluon_weights.py), also divide by the
    # deviation 255 x (0.229, 0.224, 0.225). Inputs of unit scale also suit training from scratch.
    # (28 pixels at least: MXNet's image_shape 3,28,28, for MNIST-sized images)
    *_family("ResNetV1", "torch", 28, {"resnet18": ("ResNet18", 224), "resnet34": ("ResNet34", 224)},
             built_here=True, imagenet_from="gluon"),
    *_family("ResNetV1", "torch", 28, {"resnet200": ("ResNet200", 224)}, built_here=True, imagenet_from=None),
    # (8 pixels at least: MXNet's symbol takes any image_shape up to 28 for these, AWS's page "any value")
    *_family("ResNetCIFAR", "torch", 8, {f"resnet{depth}": (f"ResNet{depth}CIFAR", 32)
                                          for depth in (20, 32, 44, 56, 110)}, built_here=True, imagenet_from=None),
    *_family("ResNetV2", "tf", 32, {"resnet50_v2": ("ResNet50V2", 224), "resnet101_v2": ("ResNet101V2", 224),
                                    "resnet152_v2": ("ResNet152V2", 224)}),
    *_family("ConvNeXt", "builtin", 32, {
        "convnext_tiny": ("ConvNeXtTiny", 224), "convnext_small": ("ConvNeXtSmall", 224),
        "convnext_base": ("ConvNeXtBase", 224), "convnext_large": ("ConvNeXtLarge", 224),
        "convnext_xlarge": ("ConvNeXtXLarge", 224)}, include_preprocessing=True),
    *_family("DenseNet", "torch", 32, {"densenet121": ("DenseNet121", 224), "densenet169": ("DenseNet169", 224),
                                       "densenet201": ("DenseNet201", 224)}),
    *_family("Xception", "tf", 71, {"xception": ("Xception", 299)}),
    *_family("Inception", "tf", 75, {"inception_v3": ("InceptionV3", 299),
                                     "inception_resnet_v2": ("InceptionResNetV2", 299)}),
    *_family("NASNet", "tf", 32, {"nasnet_mobile": ("NASNetMobile", 224), "nasnet_large": ("NASNetLarge", 331)}),
    *_family("VGG", "caffe", 32, {"vgg16": ("VGG16", 224), "vgg19": ("VGG19", 224)}),
]}

# MXNet's built-in algorithm picks its ResNet by depth (num_layers): each of its depths, for ImageNet-sized
# images (18 to 200) and for small, CIFAR-sized ones (20 to 110), and the backbone it names
RESNET_DEPTHS: dict[int, str] = {depth: f"resnet{depth}" for depth in (18, 34, 50, 101, 152, 200, 20, 32, 44, 56, 110)}
# The depths whose backbone has ImageNet weights: Keras' ResNet50, ResNet101, ResNet152, and Gluon's ResNet-18 and 34
IMAGENET_RESNET_DEPTHS = tuple(depth for depth, name in RESNET_DEPTHS.items() if BACKBONES[name].imagenet_weights)
