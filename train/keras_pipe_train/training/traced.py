"""Functions traced once for batches of any size.

tf.function traces again for each new input shape, and `reduce_retracing=True` still traces twice
(at the first batch, then with the shape relaxed at the first batch of another size: a pass's last,
smaller batch, or a reservoir's share of one). A trace of a model's forward pass costs 0.5-1 s of CPU
(MobileNetV3-Small, this project's CI machine) and a training step's 8-10 s, so these trace once,
at the first batch, with its batch dimension left open; as written, without AutoGraph
(settings/tracing.py).
"""

from __future__ import annotations

import tensorflow as tf

from keras_pipe_train.settings.tracing import traced


def any_batch_signature(batch) -> list:
    """tf.function's input_signature for `batch` (a tensor or a structure of them) and for any other
    batch of the same kind: the first dimension left open."""
    return [tf.nest.map_structure(lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), batch)]


def for_any_batch(function):
    """`function` (a batch -> tensors), traced once at its first call for batches of any size."""
    once = None

    def call(batch):
        nonlocal once
        if once is None:
            once = traced(function, input_signature=any_batch_signature(batch))
        return once(batch)

    return call
