"""An exponential moving average of the model's weights (ema_decay), the model each epoch is
judged by and the one exported: timm's ModelEmaV2 (every float weight, BatchNorm's statistics
included), with the warm-up of TensorFlow's ExponentialMovingAverage, so that short runs are not
left near their first weights: the nth update (from 0) decays by min(ema_decay, (1 + n) / (10 + n)).

How it rides along the job (job.py):
  - each training step updates it, after the optimizer (in the traced step, on every replica);
  - at an epoch's end it is swapped into the model: validation, precise BatchNorm, the epoch's kept
    model, early stopping's best and the checkpoint all see the average as the model;
  - the next epoch's training swaps the trained weights back first;
  - at a phase's end the average is settled: it becomes the model (the phase's result, or early
    stopping's best), and starts again from there, its warm-up too, for the next phase.
It is a checkpoint's entry, with whether it is swapped in, so a resumed job goes on as one never
stopped.
"""

from __future__ import annotations

import keras
import tensorflow as tf


class WeightAverage(tf.Module):
    """Made in the strategy's scope: mirrored on every replica like the model's weights."""

    def __init__(self, model: keras.Model, decay: float):
        super().__init__(name="weight_average")
        self.decay = float(decay)
        # (not the model itself as an attribute: the module would track it, and checkpoints hold it already)
        self.averages = [tf.Variable(weight.value, trainable=False, name=f"average_{i}")
                         for i, weight in enumerate(averaged(model))]
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates")
        self.swapped = tf.Variable(False, trainable=False, name="swapped")

    def update(self, model: keras.Model) -> None:
        """One step's update (in the cross-replica context of the traced step)."""
        n = tf.cast(self.updates, tf.float32)
        decay = tf.minimum(self.decay, (1.0 + n) / (10.0 + n))
        for average, weight in zip(self.averages, averaged(model)):
            average.assign(decay * average + (1.0 - decay) * tf.cast(weight.value, average.dtype))
        self.updates.assign_add(1)

    def swap(self, model: keras.Model) -> None:
        """The average into the model, the model's weights kept in its place (and back again)."""
        for average, weight in zip(self.averages, averaged(model)):
            kept = tf.identity(weight.value)
            weight.assign(average)
            average.assign(kept)
        self.swapped.assign(tf.logical_not(self.swapped))

    def train_again(self, model: keras.Model) -> None:
        """Before an epoch's training: the trained weights back in the model, if the average is in."""
        if bool(self.swapped.numpy()):
            self.swap(model)

    def settle(self, model: keras.Model) -> None:
        """At a phase's end: the average starts again from the model as it now is."""
        for average, weight in zip(self.averages, averaged(model)):
            average.assign(weight.value)
        self.updates.assign(0)
        self.swapped.assign(False)


def averaged(model: keras.Model) -> list:
    """The weights averaged: every float one (not a random generator's state)."""
    return [weight for weight in model.weights if "float" in str(weight.dtype)]
