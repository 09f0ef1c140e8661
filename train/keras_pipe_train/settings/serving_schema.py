"""serving.json, what an exported model tells whoever serves it beside its SavedModel: a typed,
versioned schema. model/export.py writes it (ServingSettings.write); `serve` and `keras-pipe
predict` read it (keras_pipe_serve.predictor: read); MLflow's pyfunc model needs none of it (the
SavedModel's signature decides, report/keras_pipe_pyfunc.py). Its keys are named here and nowhere else.

    {"version": 2, "image_size": 224, "max_image_pixels": 100000000, "multi_label": false,
     "threshold": null, "dialect": "keras-pipe", "calibration": null}

Version 1 is every serving.json written before the schema had a version: no "version" key, and
keys added as the export grew (image_size, max_image_pixels, multi_label and threshold from the
first; dialect, then calibration, later). A key it lacks reads as the server took its absence: no
image limit, the default one; no dialect, keras-pipe (a model from before dialects answers in this
project's own); no calibration, none. Version 2 holds every key, "version" among them, and no other:
a key misspelt by hand is said rather than ignored. Its calibration may hold a "bias", one per class
(the served probabilities are those of the logits divided by the temperature plus the bias: Platt
scaling, or a single-label model's bias per class); a calibration without one, in either version, has
none. A version newer than this code knows is refused,
since its keys may mean what this code cannot tell. A model folder with no serving.json at all (an
export from before `serve`) is served with the defaults: ServingSettings().

No TensorFlow here: the server reads it before loading anything, and so does the launcher.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from keras_pipe_train.settings.hyperparameters import DEFAULT_MAX_PIXELS, DIALECTS, KERAS_PIPE

SCHEMA_VERSION = 2
UNVERSIONED = 1  # the version of a serving.json without "version"
FILE_NAME = "serving.json"
CALIBRATION_METHOD = "temperature scaling"
PLATT_METHOD = "Platt scaling"  # (multi-label: a temperature and a bias per class)
CALIBRATION_METHODS = (CALIBRATION_METHOD, PLATT_METHOD)
KEYS = ("version", "image_size", "max_image_pixels", "multi_label", "threshold", "dialect", "calibration")


class ServingFileError(ValueError):
    """serving.json cannot be read or written: the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class ServedCalibration:
    """serving.json's "calibration" (training/calibration.py): the served probabilities are those
    of the logits divided by `temperature` (one, or one per class) plus `bias` (one per class; None,
    as in every file before it: none), how many validation examples fitted them, and for a
    multi-label model the calibrated probability at which each class is predicted (its threshold on
    the model's own probability, which decides)."""

    temperature: float | tuple[float, ...]
    validation_examples: int
    calibrated_thresholds: tuple[float, ...] | None = None
    method: str = CALIBRATION_METHOD
    bias: tuple[float, ...] | None = None

    def to_json(self) -> dict:
        t = self.temperature
        found = {"method": self.method, "temperature": list(t) if isinstance(t, tuple) else t,
                 "validation_examples": self.validation_examples}
        if self.bias is not None:
            found["bias"] = list(self.bias)
        if self.calibrated_thresholds is not None:
            found["calibrated_thresholds"] = list(self.calibrated_thresholds)
        return found

    @classmethod
    def from_json(cls, data, where: str = FILE_NAME, strict: bool = True) -> ServedCalibration:
        """`strict`: a key this schema does not name is an error (version 2), else ignored."""
        field = "calibration"
        data = _object(data, where, field)
        if strict:
            _no_others(data, {"method", "temperature", "bias", "validation_examples", "calibrated_thresholds"}, where,
                       field)
        for key in ("method", "temperature", "validation_examples"):
            _required(data, key, where, field)
        method = data["method"]
        if not isinstance(method, str):
            raise ServingFileError(f"{where}: {field}.method must be text, got {_shown(method)}")
        temperature = data["temperature"]
        if isinstance(temperature, list):
            if not temperature:
                raise ServingFileError(f"{where}: {field}.temperature must be a number or one per class, got []")
            temperature = tuple(_number(t, where, f"{field}.temperature[{i}]", positive=True)
                                for i, t in enumerate(temperature))
        else:
            temperature = _number(temperature, where, f"{field}.temperature", positive=True)
        bias = data.get("bias")
        if bias is not None:
            if not isinstance(bias, list) or not bias:
                raise ServingFileError(f"{where}: {field}.bias must be a list of numbers, one per class, got "
                                       f"{_shown(bias)}")
            bias = tuple(_number(b, where, f"{field}.bias[{i}]") for i, b in enumerate(bias))
        edges = data.get("calibrated_thresholds")
        if edges is not None:
            if not isinstance(edges, list):
                raise ServingFileError(f"{where}: {field}.calibrated_thresholds must be a list of probabilities, "
                                       f"got {_shown(edges)}")
            edges = tuple(_number(e, where, f"{field}.calibrated_thresholds[{i}]", low=0, high=1)
                          for i, e in enumerate(edges))
        return cls(temperature, _whole(data["validation_examples"], where, f"{field}.validation_examples", 0),
                   edges, method, bias)


@dataclasses.dataclass(frozen=True)
class ServingSettings:
    """What serving.json says. `image_size`: the side the model's images are resized to (None: not
    known, as in a file from before the export wrote it); `max_image_pixels`: the largest image it
    takes; `threshold`: a multi-label model's (None: single-label); `dialect`: whose answers it
    gives (settings/dialects.py); `calibration`: None when its probabilities are its own.
    `version`: the one the file was written in, as read (to_json writes the current one)."""

    image_size: int | None = None
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    threshold: float | None = None
    dialect: str = KERAS_PIPE
    calibration: ServedCalibration | None = None
    version: int = dataclasses.field(default=SCHEMA_VERSION, compare=False)

    def __post_init__(self):
        # checked as serve will read it, so that the export never writes a file serve refuses
        _fields(self.to_json(), "the serving.json being made")

    @property
    def multi_label(self) -> bool:
        return self.threshold is not None

    def to_json(self) -> dict:
        return {"version": SCHEMA_VERSION, "image_size": self.image_size, "max_image_pixels": self.max_image_pixels,
                "multi_label": self.multi_label, "threshold": self.threshold, "dialect": self.dialect,
                "calibration": self.calibration.to_json() if self.calibration else None}

    def write(self, folder: Path) -> Path:
        path = Path(folder) / FILE_NAME
        path.write_text(json.dumps(self.to_json()) + "\n", encoding="utf-8")
        return path

    @classmethod
    def from_json(cls, data, where: str = FILE_NAME) -> ServingSettings:
        """serving.json's content in any version this code knows; a ServingFileError naming
        `where` (the file) and the field otherwise."""
        return cls(**_fields(data, where))


def read(folder: Path) -> ServingSettings | None:
    """The serving.json in `folder` (None: it has none); a ServingFileError naming the file and
    the field when it cannot be read."""
    path = Path(folder) / FILE_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise ServingFileError(f"{path} cannot be read: {err}") from None
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ServingFileError(f"{path} is not JSON: {err}") from None
    return ServingSettings.from_json(data, str(path))


def _fields(data, where: str) -> dict:
    """ServingSettings' fields from serving.json's content (ServingSettings.from_json)."""
    data = _object(data, where, None)
    version = data.get("version", UNVERSIONED)
    if "version" in data:
        version = _whole(version, where, "version", 1)
    if version > SCHEMA_VERSION:
        raise ServingFileError(f"{where} is version {version} of serving.json, newer than this keras-pipe reads "
                               f"(up to {SCHEMA_VERSION}): serve the model with the keras-pipe that exported it")
    strict = version >= 2
    if strict:
        _no_others(data, KEYS, where, None)
        for key in KEYS:
            _required(data, key, where, None)
    image_size = data.get("image_size")
    if image_size is not None:
        image_size = _whole(image_size, where, "image_size", 1)
    threshold = data.get("threshold")
    if threshold is not None:
        threshold = _number(threshold, where, "threshold", low=0, high=1)
    if "multi_label" in data:
        multi_label = data["multi_label"]
        if not isinstance(multi_label, bool):
            raise ServingFileError(f"{where}: multi_label must be true or false, got {_shown(multi_label)}")
        if multi_label != (threshold is not None):
            raise ServingFileError(f"{where}: multi_label is {json.dumps(multi_label)} but threshold is "
                                   f"{json.dumps(threshold)}: a multi-label model has a threshold, a "
                                   "single-label one none")
    dialect = data.get("dialect", KERAS_PIPE)
    if dialect not in DIALECTS:
        raise ServingFileError(f"{where}: serving.json's dialect is {str(dialect)[:40]!r}: this server answers in "
                               f"{', '.join(DIALECTS)}")
    calibration = data.get("calibration")
    if calibration is not None:
        calibration = ServedCalibration.from_json(calibration, where, strict)
        _consistent(calibration, threshold is not None, where)
    return {"image_size": image_size, "threshold": threshold, "dialect": dialect, "calibration": calibration,
            "max_image_pixels": _whole(data.get("max_image_pixels", DEFAULT_MAX_PIXELS), where, "max_image_pixels", 1),
            "version": version}


def _consistent(calibration: ServedCalibration, multi_label: bool, where: str) -> None:
    """A calibration whose parts fit one another and the model's kind: a rule the server would apply
    otherwise than it was fitted is refused, never served."""
    t, bias, edges = calibration.temperature, calibration.bias, calibration.calibrated_thresholds
    if calibration.method not in CALIBRATION_METHODS:
        raise ServingFileError(f"{where}: calibration.method must be one of {', '.join(CALIBRATION_METHODS)}, got "
                               f"{_shown(calibration.method)}")
    if (bias is not None) != (calibration.method == PLATT_METHOD):
        raise ServingFileError(f"{where}: calibration.bias is {'missing' if bias is None else 'given'} with method "
                               f"{calibration.method!r}: {PLATT_METHOD} has a bias per class, "
                               f"{CALIBRATION_METHOD} none")
    if not multi_label:
        if isinstance(t, tuple) or edges is not None or bias is not None:
            raise ServingFileError(f"{where}: a single-label model's calibration is one temperature, without bias "
                                   "or calibrated_thresholds")
        return
    per_class = {"temperature": t if isinstance(t, tuple) else None, "bias": bias, "calibrated_thresholds": edges}
    lengths = {name: len(values) for name, values in per_class.items() if values is not None}
    if len(set(lengths.values())) > 1:
        raise ServingFileError(f"{where}: calibration's per-class lists differ in length ("
                               + ", ".join(f"{name} {n}" for name, n in lengths.items()) + ")")


def _object(data, where: str, field: str | None) -> dict:
    if not isinstance(data, dict):
        raise ServingFileError(f"{where}: {field or 'its content'} must be a JSON object, got {_shown(data)}")
    return data


def _required(data: dict, key: str, where: str, within: str | None) -> None:
    if key not in data:
        raise ServingFileError(f"{where}: {_named(within, key)} is missing")


def _no_others(data: dict, known, where: str, within: str | None) -> None:
    others = sorted(set(data) - set(known))
    if others:
        raise ServingFileError(f"{where}: {', '.join(_named(within, k) for k in others)[:200]} is not a key of "
                               f"serving.json version {SCHEMA_VERSION} (its keys: {', '.join(known)})")


def _named(within: str | None, key: str) -> str:
    return f"{within}.{key}" if within else key


def _whole(value, where: str, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ServingFileError(f"{where}: {field} must be a whole number of at least {minimum}, got {_shown(value)}")
    return value


def _number(value, where: str, field: str, low: float | None = None, high: float | None = None,
            positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ServingFileError(f"{where}: {field} must be a number, got {_shown(value)}")
    if positive and value <= 0:
        raise ServingFileError(f"{where}: {field} must be above 0, got {value}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ServingFileError(f"{where}: {field} must be between {low} and {high}, got {value}")
    return value


def _shown(value) -> str:
    return json.dumps(value)[:60] if isinstance(value, (dict, list, str, int, float, bool, type(None))) \
        else type(value).__name__
