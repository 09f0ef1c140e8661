"""The last images of a training pass, kept on the host as the pipeline makes them, for the BatchNorm
statistics recomputed after each epoch of a backbone trained from scratch
(training/precise_batchnorm.py says why): Pipe mode cannot read a pass twice, so the images are
kept as the training pass decodes them (augmented), as uint8, in a ring whose tap sits at the end
of the training pipeline (datasets.EpochInput).
"""

from __future__ import annotations

import threading

import numpy as np
import tensorflow as tf

from keras_pipe_train.settings.tracing import as_written

# The most host memory the kept images take: 1024 images at 224 px are 154 MB; at 600 px
# (EfficientNetB7's size) 1024 would be 1.1 GB, so fewer are kept (248). (While the statistics are
# recomputed, a copy of the images and a tensor of them take about twice that again.)
MAX_BYTES = 256 * 2**20


class RecentImages:
    """The last `capacity` images of a training pass (fewer where they would take more than
    `max_bytes`), kept by tap() as the pipeline makes them."""

    def __init__(self, capacity: int, image_size: int | None = None, max_bytes: int = MAX_BYTES):
        self.capacity, self.image_size, self.max_bytes = capacity, image_size, max_bytes
        self._images: np.ndarray | None = None  # allocated at the first batch: its image shape
        self._next = self._count = 0
        self._lock = threading.Lock()  # (tf.data may run the tap on any of its threads)

    @property
    def slots(self) -> int:
        """How many images the ring holds (without image_size: 0 until the first batch says it)."""
        if self._images is not None:
            return len(self._images)
        return self._slots_for(self.image_size * self.image_size * 3) if self.image_size else 0

    def _slots_for(self, image_bytes: int) -> int:
        return min(self.capacity, max(1, self.max_bytes // max(1, image_bytes)))

    def batches_to_fill(self, batch: int, available: int, replicas: int = 1) -> int:
        """How many of the `available` batches (of `batch` images) before a resumed epoch's first
        must be kept again for the ring to hold what the uninterrupted epoch's would. With slack of
        a batch per replica: an epoch resumed after its last step (stopped while validating) counts
        the pass's last batch, which may be short, and on several replicas batches beyond it."""
        return min(available, -(-self.slots // batch) + replicas)

    def clear(self) -> None:
        with self._lock:
            self._next = self._count = 0

    def keep(self, images: np.ndarray) -> None:
        """Keeps `images` (a batch, [0, 255]), dropping the oldest beyond the capacity."""
        if images.dtype != np.uint8:
            images = np.clip(np.rint(images), 0, 255).astype(np.uint8)
        with self._lock:
            if self._images is None or self._images.shape[1:] != images.shape[1:]:
                slots = self._slots_for(images[0].nbytes)
                self._images = np.empty((slots, *images.shape[1:]), np.uint8)
                self._next = self._count = 0
            slots = len(self._images)
            images = images[-slots:]
            first = self._next
            end = first + len(images)
            head = min(end, slots) - first
            self._images[first:first + head] = images[:head]
            self._images[:end - first - head] = images[head:]  # (wrapped round)
            self._next = end % slots
            self._count = min(self._count + len(images), slots)

    def images(self) -> np.ndarray:
        """The images kept, oldest first (a copy)."""
        with self._lock:
            if not self._count:
                return np.empty((0,), np.uint8)
            if self._count < len(self._images):
                return self._images[:self._count].copy()
            return np.concatenate([self._images[self._next:], self._images[:self._next]])

    def tap(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """`dataset` of (images, labels) batches, each batch's images kept as it passes."""
        def kept(images):
            self.keep(images.numpy())
            return np.int64(0)

        def keeping(images, labels):
            # (made uint8 in the graph, on tf.data's threads: the host's copy is then a quarter of
            # the bytes, and numpy's rounding of a large float batch would hold the GIL)
            pixels = tf.cast(tf.clip_by_value(tf.round(images), 0, 255), tf.uint8)
            done = tf.py_function(kept, [pixels], tf.int64)
            with tf.control_dependencies([done]):
                return tf.identity(images), labels

        return dataset.map(as_written(keeping))
