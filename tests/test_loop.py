"""The training loop on its own: a tiny model, datasets made in memory."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from train.distribute import Cluster
from train.loop import Diverged, Trainer


def tiny_trainer(learning_rate=0.1) -> Trainer:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(3, activation="softmax")])
    trainer = Trainer(model, Cluster(tf.distribute.get_strategy(), 1, 0, True), mixed_precision=False)
    trainer.start_phase(learning_rate)
    return trainer


def batches(images: np.ndarray, labels: np.ndarray, size: int = 4) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((images.astype(np.float32), labels.astype(np.int64))).batch(size)


def test_a_loss_that_becomes_nan_stops_training_with_the_step_and_the_rate_to_change():
    images = np.ones((16, 4, 4, 3))
    images[9] = np.nan  # in the third batch
    with pytest.raises(Diverged, match=r"the loss became nan at step 3 of epoch 2, .*this phase's is 0\.1"):
        tiny_trainer().train_epoch(batches(images, np.zeros(16)), epoch=1, first_step=0, global_batch=4)


def test_a_finite_epoch_reports_its_mean_loss_and_accuracy():
    images = np.random.default_rng(0).random((16, 4, 4, 3))
    results, steps, stopped = tiny_trainer().train_epoch(batches(images, np.arange(16) % 3), 0, 0, 4)
    assert steps == 4 and not stopped
    assert np.isfinite(results["train_loss"]) and 0 <= results["train_accuracy"] <= 1
