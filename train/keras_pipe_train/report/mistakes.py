"""The validation images the exported model gets most wrong: of those it gets wrong, the ones of
highest loss, as fastai's plot_top_losses shows them, for the job's report page (job_page.py) and TensorBoard.

One pass over the validation channel, on the chief alone, after the export (the other hosts wait
for it in the job's last collective): each batch through the model as exported (its probabilities
calibrated when they are served so), each example's
loss as validation computes it (the plain cross-entropy), and only the KEEP worst kept, in a heap:
memory stays bounded whatever the size of the set. What is kept of an image is the picture the
model saw (its input, after the same resize and crop as validation), shrunk to a
THUMBNAIL-pixel JPEG: at most KEEP x ~5 KB in the page.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging

import numpy as np
import tensorflow as tf

from keras_pipe_train.sources import preprocess
from keras_pipe_train.training.gathered import Within
from keras_pipe_train.training.tasks import MultiLabel, SingleLabel
from keras_pipe_train.training.traced import for_any_batch

log = logging.getLogger(__name__)

KEEP = 24  # images in the report's gallery
THUMBNAIL = 128  # pixels: the longer side of a gallery image
HEATMAP = 96  # pixels: the longer side of a heatmap beside it (as the page shows it: the page's size)
QUALITY = 85


@dataclasses.dataclass(frozen=True)
class Mistake:
    """One validation image and what the model said of it. `given`/`predicted`: class ids (one each
    for single-label; for multi-label, the classes labelled / those at or above the threshold);
    `probabilities`: the model's probability of each class in either."""

    loss: float
    jpeg: bytes
    given: tuple[int, ...]
    predicted: tuple[int, ...]
    probabilities: dict[int, float]
    # the picture as the model took it (0-255, uint8), kept for its heatmaps (explained), then let go
    picture: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)
    heatmaps: tuple[tuple[str, int, bytes], ...] = ()  # (what: "predicted"/"label", class, the overlay's JPEG)

    def as_json(self, class_names: tuple[str, ...]) -> dict:
        def name(label: int) -> str:
            return class_names[label] if label < len(class_names) else str(label)

        return {"loss": round(self.loss, 4), "given": [name(c) for c in self.given],
                "predicted": [name(c) for c in self.predicted],
                "probabilities": {name(c): round(p, 4) for c, p in self.probabilities.items()}}


class Worst:
    """Of the examples seen so far that the model gets wrong, the `keep` of highest loss (a
    min-heap: the least bad of them on top)."""

    def __init__(self, task: SingleLabel | MultiLabel, keep: int = KEEP, threshold=None):
        """`threshold`: multi-label, the probability (or one per class) from which a class counts
        as predicted: the task's, or the calibrated probabilities' (training/calibration.py)."""
        self.task, self.keep = task, keep
        self.threshold = task.threshold if threshold is None and isinstance(task, MultiLabel) else threshold
        self.seen = self.wrong_count = 0
        self.cut = False  # (the pass ended at its time budget, before the channel's end)
        self._heap: list = []
        self._order = itertools.count()  # (ties broken by arrival, never by comparing images)

    def wrong(self, labels: np.ndarray, probabilities: np.ndarray) -> np.ndarray:
        """Which examples the model gets wrong: another class (single-label), or not exactly the
        classes labelled (multi-label, at the threshold)."""
        if isinstance(self.task, MultiLabel):
            return np.any((probabilities >= self.threshold) != (labels >= 0.5), axis=-1)
        return np.argmax(probabilities, axis=-1) != labels

    def add(self, images: np.ndarray, labels: np.ndarray, probabilities: np.ndarray, losses: np.ndarray) -> None:
        self.seen += len(losses)
        wrong = self.wrong(labels, probabilities)
        self.wrong_count += int(wrong.sum())
        losses = np.where(wrong, losses, -np.inf)  # (only the wrong ones enter the gallery)
        for index in np.argsort(-losses)[:min(self.keep, int(wrong.sum()))]:
            loss = float(losses[index])
            if not np.isfinite(loss):
                loss = float("inf")
            if len(self._heap) == self.keep and loss <= self._heap[0][0]:
                break  # (sorted: none after it is worse either)
            entry = (loss, next(self._order), self._mistake(images[index], labels[index], probabilities[index], loss))
            if len(self._heap) < self.keep:
                heapq.heappush(self._heap, entry)
            else:
                heapq.heapreplace(self._heap, entry)

    def _mistake(self, image: np.ndarray, label: np.ndarray, probabilities: np.ndarray, loss: float) -> Mistake:
        probabilities = probabilities.astype(np.float64)
        if isinstance(self.task, MultiLabel):
            given = tuple(int(c) for c in np.flatnonzero(label >= 0.5))
            predicted = tuple(int(c) for c in np.flatnonzero(probabilities >= self.threshold))
        else:
            given, predicted = (int(label),), (int(np.argmax(probabilities)),)
        shown = dict.fromkeys((*given, *predicted))
        picture = np.clip(np.round(image), 0, 255).astype(np.uint8)
        return Mistake(loss, thumbnail(image), given, predicted, {c: float(probabilities[c]) for c in shown}, picture)

    def worst_first(self) -> list[Mistake]:
        return [entry[2] for entry in sorted(self._heap, key=lambda entry: (-entry[0], entry[1]))]


def thumbnail(image: np.ndarray) -> bytes:
    """The model's input image (0-255 floats, height x width x 3) as a JPEG of at most THUMBNAIL pixels a side."""
    return preprocess.thumbnail(image, THUMBNAIL, QUALITY).numpy()


def find(predict, task: SingleLabel | MultiLabel, dataset: tf.data.Dataset, stop=None, keep: int = KEEP,
         budget_s: float | None = None, threshold=None) -> Worst:
    """The worst `keep` of `dataset`'s (images, labels) batches for `predict` (images -> the
    probabilities the model serves); `stop` (a threading.Event) ends the pass early, and so does
    `budget_s` seconds gone (`cut` then says so, as it does for a stop). `threshold`: Worst's."""
    worst = Worst(task, keep, threshold)
    predict = for_any_batch(predict)
    batches = Within(dataset, stop, budget_s)
    for images, labels in batches:
        probabilities = tf.cast(predict(images), tf.float32)
        losses = task.per_example_loss(False, labels, probabilities)
        worst.add(images.numpy(), labels.numpy(), probabilities.numpy(), losses.numpy())
    worst.cut = batches.cut
    return worst


def asked(mistakes: list[Mistake]) -> list[list[tuple[str, int]]]:
    """The classes each mistake's heatmaps are of (model/explain.py's `drawn`): its predicted class
    and its label. Multi-label: the class predicted wrongly of highest probability, and the label
    missed of lowest (either may be none)."""
    return [[(what, label) for what, label in zip(("predicted", "label"), _explained_classes(mistake))
             if label is not None] for mistake in mistakes]


def explained(mistakes: list[Mistake], drawn: list[tuple], asked: list[list]) -> tuple[list[Mistake], int]:
    """`mistakes` with the heatmaps `drawn` of the classes `asked` of them (explain.drawn's), and how
    many got those asked (the budget may have ended before the last). The pictures are let go."""
    done = sum(1 for heatmaps, wanted in zip(drawn, asked) if heatmaps or not wanted)
    return [dataclasses.replace(mistake, picture=None, heatmaps=heatmaps)
            for mistake, heatmaps in zip(mistakes, drawn)], done


def _explained_classes(mistake: Mistake) -> tuple[int | None, int | None]:
    """(the class predicted wrongly, the label missed) of a mistake."""
    wrong = [c for c in mistake.predicted if c not in mistake.given]
    missed = [c for c in mistake.given if c not in mistake.predicted]
    return (max(wrong, key=mistake.probabilities.get) if wrong else None,
            min(missed, key=mistake.probabilities.get) if missed else None)
