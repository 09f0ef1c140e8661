"""JumpStart's pretrained TensorFlow image models, given in the `model` channel, as the backbone.

AWS's TensorFlow image-classification algorithm is JumpStart's: its notebook's
`Estimator(model_uri=...)` adds a `model` channel (application/x-sagemaker-model, File mode) holding
the pretrained model of the `model_id` the user chose, one of some sixty TF Hub image models. That
tarball, as JumpStart's artifact script writes it, holds:

  1/saved_model.pb, 1/variables/...  tf.saved_model.save(hub.load(<TF Hub feature-vector URL>))
  __model_info__.json                {"image_size": [H, W], "pixel_scaling_method": "normalize",
                                      "finetuned": false, "signature": null, "output_key": null}

and JumpStart's training script (load_model.py) reads it as hub.KerasLayer(<untarred>/1,
trainable=signature is None, signature=..., output_key=...) on images of image_size, scaled by
pixel_scaling_method, under Dropout and a Dense head. This module does the same without
tensorflow_hub: the SavedModel's `__call__(images, training)` (TF Hub's reusable SavedModel API), or
its named signature, becomes the backbone's one layer, whose weights are the SavedModel's own
variables, so fine-tuning (train_only_top_layer=False) trains them. Whichever model_id was chosen,
that model is what trains: nothing here depends on its architecture.

Keras' own TFSMLayer calls one endpoint and never passes `training` to it (a BatchNorm inside cannot
train), and knows neither TF Hub's regularization_losses nor an output_key: hence this layer.

Not verified against JumpStart's own constants (its TF image-classification constants.py is not in
public code): the model info's file name, taken as __model_info__.json as JumpStart's other scripts
name it (__models_info__.json, another script's spelling, is read too), and standardize_on_imagenet's
mean and deviation, taken as ImageNet's usual ones for pixels in [0, 1].

A model trained on such a backbone exports its serving SavedModel (1/) as any other, but no
model.keras: its backbone is a SavedModel graph, which a .keras file cannot hold. It cannot be
continued in a later job (said there), nor can JumpStart's own fine-tuned models (finetuned: true).
"""

from __future__ import annotations

import inspect
import json
import logging
import shutil
import tempfile
import weakref
from pathlib import Path, PurePosixPath

import keras
import tensorflow as tf

from keras_pipe_train.model.archives import unpack
from keras_pipe_train.settings.channels import MODEL
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.settings.serving_schema import FILE_NAME as SERVING_FILE

log = logging.getLogger(__name__)

CHANNEL = MODEL  # (the channel it comes in)
MODEL_INFO = "__model_info__.json"  # (JumpStart's constants.MODEL_INFO_FILE_NAME, as its other scripts name it)
MODEL_INFOS = (MODEL_INFO, "__models_info__.json")
SAVED_MODEL = "saved_model.pb"
NAME = "jumpstart"  # the backbone's name: the model is "jumpstart_classifier"
# JumpStart's pixel_scaling_method -> the input scaling from [0, 255] of the same effect
# (model/classifier.py's modes): normalize x/255; center 2x/255 - 1; ImageNet's mean and deviation
SCALINGS = {"normalize": "unit", "center": "tf", "standardize_on_imagenet": "torch"}


class Pretrained:
    """The model channel's pretrained model: where its SavedModel lies (unpacked, in a temporary
    folder that lives as long as this object: the backbone's layer keeps it), and its info."""

    def __init__(self, folder: Path, source: str, info: dict, unpacked: Path | None = None):
        self.folder, self.source = folder, source
        if unpacked is not None:
            # (removed when this object is collected or at exit; a TemporaryDirectory would warn
            # "Implicitly cleaning up" then, a ResourceWarning that lands in whatever code runs at
            # that moment's catch_warnings, such as the weights loader's mismatch check)
            weakref.finalize(self, shutil.rmtree, unpacked, ignore_errors=True)
        self.image_size = info.get("image_size")
        self.scaling = SCALINGS[info.get("pixel_scaling_method") or "normalize"]
        self.signature, self.output_key = info.get("signature"), info.get("output_key")

    def image_size_for(self, configured: int) -> int:
        """The image size the model takes: its info's, or, without one, the job's."""
        if self.image_size is None:
            log.info("channel '%s': %s has no %s image_size: images are %d px (image_size)", CHANNEL, self.source,
                     MODEL_INFO, configured)
            return configured
        if self.image_size != configured:
            log.info("channel '%s': images are %d px, as %s's %s says (not image_size=%d)", CHANNEL,
                     self.image_size, self.source, MODEL_INFO, configured)
        return self.image_size


def is_pretrained_archive(names: set[str]) -> bool:
    """Whether an archive's member names are a pretrained SavedModel's (not this job's export,
    which holds a serving SavedModel too, beside its serving.json)."""
    bases = {PurePosixPath(name).name for name in names}
    return SAVED_MODEL in bases and SERVING_FILE not in bases and "model.keras" not in bases


def from_archive(archive: Path, folder: Path) -> Pretrained:
    """The pretrained model in a model.tar.gz, unpacked into a temporary folder kept with it."""
    work = Path(tempfile.mkdtemp(prefix="jumpstart-"))
    try:
        unpack(archive, work, CHANNEL)
        return _pretrained(work, str(archive.relative_to(folder)), work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def from_folder(folder: Path) -> Pretrained:
    """The pretrained model as the channel's files (an S3 prefix of the unpacked tarball)."""
    return _pretrained(folder, folder.name, None)


def _pretrained(root: Path, source: str, unpacked: Path | None) -> Pretrained:
    models = sorted(p.parent for p in root.rglob(SAVED_MODEL) if p.is_file())
    if len(models) != 1:
        raise UserError(f"channel '{CHANNEL}': {source} must hold one SavedModel (a folder with {SAVED_MODEL}), as "
                        f"JumpStart's pretrained models do; it holds {len(models)}")
    info_files = [folder / name for folder in (models[0].parent, root) for name in MODEL_INFOS]
    info = _info(next((p for p in info_files if p.is_file()), None), source)
    if info.get("finetuned"):
        raise UserError(f"channel '{CHANNEL}': {source} is a model JumpStart fine-tuned ({MODEL_INFO} says "
                        "finetuned: true), a Keras 2 SavedModel that Keras 3 cannot load as a model. Give the "
                        "pretrained model it started from instead (JumpStart's training artifact for its model_id)")
    return Pretrained(models[0], source, info, unpacked)


def _info(path: Path | None, source: str) -> dict:
    """The model info, its keys lower-cased (as JumpStart's ModelInfo.from_file reads them); {}
    without the file: JumpStart's defaults then (normalize, not fine-tuned), the job's image_size."""
    if path is None:
        log.warning("channel '%s': %s has no %s: JumpStart's defaults (pixel_scaling_method normalize) and the "
                    "job's image_size are used", CHANNEL, source, MODEL_INFO)
        return {}
    try:
        info = {str(key).lower(): value for key, value in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError) as err:
        raise UserError(f"channel '{CHANNEL}': {source}'s {MODEL_INFO} is not a JSON object ({err})") from err
    size = info.get("image_size")
    if size is not None:
        if not (isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and v > 0 for v in size)):
            raise UserError(f"channel '{CHANNEL}': {source}'s {MODEL_INFO} image_size must be [height, width]; "
                            f"got {size!r}")
        if size[0] != size[1]:
            raise UserError(f"channel '{CHANNEL}': {source}'s {MODEL_INFO} image_size is {size}: this job trains on "
                            "square images only")
        info["image_size"] = size[0]
    method = info.get("pixel_scaling_method") or "normalize"
    if method not in SCALINGS:
        raise UserError(f"channel '{CHANNEL}': {source}'s {MODEL_INFO} pixel_scaling_method is {method!r}: one of "
                        f"{', '.join(SCALINGS)}")
    for key in ("signature", "output_key"):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise UserError(f"channel '{CHANNEL}': {source}'s {MODEL_INFO} {key} must be a name or null")
    if not isinstance(info.get("finetuned", False), bool):
        raise UserError(f"channel '{CHANNEL}': {source}'s {MODEL_INFO} finetuned must be true or false")
    return info


class SavedModelFeatures(keras.layers.Layer):
    """A SavedModel's image features as a Keras layer (what hub.KerasLayer does for JumpStart):
    images in the model's own scaling -> a feature vector (or map) per image. Called in training
    mode (its BatchNorm's statistics and dropout training) only while it trains and
    `batchnorm_trains` (train_batchnorm: JumpStart's train_only_top_layer=False); its TF Hub
    regularization_losses count whenever its weights train. `keep`: what must live as long as the
    layer (the temporary folder the SavedModel was unpacked into)."""

    def __init__(self, folder: Path, signature: str | None = None, output_key: str | None = None,
                 batchnorm_trains: bool = False, keep=None, **kwargs):
        super().__init__(dtype="float32", **kwargs)  # (the SavedModel's own dtype, under mixed precision too)
        self._keep, self._batchnorm_trains = keep, batchnorm_trains
        self._loaded = tf.saved_model.load(str(folder))
        self._signature, self._output_key = signature, output_key
        # (TF Hub's regularization_losses: penalties the model's training asks for, as hub.KerasLayer
        # adds them to the loss while it trains)
        self._regularization = list(getattr(self._loaded, "regularization_losses", [])) if signature is None else []
        if signature is None:
            if not callable(self._loaded):
                raise UserError(f"channel '{CHANNEL}': the SavedModel {folder} has no __call__ (TF Hub's reusable "
                                "SavedModel API) and its model info names no signature to call instead")
            self._takes_training = "training" in inspect.signature(self._loaded.__call__).parameters
            trainable = {id(v) for v in getattr(self._loaded, "trainable_variables", [])}
            variables = list(getattr(self._loaded, "variables", []))
            if not variables:  # (a SavedModel without TF Hub's variables attributes: every one its call reads)
                variables = _used_variables(self._loaded.__call__.concrete_functions)
                trainable = {id(v) for v in variables if v.trainable}
        else:
            if signature not in self._loaded.signatures:
                raise UserError(f"channel '{CHANNEL}': the SavedModel {folder} has no signature {signature!r} (its "
                                f"model info's); it has {', '.join(self._loaded.signatures) or 'none'}")
            # (a signature's variables do not train: JumpStart's hub.KerasLayer(trainable=False), as TF Hub requires)
            self._takes_training, trainable = False, set()
            variables = _used_variables([self._loaded.signatures[signature]])
        for index, variable in enumerate(variables):
            # (a keras.Variable given a tf.Variable keeps that very variable, not a copy: the
            # SavedModel's functions read what the optimizer updates and checkpoints save)
            self._track_variable(keras.Variable(
                variable, shape=variable.shape, dtype=variable.dtype.name, trainable=id(variable) in trainable,
                name=f"v{index}_" + variable.name.split(":")[0].replace("/", "_")))
        self.built = True

    def call(self, images, training=None):
        trains = bool(training) and self.trainable
        if self._signature is not None:
            outputs = self._loaded.signatures[self._signature](images)
        elif self._takes_training:
            outputs = self._loaded(images, training=trains and self._batchnorm_trains)
        else:
            outputs = self._loaded(images)
        if trains:
            for penalty in self._regularization:
                self.add_loss(penalty())
        return _features(outputs, self._output_key)


def _features(outputs, output_key: str | None):
    """The feature tensor out of what the SavedModel returns: a dict's output_key entry (or its one
    entry), a tuple's first item (some transformers return their attention maps beside it, as
    JumpStart's extract_only_feature_tensor says)."""
    if isinstance(outputs, dict):
        if output_key is None and len(outputs) == 1:
            return next(iter(outputs.values()))
        if output_key not in outputs:
            raise UserError(f"channel '{CHANNEL}': the SavedModel answers {', '.join(sorted(outputs))}; its model "
                            f"info's output_key ({output_key}) must name one of them")
        return outputs[output_key]
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def _used_variables(functions) -> list:
    seen, found = set(), []
    for function in functions:
        for variable in function.variables:
            if id(variable) not in seen:
                seen.add(id(variable))
                found.append(variable)
    return found


def build_backbone(pretrained: Pretrained, image_size: int, batchnorm_trains: bool = False) -> keras.Model:
    """The backbone: images (in the model's scaling) -> features, as one layer. It decides its
    training mode itself (SavedModelFeatures): the classifier calls it with Keras' own flag."""
    images = keras.Input((image_size, image_size, 3), name="scaled_images")
    try:
        layer = SavedModelFeatures(pretrained.folder, pretrained.signature, pretrained.output_key, batchnorm_trains,
                                   keep=pretrained, name="savedmodel")
        features = layer(images)
    except UserError:
        raise
    except Exception as err:  # (TensorFlow raises many kinds on a SavedModel it cannot load or call)
        raise UserError(f"channel '{CHANNEL}': {pretrained.source}'s SavedModel cannot be used as the backbone "
                        f"on {image_size} px images ({type(err).__name__}: {str(err)[:400]})") from err
    if len(features.shape) not in (2, 4):
        raise UserError(f"channel '{CHANNEL}': {pretrained.source}'s SavedModel gives features of shape "
                        f"{tuple(features.shape)}: a vector or a map per image is needed")
    log.info("backbone: the SavedModel in channel '%s' (%s), %d weights (%d trainable), features %s", CHANNEL,
             pretrained.source, len(layer.weights), len(layer.trainable_weights), tuple(features.shape[1:]))
    return keras.Model(images, features, name=NAME)


def is_savedmodel_backbone(backbone: keras.Model) -> bool:
    return any(isinstance(layer, SavedModelFeatures) for layer in backbone.layers)
