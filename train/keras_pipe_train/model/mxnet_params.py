"""Reads MXNet's `.params` files (Gluon's model zoo, `save_parameters`, a built-in model's
`*-NNNN.params`) into numpy arrays, without MXNet.

Why not MXNet itself: its last release (1.9.1, 2022) needs numpy < 1.24, which TensorFlow 2.21 does
not install beside, and the project is retired; the format is small and fixed. It is MXNet's
`NDArray::Save` list (src/ndarray/ndarray.cc, `MXNDArraySave`), little-endian:

  uint64 0x112 (the list's magic), uint64 reserved
  uint64 count, then each array:
      uint32 magic: 0xF993FAC9 (V2) or 0xF993FACA (V3, numpy shapes); older files start with the shape
      int32 storage type (V2, V3): 0 is dense, the only one a model's weights use
      int32 ndim, then ndim int64 dimensions (uint32 ones before V1); an empty array ends here
      (ndim 0; -1 under V3, where ndim 0 is a scalar, one value)
      int32 device type, int32 device id
      int32 dtype flag, then the data, C order
  uint64 count, then each name: uint64 length, its bytes (Gluon's names, or "arg:"/"aux:" ones)
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

_LIST_MAGIC = 0x112
_V1, _V2, _V3 = 0xF993FAC8, 0xF993FAC9, 0xF993FACA
# mshadow's type flags
_DTYPES = {0: np.float32, 1: np.float64, 2: np.float16, 3: np.uint8, 4: np.int32, 5: np.int8, 6: np.int64}


class ParamsError(ValueError):
    """The file is not an MXNet parameter list, or one this reader cannot read."""


class _Reader:
    def __init__(self, data: bytes, path: Path):
        self.data, self.at, self.path = data, 0, path

    def take(self, fmt: str, many: bool = False):
        """The values of `fmt` next in the file: one value, or a tuple of them with `many`."""
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise ParamsError(f"{self.path} ends at byte {len(self.data)}, inside an array or name "
                              f"(truncated?)")
        values = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return values if many else values[0]

    def array(self, index: int) -> np.ndarray:
        magic = self.take("<I")
        if magic in (_V2, _V3):
            storage = self.take("<i")
            if storage != 0:
                raise ParamsError(f"{self.path}: array {index} is sparse (storage type {storage}); a model's "
                                  "weights are dense")
            ndim = self.take("<i")
        elif magic == _V1:
            ndim = self.take("<I")
        else:  # before V1 the array starts with its shape: uint32 ndim, uint32 dimensions
            ndim = magic
            if ndim > 32:
                raise ParamsError(f"{self.path}: array {index} starts with {magic:#x}, not an NDArray's magic")
        # an array saved empty ("none") ends at its shape: ndim 0, or -1 under V3, where 0 is a scalar
        if ndim < 0 or (ndim == 0 and magic != _V3):
            return np.zeros((0,), np.float32)
        shape = tuple(self.take(f"<{ndim}{'I' if magic not in (_V1, _V2, _V3) else 'q'}", many=True))
        self.take("<ii")  # the device it was saved from
        flag = self.take("<i")
        if flag not in _DTYPES:
            raise ParamsError(f"{self.path}: array {index} has dtype flag {flag}, not one of MXNet's")
        dtype = np.dtype(_DTYPES[flag]).newbyteorder("<")
        count = int(np.prod(shape))
        end = self.at + count * dtype.itemsize
        if end > len(self.data):
            raise ParamsError(f"{self.path} ends at byte {len(self.data)}, inside array {index} "
                              f"({shape}; truncated?)")
        values = np.frombuffer(self.data, dtype, count, self.at).reshape(shape).copy()
        self.at = end
        return values


def load(path: Path) -> dict[str, np.ndarray]:
    """The named arrays of an MXNet `.params` file, in the file's order."""
    path = Path(path)
    data = path.read_bytes()
    reader = _Reader(data, path)
    if len(data) < 16 or reader.take("<Q") != _LIST_MAGIC:
        raise ParamsError(f"{path} is not an MXNet .params file (it does not start with NDArray::Save's "
                          "list magic 0x112)")
    reader.take("<Q")
    arrays = [reader.array(i) for i in range(reader.take("<Q"))]
    try:
        names = [reader.take(f"<{reader.take('<Q')}s").decode() for _ in range(reader.take("<Q"))]
    except UnicodeDecodeError as err:
        raise ParamsError(f"{path}: a parameter's name is not text ({err})") from None
    if len(names) != len(arrays):
        raise ParamsError(f"{path} holds {len(arrays)} arrays but {len(names)} names: a model's parameters "
                          "are named")
    return dict(zip(names, arrays))
