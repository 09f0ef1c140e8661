"""What an image may be before anything decodes it: train/keras_pipe_train/sources/images.py (Python, for the data the job
and `keras-pipe prepare` read) and preprocess.header_pixels (TensorFlow ops, for the serving
signature), held to the same answers; each op run eagerly and inside Dataset.map."""

import io
import struct

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_pipe_train.sources import images, preprocess
from tests.conftest import image_bytes, png_bomb

FORMATS = {
    "jpeg": lambda: image_bytes("JPEG"),
    "jpeg with exif thumbnail": lambda: jpeg_with_thumbnail(),
    "progressive jpeg": lambda: image_bytes("JPEG", progressive=True),
    "png": lambda: image_bytes("PNG"),
    "gif": lambda: image_bytes("GIF"),
    "bmp": lambda: image_bytes("BMP"),
    "webp lossy": lambda: image_bytes("WEBP"),
    "webp lossless": lambda: image_bytes("WEBP", lossless=True),
    "webp extended": lambda: rgba_webp(),
}


def jpeg_with_thumbnail() -> bytes:
    """A JPEG whose EXIF holds a whole thumbnail JPEG (its own scan and end marker) before the scan
    of the image itself, as camera photos do."""
    thumbnail = image_bytes("JPEG", 16, 12)
    exif = b"Exif\0\0" + b"II*\0\x08\0\0\0" + b"\0\0" + thumbnail  # a token TIFF block, then the thumbnail
    plain = image_bytes("JPEG")
    return plain[:2] + b"\xff\xe1" + struct.pack(">H", len(exif) + 2) + exif + plain[2:]


def rgba_webp() -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", (53, 37), (1, 2, 3, 100)).save(out, "WEBP")
    return out.getvalue()


def in_dataset_map(fn, data: bytes):
    return next(iter(tf.data.Dataset.from_tensors(tf.constant(data)).map(fn))).numpy()


@pytest.mark.parametrize("kind", FORMATS)
def test_every_supported_format_is_accepted_and_sized_alike_in_python_and_in_tensorflow(kind):
    data = FORMATS[kind]()
    assert images.problem(data) is None
    assert preprocess.header_pixels(tf.constant(data)).numpy() == 53 * 37
    assert in_dataset_map(preprocess.header_pixels, data) == 53 * 37
    assert preprocess.decode(tf.constant(data)).shape == (37, 53, 3)  # and TensorFlow decodes it


def jpeg_claiming(width: int, height: int) -> bytes:
    """A small JPEG whose header (SOF0) claims another size."""
    data = bytearray(image_bytes("JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.mark.parametrize("name, make, pixels", [
    ("png bomb", lambda: png_bomb(), 16000 * 16000),
    ("jpeg bomb", lambda: jpeg_claiming(30000, 20000), 30000 * 20000),
])
def test_decompression_bombs_are_refused_from_the_header_without_decoding(name, make, pixels):
    data = make()
    assert len(data) < 2 << 20
    problem = images.problem(data, max_pixels=100_000_000)
    assert f"{pixels / 1e6:.0f} megapixels: more than max_image_pixels (100000000)" in problem
    assert images.problem(data, max_pixels=pixels) is None or name == "jpeg bomb"  # at the limit: accepted
    assert preprocess.header_pixels(tf.constant(data)).numpy() == pixels
    assert in_dataset_map(preprocess.header_pixels, data) == pixels
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"more than max_image_pixels \(100000000\) pixels"):
        preprocess.checked(tf.constant(data), 100_000_000)


def truncated(data: bytes) -> bytes:
    return data[: len(data) * 2 // 3]


@pytest.mark.parametrize("data, problem", [
    (b"", "is empty (0 bytes)"),
    (b"<!DOCTYPE html><html>Access Denied</html>", "is not an image (it starts with b'<!DOCTYPE html><')"),
    (image_bytes("TIFF"), "is a TIFF image; the job reads JPEG, PNG, GIF, BMP or WebP"),
    (truncated(image_bytes("JPEG", 300, 200)), "is a truncated JPEG (no end-of-image marker after its image data)"),
    (truncated(jpeg_with_thumbnail()), "is a truncated JPEG"),
    (truncated(image_bytes("PNG", 300, 200)), "is a damaged image"),
])
def test_what_is_not_a_usable_image_says_why(data, problem):
    assert images.problem(data).startswith(problem), images.problem(data)


def test_a_png_with_a_damaged_chunk_is_refused_before_libpng_sees_it():
    data = bytearray(image_bytes("PNG", 300, 200))
    data[len(data) // 2] ^= 0xFF  # inside the image data: its chunk's CRC no longer matches
    assert images.problem(bytes(data)).startswith("is a damaged image")


def test_the_serving_check_refuses_what_is_not_an_image():
    assert preprocess.header_pixels(tf.constant(b"<html>")).numpy() == -1
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a JPEG, PNG, GIF, BMP or WebP image"):
        preprocess.checked(tf.constant(b"<html>" * 10), 100)
    assert preprocess.checked(tf.constant(image_bytes("PNG")), 53 * 37).numpy() == image_bytes("PNG")


def test_the_decoded_size_is_what_the_header_says():
    data = image_bytes("PNG", 40, 30)
    assert images.problem(data, max_pixels=1200) is None and images.problem(data, max_pixels=1199)
    assert np.prod(preprocess.decode(tf.constant(data)).shape[:2]) == preprocess.header_pixels(tf.constant(data))
