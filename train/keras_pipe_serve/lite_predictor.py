"""A TFLite export (model/lite/*.tflite, hyperparameter export_formats) as a Predictor: `keras-pipe
predict model/lite/model_int8.tflite photos/` answers with it as with the SavedModel, the same
prediction objects. lite.json beside it says how its images are prepared; they are decoded and
prepared here by the code the SavedModel's own signature runs (keras_pipe_train.sources.preprocess),
so that the export alone differs, then run by TensorFlow's TFLite interpreter."""

from __future__ import annotations

import json
from pathlib import Path

from keras_pipe_serve.predictor import (
    DEFAULT_TOP_K,
    ModelError,
    Predictor,
    calibrated_thresholds,
    serving_settings,
)


class LitePredictor(Predictor):
    def __init__(self, path: Path):  # (no super().__init__: that loads a SavedModel)
        import tensorflow as tf

        from keras_pipe_train.model import lite

        self._tf = tf
        path = Path(path)
        try:
            described = json.loads((path.parent / "lite.json").read_text())
            flatbuffer = path.read_bytes()
        except (OSError, ValueError) as err:
            raise ModelError(f"{path} cannot be run as a TFLite export of this job: {err} (it reads lite.json beside "
                             "it, as the job writes both in model/lite/)") from None
        try:
            self._runner = lite.Runner(flatbuffer)
        except (ValueError, RuntimeError) as err:
            raise ModelError(f"{path} cannot be loaded by the TFLite interpreter: {str(err)[:300]}") from None
        settings = serving_settings([path.parent.parent])  # (the model folder's serving.json: the image limit)
        self.max_pixels, self.dialect = settings.max_image_pixels, "keras-pipe"
        self.threshold = described.get("threshold")
        self.multi_label = bool(described.get("multi_label"))
        self.labels = [str(n) for n in described["class_names"]]
        self.calibrated_thresholds = calibrated_thresholds(settings, len(self.labels)) if self.multi_label else None
        prepared = described["input"]
        self._size, self._resize, self._interpolation = prepared["shape"][1], prepared.get("resize"), prepared.get(
            "interpolation", "bilinear")
        self.default_top_k = min(DEFAULT_TOP_K, len(self.labels))

    def _call(self, images: list[bytes]) -> tuple[list[list[float]], list[list[int]] | None]:
        """Predictor's call, the images prepared here and run by the interpreter."""
        from keras_pipe_train.sources import preprocess

        size = self._size
        batch = preprocess.batch_of(lambda x: preprocess.for_eval(preprocess.checked(x, self.max_pixels), size,
                                                                   self._resize, self._interpolation),
                                    self._tf.constant([bytes(i) for i in images]), size).numpy()
        answer = self._runner(batch)
        return (answer["probabilities"].tolist(), answer["predictions"].tolist() if self.multi_label else None)
