"""The transfer-learning model: a Keras application backbone and a new classification head.

Inputs are float32 RGB images in [0, 255]; the backbone's own preprocessing is inside the model.
Training runs in two phases (https://keras.io/guides/transfer_learning/):
  1. the backbone frozen, only the new head trains;
  2. the top `fine_tune_layers` of the backbone unfrozen, at a lower learning rate.
"""

from __future__ import annotations

import logging
from pathlib import Path

import keras
import numpy as np

from keras_pipe_train.model import hub, jumpstart, resnets
from keras_pipe_train.model.weights_file import load_backbone_weights
from keras_pipe_train.settings.backbones import BACKBONES, IMAGENET_RESNET_DEPTHS, is_hub
from keras_pipe_train.settings.errors import UserError

log = logging.getLogger(__name__)


# Each family's input scaling, as Keras' preprocess_input does it ("caffe", "tf", "torch"), for
# the families whose application does not scale its input itself: (channel order, scale, offset)
# with output channel c = input[order[c]] * scale[c] + offset[c], from [0, 255] RGB
Scaling = tuple[tuple[float, ...], tuple[float, ...]]  # (scale, offset) per RGB channel: a keras-hub preset's
_IMAGENET_MEAN_RGB, _IMAGENET_STD_RGB = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
_CAFFE_MEAN_BGR = (103.939, 116.779, 123.68)
_SCALING = {
    "caffe": ((2, 1, 0), (1.0, 1.0, 1.0), tuple(-m for m in _CAFFE_MEAN_BGR)),
    "tf": ((0, 1, 2), (1 / 127.5,) * 3, (-1.0,) * 3),
    "torch": ((0, 1, 2), tuple(1 / (255 * s) for s in _IMAGENET_STD_RGB),
              tuple(-m / s for m, s in zip(_IMAGENET_MEAN_RGB, _IMAGENET_STD_RGB))),
    "unit": ((0, 1, 2), (1 / 255,) * 3, (0.0,) * 3),  # [0, 1]: TF Hub's image models (model/jumpstart.py)
}


def build_backbone(name: str, image_size: int, weights: str | None) -> keras.Model:
    """The backbone without its ImageNet classifier. `weights`: "imagenet", None, or a file."""
    spec = BACKBONES[name]
    if weights == "imagenet" and not spec.imagenet_weights:
        raise UserError(
            f"backbone {name} has no public ImageNet weights (neither Keras' applications nor MXNet Gluon's model "
            f"zoo have a ResNet of its depth); of MXNet's ResNet depths (num_layers) only "
            f"{', '.join(map(str, IMAGENET_RESNET_DEPTHS))} have them ("
            f"{', '.join(f'resnet{depth}' for depth in IMAGENET_RESNET_DEPTHS)}). Set "
            f"weights=none to train {name} from scratch, or give it a weights file of a {name} backbone "
            "(weights=pretrained, or a path), or choose one of those depths")
    constructor = getattr(resnets if spec.built_here else keras.applications, spec.application)
    kwargs = {"include_preprocessing": True} if spec.include_preprocessing else {}
    if weights == "imagenet" and spec.imagenet_from == "gluon":
        weights = str(converted_imagenet_weights(name))
    from_file = weights not in (None, "imagenet")
    if from_file and not spec.loads_weight_files:
        raise UserError(f"backbone {name} cannot be restored from a weights file ({weights}): its application "
                        "builds its input scaling differently for ImageNet weights, which a file cannot say. Use "
                        "weights=imagenet (downloaded, or baked into the image), or another backbone")
    try:
        backbone = constructor(
            include_top=False, weights=None if from_file else weights,
            input_shape=(image_size, image_size, 3), **kwargs,
        )
    except Exception as err:
        if weights == "imagenet":
            raise UserError(
                f"could not load the ImageNet weights of {name} ({type(err).__name__}: {err}). "
                "Without internet access (network isolation), put the weights file in a "
                "'pretrained' channel and set weights=pretrained, or bake them into the image "
                "(docker build --build-arg BAKE_WEIGHTS=...)"
            ) from err
        raise
    if from_file:
        load_backbone_weights(backbone, Path(weights), name)
    return backbone


def converted_imagenet_weights(name: str) -> Path:
    """The ImageNet weights of a backbone built here, converted from Gluon's model zoo into
    $KERAS_HOME/models (model/gluon_weights.py), or a UserError saying how to put them there."""
    from keras_pipe_train.model import gluon_weights

    path = gluon_weights.weights_path(name)
    if not path.is_file():
        raise UserError(
            f"backbone {name} takes its ImageNet weights from MXNet Gluon's model zoo, converted, and there are "
            f"none at {path}. Bake them into the image (docker build --build-arg BAKE_WEIGHTS={name}: it downloads "
            f"and converts {gluon_weights.gluon_file(name)}), or, without internet, convert a copy of that file "
            f"you bring: python -m keras_pipe_train.model --import-gluon {gluon_weights.gluon_file(name)} (with "
            "KERAS_HOME set to where the job's image keeps them, /opt/keras; docs/migration.md). weights=none "
            "trains it from scratch instead")
    return path


def input_scaling(name: str, mode: str | Scaling | None = None) -> keras.layers.Layer | None:
    """The backbone's input scaling from [0, 255] RGB (None when its application does it itself),
    as a fixed 1x1 convolution: a plain Keras layer, so the saved .keras model loads without this
    project's code (a custom layer would not). `mode`: one of _SCALING's, in place of the backbone's,
    or a keras-hub preset's (scale, offset) per RGB channel (model/hub.py)."""
    mode = mode or BACKBONES[name].preprocessing
    if mode == "builtin":
        return None
    name = f"{mode}_preprocessing"
    if isinstance(mode, tuple):
        (scale, offset), order, name = mode, (0, 1, 2), hub.SCALING_LAYER
    else:
        order, scale, offset = _SCALING[mode]
    kernel = np.zeros((1, 1, 3, 3), np.float32)
    for out, source in enumerate(order):
        kernel[0, 0, source, out] = scale[out]
    layer = keras.layers.Conv2D(3, 1, name=name, trainable=False)
    layer.build((None, None, None, 3))
    layer.set_weights([kernel, np.array(offset, np.float32)])
    return layer


def build_classifier(backbone_name: str, backbone: keras.Model, num_classes: int, dropout: float,
                     *, batchnorm_frozen: bool = True, l2: float = 0.0, activation: str = "softmax",
                     scaling: str | Scaling | None = None, image_size: int | None = None) -> keras.Model:
    """The backbone with a new head: pooling (of a feature map), dropout and a dense layer giving
    each class's probability (`activation`: softmax over the classes, or sigmoid, each class on its
    own). `batchnorm_frozen`: the backbone's BatchNorm layers always in inference mode. `scaling`:
    the input scaling's mode, in place of the backbone's (input_scaling)."""
    # (a convolutional keras-hub backbone takes any size: the job's)
    size = (hub.image_size_of(backbone) if is_hub(backbone_name) else backbone.input_shape[1]) or image_size
    images = keras.Input((size, size, 3), name="images")
    scaling = input_scaling(backbone_name, scaling)
    x = scaling(images) if scaling else images
    # training=False keeps a pretrained backbone's BatchNorm layers in inference mode for good,
    # even once phase 2 unfreezes them: updating their statistics on a small dataset would wreck
    # the pretrained features (Keras transfer-learning guide). A backbone trained from scratch
    # has no statistics worth keeping, and MXNet's built-in trains a pretrained one's
    # (train_batchnorm): its BatchNorm layers then follow the training flag.
    # (a SavedModel backbone takes Keras' own flag: it knows its BatchNorm's rule, and trains its
    # weights' regularization in any case: jumpstart.SavedModelFeatures)
    frozen = batchnorm_frozen and not jumpstart.is_savedmodel_backbone(backbone)
    training = False if frozen else None
    # (some keras-hub backbones take their images in a dict; a SavedModel's backbone may give its
    # features pooled already, a keras-hub transformer's are tokens: hub.pooled)
    features = hub.call(backbone, x, training=training) if is_hub(backbone_name) else backbone(x, training=training)
    x = hub.pooled(backbone, features)
    x = keras.layers.Dropout(dropout, name="dropout")(x)
    # float32 output even under mixed precision: softmax and loss in float16 lose accuracy
    # (an L2 penalty, as the built-in TensorFlow algorithm's regularizers_l2, on the new head only)
    regularizer = keras.regularizers.L2(l2) if l2 else None
    probabilities = keras.layers.Dense(num_classes, activation=activation, dtype="float32", name="classifier",
                                       kernel_regularizer=regularizer)(x)
    return keras.Model(images, probabilities, name=f"{hub.classifier_prefix(backbone_name)}_classifier")


def logits_of(model: keras.Model, flip: bool = False):
    """images -> the classifier's logits (float32), before its softmax or sigmoid: what a temperature
    divides (training/calibration.py). The model's own layers and weights, in inference mode.
    `flip` (test_time_flip): the mean of the logits of the images and of their mirror images
    (averaged before the softmax or sigmoid, so that a temperature divides them as it divides one
    image's)."""
    head = model.get_layer("classifier")
    features = keras.Model(model.input, head.input, name="features")

    def logits(images):
        x = keras.ops.cast(features(images, training=False), "float32")
        return keras.ops.matmul(x, head.kernel) + head.bias

    if not flip:
        return logits
    return lambda images: (logits(images) + logits(keras.ops.flip(images, axis=2))) / 2  # (NHWC: axis 2, the width)


def probabilities_of(model: keras.Model, flip: bool = False):
    """images -> the model's probabilities (float32), its mirror images' averaged in when `flip`
    (logits_of)."""
    if not flip:
        return lambda images: keras.ops.cast(model(images, training=False), "float32")
    logits, activation = logits_of(model, flip=True), model.get_layer("classifier").activation
    return lambda images: activation(logits(images))


def freeze(backbone: keras.Model) -> None:
    backbone.trainable = False


def prepare_from_scratch(backbone: keras.Model, momentum: float = 0.9) -> None:
    """Makes a randomly initialised backbone trainable as a whole."""
    backbone.trainable = True
    set_batchnorm_momentum(backbone, momentum)


def set_batchnorm_momentum(backbone: keras.Model, momentum: float = 0.9) -> None:
    """For a backbone whose BatchNorm statistics train (from scratch, or train_batchnorm).

    Keras applications build BatchNorm with momentum 0.999 (0.99 here for the ResNets built here),
    tuned for ImageNet-length runs; in a run of a few hundred steps the moving statistics used at
    inference barely leave their initial values and validation accuracy stays at chance however well
    training goes (seen here on the digits). 0.9, MXNet's own BatchNorm momentum, lets them converge
    within an epoch or two.
    """
    for layer in backbone.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = momentum


def backbone_of(model: keras.Model) -> keras.Model:
    """The backbone inside a classifier built by build_classifier (also one loaded from .keras)."""
    return next(layer for layer in model.layers if isinstance(layer, keras.Model))


def unfreeze_top(backbone: keras.Model, count: int, batchnorm: bool = False) -> list[str]:
    """Makes the top `count` layers of the backbone trainable, except BatchNormalization layers
    unless `batchnorm`. Returns the names of the layers that train. The model must be compiled
    again afterwards: Keras fixes the trainable weights at compile time."""
    backbone.trainable = True
    first = max(0, len(backbone.layers) - count)  # count may exceed the layers: all of them
    training = []
    for index, layer in enumerate(backbone.layers):
        layer.trainable = index >= first and (batchnorm or not isinstance(layer, keras.layers.BatchNormalization))
        if layer.trainable and layer.weights:
            training.append(layer.name)
    return training


def download_imagenet_weights(names: list[str]) -> None:
    """Fetches the ImageNet weights of these backbones into $KERAS_HOME (the image bakes them in
    with BAKE_WEIGHTS, for jobs that run without internet access): Keras' own, Gluon's converted
    for the ResNets built here, or a keras-hub preset (model/hub.py)."""
    from keras_pipe_train.model import gluon_weights

    for name in names:
        if is_hub(name):
            print(f"saved the keras-hub preset {name} in {hub.bake(name)}")
            continue
        if name not in BACKBONES:
            raise SystemExit(f"unknown backbone {name!r}; known: {', '.join(BACKBONES)}")
        if not BACKBONES[name].imagenet_weights:
            raise SystemExit(f"backbone {name} has no public ImageNet weights to download")
        if BACKBONES[name].imagenet_from == "gluon":
            gluon_weights.fetch(name)
        build_backbone(name, 224, "imagenet")
        print(f"downloaded the ImageNet weights of {name}")

