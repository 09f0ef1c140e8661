"""One image as `keras-pipe prepare` stores it: checked whole, and with --max-side shrunk to a JPEG.

Why shrink: a large photo costs its full decode in every epoch, where the same photo stored at
512 px decodes in a fraction of that time, and the Pipe stream carries far fewer bytes
(docs/speed.md, Figures behind the code's choices: --max-side). A model that sees 224x224 crops
gains nothing from the extra pixels, so preparing once at a few times the model's input size moves
that cost out of every epoch.

Pixels are as TensorFlow decodes them, which is how the job and its serving signature see the
originals too: EXIF orientation is not applied (a re-encoded JPEG carries no EXIF).
"""

from __future__ import annotations

import argparse
import math
import re

DEFAULT_QUALITY = 90  # libjpeg's scale; 90 keeps JPEG artefacts well below what augmentation changes


def checked(data: bytes, max_pixels: int, max_side: int | None = None,
            quality: int = DEFAULT_QUALITY) -> tuple[bytes | None, str | None]:
    """(bytes to store, None) for an image the job can use, else (None, why). The header is checked
    first (a decompression bomb is refused before it is decoded), then the whole image is decoded.
    With max_side, an image whose longer side is larger is stored shrunk to it, as a JPEG."""
    import tensorflow as tf

    from keras_pipe_train.sources import images, preprocess

    problem = images.problem(data, max_pixels)
    if problem:
        return None, f"the file {problem}"
    encoded = tf.constant(data)
    try:
        if not max_side:
            preprocess.decode(encoded)
            return data, None
        return shrunk(encoded, max_side, quality), None
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as err:
        why = re.sub(r"\{\{[^}]*\}\}\s*", "", err.message.splitlines()[0])  # TF's op-location prefix
        return None, f"corrupt image: {why[:120]}"


def shrunk(encoded, max_side: int, quality: int) -> bytes:
    """The image with its longer side at most max_side (aspect kept), or its own bytes if it is
    already that small. JPEGs are decoded at the smallest of libjpeg's scales (1/2, 1/4, 1/8) that
    keeps max_side pixels, then resized with antialiasing (plain bilinear would alias at these
    factors)."""
    import tensorflow as tf

    from keras_pipe_train.sources import preprocess

    if tf.io.is_jpeg(encoded):
        # (read to numpy at once: iterating the eager tensor runs a slice op per element; docs/speed.md,
        # Figures behind the code's choices: --max-side)
        height, width = (int(n) for n in tf.io.extract_jpeg_shape(encoded).numpy()[:2])
        ratio = max(r for r in preprocess.JPEG_RATIOS if max(height, width) // r >= max_side or r == 1)
        image = tf.io.decode_jpeg(encoded, channels=3, ratio=ratio)
    else:
        image = preprocess.decode(encoded)
        height, width = image.shape[:2]
    if max(height, width) <= max_side:
        return encoded.numpy()
    scale = max_side / max(height, width)
    size = [max(1, round(height * scale)), max(1, round(width * scale))]
    image = tf.image.resize(image, size, method="bilinear", antialias=True)
    image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    return tf.io.encode_jpeg(image, quality=quality, optimize_size=True).numpy()


def whole_number(text: str) -> int:
    """An option that counts something (pixels, workers): refused where the command starts, not
    inside an instance after the plan is written."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return int(text)


def megabytes(text: str) -> float:
    """--shard-mb: a finite size of more than zero (nan or -1 would write one shard per image)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: give a size in MB, more than 0 (e.g. 100 or 0.5)")
    return value


def bits(text: str) -> int:
    """--duplicate-distance: bits of a 64-bit perceptual hash, 0 to duplicates.MAX_DISTANCE."""
    from keras_pipe_launch.prepare.duplicates import MAX_DISTANCE

    if not text.isdigit() or int(text) > MAX_DISTANCE:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of bits from 0 to {MAX_DISTANCE}")
    return int(text)


def jpeg_quality(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a JPEG quality: give a whole number from 1 to 100")
    return int(text)
