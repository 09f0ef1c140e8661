"""The backbones a job can fine-tune: every Keras application, named in snake case, with what
each needs around it. No TensorFlow here: the config checks a job's backbone and image size
against this table before anything is built, and the docs' table is made from it.

Each family scales its input its own way, and the model holds that scaling (model.py), so the
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
    application: str  # the keras.applications constructor
    family: str
    preprocessing: str  # builtin, tf, caffe or torch
    min_size: int  # the smallest image_size the application accepts
    default_size: int  # the size its ImageNet weights were trained at
    # Whether it takes include_preprocessing (else its builtin scaling is always there)
    include_preprocessing: bool = False
    # Whether a weights *file* (weights=pretrained, or a path) restores it exactly. EfficientNet
    # (B0-B7) builds one more scaling layer only when asked for weights="imagenet" (Keras divides by
    # the square root of the ImageNet deviation once more there): a backbone built for a file lacks
    # it, and its weights would see inputs at about half the scale they were trained on. Its ImageNet
    # weights come through weights=imagenet (downloaded, or baked into the image) instead.
    loads_weight_files: bool = True


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

# MXNet's built-in algorithm picks its ResNet by depth (num_layers); these depths are Keras'
RESNET_DEPTHS = (50, 101, 152)
