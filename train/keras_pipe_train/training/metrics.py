"""Metric lines in a stable `name=value` format, the regexes that catch them, and metrics.json.

Each epoch prints one line to stdout, e.g.
    metrics: epoch=3 phase=fine_tune train_loss=0.2314 train_accuracy=0.9312 val_loss=0.3011 val_accuracy=0.9
SageMaker extracts metrics from the job's log with regexes (MetricDefinitions); the launcher
sends METRIC_DEFINITIONS, made here from the same names, so the two cannot drift apart.

After it come the same numbers in the forms the built-in algorithms' users parse (lines()): Keras'
fit() log, whose `- accuracy: `, `- loss: `, `val_accuracy: `, `val_loss: ` the built-in
TensorFlow algorithm's notebooks give SageMaker as regexes, and MXNet's Module.fit log,
`Epoch[2] Validation-accuracy=0.900000`, which the Ground Truth demo reads for the built-in MXNet
algorithm (docs/job.md, Metric lines).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from keras_pipe_train.settings.config import MULTI_LABEL_METRICS

PREFIX = "metrics:"
# metric line name -> the name SageMaker shows (and CloudWatch stores) it under
REPORTED = {"train_loss": "train:loss", "train_accuracy": "train:accuracy",
            "val_loss": "validation:loss", "val_accuracy": "validation:accuracy",
            # only with hyperparameter top_k (MXNet's name for it: top_k)
            "train_top_k_accuracy": "train:top_k_accuracy", "val_top_k_accuracy": "validation:top_k_accuracy",
            # only with multi_label (accuracy is then each class's accuracy averaged over the classes, as
            # the built-in MXNet algorithm's; exact_match the share of images whose classes are all right)
            **{f"{prefix}_{name}": f"{shown}:{name}" for prefix, shown in (("train", "train"), ("val", "validation"))
               for name in MULTI_LABEL_METRICS if name != "accuracy"}}
_NUMBER = r"([-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|nan|inf))"

METRIC_DEFINITIONS = [
    {"Name": shown, "Regex": rf"{PREFIX} .*\b{name}={_NUMBER}"} for name, shown in REPORTED.items()
]


def row(epoch: int, phase: str, logs: dict) -> dict:
    """An epoch's metrics under stable names: loss -> train_loss; train_*, val_* kept."""
    out = {"epoch": epoch, "phase": phase}
    for key, value in logs.items():
        name = key if key.startswith(("train_", "val_")) else f"train_{key}"
        out[name] = float(value)
    return out


def format_line(values: dict) -> str:
    parts = [f"epoch={values['epoch']}", f"phase={values['phase']}"]
    for name, value in values.items():
        if name not in ("epoch", "phase"):
            parts.append(f"{name}={value:.6g}" if math.isfinite(value) else f"{name}={value}")
    return " ".join([PREFIX, *parts])


def lines(values: dict, total: int, top_k: int | None = None) -> list[str]:
    """An epoch's metric lines (values: a row, with its epoch counted from 1 over the whole job, as
    format_line takes it): format_line's, then Keras' form, then MXNet's. `total`: the job's epochs;
    `top_k`: the k of its top_k_accuracy, which both forms put in the metric's name."""
    return [format_line(values), keras_line(values, total, top_k), *mxnet_lines(values, top_k)]


def _metrics(values: dict) -> list[tuple[str, str, float]]:
    """(train_ or val_, the bare name, value) of each metric of a row, the training ones first."""
    found = [(prefix, name[len(prefix):], value) for name, value in values.items()
             for prefix in ("train_", "val_") if name.startswith(prefix)]
    return sorted(found, key=lambda item: (item[0] != "train_", item[1]))


def _fixed(value: float) -> str:
    """Six decimals, never an exponent or a sign (the regexes' [0-9\\.]+ would read part of the
    number); not a number or infinite: nan, inf, -inf, which such a regex reads nothing of."""
    return f"{value + 0.0:.6f}" if math.isfinite(value) else str(value)  # (+ 0.0: -0.0 is 0.0)


def keras_line(values: dict, total: int, top_k: int | None = None) -> str:
    """Keras' fit() log form, on one line: `Epoch 3/30 - accuracy: 0.931200 - loss: 0.231400 -
    val_accuracy: 0.900000 - val_loss: 0.301100`. Every metric is ` - name: value`, the training
    ones under their bare names (accuracy, loss, f1_micro ...), the validation ones as val_name, so
    `- loss: ` is never part of `- val_loss: `. top_k_accuracy is top_5_accuracy with top_k=5, as
    Keras and the built-in TensorFlow algorithm name it."""
    parts = [f"Epoch {values['epoch']}/{total}"]
    for prefix, name, value in _metrics(values):
        if name == "top_k_accuracy" and top_k:
            name = f"top_{top_k}_accuracy"
        parts.append(f"{'val_' if prefix == 'val_' else ''}{name}: {_fixed(value)}")
    return " - ".join(parts)


def mxnet_lines(values: dict, top_k: int | None = None) -> list[str]:
    """MXNet's Module.fit log form: one line per metric, `Epoch[2] Train-accuracy=0.931200` (its
    epochs counted from 0; %f), then the epoch's `Epoch[2] Time cost=12.345`, then
    `Epoch[2] Validation-accuracy=0.900000`, each number last on its line. top_k_accuracy is
    top_k_accuracy_5 with top_k=5, as MXNet's TopKAccuracy names it."""
    epoch, lines_ = values["epoch"] - 1, {"train_": [], "val_": []}
    for prefix, name, value in _metrics(values):
        if name == "top_k_accuracy" and top_k:
            name = f"top_k_accuracy_{top_k}"
        kind = "Validation" if prefix == "val_" else "Train"
        lines_[prefix].append(f"Epoch[{epoch}] {kind}-{name}={value + 0.0:f}")
    time = [f"Epoch[{epoch}] Time cost={values['seconds']:.3f}"] if "seconds" in values else []
    return [*lines_["train_"], *time, *lines_["val_"]]


def write_json(path: Path, rows: list[dict], summary: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_json({"epochs": rows, "final": summary}, indent=2) + "\n")


def to_json(value, **options) -> str:
    """Strict JSON: a non-finite number (a diverged loss) becomes null. Python's json writes bare
    NaN and Infinity by default, which no other JSON reader accepts."""
    return json.dumps(_finite(value), allow_nan=False, **options)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
