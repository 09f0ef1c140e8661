"""How a hyperparameter's value reads, in every form SageMaker's clients send it.

SageMaker passes every hyperparameter as a string, and each client encodes differently (`unquoted`
says how). Each parser here takes (name, value) and returns the typed value, or raises a UserError
naming the hyperparameter and what it allows. Each is a small typed object that also says the values
it takes (`accepts`), its bounds if it reads a number, and the kind of range a tuning job may give it
(`tuning_range`: Integer, Continuous, or any Categorical): the definitions (hyperparameters.py), the
docs and the launcher read them from it. No TensorFlow here.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any, ClassVar

from keras_pipe_train.settings.backbones import HUB_PRESETS, HUB_SCHEMES, is_hub
from keras_pipe_train.settings.errors import UserError

Parse = Callable[[str, Any], Any]

AUGMENTATIONS = ("crop", "flip", "color", "rotate", "zoom", "aspect", "shear", "trivial", "randaugment")
DEFAULT_AUGMENTATIONS = ("crop", "flip", "color")  # augment=true
ALL_AUGMENTATIONS = AUGMENTATIONS[:7]  # augment=all: every one but the policies (sources/auto_augment.py)
WEIGHT_SOURCES = ("imagenet", "none", "pretrained")  # or a path to a weights file
RESIZE_ORIGINAL = "original"  # (sources/preprocess.py's ORIGINAL: the images at their own scale)
MAX_LABEL_ERROR_FOLDS = 20  # (each fold is one more head fitted: cleanlab's default is 5, more gains little)


# --- the forms of a value ---------------------------------------------------------------------------

def unquoted(value):
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


def numeric(value):
    """int/float from a number or its text ("8", "8.0", "1e-3", ".5"); anything else unchanged."""
    value = unquoted(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                return float(value)
            except ValueError:
                return value
    return value


def is_unset(value) -> bool:
    """None, null or str(None): a request's way of not setting a name (dialects.without_unset)."""
    value = unquoted(value)
    return value is None or (isinstance(value, str) and value in ("None", "null"))


def is_none(value) -> bool:
    """No value: absent, JSON null, str(None) from the v2 Estimator, or empty."""
    return is_unset(value) or unquoted(value) == ""


def literal(text: str):
    """A list or object written as JSON, or as Python's repr of one (str() in the v2 Estimator);
    None when it is neither. Only literals are read: nothing is evaluated."""
    try:
        return json.loads(text)
    except ValueError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None


def list_of_text(name, value, example: str) -> list[str] | None:
    """A list of strings given as a list, a JSON list, Python's repr of a list (str() in the v2
    Estimator) or comma-separated text; None when the value is not list-shaped at all.

    A value that starts with "[" but is neither JSON nor a Python list literal is refused rather
    than split on commas: split, "['a', 'b']" would become the names "['a'" and "'b']".
    """
    value = unquoted(value)
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, str) and value.startswith("["):
        items = literal(value)
        if not isinstance(items, list):
            raise UserError(f"hyperparameter {name}: cannot read {value!r} as a list; give a JSON list like {example}")
    elif isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
    else:
        return None
    if any(not isinstance(item, str) for item in items):
        raise UserError(f"hyperparameter {name} must list strings, got {value!r}; e.g. {example}")
    return items


# --- typed parsers: their bounds and tuning range are part of the definition ------------------------

@dataclasses.dataclass(frozen=True)
class Integer:
    """A whole number from `minimum` to `maximum` (None: no upper bound)."""
    minimum: int
    maximum: int | None = None
    tuning_range: ClassVar[str] = "Integer"

    def __call__(self, name, value) -> int:
        number = numeric(value)
        if isinstance(number, float) and number.is_integer():
            number = int(number)  # tuning's IntegerParameter and JSON both may say 8.0
        if isinstance(number, bool) or not isinstance(number, int):
            raise UserError(f"hyperparameter {name} must be an integer, got {value!r}")
        if number < self.minimum or (self.maximum is not None and number > self.maximum):
            raise UserError(f"hyperparameter {name} must be {self.limits}, got {number}")
        return number

    @property
    def bounds(self) -> tuple[int, int | None]:
        """(minimum, maximum), None: no upper bound."""
        return self.minimum, self.maximum

    @property
    def limits(self) -> str:
        return f">= {self.minimum}" if self.maximum is None else f"between {self.minimum} and {self.maximum}"

    @property
    def accepts(self) -> str:
        return f"an integer {self.limits}"


@dataclasses.dataclass(frozen=True)
class Number:
    """A finite number up to `maximum`, above `minimum` (open_low) or from it."""
    minimum: float
    maximum: float
    open_low: bool = True
    tuning_range: ClassVar[str] = "Continuous"

    def __call__(self, name, value) -> float:
        number = numeric(value)
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise UserError(f"hyperparameter {name} must be a number, got {value!r}")
        # "nan", "NaN" and "Infinity" parse as floats that pass every comparison
        if not math.isfinite(number):
            raise UserError(f"hyperparameter {name} must be a finite number, got {value!r}")
        if number < self.minimum or number > self.maximum or (self.open_low and number == self.minimum):
            raise UserError(f"hyperparameter {name} must be {self.limits}, got {number}")
        return float(number)

    @property
    def bounds(self) -> tuple[float, float]:
        """(minimum, maximum); the minimum itself is refused when open_low."""
        return self.minimum, self.maximum

    @property
    def limits(self) -> str:
        return f"{'> ' if self.open_low else '>= '}{self.minimum:g} and <= {self.maximum:g}"

    @property
    def accepts(self) -> str:
        return f"a number {self.limits}"


@dataclasses.dataclass(frozen=True)
class Choice:
    """One of `options`, in any case and quoting; `aliases` are other words for some of them."""
    options: tuple[str, ...]
    aliases: dict[str, str] = dataclasses.field(default_factory=dict)
    tuning_range: ClassVar[str] = "Categorical"
    LISTED: ClassVar[int] = 12  # more options than this are counted, not listed, where values are shown

    def __call__(self, name, value) -> str:
        # case-insensitive: the v2 Estimator sends str(False) == "False"
        text = str(unquoted(value)).lower()
        text = self.aliases.get(text, text)
        if FLAG_WORDS.get(text) in self.options:  # (a choice of true, false or more takes a flag's words)
            text = FLAG_WORDS[text]
        if text not in self.options:
            raise UserError(f"hyperparameter {name} must be one of {', '.join(self.options)}; got {value!r}")
        return text

    @property
    def bounds(self) -> None:
        return None

    @property
    def accepts(self) -> str:
        return ", ".join(self.options) if len(self.options) <= self.LISTED else f"one of {len(self.options)} names"


@dataclasses.dataclass(frozen=True)
class BackboneName(Choice):
    """One of `options` (the applications', any case), or a keras-hub image backbone (backbones.is_hub):
    one of its presets (any case), or a handle or a folder's path, kept as written (a Hugging Face
    handle or a path is case-sensitive)."""

    def __call__(self, name, value) -> str:
        text = str(unquoted(value)).strip()
        if text.lower() in HUB_PRESETS:
            return text.lower()
        if is_hub(text):
            if text.startswith(HUB_SCHEMES) and not text.split("://", 1)[1].strip("/"):
                raise UserError(f"hyperparameter {name}: the handle {text!r} names no model")
            return text
        if text.lower() in self.options:
            return text.lower()
        raise UserError(
            f"hyperparameter {name} must be one of {', '.join(self.options)}; or a keras-hub image preset "
            f"({', '.join(list(HUB_PRESETS)[:3])} ...), a keras-hub handle "
            f"({', '.join(s + '...' for s in HUB_SCHEMES)}) or the absolute path of a preset folder (docs/job.md, "
            f"Backbones); got {value!r}")

    @property
    def accepts(self) -> str:
        return (f"one of {len(self.options)} Keras applications, one of {len(HUB_PRESETS)} keras-hub presets, a "
                f"keras-hub handle ({', '.join(HUB_SCHEMES)}) or a preset folder's absolute path")


class _Or:
    """A number's parser that takes one value more: its range and bounds are the number's."""
    parse: Integer | Number | OrWord

    @property
    def tuning_range(self) -> str:
        return self.parse.tuning_range

    @property
    def bounds(self) -> tuple[float, float | None]:
        return self.parse.bounds


@dataclasses.dataclass(frozen=True)
class OrWord(_Or):
    """`word` (any case, any quoting), or what `parse` reads ("auto", resize's "original")."""
    word: str
    parse: Integer | Number

    def __call__(self, name, value):
        if str(unquoted(value)).lower() == self.word:
            return self.word
        try:
            return self.parse(name, value)
        except UserError as err:
            raise UserError(f"{err} (or {self.word})") from None

    @property
    def accepts(self) -> str:
        return f"{self.word}, or {self.parse.accepts}"


@dataclasses.dataclass(frozen=True)
class OrUnset(_Or):
    """No value (None), or what `parse` reads."""
    parse: Integer | Number | OrWord

    def __call__(self, name, value):
        return None if is_none(value) else self.parse(name, value)

    @property
    def accepts(self) -> str:
        return f"unset, or {self.parse.accepts}"


FLAG_WORDS = {"true": "true", "1": "true", "yes": "true", "on": "true",
              "false": "false", "0": "false", "no": "false", "off": "false"}


@dataclasses.dataclass(frozen=True)
class Flag:
    """true or false (1 or 0, yes or no, on or off), in any case and quoting."""
    tuning_range: ClassVar[str] = "Categorical"
    bounds: ClassVar[None] = None
    accepts: ClassVar[str] = "true, false"

    def __call__(self, name, value) -> bool:
        given = FLAG_WORDS.get(str(unquoted(value)).lower())
        if given is not None:
            return given == "true"
        raise UserError(f"hyperparameter {name} must be true or false, got {value!r}")


flag = Flag()


@dataclasses.dataclass(frozen=True)
class Described:
    """A parser of a value with a shape of its own, and the values it takes in words."""
    parse: Parse
    accepts: str
    tuning_range: ClassVar[str] = "Categorical"
    bounds: ClassVar[None] = None

    def __call__(self, name, value):
        return self.parse(name, value)


def takes(accepts: str) -> Callable[[Parse], Described]:
    """Decorates a parser function with the values it takes, in words."""
    return lambda parse: Described(parse, accepts)


@takes("a non-empty name")
def text(name, value) -> str:
    given = unquoted(value)
    if not isinstance(given, str) or not given:
        raise UserError(f"hyperparameter {name} must be a non-empty string, got {value!r}")
    return given


# --- values with a shape of their own ---------------------------------------------------------------

@takes(f"0, or an integer between 2 and {MAX_LABEL_ERROR_FOLDS}")
def label_error_folds(name, value) -> int:
    folds = Integer(0)(name, value)
    if folds == 1 or folds > MAX_LABEL_ERROR_FOLDS:
        raise UserError(f"hyperparameter {name} must be 0 (the training images not checked) or 2 to "
                        f"{MAX_LABEL_ERROR_FOLDS} folds; got {folds}")
    return folds


@takes(f"{', '.join(WEIGHT_SOURCES)}, or the path of a .h5 file")
def weights(name, value) -> str:
    given = "none" if is_unset(value) else str(unquoted(value))  # (Keras' weights=None: no weights to start from)
    if given.lower() in WEIGHT_SOURCES:
        return given.lower()
    if given.endswith(".h5"):
        return given
    raise UserError(
        f"hyperparameter {name} must be imagenet, none, pretrained (a weights file in the "
        f"'pretrained' channel) or a path to a .weights.h5/.h5 file; got {value!r}"
    )


@takes(f"true, false, all, or some of {', '.join(AUGMENTATIONS)}")
def augment(name, value) -> tuple[str, ...]:
    given = unquoted(value)
    word = FLAG_WORDS.get(str(given).lower())  # (a flag's words: yes, 1, on; no, 0, off)
    if given is True or word == "true":
        return DEFAULT_AUGMENTATIONS
    if str(given).lower() == "all":
        return ALL_AUGMENTATIONS
    if given is False or word == "false" or is_none(given) or str(given).lower() in ("none", "[]"):
        return ()
    parts = list_of_text(name, value, '["crop", "flip"]')
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


# the exports beside the SavedModel (model/conversions.py): TFLite at float32, with float16 weights, with
# int8 weights (dynamic range quantization: activations quantized on the fly), and all in int8 (full integer
# quantization, from representative training images); ONNX at float32
EXPORT_FORMATS = ("tflite", "tflite_float16", "tflite_int8", "tflite_full_int8", "onnx")


@takes(f"none, or a list of {', '.join(EXPORT_FORMATS)}: a list, or comma-separated")
def export_formats(name, value) -> tuple[str, ...]:
    if is_none(value) or str(unquoted(value)).strip().lower() in ("none", "", "[]"):
        return ()
    parts = list_of_text(name, value, '["tflite", "tflite_int8"]')
    if parts is None:
        raise UserError(f"hyperparameter {name} must be none or a list of {', '.join(EXPORT_FORMATS)}; got {value!r}")
    formats = tuple(dict.fromkeys(p.strip().lower() for p in parts if p.strip()))
    unknown = [f for f in formats if f not in EXPORT_FORMATS]
    if unknown or not formats:
        raise UserError(f"hyperparameter {name} must be none or a comma-separated list of {', '.join(EXPORT_FORMATS)}; "
                        f"{', '.join(unknown) + ' unknown' if unknown else 'got none'}")
    return formats


@takes("unset, or 2 or more names: a list, or comma-separated")
def class_names(name, value) -> tuple[str, ...] | None:
    if is_none(value):
        return None
    names = list_of_text(name, value, '["cat", "dog"]')
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


@takes("unset, or names: a list, or comma-separated")
def attribute_names(name, value) -> tuple[str, ...] | None:
    if is_none(value):
        return None
    names = list_of_text(name, value, '["source-ref", "label"]')
    if names is None or any(not n for n in names):
        raise UserError(f"hyperparameter {name} must list the manifest's attribute names, e.g. source-ref,label; got "
                        f"{value!r}")
    names = tuple(names)
    manifest_roles(names)
    return names


@takes("unset, or epoch numbers (1 or more): a list, or comma-separated")
def epochs_list(name, value) -> tuple[int, ...]:
    """Epoch numbers (1-based): a list, JSON or Python's, or comma-separated like MXNet's "10, 20"."""
    if is_none(value):
        return ()
    raw = unquoted(value)
    if isinstance(raw, str) and raw.startswith("["):
        raw = literal(raw)
    items = raw if isinstance(raw, (list, tuple)) else raw.split(",") if isinstance(raw, str) else [raw]
    try:
        epochs = tuple(sorted({Integer(1)(name, item) for item in items if str(item).strip()}))
    except UserError:
        epochs = ()
    if not epochs:
        raise UserError(f"hyperparameter {name} must list epoch numbers (1 or more), e.g. 10,20; got {value!r}")
    return epochs


@takes("unset, balanced, or weights >= 0: a list in label order, or an object of class to weight")
def class_weights(name, value) -> tuple[float, ...] | tuple[tuple[str, float], ...] | str | None:
    """A weight per class: a list in label order, or an object of class name (or label) to weight
    (classes it leaves out weigh 1), or "balanced" (from the labels' counts as training sees them).
    Checked against the classes in JobConfig."""
    if is_none(value):
        return None
    raw = unquoted(value)
    if isinstance(raw, str) and raw.lower() == "balanced":
        return "balanced"
    if isinstance(raw, str) and raw.startswith(("{", "[")):
        raw = literal(raw)  # (str() of a dict, as the v2 Estimator sends it: "{'cat': 2.0}")
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
