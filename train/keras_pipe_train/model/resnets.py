"""The ResNets of MXNet's image classification algorithm (its hyperparameter num_layers) that Keras
has no application for, built here from plain Keras layers: a model saved with one loads with plain
Keras, no custom objects. ResNet18 and ResNet34 take MXNet Gluon's ImageNet weights, converted
(gluon_weights.py); the others have none public (classifier.py refuses weights=imagenet for them).
Each takes a weights file like any backbone. Like the applications built with include_top=False,
each ends with its last stage's feature map; the job adds the pooling and the classifier.

  ResNet18, ResNet34  ResNet v1 with basic blocks (He et al. 2015, "Deep Residual Learning for
                      Image Recognition", table 1), as torchvision's resnet18/34 and MXNet Gluon's
                      resnet18_v1/34_v1 build it: Keras' ResNet stem, then 64-128-256-512 filters,
                      the first block of stages 2-4 downsampling with a 1x1/2 projection shortcut,
                      BatchNorm after every convolution, no convolution biases.
  ResNet200           the bottleneck ResNet v1 with [3, 24, 36, 3] blocks, built by Keras' own
                      ResNet code, as its ResNet50/101/152 are.
  CIFARResNet(depth)  the CIFAR-10 ResNets of the same paper (section 4.2): a 3x3 convolution with 16
                      filters, then 3 stages of (depth - 2) / 6 basic blocks with 16, 32 and 64
                      filters, stride 2 in the first block of stages 2 and 3; depths 20, 32, 44, 56
                      and 110. Their blocks are those of MXNet's own symbol for these depths
                      (example/image-classification/symbols/resnet.py in apache/mxnet, what
                      num_layers builds for small images): pre-activation units (He et al. 2016,
                      "Identity Mappings in Deep Residual Networks": BN-ReLU-conv twice), the first
                      unit of each stage with a 1x1 projection shortcut taken from its pre-activated
                      input, and BN-ReLU after the last stage. MXNet's BatchNorm on the raw input
                      ("bn_data") is left out: the model's fixed input scaling stands for it.

Strided 3x3 convolutions pad one pixel on every side (explicitly, as torchvision and MXNet do):
Keras' padding="same" pads only the bottom and right of an even-sized input at stride 2, which
would put the main branch's samples one pixel off its 1x1/2 shortcut's.
"""

from __future__ import annotations

import keras
from keras import layers

# Keras' ResNets' BatchNorm epsilon; MXNet's symbol's epsilon and momentum
_KERAS_EPSILON = 1.001e-5
_MXNET_EPSILON, _MXNET_MOMENTUM = 2e-5, 0.9

CIFAR_DEPTHS = (20, 32, 44, 56, 110)


def _check(include_top: bool, weights: str | None, name: str) -> None:
    if include_top:
        raise ValueError(f"{name} is built without its ImageNet classifier only (include_top=False)")
    if weights is not None:
        raise ValueError(f"{name} has no ImageNet weights, and takes a weights file through load_weights: "
                         f"weights must be None; got {weights!r}")


def _conv3x3(x, filters: int, stride: int, name: str):
    if stride == 1:
        return layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv")(x)
    x = layers.ZeroPadding2D(1, name=f"{name}_pad")(x)
    return layers.Conv2D(filters, 3, strides=stride, use_bias=False, name=f"{name}_conv")(x)


def _basic_block_v1(x, filters: int, stride: int, project: bool, name: str):
    """conv3x3(stride)-BN-ReLU-conv3x3-BN, plus the shortcut (1x1/stride conv and BN when
    `project`), then ReLU; layer names in Keras' ResNet's pattern (conv2_block1_1_conv ...)."""
    if project:
        shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False, name=f"{name}_0_conv")(x)
        shortcut = layers.BatchNormalization(epsilon=_KERAS_EPSILON, name=f"{name}_0_bn")(shortcut)
    else:
        shortcut = x
    x = _conv3x3(x, filters, stride, f"{name}_1")
    x = layers.BatchNormalization(epsilon=_KERAS_EPSILON, name=f"{name}_1_bn")(x)
    x = layers.Activation("relu", name=f"{name}_1_relu")(x)
    x = _conv3x3(x, filters, 1, f"{name}_2")
    x = layers.BatchNormalization(epsilon=_KERAS_EPSILON, name=f"{name}_2_bn")(x)
    x = layers.Add(name=f"{name}_add")([shortcut, x])
    return layers.Activation("relu", name=f"{name}_out")(x)


def _basic_resnet_v1(blocks: tuple[int, int, int, int], name: str, include_top: bool, weights: str | None,
                     input_shape) -> keras.Model:
    from keras.src.applications.resnet import ResNet

    _check(include_top, weights, name)

    def stack_fn(x):
        for stage, (filters, count) in enumerate(zip((64, 128, 256, 512), blocks)):
            for block in range(count):
                first_downsamples = block == 0 and stage > 0
                x = _basic_block_v1(x, filters, 2 if first_downsamples else 1, first_downsamples,
                                    f"conv{stage + 2}_block{block + 1}")
        return x

    # Keras' ResNet gives the stem (7x7/2 conv, BN, ReLU, 3x3/2 max pool) and the model around stack_fn
    return _single_input(ResNet(stack_fn, False, False, include_top=False, weights=None, **_any_size(input_shape),
                                name=name))


def _any_size(input_shape) -> dict:
    """Keras' ResNet refuses an input_shape under 32 pixels (its ImageNet applications' limit); MXNet's
    ResNets take 28 (image_shape 3,28,28), and so do these, given their input as a tensor instead."""
    return {"input_tensor": keras.Input(input_shape or (None, None, 3)), "input_shape": None}


def _single_input(model: keras.Model) -> keras.Model:
    """The model taking its one input as a tensor, not a list of one (as Keras' ResNet builds it from an
    input_tensor), so that calling it with a tensor does not warn; the same layers and weights."""
    return keras.Model(model.inputs[0], model.outputs[0], name=model.name)


def ResNet18(include_top: bool = False, weights: str | None = None, input_shape=None) -> keras.Model:
    return _basic_resnet_v1((2, 2, 2, 2), "resnet18", include_top, weights, input_shape)


def ResNet34(include_top: bool = False, weights: str | None = None, input_shape=None) -> keras.Model:
    return _basic_resnet_v1((3, 4, 6, 3), "resnet34", include_top, weights, input_shape)


def ResNet200(include_top: bool = False, weights: str | None = None, input_shape=None) -> keras.Model:
    """Keras' ResNet152 with 24 blocks instead of 8 in its second stage (conv3), built by its code
    (its blocks, biases and all): the ResNet-200 of fb.resnet.torch and MXNet's symbol, in v1 form."""
    from keras.src.applications.resnet import ResNet, stack_residual_blocks_v1

    _check(include_top, weights, "resnet200")

    def stack_fn(x):
        x = stack_residual_blocks_v1(x, 64, 3, stride1=1, name="conv2")
        x = stack_residual_blocks_v1(x, 128, 24, name="conv3")
        x = stack_residual_blocks_v1(x, 256, 36, name="conv4")
        return stack_residual_blocks_v1(x, 512, 3, name="conv5")

    return _single_input(ResNet(stack_fn, False, True, include_top=False, weights=None, **_any_size(input_shape),
                                name="resnet200"))


def _preact_unit(x, filters: int, stride: int, project: bool, name: str):
    """MXNet's residual_unit without bottleneck: BN-ReLU-conv3x3(stride)-BN-ReLU-conv3x3, plus the
    input, or a 1x1/stride projection of its pre-activation where `project` (dim_match=False)."""
    pre = layers.BatchNormalization(epsilon=_MXNET_EPSILON, momentum=_MXNET_MOMENTUM, name=f"{name}_bn1")(x)
    pre = layers.Activation("relu", name=f"{name}_relu1")(pre)
    y = _conv3x3(pre, filters, stride, f"{name}_1")
    y = layers.BatchNormalization(epsilon=_MXNET_EPSILON, momentum=_MXNET_MOMENTUM, name=f"{name}_bn2")(y)
    y = layers.Activation("relu", name=f"{name}_relu2")(y)
    y = _conv3x3(y, filters, 1, f"{name}_2")
    shortcut = (layers.Conv2D(filters, 1, strides=stride, use_bias=False, name=f"{name}_sc")(pre)
                if project else x)
    return layers.Add(name=f"{name}_add")([y, shortcut])


def CIFARResNet(depth: int, include_top: bool = False, weights: str | None = None,
                input_shape=None) -> keras.Model:
    name = f"resnet{depth}"
    if depth not in CIFAR_DEPTHS:
        raise ValueError(f"the CIFAR ResNets have depths {', '.join(map(str, CIFAR_DEPTHS))}; got {depth}")
    _check(include_top, weights, name)
    units = (depth - 2) // 6
    images = keras.Input(input_shape or (None, None, 3))
    x = layers.Conv2D(16, 3, padding="same", use_bias=False, name="conv0")(images)
    for stage, filters in enumerate((16, 32, 64)):
        for unit in range(units):
            # MXNet's symbol projects in the first unit of every stage, the first's too (16 to 16, stride 1)
            x = _preact_unit(x, filters, 2 if stage > 0 and unit == 0 else 1, unit == 0,
                             f"stage{stage + 1}_unit{unit + 1}")
    x = layers.BatchNormalization(epsilon=_MXNET_EPSILON, momentum=_MXNET_MOMENTUM, name="bn1")(x)
    x = layers.Activation("relu", name="relu1")(x)
    return keras.Model(images, x, name=name)


def _cifar(depth: int):
    def build(include_top: bool = False, weights: str | None = None, input_shape=None) -> keras.Model:
        return CIFARResNet(depth, include_top, weights, input_shape)

    build.__name__ = build.__qualname__ = f"ResNet{depth}CIFAR"
    return build


ResNet20CIFAR, ResNet32CIFAR, ResNet44CIFAR, ResNet56CIFAR, ResNet110CIFAR = (_cifar(d) for d in CIFAR_DEPTHS)
