"""The exported model, loaded once and called in-process: encoded images in, one prediction object
per image out (this project's; payloads shapes it into the answer of the model's dialect, which
serving.json says: "keras-pipe", "mxnet" or "tensorflow"; a serving.json without it, from an
export before dialects, or none at all: "keras-pipe"). serving.json is read by its schema
(keras_pipe_train.settings.serving_schema), in any version an export has written.

It loads the SavedModel the job exported (model/1, TF Serving's layout) with TensorFlow alone: no
Keras, no code of the job, so a worker starts in seconds and holds one graph. Each image is checked
from its header first (keras_pipe_train.sources.images: not an image, damaged, a decompression bomb), so
a bad image is a 400 naming it instead of an error from inside the graph; the graph checks the
same limits again (preprocess.checked) for callers that reach it directly.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from keras_pipe_serve.payloads import BadRequest
from keras_pipe_train.settings import cpu_kernels, serving_schema
from keras_pipe_train.settings.serving_schema import ServingSettings
from keras_pipe_train.sources import images as image_checks

log = logging.getLogger("keras_pipe_serve")

DEFAULT_TOP_K = 5


class ImageError(BadRequest):
    """A 400 for one image of a request: `index`, its place in the request (from 0), which the
    answer names."""

    def __init__(self, index: int, problem: str):
        super().__init__(400, problem)
        self.index = index
        self.problem = problem

    def named(self, count: int) -> str:
        """The message, naming the image among `count` sent."""
        return f"{'the body' if count == 1 else f'item {self.index + 1}'} {self.problem}"


class ModelError(Exception):
    """The model folder cannot be served (said at startup, before any request)."""


def saved_model_dir(model_dir: Path) -> Path:
    """model_dir itself if it is a SavedModel, else its highest numbered version (TF Serving's rule)."""
    if (model_dir / "saved_model.pb").is_file():
        return model_dir
    versions = sorted((int(p.name), p) for p in model_dir.glob("*") if p.name.isdigit()
                      and (p / "saved_model.pb").is_file())
    if not versions:
        raise ModelError(f"{model_dir} holds no SavedModel (saved_model.pb, or a numbered folder holding one, as the "
                         f"job exports it: model/1); it holds: {sorted(p.name for p in model_dir.glob('*'))[:20]}")
    return versions[-1][1]


class Predictor:
    def __init__(self, model_dir: Path, threads: int | None = None, inter_threads: int | None = None):
        """`threads`: TensorFlow's threads within an op (the convolutions); `inter_threads`: ops
        run at once (a batch's images decode in parallel), `threads` unless given."""
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # (TensorFlow's C++ startup chatter)
        log.info("%s", cpu_kernels.choose())  # (oneDNN on: the backbone is not known here; cpu_kernels.py)
        import tensorflow as tf  # (here: the request parsing above runs without it)

        if threads:
            # one worker's share of the cores: several workers each using all of them would only
            # take turns (set before the first op runs, which is why it is here)
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(inter_threads or threads)
        self._tf = tf
        model_dir = Path(model_dir)
        served = saved_model_dir(model_dir)
        # the export's JSON files lie beside its SavedModel folder (model/1): in model_dir, or
        # beside the SavedModel folder given itself
        folders = list(dict.fromkeys([model_dir, served.parent]))
        settings = serving_settings(folders)
        self.max_pixels, self.threshold, self.dialect = settings.max_image_pixels, settings.threshold, settings.dialect
        try:
            self._serve = tf.saved_model.load(str(served)).signatures["serving_default"]
        except (OSError, ValueError, KeyError, tf.errors.OpError) as err:
            raise ModelError(f"{served} cannot be loaded as the job's SavedModel: {type(err).__name__}: "
                             f"{str(err)[:300]}") from None
        outputs = self._serve.structured_outputs
        self.multi_label = "predicted" in outputs
        if "probabilities" not in outputs:
            raise ModelError(f"{served}'s serving_default signature has no 'probabilities' output (it has "
                             f"{sorted(outputs)}): not a model exported by this job")
        count = int(outputs["probabilities"].shape[-1])
        names = next((found for found in (_json_file(f / "classes.json") for f in folders) if found is not None),
                     None)
        if names is None:
            log.warning("no classes.json beside the model: classes are named by their ids")
            names = [str(i) for i in range(count)]
        if len(names) != count:
            raise ModelError(f"classes.json lists {len(names)} classes but the model has {count} outputs")
        self.labels = [str(n) for n in names]
        self.calibrated_thresholds = calibrated_thresholds(settings, count) if self.multi_label else None
        self.default_top_k = min(DEFAULT_TOP_K, count)
        log.info("loaded %s: %d classes, %s, answering in the %s dialect", served, count,
                 f"multi-label (threshold {self.threshold})" if self.multi_label else "single-label", self.dialect)

    def problem(self, data: bytes) -> str | None:
        """Why `data` is not an image this model takes (from its header), or None."""
        return image_checks.problem(data, self.max_pixels)

    def predict(self, images: list[bytes], top_k: int | None = None) -> list[dict]:
        """One prediction object per image, in this thread (the server's workers go through a
        batcher instead: keras_pipe_serve.batcher)."""
        self.check(images)
        try:
            return self.predictions(*self.run(images), top_k)
        except ImageError as err:
            raise BadRequest(400, err.named(len(images))) from None

    def check(self, images: Sequence[bytes]) -> None:
        """A 400 naming the first image that this model cannot take, from the headers alone. A JSON
        Lines or RecordIO request's images (payloads.LazyImages) are decoded here, one at a time, so
        that a line or record that cannot be is its 400 too, before the model runs, and memory holds
        the body and one image (this loop keeps none of them)."""
        for index, data in enumerate(images):
            problem = self.problem(data)
            if problem:
                raise BadRequest(400, ImageError(index, problem).named(len(images)))

    def run(self, images: list[bytes]) -> tuple[list[list[float]], list[list[int]] | None]:
        """The model's call on checked images: each one's probabilities, and a multi-label model's
        0/1 per class (else None). No call on no image: ([], None)."""
        if not len(images):
            return [], None
        try:
            return self._call(images)
        except self._tf.errors.InvalidArgumentError as err:  # what the header check cannot see: a corrupt scan
            raise self._undecodable(images, err) from None

    def _call(self, images: list[bytes]) -> tuple[list[list[float]], list[list[int]] | None]:
        """run's call of the model (an InvalidArgumentError where an image cannot be decoded)."""
        # (a body sent as one image is the server's buffer, a bytearray: TensorFlow takes bytes)
        out = self._serve(image_bytes=self._tf.constant([i if isinstance(i, bytes) else bytes(i) for i in images]))
        return (out["probabilities"].numpy().tolist(),
                out["predicted"].numpy().tolist() if self.multi_label else None)

    def _undecodable(self, images: list[bytes], err) -> ImageError:
        """The error naming the first of `images` that the model cannot decode: the call failed as
        a whole, so each is tried alone (a rare path: a scan that passed the header check)."""
        failing = 0
        if len(images) > 1:
            for index, image in enumerate(images):
                try:
                    self._call([image])
                except self._tf.errors.InvalidArgumentError as alone:
                    failing, err = index, alone
                    break
        return ImageError(failing, f"cannot be decoded: {err.message.splitlines()[0][:300]}")

    def warm_up(self) -> float:
        """One call on a small image, so that the first request does not pay for the graph's first
        run (kernels chosen, memory reserved); its seconds, the model's first history (Batcher.timed)."""
        image = self._tf.io.encode_png(self._tf.zeros([8, 8, 3], self._tf.uint8)).numpy()
        started = time.monotonic()
        self.run([image])
        return time.monotonic() - started

    def predictions(self, probabilities: list[list[float]], predicted: list[list[int]] | None,
                    top_k: int | None = None) -> list[dict]:
        k = min(top_k or self.default_top_k, len(self.labels))
        return [self._prediction(row, predicted[i] if predicted else None, k) for i, row in enumerate(probabilities)]

    def _prediction(self, probabilities: list[float], predicted: list[int] | None, k: int) -> dict:
        order = sorted(range(len(probabilities)), key=lambda i: -probabilities[i])
        answer: dict = {}
        if predicted is None:
            answer["predicted_label"] = self.labels[order[0]]
        else:
            answer["predicted_labels"] = [self.labels[i] for i, on in enumerate(predicted) if on]
            answer["threshold"] = self.threshold
            if self.calibrated_thresholds:
                answer["calibrated_thresholds"] = self.calibrated_thresholds
        answer["top_k"] = [{"label": self.labels[i], "probability": probabilities[i]} for i in order[:k]]
        answer["labels"] = self.labels
        answer["probabilities"] = probabilities
        return answer


def serving_settings(folders: Sequence[Path]) -> ServingSettings:
    """The first of `folders`' serving.json, read by its schema (none in any: an export from before
    serving.json, served with the defaults); a ModelError saying what is wrong with it."""
    try:
        found = (serving_schema.read(folder) for folder in folders)
        return next((settings for settings in found if settings is not None), ServingSettings())
    except serving_schema.ServingFileError as err:
        raise ModelError(str(err)) from None


def calibrated_thresholds(settings: ServingSettings, classes: int) -> list | None:
    """A calibrated multi-label model decides on its own sigmoid at `threshold`, and serves the
    calibrated probabilities: each class's edge in those (serving.json's calibration says them) is
    answered beside them, or a client comparing them with `threshold` would disagree with
    predicted_labels. None for a model not calibrated."""
    edges = settings.calibration.calibrated_thresholds if settings.calibration else None
    if edges is not None and len(edges) != classes:  # (answered for the wrong classes: refused, not dropped)
        raise ModelError(f"serving.json's calibration.calibrated_thresholds has {len(edges)} values but the model has "
                         f"{classes} classes")
    return None if edges is None else list(edges)


def _json_file(path: Path):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ModelError(f"{path} cannot be read: {err}") from None
