"""BatchNorm statistics recomputed with each epoch's final weights ("precise BN").

A backbone trained from scratch keeps, in each BatchNorm layer, a moving average of the batch
statistics it saw while its weights changed: inference (validation, the exported model) then
normalises with statistics of networks that no longer exist. Over a long run the lag is small;
over the few dozen steps of a short job the weights move faster than the average follows, and a
model that classifies every training batch right validates at chance (docs/speed.md, Figures
behind the code's choices: Precise BN, has a case).

So after each epoch of such a backbone, its BatchNorm statistics are recomputed on the last
`precise_bn_examples` training images of the epoch (fewer where they would take over 256 MiB),
run through the network in training mode with the epoch's final weights: the mean over the
batches of each batch's mean and variance (Wu & Johnson, "Rethinking 'Batch' in BatchNorm",
2021, section 3; detectron2's PreciseBN). The images are kept as the training pass decodes them
(augmented), as uint8, in a ring on the host (sources/recent_images.py): Pipe mode cannot read a
pass twice.

A pretrained backbone's BatchNorm layers stay in inference mode (model/classifier.py): their
statistics never change, and none of this runs.
"""

from __future__ import annotations

import contextlib
import logging
import time

import keras
import numpy as np
import tensorflow as tf

from keras_pipe_train.settings.tracing import as_written, traced
from keras_pipe_train.sources.recent_images import RecentImages
from keras_pipe_train.training.checkpoints import random_states
from keras_pipe_train.training.distribute import Cluster

log = logging.getLogger(__name__)


def batchnorm_layers(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    """The BatchNorm layers of `model` and of the models inside it, in order."""
    found = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            found.append(layer)
        elif isinstance(layer, keras.Model):
            found.extend(batchnorm_layers(layer))
    return found


class PreciseBatchNorm:
    """Recomputes the BatchNorm statistics of `model`'s trainable BatchNorm layers (recompute())
    from the images a RecentImages kept, with the model's current weights."""

    def __init__(self, model: keras.Model, cluster: Cluster, global_batch: int, recent: RecentImages):
        self.model, self.cluster, self.recent = model, cluster, recent
        self.per_replica_batch = cluster.per_replica_batch(global_batch)
        self.all_layers = batchnorm_layers(model)
        self.layers: list = []
        self._functions: list = []  # (element spec, layers, traced step); (specs need not be hashable)

    def recompute(self) -> int:
        """Sets each layer's moving mean and variance to the means of its batch statistics over the
        images kept; returns how many images that was on this worker (0: nothing recomputed).
        A collective under several workers: every worker calls it after the same epoch, and all
        use as many images (the fewest any of them kept) in as many steps."""
        # the layers that train now: a frozen one (below fine_tune_layers, or under train_batchnorm's
        # head phase) normalises with its moving statistics in training mode too, and keeps them
        self.layers = [layer for layer in self.all_layers if layer.trainable]
        images = self.recent.images()
        count = min(int(n) for n in self.cluster.all_texts(str(len(images))))
        local = self.cluster.local_replicas
        batch = min(self.per_replica_batch, count // local)
        steps = count // (batch * local) if batch else 0
        if not steps or not self.layers:
            return 0
        used = images[len(images) - steps * batch * local:]
        dataset = self.cluster.strategy.distribute_datasets_from_function(
            lambda context: tf.data.Dataset.from_tensor_slices(used).batch(batch, drop_remainder=True).map(
                as_written(lambda x: tf.cast(x, tf.float32))))
        total = 0.0
        # (the steps are traced with momentum 0: see batch_statistics)
        with batch_statistics(self.layers), random_states_kept(self.model):
            for variable in self._moving():  # (momentum 0 keeps 0 x a statistic: an inf would stay NaN)
                variable.assign(np.zeros(variable.shape, variable.dtype))
            step = self._step(dataset)
            for images_batch in dataset:
                total = total + step(images_batch).numpy().astype(np.float64)
        means, first = total / steps, 0
        for variable in self._moving():
            size = int(np.prod(variable.shape))
            variable.assign(means[first:first + size].reshape(variable.shape).astype(variable.dtype))
            first += size
        return len(used)

    def recompute_after(self, epoch: int) -> None:
        """`recompute`, said in the log, after `epoch` (0-based), before it is validated,
        checkpointed or exported."""
        started = time.perf_counter()
        used = self.recompute()
        if used:
            log.info("batchnorm statistics of epoch %d recomputed with its final weights on its last %d training "
                     "images (precise_bn_examples; on each host) in %.1f s", epoch + 1, used,
                     time.perf_counter() - started)
        else:
            log.warning("batchnorm statistics of epoch %d not recomputed: a host kept fewer of its training images "
                        "than it has devices (a shard that ran out?): the moving averages are used as they are",
                        epoch + 1)

    def _moving(self):
        for layer in self.layers:
            yield layer.moving_mean
            yield layer.moving_variance

    def _step(self, dataset):
        """The traced step: each replica's batch through the model in training mode, which sets
        each layer's moving statistics (on that replica) to the batch's, then their mean over all
        replicas of all workers, as one flat vector (a collective reduces one tensor; a list of
        them, under MultiWorkerMirroredStrategy, is packed and must agree in shape). (Keras
        creates the statistics unsynchronised, aggregation NONE: under MirroredStrategy each
        replica keeps its own, and the model is saved with the first's.)"""
        spec, layers = dataset.element_spec, list(self.layers)
        for known, known_layers, function in self._functions:
            if known == spec and known_layers == layers:
                return function
        model, strategy, moving = self.model, self.cluster.strategy, list(self._moving())

        def forward(images):
            model(images, training=True)
            return tf.concat([tf.reshape(tf.cast(variable.value, tf.float32), [-1]) for variable in moving], 0)

        function = traced(lambda images: strategy.reduce("mean", strategy.run(forward, args=(images,)), axis=None))
        self._functions.append((spec, layers, function))
        return function


@contextlib.contextmanager
def random_states_kept(model: keras.Model):
    """Within: `model` runs in training mode, where Dropout draws masks; after, its generators'
    states are put back, so that the training that follows draws what it would have, and a resumed
    job what the first did."""
    generators = random_states(model).states
    states = [state.numpy() for state in generators]
    try:
        yield
    finally:
        for state, value in zip(generators, states):
            state.assign(value)


class batch_statistics:
    """Within: `layers` keep each training-mode batch's statistics as their moving ones (momentum
    0). Keras reads a BatchNorm layer's momentum when a function is traced, so the steps traced
    within keep it, and the training steps, traced outside (before or after), keep theirs."""

    def __init__(self, layers):
        self.layers = layers
        self.momenta: list[float] = []

    def __enter__(self):
        self.momenta = [layer.momentum for layer in self.layers]
        for layer in self.layers:
            layer.momentum = 0.0
        return self

    def __exit__(self, *exc):
        for layer, momentum in zip(self.layers, self.momenta):
            layer.momentum = momentum
        return False
