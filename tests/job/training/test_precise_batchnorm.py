"""precise_batchnorm.py: the images a training pass kept, and BatchNorm statistics recomputed from
them with the model's final weights, on one replica and on two (MirroredStrategy over two logical
CPUs, in a process of its own: TensorFlow fixes its devices once)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from keras_pipe_train.sources.recent_images import RecentImages
from tests.conftest import REPO, run_logged
from tests.timeouts import wait_s


def batch(first: int, count: int) -> np.ndarray:
    """`count` 1x1 images whose pixels all hold their number, from `first`."""
    return np.arange(first, first + count, dtype=np.float32).reshape(count, 1, 1, 1).repeat(3, axis=3)


def numbers(images: np.ndarray) -> list[int]:
    return [int(image[0, 0, 0]) for image in images]


def test_the_last_images_are_kept_oldest_first_however_the_batches_fall():
    recent = RecentImages(5)
    assert len(recent.images()) == 0
    recent.keep(batch(0, 3))
    assert numbers(recent.images()) == [0, 1, 2]
    recent.keep(batch(3, 3))  # (wraps round)
    assert numbers(recent.images()) == [1, 2, 3, 4, 5]
    recent.keep(batch(6, 1))
    assert numbers(recent.images()) == [2, 3, 4, 5, 6]
    recent.keep(batch(7, 12))  # (a batch larger than the ring: its last 5)
    assert numbers(recent.images()) == [14, 15, 16, 17, 18]
    recent.clear()
    assert len(recent.images()) == 0
    recent.keep(batch(20, 2))
    assert numbers(recent.images()) == [20, 21]


def test_images_are_kept_as_uint8_rounded_and_clipped_and_a_new_size_starts_afresh():
    recent = RecentImages(4)
    recent.keep(np.array([-3.0, 0.4, 0.6, 254.6, 300.0]).reshape(5, 1, 1, 1))
    kept = recent.images()
    assert kept.dtype == np.uint8 and kept.ravel().tolist() == [0, 1, 255, 255]
    recent.keep(np.zeros((2, 2, 2, 3)))  # (another image size: the ring holds one size)
    assert recent.images().shape == (2, 2, 2, 3)


def test_fewer_large_images_are_kept_than_asked_for():
    recent = RecentImages(1024, max_bytes=10 * 600 * 600 * 3)
    recent.keep(np.zeros((4, 600, 600, 3), np.uint8))
    assert recent.slots == 10
    recent.keep(np.zeros((12, 600, 600, 3), np.uint8))
    assert len(recent.images()) == 10
    assert RecentImages(5).slots == 0  # (until a batch says the images' size)


def test_a_resumed_epoch_reads_again_the_batches_that_fill_the_ring():
    """(datasets.EpochInput decodes them again, only to keep them: test_local_runner's stopped and
    rerun job ends with the uninterrupted one's statistics)"""
    recent = RecentImages(10, image_size=8)
    assert recent.slots == 10
    # (10 images: 3 batches of 4, and one more per replica: the pass's last batch may be short)
    assert recent.batches_to_fill(4, available=7) == 4
    assert recent.batches_to_fill(4, available=20, replicas=2) == 5
    assert recent.batches_to_fill(4, available=2) == 2  # (the epoch resumed after 2 batches)
    assert RecentImages(1024, image_size=600, max_bytes=10 * 600 * 600 * 3).slots == 10


def test_the_tap_keeps_each_batch_that_passes_and_changes_nothing():
    import tensorflow as tf

    recent = RecentImages(10)
    images = batch(0, 7)
    dataset = recent.tap(tf.data.Dataset.from_tensor_slices((images, np.arange(7))).batch(3))
    passed = [(x.numpy(), y.numpy()) for x, y in dataset]
    assert numbers(np.concatenate([x for x, _ in passed])) == list(range(7))
    assert np.concatenate([y for _, y in passed]).tolist() == list(range(7))
    assert numbers(recent.images()) == list(range(7))


RECOMPUTE = r"""
import json, sys
import numpy as np, tensorflow as tf
replicas = int(sys.argv[1])
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from keras_pipe_train.training.checkpoints import random_states
from keras_pipe_train.training.distribute import Cluster
from keras_pipe_train.sources.recent_images import RecentImages
from keras_pipe_train.training.precise_batchnorm import PreciseBatchNorm
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if replicas > 1 else tf.distribute.get_strategy()
rng = np.random.default_rng(0)
images = rng.uniform(0, 255, (23, 8, 8, 3)).round().astype(np.float32)
with strategy.scope():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    features = keras.layers.Conv2D(4, 3, use_bias=False, name="conv")(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9, name="bn")(features)
    x = keras.layers.BatchNormalization(momentum=0.9, name="frozen")(x)
    x = keras.layers.Dropout(0.5)(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(x))
model.get_layer("frozen").trainable = False
frozen = [w.numpy().copy() for w in model.get_layer("frozen").non_trainable_weights]
recent = RecentImages(20)
recent.keep(images)
precise = PreciseBatchNorm(model, Cluster(strategy, 1, 0, True), 8, recent)
model.get_layer("bn").moving_variance.assign(np.full(4, np.inf, np.float32))  # (a float16 overflow's)
seeds = [state.numpy().tolist() for state in random_states(model).states]
used = precise.recompute()
# expected: the mean over the per-replica batches of the steps of each batch's moments of the conv's output
per_replica = min(8 // replicas, 20 // replicas)
steps = 20 // (per_replica * replicas)
taken = images[3:][20 - steps * per_replica * replicas:]
conv = keras.Model(inputs, features).predict(taken, verbose=0).astype(np.float64)
chunks = [conv[i:i + per_replica] for i in range(0, len(conv), per_replica)]
bn = model.get_layer("bn")
print(json.dumps({
    "used": used, "chunks": len(chunks),
    "mean": bn.moving_mean.numpy().tolist(), "expected_mean": np.mean([c.mean(axis=(0, 1, 2)) for c in chunks], 0).tolist(),
    "variance": bn.moving_variance.numpy().tolist(),
    "expected_variance": np.mean([c.var(axis=(0, 1, 2)) for c in chunks], 0).tolist(),
    "momentum": bn.momentum,
    "seeds_unchanged": seeds == [state.numpy().tolist() for state in random_states(model).states] and len(seeds) == 1,
    "copies_equal": all(np.array_equal(copy.numpy(), bn.moving_variance.numpy())
                        for copy in strategy.experimental_local_results(bn.moving_variance.value)),
    "frozen_unchanged": all(np.array_equal(a, w.numpy()) for a, w in zip(frozen, model.get_layer("frozen").non_trainable_weights)),
    "none_kept": PreciseBatchNorm(model, Cluster(strategy, 1, 0, True), 8, RecentImages(4)).recompute(),
}))
"""


@pytest.mark.parametrize("replicas", [1, 2])
def test_the_statistics_are_the_mean_of_the_batches_moments_with_the_final_weights(replicas):
    """A ring of 20 of 23 images, batches of 8 (4 per replica on two): every image kept used in
    whole per-replica batches, each layer's moving mean and variance the mean over those batches of
    their moments, on every replica, even from an infinite variance; Dropout's random state as it
    was; a layer that does not train is left alone, the momentum the training steps use is
    unchanged, and with no image kept nothing is recomputed."""
    out = run_logged([sys.executable, "-c", RECOMPUTE, str(replicas)], wait_s(120), cwd=REPO / "train")
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["used"] == 16 and found["chunks"] == (2 if replicas == 1 else 4)
    np.testing.assert_allclose(found["mean"], found["expected_mean"], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(found["variance"], found["expected_variance"], rtol=1e-4, atol=1e-3)
    assert found["momentum"] == 0.9 and found["frozen_unchanged"] and found["none_kept"] == 0
    assert found["copies_equal"]  # (each replica's copy: Keras keeps one per replica, unsynchronised)
    assert found["seeds_unchanged"]  # (Dropout's generator, run in training mode, put back as it was)
