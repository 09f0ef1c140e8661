"""The training job's hyperparameters: one typed, validated config with its defaults in one place.

`HYPERPARAMETERS` is the schema. The launcher checks a job's hyperparameters against it before
submitting (so there is one source of truth), and `JobConfig.from_hyperparameters` turns
SageMaker's hyperparameters (strings, in whichever form the client that set them used: see
`_unquoted`) into a JobConfig, or raises a UserError naming the hyperparameter and what is allowed. No TensorFlow here.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import math
from collections.abc import Callable
from typing import Any

from keras_pipe_train.settings import dialects
from keras_pipe_train.settings.backbones import BACKBONES as BACKBONE_TABLE
from keras_pipe_train.settings.errors import UserError

DEFAULT_MAX_PIXELS = 100_000_000  # 100 megapixels, 300 MB decoded: above any phone or camera's default
BACKBONES = tuple(BACKBONE_TABLE)  # every Keras application (backbones.py)
AUGMENTATIONS = ("crop", "flip", "color", "rotate", "zoom", "aspect", "shear")
DEFAULT_AUGMENTATIONS = ("crop", "flip", "color")  # augment=true; all: every one
FLIPS = ("horizontal", "vertical", "horizontal_and_vertical")
WEIGHT_SOURCES = ("imagenet", "none", "pretrained")  # or a path to a weights file
MIXED_PRECISION = ("auto", "true", "false")
OTHER_CHECKPOINTS = ("refuse", "resume", "ignore")  # (training/checkpoints.py says what each does)
OPTIMIZERS = ("adam", "adamw", "sgd", "nesterov", "rmsprop", "adagrad", "adadelta")  # (training/recipe.py builds them)
SCHEDULES = ("constant", "cosine", "step")
LABEL_FORMATS = ("index", "multi_hot")
# what the train and validation channels hold (Ground Truth manifests: attribute_names)
RECORD_FORMATS = ("tfrecord", "class_folders", "recordio", "lst")
# what early stopping may watch (each only where the job reports it: _reported_metrics)
EARLY_STOPPING_METRICS = ("val_loss", "val_accuracy", "val_top_k_accuracy", "val_f1_micro", "val_f1_macro",
                          "val_precision_micro", "val_recall_micro", "val_auc")

# the interpolations tf.image.resize offers (the built-in TensorFlow algorithm's image_resize_interpolation)
INTERPOLATIONS = ("bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5", "gaussian", "mitchellcubic")
WEIGHT_DECAY_STYLES = ("decoupled", "l2")
EXPORT_EPOCHS = ("last", "best")
CALIBRATION = ("auto", "true", "false")  # (training/calibration.py)

# Set by SageMaker or its SDKs, not by the user: accepted and ignored. A tuning job adds
# _tuning_objective_metric to each of its training jobs; the SDKs add sagemaker_* and model_dir.
_PLATFORM_PREFIXES = ("sagemaker_", "_tuning_")
_PLATFORM_NAMES = ("model_dir",)


@dataclasses.dataclass(frozen=True)
class Hyperparameter:
    name: str
    default: Any
    parse: Callable[[str, Any], Any]
    help: str

    @property
    def tuning_range(self) -> str:
        """The kind of range a tuning job may give it: Integer, Continuous, or (any) Categorical."""
        return getattr(self.parse, "tuning_range", "Categorical")


def _unquoted(value):
    """A value with one layer of JSON string quoting removed: '"8"' -> "8", '"imagenet"' -> "imagenet".

    SageMaker passes every hyperparameter as a string, and each client encodes differently: the v2
    Estimator sends str(value) ("8", "False", "['a', 'b']"), v2 framework estimators and the v3
    ModelTrainer send json.dumps(value) ('"imagenet"', "false", '["a", "b"]'), and a tuning job's
    categorical values arrive as the strings they were given, JSON-quoted again by v2 frameworks
    ('"8"'). Every parser below starts from this, then reads the forms its type can take.
    """
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value.strip()
        if isinstance(decoded, str):
            return decoded.strip()
    return value


def _numeric(value):
    """int/float from a number or its text ("8", "8.0", "1e-3", ".5"); anything else unchanged."""
    value = _unquoted(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                return float(value)
            except ValueError:
                return value
    return value


def _integer(minimum: int, maximum: int | None = None):
    def parse(name, value):
        number = _numeric(value)
        if isinstance(number, float) and number.is_integer():
            number = int(number)  # tuning's IntegerParameter and JSON both may say 8.0
        if isinstance(number, bool) or not isinstance(number, int):
            raise UserError(f"hyperparameter {name} must be an integer, got {value!r}")
        if number < minimum or (maximum is not None and number > maximum):
            bounds = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
            raise UserError(f"hyperparameter {name} must be {bounds}, got {number}")
        return number

    parse.tuning_range = "Integer"  # which range of a tuning job can set it (launch tune)
    return parse


def _word_or(word: str, parse_value):
    """`word` (any case, any quoting), or what `parse_value` reads ("auto", resize's "original")."""
    def parse(name, value):
        if str(_unquoted(value)).lower() == word:
            return word
        try:
            return parse_value(name, value)
        except UserError as err:
            raise UserError(f"{err} (or {word})") from None

    parse.tuning_range = parse_value.tuning_range
    return parse


def _number(minimum: float, maximum: float, *, open_low: bool = True):
    def parse(name, value):
        number = _numeric(value)
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise UserError(f"hyperparameter {name} must be a number, got {value!r}")
        # "nan", "NaN" and "Infinity" parse as floats that pass every comparison
        if not math.isfinite(number):
            raise UserError(f"hyperparameter {name} must be a finite number, got {value!r}")
        if number < minimum or number > maximum or (open_low and number == minimum):
            low = "> " if open_low else ">= "
            raise UserError(f"hyperparameter {name} must be {low}{minimum:g} and <= {maximum:g}, got {number}")
        return float(number)

    parse.tuning_range = "Continuous"
    return parse


def _choice(options: tuple[str, ...], aliases: dict[str, str] | None = None):
    def parse(name, value):
        # case-insensitive: the v2 Estimator sends str(False) == "False"
        text = str(_unquoted(value)).lower()
        text = (aliases or {}).get(text, text)
        if text not in options:
            raise UserError(f"hyperparameter {name} must be one of {', '.join(options)}; got {value!r}")
        return text

    return parse


MAX_LABEL_ERROR_FOLDS = 20  # (each fold is one more head fitted: cleanlab's default is 5, more gains little)


def _label_error_folds(name, value):
    folds = _integer(0)(name, value)
    if folds == 1 or folds > MAX_LABEL_ERROR_FOLDS:
        raise UserError(f"hyperparameter {name} must be 0 (no label check) or 2 to {MAX_LABEL_ERROR_FOLDS} folds; "
                        f"got {folds}")
    return folds


def _text(name, value):
    text = _unquoted(value)
    if not isinstance(text, str) or not text:
        raise UserError(f"hyperparameter {name} must be a non-empty string, got {value!r}")
    return text


def _weights(name, value):
    text = str(_unquoted(value))
    if text in WEIGHT_SOURCES or text.endswith(".h5"):
        return text
    raise UserError(
        f"hyperparameter {name} must be imagenet, none, pretrained (a weights file in the "
        f"'pretrained' channel) or a path to a .weights.h5/.h5 file; got {value!r}"
    )


RESIZE_ORIGINAL = "original"  # (sources/preprocess.py's ORIGINAL: the images at their own scale)


def _is_none(value) -> bool:
    """No value: absent, JSON null, or str(None) from the v2 Estimator."""
    value = _unquoted(value)
    return value is None or (isinstance(value, str) and value in ("None", "null", ""))


def _literal(text: str):
    """A list or object written as JSON, or as Python's repr of one (str() in the v2 Estimator);
    None when it is neither. Only literals are read: nothing is evaluated."""
    try:
        return json.loads(text)
    except ValueError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None


def _list_of_text(name, value, example: str) -> list[str] | None:
    """A list of strings given as a list, a JSON list, Python's repr of a list (str() in the v2
    Estimator) or comma-separated text; None when the value is not list-shaped at all.

    A value that starts with "[" but is neither JSON nor a Python list literal is refused rather
    than split on commas: split, "['a', 'b']" would become the names "['a'" and "'b']".
    """
    value = _unquoted(value)
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, str) and value.startswith("["):
        items = _literal(value)
        if not isinstance(items, list):
            raise UserError(f"hyperparameter {name}: cannot read {value!r} as a list; give a JSON list like {example}")
    elif isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    else:
        return None
    if any(not isinstance(item, str) for item in items):
        raise UserError(f"hyperparameter {name} must list strings, got {value!r}; e.g. {example}")
    return items


def _augment(name, value):
    flag = _unquoted(value)
    if flag is True or str(flag).lower() == "true":
        return DEFAULT_AUGMENTATIONS
    if str(flag).lower() == "all":
        return AUGMENTATIONS
    if flag is False or _is_none(flag) or str(flag).lower() in ("false", "none", "[]"):
        return ()
    parts = _list_of_text(name, value, '["crop", "flip"]')
    if parts is None:
        raise UserError(f"hyperparameter {name} must be true, false or a list of {', '.join(AUGMENTATIONS)}; "
                        f"got {value!r}")
    parts = tuple(p.strip().lower() for p in parts if p.strip())
    unknown = [p for p in parts if p not in AUGMENTATIONS]
    if unknown:
        raise UserError(
            f"hyperparameter {name} must be true, false or a comma-separated list of "
            f"{', '.join(AUGMENTATIONS)}; {', '.join(unknown)} unknown"
        )
    return parts


def _class_names(name, value):
    if _is_none(value):
        return None
    names = _list_of_text(name, value, '["cat", "dog"]')
    if names is None or len(names) < 2 or any(not n for n in names) or len(set(names)) < len(names):
        raise UserError(
            f"hyperparameter {name} must list at least two distinct, non-empty class names "
            f"(a JSON list, or comma-separated when no name holds a comma), got {value!r}"
        )
    return tuple(names)


@dataclasses.dataclass(frozen=True)
class ManifestRoles:
    """Where each part of a manifest line is among its attributes (indexes into attribute_names)."""
    image: int
    label: int
    metadata: int | None


def manifest_roles(names: tuple[str, ...]) -> ManifestRoles:
    """The image (the one "-ref" attribute), the label (the one other) and its optional
    "<label>-metadata", or a UserError saying what the list lacks or holds too much of."""
    refs = [i for i, n in enumerate(names) if n.endswith("-ref")]
    metadata = [i for i, n in enumerate(names) if n.endswith("-metadata")]
    labels = [i for i, n in enumerate(names) if i not in refs and i not in metadata]
    example = "e.g. source-ref,label or source-ref,label,label-metadata"
    if len(refs) != 1:
        raise UserError(f"hyperparameter attribute_names must list one image attribute, whose name ends in -ref; it "
                        f"lists {len(refs)} ({', '.join(names)}): {example}")
    if len(labels) != 1:
        raise UserError(f"hyperparameter attribute_names must list one label attribute besides the image (and its "
                        f"-metadata); it lists {len(labels)} ({', '.join(names[i] for i in labels) or 'none'}): "
                        f"{example}")
    label = names[labels[0]]
    if metadata and (len(metadata) > 1 or names[metadata[0]] != f"{label}-metadata"):
        raise UserError(f"hyperparameter attribute_names: the only -metadata attribute the job reads is the label's "
                        f"({label}-metadata); it lists {', '.join(names[i] for i in metadata)}")
    if len(set(names)) < len(names):
        raise UserError(f"hyperparameter attribute_names lists a name twice ({', '.join(names)})")
    return ManifestRoles(refs[0], labels[0], metadata[0] if metadata else None)


def _attribute_names(name, value):
    if _is_none(value):
        return None
    names = _list_of_text(name, value, '["source-ref", "label"]')
    if names is None or any(not n for n in names):
        raise UserError(f"hyperparameter {name} must list the manifest's attribute names, e.g. source-ref,label; got "
                        f"{value!r}")
    names = tuple(names)
    manifest_roles(names)
    return names


def _optional(parse):
    def optional(name, value):
        return None if _is_none(value) else parse(name, value)

    optional.tuning_range = getattr(parse, "tuning_range", "Categorical")
    return optional


def _flag(name, value):
    text = str(_unquoted(value)).lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise UserError(f"hyperparameter {name} must be true or false, got {value!r}")


_flag.tuning_range = "Categorical"


def _epochs_list(name, value):
    """Epoch numbers (1-based): a list, JSON or Python's, or comma-separated like MXNet's "10, 20"."""
    if _is_none(value):
        return ()
    raw = _unquoted(value)
    if isinstance(raw, str) and raw.startswith("["):
        raw = _literal(raw)
    items = raw if isinstance(raw, (list, tuple)) else raw.split(",") if isinstance(raw, str) else [raw]
    try:
        epochs = tuple(sorted({_integer(1)(name, item) for item in items if str(item).strip()}))
    except UserError:
        epochs = ()
    if not epochs:
        raise UserError(f"hyperparameter {name} must list epoch numbers (1 or more), e.g. 10,20; got {value!r}")
    return epochs


def _class_weights(name, value):
    """A weight per class: a list in label order, or an object of class name (or label) to weight
    (classes it leaves out weigh 1), or "balanced" (from the labels' counts as training sees them).
    Checked against the classes in JobConfig."""
    if _is_none(value):
        return None
    raw = _unquoted(value)
    if isinstance(raw, str) and raw.lower() == "balanced":
        return "balanced"
    if isinstance(raw, str) and raw.startswith(("{", "[")):
        raw = _literal(raw)  # (str() of a dict, as the v2 Estimator sends it: "{'cat': 2.0}")
    elif isinstance(raw, str):
        try:
            raw = json.loads(raw)  # (a bare number)
        except ValueError:
            try:
                raw = [float(part) for part in raw.split(",")]
            except ValueError:
                raw = None
    pairs = list(raw.items()) if isinstance(raw, dict) else list(enumerate(raw)) if isinstance(raw, list) else None
    if not pairs or any(isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0
                        for _, w in pairs):
        raise UserError(f"hyperparameter {name} must be a list of weights in label order, or a JSON object of "
                        f"class name to weight, each a number >= 0; got {value!r}")
    return tuple((str(key), float(weight)) for key, weight in pairs) if isinstance(raw, dict) else \
        tuple(float(w) for _, w in pairs)


HYPERPARAMETERS = {
    h.name: h
    for h in (
        Hyperparameter("epochs", 5, _integer(0), "epochs training the new head on the frozen backbone"),
        Hyperparameter("fine_tune_epochs", 0, _integer(0), "epochs then fine-tuning the top of the backbone too"),
        Hyperparameter("fine_tune_layers", 20, _integer(0),
                       "how many top backbone layers phase 2 unfreezes (BatchNorm layers stay frozen, unless "
                       "train_batchnorm)"),
        Hyperparameter("train_batchnorm", "false", _flag,
                       "a pretrained backbone's BatchNorm layers train in phase 2 (their scale and offset learnt, "
                       "their statistics those of each batch, the moving ones updated at momentum 0.9) as MXNet's "
                       "built-in does; false keeps them as pretrained (Keras' transfer-learning guide)"),
        Hyperparameter("batch_size", 32, _integer(1), "examples per step (global, across all GPUs and hosts)"),
        Hyperparameter("learning_rate", 1e-3, _number(0, 10),
                       "learning rate of phase 1 (the head; the whole network with weights=none)"),
        Hyperparameter("fine_tune_learning_rate", 1e-5, _number(0, 10), "learning rate of phase 2 (fine-tuning)"),
        Hyperparameter("backbone", "mobilenet_v3_small", _choice(BACKBONES),
                       "the Keras application fine-tuned, in snake case: mobilenet_v3_small, efficientnet_v2_s, "
                       "convnext_tiny, resnet50 ... (docs/job.md, Backbones)"),
        Hyperparameter("weights", "imagenet", _weights, "backbone weights: imagenet, none, pretrained, or a file"),
        Hyperparameter("image_size", 224, _integer(min(b.min_size for b in BACKBONE_TABLE.values()), 1024),
                       "side of the square images the model sees"),
        Hyperparameter("resize", None, _optional(_word_or(RESIZE_ORIGINAL, _integer(32, 4096))),
                       "the images' shorter side is resized to it first, then image_size taken from its centre (at "
                       "random in training with augment crop): MXNet's resize; original: image_size taken so from "
                       "each image at its own scale (enlarged to image_size first if smaller: MXNet without resize); "
                       "unset: each whole image is resized to image_size"),
        Hyperparameter("resize_interpolation", "bilinear", _choice(INTERPOLATIONS),
                       "how images are resized: bilinear, nearest, bicubic, area, lanczos3, lanczos5, gaussian or "
                       "mitchellcubic (tf.image.resize's methods)"),
        Hyperparameter("reinitialize_top_layer", "auto", _choice(("auto", "true", "false")),
                       "with a 'model' channel (incremental training): auto keeps the previous classifier when the "
                       "classes are the same and replaces it otherwise; true always replaces it; false keeps it"),
        Hyperparameter("num_classes", None, _optional(_integer(2)), "number of classes (or give class_names)"),
        Hyperparameter("class_names", None, _class_names, "class names, in label order (implies num_classes); "
                       "without it, a Ground Truth manifest's label metadata names the classes"),
        Hyperparameter("record_format", "tfrecord", _choice(RECORD_FORMATS),
                       "what the train and validation channels hold: tfrecord (tf.train.Examples), class_folders "
                       "(File/FastFile: images in one folder per class, the built-in TensorFlow algorithm's layout; "
                       "class_names default to the train channel's folder names, sorted), recordio (MXNet RecordIO "
                       "image files, im2rec's .rec, the built-in MXNet algorithm's) or lst (File/FastFile: images "
                       "listed by the .lst file of a train_lst and validation_lst channel, the built-in MXNet "
                       "algorithm's application/x-image); in the MXNet dialect, the channels' ContentType decides"),
        Hyperparameter("attribute_names", None, _attribute_names,
                       "the train and validation channels are augmented manifests (Ground Truth's output) streamed "
                       "in Pipe mode: their AttributeNames, in order, e.g. source-ref,label (the image, its label, "
                       "optionally label-metadata); keras-pipe local, submit and tune set it"),
        Hyperparameter("image_feature", "image/encoded", _text, "tf.train.Example feature holding the JPEG/PNG bytes"),
        Hyperparameter("label_feature", "image/class/label", _text, "tf.train.Example int64 feature holding the label"),
        Hyperparameter("augment", "true", _augment, "true (crop,flip,color), false, all, or some of crop, flip, "
                       "color, rotate, zoom, aspect, shear"),
        Hyperparameter("augmentation_random_rotation", 0.03, _number(0, 0.5, open_low=False),
                       "augment rotate: the largest turn either way, as a fraction of a full turn (Keras' "
                       "RandomRotation factor; 0.03 is about 11 degrees)"),
        Hyperparameter("augmentation_random_zoom", 0.1, _number(0, 1, open_low=False),
                       "augment zoom: the largest change of scale, out or in (0.1: 90 to 110 %)"),
        Hyperparameter("augmentation_random_aspect", 0.25, _number(0, 1, open_low=False),
                       "augment aspect: the largest stretch of one side against the other (0.25: MXNet's)"),
        Hyperparameter("augmentation_random_shear", 0.1, _number(0, 1, open_low=False),
                       "augment shear: the largest slant (0.1: MXNet's)"),
        Hyperparameter("augmentation_random_flip", "horizontal", _choice(FLIPS),
                       "augment flip: horizontal, vertical or horizontal_and_vertical"),
        Hyperparameter("steps_per_execution", "auto", _word_or("auto", _integer(1, 1000)),
                       "training steps per call into TensorFlow (the host reads metrics once per call): more keeps "
                       "a fast GPU busy between steps; a stop waits for the call to end; auto: 8 with a GPU, else 1"),
        Hyperparameter("shuffle_buffer", 1024, _integer(0), "records in the shuffle buffer (0: no shuffling)"),
        Hyperparameter("precise_bn_examples", 1024, _integer(0, 100_000),
                       "a backbone trained from scratch (weights=none) or whose BatchNorm trains (train_batchnorm): "
                       "its BatchNorm statistics recomputed after "
                       "each epoch with the epoch's final weights, on up to this many of its last training images "
                       "(kept on the host as uint8, 256 MiB at most; 0: the moving averages as they are)"),
        Hyperparameter("dropout", 0.2, _number(0, 0.99, open_low=False), "dropout before the classifier"),
        Hyperparameter("optimizer", "adam", _choice(OPTIMIZERS),
                       "adam, adamw, sgd, nesterov, rmsprop, adagrad or adadelta"),
        Hyperparameter("momentum", 0.9, _number(0, 1, open_low=False), "momentum of sgd, nesterov and rmsprop"),
        Hyperparameter("beta_1", 0.9, _number(0, 1, open_low=False), "adam and adamw: decay of the first moment"),
        Hyperparameter("beta_2", 0.999, _number(0, 1, open_low=False), "adam and adamw: decay of the second moment"),
        Hyperparameter("epsilon", 1e-07, _number(0, 1), "adam, adamw, rmsprop, adagrad and adadelta: added to the "
                       "denominator"),
        Hyperparameter("rho", 0.95, _number(0, 1, open_low=False), "rmsprop and adadelta: decay of the squared "
                       "gradients' mean"),
        Hyperparameter("initial_accumulator_value", 0.0001, _number(0, 1, open_low=False),
                       "adagrad: the accumulators' starting value"),
        Hyperparameter("weight_decay", None, _optional(_number(0, 1, open_low=False)),
                       "decoupled weight decay of every trained weight, per step and scaled by the learning rate "
                       "(for sgd without momentum the same as MXNet's weight_decay); unset: 0.004 for adamw, "
                       "else 0"),
        Hyperparameter("weight_decay_style", "decoupled", _choice(WEIGHT_DECAY_STYLES),
                       "decoupled: weight_decay shrinks each weight apart from its gradient (Keras', AdamW's); l2: "
                       "weight_decay x the weight is added to each trained weight's gradient, through the momentum, "
                       "biases and betas excepted (MXNet's for sgd, nag)"),
        Hyperparameter("regularizers_l2", 0.0, _number(0, 1, open_low=False),
                       "L2 penalty on the classifier's kernel, added to the training loss"),
        Hyperparameter("label_smoothing", 0.0, _number(0, 0.99, open_low=False),
                       "training loss against labels of 1 - s + s/classes and s/classes elsewhere"),
        Hyperparameter("gradient_clip_norm", 0.0, _number(0, 1e6, open_low=False),
                       "largest global norm of each step's gradient, summed over replicas (0: no clipping)"),
        Hyperparameter("lr_schedule", "constant", _choice(SCHEDULES),
                       "each phase's learning rate by epoch: constant, cosine (down to 0 after its last epoch) "
                       "or step (lr_scheduler_step)"),
        Hyperparameter("lr_scheduler_step", None, _epochs_list,
                       "lr_schedule=step: the epochs after which the rate is multiplied by lr_scheduler_factor, "
                       "e.g. 10,20"),
        Hyperparameter("lr_scheduler_factor", 0.1, _number(0, 1), "lr_schedule=step: the factor at each step"),
        Hyperparameter("warmup_steps", 0, _integer(0), "optimizer steps at the start of each phase ramping its "
                       "learning rate up linearly"),
        Hyperparameter("early_stopping", "false", _flag, "end a phase when early_stopping_metric stops improving; "
                       "the phase's best weights are kept"),
        Hyperparameter("early_stopping_metric", "val_loss", _choice(EARLY_STOPPING_METRICS),
                       "what early stopping watches: val_loss, val_accuracy, or another validation metric the job "
                       "reports (val_top_k_accuracy with top_k; val_f1_micro, val_f1_macro, val_auc ... with "
                       "multi_label)"),
        Hyperparameter("early_stopping_patience", 5, _integer(1), "epochs without improvement before a phase ends"),
        Hyperparameter("early_stopping_min_delta", 0.0, _number(0, 1e6, open_low=False),
                       "smallest change that counts as an improvement"),
        Hyperparameter("early_stopping_tolerance", 0.0, _number(0, 1, open_low=False),
                       "smallest change that counts, relative to the best value so far (MXNet's)"),
        Hyperparameter("early_stopping_min_epochs", 1, _integer(1), "epochs of a phase always trained"),
        Hyperparameter("export_epoch", "last", _choice(EXPORT_EPOCHS),
                       "the epoch whose model is exported: last, or best by early_stopping_metric (with a validation "
                       "channel; early stopping keeps the best in any case)"),
        Hyperparameter("keep_epoch_models", 0, _integer(0),
                       "every N epochs, that epoch's model is kept in the export's epochs/ folder (0: none), "
                       "beside the model exported: the built-in MXNet algorithm's checkpoint_frequency"),
        Hyperparameter("calibration", "auto", _choice(CALIBRATION, {"on": "true", "off": "false", "1": "true",
                                                                   "0": "false"}),
                       "divide the served probabilities' logits by a temperature fitted on the validation set "
                       "(one per class for multi_label; predictions unchanged): true, false, or auto (with at least "
                       "200 validation examples, when it lowers their cross-fitted NLL)"),
        Hyperparameter("label_error_folds", 0, _label_error_folds,
                       "find the likely label errors (confident learning): the validation images' from the exported "
                       "model, the training images' from this many cross-validated heads on the starting backbone's "
                       "features (2 to 20); in output/data/label_errors.csv and .manifest and the report page (0: no "
                       "check)"),
        Hyperparameter("class_weights", None, _class_weights,
                       "weight of each class in the training loss: a list in label order, {name: weight}, or balanced "
                       "(examples / (classes x the class's examples), as counted over the training examples seen so "
                       "far)"),
        Hyperparameter("multi_label", "false", _flag,
                       "each image has any number of the classes: a sigmoid per class, binary cross-entropy, and "
                       "precision, recall, F1 and AUC in the metric lines"),
        Hyperparameter("label_format", "index", _choice(LABEL_FORMATS),
                       "multi_label: the label feature holds class ids (index: an int64 list, e.g. [0, 2]) or one "
                       "value per class (multi_hot: a float list of num_classes values, 0 or 1)"),
        Hyperparameter("multi_label_threshold", 0.5, _number(0, 1),
                       "multi_label: the probability from which a class counts as predicted (metrics, serving)"),
        Hyperparameter("use_weighted_loss", "false", _flag,
                       "multi_label: weigh each class's positive examples by its negatives / positives, as counted "
                       "over the training examples seen so far (MXNet's)"),
        Hyperparameter("top_k", None, _optional(_integer(2)),
                       "also report top_k_accuracy: the share of examples whose label is among the k most likely"),
        Hyperparameter("mixed_precision", "auto", _choice(MIXED_PRECISION),
                       "float16 compute; auto: on when a GPU is present"),
        Hyperparameter("max_corrupted_records_to_skip", 0, _integer(0),
                       "corrupt or unusable records (not an image, too large, bad label) tolerated per pass and "
                       "channel, each logged"),
        Hyperparameter("max_image_pixels", DEFAULT_MAX_PIXELS, _integer(1),
                       "largest image accepted (width x height, read from its header before decoding); larger ones "
                       "are unusable records"),
        Hyperparameter("pipe_wait_timeout", 600, _number(0, 86400),
                       "seconds to wait for a Pipe-mode FIFO and its writer"),
        Hyperparameter("collective_timeout", 600, _number(0, 86400),
                       "several hosts: seconds a step may wait for the others before the job fails (a host died)"),
        Hyperparameter("seed", 0, _integer(0), "seed for shuffling, augmentation and initialisation"),
        Hyperparameter("validation_split_ratio", 0.0, _number(0, 0.9, open_low=False),
                       "without a validation channel, the share of the train channel's images kept apart for "
                       "validation, in each class folder, drawn by seed (record_format=class_folders; the built-in "
                       "TensorFlow algorithm's split of its training channel); 0: none"),
        Hyperparameter("dialect", "auto", _choice(("auto", *dialects.DIALECTS)),
                       "whose names and defaults the hyperparameters are: keras-pipe (this job's), mxnet or "
                       "tensorflow (SageMaker's built-in image classifiers'; docs/migration.md); auto: decided by the "
                       "names given"),
        Hyperparameter("other_checkpoints", "refuse", _choice(OTHER_CHECKPOINTS),
                       "when the checkpoint folder holds another job's checkpoints: refuse to start, resume the "
                       "newest written with the same settings, or ignore them and train afresh"),
    )
}


@dataclasses.dataclass(frozen=True)
class JobConfig:
    epochs: int
    fine_tune_epochs: int
    fine_tune_layers: int
    train_batchnorm: bool
    batch_size: int
    learning_rate: float
    fine_tune_learning_rate: float
    backbone: str
    weights: str
    image_size: int
    resize: int | str | None  # (str: RESIZE_ORIGINAL)
    resize_interpolation: str
    reinitialize_top_layer: str
    num_classes: int
    class_names: tuple[str, ...]
    record_format: str
    attribute_names: tuple[str, ...] | None
    image_feature: str
    label_feature: str
    augment: tuple[str, ...]
    augmentation_random_rotation: float
    augmentation_random_zoom: float
    augmentation_random_aspect: float
    augmentation_random_shear: float
    augmentation_random_flip: str
    steps_per_execution: int | str
    shuffle_buffer: int
    precise_bn_examples: int
    dropout: float
    optimizer: str
    momentum: float
    beta_1: float
    beta_2: float
    epsilon: float
    rho: float
    initial_accumulator_value: float
    weight_decay: float | None
    weight_decay_style: str
    regularizers_l2: float
    label_smoothing: float
    gradient_clip_norm: float
    lr_schedule: str
    lr_scheduler_step: tuple[int, ...]
    lr_scheduler_factor: float
    warmup_steps: int
    early_stopping: bool
    early_stopping_metric: str
    early_stopping_patience: int
    early_stopping_min_delta: float
    early_stopping_tolerance: float
    early_stopping_min_epochs: int
    keep_epoch_models: int
    export_epoch: str
    calibration: str
    label_error_folds: int
    class_weights: tuple[float, ...] | str | None  # (str: "balanced")
    multi_label: bool
    label_format: str
    multi_label_threshold: float
    use_weighted_loss: bool
    top_k: int | None
    mixed_precision: str
    max_corrupted_records_to_skip: int
    max_image_pixels: int
    pipe_wait_timeout: float
    collective_timeout: float
    seed: int
    validation_split_ratio: float
    dialect: str  # keras-pipe, mxnet or tensorflow: the names and defaults the request was read with
    other_checkpoints: str
    dialect_notes: tuple[str, ...] = ()  # what the log says of the built-in's names (dialects.py)

    @classmethod
    def from_hyperparameters(cls, raw: dict, hosts: int = 1) -> JobConfig:
        """`hosts`: how many train (the built-in MXNet algorithm's batch size is per host)."""
        translation = dialects.translate(raw, hosts)
        raw = dict(translation.hyperparameters)
        # MXNet's step schedule has no switch: its steps alone turn it on
        if "lr_scheduler_step" in raw and "lr_schedule" not in raw and not _is_none(raw["lr_scheduler_step"]):
            raw["lr_schedule"] = "step"
        _check_known(raw)
        # defaults go through the same parsing as given values ("true" -> all augmentations)
        values = {name: h.parse(name, raw.get(name, h.default)) for name, h in HYPERPARAMETERS.items()}
        # class folders name their classes: the job reads them from the train channel (main.py),
        # the launcher checks the rest without them
        deferred = values["record_format"] == "class_folders" and values["class_names"] is None
        if not deferred or values["num_classes"] is not None:
            values["num_classes"], values["class_names"] = _classes(values["num_classes"], values["class_names"])
        _check_record_format(values)
        values["class_weights"] = _weights_per_label(values["class_weights"], values["class_names"])
        _check_training(values)
        return cls(**values, dialect_notes=translation.notes)


def _check_known(raw: dict) -> None:
    """Every hyperparameter given is the job's, one of the built-in algorithms' names for one, or
    SageMaker's own; else a UserError naming the unknown ones (with what they may have meant)."""
    unknown = sorted(
        name for name in raw
        if name not in HYPERPARAMETERS
        and name not in _PLATFORM_NAMES
        and not name.startswith(_PLATFORM_PREFIXES)
    )
    if unknown:
        # (the names it takes are too many to list in a failure reason SageMaker cuts at 1 KB)
        # (a name the job and a built-in share is offered once)
        known = list(dict.fromkeys([*HYPERPARAMETERS, *dialects.MXNET_NAMES, *dialects.TENSORFLOW_NAMES]))
        guesses = [f"{name} (did you mean {', '.join(close)}?)" if (close := difflib.get_close_matches(
            name.lower(), known, n=2, cutoff=0.75)) else name for name in unknown]
        raise UserError(
            f"unknown hyperparameter{'s' if len(unknown) > 1 else ''} {', '.join(guesses)}; the job accepts "
            f"{len(HYPERPARAMETERS)} (docs/job.md, Hyperparameters), or the built-in MXNet or TensorFlow image "
            "classifier's (docs/migration.md)"
        )


def _check_training(values: dict) -> None:
    """The training recipe's values, checked together: the schedule, the metric early stopping
    watches, top_k, the image size for the backbone (and resize, not below it), something to train."""
    if values["lr_schedule"] == "step" and not values["lr_scheduler_step"]:
        raise UserError("hyperparameter lr_schedule=step needs lr_scheduler_step: the epochs after which the "
                        "learning rate drops, e.g. 10,20")
    if values["lr_schedule"] != "step" and values["lr_scheduler_step"]:
        raise UserError(f"hyperparameter lr_scheduler_step is for lr_schedule=step; lr_schedule is "
                        f"{values['lr_schedule']}: give one or the other")
    _check_multi_label(values)
    watched = values["early_stopping_metric"]
    if watched not in reported_metrics(values, "val_"):
        needs = ("top_k set (single-label)" if "top_k" in watched else "multi_label=true")
        raise UserError(f"hyperparameter early_stopping_metric={watched}: the job reports it only with {needs}; "
                        f"with these settings it reports {', '.join(reported_metrics(values, 'val_'))}")
    if values["top_k"] is not None and values["num_classes"] and values["top_k"] >= values["num_classes"]:
        raise UserError(f"hyperparameter top_k must be below the number of classes ({values['num_classes']}): "
                        f"the top {values['top_k']} hold every class; got {values['top_k']}")
    backbone = BACKBONE_TABLE[values["backbone"]]
    if values["image_size"] < backbone.min_size:
        # (named as the request named it: MXNet's image_shape is image_size here)
        size = "image_shape's height and width" if values["dialect"] == dialects.MXNET else "image_size"
        raise UserError(f"hyperparameter {size} must be at least {backbone.min_size} for backbone "
                        f"{backbone.name} (the smallest input its application takes); got {values['image_size']}")
    if values["resize"] not in (None, RESIZE_ORIGINAL) and values["resize"] < values["image_size"]:
        raise UserError(f"hyperparameter resize ({values['resize']}) must be at least image_size "
                        f"({values['image_size']}): the image_size x image_size crop is taken from the image "
                        "resized to resize on its shorter side")
    if values["epochs"] + values["fine_tune_epochs"] == 0:
        raise UserError("hyperparameters epochs and fine_tune_epochs are both 0: nothing to train")
    if values["keep_epoch_models"] > values["epochs"] + values["fine_tune_epochs"]:
        name = "checkpoint_frequency" if values["dialect"] == dialects.MXNET else "keep_epoch_models"
        raise UserError(f"hyperparameter {name} ({values['keep_epoch_models']}) must be at most the epochs trained "
                        f"({values['epochs'] + values['fine_tune_epochs']}): it keeps every {name}-th epoch's model")


MULTI_LABEL_METRICS = ("accuracy", "exact_match", "precision_micro", "recall_micro", "f1_micro", "precision_macro",
                       "recall_macro", "f1_macro", "auc")


def reported_metrics(values: dict, prefix: str) -> list[str]:
    """The metrics the job's lines report for these settings (a hyperparameter name -> value
    mapping, or a JobConfig's fields), under `prefix` (train_, val_)."""
    if values["multi_label"]:
        names = ["loss", *MULTI_LABEL_METRICS]
    else:
        names = ["loss", "accuracy"] + (["top_k_accuracy"] if values["top_k"] else [])
    return [prefix + name for name in names]


def _check_multi_label(values: dict) -> None:
    if values["multi_label"]:
        if values["class_weights"] == "balanced":
            raise UserError("hyperparameter class_weights=balanced is for single-label jobs; a multi-label job's "
                            "classes are balanced by use_weighted_loss=true")
        if values["top_k"] is not None:
            raise UserError("hyperparameter top_k is for single-label jobs (the share of examples whose one label is "
                            "among the k most likely); multi_label reports precision, recall, F1 and AUC")
        return
    for name in ("use_weighted_loss",):
        if values[name]:
            raise UserError(f"hyperparameter {name} weighs a multi_label job's classes; set multi_label=true, or "
                            "class_weights for a single-label job")
    if values["label_format"] != "index":
        raise UserError(f"hyperparameter label_format={values['label_format']} is for multi_label=true: a "
                        "single-label job reads one class id per image")


def _check_record_format(values: dict) -> None:
    fmt = values["record_format"]
    if values["attribute_names"] and fmt != "tfrecord":
        raise UserError(f"hyperparameter attribute_names makes the channels Ground Truth manifests; record_format="
                        f"{fmt} says they hold something else: give one")
    if fmt == "class_folders" and values["multi_label"]:
        raise UserError("hyperparameter record_format=class_folders gives each image the one class of its folder: "
                        "for multi_label, prepare a CSV of path,label,label,... (keras-pipe prepare --multi-label)")
    if fmt == "recordio" and values["multi_label"] and values["label_format"] != "multi_hot":
        raise UserError("hyperparameter record_format=recordio with multi_label: im2rec stores one value per class "
                        "(0 or 1): set label_format=multi_hot")


def _weights_per_label(weights, class_names: tuple[str, ...] | None) -> tuple[float, ...] | str | None:
    if weights is None or weights == "balanced" or class_names is None:
        return weights
    if weights and isinstance(weights[0], tuple):  # {name or label: weight}
        given = dict(weights)
        labels = {name: str(label) for label, name in enumerate(class_names)}
        unknown = [key for key in given if key not in labels and key not in labels.values()]
        if unknown:
            raise UserError(f"hyperparameter class_weights names {', '.join(map(repr, unknown))}, not a class of the "
                            f"job ({', '.join(class_names[:10])}{', ...' if len(class_names) > 10 else ''})")
        return tuple(given.get(name, given.get(str(label), 1.0)) for label, name in enumerate(class_names))
    if len(weights) != len(class_names):
        raise UserError(f"hyperparameter class_weights lists {len(weights)} weights for {len(class_names)} classes")
    return tuple(weights)


def _classes(num_classes, class_names):
    if class_names is None and num_classes is None:
        raise UserError("hyperparameter num_classes (or class_names) is required")
    if class_names is None:
        return num_classes, tuple(str(i) for i in range(num_classes))
    if num_classes is not None and num_classes != len(class_names):
        raise UserError(
            f"hyperparameters disagree: num_classes is {num_classes} but class_names lists {len(class_names)}"
        )
    return len(class_names), class_names
