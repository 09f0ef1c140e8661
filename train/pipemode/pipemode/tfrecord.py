"""TFRecord framing: writing records, and splitting a byte stream back into them.

A record on the wire (tensorflow/core/lib/io/record_writer.cc):
    uint64 length | uint32 mask(crc32c(length bytes)) | data[length] | uint32 mask(crc32c(data))
all little-endian. TFRecord files concatenate into a valid TFRecord stream, which is why a Pipe
channel with RecordWrapperType None delivers one continuous stream per pass.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from pipemode.corruption import CorruptionPolicy
from pipemode.crc import crc32c, mask_array, masked_crc32c
from pipemode.errors import CorruptRecordError, TruncatedRecordError, UnusableRecordError

try:  # built from _framing.c where a C compiler was at hand at install time (setup.py)
    from pipemode import _framing
except ImportError:  # pragma: no cover - depends on the install
    _framing = None

log = logging.getLogger(__name__)

PURE_PYTHON_ENV = "PIPEMODE_PURE_PYTHON"


def compiled_framing():
    """pipemode._framing, the compiled fast path of TFRecordDecoder, or None: not built in this
    install, or turned off with PIPEMODE_PURE_PYTHON=1."""
    return None if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0") else _framing

_HEADER = struct.Struct("<QI")  # length, masked crc of the length
_LENGTH = struct.Struct("<Q")
_U32 = struct.Struct("<I")
HEADER_BYTES = 12
FOOTER_BYTES = 4
OVERHEAD_BYTES = HEADER_BYTES + FOOTER_BYTES

# A serialized protobuf (tf.train.Example) cannot exceed 2 GiB, so a longer length field means
# corruption, not a big record. Without this bound a damaged length would make us wait for, and
# buffer, up to 2**64 bytes.
MAX_RECORD_BYTES = 2**31 - 1
# 1 MiB reads. Larger ones are slower here, not faster: once TensorFlow has created a generator
# dataset it sets glibc's M_TRIM_THRESHOLD (its "memory patch"), which freezes the mmap threshold,
# and every 4 MiB bytes object became a fresh mmap: 44 page faults per 100 KB record, 590 MB/s
# instead of 2.4 GB/s from a FIFO (best of 3, bench machine).
CHUNK_BYTES = 1 << 20

# The header CRC depends only on the length, so the hot loop compares against a cache of
# length -> masked crc instead of computing a CRC per record. Bounded: records of all-distinct
# lengths (JPEGs) would otherwise grow it forever.
_HEADER_CACHE_LIMIT = 1 << 16

_NEED_MORE, _BAD_LENGTH_CRC, _BAD_LENGTH = "need more", "bad length crc", "bad length"

Read = Callable[[int], bytes]
RecordCheck = Callable[[bytes], "str | None"]  # why a record is unusable, or None


# A read of n bytes allocates n bytes up front (CPython's buffered and FIFO reads do), so a
# damaged but CRC-valid length of 2 GiB would reserve 2 GiB before finding the stream short.
# Longer records are read in pieces of this size: memory follows the bytes really there.
_WHOLE_READ_BYTES = 64 << 20


def _read_in_pieces(read: Read, count: int) -> bytes:
    pieces = []
    while count > 0:
        piece = read(min(count, _WHOLE_READ_BYTES))
        if not piece:
            break
        pieces.append(piece)
        count -= len(piece)
    return b"".join(pieces)


def header_length(header: bytes) -> int | None:
    """The data length a record's HEADER_BYTES-byte header gives, or None if its CRC does not match."""
    length, length_crc = _HEADER.unpack_from(header)
    return length if masked_crc32c(header[:8]) == length_crc else None


def encode_record(data: bytes) -> bytes:
    length = _LENGTH.pack(len(data))
    return b"".join(
        (length, _U32.pack(masked_crc32c(length)), data, _U32.pack(masked_crc32c(data)))
    )


def encode(records: Iterable[bytes]) -> bytes:
    """The TFRecord file/stream holding `records`, byte for byte what tf.io.TFRecordWriter writes."""
    return b"".join(map(encode_record, records))


class TFRecordDecoder:
    """Splits TFRecord streams into records, checking both CRCs of every record.

    Works a chunk at a time: read `chunk_bytes`, cut out every complete record with a tight
    Python loop, verify the chunk's data CRCs in one numpy pass, then read exactly the rest of
    the record that straddles the chunk's end (so no chunk is ever copied to join it with the
    next). Memory is bounded by the chunk size and the largest record, not by the stream.

    With pipemode._framing built (and CRC checks on, no record_check), each chunk is framed and
    checked in C first; it stops at the first record that does not check out and leaves the rest
    of the chunk to the Python code below, so errors, offsets and skipping are the same either way.

    Record numbers in errors count every record of the pass from 0, corrupt ones included.
    `record_check(record)` may reject well-framed records by returning why (None: accepted);
    those are errors, or skipped, under the same policy as corrupt ones, with their position.
    """

    def __init__(
        self,
        policy: CorruptionPolicy,
        *,
        check_crc: bool = True,
        max_record_bytes: int = MAX_RECORD_BYTES,
        chunk_bytes: int = CHUNK_BYTES,
        record_check: RecordCheck | None = None,
    ):
        self.policy = policy
        self.check_crc = check_crc
        self.max_record_bytes = max_record_bytes
        self.chunk_bytes = chunk_bytes
        self.record_check = record_check
        self.seen = 0  # records framed so far, corrupt ones included
        self._header_crcs: dict[int, int] = {}
        self._compiled = compiled_framing() if check_crc and record_check is None else None

    def decode(self, read: Read, where: str) -> Iterator[list[bytes]]:
        """Yields the records of one stream, a list per chunk. `read(n)` returns n bytes, fewer
        only at the end of the stream; `where` names the stream in error messages."""
        buf, base, pos = read(self.chunk_bytes), 0, 0
        compiled = self._compiled
        limit = min(self.max_record_bytes, 2**64 - 1)  # a length field holds no more
        while buf:
            if compiled is not None:
                records, pos, clean = compiled.scan(buf, pos, limit, crc32c)
                if records:
                    self.seen += len(records)
                    yield records
                if clean:
                    buf, base, pos = self._refill(read, buf, base, pos, where)
                    continue
                # a record at pos does not check out: the code below reports or skips it
            records, ends, pos, status = self._scan(buf, pos)
            scanned = len(records)
            if self.check_crc and records:
                records = self._verify(records, ends, buf, base, where)
            elif self.record_check and records:
                records = self._checked(records, (), ends, base, where)
            self.seen += scanned
            if records:
                yield records
            if status is _NEED_MORE:
                buf, base, pos = self._refill(read, buf, base, pos, where)
            else:
                buf, base, pos = self._skip_bad_header(read, buf, base, pos, status, where)

    def _scan(self, buf: bytes, pos: int):
        """Cuts complete records out of buf[pos:]; the hot loop, kept free of attribute lookups."""
        records: list[bytes] = []
        ends: list[int] = []  # where each record's data ends: its CRC's offset, and its place in errors
        keep, keep_end = records.append, ends.append
        unpack, cached_crc = _HEADER.unpack_from, self._header_crcs.get
        size = len(buf)
        last_header = size - HEADER_BYTES
        while pos <= last_header:
            length, length_crc = unpack(buf, pos)
            if cached_crc(length) != length_crc:
                status = self._check_header(buf, pos, length, length_crc)
                if status is not None:
                    return records, ends, pos, status
            start = pos + HEADER_BYTES
            end = start + length
            pos = end + FOOTER_BYTES
            if pos > size:
                pos = start - HEADER_BYTES
                break
            keep(buf[start:end])
            keep_end(end)
        return records, ends, pos, _NEED_MORE

    def _check_header(self, buf: bytes, pos: int, length: int, length_crc: int):
        if self.check_crc and masked_crc32c(buf[pos : pos + 8]) != length_crc:
            return _BAD_LENGTH_CRC
        if length > self.max_record_bytes:
            return _BAD_LENGTH
        if len(self._header_crcs) >= _HEADER_CACHE_LIMIT:
            self._header_crcs.clear()
        self._header_crcs[length] = length_crc
        return None

    def _verify(self, records, ends, buf, base, where) -> list[bytes]:
        """Checks the data CRCs of one scan in a single vectorised comparison (then the records
        against record_check, if any). The CRCs are computed by map() in C, not in the scan's
        loop: 1 KB records, ~0.1 us less each."""
        crcs = np.fromiter(map(crc32c, records), np.uint32, len(records))
        ends_arr = np.asarray(ends, dtype=np.int64)
        stored = np.frombuffer(buf, np.uint8)[ends_arr[:, None] + np.arange(4)].view("<u4").ravel()
        bad = np.flatnonzero(mask_array(crcs) != stored).tolist()
        if self.record_check:
            return self._checked(records, bad, ends, base, where)
        for i in bad:
            self._reject(CorruptRecordError, records, ends, i, base, where,
                         f"data CRC mismatch in a record of {len(records[i])} bytes")
        if bad:
            drop = set(bad)
            records = [r for i, r in enumerate(records) if i not in drop]
        return records

    def _checked(self, records, bad_crc, ends, base, where) -> list[bytes]:
        """The records that pass record_check, in stream order with those of a bad CRC."""
        bad_crc, kept = set(bad_crc), []
        for i, record in enumerate(records):
            if i in bad_crc:
                self._reject(CorruptRecordError, records, ends, i, base, where,
                             f"data CRC mismatch in a record of {len(record)} bytes")
            elif problem := self.record_check(record):
                self._reject(UnusableRecordError, records, ends, i, base, where, problem)
            else:
                kept.append(record)
        return kept

    def _reject(self, error_type, records, ends, i, base, where, detail) -> None:
        start = base + ends[i] - len(records[i]) - HEADER_BYTES
        self.policy.skip_or_raise(error_type(where, self.seen + i, start, detail))

    def _refill(self, read: Read, buf: bytes, base: int, pos: int, where: str):
        """The next bytes to scan: a fresh chunk, or exactly the record straddling the chunk end."""
        tail = buf[pos:]
        base += pos
        if not tail:
            return read(self.chunk_bytes), base, 0
        if len(tail) < HEADER_BYTES:
            tail += read(HEADER_BYTES - len(tail))
            if len(tail) < HEADER_BYTES:
                return self._truncated(where, base, len(tail), None)
        length, length_crc = _HEADER.unpack_from(tail)
        if self._header_crcs.get(length) != length_crc and self._check_header(
            tail, 0, length, length_crc
        ):
            return tail, base, 0  # the scan reports the bad header
        missing = OVERHEAD_BYTES + length - len(tail)
        rest = read(missing) if missing <= _WHOLE_READ_BYTES else _read_in_pieces(read, missing)
        if len(rest) < missing:
            return self._truncated(where, base, len(tail) + len(rest), length)
        return tail + rest, base, 0

    def _truncated(self, where: str, offset: int, got: int, length: int | None):
        expected = f"{OVERHEAD_BYTES + length}-byte record" if length is not None else "record header"
        self.policy.skip_or_raise(
            TruncatedRecordError(
                where, self.seen, offset, f"the stream ended {got} bytes into a {expected}"
            )
        )
        self.seen += 1
        return b"", offset + got, 0

    def _skip_bad_header(self, read: Read, buf: bytes, base: int, pos: int, status: str, where):
        length = _LENGTH.unpack_from(buf, pos)[0]
        detail = (
            "length CRC mismatch (the length field or its CRC is damaged)"
            if status is _BAD_LENGTH_CRC
            else f"impossible record length {length} (max_record_bytes={self.max_record_bytes})"
        )
        self.policy.skip_or_raise(CorruptRecordError(where, self.seen, base + pos, detail))
        self.seen += 1
        return self._resync(read, buf[pos + 1 :], base + pos + 1, where)

    def _resync(self, read: Read, window: bytes, base: int, where: str):
        """After a damaged header, finds the next offset where a valid header starts.

        A header is accepted when its length CRC matches (always checked here, even with
        check_crc=False) and its length is possible: a false match has odds of about 2**-32 per
        offset. Runs at hundreds of MB/s (find_header), so a large stray object in a channel
        costs seconds, not minutes, of every pass.
        """
        start = base
        while True:
            offset = find_header(window, self.max_record_bytes)
            if offset >= 0:
                log.warning(
                    "%s: skipped %d bytes after a damaged header; records resume at byte offset %d",
                    where,
                    base + offset - start + 1,
                    base + offset,
                )
                return window, base, offset
            keep = window[-(HEADER_BYTES - 1) :] if len(window) >= HEADER_BYTES else window
            more = read(self.chunk_bytes)
            if not more:
                log.warning(
                    "%s: no valid record header in the last %d bytes of the stream; skipped them",
                    where,
                    base + len(window) - start + 1,
                )
                return b"", base + len(window), 0
            base += len(window) - len(keep)
            window = keep + more


# Candidates are checked in blocks: bounded memory (12 bytes each) even when every offset is one
# (a run of zero bytes), and an early match ends the search.
_RESYNC_BLOCK = 1 << 16
_ZERO_LENGTH_CRC = _U32.pack(masked_crc32c(bytes(8)))


def find_header(window: bytes, max_record_bytes: int = MAX_RECORD_BYTES) -> int:
    """The first offset in `window` where a whole, valid TFRecord header starts (a length of at
    most max_record_bytes followed by its masked CRC), or -1.

    Vectorised with numpy: a length <= max_record_bytes has zeros in its high bytes, which rules
    out almost every offset of random bytes at once; the CRCs of the remaining candidates are
    computed once per distinct length (a run of zeros has one). A byte-by-byte search in Python
    ran at ~1-7 MB/s.
    """
    count = len(window) - HEADER_BYTES + 1
    if count <= 0:
        return -1
    data = np.frombuffer(window, np.uint8)
    # In place, into three arrays: once TensorFlow has patched glibc's malloc (see CHUNK_BYTES),
    # every fresh 1 MB temporary is an mmap that page-faults, which cost 4/5 of the speed.
    plausible, scratch = np.ones(count, bool), np.empty(count, bool)
    high = min(8, (max_record_bytes.bit_length() + 7) // 8)  # length bytes that must be zero
    for k in range(high, 8):
        plausible &= np.equal(data[k : k + count], 0, out=scratch)
    if not plausible.any():  # (random bytes: almost always)
        return -1
    # A run of zero bytes makes every offset a candidate of length 0: those can only match where
    # the masked CRC of a zero length follows, which is checked for all of them at once.
    zero_length = plausible.copy()
    for k in range(high):
        zero_length &= np.equal(data[k : k + count], 0, out=scratch)
    crc_follows = np.ones(count, bool)
    for k, byte in enumerate(_ZERO_LENGTH_CRC):
        crc_follows &= np.equal(data[8 + k : 8 + k + count], byte, out=scratch)
    zero_length &= np.logical_not(crc_follows, out=scratch)  # zero lengths that cannot match
    plausible &= np.logical_not(zero_length, out=scratch)
    candidates = np.flatnonzero(plausible)
    headers = np.lib.stride_tricks.sliding_window_view(data, HEADER_BYTES)
    for first in range(0, len(candidates), _RESYNC_BLOCK):
        block = candidates[first : first + _RESYNC_BLOCK]
        rows = headers[block]  # a (len(block), 12) copy
        lengths = np.ascontiguousarray(rows[:, :8]).view("<u8").ravel()
        stored = np.ascontiguousarray(rows[:, 8:]).view("<u4").ravel()
        distinct, which = np.unique(lengths, return_inverse=True)
        expected = np.array([masked_crc32c(_LENGTH.pack(int(n))) for n in distinct], np.uint32)
        found = np.flatnonzero((expected[which.ravel()] == stored) & (lengths <= max_record_bytes))
        if found.size:
            return int(block[found[0]])
    return -1
