"""MXNet's image record header (mxnet.recordio's IRHeader), what each record of an im2rec .rec
file holds before its image: read by the job (sources/mxnet_records.py) and by the server from a
RecordIO request (keras_pipe_serve.payloads). No TensorFlow: the server reads it before any.

    uint32 flag | float32 label | uint64 id | uint64 id2        (24 bytes, little-endian)

then, when flag > 0, `flag` float32 labels (the label field is then unused), then the encoded
image. A single-label record holds its class id in `label` (flag 0); a multi-label one, as the
built-in algorithm takes it, one 0/1 value per class (flag = the number of classes).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence

# (MXNet packs it natively: little-endian, no padding, on every platform it runs on)
HEADER = struct.Struct("<IfQQ")
LABEL_BYTES = struct.calcsize("<f")


class ImageRecordError(ValueError):
    """The bytes cannot be an image record: the message says why, for the caller to say where."""


@dataclasses.dataclass(frozen=True)
class ImageRecordHeader:
    flag: int
    label: float
    id: int
    id2: int
    labels: tuple[float, ...]  # the header's label alone (flag 0), or the `flag` labels after it
    image_offset: int  # where the image starts in the record


def unpack(payload: bytes | memoryview) -> ImageRecordHeader:
    """The header at the start of `payload` (a record's bytes); an ImageRecordError if they are
    too few for it, or for the labels it says follow."""
    if len(payload) < HEADER.size:
        raise ImageRecordError(f"{len(payload)} bytes, fewer than the image record header's {HEADER.size}")
    flag, label, index, index2 = HEADER.unpack_from(payload)
    image_offset = HEADER.size + LABEL_BYTES * flag
    if image_offset > len(payload):
        raise ImageRecordError(f"its header says {flag} labels follow, more than its {len(payload)} bytes hold")
    labels = struct.unpack_from(f"<{flag}f", payload, HEADER.size) if flag else (label,)
    return ImageRecordHeader(flag, label, index, index2, labels, image_offset)


def pack(label: float | Sequence[float], index: int, index2: int = 0) -> bytes:
    """The header mxnet.recordio.pack(IRHeader(0, label, index, index2), image) writes before the
    image: a number as the header's label (flag 0); a sequence as `flag` labels after it."""
    if isinstance(label, (int, float)):
        return HEADER.pack(0, label, index, index2)
    values = [float(v) for v in label]
    return HEADER.pack(len(values), 0.0, index, index2) + struct.pack(f"<{len(values)}f", *values)
