"""precise_batchnorm.py: BatchNorm statistics recomputed from the images a training pass kept
(sources/recent_images.py, tests/job/sources/test_recent_images.py) with the model's final weights,
on one replica and on two (MirroredStrategy over two logical CPUs, in a process of its own:
TensorFlow fixes its devices once)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.conftest import REPO, run_logged
from tests.timeouts import wait_s

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


@pytest.mark.slow
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
