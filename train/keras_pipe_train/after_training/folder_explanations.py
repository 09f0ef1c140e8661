"""`keras-pipe predict --explain DIR`: where a finished job's model found the evidence for what it
predicted of each image (model/explain.py: Grad-CAM, or Integrated Gradients), as JPEGs: the
picture as the model saw it (prepared as the job's validation, preparation.json) under the heatmap
of each class it predicted, named <image's name>.<class>.jpg (each name's characters other than
letters, digits, ".", "-" and "_" as "_", a long one shortened with a hash of it; "-2", "-3"... where
two would share one, whatever their case)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import tensorflow as tf

from keras_pipe_train.after_training.folder_exports import read_model_folder
from keras_pipe_train.model import explain
from keras_pipe_train.sources import preprocess

SIZE = 256  # pixels of an overlay's longer side (a 32-pixel model's picture is shown larger)
LONGEST = 80  # characters of a name's part kept in a file's name (file systems take 255 bytes)


class Explanations:
    """The heatmaps of a model folder's predictions, written in `out` batch by batch (add). Made
    before any prediction: a model folder that cannot explain (no model.keras, no preparation.json)
    is a UserError at once."""

    def __init__(self, model_dir: Path, named: str, out: Path):
        self.folder = read_model_folder(model_dir, named)
        self.explainer = explain.explainer(self.folder.model)
        self.names = [str(c) for c in self.folder.classes]
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.written: list[Path] = []
        self.none_predicted = 0  # (multi-label: images with no class at or above its threshold)
        self._taken: set[str] = set()

    @property
    def how(self) -> str:
        return f"{self.explainer.method} on {self.explainer.where}"

    def add(self, batch: list[tuple[Path, bytes, list[str]]]) -> None:
        """For each (path, encoded image, the classes predicted of it), the heatmap of each class."""
        self.none_predicted += sum(1 for _, _, chosen in batch if not chosen)
        batch = [item for item in batch if item[2]]
        if not batch:
            return
        settings = self.folder.settings
        pictures = preprocess.served_batch(tf.constant([data for _, data, _ in batch]), settings.image_size,
                                           self.folder.resize, self.folder.interpolation).numpy()
        asked = [[("predicted", self.names.index(name)) for name in chosen if name in self.names]
                 for _, _, chosen in batch]
        for (path, _, _), heatmaps in zip(batch, explain.drawn(self.explainer, pictures, asked, SIZE)):
            for _, label, jpeg in heatmaps:
                target = self._unique(f"{_safe(path.stem)}.{_safe(self.names[label])}")
                target.write_bytes(jpeg)
                self.written.append(target)

    def _unique(self, stem: str) -> Path:
        """out/stem.jpg, or out/stem-2.jpg and so on where two images share a name (photos/a/x.jpg
        and photos/b/X.jpg: the same file where names ignore case, macOS' and Windows')."""
        name, number = stem, 1
        while name.lower() in self._taken:
            number += 1
            name = f"{stem}-{number}"
        self._taken.add(name.lower())
        return self.out / f"{name}.jpg"


def _safe(name: str) -> str:
    """A name as part of a file's: what is not a letter, digit, dot, dash or underscore becomes "_"
    (class names and file names nobody sanitised: "a/b", "..", spaces); past LONGEST characters, its
    start and a hash of the whole."""
    safe = re.sub(r"[^\w.-]", "_", name).strip(".") or "_"
    if len(safe) > LONGEST:
        safe = f"{safe[:LONGEST - 9]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return safe
