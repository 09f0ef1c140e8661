"""TFRecord's masked CRC-32C.

TFRecord stores mask(crc32c(x)) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2**32) for the
length and for the data of every record (tensorflow/core/lib/hash/crc32c.h).
"""

import logging

import google_crc32c
import numpy as np

crc32c = google_crc32c.value  # accepts bytes only (not memoryview or bytearray)
crc32c_extend = google_crc32c.extend  # (crc so far, more bytes): the crc of both, bytes only too

MASK_DELTA = 0xA282EAD8

if google_crc32c.implementation != "c":  # pragma: no cover - depends on the installed wheel
    logging.getLogger(__name__).warning(
        "google-crc32c is using its pure-Python fallback: CRC checks will be ~100x slower. "
        "Install a binary wheel of google-crc32c for this platform."
    )


def mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    return mask(crc32c(data))


def mask_array(crcs: np.ndarray) -> np.ndarray:
    """mask() over a uint32 array; uint32 arithmetic wraps exactly like the C++ code."""
    crcs = crcs.astype(np.uint32, copy=False)
    return ((crcs >> np.uint32(15)) | (crcs << np.uint32(17))) + np.uint32(MASK_DELTA)
