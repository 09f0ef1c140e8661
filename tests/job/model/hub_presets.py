"""Small keras-hub presets with random (seeded) weights, of three families, written as keras-hub's
`save_to_preset` writes them: what a user puts in the `pretrained` channel, or bakes into the image,
in place of a download (the tests never reach the internet). Each has an image converter whose
scale and offset differ per channel, so a job that ignored them would be seen.

    python -m tests.job.model.hub_presets FAMILY FOLDER     # vit, mobilenet_v3, resnet, dinov2, dinov3, hgnetv2, siglip
"""

from __future__ import annotations

import sys

SIZE = 32
# (per channel, as timm's ImageNet mean and deviation: x / (255 * std) - mean / std)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SCALE = [1 / (255 * s) for s in STD]
OFFSET = [-m / s for m, s in zip(MEAN, STD)]


def backbone_and_converter(family: str):
    import keras_hub

    models, layers = keras_hub.models, keras_hub.layers
    if family == "vit":
        return (models.ViTBackbone(image_shape=(SIZE, SIZE, 3), patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                   mlp_dim=32),
                layers.ViTImageConverter(image_size=(SIZE, SIZE), scale=1 / 127.5, offset=-1.0))
    if family == "dinov2":
        return (models.DINOV2Backbone(patch_size=8, num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32,
                                      image_shape=(SIZE, SIZE, 3), position_embedding_shape=(SIZE, SIZE, 3)),
                layers.DINOV2ImageConverter(image_size=(SIZE, SIZE), scale=SCALE, offset=OFFSET))
    if family == "mobilenet_v3":
        return (models.MobileNetBackbone(
            stackwise_expansion=[[16], [32, 32]], stackwise_num_blocks=[1, 2], stackwise_num_filters=[[16], [24, 24]],
            stackwise_kernel_size=[[3], [3, 3]], stackwise_num_strides=[[2], [2, 1]], stackwise_padding=[[1], [1, 1]],
            stackwise_se_ratio=[[0.25], [None, 0.25]], stackwise_activation=[["relu"], ["hard_swish", "hard_swish"]],
            output_num_filters=48, depthwise_filters=8, depthwise_stride=2, depthwise_residual=False,
            last_layer_filter=48, squeeze_and_excite=0.5, input_num_filters=8),
            layers.MobileNetImageConverter(image_size=(SIZE, SIZE), scale=SCALE, offset=OFFSET))
    if family == "resnet":
        return (models.ResNetBackbone(input_conv_filters=[64], input_conv_kernel_sizes=[3],
                                      stackwise_num_filters=[64, 32], stackwise_num_blocks=[1, 1],
                                      stackwise_num_strides=[1, 2], block_type="basic_block"),
                layers.ResNetImageConverter(image_size=(SIZE, SIZE), scale=SCALE, offset=OFFSET))
    if family == "hgnetv2":  # (its features: a dict of its stages' maps)
        stages = [[32, 16, 64, 1, 1, 3], [64, 32, 128, 1, 1, 3]]
        return (models.HGNetV2Backbone(embedding_size=32, stem_channels=[3, 16, 32], hidden_act="relu",
                                       use_learnable_affine_block=False, depths=[1, 1], hidden_sizes=[64, 128],
                                       stackwise_stage_filters=stages, apply_downsample=[False, True],
                                       use_lightweight_conv_block=[False, False], image_shape=(SIZE, SIZE, 3)),
                layers.HGNetV2ImageConverter(image_size=(SIZE, SIZE), scale=SCALE, offset=OFFSET))
    if family == "dinov3":  # (its input: a dict keyed pixel_values; rotary position embeddings)
        return (models.DINOV3Backbone(patch_size=16, num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=32,
                                      num_register_tokens=4, image_shape=(SIZE, SIZE, 3)),
                layers.DINOV3ImageConverter(image_size=(SIZE, SIZE), scale=SCALE, offset=OFFSET))
    if family == "siglip":
        vision = models.SigLIPVisionEncoder(patch_size=8, hidden_dim=16, num_layers=2, num_heads=2,
                                            intermediate_dim=32, image_shape=(SIZE, SIZE, 3))
        text = models.SigLIPTextEncoder(vocabulary_size=64, embedding_dim=16, hidden_dim=16, num_layers=1,
                                        num_heads=2, intermediate_dim=32, sequence_length=8)
        return (models.SigLIPBackbone(vision, text),
                layers.SigLIPImageConverter(image_size=(SIZE, SIZE), scale=1 / 127.5, offset=-1.0))
    raise SystemExit(f"unknown family {family}")


def make(family: str, folder: str, seed: int = 3) -> None:
    import keras

    keras.utils.set_random_seed(seed)
    backbone, converter = backbone_and_converter(family)
    backbone.save_to_preset(folder)
    converter.save_to_preset(folder)


if __name__ == "__main__":
    make(sys.argv[1], sys.argv[2])
