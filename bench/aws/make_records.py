"""A TFRecord file of COUNT records of SIZE bytes each (valid framing and CRCs), for the reader
benchmarks; no TensorFlow needed.  usage: python make_records.py FILE COUNT SIZE"""

import os
import struct
import sys

import google_crc32c


def masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked(google_crc32c.value(length))) + data
            + struct.pack("<I", masked(google_crc32c.value(data))))


if __name__ == "__main__":
    path, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    payload = os.urandom(size)
    with open(path + ".tmp", "wb") as out:
        for i in range(count):  # each record numbered, so no two are the same
            out.write(frame(struct.pack("<Q", i) + payload[8:]))
    os.replace(path + ".tmp", path)
    print(path, os.path.getsize(path))
