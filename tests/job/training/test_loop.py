"""The training loop on its own: a tiny model, datasets made in memory."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_train.training.distribute import Cluster
from keras_pipe_train.training.loop import Diverged, Trainer


def tiny_trainer(learning_rate=0.1, steps_per_execution=1) -> Trainer:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(3, activation="softmax")])
    trainer = Trainer(model, Cluster(tf.distribute.get_strategy(), 1, 0, True), mixed_precision=False,
                      steps_per_execution=steps_per_execution)
    trainer.start_phase(learning_rate)
    return trainer


def batches(images: np.ndarray, labels: np.ndarray, size: int = 4) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((images.astype(np.float32), labels.astype(np.int64))).batch(size)


@pytest.mark.parametrize("steps_per_execution", [1, 2, 4])
def test_a_loss_that_becomes_nan_stops_training_with_the_step_and_the_rate_to_change(steps_per_execution):
    images = np.ones((16, 4, 4, 3))
    images[9] = np.nan  # in the third batch
    trainer = tiny_trainer(steps_per_execution=steps_per_execution)
    with pytest.raises(Diverged, match=r"the loss became nan at step 3 of epoch 2, .*this phase's is 0\.1"):
        trainer.train_epoch(batches(images, np.zeros(16)), epoch=1, first_step=0, global_batch=4)


def test_a_finite_epoch_reports_its_mean_loss_and_accuracy():
    """At a rate of 0 the model stays as it was: the epoch's loss and accuracy are its own on the
    16 images, computed here from its answers."""
    images = np.random.default_rng(0).random((16, 4, 4, 3))
    labels = np.arange(16) % 3
    trainer = tiny_trainer(learning_rate=0.0)
    probabilities = trainer.model(images.astype(np.float32)).numpy()
    results, steps, stopped = trainer.train_epoch(batches(images, labels), 0, 0, 4)
    assert steps == 4 and not stopped
    right = probabilities.argmax(axis=1) == labels
    assert 0 < right.sum() < 16  # (neither 0 nor 1: an accuracy that is always either would fail)
    assert results["train_accuracy"] == pytest.approx(right.mean())
    assert results["train_loss"] == pytest.approx(-np.log(probabilities[np.arange(16), labels]).mean(), rel=1e-5)


def train_twice(steps_per_execution, stop_after_steps=None):
    """Two epochs of 7 steps (the last one short: 26 examples in batches of 4)."""
    images = np.random.default_rng(1).random((26, 4, 4, 3))
    trainer = tiny_trainer(steps_per_execution=steps_per_execution)
    seen = []

    def on_step(steps):
        seen.append(steps)
        if stop_after_steps and steps >= stop_after_steps:
            trainer.stop.set()

    results = [trainer.train_epoch(batches(images, np.arange(26) % 3), epoch, 0, 4, on_step) for epoch in range(2)]
    return trainer, results, seen


@pytest.mark.parametrize("steps_per_execution", [2, 3, 7, 50])
def test_several_steps_per_call_train_exactly_as_one_step_per_call(steps_per_execution):
    one, one_results, one_seen = train_twice(1)
    several, several_results, seen = train_twice(steps_per_execution)
    assert [steps for _, steps, _ in several_results] == [7, 7]
    for (a, _, _), (b, _, _) in zip(one_results, several_results):
        assert a == pytest.approx(b, rel=1e-5)
    for a, b in zip(one.model.get_weights(), several.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert one_seen == [*range(1, 8)] * 2  # the host hears of every step, or of every call
    assert seen == [*range(steps_per_execution, 7, steps_per_execution), 7] * 2
    # one graph for both epochs' iterators and the pass's short last batch
    (_, _, function), = several._functions
    assert function.experimental_get_tracing_count() == 1


def test_a_stop_ends_the_epoch_after_the_call_with_the_exact_step_count():
    trainer, results, seen = train_twice(3, stop_after_steps=2)
    assert seen[0] == 3 and results[0][1:] == (3, True)  # the call's 3 steps were trained and counted


def test_evaluation_counts_every_example_with_several_steps_per_call():
    images = np.random.default_rng(2).random((26, 4, 4, 3))
    scores = {k: tiny_trainer(steps_per_execution=k).evaluate(batches(images, np.arange(26) % 3)) for k in (1, 4)}
    assert scores[1][1] == scores[4][1] == 26
    assert scores[1][0] == pytest.approx(scores[4][0], rel=1e-6)
