"""The report page's heatmaps (after_training/report_page.py's with_heatmaps): the gallery's mistakes
and the label check's suspects drawn together by one explainer, within their time, the pictures let
go whatever happens, and the page told why there are none when there are none. On a real (untrained)
classifier of the job's own building, as a job's chief draws them."""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from keras_pipe_train.report import job_page
from keras_pipe_train.report.mistakes import KEEP, Worst
from keras_pipe_train.training.tasks import SingleLabel

SIZE, CLASSES = 32, 4


@pytest.fixture(scope="module")
def trained():
    import keras

    from keras_pipe_train.model.classifier import build_backbone, build_classifier

    keras.utils.set_random_seed(0)
    model = build_classifier("mobilenet_v3_small", build_backbone("mobilenet_v3_small", SIZE, None), CLASSES, 0.0,
                             image_size=SIZE)
    return SimpleNamespace(model=model, config=SimpleNamespace(image_size=SIZE), stop=threading.Event())


def pictures(count: int, side: int = SIZE, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 255, (count, side, side, 3)).astype(np.float32)


def gallery(count: int, budget_s: float = 2.0) -> job_page.Gallery:
    worst = Worst(SingleLabel(CLASSES), keep=KEEP)
    rng = np.random.default_rng(1)
    labels = np.arange(count) % CLASSES
    probabilities = np.eye(CLASSES, dtype=np.float32)[(labels + 1) % CLASSES] * 0.7 + 0.3 / CLASSES  # all wrong
    worst.add(pictures(count), labels, probabilities, rng.uniform(1, 5, count))
    return job_page.Gallery(worst.worst_first(), worst.seen, worst.wrong_count, heatmaps_budget_s=budget_s)


def checked(count: int = 5, seconds: float = 1.0):
    """The label check's validation suspects, with the 64-pixel thumbnails a check keeps."""
    from keras_pipe_train.report import suspects as S
    from keras_pipe_train.sources import preprocess
    from keras_pipe_train.training.gathered import Gathered
    from keras_pipe_train.training.label_errors import Suspects

    rng = np.random.default_rng(2)
    thumbnails = tuple(preprocess.thumbnail(p, 64, 85).numpy() for p in pictures(count, 96, 3))
    seen = Gathered(np.zeros((count, CLASSES), np.float32), rng.integers(0, CLASSES, count),
                    fingerprints=tuple(f"{i:016x}" for i in range(count)), thumbnails=thumbnails)
    found = Suspects(np.arange(count), rng.integers(0, CLASSES, count), rng.random(count), rng.random(count))
    return S.Checked({"validation": (seen, found)}, tuple(f"c{i}" for i in range(CLASSES)), 0, False, seconds)


def test_the_mistakes_and_the_suspects_get_their_two_heatmaps_from_one_explainer(trained):
    from keras_pipe_train.after_training.report_page import with_heatmaps

    shown, found = with_heatmaps(trained, gallery(6), checked())
    assert shown.explained == 6 and shown.explained_by.startswith("Grad-CAM on MobileNetV3Small/"), shown
    for mistake in shown.mistakes:
        assert mistake.picture is None  # (let go: never on the page)
        assert [(what, label) for what, label, _ in mistake.heatmaps] == [
            ("predicted", mistake.predicted[0]), ("label", mistake.given[0])]
        assert all(jpeg[:2] == b"\xff\xd8" for _, _, jpeg in mistake.heatmaps)
    (seen, suspects), = found.sets.values()
    drawn = found.heatmaps["validation"]
    assert len(drawn) == 5 and found.explained_by == shown.explained_by  # (64-pixel pictures: none enlarged)
    for heatmaps, index, likely in zip(drawn, suspects.indices, suspects.likely):
        assert [(what, label) for what, label, _ in heatmaps] == [("likely", likely), ("label", seen.labels[index])]


def test_suspects_alone_are_drawn_and_a_gallery_without_mistakes_takes_no_time(trained):
    from keras_pipe_train.after_training.report_page import with_heatmaps

    empty = job_page.Gallery([], 10, 0)
    shown, found = with_heatmaps(trained, empty, checked(), left_s=None)
    assert shown == dataclasses.replace(empty, explained=0, explained_by="") and len(found.heatmaps["validation"]) == 5
    shown, found = with_heatmaps(trained, None, checked())
    assert shown is None and len(found.heatmaps["validation"]) == 5
    assert with_heatmaps(trained, None, "label_check=false") == (None, "label_check=false")


def test_without_time_or_after_a_stop_none_is_drawn_the_pictures_are_let_go_and_the_page_says_why(trained):
    from keras_pipe_train.after_training.report_page import with_heatmaps

    shown, found = with_heatmaps(trained, gallery(6, budget_s=3.0), checked(), left_s=0.0)
    assert shown.explained == 0 and shown.explained_by == "their time budget (0.0 s) ended before the first", shown
    assert all(m.picture is None and m.heatmaps == () for m in shown.mistakes)
    assert found.heatmaps["validation"] == [()] * 5
    trained.stop.set()
    try:
        shown, found = with_heatmaps(trained, gallery(6), checked())
    finally:
        trained.stop.clear()
    assert shown.explained == 0 and shown.explained_by == "a stop request came before them"
    assert all(m.picture is None for m in shown.mistakes) and found.heatmaps == {}


def test_a_model_that_cannot_be_explained_is_a_warning_and_the_page_says_they_failed(trained, caplog):
    import keras

    from keras_pipe_train.after_training.report_page import with_heatmaps

    inputs = keras.Input((SIZE, SIZE, 3))
    headless = keras.Model(inputs, keras.layers.Dense(CLASSES)(keras.layers.GlobalAveragePooling2D()(inputs)))
    shown, found = with_heatmaps(SimpleNamespace(model=headless, config=trained.config, stop=trained.stop),
                                 gallery(3), checked())
    assert shown.explained == 0 and shown.explained_by == "they failed (ValueError)", shown
    assert all(m.picture is None for m in shown.mistakes) and found.heatmaps == {}
    assert "could not draw the heatmaps (ValueError" in caplog.text
