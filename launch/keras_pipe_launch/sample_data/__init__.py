"""Built-in images for the demo and the tests: scikit-learn's copy of the UCI handwritten digits
(1797 images, 8x8 pixels, 10 classes; CC BY 4.0, see README.md), shipped as digits.npz so that
nothing needs downloading."""

from __future__ import annotations

from pathlib import Path

import numpy as np

DIGITS = Path(__file__).with_name("digits.npz")


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 8, 8] in 0..16, labels uint8 [N]), in a fixed shuffled order."""
    with np.load(DIGITS) as data:
        images, labels = data["images"], data["labels"]
    order = np.random.default_rng(0).permutation(len(images))
    return images[order], labels[order]


def digit_jpeg(image: np.ndarray, size: int = 32) -> bytes:
    """An 8x8 digit as a size x size RGB JPEG, ink dark on white like a scanned page."""
    import tensorflow as tf

    gray = 255 - image.astype(np.float32) * (255 / 16)
    big = tf.image.resize(gray[..., None], [size, size], method="bilinear")
    rgb = tf.cast(tf.round(tf.repeat(big, 3, axis=-1)), tf.uint8)
    return tf.io.encode_jpeg(rgb, quality=95).numpy()


def digit_examples(images: np.ndarray, labels: np.ndarray, size: int = 32) -> list[bytes]:
    from keras_pipe_train.sources.example import encode_example

    return [encode_example(digit_jpeg(im, size), int(y)) for im, y in zip(images, labels)]


def digit_pairs(images: np.ndarray, labels: np.ndarray, count: int, seed: int = 0
                ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """A multi-label task from the digits: `count` images of two different digits side by side
    (16x16, the pair centred), each labelled with both classes (smaller first)."""
    rng = np.random.default_rng(seed)
    pairs, classes = np.zeros((count, 16, 16), images.dtype), []
    for index in range(count):
        first = rng.integers(len(images))
        second = rng.choice(np.flatnonzero(labels != labels[first]))
        pairs[index, 4:12, :8], pairs[index, 4:12, 8:] = images[first], images[second]
        classes.append(tuple(sorted((int(labels[first]), int(labels[second])))))
    return pairs, classes


def pair_examples(images: np.ndarray, classes: list[tuple[int, int]], size: int = 32) -> list[bytes]:
    from keras_pipe_train.sources.example import encode_example

    return [encode_example(digit_jpeg(im, size), pair) for im, pair in zip(images, classes)]
