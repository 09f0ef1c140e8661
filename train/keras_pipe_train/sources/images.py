"""What an image is allowed to be before anything decodes it: a format TensorFlow decodes, whole,
and no larger than max_image_pixels.

A few KB of PNG can decode to 16000x16000 pixels (768 MB of RGB): checked from the header, such a
decompression bomb costs nothing; decoded, it kills the job with OOM (exit 137, no failure file).
The header is read with Pillow, which reads headers without decoding (and is already installed
with TensorBoard). The exported serving signature cannot call Python: it checks the same limit
with TensorFlow ops (preprocess.header_pixels), and tests hold the two to the same answers.
"""

from __future__ import annotations

import functools
import io
import warnings

from keras_pipe_train.settings.config import DEFAULT_MAX_PIXELS

# Pillow's name -> ours, for the formats tf.io.decode_image decodes (MPO: a camera JPEG with more
# than one picture, decoded as its first). JPEG XL is decoded by TF too, but no header reader
# here sizes it, so it is refused rather than decoded unchecked.
FORMATS = {"JPEG": "JPEG", "MPO": "JPEG", "PNG": "PNG", "GIF": "GIF", "BMP": "BMP", "WEBP": "WebP"}
SUPPORTED = "JPEG, PNG, GIF, BMP or WebP"


@functools.cache
def _pillow():
    """Pillow, imported when first needed (the launcher loads this module without it)."""
    from PIL import Image

    # This module enforces its own limit before anything decodes; Pillow's (a warning at 89 MP, an
    # error at 179 MP) would only get in the way of max_image_pixels.
    Image.MAX_IMAGE_PIXELS = None
    return Image


def problem(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> str | None:
    """Why `data` cannot be used as an image, or None."""
    if not data:
        return "is empty (0 bytes)"
    Image = _pillow()  # (Pillow's own name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's warnings about odd but readable headers
            with Image.open(io.BytesIO(data)) as image:
                kind, (width, height) = image.format, image.size
                if kind == "PNG":
                    image.verify()  # every chunk's CRC: a damaged PNG found here, not mid-batch in libpng
    except (OSError, SyntaxError, ValueError, EOFError) as err:  # UnidentifiedImageError is an OSError
        if type(err).__name__ == "UnidentifiedImageError":
            return f"is not an image (it starts with {data[:16]!r})"
        return f"is a damaged image ({type(err).__name__}: {str(err)[:100]})"
    if kind not in FORMATS:
        return f"is a {kind} image; the job reads {SUPPORTED}"
    if width * height > max_pixels:
        return (f"is a {width}x{height} {FORMATS[kind]} image, {width * height / 1e6:.0f} megapixels: more than "
                f"max_image_pixels ({max_pixels}); shrink it, or raise the limit")
    if kind == "JPEG" and not _jpeg_is_whole(data):
        return "is a truncated JPEG (no end-of-image marker after its image data)"
    return None


def _jpeg_is_whole(data: bytes) -> bool:
    """Whether an end-of-image marker follows the start of the first scan (of the main image: the
    walk over segments skips an EXIF thumbnail, which has its own scan and end marker). Inside
    image data 0xFF is always followed by 0x00 or a restart marker, so FF D9 there is the end."""
    scan = _first_scan(data)
    return scan is not None and data.rfind(b"\xff\xd9") > scan


def _first_scan(data: bytes) -> int | None:
    position = 2  # after SOI
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            return None
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
        elif marker == 0xDA:  # start of scan
            return position
        elif 0xD0 <= marker <= 0xD7 or marker == 0x01:  # markers without a length
            position += 2
        else:
            position += 2 + int.from_bytes(data[position + 2 : position + 4], "big")
    return None
