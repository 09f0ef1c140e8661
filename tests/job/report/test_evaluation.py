"""The final evaluation: each class's precision, recall and F1, the confusion matrix (or each
class's counts, multi-label) from a pass on known labels, and the pictures drawn beside it."""

import json
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_train.report import evaluation
from keras_pipe_train.report.pages import drawn
from keras_pipe_train.training.distribute import Cluster
from keras_pipe_train.training.loop import Trainer
from keras_pipe_train.training.recipe import Loss

PNG = b"\x89PNG\r\n\x1a\n"


def evaluated(probabilities, labels, loss: Loss, steps_per_execution=1):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, kernel_initializer="identity")])
    trainer = Trainer(model, Cluster(tf.distribute.get_strategy(), 1, 0, True), mixed_precision=False, loss=loss,
                      steps_per_execution=steps_per_execution)
    trainer.start_phase(0.1)
    dataset = tf.data.Dataset.from_tensor_slices((np.asarray(probabilities, np.float32), np.asarray(labels))).batch(2)
    return trainer, trainer.evaluate_in_detail(dataset)


@pytest.mark.slow
@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_the_confusion_matrix_and_each_class_on_known_labels(steps_per_execution, tmp_path):
    # predicted (argmax): 0, 1, 1, 2, 2 ; true: 0, 1, 0, 2, 1
    probabilities = [[.8, .1, .1], [.1, .8, .1], [.3, .6, .1], [.1, .2, .7], [.2, .3, .5]]
    labels = np.array([0, 1, 0, 2, 1], np.int64)
    trainer, (scores, examples, counts, detail) = evaluated(probabilities, labels, Loss(top_k=2), steps_per_execution)
    report = evaluation.report(trainer.task, ("a", "b", "c"), scores, examples, counts, detail, epoch=4)
    assert report["confusion_matrix"]["counts"].tolist() == [[1, 1, 0], [0, 1, 1], [0, 0, 1]]
    assert scores["val_accuracy"] == pytest.approx(3 / 5) and scores["val_top_k_accuracy"] == pytest.approx(5 / 5)
    a, b, c = report["per_class"]
    assert (a["precision"], a["recall"], a["support"]) == (1.0, 0.5, 2)
    assert (b["precision"], b["recall"], b["f1"]) == (0.5, 0.5, 0.5)
    assert (c["precision"], c["recall"], c["f1"]) == (0.5, 1.0, pytest.approx(2 / 3))
    evaluation.write(tmp_path, report, [{"epoch": 1, "phase": "head", "train_loss": 1.0, "val_loss": 0.9,
                                         "train_accuracy": 0.5, "val_accuracy": 0.6}])
    written = json.loads((tmp_path / "evaluation.json").read_text())
    assert written["confusion_matrix"]["counts"] == [[1, 1, 0], [0, 1, 1], [0, 0, 1]] and written["epoch"] == 4
    assert written["metrics"]["val_accuracy"] == pytest.approx(0.6)
    for picture in ("learning_curves.png", "confusion_matrix.png"):
        assert (tmp_path / picture).read_bytes()[:8] == PNG


def test_multi_label_reports_each_class_counts(tmp_path):
    probabilities = [[0.9, 0.2, 0.6], [0.1, 0.8, 0.4], [0.7, 0.6, 0.3], [0.2, 0.1, 0.05]]
    labels = [[1, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 1]]
    trainer, (scores, examples, counts, detail) = evaluated(probabilities, np.float32(labels), Loss(multi_label=True))
    report = evaluation.report(trainer.task, ("a", "b", "c"), scores, examples, counts, detail, epoch=2)
    assert report["per_class_counts"]["true_positives"].tolist() == [2, 1, 1]
    assert report["per_class_counts"]["false_positives"].tolist() == [0, 1, 0]
    assert report["per_class_counts"]["true_negatives"].tolist() == [2, 2, 2]
    assert [row["support"] for row in report["per_class"]] == [2, 1, 2]
    evaluation.write(tmp_path, report, [])
    assert (tmp_path / "per_class.png").read_bytes()[:8] == PNG
    assert json.loads((tmp_path / "evaluation.json").read_text())["threshold"] == 0.5


def test_a_picture_that_cannot_be_drawn_is_a_warning_and_the_numbers_are_still_written(tmp_path, caplog, monkeypatch):
    def broken(*args):
        raise RuntimeError("no fonts here")

    monkeypatch.setattr(evaluation, "confusion_picture", broken)
    report = {"epoch": 1, "examples": 2, "multi_label": False, "metrics": {"val_loss": float("nan")}, "classes": ["a", "b"],
              "per_class": [], "confusion_matrix": {"counts": np.eye(2)}}
    evaluation.write(tmp_path, report, [])
    assert "could not draw confusion_matrix.png (RuntimeError: no fonts here)" in caplog.text
    assert json.loads((tmp_path / "evaluation.json").read_text())["metrics"] == {"val_loss": None}
    assert (tmp_path / "learning_curves.png").is_file()


def test_class_names_nobody_sanitised_are_drawn_as_text(tmp_path, caplog):
    """A name between two dollars is TeX to matplotlib (`$\\frac$` failed the whole picture), an
    escape code has no glyph (matplotlib warned with it raw on stderr, where it reached the terminal):
    each is drawn as its text, and nothing is warned."""
    names = [r"$\frac$", "red\x1b[31m", "a$b$c", "猫"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        evaluation.confusion_picture(np.eye(4, dtype=int) * 3, names, tmp_path / "confusion_matrix.png")
        evaluation.per_class_bars([{"class": n, "precision": 0.5, "recall": 0.5, "f1": 0.5} for n in names],
                                  tmp_path / "per_class.png", "each class")
    assert (tmp_path / "confusion_matrix.png").read_bytes()[:8] == PNG
    assert (tmp_path / "per_class.png").read_bytes()[:8] == PNG
    assert [drawn(n, 20) for n in names] == [r"\$\frac\$", "red\\x1b[31m", r"a\$b\$c", "猫"]
