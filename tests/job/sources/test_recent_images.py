"""sources/recent_images.py: the last images of a training pass, kept for precise BatchNorm
(training/precise_batchnorm.py, tests/job/training/test_precise_batchnorm.py) as the pipeline's tap
passes them: oldest first, as uint8, bounded in bytes, and what a resumed epoch must read again."""

from __future__ import annotations

import numpy as np

from keras_pipe_train.sources.recent_images import RecentImages


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
