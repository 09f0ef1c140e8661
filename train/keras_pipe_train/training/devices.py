"""What the job asks of the devices it finds: mixed precision, and steps per call into TensorFlow."""

from __future__ import annotations

import logging

import keras
import tensorflow as tf

log = logging.getLogger(__name__)


def steps_per_execution(setting: int | str) -> int:
    """auto: 8 steps per call with a GPU, where the host's work between calls would leave it idle
    (a small model's step takes milliseconds); 1 on CPUs, where a step takes long enough that the
    host's work is noise, and a stop is then answered after the step that is running."""
    if setting != "auto":
        return setting
    chosen = 8 if tf.config.list_physical_devices("GPU") else 1
    log.info("steps_per_execution=auto: %d", chosen)
    return chosen


def use_mixed_precision(setting: str) -> bool:
    """Sets Keras' dtype policy by mixed_precision (auto: on with a GPU); whether it is on."""
    gpus = tf.config.list_physical_devices("GPU")
    on = setting == "true" or (setting == "auto" and bool(gpus))
    keras.mixed_precision.set_dtype_policy("mixed_float16" if on else "float32")
    log.info("mixed precision %s (%d GPU%s)", "on" if on else "off", len(gpus), "" if len(gpus) == 1 else "s")
    return on
