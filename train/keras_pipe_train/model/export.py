"""Exporting the trained model for serving.

model_dir/
  1/            SavedModel for TensorFlow Serving (and SageMaker's TF serving containers): the
                serving_default signature takes encoded images (JPEG/PNG bytes) and returns each
                class's probability and the most likely class (its id and name), or for a
                multi-label model, which classes reach the threshold set at training (a 0/1 per
                class, and their names, "" for the others). Loads without this project's code.
  model.keras   the Keras model (images in [0, 255] -> probabilities), to fine-tune further
  backbone.weights.h5  the backbone's weights alone: a later job's `pretrained` channel
                (neither of these two for a backbone that is a SavedModel, JumpStart's: a .keras
                file cannot hold its graph; model/jumpstart.py)
  classes.json  the class names, in label order
  preparation.json  how the SavedModel prepares each image beside serving.json's image_size:
                {"resize": null | N | "original", "interpolation": "bilinear", "test_time_flip": false}
                (preprocess.for_eval; the flip: classifier.logits_of), what `keras-pipe export`
                needs to convert model.keras as the job served it (after_training/folder_exports.py)
  serving.json  what `serve` needs beside the SavedModel, in a versioned schema
                (settings/serving_schema.py): the image limit, a multi-label model's threshold,
                its calibration (the temperature the served probabilities' logits are divided
                by and the bias added to them, training/calibration.py; null: none), and the
                dialect its answers speak:
                "mxnet" or "tensorflow" (a model trained in a SageMaker built-in image
                classifier's dialect, whose clients read the answers that built-in gave), or
                "keras-pipe", this project's own (keras_pipe_serve.payloads says each one's
                answers; a serving.json without it is "keras-pipe")
"""

from __future__ import annotations

import json
from pathlib import Path

import keras
import tensorflow as tf

from keras_pipe_train.model import jumpstart
from keras_pipe_train.model.classifier import backbone_of, logits_of, probabilities_of
from keras_pipe_train.settings.config import DEFAULT_MAX_PIXELS
from keras_pipe_train.settings.dialects import DIALECTS, KERAS_PIPE, MXNET
from keras_pipe_train.settings.serving_schema import ServedCalibration, ServingSettings
from keras_pipe_train.sources import preprocess

SERVING_VERSION = "1"  # TF Serving serves numbered subfolders; the highest is the live one
PREPARATION = "preparation.json"


def serving_archive(model: keras.Model, class_names: tuple[str, ...], image_size: int, max_pixels: int,
                    threshold: float | None = None, resize_to: int | str | None = None,
                    interpolation: str = "bilinear", calibration: ServedCalibration | None = None,
                    flip: bool = False):
    """`threshold`: a multi-label model's (None: a single-label one). `resize_to`, `interpolation`:
    how each image is prepared (preprocess.for_eval): the job's resize and resize_interpolation, as
    validation prepared it (the MXNet dialect's: resize None, serving_resize). `calibration`:
    the served probabilities are those of the logits divided by its temperature plus its bias
    (None: the model's own); a multi-label model's predictions stay its threshold's on the model's
    own probabilities, as validated (training/calibration.py). `flip` (test_time_flip): each
    image's logits averaged with its mirror image's (classifier.logits_of)."""
    names = tf.constant(list(class_names))
    answer = served_probabilities(model, calibration, threshold is not None, flip)

    def serve(image_bytes):
        # each request's images are checked from their headers before decoding: a small file that
        # decodes to gigapixels is refused instead of costing the server its memory
        images = preprocess.served_batch(image_bytes, image_size, resize_to, interpolation, max_pixels)
        probabilities, decided = answer(images)
        if threshold is not None:
            predicted = decided >= threshold
            return {"probabilities": probabilities, "predicted": tf.cast(predicted, tf.int32),
                    "classes": tf.where(predicted, names, tf.constant(""))}
        ids = tf.argmax(probabilities, axis=-1, output_type=tf.int32)
        return {"probabilities": probabilities, "class_ids": ids, "classes": tf.gather(names, ids)}

    archive = keras.export.ExportArchive()
    # The SavedModel's variables, as archive.track(model) would list them, without track's walk
    # through every object of the model in search of lookup tables (a model of this job has none):
    # a large share of each export's time (docs/speed.md, Figures behind the code's choices: The export).
    for name in ("variables", "trainable_variables", "non_trainable_variables"):
        archive.add_variable_collection(name, getattr(model, name))
    # the input is named *_bytes: TF Serving's REST API then accepts {"b64": ...} for it
    archive.add_endpoint("serving_default", serve,
                         input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    return archive


def serving_resize(config) -> int | str | None:
    """How the served model prepares each image (a JobConfig's): as validation did, except in the
    MXNet dialect, whose built-in resizes each image whole to image_shape at inference, whatever its
    training's resize: "At inference, input images are resized to the image_shape ... Aspect ratio
    is not preserved, and images are not cropped" (AWS's IC-Hyperparameter page, image_shape). The
    report's evaluation and gallery stay validation's (docs/migration.md says so)."""
    return None if config.dialect == MXNET else config.resize


def served_probabilities(model: keras.Model, calibration: ServedCalibration | None, multi_label: bool,
                         flip: bool = False):
    """images -> (the probabilities served, those its predictions are decided on): the model's own
    for both, or with a `calibration`, those of the logits divided by its temperature (a number, or
    one per class) plus its bias (one per class, when it has one). A multi-label model's
    predictions stay its own (its threshold is judged on its own sigmoid, as validated); a
    single-label one's are the served probabilities' likeliest (a temperature alone keeps the
    model's own; a bias may not). `flip`: the images' and their mirror images' logits averaged."""
    if calibration is None:
        probabilities_of_images = probabilities_of(model, flip)

        def own(images):
            probabilities = probabilities_of_images(images)
            return probabilities, probabilities

        return own
    logits, divisor = logits_of(model, flip), tf.constant(calibration.temperature, tf.float32)
    bias = tf.constant(0.0 if calibration.bias is None else calibration.bias, tf.float32)
    activation = tf.sigmoid if multi_label else tf.nn.softmax

    def calibrated(images):
        z = logits(images)
        probabilities = activation(z / divisor + bias)
        return probabilities, tf.sigmoid(z) if multi_label else probabilities

    return calibrated


def export(model: keras.Model, class_names: tuple[str, ...], image_size: int, model_dir: Path,
           max_pixels: int = DEFAULT_MAX_PIXELS, threshold: float | None = None, dialect: str = KERAS_PIPE,
           resize_to: int | str | None = None, interpolation: str = "bilinear",
           calibration: ServedCalibration | None = None, flip: bool = False) -> Path:
    """`dialect`: whose answers `serve` gives for the model (keras_pipe_train.settings.dialects.DIALECTS:
    the request's, as dialects.translate says it).
    `resize_to`, `interpolation`: how the serving signature prepares images (serving_archive).
    `calibration`: set when the served probabilities are calibrated (calibration.Calibration.serving),
    recorded in serving.json. `flip`: test_time_flip (serving_archive)."""
    if dialect not in DIALECTS:
        raise ValueError(f"dialect {dialect!r}: one of {', '.join(DIALECTS)}")
    settings = ServingSettings(image_size, max_pixels, threshold, dialect, calibration)
    model_dir.mkdir(parents=True, exist_ok=True)
    if not jumpstart.is_savedmodel_backbone(backbone_of(model)):
        model.save(model_dir / "model.keras")
        backbone_of(model).save_weights(model_dir / "backbone.weights.h5")
    (model_dir / "classes.json").write_text(json.dumps(list(class_names)) + "\n")
    (model_dir / PREPARATION).write_text(json.dumps(
        {"resize": resize_to, "interpolation": interpolation, "test_time_flip": flip}) + "\n")
    settings.write(model_dir)
    serving_dir = model_dir / SERVING_VERSION
    serving_archive(model, class_names, image_size, max_pixels, threshold, resize_to, interpolation,
                    calibration, flip).write_out(str(serving_dir), verbose=False)
    return serving_dir
