"""The ONNX export (onnx: model/conversions.py says what it holds), converted by tf2onnx from the
same SavedModel function the TFLite exports are, and run by ONNX Runtime on the CPU.

Why tf2onnx: it is the converter of TensorFlow graphs to ONNX the ONNX project keeps (onnx/tensorflow-onnx),
and what Keras' own `export(format="onnx")` runs for its TensorFlow backend. It reads the function
from the SavedModel written for the exports, so the ONNX file computes what the TFLite ones do."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np

# ONNX's operator set the export is written in: the newest tf2onnx 1.17 writes, which ONNX Runtime
# has run since 1.14 (2023), in its full packages (Python, web/wasm, Android, iOS); its DirectML
# provider documents opset 17 at most
OPSET = 18


def convert(folder: Path, export_format: str, signature: str) -> bytes:
    """The ONNX model (serialized) of the SavedModel conversions.write_classifier wrote in `folder`:
    its function `signature` frozen (its variables made constants), as tf2onnx's own command converts a
    SavedModel. (tf2onnx.convert.from_function on the loaded function left the calibration's
    captured tensors as inputs the model then asked for.) Its input and outputs keep the signature's
    names: "images"; "probabilities", "predictions"."""
    import tf2onnx

    _register_erfc()
    with _quiet():
        graph_def, inputs, outputs, renamed = tf2onnx.tf_loader.from_saved_model(
            str(folder), None, None, tag=["serve"], signatures=[signature], return_tensors_to_rename=True)
        proto, _ = tf2onnx.convert.from_graph_def(graph_def, input_names=inputs, output_names=outputs, opset=OPSET,
                                                  tensors_to_rename=renamed)
    return proto.SerializeToString()


def _register_erfc() -> None:
    """TensorFlow's Erfc as ONNX's 1 - Erf (ONNX has no Erfc): Keras 3 computes the exact GELU of
    the transformers (keras-hub's ViT, DeiT, DINOv2; SigLIP's is the tanh approximation) with erfc
    (TensorFlow's tf.nn.gelu), which tf2onnx 1.17 does not map ("Unsupported ops: Erfc"; open
    upstream: onnx/tensorflow-onnx#2463). Registered by tf2onnx's own decorator, its way for handlers of its
    users' ops, once. (1 - Erf loses erfc's tiny values in float32: GELU's negative tail, below 1e-7
    of its input, becomes 0.)"""
    from tf2onnx import constants, handler, utils

    if any("Erfc" in handlers for handlers in handler.tf_op.get_opsets().get(constants.ONNX_DOMAIN, [])):
        return

    @handler.tf_op("Erfc")
    class Erfc:
        @classmethod
        def version_9(cls, ctx, node, **kwargs):  # (Erf came in opset 9)
            dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
            node.type = "Erf"
            one = ctx.make_const(utils.make_name(f"{node.name}/one"), np.array(1, dtype))
            ctx.insert_new_node_on_output("Sub", node.output[0], inputs=[one.output[0], node.output[0]])


@contextmanager
def _quiet():
    """What tf2onnx logs on the way that would read as trouble in the job's log: TensorFlow's
    deprecation notes for the TF1 graph calls it freezes with, and its transpose optimizer's
    traceback where a scalar is added after a convolution without bias (1.17's max() of the
    scalar's empty shape: hard-swish's x + 3), after which it keeps the graph from before that
    pass: correct (the job compares its answers), with the NHWC/NCHW transposes the pass would have
    removed (ONNX Runtime removes most of them when it loads the model). Errors still show."""
    loggers = [logging.getLogger(name) for name in ("tensorflow", "tf2onnx")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


class Runner:
    """An ONNX model run by ONNX Runtime's CPU provider, a batch at a time, on `threads` (None:
    every core)."""

    def __init__(self, model: bytes, signature: str, threads: int | None = None):  # (ONNX has one graph, no signatures)
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads or os.cpu_count() or 1
        options.log_severity_level = 3  # (errors only: its graph-optimizer notes are not the user's)
        self.session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.outputs = [output.name for output in self.session.get_outputs()]

    def __call__(self, images: np.ndarray) -> dict[str, np.ndarray]:
        answered = self.session.run(self.outputs, {"images": np.asarray(images, np.float32)})
        return dict(zip(self.outputs, answered, strict=True))
