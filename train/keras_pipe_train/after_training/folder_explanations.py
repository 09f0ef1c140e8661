"""`keras-pipe predict --explain DIR`: where a finished job's model found the evidence for what it
predicted of each image (model/explain.py: Grad-CAM, or Integrated Gradients), as JPEGs: the
picture as the model saw it (prepared as the job's validation, preparation.json) under the heatmap
of each class it predicted, named <image's name>.<class>.jpg."""

from __future__ import annotations

import re
from pathlib import Path

import tensorflow as tf

from keras_pipe_train.after_training.folder_exports import read_model_folder
from keras_pipe_train.model import explain
from keras_pipe_train.sources import preprocess

BATCH = 16
SIZE = 256  # pixels of an overlay's longer side (a 32-pixel model's picture is shown larger)


def explain_images(model_dir: Path, named: str, images: list[tuple[Path, bytes, list[str]]], out: Path
                   ) -> tuple[list[Path], str]:
    """For each (path, encoded image, the classes predicted of it), the heatmap of each class over
    the picture, written in `out`; the files, and how they were made ("Grad-CAM on ...")."""
    folder = read_model_folder(model_dir, named)
    explainer = explain.explainer(folder.model)
    names = [str(c) for c in folder.classes]
    out.mkdir(parents=True, exist_ok=True)
    written, taken = [], set()
    for start in range(0, len(images), BATCH):
        batch = images[start:start + BATCH]
        pictures = preprocess.served_batch(tf.constant([data for _, data, _ in batch]), folder.settings.image_size,
                                           folder.resize, folder.interpolation).numpy()
        asked = [(i, names.index(name)) for i, (_, _, chosen) in enumerate(batch) for name in chosen if name in names]
        if not asked:
            continue
        heat = explainer.heatmaps(pictures[[i for i, _ in asked]], [label for _, label in asked])
        for row, (i, label) in zip(heat, asked):
            path = _unique(out, f"{_safe(batch[i][0].stem)}.{_safe(names[label])}", taken)
            path.write_bytes(explain.overlay(pictures[i], row, SIZE))
            written.append(path)
    return written, f"{explainer.method} on {explainer.where}"


def _safe(name: str) -> str:
    """A name as a file's: what is not a letter, digit, dot, dash or underscore becomes "_" (class
    names and file names nobody sanitised: "a/b", "..", spaces)."""
    return re.sub(r"[^\w.-]", "_", name).strip(".") or "_"


def _unique(out: Path, stem: str, taken: set[str]) -> Path:
    """out/stem.jpg, or out/stem-2.jpg and so on where two images share a name (photos/a/x.jpg and
    photos/b/x.jpg)."""
    name, number = stem, 1
    while name in taken:
        number += 1
        name = f"{stem}-{number}"
    taken.add(name)
    return out / f"{name}.jpg"
