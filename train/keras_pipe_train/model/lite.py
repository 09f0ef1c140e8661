"""TFLite exports (tflite, tflite_float16, tflite_int8, tflite_full_int8: model/conversions.py says
what each holds), converted by TensorFlow's TFLite converter and run by its interpreter."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import tensorflow as tf

# TensorFlow's warning at every interpreter's creation (Runner says why it is left unheard)
DEPRECATED = ".*tf.lite.Interpreter is deprecated"


def convert(folder: Path, export_format: str, signature: str, representative: np.ndarray | None = None) -> bytes:
    """The TFLite flatbuffer of the SavedModel conversions.write_classifier wrote in `folder`, its
    function `signature`; tflite_full_int8's activations' ranges from the `representative` images."""
    converter = tf.lite.TFLiteConverter.from_saved_model(str(folder), signature_keys=[signature])
    if export_format in ("tflite_float16", "tflite_int8", "tflite_full_int8"):
        # (without representative data: the weights alone, dynamic range quantization)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if export_format == "tflite_float16":
        converter.target_spec.supported_types = [tf.float16]
    if export_format == "tflite_full_int8":
        # Every operator in int8, or the conversion fails (and the export is dropped, said): with
        # TFLITE_BUILTINS beside it, an operator without an int8 kernel would stay float silently.
        # The input and output stay float32 (quantized and dequantized at the edges): the same
        # signature as the other exports, for the same clients.
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.representative_dataset = lambda: ({"images": representative[i:i + 1]}
                                                    for i in range(len(representative)))
    with warnings.catch_warnings():  # (the calibration runs its own interpreter: Runner's warning, unasked)
        warnings.filterwarnings("ignore", message=DEPRECATED)
        return converter.convert()


class Runner:
    """A TFLite model run by TensorFlow's own interpreter, a batch at a time. (TensorFlow 2.21 still
    has it, deprecated since 2.19/2.20 for LiteRT's ai-edge-litert, the same interpreter and
    calls: one dependency fewer in the image, until tf.lite leaves TensorFlow's packages, as
    announced (tensorflow/tensorflow#102071). Its deprecation warning, at every load, is silenced
    here.)"""

    def __init__(self, flatbuffer: bytes, signature: str, threads: int | None = None):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=DEPRECATED)
            # (every core unless told: the interpreter's own default is left to its implementation)
            self.interpreter = tf.lite.Interpreter(model_content=flatbuffer, num_threads=threads or os.cpu_count() or 1)
        self.run = self.interpreter.get_signature_runner(signature)

    def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
        return self.run(images=np.asarray(images, np.float32))
