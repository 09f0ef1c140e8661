"""Exports beside the SavedModel (hyperparameter export_formats), each checked against it: TFLite
(model/lite.py) and ONNX (model/onnx_conversion.py).

model_dir/exports/
  model.tflite          TFLite float32 (export_formats tflite)
  model_float16.tflite  TFLite, float16 weights, dequantized when loaded: half the file (tflite_float16)
  model_int8.tflite     TFLite, int8 weights (per output channel), activations stored as float and
                        quantized on the fly by the heavy kernels (dynamic range quantization):
                        about a third of the file (tflite_int8)
  model_full_int8.tflite  TFLite, int8 weights and activations (full integer quantization, their ranges
                        from representative images: 200 of the training channel's), float32 in and out:
                        integer kernels throughout, for CPUs' and NPUs' int8 paths (tflite_full_int8)
  model.onnx            ONNX, float32, opset onnx_conversion.OPSET, for ONNX Runtime (onnx)
  exports.json          what a client needs beside them: the input, the classes, the rule each
                        prediction is decided by, and how each export compared with the SavedModel

Each takes a batch of decoded RGB images as float32 in [0, 255], image_size x image_size, input
"images", prepared as the SavedModel's serving signature prepares them (exports.json's "prepare":
the whole image resized, or its shorter side resized and the centre cropped; validation's way, but
in the MXNet dialect, whose built-in served each image resized whole). Neither TFLite's builtin
operators nor ONNX's at opset 18 decode JPEG or PNG, so decoding and resizing are the client's.
Inside each: the backbone's input scaling, the calibration (the served probabilities are the
SavedModel's), test-time flips where trained so, and the decision: outputs "probabilities" (one
per class) and "predictions" (a single-label model's class id; a multi-label model's 0/1 per
class, its threshold on its own probabilities, as the SavedModel decides).

Why checked inside the job: a conversion can change answers silently (quantization, an operator
lowered differently), and the job has the images to tell, which a user converting later does not.
Each export answers the validation images beside the SavedModel's own function (the same graph,
in TensorFlow): how often they decide alike, the largest difference of a probability, and each
one's accuracy. An export past its bar (BARS) is dropped, and said: the job's result stands on the
SavedModel, which a user can convert otherwise."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from keras_pipe_train.settings.parsers import EXPORT_FORMATS

FOLDER = "exports"
DESCRIBED = "exports.json"
FILES = dict(zip(EXPORT_FORMATS, ("model.tflite", "model_float16.tflite", "model_int8.tflite",
                                  "model_full_int8.tflite", "model.onnx"), strict=True))
# the formats that need representative images to convert (their activations' ranges)
REPRESENTED = ("tflite_full_int8",)


@dataclasses.dataclass(frozen=True)
class Bar:
    """What an export must reach against the SavedModel on the validation images to be kept."""
    agreement: float  # the share of images decided alike, at least
    max_difference: float | None  # the largest |difference| of a probability, below (None: not bounded)
    accuracy_drop: float | None  # accuracy lost against the SavedModel's, at most (None: not bounded)


# float32 computes what the SavedModel computes, in another runtime's kernels: only rounding may
# differ. Quantized weights change the answers a little: judged by the decisions and the accuracy,
# as the bars for int8 put it (98 % agreement, accuracy within a point).
BARS = {"tflite": Bar(0.995, 1e-3, None), "tflite_float16": Bar(0.98, None, 0.01),
        "tflite_int8": Bar(0.98, None, 0.01), "tflite_full_int8": Bar(0.98, None, 0.01),
        "onnx": Bar(0.995, 1e-3, None)}


SIGNATURE = "classify"  # (the exports' one signature, and the SavedModel function each is converted from)


def write_classifier(model, answer, image_size: int, threshold: float | None, folder: Path) -> None:
    """A SavedModel in `folder` whose SIGNATURE is what each export computes: images ->
    {"probabilities", "predictions"}. `answer`: the SavedModel's images -> (the probabilities served,
    those its predictions are decided on) (export.served_probabilities). Written as the serving
    SavedModel is (Keras' ExportArchive), since TFLite's converter reads a SavedModel's variables
    (from a Keras 3 model's own functions it converted none: every answer NaN), and ONNX's is
    converted from the same function."""

    def classify(images):
        served, decided = answer(images)
        if threshold is None:
            predictions = tf.argmax(decided, axis=-1, output_type=tf.int32)
        else:
            predictions = tf.cast(decided >= threshold, tf.int32)
        return {"probabilities": served, "predictions": predictions}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(SIGNATURE, classify, input_signature=[
        tf.TensorSpec([None, image_size, image_size, 3], tf.float32, name="images")])
    archive.write_out(str(folder), verbose=False)


# the dtype policies of mixed precision (float16 on GPUs, bfloat16 on TPUs): computing in them, a model
# is converted from its float32 twin (in_float32)
MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16")


def in_float32(model: keras.Model) -> keras.Model:
    """`model` itself, or where any layer computes in half precision (mixed precision: on with a
    GPU), its twin computing in float32 with the same weights: TFLite's converter does not take a
    model computing in float16 (tensorflow/tensorflow#46380), Keras' own ONNX export asks for float32,
    and the exports are float32 models. Built from the model's config with every mixed policy made
    float32 (its variables are float32 already: mixed precision keeps them so)."""
    config = model.get_config()
    if not _mixed(config):
        return model
    kept = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_dtype_policy("float32")  # (a layer whose config names no policy takes the global one)
    try:
        twin = model.__class__.from_config(_float32(config))
    finally:
        keras.mixed_precision.set_dtype_policy(kept)
    twin.set_weights(model.get_weights())
    return twin


def _mixed(config) -> bool:
    if isinstance(config, dict):
        return any(_mixed(value) for value in config.values())
    if isinstance(config, list):
        return any(_mixed(value) for value in config)
    return config in MIXED_POLICIES


def _float32(config):
    """`config` with every mixed policy (a DTypePolicy's name, or a layer's dtype given as a string) float32."""
    if isinstance(config, dict):
        return {key: _float32(value) for key, value in config.items()}
    if isinstance(config, list):
        return [_float32(value) for value in config]
    return "float32" if config in MIXED_POLICIES else config


def convert(folder: Path, export_format: str, representative: np.ndarray | None = None) -> bytes:
    """The file of `export_format` converted from the SavedModel write_classifier wrote in `folder`;
    a format of REPRESENTED with `representative`, a batch of images as the exports take them."""
    if export_format in REPRESENTED:
        if representative is None or not len(representative):
            raise ValueError(f"{export_format} needs representative images to convert, and was given none")
        return _runtime(export_format).convert(folder, export_format, SIGNATURE, representative)
    return _runtime(export_format).convert(folder, export_format, SIGNATURE)


def runner(content: bytes, export_format: str, threads: int | None = None):
    """A callable: a batch of images -> {"probabilities", "predictions"} as numpy arrays, from the
    export's own runtime, on `threads` (None: every core)."""
    return _runtime(export_format).Runner(content, SIGNATURE, threads)


def format_of(path: Path) -> str | None:
    """The format of an export's file, by its name (None: not one of FILES)."""
    return next((export_format for export_format, name in FILES.items() if name == Path(path).name), None)


def _runtime(export_format: str):
    # (imported when asked: each runtime's packages load only for its own exports)
    if export_format == "onnx":
        from keras_pipe_train.model import onnx_conversion
        return onnx_conversion
    from keras_pipe_train.model import lite
    return lite


@dataclasses.dataclass
class Comparison:
    """One export's answers beside the SavedModel's, summed over the batches."""
    images: int = 0
    alike: int = 0
    max_difference: float = 0.0
    right: int = 0  # the export's decisions that are the labels'
    reference_right: int = 0

    def add(self, reference: dict, lite: dict, labels: np.ndarray | None) -> None:
        ours, theirs = np.asarray(reference["predictions"]), np.asarray(lite["predictions"])
        same = ours == theirs if ours.ndim == 1 else np.all(ours == theirs, axis=-1)
        self.images += len(same)
        self.alike += int(same.sum())
        difference = np.abs(np.asarray(reference["probabilities"], np.float64)
                            - np.asarray(lite["probabilities"], np.float64))
        # (a probability that is not a number differs without bound: max() would pass over it)
        self.max_difference = max(self.max_difference, float("inf") if np.isnan(difference).any()
                                  else float(difference.max()))
        if labels is not None:
            self.right += int(_right(theirs, labels).sum())
            self.reference_right += int(_right(ours, labels).sum())

    def figures(self) -> dict:
        n = max(self.images, 1)
        return {"images": self.images, "agreement": self.alike / n, "max_probability_difference": self.max_difference,
                "accuracy": self.right / n, "savedmodel_accuracy": self.reference_right / n}

    def failed(self, bar: Bar) -> str | None:
        """Why the export falls short of `bar` (None: it does not)."""
        return verdict(self.figures(), bar)


def verdict(found: dict, bar: Bar) -> str | None:
    """Why an export whose figures (Comparison.figures) are `found` falls short of `bar` (None: it
    does not). A probability that is not a number fails every bar."""
    if not found["images"]:
        return "no validation image to compare it on"
    if not math.isfinite(found["max_probability_difference"]):
        return "some of its probabilities are not numbers"
    if found["agreement"] < bar.agreement:
        return f"it decides {found['agreement']:.2%} of the images as the SavedModel does, below {bar.agreement:.1%}"
    if bar.max_difference is not None and found["max_probability_difference"] >= bar.max_difference:
        return (f"a probability differs from the SavedModel's by {found['max_probability_difference']:.2g}, "
                f"not below {bar.max_difference:g}")
    lost = found["savedmodel_accuracy"] - found["accuracy"]
    if bar.accuracy_drop is not None and lost > bar.accuracy_drop:
        return f"its accuracy is {lost:.2%} below the SavedModel's, more than {bar.accuracy_drop:.0%}"
    return None


def _right(predictions: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each image's decision is its label (multi-label: every class's, as exact match counts)."""
    if predictions.ndim == 1:
        return predictions == np.asarray(labels).reshape(-1)
    return np.all(predictions == (np.asarray(labels) >= 0.5), axis=-1)


def write(out: Path, converted: dict[str, bytes], keep: tuple[str, ...] = ()) -> dict[str, Path]:
    """The kept exports in the folder `out` (a model folder's FOLDER); their paths, by format. The
    file of any other format is removed, but those of `keep`. (exports.json beside them is
    after_training/conversions.py's.)"""
    out.mkdir(parents=True, exist_ok=True)
    for export_format, name in FILES.items():  # (one an earlier run of the job left, now dropped or not asked)
        if export_format not in converted and export_format not in keep:
            (out / name).unlink(missing_ok=True)
    paths = {}
    for export_format, content in converted.items():
        paths[export_format] = out / FILES[export_format]
        partial = paths[export_format].with_suffix(".partial")  # (whole or not at all: a stop may come)
        partial.write_bytes(content)
        partial.replace(paths[export_format])
    return paths
