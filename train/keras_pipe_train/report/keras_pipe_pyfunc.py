"""The job's exported model as an MLflow pyfunc model: MLflow's loader module for it (its
python_function flavor's `loader_module`), copied into the logged model's code/ folder by
tracking.py, where MLflow imports it by this file's name. It needs TensorFlow and pandas (which
mlflow.pyfunc needs anyway), never this project: the model loads wherever MLflow and TensorFlow
are (`mlflow.pyfunc.load_model`, `mlflow models serve --env-manager local`).

    model = mlflow.pyfunc.load_model("runs:/<run id>/model")
    model.predict(pd.DataFrame({"image": [open("cat.jpg", "rb").read()]}))
    ->  class ("cat"), class_id (2) and probability (the class's) for each image, and its
        probabilities (one per class, in classes.json's order); a multi-label model's: classes
        (those it predicts), predicted (0/1 per class) and probabilities

Input: images' encoded bytes (JPEG, PNG, GIF, BMP or WebP), or base64 text of them (how JSON,
and so `mlflow models serve`, carries bytes): a DataFrame's `image` column (else its first), a
list, a numpy array, or one image. The images go through the SavedModel's serving signature, as
the endpoint's do (model/export.py): decoded, checked and resized there.
"""

from __future__ import annotations

import base64
import binascii
import json
import os

DATA = "saved_model"  # the flavor's data folder: the SavedModel's version folder and classes.json


def _load_pyfunc(data_path: str):
    return ImageClassifier(data_path)


class ImageClassifier:
    def __init__(self, data_path: str):
        import tensorflow as tf

        self._model = tf.saved_model.load(os.path.join(data_path, "1"))  # (kept: the signature needs it alive)
        self._serve = self._model.signatures["serving_default"]
        with open(os.path.join(data_path, "classes.json"), encoding="utf-8") as f:
            self.classes = json.load(f)

    def predict(self, model_input, params=None):
        import pandas as pd
        import tensorflow as tf

        images = [_image_bytes(value) for value in _values(model_input)]
        if not images:
            return pd.DataFrame()
        out = {key: value.numpy() for key, value in self._serve(image_bytes=tf.constant(images)).items()}
        probabilities = [row.tolist() for row in out["probabilities"]]
        if "class_ids" in out:
            ids = [int(i) for i in out["class_ids"]]
            return pd.DataFrame({"class": [self.classes[i] for i in ids], "class_id": ids,
                                 "probability": [row[i] for row, i in zip(probabilities, ids)],
                                 "probabilities": probabilities})
        predicted = [row.tolist() for row in out["predicted"]]
        return pd.DataFrame({"classes": [[name for name, on in zip(self.classes, row) if on] for row in predicted],
                             "predicted": predicted, "probabilities": probabilities})


def _values(model_input) -> list:
    if hasattr(model_input, "columns"):  # a DataFrame
        column = "image" if "image" in model_input.columns else model_input.columns[0]
        return list(model_input[column])
    if isinstance(model_input, (bytes, str)):
        return [model_input]
    return list(model_input)


def _image_bytes(value) -> bytes:
    """An image's bytes as given, or decoded from base64 text (how JSON carries bytes)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("an image as text must be base64 of its bytes") from None
    raise TypeError(f"an image is its encoded bytes or base64 text of them, not {type(value).__name__}")
