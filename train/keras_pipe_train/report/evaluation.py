"""The exported model's evaluation on the validation channel, written at the end of training:

    output/data/evaluation.json     the metrics, each class's precision, recall, F1 and support, and
                                    the confusion matrix (single-label, up to 256 classes) or each
                                    class's true and false positives and negatives (multi-label)
    output/data/learning_curves.png loss and accuracy (or F1) by epoch, train and validation
    output/data/confusion_matrix.png  single-label; multi-label (or more than 256 classes):
                                    per_class.png, each class's precision, recall and F1
    output/data/reliability.png     the calibration's reliability diagram, before and after
                                    (evaluation.json's "calibration": training/calibration.py)

SageMaker uploads output/data in output.tar.gz beside the model. The numbers come from one more
pass over the validation channel with the weights exported (the best epoch's under early
stopping), summed on the device like every metric here; the pictures are drawn with matplotlib's
Agg backend, with no display, and a picture that cannot be drawn is a warning, not a failed job.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from keras_pipe_train.report.pages import drawn, pyplot
from keras_pipe_train.training.metrics import to_json
from keras_pipe_train.training.tasks import MultiLabel, SingleLabel, ratio

log = logging.getLogger(__name__)

REPORT = "evaluation.json"
LABELLED_CLASSES = 40  # a picture names its classes up to this many; beyond, its axes count them


def report(task: SingleLabel | MultiLabel, class_names: tuple[str, ...], scores: dict, examples: int,
           counts: np.ndarray, detail: np.ndarray, epoch: int | None) -> dict:
    """evaluation.json's content from the pass's sums."""
    if isinstance(task, MultiLabel):
        tp, fp, fn = task.per_class(counts)
        tn = examples - tp - fp - fn
        extra = {"per_class_counts": {"true_positives": tp, "false_positives": fp, "false_negatives": fn,
                                      "true_negatives": tn},
                 "threshold": task.threshold}
    else:
        tp, fp, fn = task.per_class(detail)
        matrix = detail[3 * task.num_classes:].reshape(task.num_classes, task.num_classes) if task.confused else None
        extra = {"confusion_matrix": None if matrix is None else {
            "rows": "true class", "columns": "predicted class", "counts": matrix}}
    per_class = [{"class": name, "precision": ratio(t, t + p), "recall": ratio(t, t + n),
                  "f1": ratio(2 * t, 2 * t + p + n), "support": t + n}
                 for name, t, p, n in zip(class_names, tp, fp, fn)]
    return {"epoch": epoch, "examples": examples, "multi_label": isinstance(task, MultiLabel),
            "metrics": scores, "classes": list(class_names), "per_class": per_class, **extra}


def write_json(folder: Path, evaluation: dict) -> None:
    """evaluation.json alone (the exports' figures added to it: after_training/conversions.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / REPORT).write_text(to_json(_plain(evaluation), indent=1) + "\n")


def write(folder: Path, evaluation: dict, rows: list[dict]) -> None:
    """evaluation.json, then the pictures (a picture that fails is said, and left out)."""
    write_json(folder, evaluation)
    pictures = {"learning_curves.png": lambda path: learning_curves(rows, evaluation["multi_label"], path)}
    if evaluation["multi_label"] or evaluation["confusion_matrix"] is None:  # (too many classes for one)
        pictures["per_class.png"] = lambda path: per_class_bars(
            evaluation["per_class"], path, "each class, at the threshold set at training" if evaluation["multi_label"]
            else "each class (too many for a confusion matrix)")
    else:
        pictures["confusion_matrix.png"] = lambda path: confusion_picture(
            np.asarray(evaluation["confusion_matrix"]["counts"]), evaluation["classes"], path)
    if evaluation.get("calibration"):
        pictures["reliability.png"] = lambda path: reliability_picture(evaluation["calibration"], path)
    for name, draw in pictures.items():
        try:
            draw(folder / name)
        except Exception as err:  # (a picture is a convenience: the numbers are in evaluation.json)
            log.warning("could not draw %s (%s: %s); evaluation.json has its numbers", name, type(err).__name__, err)
    log.info("evaluation of the exported model on %d validation examples: %s (%s)", evaluation["examples"],
             folder / REPORT, ", ".join(sorted(pictures)))


def _plain(value):
    """numpy's numbers and arrays as JSON's (a count as an integer when it is one)."""
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    if isinstance(value, np.integer):
        return int(value)
    return value


def learning_curves(rows: list[dict], multi_label: bool, path: Path) -> None:
    plt = pyplot()
    second = "f1_micro" if multi_label else "accuracy"
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    epochs = [row["epoch"] for row in rows]
    for axis, metric in zip(axes, ("loss", second)):
        for prefix, style in (("train_", "-o"), ("val_", "-s")):
            values = [row.get(prefix + metric) for row in rows]
            if any(v is not None and math.isfinite(v) for v in values):
                axis.plot(epochs, [np.nan if v is None else v for v in values], style, markersize=3,
                          label=("train" if prefix == "train_" else "validation"))
        for row, following in zip(rows, rows[1:]):  # where phase 2 starts
            if following["phase"] != row["phase"]:
                axis.axvline(row["epoch"] + 0.5, color="grey", linestyle=":", linewidth=1)
        axis.set_xlabel("epoch")
        axis.set_title(metric.replace("_", " "))
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:  # (no curve without epochs)
            axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def confusion_picture(matrix: np.ndarray, classes: list[str], path: Path) -> None:
    """Each true class's row as shares of its examples (the counts are in evaluation.json)."""
    plt = pyplot()
    count = len(classes)
    shares = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    side = min(4 + 0.35 * count, 24)
    figure, axis = plt.subplots(figsize=(side, side * 0.9))
    image = axis.imshow(shares, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    figure.colorbar(image, ax=axis, fraction=0.046, pad=0.04, label="share of the true class")
    if count <= LABELLED_CLASSES:
        axis.set_xticks(range(count), [drawn(c, 20) for c in classes], rotation=90)
        axis.set_yticks(range(count), [drawn(c, 20) for c in classes])
        if count <= 15:
            for (i, j), value in np.ndenumerate(matrix):
                if value:
                    axis.text(j, i, f"{int(value)}", ha="center", va="center", fontsize=8,
                              color="white" if shares[i, j] > 0.5 else "black")
    axis.set_xlabel("predicted class")
    axis.set_ylabel("true class")
    axis.set_title(f"confusion matrix ({int(matrix.sum())} validation examples)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def per_class_bars(per_class: list[dict], path: Path, title: str) -> None:
    plt = pyplot()
    count = len(per_class)
    figure, axis = plt.subplots(figsize=(min(4 + 0.4 * count, 24), 4.5))
    positions = np.arange(count)
    for offset, name in zip((-0.27, 0, 0.27), ("precision", "recall", "f1")):
        values = [row[name] if row[name] is not None and math.isfinite(row[name]) else 0 for row in per_class]
        axis.bar(positions + offset, values, width=0.27, label=name)
    if count <= LABELLED_CLASSES:
        axis.set_xticks(positions, [drawn(row["class"], 20) for row in per_class], rotation=90)
    axis.set_ylim(0, 1)
    axis.set_title(title)
    axis.legend()
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def reliability_picture(calibration: dict, path: Path) -> None:
    """Each confidence bin's accuracy against its mean confidence, before calibration and after
    (cross-fitted): a calibrated model's points lie on the diagonal. Each point's area is its
    share of the examples."""
    plt = pyplot()
    figure, axis = plt.subplots(figsize=(5.2, 4.8))
    axis.plot([0, 1], [0, 1], ":", color="grey", linewidth=1, label="perfectly calibrated")
    total = max(calibration["examples"], 1)
    for key, style, label in (("before", "-o", "the model's own"),
                              ("after", "-s", f"temperature {_temperature_text(calibration['temperature'])}")):
        bins = calibration[key]["reliability"]
        line, = axis.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], style, markersize=0,
                          label=f"{label}: ECE {calibration[key]['ece']:.3f}")
        axis.scatter([b["confidence"] for b in bins], [b["accuracy"] for b in bins], color=line.get_color(),
                     s=[8 + 400 * b["examples"] / total for b in bins], alpha=0.7)
    multi = len(calibration.get("per_class_ece", {}).get("before", ())) > 0
    axis.set_xlabel("probability given (each class's)" if multi else "confidence (the top class's probability)")
    axis.set_ylabel("share right" if not multi else "share where the class is present")
    axis.set_xlim(-0.03, 1.03)  # (a bin's marker at 1 drawn whole)
    axis.set_ylim(-0.03, 1.03)
    axis.set_title(f"reliability ({calibration['examples']:,} validation examples)")
    axis.grid(alpha=0.3)
    axis.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _temperature_text(temperature) -> str:
    values = np.atleast_1d(np.asarray(temperature, np.float64))
    return f"{values[0]:.3g}" if values.size == 1 else f"{values.min():.3g}-{values.max():.3g} (by class)"
