"""ImageNet weights for the ResNet-18 and ResNet-34 built here (model/resnets.py), from MXNet Gluon's
model zoo, converted to Keras.

Why Gluon's: MXNet's built-in image classification algorithm offers use_pretrained_model=1 at
depths 18 and 34 too, and Keras has no ImageNet ResNet of either depth. Gluon's model zoo is MXNet's
own (AWS publishes no weights of the built-in's); its files are pinned by SHA-1 in MXNet's source
(python/mxnet/gluon/model_zoo/model_store.py), served from Apache MXNet's S3 bucket. Its `resnet18_v1`
and `resnet34_v1` (ImageNet top-1 70.9% and 74.4%) are the network resnets.py builds, layer for layer:
the 7x7/2 stem, basic blocks with the stride in the first 3x3 and a 1x1/2 projection, no convolution
biases (BatchNorm's epsilon aside: 1e-5 there, Keras' ResNets' 1.001e-5 here). Why v1, when the
built-in's own network is the pre-activation ResNet of MXNet's symbols/resnet.py (Gluon's _v2): the
ResNet-18 and 34 of earlier jobs' models and weights files are v1 (so they keep loading), as are
Keras' ResNet-50, 101 and 152 at the other depths; the two forms' ImageNet accuracies are within
0.1 point. They take RGB scaled as torchvision does (/255, minus the
ImageNet mean, over its deviation), the "torch" scaling these backbones already have
(settings/backbones.py). Depths 50, 101 and 152 keep Keras' own ImageNet weights (its
applications, pinned by Keras); 200 has no public ImageNet weights in either zoo.

The converted weights live where Keras keeps its downloaded ones ($KERAS_HOME/models), so that
weights=imagenet (use_pretrained_model=1) finds them as it finds Keras': the image bakes them with
BAKE_WEIGHTS=resnet18,resnet34 (fetch()), and a machine without internet imports a file it brings
(`python -m keras_pipe_train.model --import-gluon resnet18_v1-a0666292.params`: import_file()).

Gluon names a parameter by where it sits, in one of two forms: `features.4.0.body.0.weight`
(save_parameters, MXNet >= 1.3) or `stage1_conv0_weight` (the model zoo's older files, save_params
with the prefix stripped). Both list each stage's convolutions in the order its blocks create them:
body's first and second 3x3, then the projection (the first block of stages 2 to 4), each followed by
its BatchNorm. MXNet's convolution kernels are (out, in, height, width), Keras' (height, width, in,
out); BatchNorm's gamma, beta, running mean and variance are Keras' order already.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import urllib.request
import zipfile
from pathlib import Path

import numpy as np

from keras_pipe_train.model import mxnet_params
from keras_pipe_train.settings.errors import UserError

log = logging.getLogger(__name__)

# backbone: (Gluon's model name, the SHA-1 of its .params file: model_store.py's _model_sha1)
MODEL_ZOO = {
    "resnet18": ("resnet18_v1", "a0666292f0a30ff61f857b0b66efc0228eb6a54b"),
    "resnet34": ("resnet34_v1", "48216ba99a8b1005d75c0f3a0c422301a0473233"),
}
# model_store.py's apache_repo_url and _url_format; MXNET_GLUON_REPO names a mirror, as it does for MXNet
_REPO = "https://apache-mxnet.s3-accelerate.dualstack.amazonaws.com/"
_URL = "{repo}gluon/models/{file}.zip"
_BLOCKS = {(2, 2, 2, 2): "resnet18", (3, 4, 6, 3): "resnet34"}
# a block's layers in resnets.py's names: its first 3x3 (_1), its second (_2), its projection (_0)
_ROLE_SUFFIX = ("1", "2", "0")


def gluon_file(backbone: str) -> str:
    """The model zoo's file name for a backbone: resnet18_v1-a0666292.params."""
    model, sha1 = MODEL_ZOO[backbone]
    return f"{model}-{sha1[:8]}.params"


def weights_path(backbone: str) -> Path:
    """Where the converted ImageNet weights of a backbone are kept: beside Keras' own downloads
    ($KERAS_HOME/models, as keras.utils.get_file keeps them)."""
    home = Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras")
    return home / "models" / f"{backbone}_gluon_imagenet.weights.h5"


def _layer(name: str) -> tuple[int, str, int, str]:
    """(stage: 0 for the stem, which of the stage's layers of its kind, that kind: conv or bn, the
    parameter) from either form of Gluon's names; stage -1 for the classifier."""
    parts = name.split(".")
    if parts[0] == "features":  # features.<i>[.<block>.(body|downsample).<j>].<param>
        index = int(parts[1])
        if len(parts) == 3:
            return (0, "conv" if index == 0 else "bn", 0, parts[2])
        block, branch, j, param = int(parts[2]), parts[3], int(parts[4]), parts[5]
        # in a block: body.0 conv, body.1 bn, body.3 conv, body.4 bn, then downsample.0 conv, .1 bn
        order = {("body", 0): 0, ("body", 1): 0, ("body", 3): 1, ("body", 4): 1,
                 ("downsample", 0): 2, ("downsample", 1): 2}[branch, j]
        return (index - 3, "conv" if param == "weight" else "bn", block * 3 + order, param)
    if parts[0] == "output":
        return (-1, "dense", 0, parts[1])
    found = re.fullmatch(r"(?:resnetv\d+_)?(?:stage(\d+)_)?(conv|batchnorm|dense)(\d+)_(\w+)", name)
    if not found:
        raise KeyError(name)
    stage, kind, index, param = found.groups()
    kind = {"batchnorm": "bn"}.get(kind, kind)
    return (-1 if kind == "dense" else int(stage or 0), kind, int(index), param)


def keras_weights(params: dict[str, np.ndarray], source: str) -> tuple[str, dict[str, list[np.ndarray]]]:
    """The backbone (resnet18 or resnet34) that Gluon parameters are of, and its Keras layers'
    weights by layer name; the classifier's as "classifier" ([kernel, bias]) when there is one."""
    layers: dict[tuple, dict[str, np.ndarray]] = {}
    for name, value in params.items():
        try:
            stage, kind, index, param = _layer(name.removeprefix("arg:").removeprefix("aux:"))
        except (KeyError, ValueError, IndexError):
            raise UserError(f"{source} is not a Gluon ResNet v1 (resnet18_v1 or resnet34_v1): it has a "
                            f"parameter {name!r}, which their layers do not") from None
        layers.setdefault((stage, kind, index), {})[param] = value
    convs = {stage: sorted(i for s, k, i in layers if s == stage and k == "conv") for stage in range(1, 5)}
    # a stage's blocks: 2 convolutions each, and the first of stages 2-4 a third (its projection)
    blocks = tuple((len(convs[stage]) - (stage > 1)) // 2 for stage in range(1, 5))
    norms = {stage: sorted(i for s, k, i in layers if s == stage and k == "bn") for stage in range(1, 5)}
    if (blocks not in _BLOCKS or norms != convs
            or any(len(convs[s]) != 2 * b + (s > 1) for s, b in zip(range(1, 5), blocks))):
        raise UserError(f"{source} is not a Gluon ResNet v1 with basic blocks (resnet18_v1 or resnet34_v1): its "
                        f"stages have {[len(convs[s]) for s in range(1, 5)]} convolutions. Depths 50, 101 and 152 "
                        "take Keras' own ImageNet weights (weights=imagenet)")
    backbone, weights = _BLOCKS[blocks], {}
    for (stage, kind, index), values in layers.items():
        try:
            if kind == "dense":
                weights["classifier"] = [values["weight"].T, values["bias"]]
                continue
            weights[_keras_name(stage, kind, index, convs.get(stage))] = (
                [values["weight"].transpose(2, 3, 1, 0)] if kind == "conv" else
                [values["gamma"], values["beta"], values["running_mean"], values["running_var"]])
        except (KeyError, ValueError) as err:  # (a missing parameter; a kernel that is not 4-dimensional)
            raise UserError(f"{source}: its {kind} layer {index} of stage {stage} is not a Gluon ResNet v1's "
                            f"({type(err).__name__}: {err}; it has {sorted(values)})") from None
    return backbone, weights


def _keras_name(stage: int, kind: str, index: int, convs: list[int] | None) -> str:
    """resnets.py's name for a Gluon stage's convolution (or its BatchNorm) numbered `index`. Either
    form of names numbers a stage's layers in creation order (a structural name by block * 3 + role,
    an older one by a counter: conv0, conv1 ...), and a BatchNorm as its convolution: the index's rank
    among the stage's convolutions is its place in the stage."""
    if stage == 0:
        return f"conv1_{kind}"
    position = convs.index(index)
    first = 3 if stage > 1 else 2  # the first block's layers: body, body, and the projection after stage 1
    block, role = (0, position) if position < first else (1 + (position - first) // 2, (position - first) % 2)
    return f"conv{stage + 1}_block{block + 1}_{_ROLE_SUFFIX[role]}_{kind}"


def _backbone_with(backbone: str, weights: dict[str, list[np.ndarray]]):
    from keras_pipe_train.model import resnets

    model = getattr(resnets, backbone.replace("resnet", "ResNet"))(input_shape=(224, 224, 3))
    expected = {layer.name for layer in model.layers if layer.weights}
    if expected != set(weights) - {"classifier"}:
        raise UserError(f"{backbone}'s layers and the Gluon file's differ: missing "
                        f"{sorted(expected - set(weights))[:5]}, unexpected {sorted(set(weights) - expected)[:5]}")
    for name, values in weights.items():
        if name != "classifier":
            layer = model.get_layer(name)
            shapes = [tuple(w.shape) for w in layer.weights]
            if shapes != [v.shape for v in values]:
                raise UserError(f"{backbone} layer {name} holds {shapes}; the Gluon file gives "
                                f"{[v.shape for v in values]}")
            layer.set_weights(values)
    return model


def convert(params_file: Path, source: str | None = None) -> tuple[str, Path]:
    """Converts a Gluon resnet18_v1 or resnet34_v1 .params file into the Keras backbone's weights
    file (weights_path). Returns the backbone and the file written."""
    params_file = Path(params_file)
    try:
        params = mxnet_params.load(params_file)
    except (OSError, mxnet_params.ParamsError) as err:
        raise UserError(f"cannot read {params_file}: {err}") from err
    backbone, weights = keras_weights(params, source or str(params_file))
    target = weights_path(backbone)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial.weights.h5")
    _backbone_with(backbone, weights).save_weights(str(partial))
    partial.replace(target)  # whole or not at all: a job never loads half a file
    return backbone, target


def sha1(path: Path) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def import_file(params_file: Path) -> Path:
    """Converts a .params file the user brings (the model zoo's, copied onto a machine without
    internet), saying whether it is the model zoo's ImageNet file."""
    backbone, target = convert(params_file)
    digest = sha1(params_file)
    model, pinned = MODEL_ZOO[backbone]
    if digest == pinned:
        print(f"{params_file}: Gluon's {model} ImageNet weights (SHA-1 {digest}), converted to {target}")
    else:
        print(f"{params_file}: a {model} network but not the model zoo's ImageNet file (SHA-1 {digest}, "
              f"the model zoo's is {pinned}); converted to {target}, used as {backbone}'s weights=imagenet")
    return target


def fetch(backbone: str) -> Path:
    """Downloads the model zoo's file of a backbone, checks its SHA-1, converts it."""
    file = gluon_file(backbone)
    repo = os.environ.get("MXNET_GLUON_REPO") or _REPO
    url = _URL.format(repo=repo if repo.endswith("/") else repo + "/", file=file.removesuffix(".params"))
    log.info("downloading %s", url)
    try:
        with urllib.request.urlopen(url, timeout=300) as answer:
            packed = zipfile.ZipFile(io.BytesIO(answer.read())).read(file)
    except (OSError, zipfile.BadZipFile, KeyError) as err:  # (URLError and HTTPError are OSErrors)
        raise UserError(f"cannot download {file} from {url} ({type(err).__name__}: {err}); without internet, bring "
                        f"the file and convert it: python -m keras_pipe_train.model --import-gluon {file}") from err
    target = weights_path(backbone)
    target.parent.mkdir(parents=True, exist_ok=True)
    params_file = target.with_name(file)
    params_file.write_bytes(packed)
    try:
        if (digest := sha1(params_file)) != MODEL_ZOO[backbone][1]:
            raise UserError(f"{url} gave {file} with SHA-1 {digest}, not the pinned {MODEL_ZOO[backbone][1]}")
        return convert(params_file, url)[1]
    finally:
        params_file.unlink()
