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

# keras-hub's image backbones (model/hub.py): the presets of its image families, by family, as keras-hub 0.32
# registers them (tests/job/model/test_hub.py checks this list against keras-hub's own). A job names one of
# them, a handle keras-hub loads (kaggle://, or hf://: a timm or transformers checkpoint of an
# architecture keras-hub converts is converted on load), or the absolute path of a preset folder in the
# image (what save_to_preset writes).
# The preset brings its own input scaling (its image converter's scale and offset), which the model holds
# as it holds the applications' (model/classifier.py).
HUB_FAMILIES: dict[str, tuple[str, ...]] = {
    "ViT": ("vit_base_patch16_224_imagenet", "vit_base_patch16_384_imagenet", "vit_large_patch16_224_imagenet",
            "vit_large_patch16_384_imagenet", "vit_base_patch32_384_imagenet", "vit_large_patch32_384_imagenet",
            "vit_base_patch16_224_imagenet21k", "vit_base_patch32_224_imagenet21k", "vit_huge_patch14_224_imagenet21k",
            "vit_large_patch16_224_imagenet21k", "vit_large_patch32_224_imagenet21k"),
    "DeiT": ("deit_tiny_distilled_patch16_224_imagenet", "deit_small_distilled_patch16_224_imagenet",
             "deit_base_distilled_patch16_224_imagenet", "deit_base_distilled_patch16_384_imagenet"),
    "DINOv2": ("dinov2_small", "dinov2_base", "dinov2_large", "dinov2_giant", "dinov2_with_registers_small",
               "dinov2_with_registers_base", "dinov2_with_registers_large", "dinov2_with_registers_giant"),
    "DINOv3": ("dinov3_vit_small_lvd1689m", "dinov3_vit_small_plus_lvd1689m", "dinov3_vit_base_lvd1689m",
               "dinov3_vit_large_lvd1689m", "dinov3_vit_huge_plus_lvd1689m", "dinov3_vit_7b_lvd1689m",
               "dinov3_vit_large_sat493m", "dinov3_vit_7b_sat493m"),
    "SigLIP": ("siglip_base_patch16_224", "siglip_base_patch16_256", "siglip_base_patch16_384",
               "siglip_base_patch16_512", "siglip_large_patch16_256", "siglip_large_patch16_384",
               "siglip_so400m_patch14_224", "siglip_so400m_patch14_384", "siglip_so400m_patch16_256_i18n",
               "siglip_base_patch16_256_multilingual", "siglip2_base_patch16_224", "siglip2_base_patch16_256",
               "siglip2_base_patch32_256", "siglip2_base_patch16_384", "siglip2_large_patch16_256",
               "siglip2_large_patch16_384", "siglip2_large_patch16_512", "siglip2_giant_opt_patch16_256",
               "siglip2_giant_opt_patch16_384", "siglip2_so400m_patch14_224", "siglip2_so400m_patch14_384",
               "siglip2_so400m_patch16_256", "siglip2_so400m_patch16_384", "siglip2_so400m_patch16_512",
               "medsiglip_900m_448"),
    "Swin": ("swin_tiny_patch4_window7_224", "swin_small_patch4_window7_224", "swin_base_patch4_window7_224",
             "swin_base_patch4_window12_384", "swin_large_patch4_window7_224", "swin_large_patch4_window12_384"),
    "EfficientNet (timm)": (
        "efficientnet_b0_ra_imagenet", "efficientnet_b0_ra4_e3600_r224_imagenet", "efficientnet_b1_ft_imagenet",
        "efficientnet_b1_ra4_e3600_r240_imagenet", "efficientnet_b2_ra_imagenet", "efficientnet_b3_ra2_imagenet",
        "efficientnet_b4_ra2_imagenet", "efficientnet_b5_sw_imagenet", "efficientnet_b5_sw_ft_imagenet",
        "efficientnet_el_ra_imagenet", "efficientnet_em_ra2_imagenet", "efficientnet_es_ra_imagenet",
        "efficientnet2_rw_m_agc_imagenet", "efficientnet2_rw_s_ra2_imagenet", "efficientnet2_rw_t_ra2_imagenet",
        "efficientnet_lite0_ra_imagenet"),
    "MobileNetV3 (timm)": ("mobilenet_v3_small_050_imagenet", "mobilenet_v3_small_100_imagenet",
                           "mobilenet_v3_large_100_imagenet", "mobilenet_v3_large_100_imagenet_21k"),
    "ResNet (timm)": ("resnet_18_imagenet", "resnet_50_imagenet", "resnet_101_imagenet", "resnet_152_imagenet",
                      "resnet_v2_50_imagenet", "resnet_v2_101_imagenet", "resnet_vd_18_imagenet",
                      "resnet_vd_34_imagenet", "resnet_vd_50_imagenet", "resnet_vd_50_ssld_imagenet",
                      "resnet_vd_50_ssld_v2_imagenet", "resnet_vd_50_ssld_v2_fix_imagenet",
                      "resnet_vd_101_imagenet", "resnet_vd_101_ssld_imagenet", "resnet_vd_152_imagenet",
                      "resnet_vd_200_imagenet"),
    "HGNetV2": ("hgnetv2_b4_ssld_stage2_ft_in1k", "hgnetv2_b5_ssld_stage1_in22k_in1k", "hgnetv2_b5_ssld_stage2_ft_in1k",
                "hgnetv2_b6_ssld_stage1_in22k_in1k", "hgnetv2_b6_ssld_stage2_ft_in1k"),
    "CSPNet": ("csp_darknet_53_ra_imagenet", "csp_resnext_50_ra_imagenet", "csp_resnet_50_ra_imagenet",
               "darknet_53_imagenet"),
    "DenseNet (timm)": ("densenet_121_imagenet", "densenet_169_imagenet", "densenet_201_imagenet"),
}
HUB_PRESETS: dict[str, str] = {name: family for family, names in HUB_FAMILIES.items() for name in names}
HUB_SCHEMES = ("kaggle://", "hf://")  # (not modelscope://: its package is not installed)


def is_hub(name: str) -> bool:
    """Whether a backbone's name is keras-hub's: one of its presets, a handle, or a preset folder's path."""
    return name in HUB_PRESETS or name.startswith(HUB_SCHEMES) or name.startswith("/")
