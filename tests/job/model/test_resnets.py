"""The ResNets built here (keras_pipe_train/model/resnets.py), MXNet's depths that Keras has no application
for: each is a ResNet of its depth with the parameters of the published model, takes weights from a
file, and refuses weights=imagenet, saying which depths have them. (Each family built, trained a step
and saved, its model loaded by plain Keras, and an exported SavedModel: tests/job/model/test_model.py.)"""

import functools

import keras
import numpy as np
import pytest

from keras_pipe_train.model import classifier as M
from keras_pipe_train.settings.backbones import BACKBONES, IMAGENET_RESNET_DEPTHS, RESNET_DEPTHS
from keras_pipe_train.settings.errors import UserError

BUILT_HERE = [depth for depth, name in RESNET_DEPTHS.items() if BACKBONES[name].built_here]


def bottleneck_resnet(blocks, biases: bool) -> int:
    """The trainable parameters of a bottleneck ResNet v1 without its classifier, counted from the
    paper's table 1: the 7x7 stem, then per stage of width m, blocks of 1x1 (m), 3x3 (m), 1x1 (4m)
    convolutions, the first with a 1x1 projection shortcut (4m); a BatchNorm (gamma, beta) after each."""
    count, channels = 7 * 7 * 3 * 64 + 64 * biases + 2 * 64, 64
    for width, repeat in zip((64, 128, 256, 512), blocks):
        for block in range(repeat):
            convs = [(channels, width, 1), (width, width, 3), (width, 4 * width, 1)]
            convs += [(channels, 4 * width, 1)] if block == 0 else []
            count += sum(k * k * cin * cout + cout * biases + 2 * cout for cin, cout, k in convs)
            channels = 4 * width
    return count


def cifar_resnet_kernels(depth: int) -> int:
    """The convolution weights of MXNet's CIFAR ResNet of this depth (resnets.py): the 3x3 stem (16),
    3 stages of (depth - 2) / 6 units of two 3x3 convolutions, each stage's first unit with a 1x1
    projection shortcut."""
    units, count, channels = (depth - 2) // 6, 3 * 3 * 3 * 16, 16
    for width in (16, 32, 64):
        for unit in range(units):
            count += 9 * channels * width + 9 * width * width + (channels * width if unit == 0 else 0)
            channels = width
    return count


# torchvision's resnet18 and resnet34 (11,689,512 and 21,797,672 parameters: its model docs' num_params),
# less their 512 x 1000 + 1000 classifier; its ResNet-50 (25,557,032, less a 2048 x 1000 + 1000 classifier)
# checks bottleneck_resnet's count, which gives ResNet-200's: about 62.6M without convolution biases (as
# torchvision and fb.resnet.torch build it; Keras' ResNets have them, 88,000 more)
def test_the_counting_is_torchvisions():
    assert bottleneck_resnet((3, 4, 6, 3), biases=False) == 25_557_032 - 2_049_000
    assert round(bottleneck_resnet((3, 24, 36, 3), biases=False) / 1e6, 1) == 62.6


TRAINABLE = {18: 11_689_512 - 513_000, 34: 21_797_672 - 513_000,
             200: bottleneck_resnet((3, 24, 36, 3), biases=True)}
# He et al. 2015, table 6: the CIFAR ResNets' parameters (their convolutions' weights), in millions
PAPER = {20: 0.27, 32: 0.46, 44: 0.66, 56: 0.85, 110: 1.7}


@functools.cache
def built(depth: int) -> keras.Model:
    return M.build_backbone(RESNET_DEPTHS[depth], 32, None)


def shortcut(layer) -> bool:
    return layer.name.endswith(("_0_conv", "_sc"))  # (Keras' and resnets.py's names for the projections)


def trainable(model: keras.Model) -> int:
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


@pytest.mark.slow
@pytest.mark.parametrize("depth", BUILT_HERE)
def test_each_resnet_built_here_has_its_depth_and_the_published_models_parameters(depth):
    """Its depth counted as the paper does: the convolutions along the main path, plus the classifier
    the job adds; its parameters those of the published model."""
    backbone = built(depth)
    convolutions = [layer for layer in backbone.layers if isinstance(layer, keras.layers.Conv2D)]
    assert len([layer for layer in convolutions if not shortcut(layer)]) + 1 == depth
    if depth in PAPER:
        kernels = sum(int(np.prod(layer.kernel.shape)) for layer in convolutions)
        assert kernels == cifar_resnet_kernels(depth)
        assert round(kernels / 1e6, 1 if depth == 110 else 2) == PAPER[depth]
        assert backbone.output.shape == (None, 8, 8, 64)  # (32x32 input: two stride-2 stages)
        assert not any(layer.use_bias for layer in convolutions)
        assert trainable(backbone) == kernels + 2 * sum(  # (and BN's gamma and beta)
            layer.gamma.shape[0] for layer in backbone.layers if isinstance(layer, keras.layers.BatchNormalization))
    else:
        assert trainable(backbone) == TRAINABLE[depth]
        assert backbone.output.shape == (None, 1, 1, 2048 if depth == 200 else 512)  # (32x32 input: stride 32)
    assert backbone.name == RESNET_DEPTHS[depth]


@pytest.mark.slow
def test_resnet200_is_keras_resnet152_with_24_blocks_in_stage_3():
    blocks = {}
    for layer in built(200).layers:
        if layer.name.endswith("_out"):
            stage = layer.name.split("_")[0]
            blocks[stage] = blocks.get(stage, 0) + 1
    assert blocks == {"conv2": 3, "conv3": 24, "conv4": 36, "conv5": 3}  # (Keras' ResNet152: 3, 8, 36, 3)


def test_each_mxnet_depth_names_a_backbone_and_the_public_ones_have_imagenet_weights():
    assert sorted(RESNET_DEPTHS) == [18, 20, 32, 34, 44, 50, 56, 101, 110, 152, 200]
    assert IMAGENET_RESNET_DEPTHS == (18, 34, 50, 101, 152)  # (Gluon's 18 and 34, Keras' others)
    for depth, name in RESNET_DEPTHS.items():
        assert name == f"resnet{depth}" and BACKBONES[name].imagenet_weights == (depth in IMAGENET_RESNET_DEPTHS)


@pytest.mark.parametrize("name", ["resnet200", "resnet20"])
def test_weights_imagenet_for_a_resnet_without_public_weights_is_a_clear_error(name):
    with pytest.raises(UserError, match=rf"backbone {name} has no public ImageNet weights .* only 18, 34, 50, 101, "
                                        rf"152 have them \(resnet18, resnet34, resnet50, resnet101, resnet152\)\. "
                                        "Set weights=none"):
        M.build_backbone(name, 32, "imagenet")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "resnet20"])
def test_a_resnet_built_here_takes_its_weights_from_a_file(name, tmp_path):
    keras.utils.set_random_seed(3)
    source = M.build_backbone(name, 32, None)
    path = tmp_path / "backbone.weights.h5"
    source.save_weights(path)
    keras.utils.set_random_seed(4)
    loaded = M.build_backbone(name, 48, str(path))  # (at another size: the weights do not depend on it)
    for expected, got in zip(source.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(expected), np.asarray(got))
    other = "resnet34" if name == "resnet18" else "resnet32"
    with pytest.raises(UserError, match=f"does not fit backbone {other}"):
        M.build_backbone(other, 32, str(path))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "size"), [("resnet18", 28), ("resnet200", 28), ("resnet20", 8)])
def test_the_resnets_built_here_take_small_images_as_mxnets_do(name, size):
    backbone = M.build_backbone(name, size, None)
    features = backbone(np.zeros((1, size, size, 3), np.float32))
    assert features.shape[0] == 1 and min(features.shape[1:3]) >= 1
