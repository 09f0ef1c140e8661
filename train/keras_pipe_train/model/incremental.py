"""Incremental training: a previous job's model, given in a `model` channel, continued.

As with SageMaker's built-in image classifiers, the channel holds what a job left in S3: its
model.tar.gz (File mode copies it as it is), or the model/ folder's files. The job reads
model.keras and classes.json from it (out of the archive, without unpacking anything else), builds
its model from its own hyperparameters as usual, and copies the previous model's weights into it:
the backbone's always; the classifier's when the classes are the same (`reinitialize_top_layer`,
the TensorFlow algorithm's name: auto keeps a head of the same classes and replaces any other,
true always replaces it, false refuses other classes). Building anew, rather than training the
loaded model, keeps every setting of this job (image size, dropout, L2, the head's activation)
and needs no trust in the file's graph beyond Keras' safe loading.

A model.tar.gz (or folder) of JumpStart's pretrained SavedModel, in its place, is not continued but
taken as the backbone: load() hands it to model/jumpstart.py.
"""

from __future__ import annotations

import json
import logging
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

import keras

from keras_pipe_train.model import hub, jumpstart
from keras_pipe_train.model.classifier import backbone_of
from keras_pipe_train.settings.backbones import BACKBONES
from keras_pipe_train.settings.channels import MODEL
from keras_pipe_train.settings.errors import UserError

log = logging.getLogger(__name__)

MODEL_FILE, CLASSES_FILE = "model.keras", "classes.json"
MAX_MODEL_BYTES = 8 << 30  # model.keras of the largest backbone (ConvNeXt XLarge, 350M weights) is 1.4 GB
MAX_CLASSES_BYTES = 64 << 20


class Previous:
    """The model in the channel: the Keras model, its class names, and where it came from."""

    def __init__(self, model: keras.Model, classes: list[str], source: str):
        self.model, self.classes, self.source = model, classes, source

    @property
    def backbone_name(self) -> str | None:
        name = self.model.name.removesuffix("_classifier")
        known = name in BACKBONES or name == hub.NAME
        return name if known and self.model.name.endswith("_classifier") else None

    @property
    def multi_label(self) -> bool:
        return self.model.get_layer("classifier").activation.__name__ == "sigmoid"


def load(folder: Path) -> Previous | jumpstart.Pretrained:
    """The model in the channel's folder: a previous job's model, or a pretrained SavedModel
    (JumpStart's, model/jumpstart.py) to start from; a UserError says what is missing or wrong."""
    if not folder.is_dir():
        raise UserError(f"channel '{MODEL}' folder {folder} does not exist (the channel must be in File or FastFile "
                        "mode)")
    archives = sorted(p for p in folder.rglob("*.tar.gz") if p.is_file())
    models = sorted(p for p in folder.rglob(MODEL_FILE) if p.is_file())
    found = archives + models
    if not found and any(folder.rglob(jumpstart.SAVED_MODEL)):
        names = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
        if not jumpstart.is_pretrained_archive(names):
            raise UserError(f"channel '{MODEL}': {folder} holds no {MODEL_FILE}{_foreign({'savedmodel'})}")
        return jumpstart.from_folder(folder)
    if len(found) != 1:
        listed = ", ".join(str(p.relative_to(folder)) for p in found[:5]) or "neither"
        raise UserError(f"channel '{MODEL}' must hold one previous model: its model.tar.gz (as SageMaker stores a "
                        f"job's model) or its model/ folder's {MODEL_FILE} and {CLASSES_FILE}; or one pretrained "
                        f"model (JumpStart's .tar.gz); {folder} holds {listed}")
    with tempfile.TemporaryDirectory() as work:
        if archives:
            unpacked = _unpack(archives[0], Path(work))
            if unpacked is None:
                return jumpstart.from_archive(archives[0], folder)
            model_path, classes_path = unpacked
        else:
            model_path, classes_path = models[0], models[0].with_name(CLASSES_FILE)
        source = str(found[0].relative_to(folder))
        try:
            model = hub.load_keras_file(model_path)
        except Exception as err:  # (Keras raises ValueError, TypeError, zipfile and h5py errors)
            raise UserError(f"channel '{MODEL}': {source} holds a {MODEL_FILE} that Keras cannot load "
                            f"({type(err).__name__}: {str(err)[:300]})") from err
        classes = _classes(classes_path, source)
    previous = Previous(model, classes, source)
    layers = {layer.name for layer in model.layers}
    nested = [layer for layer in model.layers if isinstance(layer, keras.Model)]
    if (previous.backbone_name is None or "classifier" not in layers or len(nested) != 1
            or len(classes) != model.output_shape[-1]):
        raise UserError(f"channel '{MODEL}': {source} is not a model this job exported (its model is "
                        f"{model.name!r} with {model.output_shape[-1]} outputs for {len(classes)} class names)")
    return previous


def _unpack(archive: Path, work: Path) -> tuple[Path, Path] | None:
    """model.keras and classes.json out of the archive, as regular files of at most so much: no
    other member is read, and no member's name or link decides where anything is written. None:
    the archive is a pretrained SavedModel's (jumpstart.is_pretrained_archive)."""
    wanted = {MODEL_FILE: MAX_MODEL_BYTES, CLASSES_FILE: MAX_CLASSES_BYTES}
    got, kinds, names = {}, set(), set()
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                kinds.add(_kind(name))
                names.add(name)
                if name not in wanted or name in got:
                    continue
                if not member.isreg() or member.size > wanted[name]:
                    raise UserError(f"channel '{MODEL}': {archive.name}'s {name} is not a regular file of at most "
                                    f"{wanted[name] >> 20} MB")
                with tar.extractfile(member) as source, open(work / name, "wb") as target:
                    shutil.copyfileobj(source, target)
                got[name] = work / name
            # to the end of the gzip stream, which checks its CRC: tarfile takes a damaged header
            # after the first for the archive's end, and would hand over damaged members unsaid
            while tar.fileobj.read(1 << 20):
                pass
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:  # (zlib: a damaged member's data)
        raise UserError(f"channel '{MODEL}': {archive.name} cannot be read as a model.tar.gz "
                        f"({type(err).__name__}: {err})") from err
    if MODEL_FILE not in got and jumpstart.is_pretrained_archive(names):
        return None
    if MODEL_FILE not in got:
        raise UserError(f"channel '{MODEL}': {archive.name} holds no {MODEL_FILE} at its top: it must be a "
                        f"model.tar.gz this job exported (a SageMaker job's output/model.tar.gz){_foreign(kinds)}")
    return got[MODEL_FILE], got.get(CLASSES_FILE, work / CLASSES_FILE)


def _kind(name: str) -> str | None:
    """What an archive member says of the model it belongs to, when it is not one of this job's."""
    base = name.rsplit("/", 1)[-1]
    if base == "saved_model.pb":
        return "savedmodel"
    return "mxnet" if base.endswith("-symbol.json") else None


def _foreign(kinds: set) -> str:
    """What a model.tar.gz that is not this job's is, and the way round, as the end of a sentence."""
    if "savedmodel" in kinds:
        return (". It holds a serving SavedModel beside its serving.json instead: a model this job trained on a "
                "pretrained SavedModel (JumpStart's), which exports no model.keras and cannot be continued "
                "(model/jumpstart.py says why): train anew from that pretrained model")
    if "mxnet" in kinds:
        # (At depths 18 to 152 MXNet's symbol is a pre-activation ResNet, and the ResNets built here
        # are v1. At 20 to 110 on small images its blocks are those of resnets.CIFARResNet, its
        # BatchNorm on the raw input (bn_data) aside; but AWS publishes neither that its built-in is
        # MXNet's example symbol nor the pixel scaling it feeds it, and no built-in model was at
        # hand to check a conversion against.)
        return (". It holds an MXNet model (a symbol and its params) instead: the built-in MXNet algorithm's, "
                "which cannot be continued here (its pre-activation ResNet and input scaling are not a network "
                "built here): train anew with use_pretrained_model=1, which starts from ImageNet weights")
    return ""


def _classes(path: Path, source: str) -> list[str]:
    try:
        classes = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"channel '{MODEL}': {source} has no readable {CLASSES_FILE} beside its {MODEL_FILE} "
                        f"({type(err).__name__})") from err
    if not (isinstance(classes, list) and all(isinstance(name, str) for name in classes)):
        raise UserError(f"channel '{MODEL}': {source}'s {CLASSES_FILE} is not a list of class names")
    return classes


def continue_from(previous: Previous, model: keras.Model, backbone_name: str, class_names: tuple[str, ...],
                  multi_label: bool, reinitialize_top_layer: str) -> bool:
    """Copies the previous model's weights into `model` (built for this job): the backbone's, and
    the classifier's unless it is replaced. Returns whether the head was kept."""
    # (a keras-hub backbone's model is named for no handle: the weights' shapes tell a mismatch below)
    backbone_name = hub.classifier_prefix(backbone_name)
    if previous.backbone_name != backbone_name:
        wanted = ("backbone to the keras-hub preset or handle it was trained from" if previous.backbone_name == hub.NAME
                  else f"backbone={previous.backbone_name}")
        described = "a keras-hub backbone" if previous.backbone_name == hub.NAME else previous.backbone_name
        raise UserError(f"channel '{MODEL}': the previous model's backbone is {described}, and this job's is "
                        f"{backbone_name}: set hyperparameter {wanted} to continue it")
    if backbone_name in BACKBONES and not BACKBONES[backbone_name].loads_weight_files:
        raise UserError(f"channel '{MODEL}': backbone {backbone_name} cannot be continued from a model's weights "
                        "(its application builds its input scaling differently for ImageNet weights); train it anew")
    try:
        backbone_of(model).set_weights(backbone_of(previous.model).get_weights())
    except ValueError as err:
        raise UserError(f"channel '{MODEL}': the previous model's backbone weights do not fit this job's "
                        f"({str(err)[:300]})") from err
    same = list(class_names) == previous.classes and multi_label == previous.multi_label
    if reinitialize_top_layer == "false" and not same:
        raise UserError(f"channel '{MODEL}': reinitialize_top_layer=false keeps the previous classifier, which was "
                        f"trained for {_described(previous.classes, previous.multi_label)}; this job has "
                        f"{_described(list(class_names), multi_label)}. Set reinitialize_top_layer=auto to replace it")
    keep = same and reinitialize_top_layer != "true"
    if keep:
        model.get_layer("classifier").set_weights(previous.model.get_layer("classifier").get_weights())
    why = ("the same classes" if keep else "reinitialize_top_layer=true" if same
           else f"the classes differ: it was trained for {_described(previous.classes, previous.multi_label)}")
    log.info("incremental training: continuing %s (channel '%s', backbone %s): the backbone's weights, and the "
             "classifier %s (%s)", previous.source, MODEL, backbone_name, "kept" if keep else "replaced", why)
    return keep


def _described(classes: list[str], multi_label: bool) -> str:
    shown = ", ".join(classes[:8]) + (", ..." if len(classes) > 8 else "")
    return f"{len(classes)} classes ({shown}){', multi-label' if multi_label else ''}"
