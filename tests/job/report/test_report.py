"""The job's report page and its gallery of mistakes (mistakes.py, job_page.py), from the parts:
which images enter the gallery, a page whatever the class names hold, bounded in size however
many classes, and multi-label's page as a browser shows it. (A whole job's page: test_job_e2e.)"""

from __future__ import annotations

import dataclasses
import io
import json
import re

import numpy as np
import pytest

from keras_pipe_train.report import evaluation, job_page
from keras_pipe_train.report.mistakes import HEATMAP, KEEP, Worst, thumbnail
from keras_pipe_train.training.tasks import MultiLabel, SingleLabel
from tests.browser import open_page, painted


def images(count: int, side: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 255, (count, side, side, 3)).astype(np.float32)


def test_the_gallery_keeps_the_wrong_ones_of_highest_loss_across_batches():
    worst = Worst(SingleLabel(3), keep=4)
    rng = np.random.default_rng(1)
    expected = []
    for batch in range(5):
        labels = rng.integers(0, 3, 16)
        probabilities = rng.dirichlet(np.ones(3), 16).astype(np.float32)
        losses = -np.log(probabilities[np.arange(16), labels])
        worst.add(images(16, seed=batch), labels, probabilities, losses)
        wrong = np.argmax(probabilities, -1) != labels
        expected += [float(loss) for loss in losses[wrong]]
    kept = worst.worst_first()
    assert [m.loss for m in kept] == pytest.approx(sorted(expected, reverse=True)[:4])
    assert worst.seen == 80 and worst.wrong_count == len(expected)
    for mistake in kept:
        assert mistake.given != mistake.predicted and mistake.jpeg[:2] == b"\xff\xd8"
        assert set(mistake.probabilities) == {*mistake.given, *mistake.predicted}


def test_an_example_it_gets_right_never_enters_even_with_a_high_loss():
    worst = Worst(SingleLabel(2), keep=4)
    probabilities = np.array([[0.45, 0.55], [0.9, 0.1]], np.float32)  # right but unsure; confidently wrong
    worst.add(images(2), np.array([1, 1]), probabilities, np.array([5.0, 2.3]))  # (losses as given)
    (only,) = worst.worst_first()
    assert only.given == (1,) and only.predicted == (0,) and only.loss == 2.3


def test_multi_label_mistakes_are_label_sets_at_the_threshold():
    task = MultiLabel(4, threshold=0.5)
    worst = Worst(task, keep=KEEP)
    labels = np.array([[1, 0, 1, 0], [0, 1, 0, 0]], np.float32)
    probabilities = np.array([[0.9, 0.6, 0.2, 0.1], [0.1, 0.8, 0.1, 0.3]], np.float32)
    worst.add(images(2), labels, probabilities, np.array([0.7, 0.1]))
    (mistake,) = worst.worst_first()
    assert mistake.given == (0, 2) and mistake.predicted == (0, 1)
    assert mistake.as_json(("a", "b", "c", "d"))["probabilities"] == {"a": 0.9, "c": 0.2, "b": 0.6}


def test_the_pass_ends_at_its_time_budget_and_says_so(tmp_path):
    import keras
    import tensorflow as tf

    from keras_pipe_train.report.mistakes import find

    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(3, "softmax")])
    rng = np.random.default_rng(2)
    dataset = tf.data.Dataset.from_tensor_slices((images(40, 8), rng.integers(0, 3, 40))).batch(10)
    whole = find(model, SingleLabel(3), dataset)
    assert (whole.seen, whole.cut) == (40, False)
    cut = find(model, SingleLabel(3), dataset, budget_s=0)
    assert (cut.seen, cut.cut) == (10, True)
    found = single_label_evaluation(["a", "b", "c"])
    evaluation.write(tmp_path, found, ROWS)
    shown = job_page.Gallery(cut.worst_first(), cut.seen, cut.wrong_count, cut.cut)
    text = job_page.write(tmp_path, found, ROWS, {"dialect": "keras-pipe"}, "job-4", shown).read_text()
    assert f"it gets {cut.wrong_count} of the first 10 validation images wrong" in text


def test_a_thumbnail_is_small_whatever_the_input_size():
    from PIL import Image

    for side, expected in ((224, 128), (32, 64), (100, 100)):
        picture = Image.open(io.BytesIO(thumbnail(images(1, side)[0])))
        assert picture.size == (expected, expected), side


def single_label_evaluation(classes: list[str], examples: int = 50) -> dict:
    count = len(classes)
    matrix = np.diag(np.full(count, 3))
    matrix[0, 1] = 4
    per_class = [{"class": c, "precision": 0.5, "recall": 0.25, "f1": i / count, "support": 4}
                 for i, c in enumerate(classes)]
    return {"epoch": 2, "examples": examples, "multi_label": False, "metrics": {"val_loss": 0.8, "val_accuracy": 0.6},
            "classes": classes, "per_class": per_class,
            "confusion_matrix": {"rows": "true class", "columns": "predicted class", "counts": matrix}
            if count <= 256 else None}


ROWS = [{"epoch": 1, "phase": "head", "train_loss": 1.2, "train_accuracy": 0.5, "val_loss": 1.0, "val_accuracy": 0.55,
         "seconds": 3.0},
        {"epoch": 2, "phase": "head", "train_loss": 0.9, "train_accuracy": 0.6, "val_loss": 0.8, "val_accuracy": 0.6,
         "seconds": 3.0}]


def gallery(task, classes: int, count: int) -> job_page.Gallery:
    worst = Worst(task, keep=KEEP)
    rng = np.random.default_rng(3)
    if isinstance(task, MultiLabel):
        labels = (rng.random((count, classes)) > 0.5).astype(np.float32)
        probabilities = rng.random((count, classes)).astype(np.float32)
    else:
        labels = rng.integers(0, classes, count)
        probabilities = rng.dirichlet(np.ones(classes), count).astype(np.float32)
    worst.add(images(count, 224), labels, probabilities, rng.uniform(0, 5, count))
    return job_page.Gallery(worst.worst_first(), worst.seen, worst.wrong_count)


def test_class_names_are_text_in_the_page_never_markup(tmp_path):
    hostile = ['<img src="http://127.0.0.1:9/x.png">', "</table><script>alert(1)</script>", "a&b", "ordinary"]
    found = single_label_evaluation(hostile)
    evaluation.write(tmp_path, found, ROWS)
    settings = {"dialect": "keras-pipe", "class_names": hostile, "dialect_notes": ["<b>note</b>"]}
    page = job_page.write(tmp_path, found, ROWS, settings, "job-1", gallery(SingleLabel(4), 4, 40)).read_text()
    assert "<script>" not in page and '<img src="http' not in page and "<b>note" not in page
    assert "&lt;/table&gt;&lt;script&gt;" in page
    opened = open_page(tmp_path / "report.html", tmp_path / "browser")
    assert opened.console == [] and opened.requests == [], (opened.console, opened.requests)


def with_heatmaps(shown: job_page.Gallery) -> job_page.Gallery:
    """The gallery's mistakes with two heatmaps each over noise: the JPEGs at their largest."""
    from keras_pipe_train.model import explain

    rng = np.random.default_rng(5)
    heatmaps = [tuple((what, 1, explain.overlay(images(1, 224, seed)[0], rng.random((7, 7)), HEATMAP))
                      for what in ("predicted", "label")) for seed in range(len(shown.mistakes))]
    return dataclasses.replace(shown, mistakes=[dataclasses.replace(m, heatmaps=h)
                                                for m, h in zip(shown.mistakes, heatmaps)],
                               explained=len(shown.mistakes), explained_by="Grad-CAM on backbone/layer (7 x 7)")


def suspects_shown(classes: int):
    """The label check's two sets of suspects, each its MAX_SHOWN of noise pictures with two heatmaps."""
    from keras_pipe_train.model import explain
    from keras_pipe_train.report import suspects as S
    from keras_pipe_train.sources import preprocess
    from keras_pipe_train.training.gathered import Gathered
    from keras_pipe_train.training.label_errors import Suspects

    count, rng = S.MAX_SHOWN, np.random.default_rng(6)
    pictures = images(count, 224, 9)
    thumbnails = tuple(preprocess.thumbnail(p, 64, 85).numpy() for p in pictures)
    seen = Gathered(np.zeros((count, 2), np.float32), rng.integers(0, classes, count),
                    fingerprints=tuple(f"{i:016x}" for i in range(count)), thumbnails=thumbnails,
                    sources=tuple(f"s3://bucket/a long prefix/{i:05d} of the photos.jpg" for i in range(count)))
    found = Suspects(np.arange(count), rng.integers(0, classes, count), rng.random(count), rng.random(count))
    heatmaps = [tuple((what, 1, explain.overlay(p, rng.random((7, 7)), HEATMAP)) for what in ("likely", "label"))
                for p in pictures]
    return S.Checked({"train": (seen, found), "validation": (seen, found)}, tuple(f"c{i}" for i in range(classes)),
                     5, False, 1.0, heatmaps={"train": heatmaps, "validation": heatmaps},
                     explained_by="Grad-CAM on backbone/layer (7 x 7)")


@pytest.mark.slow
def test_the_page_is_bounded_however_many_classes(tmp_path):
    """2,000 classes, the gallery and both sets of suspects with their heatmaps, all of noise."""
    classes = [f"class number {i} with a long name" for i in range(2000)]
    found = single_label_evaluation(classes, examples=100_000)
    evaluation.write(tmp_path, found, ROWS)  # (too many classes for a matrix: per_class.png)
    page = job_page.write(tmp_path, found, ROWS, {"dialect": "keras-pipe", "class_names": classes}, "job-1",
                          with_heatmaps(gallery(SingleLabel(2000), 2000, 500)), suspects_shown(2000))
    text = page.read_text()
    assert text.count('alt="heatmap of ') == 2 * KEEP + 2 * 2 * 24, text.count('alt="heatmap of ')
    assert page.stat().st_size < 1_500_000, page.stat().st_size
    assert text.count("<tr>") < job_page.MAX_CLASS_ROWS + 100
    assert f"the {job_page.MAX_CLASS_ROWS} of lowest F1 of 2000 classes" in text
    assert text.count('<div class="tile">') == KEEP + 2 * 24  # (the mistakes, the suspects of each set)
    assert f"... ({len(json.dumps(classes)):,} characters)" in text  # (the setting, shortened)


@pytest.mark.slow
def test_a_multi_label_page_in_a_browser(tmp_path):
    classes = ["sky", "tree", "car", "person", "dog"]
    tp, fp, fn = np.array([5, 4, 0, 3, 2]), np.array([1, 0, 6, 2, 0]), np.array([0, 7, 2, 1, 0])
    found = {"epoch": 3, "examples": 20, "multi_label": True, "metrics": {"val_loss": 0.4, "val_f1_micro": 0.7},
             "classes": classes, "threshold": 0.5,
             "per_class": [{"class": c, "precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 5} for c in classes],
             "per_class_counts": {"true_positives": tp, "false_positives": fp, "false_negatives": fn,
                                  "true_negatives": 20 - tp - fp - fn}}
    rows = [dict(row, train_f1_micro=0.6, val_f1_micro=0.7) for row in ROWS]
    evaluation.write(tmp_path, found, rows)
    shown = gallery(MultiLabel(5), 5, 30)
    page = job_page.write(tmp_path, found, rows, {"dialect": "mxnet"}, "job-2", shown)
    text = page.read_text()
    missed = re.search(r"Classes most often missed</h3><table>.*?<tbody>(.*?)</tbody>", text).group(1)
    assert re.findall(r"<tr><td>(\w+)</td>", missed) == ["tree", "car", "person"]  # (by false negatives)
    assert "labelled: " in text and text.count('<div class="tile">') == len(shown.mistakes) > 0
    opened = open_page(page, tmp_path / "browser")
    assert opened.console == [] and opened.requests == [], (opened.console, opened.requests)
    pictures, area = painted(page, tmp_path / "browser")
    assert pictures == len(shown.mistakes) and area >= pictures * 64 * 64, (pictures, area)


def test_a_job_stopped_before_its_gallery_says_so(tmp_path):
    found = single_label_evaluation(["a", "b"])
    evaluation.write(tmp_path, found, ROWS)
    text = job_page.write(tmp_path, found, ROWS, {"dialect": "keras-pipe"}, "job-3", None).read_text()
    assert "no gallery: a stop request came before the pass that finds them ended" in text
    empty = dataclasses.replace(gallery(SingleLabel(2), 2, 4), mistakes=[], wrong=0)
    text = job_page.write(tmp_path, found, ROWS, {"dialect": "keras-pipe"}, "job-3", empty).read_text()
    assert "none: it gets all 4 validation images right" in text


def test_the_calibration_section_says_the_rule_served_its_bias_and_what_was_left_out(tmp_path):
    from keras_pipe_train.training import calibration as C

    rng = np.random.default_rng(0)
    truth = rng.normal(0, 3, (2000, 3))
    labels = (rng.random((2000, 3)) < C.tempered(truth, 1.0, True)).astype(np.float32)
    logits = truth + np.array([2.0, 0.0, 0.0])
    logits[5, 1] = np.nan
    found = C.calibrate(logits, labels, True, "auto", seed=0)
    shown = {"multi_label": True, "classes": ["cat", "dog", "bird"], "calibration": found.as_json()}
    text = job_page.calibration_section(tmp_path, shown)
    assert found.method == C.PLATT and "Platt scaling: a temperature for each class" in text
    assert "and a bias for each class, -1.9" in text and "<th>bias</th>" in text
    assert "1 example whose logits are not finite left out" in text and "the predictions are the same" in text
    plain = C.calibrate(truth * 2, labels, True, "auto", seed=0).as_json()
    text = job_page.calibration_section(tmp_path, {**shown, "calibration": plain})
    assert "bias" not in text and "left out" not in text


def test_a_calibration_not_measured_says_why_on_the_page(tmp_path):
    """The outside review: every logit not finite made the fit fail, and the page said "no
    validation pass before the export, or a stop request"."""
    text = job_page.calibration_section(tmp_path, {"calibration": None, "calibration_unmeasured": (
        "the fit failed (ValueError: none of the 200 validation examples' logits are finite (NaN or infinite)); the "
        "model is exported as trained")})
    assert "not measured: the model was not calibrated (the fit failed (ValueError: none of the 200" in text
    assert "no validation pass before the export" in job_page.calibration_section(tmp_path, {"calibration": None})


def test_a_single_label_class_offset_shows_beside_its_share_of_the_images(tmp_path):
    """The outside review: logits offset by class (class_weights=balanced makes such offsets on
    purpose) are left so by a temperature, which keeps each image's likeliest class; the page now
    shows each class's mean probability against its share of the validation images, the classes
    furthest first."""
    from keras_pipe_train.training import calibration as C

    rng = np.random.default_rng(1)
    truth = rng.normal(0, 2, (3000, 6))
    labels = (C.tempered(truth, 1.0, False).cumsum(axis=1) > rng.random((3000, 1))).argmax(axis=1)
    logits = truth + np.array([0, 0.5, 1.0, 1.5, -1.0, -1.5]) * 2
    found = C.calibrate(logits, labels, False, "auto", seed=0).as_json()
    means = found["class_means"]
    assert means["share"] == pytest.approx(np.bincount(labels, minlength=6) / 3000)
    assert means["before"] == pytest.approx(C.tempered(logits, 1.0, False).mean(axis=0))
    shown = {"multi_label": False, "classes": list("abcdef"), "calibration": found}
    text = job_page.calibration_section(tmp_path, shown)
    assert "<h3>Each class's mean probability against its share of the images</h3>" in text
    first = int(np.argmax(np.abs(np.array(means["after"]) - np.array(means["share"]))))
    rows = re.findall(r"<tr><td>([a-f])</td>", text)
    assert rows[0] == "abcdef"[first] and len(rows) == 6, rows


def test_the_exports_section_shows_each_formats_figures_and_what_was_dropped_and_why():
    exports = {"tflite": {"bytes": 3772068, "images": 397, "agreement": 1.0, "max_probability_difference": 4.8e-6,
                          "accuracy": 0.806, "savedmodel_accuracy": 0.806},
               "tflite_int8": {"bytes": 1132184, "images": 397, "agreement": 0.97, "max_probability_difference": 0.2,
                               "accuracy": 0.79, "savedmodel_accuracy": 0.806,
                               "dropped": "it decides 97.00% of the images as the SavedModel does, below 98.0%"},
               "tflite_float16": {"dropped": "the conversion failed: ConverterError: <op> unsupported"}}
    text = job_page.exports_section({"exports": exports})
    assert "whose accuracy is 80.60%" in text
    rows = re.findall(r"<tr><td>(.*?)</td></tr>", text)
    assert rows[0].startswith("tflite</td><td") and "3.77 MB" in rows[0] and "100.00%" in rows[0] and rows[0].endswith(
        "<td>kept") and ">4.8e-06<" in rows[0]
    assert "1.13 MB" in rows[1] and "dropped: it decides 97.00% of the images" in rows[1]
    assert "dropped: the conversion failed: ConverterError: &lt;op&gt; unsupported" in rows[2]  # (text, never markup)
    assert job_page.exports_section({"exports": None}) == job_page.exports_section({}) == ""
