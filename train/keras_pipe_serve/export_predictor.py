"""An export of the job (model/exports/: *.tflite, model.onnx; hyperparameter export_formats) as a
Predictor: `keras-pipe predict model/exports/model_int8.tflite photos/` answers with it as with the
SavedModel, the same prediction objects. exports.json beside it says how its images are prepared;
they are decoded and prepared here by the code the SavedModel's own signature runs
(keras_pipe_train.sources.preprocess), so that the export alone differs, then run by the export's
own runtime: TensorFlow's TFLite interpreter, or ONNX Runtime."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from keras_pipe_serve.predictor import (
    DEFAULT_TOP_K,
    ModelError,
    Predictor,
)

# where a model folder's ONNX export lies: model/conversions.py's FOLDER and FILES["onnx"], named here
# without importing it (it imports TensorFlow, which the server's master never loads; a test checks they agree)
ONNX_EXPORT = Path("exports") / "model.onnx"


class ExportPredictor(Predictor):
    def __init__(self, path: Path, threads: int | None = None, inter_threads: int | None = None):
        """`threads`: the runtime's threads, and TensorFlow's within an op, for the images'
        preparation; `inter_threads`: TensorFlow's ops at once (Predictor's, as the server sets them)."""
        # (no super().__init__: that loads a SavedModel)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # (TensorFlow's C++ startup chatter)
        import tensorflow as tf

        from keras_pipe_train.model import conversions

        if threads:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(inter_threads or threads)
        self._tf = tf
        path = Path(path)
        export_format = conversions.format_of(path)
        if export_format is None:
            raise ModelError(f"{path} is not one of the job's exports: {', '.join(conversions.FILES.values())}")
        try:
            described = json.loads((path.parent / conversions.DESCRIBED).read_text())
            content = path.read_bytes()
        except (OSError, ValueError) as err:
            raise ModelError(f"{path} cannot be run as an export of this job: {err} (it reads {conversions.DESCRIBED} "
                             f"beside it, as the job writes both in model/{conversions.FOLDER}/)") from None
        try:
            self._runner = conversions.runner(content, export_format, threads)
        except Exception as err:  # (each runtime's own errors: TFLite's ValueError, ONNX Runtime's Fail/InvalidGraph)
            raise ModelError(f"{path} cannot be loaded by its runtime ({export_format}): {str(err)[:300]}") from None
        try:
            self._read(described)
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise ModelError(f"{path}: {conversions.DESCRIBED} is not what the job writes ({type(err).__name__}: "
                             f"{err})") from None
        if self.calibrated_thresholds is not None and len(self.calibrated_thresholds) != len(self.labels):
            raise ModelError(f"{path}: {conversions.DESCRIBED}'s calibrated_thresholds has "
                             f"{len(self.calibrated_thresholds)} values for {len(self.labels)} classes")
        self._check_runs(path)
        self.default_top_k = min(DEFAULT_TOP_K, len(self.labels))
        self._prepare = prepared_by(tf, self._size, self._resize, self._interpolation, self.max_pixels)

    def _check_runs(self, path: Path) -> None:
        """A ModelError unless the export runs on the pictures exports.json says it takes and answers
        as many classes as it names: an export of another job's model beside this exports.json would
        answer with classes not its own. Checked once, on a black picture, which also warms its
        runtime up."""
        from keras_pipe_train.model import conversions

        try:
            width = self._runner(np.zeros((1, self._size, self._size, 3), np.float32))["probabilities"].shape[-1]
        except Exception as err:  # (the runtime's own: another input size than exports.json says, another model)
            raise ModelError(f"{path} does not run on the {self._size} x {self._size} pictures {conversions.DESCRIBED} "
                             f"beside it says it takes ({type(err).__name__}: {str(err)[:300]}): they are not of the "
                             "same model") from None
        if width != len(self.labels):
            raise ModelError(f"{path} answers {width} classes, but {conversions.DESCRIBED} beside it names "
                             f"{len(self.labels)}: they are not of the same model")

    def _read(self, described: dict) -> None:
        self.threshold = described["threshold"]
        self.multi_label = bool(described["multi_label"])
        self.labels = [str(n) for n in described["class_names"]]
        # (what serving.json says of the model, written beside the exports: they answer as the model
        # folder wherever they are copied)
        self.max_pixels, self.dialect = int(described["max_image_pixels"]), str(described["dialect"])
        thresholds = described["calibrated_thresholds"]
        self.calibrated_thresholds = None if thresholds is None else [float(t) for t in thresholds]
        prepared = described["input"]
        self._size, self._resize, self._interpolation = int(prepared["shape"][1]), prepared["resize"], str(
            prepared["interpolation"])

    def _call(self, images: list[bytes]) -> tuple[list[list[float]], list[list[int]] | None]:
        """Predictor's call, the images prepared here and run by the export's runtime."""
        batch = self._prepare(self._tf.constant([bytes(i) for i in images])).numpy()
        answer = self._runner(batch)
        return (answer["probabilities"].tolist(), answer["predictions"].tolist() if self.multi_label else None)


def prepared_by(tf, size: int, resize, interpolation: str, max_pixels: int):
    """encoded images -> the batch the exports take, prepared by the code the SavedModel's serving
    signature runs, traced once as that signature is (run eagerly, image by image, it prepared 60
    images a second where the signature answered 1,250: bench/onnx_runtime.py)."""
    from keras_pipe_train.settings.tracing import traced
    from keras_pipe_train.sources import preprocess

    return traced(lambda encoded: preprocess.served_batch(encoded, size, resize, interpolation, max_pixels),
                  input_signature=[tf.TensorSpec([None], tf.string)])


def onnx_export_of(model_dir: Path) -> Path:
    """The ONNX export beside a model folder's SavedModel (KERAS_PIPE_RUNTIME=onnx), or a ModelError
    saying how to make it. (No TensorFlow: the server's master checks it before any worker starts.)"""
    path = Path(model_dir) / ONNX_EXPORT
    if not path.is_file():
        raise ModelError(f"KERAS_PIPE_RUNTIME=onnx serves {path}, which does not exist: train with "
                         "export_formats=onnx, or run `keras-pipe export MODEL --formats onnx` on the model folder")
    logging.getLogger("keras_pipe_serve").info("KERAS_PIPE_RUNTIME=onnx: %s, in ONNX Runtime", path)
    return path
