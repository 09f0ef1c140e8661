"""Metric lines in a stable `name=value` format, the regexes that catch them, and metrics.json.

Each epoch prints one line to stdout, e.g.
    metrics: epoch=3 phase=fine_tune train_loss=0.2314 train_accuracy=0.9312 val_loss=0.3011 val_accuracy=0.9
SageMaker extracts metrics from the job's log with regexes (MetricDefinitions); the launcher
sends METRIC_DEFINITIONS, made here from the same names, so the two cannot drift apart.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from keras_pipe_train.config import MULTI_LABEL_METRICS

PREFIX = "metrics:"
# metric line name -> the name SageMaker shows (and CloudWatch stores) it under
REPORTED = {"train_loss": "train:loss", "train_accuracy": "train:accuracy",
            "val_loss": "validation:loss", "val_accuracy": "validation:accuracy",
            # only with hyperparameter top_k (MXNet's name for it: top_k)
            "train_top_k_accuracy": "train:top_k_accuracy", "val_top_k_accuracy": "validation:top_k_accuracy",
            # only with multi_label (accuracy is then the share of images whose classes are all right)
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
