"""output/data/report.html: one page a person opens after a job (from output.tar.gz, the local job
folder, or `keras-pipe report JOB`), built from what evaluation.py writes beside it and the
gallery of mistakes.py.

    the headline figures        the exported model's validation metrics, examples, epochs
    learning curves             learning_curves.png, inline
    the worst mistakes          the KEEP validation images of highest loss: the picture the model
                                saw, the label given, what it predicted, with what probability
    how far to trust its        the calibration: the temperature and whether it is served,
      probabilities             ECE, NLL and Brier score before and after (cross-fitted), the
                                reliability diagram; multi-label: the classes worst calibrated
    labels to check first       label_error_folds: the likely label errors, training and
                                validation images, their pictures (report/suspects.py)
    where it is confused        single-label: the confusion matrix and the most-confused class
                                pairs; multi-label: the classes most missed and most wrongly
                                predicted, and each class's precision, recall and F1
    each class                  precision, recall, F1 and support, the worst F1 first
    exports                     export_formats: each export (TFLite, ONNX) against the SavedModel
    the settings                the dialect the request was read in, what was translated, and
                                every hyperparameter as the job resolved it

Bounded in size whatever the validation set or the classes (three pictures, KEEP thumbnails of ~5
KB, 2 x suspects.MAX_SHOWN of ~2 KB, two heatmaps of each of them, 96 pixels, ~5 KB, at most
MAX_CLASS_ROWS rows and MAX_PAIRS pairs: 1.25 MB with 2,000 classes and every picture noise,
tests/job/report/test_report.py); evaluation.json and label_errors.csv keep every number. With pages.py's
policy, it loads nothing from outside itself.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from keras_pipe_train.report import pages, suspects
from keras_pipe_train.report.mistakes import Mistake
from keras_pipe_train.settings.config import READING_NOTES

NAME = "report.html"
MAX_CLASS_ROWS = 500
MAX_PAIRS = 15
MAX_SETTING = 1000  # characters of one setting's value


@dataclasses.dataclass(frozen=True)
class Gallery:
    mistakes: list[Mistake]
    seen: int  # validation images the pass looked at
    wrong: int  # of them, those the model gets wrong
    cut: bool = False  # the pass stopped at its time budget: `seen` are the first of the channel
    explained: int = 0  # of the mistakes, the first so many have heatmaps (mistakes.explained)
    explained_by: str = ""  # how: "Grad-CAM on <the layer>", "Integrated Gradients"; or why none
    heatmaps_budget_s: float = 0.0  # the seconds its heatmaps may take (after_training/report_page.py)


def write(folder: Path, evaluation: dict, rows: list[dict], settings: dict, job_name: str,
          gallery: Gallery | None, checked: suspects.Checked | str | None = None) -> Path:
    path = folder / NAME
    path.write_text(render(folder, evaluation, rows, settings, job_name, gallery, checked), encoding="utf-8")
    return path


def render(folder: Path, evaluation: dict, rows: list[dict], settings: dict, job_name: str,
           gallery: Gallery | None, checked: suspects.Checked | str | None = None) -> str:
    multi = evaluation["multi_label"]
    kind = "multi-label" if multi else "single-label"
    chosen = f", preset {settings['preset']}" if settings.get("preset", "none") != "none" else ""
    subtitle = (f"{kind} classifier of {len(evaluation['classes'])} classes, dialect {settings.get('dialect')}"
                f"{chosen}; "
                f"the model exported (epoch {evaluation.get('epoch')}) on {evaluation['examples']:,} validation "
                "examples")
    sections = [headline(evaluation, rows),
                pages.section("Learning curves", pages.figure(_picture(folder, "learning_curves.png"),
                                                              "loss and accuracy (or F1) by epoch"), anchor="curves"),
                mistakes_section(gallery, evaluation["classes"], multi),
                calibration_section(folder, evaluation),
                suspects.section(checked),
                confusion_section(folder, evaluation),
                class_table(evaluation),
                exports_section(evaluation),
                settings_section(settings)]
    return pages.page(f"Training job {job_name}", subtitle, sections)


def _picture(folder: Path, name: str) -> bytes | None:
    path = folder / name
    return path.read_bytes() if path.is_file() else None


def headline(evaluation: dict, rows: list[dict]) -> str:
    figures = [(pages.number(value), name.replace("val_", "validation ").replace("_", " "))
               for name, value in evaluation["metrics"].items()]
    figures += [(f"{evaluation['examples']:,}", "validation examples"), (str(len(rows)), "epochs trained"),
                (str(len(evaluation["classes"])), "classes")]
    seconds = sum(row.get("seconds") or 0 for row in rows)
    if seconds:
        figures.append((f"{seconds / 60:.1f} min", "training and validation time"))
    return pages.cards(figures)


def mistakes_section(gallery: Gallery | None, classes: list[str], multi: bool) -> str:
    title = "The validation images it gets most wrong"
    if gallery is None:
        return pages.section(title, pages.note("no gallery: a stop request came before the pass that finds them "
                                               "ended"), anchor="mistakes")
    if not gallery.mistakes:
        return pages.section(title, pages.note(f"none: it gets all {gallery.seen:,} validation images right"
                                               if gallery.seen else "no validation image was seen"),
                             anchor="mistakes")
    tiles = "".join(_tile(mistake, tuple(classes), multi) for mistake in gallery.mistakes)
    which = "all" if len(gallery.mistakes) == gallery.wrong else f"the {len(gallery.mistakes)} of highest loss"
    seen = f"{'first ' if gallery.cut else ''}{gallery.seen:,}"
    return pages.section(title, pages.note(
        f"it gets {gallery.wrong:,} of the {seen} validation images wrong; here {which}, worst first, as "
        "the model saw them (resized and cropped as for validation). A confident wrong prediction is often a wrong "
        "label"), _heatmaps_note(gallery), f'<div class="gallery">{tiles}</div>', anchor="mistakes")


def _heatmaps_note(gallery: Gallery) -> str:
    """What the heatmaps beside each picture are, and how many have them."""
    if not gallery.explained:
        return pages.note(f"no heatmaps: {gallery.explained_by}") if gallery.explained_by else ""
    return pages.heatmaps_note(gallery.explained, len(gallery.mistakes), "the class it predicted", gallery.explained_by)


def _tile(mistake: Mistake, classes: tuple[str, ...], multi: bool) -> str:
    shown = mistake.as_json(classes)
    probabilities = shown["probabilities"]

    def listed(names: list[str]) -> str:
        return ", ".join(f"{name} ({probabilities[name]:.0%})" for name in names) or "none"

    if multi:
        lines = [f"labelled: {listed(shown['given'])}", f"predicted: {listed(shown['predicted'])}"]
    else:
        lines = [f"label: {shown['given'][0]} ({probabilities[shown['given'][0]]:.0%})",
                 f"predicted: {shown['predicted'][0]} ({probabilities[shown['predicted'][0]]:.0%})"]
    text = "<br>".join(pages.escape(line) for line in lines)
    alt = f"validation image labelled {', '.join(shown['given']) or 'none'}"
    pictures = pages.with_heatmaps(pages.image(mistake.jpeg, "image/jpeg", alt), mistake.heatmaps,
                                   lambda label: classes[label] if label < len(classes) else str(label))
    return f'<div class="tile">{pictures}{text}<br>loss {shown["loss"]:.3f}</div>'



def exports_section(evaluation: dict) -> str:
    """export_formats: each export beside the SavedModel, on the validation images (empty
    when none was asked for)."""
    exports = evaluation.get("exports")
    if not exports:
        return ""
    rows = []
    for name, found in exports.items():
        compared = "agreement" in found
        rows.append((name, f"{found['bytes'] / 1e6:.2f} MB" if "bytes" in found else "",
                     f"{found['agreement']:.2%}" if compared else "", _difference(found["max_probability_difference"])
                     if compared else "", f"{found['accuracy']:.2%}" if compared else "",
                     f"dropped: {found['dropped']}" if "dropped" in found
                     else f"kept, unchecked: {found['unchecked']}" if "unchecked" in found else "kept"))
    reference = next((found["savedmodel_accuracy"] for found in exports.values() if "savedmodel_accuracy" in found),
                     None)
    return pages.section("Exports beside the SavedModel", pages.note(
        "Each export (model/exports/, exports.json says its input) answered the validation images beside the "
        "SavedModel" + (f", whose accuracy is {reference:.2%}" if reference is not None else "") + ": how often "
        "they decide alike, the largest difference of a probability, the export's own accuracy. One past its bar "
        "is dropped."), pages.table(["format", "file", "decided alike", "largest difference", "accuracy", ""], rows,
                                    [False, True, True, True, True, False]), anchor="exports")


def _difference(value) -> str:
    """A largest difference of a probability: from 1e-9 to 1 (None, or infinite: not a number)."""
    return "not a number" if value is None or value == float("inf") else f"{value:.2g}"


def calibration_section(folder: Path, evaluation: dict) -> str:
    title = "How far to trust its probabilities"
    found = evaluation.get("calibration")
    if not found:
        why = evaluation.get("calibration_unmeasured") or "no validation pass before the export, or a stop request"
        return pages.section(title, pages.note(f"not measured: the model was not calibrated ({why})"),
                             anchor="calibration")
    temperature = np.atleast_1d(np.asarray(found["temperature"], np.float64))
    bias = np.asarray(found["bias"], np.float64) if found.get("bias") is not None else None
    said = (f"temperature {temperature[0]:.3g}" if temperature.size == 1 else
            f"a temperature for each class, {temperature.min():.3g} to {temperature.max():.3g}")
    if bias is not None:
        said = (f"Platt scaling: {said}" if evaluation["multi_label"] else said) + (
            f", and a bias for each class, {bias.min():+.3g} to {bias.max():+.3g} (z / T + b: a temperature alone "
            "cannot move a class's probabilities as a whole)")
    same = "the predictions are the same" if bias is None or evaluation["multi_label"] else \
        "the class served is the calibrated probabilities' likeliest"
    served = (f"the served probabilities are those of the logits so calibrated ({same})" if found["applied"]
              else "not applied: the served probabilities are the model's own")
    cut = " (a sample of those read before the pass was cut short)" if found.get("cut") else ""
    lines = [pages.note(f"{said}, fitted on {found['examples']:,} validation examples{cut}: {served}. "
                        f"Why: {found['reason']}. 'After' is cross-fitted: each half of the examples calibrated by "
                        "the same rule fitted on the other half, so the gain is measured on examples it was not "
                        "fitted on. ECE: the mean gap between confidence and accuracy, over 15 bins; lower is "
                        "better for all three.")]
    rows = [(name, pages.number(found["before"][key]), pages.number(found["after"][key]))
            for key, name in (("ece", "ECE"), ("nll", "NLL"), ("brier", "Brier score"))]
    lines.append(pages.table(["", "the model's own", "calibrated"], rows, [False, True, True]))
    lines.append(pages.figure(_picture(folder, "reliability.png"), "reliability: accuracy by confidence"))
    per_class = found.get("per_class_ece")
    if per_class:  # (worst before or after: a class calibration made worse is shown too)
        order = sorted(range(len(per_class["before"])),
                       key=lambda c: -max(per_class["before"][c], per_class["after"][c]))[:MAX_PAIRS]
        temperatures = np.broadcast_to(temperature, (len(per_class["before"]),))
        biases = np.zeros(len(per_class["before"])) if bias is None else bias
        lines += ["<h3>The classes worst calibrated, before or after</h3>", pages.table(
            ["class", "ECE, its own", "temperature", *(["bias"] if bias is not None else []), "ECE, calibrated"],
            [(evaluation["classes"][c], pages.number(per_class["before"][c]), f"{temperatures[c]:.3g}",
              *([f"{biases[c]:+.3g}"] if bias is not None else []), pages.number(per_class["after"][c]))
             for c in order], [False, True, True, *([True] if bias is not None else []), True])]
    means = found.get("class_means")
    if means:
        lines += _class_means(evaluation["classes"], means, found["applied"])
    return pages.section(title, *lines, anchor="calibration")


def _class_means(classes: list[str], means: dict, applied: bool) -> list[str]:
    """Single-label: the classes whose mean served probability (calibrated where `applied`) is
    furthest from their share of the validation images. A temperature keeps each image's likeliest
    class, so it cannot move a class as a whole: an offset (class_weights=balanced makes one on
    purpose) shows here, not in the ECE."""
    share, before, after = (np.asarray(means[key], np.float64) for key in ("share", "before", "after"))
    order = np.argsort(-np.abs((after if applied else before) - share), kind="stable")[:MAX_PAIRS]
    return [
        "<h3>Each class's mean probability against its share of the images</h3>",
        pages.note("a temperature keeps each image's likeliest class, so it cannot move a class's probabilities as "
                   "a whole: a class whose mean probability is far from its share of the validation images is "
                   "offset (class_weights=balanced shifts them on purpose), and its served probabilities are too "
                   "high or too low by about that much; the classes furthest first"),
        pages.table(["class", "share of the images", "mean probability, the model's own",
                     "calibrated" if applied else "calibrated (not served)"],
                    [(classes[c], f"{share[c]:.1%}", f"{before[c]:.1%}", f"{after[c]:.1%}") for c in order],
                    [False, True, True, True])]


def confusion_section(folder: Path, evaluation: dict) -> str:
    classes = evaluation["classes"]
    if evaluation["multi_label"]:
        counts = evaluation["per_class_counts"]
        missed = _ranked(classes, counts["false_negatives"], counts["true_positives"])
        extra = _ranked(classes, counts["false_positives"], counts["true_negatives"])
        return pages.section(
            "Where it errs", pages.figure(_picture(folder, "per_class.png"), "each class's precision, recall and F1"),
            "<h3>Classes most often missed</h3>",
            pages.table(["class", "missed (false negatives)", "of its positives"], missed, [False, True, True]),
            "<h3>Classes most often predicted wrongly</h3>",
            pages.table(["class", "false positives", "of its negatives"], extra, [False, True, True]),
            anchor="confusion")
    matrix = evaluation.get("confusion_matrix")
    if matrix is None:
        return pages.section("Where it errs", pages.figure(_picture(folder, "per_class.png"),
                                                           "each class (too many for a confusion matrix)"),
                             anchor="confusion")
    counts = np.asarray(matrix["counts"])
    return pages.section("Where it is confused", pages.figure(_picture(folder, "confusion_matrix.png"),
                                                              "rows: true class, as shares of its examples"),
                         "<h3>The most-confused pairs</h3>", confused_pairs(counts, classes), anchor="confusion")


def _ranked(classes: list[str], wrong: list, other: list) -> list:
    order = sorted(range(len(classes)), key=lambda c: -wrong[c])[:MAX_PAIRS]
    return [(classes[c], pages.number(wrong[c]), f"{wrong[c] / max(wrong[c] + other[c], 1):.1%}")
            for c in order if wrong[c]]


def confused_pairs(counts: np.ndarray, classes: list[str]) -> str:
    off = counts.astype(np.float64).copy()
    np.fill_diagonal(off, 0)
    order = np.argsort(-off, axis=None)[:MAX_PAIRS]
    support = counts.sum(axis=1)
    rows = [(classes[i], classes[j], pages.number(int(off[i, j])), f"{off[i, j] / max(support[i], 1):.1%}")
            for i, j in zip(*np.unravel_index(order, off.shape)) if off[i, j]]
    if not rows:
        return pages.note("no validation example was given a wrong class")
    return pages.table(["true class", "predicted as", "examples", "of the true class"], rows,
                       [False, False, True, True])


def class_table(evaluation: dict) -> str:
    per_class = sorted(evaluation["per_class"], key=lambda row: (row["f1"] if row["f1"] is not None else -1,
                                                                 row["class"]))
    shown = per_class[:MAX_CLASS_ROWS]
    rows = [(row["class"], pages.number(row["precision"]), pages.number(row["recall"]), pages.number(row["f1"]),
             pages.number(row["support"])) for row in shown]
    parts = [pages.table(["class", "precision", "recall", "F1", "support"], rows, [False, True, True, True, True])]
    if len(per_class) > len(shown):
        parts.append(pages.note(f"the {len(shown)} of lowest F1 of {len(per_class)} classes: evaluation.json has all"))
    return pages.section("Each class, the worst first", *parts, anchor="classes")


def _shortened(text: str) -> str:
    """A setting as the table shows it: at most MAX_SETTING characters (thousands of class names)."""
    return text if len(text) <= MAX_SETTING else f"{text[:MAX_SETTING]}... ({len(text):,} characters)"


def settings_section(settings: dict) -> str:
    notes = [*(settings.get("dialect_notes") or ()), *(settings.get("preset_notes") or ())]
    rows = [(name, _shortened(json.dumps(value) if not isinstance(value, str) else value))
            for name, value in settings.items() if name not in READING_NOTES]
    parts = [pages.note(f"read in the {settings.get('dialect')} dialect")]
    if notes:
        parts.append("<ul>" + "".join(f"<li>{pages.escape(n)}</li>" for n in notes) + "</ul>")
    parts.append(f"<details><summary>every hyperparameter as the job resolved it ({len(rows)})</summary>"
                 f"{pages.table(['name', 'value'], rows)}</details>")
    return pages.section("The settings", *parts, anchor="settings")
