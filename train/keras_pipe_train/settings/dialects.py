"""Dialects: the hyperparameters of SageMaker's two built-in image classifiers, read with the
meanings and defaults those algorithms give them, so that a request written for one of them
trains here unchanged (docs/migration.md shows each side by side).

A request speaks one of three dialects:
  keras-pipe   this job's own names and defaults (docs/job.md)
  mxnet        the built-in Image Classification algorithm (MXNet), AWS's IC-Hyperparameter page
  tensorflow   the built-in Image Classification - TensorFlow algorithm (JumpStart),
               AWS's IC-TF-Hyperparameter page and what JumpStart's retrieve_default sends
The hyperparameter `dialect` says which; without it, the names the request uses decide: a name
only one built-in has (MXNET_ONLY, TENSORFLOW_ONLY: num_training_samples, image_shape ...;
train_only_top_layer, binary_mode ...) makes the request that built-in's, and names of both are
refused. A name the built-in shares with this job (epochs, learning_rate, weight_decay ...) then
takes the built-in's meaning: MXNet's `epochs` train the whole network, its `weight_decay` is an L2
term in the gradient of sgd and nag, its `mini_batch_size` is per host.

Which names are this job's, and which of a built-in's are only another name for one of ours
(mini_batch_size, eps, dropout_rate ...), the definitions say (hyperparameters.py: `names`); the
tables below hold the built-ins' own hyperparameters, and the code below how each becomes ours.

`translate` returns the request in this job's names (JobConfig.from_hyperparameters reads them),
with the dialect itself (`dialect`, which the export writes for `serve`: each built-in's clients
get the answers they parse) and what the log should say about names that have no effect here.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json

from keras_pipe_train.settings import parsers
from keras_pipe_train.settings.backbones import IMAGENET_RESNET_DEPTHS, RESNET_DEPTHS
from keras_pipe_train.settings.errors import UserError

# (the dialects' names are defined with the hyperparameter `dialect`, and read from here too)
from keras_pipe_train.settings.hyperparameters import DIALECTS, HYPERPARAMETERS, KERAS_PIPE, MXNET, TENSORFLOW

ALL_LAYERS = 1_000_000  # fine_tune_layers that unfreezes every layer of any backbone
# the TensorFlow algorithm takes a TF Hub model by model_id, not a hyperparameter: here the backbone of
# AWS's sample notebook's model, MobileNet V2 at 224 px, unless `backbone` says another
TENSORFLOW_BACKBONE = "mobilenet_v2"


@dataclasses.dataclass(frozen=True)
class Name:
    """One hyperparameter of a built-in algorithm: its default there (None: none), and what it
    does here (the migration page's row)."""
    name: str
    default: str | None
    here: str


MXNET_NAMES = {n.name: n for n in (
    Name("num_classes", None, "num_classes"),
    Name("num_training_samples", None, "accepted, not needed: the job counts the examples it reads"),
    Name("num_layers", "152", "backbone: the ResNet of that depth (18, 34, 50, 101, 152, 200; 20, 32, 44, 56, 110 "
                              "for small images), built here where Keras has none"),
    Name("use_pretrained_model", "0", "1: weights=imagenet (depths 18, 34, 50, 101, 152), every layer trained from "
                                      "the first epoch, BatchNorm included (train_batchnorm); 0: weights=none"),
    Name("image_shape", "3,224,224", "image_size: its height and width, which must be equal; 3 channels"),
    Name("epochs", "30", "epochs of the whole network (phase 2 from the start, every layer unfrozen)"),
    Name("learning_rate", "0.1", "learning_rate (and fine_tune_learning_rate: one rate for every layer)"),
    Name("optimizer", "sgd", "optimizer: sgd, adam, rmsprop, nag (nesterov)"),
    Name("momentum", "0.9", "momentum, for sgd and nag; ignored (0) for adam and rmsprop, as MXNet does"),
    Name("weight_decay", "0.0001", "weight_decay_style=l2: an L2 term in each trained weight's gradient, for sgd "
                                   "and nag; ignored for adam and rmsprop, as MXNet does"),
    Name("beta_1", "0.9", "beta_1"),
    Name("beta_2", "0.999", "beta_2"),
    Name("eps", "1e-8", "epsilon"),
    Name("gamma", "0.9", "rho"),
    Name("mini_batch_size", "32", "batch_size: mini_batch_size x the number of hosts (MXNet's is per host)"),
    Name("lr_scheduler_step", None, "lr_scheduler_step (lr_schedule=step)"),
    Name("lr_scheduler_factor", "0.1", "lr_scheduler_factor"),
    Name("augmentation_type", None, "augment: none by default; crop: crop,flip; crop_color: crop,flip,color; "
                                    "crop_color_transform: crop,flip,color,rotate,shear,aspect"),
    Name("resize", None, "resize: the shorter side, before the crop (training) or the centre crop (validation); "
                         "unset: resize=original, image_shape taken from each image at its own scale, as MXNet's "
                         "ImageRecordIter does. Serving resizes each image to image_shape whole, as AWS's page says "
                         "the built-in does"),
    Name("top_k", None, "top_k"),
    Name("multi_label", "0", "multi_label; the labels of .rec, .lst and augmented manifests one 0 or 1 per class "
                             "(label_format=multi_hot), unless the ContentType says label-format=class-id"),
    Name("use_weighted_loss", "0", "use_weighted_loss"),
    Name("early_stopping", "False", "early_stopping, watching val_accuracy"),
    Name("early_stopping_min_epochs", "10", "early_stopping_min_epochs"),
    Name("early_stopping_patience", "5", "early_stopping_patience"),
    Name("early_stopping_tolerance", "0.0", "early_stopping_tolerance"),
    Name("checkpoint_frequency", None, "keep_epoch_models: every N epochs, that epoch's model is kept in "
                                       "model.tar.gz (epochs/epoch-NNNN.keras), beside the model exported, which is "
                                       "the epoch of the best validation accuracy (the built-in's default)"),
    Name("precision_dtype", "float32", "mixed_precision: float16 is true, float32 false"),
    Name("kv_store", None, "accepted, no effect: hosts always train synchronously"),
)}

TENSORFLOW_NAMES = {n.name: n for n in (
    Name("train_only_top_layer", "False", "True: epochs train the head only; False: every layer, from the start, "
                                          "BatchNorm included (train_batchnorm)"),
    Name("train_only_on_top_layer", "False", "the same as train_only_top_layer (AWS's page spells it so)"),
    Name("epochs", "3", "epochs (of the head, or of every layer: train_only_top_layer)"),
    Name("batch_size", "32", "batch_size"),
    Name("optimizer", "adam", "optimizer: adam, sgd, nesterov, rmsprop, adagrad, adadelta"),
    Name("learning_rate", "0.001", "learning_rate"),
    Name("beta_1", "0.9", "beta_1"),
    Name("beta_2", "0.999", "beta_2"),
    Name("momentum", "0.9", "momentum"),
    Name("epsilon", "1e-7", "epsilon"),
    Name("rho", "0.95", "rho"),
    Name("initial_accumulator_value", "0.0001", "initial_accumulator_value"),
    Name("reinitialize_top_layer", "Auto", "reinitialize_top_layer"),
    Name("early_stopping", "False", "early_stopping, watching val_accuracy; stopped early or not, the model exported "
                                    "is the epoch of the best val_accuracy (export_epoch=best), as JumpStart's script "
                                    "restores it"),
    Name("early_stopping_patience", "5", "early_stopping_patience"),
    Name("early_stopping_min_delta", "0.0", "early_stopping_min_delta"),
    Name("dropout_rate", "0.2", "dropout"),
    Name("regularizers_l2", "0.0001", "regularizers_l2"),
    Name("label_smoothing", "0.1", "label_smoothing"),
    Name("image_resize_interpolation", "bilinear", "resize_interpolation"),
    Name("augmentation", "False", "augment: True is flip,rotate,zoom with the three below"),
    Name("augmentation_random_flip", "horizontal_and_vertical", "augmentation_random_flip (None: no flip)"),
    Name("augmentation_random_rotation", "0.2", "augmentation_random_rotation (its size: either sign turns both "
                                                "ways, as Keras' RandomRotation)"),
    Name("augmentation_random_zoom", "0.1", "augmentation_random_zoom (its size, as Keras' RandomZoom)"),
    Name("binary_mode", "False", "False only: True's single probability has no equivalent here (a 2-class model "
                                 "answers both classes' probabilities)"),
    Name("eval_metric", "accuracy", "accuracy only (the metric binary_mode=False allows)"),
    Name("validation_split_ratio", "0.2", "validation_split_ratio: the share of the training channel kept for "
                                          "validation when there is no validation channel"),
    Name("random_seed", "123", "seed"),
)}

# each built-in's names for ours (the definitions' `names`): the value as given is ours (MXNet's
# mini_batch_size is per host: _from_mxnet multiplies it)
RENAMED = {dialect: {h.names[dialect]: name for name, h in HYPERPARAMETERS.items() if dialect in h.names}
           for dialect in (MXNET, TENSORFLOW)}
# a built-in's number that is one of ours under another name (a tuning job's range is typed by ours)
NUMBERS_AS = {theirs: ours for renamed in RENAMED.values() for theirs, ours in renamed.items()
              if HYPERPARAMETERS[ours].tuning_range != "Categorical"}

# the names that make a request a built-in's: its names this job does not also use
MXNET_ONLY = tuple(name for name in MXNET_NAMES if name not in HYPERPARAMETERS)
TENSORFLOW_ONLY = tuple(name for name in TENSORFLOW_NAMES if name not in HYPERPARAMETERS)


# a built-in's name and the one of this job's that sets the same thing: giving both is refused (which
# should win would be a guess). Its other names for ours, and the settings it gives in its own form, which
# the code below translates; `weights` beside use_pretrained_model is not one: it says where the weights
# come from
SAME_SETTING = {**RENAMED[MXNET], **RENAMED[TENSORFLOW],
                "num_layers": "backbone", "image_shape": "image_size", "augmentation_type": "augment",
                "precision_dtype": "mixed_precision", "augmentation": "augment",
                "train_only_top_layer": "fine_tune_epochs", "train_only_on_top_layer": "fine_tune_epochs",
                "checkpoint_frequency": "keep_epoch_models"}


@dataclasses.dataclass(frozen=True)
class Translation:
    dialect: str
    hyperparameters: dict  # this job's names, values as SageMaker sends them (strings, or as given)
    notes: tuple[str, ...]  # for the log: what was decided, and names accepted without effect


def dialect_of(raw: dict) -> str:
    """The request's dialect: its `dialect` hyperparameter, or the built-in whose own names it uses."""
    given = _text(raw.get("dialect", "auto")).lower()
    if given not in (*DIALECTS, "auto"):
        raise UserError(f"hyperparameter dialect must be auto, {', '.join(DIALECTS)}; got {raw['dialect']!r}")
    mxnet = sorted(name for name in raw if name in MXNET_ONLY)
    tensorflow = sorted(name for name in raw if name in TENSORFLOW_ONLY)
    if given == "auto":
        if mxnet and tensorflow:
            raise UserError(f"the hyperparameters mix the built-in MXNet algorithm's names ({', '.join(mxnet)}) with "
                            f"the built-in TensorFlow algorithm's ({', '.join(tensorflow)}): use one algorithm's, or "
                            "set dialect")
        return MXNET if mxnet else TENSORFLOW if tensorflow else KERAS_PIPE
    foreign = {MXNET: tensorflow, TENSORFLOW: mxnet, KERAS_PIPE: mxnet + tensorflow}[given]
    if foreign:
        raise UserError(f"hyperparameter dialect={given}, but {', '.join(foreign)} "
                        f"{'is' if len(foreign) == 1 else 'are'} another dialect's")
    return given


WHO = {KERAS_PIPE: "this job's own", MXNET: "the built-in MXNet image classification algorithm's",
       TENSORFLOW: "the built-in TensorFlow image classification algorithm's"}


# (weights=None is Keras' own "no pretrained weights", augment=None no augmentation, and the built-in
# TensorFlow algorithm's augmentation_random_flip=None no flip: their parsers read it. Any other
# name given None or null is not given: its default is the request's dialect's)
NONE_IS_A_VALUE = ("weights", "augment", "augmentation_random_flip")


def without_unset(raw: dict) -> dict:
    """The request less the names given None or null ("" is a value, refused where it is wrong)."""
    return {name: value for name, value in raw.items()
            if name in NONE_IS_A_VALUE or not parsers.is_unset(value)}


def translate(raw: dict, hosts: int = 1) -> Translation:
    """The request in this job's names. `hosts`: how many hosts train (MXNet's batch is per host)."""
    raw = without_unset(raw)
    dialect = dialect_of(raw)
    own = {MXNET: MXNET_ONLY, TENSORFLOW: TENSORFLOW_ONLY}.get(dialect, ())
    why = "as hyperparameter dialect says" if _text(raw.get("dialect", "auto")).lower() != "auto" else \
        f"from {', '.join(sorted(n for n in raw if n in own))}" if own else "no built-in's own name is given"
    said = f"dialect {dialect}: the hyperparameters are read with {WHO[dialect]} names, meanings and defaults ({why})"
    for builtin, ours in SAME_SETTING.items():
        if builtin in raw and ours in raw:
            raise UserError(f"hyperparameters {builtin} and {ours} are one setting ({builtin} is {WHO[dialect]} name "
                            "for it): give one")
    raw = {name: value for name, value in raw.items() if name != "dialect"}
    if dialect == MXNET:
        ours, notes = _from_mxnet(raw, hosts)
    elif dialect == TENSORFLOW:
        ours, notes = _from_tensorflow(raw)
    else:
        ours, notes = dict(raw), []
    return Translation(dialect, {**ours, "dialect": dialect}, (said, *notes))


# --- MXNet ------------------------------------------------------------------------------------------

def _from_mxnet(raw: dict, hosts: int) -> tuple[dict, list[str]]:
    given = dict(raw)
    value = {name: given.pop(name, spec.default) for name, spec in MXNET_NAMES.items()}
    ours, notes = {}, []
    for name in ("num_training_samples", "kv_store"):
        if value[name] is not None:
            notes.append(f"{name}={_text(value[name])}: {MXNET_NAMES[name].here}")
    ours.update(_mxnet_model(value, given.get("weights")))
    ours.update(_mxnet_optimizer(value))
    ours.update(_renamed(value, MXNET))
    batch = _whole(value["mini_batch_size"], "mini_batch_size")
    ours["batch_size"] = str(batch * hosts)
    if hosts > 1:
        notes.append(f"mini_batch_size={batch} per host (MXNet's): batch_size {batch * hosts} on {hosts} hosts")
    ours["augment"] = _mxnet_augmentation(value["augmentation_type"])
    ours["dropout"] = "0"  # the built-in's ResNet has none before its classifier (MXNet's symbols/resnet.py)
    for name in ("num_classes", "lr_scheduler_step", "top_k"):
        if value[name] is not None:
            ours[name] = value[name]
    if value["checkpoint_frequency"] is not None:  # (a positive integer, AWS's page says: 0 is not "none" there)
        ours["keep_epoch_models"] = str(_whole(value["checkpoint_frequency"], "checkpoint_frequency"))
    # without resize, MXNet's ImageRecordIter crops image_shape out of each image as it is
    ours["resize"] = value["resize"] if value["resize"] is not None else "original"
    ours["lr_scheduler_factor"] = value["lr_scheduler_factor"]
    ours["multi_label"] = value["multi_label"]
    ours["use_weighted_loss"] = value["use_weighted_loss"]
    ours["mixed_precision"] = _choose(value["precision_dtype"], "precision_dtype",
                                      {"float32": "false", "float16": "true"})
    # early stopping watches validation accuracy; without it, the best epoch is still the one
    # exported (the built-in's checkpoint_frequency default)
    ours.update(early_stopping=value["early_stopping"], early_stopping_metric="val_accuracy",
                early_stopping_min_epochs=value["early_stopping_min_epochs"],
                early_stopping_patience=value["early_stopping_patience"],
                early_stopping_tolerance=value["early_stopping_tolerance"], export_epoch="best")
    ours["calibration"] = "false"  # (the built-in's own probabilities, unless calibration is asked for)
    ours.update(given)  # this job's own names, which any dialect takes as they are
    # MXNet's multi-label labels are one 0 or 1 per class, in its .rec and .lst files and in its
    # augmented manifests (unless their ContentType says label-format=class-id: sources/content_types.py)
    if (_flag(value["multi_label"], "multi_label") and "label_format" not in given
            and (ours.get("record_format") in ("recordio", "lst")
                 or _text(ours.get("attribute_names") or "") not in ("", "None", "null"))):
        ours["label_format"] = "multi_hot"
        notes.append("multi_label=1: label_format=multi_hot, one 0 or 1 per class, as the built-in MXNet algorithm "
                     "reads its .rec, .lst and augmented manifest labels")
    return ours, notes


def _mxnet_model(value: dict, weights) -> dict:
    """The backbone, its weights and what each epoch trains. `weights`: this job's hyperparameter,
    when given beside use_pretrained_model (it then says where the weights come from)."""
    depth = _whole(value["num_layers"], "num_layers")
    if depth not in RESNET_DEPTHS:
        raise UserError(f"hyperparameter num_layers must be one of {', '.join(map(str, RESNET_DEPTHS))} (the built-in "
                        f"MXNet algorithm's ResNet depths); got {depth}")
    pretrained = _choose(value["use_pretrained_model"], "use_pretrained_model", {"0": False, "1": True})
    if weights is not None:
        pretrained = parsers.weights("weights", weights) != "none"
    elif pretrained and depth not in IMAGENET_RESNET_DEPTHS:
        raise UserError(f"hyperparameter use_pretrained_model=1 needs a depth with ImageNet weights: num_layers "
                        f"{', '.join(map(str, IMAGENET_RESNET_DEPTHS))}; ResNet-{depth} has none here "
                        "(use_pretrained_model=0 trains it from scratch)")
    channels, height, width = _image_shape(value["image_shape"])
    epochs = value["epochs"]
    model = {"backbone": RESNET_DEPTHS[depth], "image_size": str(height),
             "weights": weights if weights is not None else "imagenet" if pretrained else "none"}
    if pretrained:  # every layer trained from the first epoch, BatchNorm too: phase 2 alone, nothing frozen
        model.update(epochs="0", fine_tune_epochs=epochs, fine_tune_layers=str(ALL_LAYERS), train_batchnorm="true")
    else:  # from scratch, phase 1 trains every layer
        model.update(epochs=epochs, fine_tune_epochs="0")
    return model


def _image_shape(text) -> tuple[int, int, int]:
    parts = [p.strip() for p in _text(text).split(",")]
    try:
        channels, height, width = (int(p) for p in parts)
    except ValueError:
        raise UserError(f"hyperparameter image_shape must be 'channels,height,width', e.g. 3,224,224; got "
                        f"{_text(text)!r}") from None
    if channels != 3:
        raise UserError(f"hyperparameter image_shape: the job trains on RGB images, 3 channels; got {channels}")
    if height != width:
        raise UserError(f"hyperparameter image_shape: the job's images are square; got {height}x{width}: use "
                        f"3,{max(height, width)},{max(height, width)} (images are resized to it)")
    return channels, height, width


def _mxnet_optimizer(value: dict) -> dict:
    optimizer = _choose(value["optimizer"], "optimizer", {"sgd": "sgd", "adam": "adam", "rmsprop": "rmsprop",
                                                          "nag": "nesterov"})
    # momentum and weight_decay are sgd's and nag's: AWS's page says of both "ignored for other optimizers"
    # (Keras' RMSprop would otherwise apply a momentum that MXNet's rmsprop does not)
    coupled = optimizer in ("sgd", "nesterov")
    return {"optimizer": optimizer, "learning_rate": value["learning_rate"],
            "fine_tune_learning_rate": value["learning_rate"], "momentum": value["momentum"] if coupled else "0",
            "weight_decay": value["weight_decay"] if coupled else "0", "weight_decay_style": "l2",
            "beta_1": value["beta_1"], "beta_2": value["beta_2"]}


def _mxnet_augmentation(kind) -> str:
    if kind is None:
        return "false"
    return _choose(kind, "augmentation_type", {"crop": "crop,flip", "crop_color": "crop,flip,color",
                                               "crop_color_transform": "crop,flip,color,rotate,shear,aspect"})


# --- TensorFlow -------------------------------------------------------------------------------------

def _from_tensorflow(raw: dict) -> tuple[dict, list[str]]:
    given = dict(raw)
    if "train_only_top_layer" in given and "train_only_on_top_layer" in given:
        raise UserError("hyperparameters train_only_top_layer and train_only_on_top_layer are one setting (AWS's page "
                        "spells it the second way): give one")
    if "train_only_on_top_layer" in given:
        given["train_only_top_layer"] = given.pop("train_only_on_top_layer")
    value = {name: given.pop(name, spec.default) for name, spec in TENSORFLOW_NAMES.items()
             if name != "train_only_on_top_layer"}
    if _flag(value["binary_mode"], "binary_mode"):
        raise UserError("hyperparameter binary_mode=True (a single probability for the positive class) has no "
                        "equivalent here: with binary_mode=False, the default, a 2-class model answers each class's "
                        "probability")
    if _text(value["eval_metric"]).lower() != "accuracy":
        raise UserError(f"hyperparameter eval_metric={_text(value['eval_metric'])}: only accuracy, as the built-in "
                        "takes with binary_mode=False")
    ours = {name: value[name] for name in ("batch_size", "optimizer", "learning_rate", "beta_1", "beta_2", "momentum",
                                           "epsilon", "rho", "initial_accumulator_value", "reinitialize_top_layer",
                                           "early_stopping", "early_stopping_patience", "early_stopping_min_delta",
                                           "regularizers_l2", "label_smoothing", "validation_split_ratio")}
    # the model AWS's notebook fine-tunes (tensorflow-ic-imagenet-mobilenet-v2-100-224-classification-4)
    ours.update(backbone=TENSORFLOW_BACKBONE, image_size="224")
    # JumpStart's transfer_learning.py watches val_accuracy, for early stopping and for the epoch whose
    # weights it restores at the end, whether it stops early or not (its ModelSelectionCallback)
    ours.update(_renamed(value, TENSORFLOW))
    ours.update(early_stopping_metric="val_accuracy", export_epoch="best", record_format="class_folders")
    # (its TopKCategoricalAccuracy, k=5, past 5 classes, for one class per image: multi_label is this job's)
    if (classes := _class_count(given)) and classes > 5 and not _flag(given.get("multi_label", "false"),
                                                                       "multi_label"):
        ours["top_k"] = "5"
    if _flag(value["train_only_top_layer"], "train_only_top_layer"):
        ours.update(epochs=value["epochs"], fine_tune_epochs="0")
    else:  # every layer fine-tuned from the start, at the one learning rate; its TF Hub model's
        # BatchNorm too (hub.KerasLayer(trainable=True) runs it in training mode)
        ours.update(epochs="0", fine_tune_epochs=value["epochs"], fine_tune_layers=str(ALL_LAYERS),
                    fine_tune_learning_rate=value["learning_rate"], train_batchnorm="true")
    ours.update(_tensorflow_augmentation(value))
    ours["calibration"] = "false"  # (the built-in's own probabilities, unless calibration is asked for)
    ours.update(given)
    return ours, []


def _class_count(given: dict) -> int | None:
    """How many classes a request names (num_classes, or class_names: the class folders'), if it
    says, read by their own definitions' parsers (every form they take: JSON, Python's repr, "10.0")."""
    for name in ("class_names", "num_classes"):
        try:
            value = HYPERPARAMETERS[name].parse(name, given[name]) if given.get(name) is not None else None
        except UserError:
            return None  # (the job's own check names it)
        if value is not None:
            return len(value) if name == "class_names" else value
    return None


def _tensorflow_augmentation(value: dict) -> dict:
    if not _flag(value["augmentation"], "augmentation"):
        return {"augment": "false"}
    flip = _text(value["augmentation_random_flip"])
    kinds = ["rotate", "zoom"] if flip.lower() == "none" else ["flip", "rotate", "zoom"]
    out = {"augment": ",".join(kinds), "augmentation_random_rotation": _size(value["augmentation_random_rotation"]),
           "augmentation_random_zoom": _size(value["augmentation_random_zoom"])}
    if flip.lower() != "none":
        out["augmentation_random_flip"] = flip
    return out


def _renamed(value: dict, dialect: str) -> dict:
    """The built-in's values that are ours under another name (eps: epsilon), as given."""
    return {ours: value[theirs] for theirs, ours in RENAMED[dialect].items()}


# --- values, as the built-ins' clients send them ------------------------------------------------------

def _text(value) -> str:
    """A value's text, one layer of JSON quoting removed (SDK v3 and v2's frameworks json.dumps it)."""
    text = str(value).strip()
    try:
        decoded = json.loads(text)
    except ValueError:
        return text
    return decoded.strip() if isinstance(decoded, str) else text


def _whole(value, name: str) -> int:
    text = _text(value)
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not number.is_integer() or number < 1:
        raise UserError(f"hyperparameter {name} must be a positive integer, got {text!r}")
    return int(number)


def _flag(value, name: str) -> bool:
    return parsers.Flag()(name, value)  # (the forms this job's own flags take: yes/no too)


def _choose(value, name: str, options: dict):
    text = _text(value).lower()
    if text not in options:
        raise UserError(f"hyperparameter {name} must be one of {', '.join(options)}; got {_text(value)!r}")
    return options[text]


def _size(value) -> str:
    """A signed factor's size: the built-in takes -x as the same range as x."""
    text = _text(value)
    try:
        return str(abs(float(text)))
    except ValueError:
        return text  # (the job's own check names it)
