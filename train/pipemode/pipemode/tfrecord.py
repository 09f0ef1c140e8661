"""TFRecord framing: writing records, and splitting a byte stream back into them.

A record on the wire (tensorflow/core/lib/io/record_writer.cc):
    uint64 length | uint32 mask(crc32c(length bytes)) | data[length] | uint32 mask(crc32c(data))
all little-endian. TFRecord files concatenate into a valid TFRecord stream, which is why a Pipe
channel with RecordWrapperType None delivers one continuous stream per pass.
"""

from __future__ import annotations

import functools
import logging
import os
import struct
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from pipemode import options
from pipemode.corruption import CorruptionPolicy
from pipemode.crc import crc32c, crc32c_extend, mask, mask_array, masked_crc32c
from pipemode.errors import CorruptRecordError, PipeDataError, TruncatedRecordError, UnusableRecordError

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
# 1 MiB reads. Larger ones are slower, not faster: once TensorFlow has created a generator
# dataset it sets glibc's M_TRIM_THRESHOLD (its "memory patch"), which freezes the mmap threshold,
# and every 4 MiB bytes object is then a fresh mmap, page-faulted in anew (docs/speed.md, Figures
# behind the code's choices: Chunk size).
CHUNK_BYTES = 1 << 20

# The header CRC depends only on the length, so the hot loop compares against a cache of
# length -> masked crc instead of computing a CRC per record. Bounded: records of all-distinct
# lengths (JPEGs) would otherwise grow it forever.
_HEADER_CACHE_LIMIT = 1 << 16

_NEED_MORE, _BAD_LENGTH_CRC, _BAD_LENGTH = "need more", "bad length crc", "bad length"
_PAST_THE_END = "past the end"
_LONG_RECORD = "long record"  # (a status: more than a piece past the chunk, see _long_record)

Read = Callable[[int], bytes]
RecordCheck = Callable[[bytes], "str | None"]  # why a record is unusable, or None


# A record that straddles a chunk's end by more than this is completed with reads of this size,
# kept as they come (_long_record): memory follows the bytes really there, so a damaged but
# CRC-valid length of 2 GiB costs what arrives (and one chunk), not 2 GiB, nor that data twice.
_PIECE_BYTES = CHUNK_BYTES


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
    of the chunk to the Python code below. Either way, and whatever the chunk size, a stream gives
    the same records in the same order, then the same error: the records before a bad one are
    yielded before its error is raised (tests/reader/test_tfrecord_properties.py).

    Record numbers in errors count every record of the pass from 0, corrupt ones included.
    `record_check(record)` may reject well-framed records by returning why (None: accepted);
    those are errors, or skipped, under the same policy as corrupt ones, with their position.
    After a damaged header the decoder resynchronises on the next valid one, in time linear in
    the bytes skipped (find_header).
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
        self.check_crc = bool(check_crc)
        self.max_record_bytes = options.max_record_bytes(max_record_bytes)
        self.chunk_bytes = options.chunk_bytes(chunk_bytes)
        self.record_check = record_check
        self.seen = 0  # records framed so far, corrupt ones included
        self._header_crcs: dict[int, int] = {}
        self._compiled = compiled_framing() if self.check_crc and record_check is None else None
        self._size: int | None = None

    def decode(self, read: Read, where: str, size: int | None = None) -> Iterator[list[bytes]]:
        """Yields the records of one stream, a list per chunk. `read(n)` returns n bytes, fewer
        only at the end of the stream; `where` names the stream in error messages; `size` is the
        stream's length when it is known (a file, a RecordIO record): a length that reaches past
        it is then corrupt at once, rather than read to the end."""
        self._size = size
        buf, base, pos = read(self.chunk_bytes), 0, 0
        while buf:
            status = None
            if self._compiled is not None:
                records, pos, clean = self._compiled.scan(buf, pos, min(self.max_record_bytes, 2**64 - 1), crc32c)
                if records:
                    self.seen += len(records)
                    yield records
                if clean:
                    status = _NEED_MORE
                # else a record at pos does not check out: the code below reports or skips it
            if status is None:
                records, ends, pos, status = self._scan(buf, pos)
                kept, error = self._accepted(records, ends, buf, base, where)
                self.seen += len(records)
                if kept:
                    yield kept
                if error is not None:
                    raise error
            if status is _NEED_MORE:
                buf, base, pos, status = self._refill(read, buf, base, pos, where)
            if status is _LONG_RECORD:
                record, base, ended = self._long_record(read, buf, base, where)
                if record is not None:
                    yield [record]
                buf, pos, status = (b"" if ended else read(self.chunk_bytes)), 0, None
            if status is not _NEED_MORE and status is not None:
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

    def _accepted(self, records, ends, buf, base, where) -> tuple[list[bytes], PipeDataError | None]:
        """The records of one scan that pass their data CRC and record_check, in stream order, up
        to the first that is not skipped; and that one's error, to raise once the others are out."""
        bad: set[int] = set()
        if self.check_crc and 0 < len(records) <= _FEW_RECORDS:
            bad = {i for i, (record, end) in enumerate(zip(records, ends))
                   if masked_crc32c(record) != _U32.unpack_from(buf, end)[0]}
        elif self.check_crc and records:
            # the CRCs computed by map() in C, not in the scan's loop (less per record: docs/speed.md,
            # Figures behind the code's choices: CRCs in map()), compared in one vectorised pass
            crcs = np.fromiter(map(crc32c, records), np.uint32, len(records))
            ends_arr = np.asarray(ends, dtype=np.int64)
            stored = np.frombuffer(buf, np.uint8)[ends_arr[:, None] + np.arange(4)].view("<u4").ravel()
            bad = set(np.flatnonzero(mask_array(crcs) != stored).tolist())
        if not bad and not self.record_check:
            return records, None
        kept = []
        for i, record in enumerate(records):
            if i in bad:
                error = self._reject(CorruptRecordError, records, ends, i, base, where,
                                     f"data CRC mismatch in a record of {len(record)} bytes")
            elif self.record_check and (problem := self.record_check(record)):
                error = self._reject(UnusableRecordError, records, ends, i, base, where, problem)
            else:
                kept.append(record)
                continue
            if error is not None:
                return kept, error
        return kept, None

    def _reject(self, error_type, records, ends, i, base, where, detail) -> PipeDataError | None:
        """Skips the record (None), or returns its error when the policy allows no more skips."""
        start = base + ends[i] - len(records[i]) - HEADER_BYTES
        try:
            self.policy.skip_or_raise(error_type(where, self.seen + i, start, detail))
        except PipeDataError as error:
            return error
        return None

    def _refill(self, read: Read, buf: bytes, base: int, pos: int, where: str):
        """The next bytes to scan: a fresh chunk, or exactly the record straddling the chunk end;
        or, at its header, the reason that record cannot be (a bad header, a length past the end),
        or _LONG_RECORD: it reaches more than a piece further (then _long_record reads it)."""
        tail = buf[pos:]
        base += pos
        if not tail:
            return read(self.chunk_bytes), base, 0, None
        if len(tail) < HEADER_BYTES:
            tail += read(HEADER_BYTES - len(tail))
            if len(tail) < HEADER_BYTES:
                return (*self._truncated(where, base, len(tail), None), None)
        length, length_crc = _HEADER.unpack_from(tail)
        status = None
        if self._header_crcs.get(length) != length_crc:
            status = self._check_header(tail, 0, length, length_crc)
        if status is None and self._size is not None and base + OVERHEAD_BYTES + length > self._size:
            status = _PAST_THE_END
        if status is not None:
            return tail, base, 0, status  # reported, or skipped, with its position
        total = OVERHEAD_BYTES + length
        if total - len(tail) > _PIECE_BYTES:
            return tail, base, 0, _LONG_RECORD
        record = tail + read(total - len(tail))
        if len(record) < total:
            return (*self._truncated(where, base, len(record), length), None)
        return record, base, 0, None

    def _long_record(self, read: Read, tail: bytes, base: int, where: str) -> tuple[bytes | None, int, bool]:
        """The record that starts with `tail` (its header checked) and ends more than a piece
        further: (its data, or None when it is skipped or the stream ends in it; the offset of
        what follows; whether the stream ended).

        Read a piece at a time, the pieces kept as they came: never a buffer grown by
        reallocation, which an allocator may grow by copying it elsewhere (the old block and the
        new one at once). Its data CRC is computed over the pieces where they lie, so a record that
        does not check out (a forged length, CRC-valid, that the stream went on to fill) is
        reported or skipped before anything is joined: like one cut short by the stream's end, it
        costs the bytes that came, once. A whole one is joined once, its data only, and yielded
        as it is, not scanned again."""
        length = _LENGTH.unpack_from(tail)[0]
        total = OVERHEAD_BYTES + length
        pieces, got = [tail], len(tail)
        while got < total:
            piece = read(min(total - got, _PIECE_BYTES))
            if not piece:
                del pieces  # (before the policy logs or raises)
                return None, self._truncated(where, base, got, length)[1], True
            pieces.append(piece)
            got += len(piece)
        parts, footer = _record_data(pieces, total)
        del pieces
        number = self.seen
        self.seen += 1
        if self.check_crc and mask(functools.reduce(crc32c_extend, parts, 0)) != _U32.unpack(footer)[0]:
            error = CorruptRecordError(where, number, base, f"data CRC mismatch in a record of {length} bytes")
        else:
            record = b"".join(parts)
            parts = None  # (freed before record_check runs)
            problem = self.record_check(record) if self.record_check else None
            if not problem:
                return record, base + total, False
            error = UnusableRecordError(where, number, base, problem)
        parts = record = None  # (an error raised below would otherwise keep them alive in its traceback)
        self.policy.skip_or_raise(error)
        return None, base + total, False

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
        if status is _BAD_LENGTH_CRC:
            detail = "length CRC mismatch (the length field or its CRC is damaged)"
        elif status is _BAD_LENGTH:
            detail = f"impossible record length {length} (max_record_bytes={self.max_record_bytes})"
        else:
            detail = (f"record length {length} reaches past the end of the stream "
                      f"({self._size - base - pos} bytes are left from its header on)")
        self.policy.skip_or_raise(CorruptRecordError(where, self.seen, base + pos, detail))
        self.seen += 1
        return self._resync(read, buf, base, pos + 1, where)

    def _resync(self, read: Read, buf: bytes, base: int, start: int, where: str):
        """After a damaged header, finds the next offset where a valid header starts, searching
        buf from `start` on (no copy of the rest of the chunk), then what follows.

        A header is accepted when its length CRC matches (always checked here, even with
        check_crc=False) and its length is possible: a false match has odds of about 2**-32 per
        offset (one whose record then reaches past a known end is one more corrupt record). Every
        byte is looked at a bounded number of times (find_header's growing blocks), so a stream of
        damaged headers a few bytes apart costs time in proportion to its length, not its square.
        """
        skipped_from = base + start - 1
        while True:
            offset = find_header(buf, self.max_record_bytes, start)
            if offset >= 0:
                if self.policy.logs_each:
                    log.warning("%s: skipped %d bytes after a damaged header; records resume at byte offset %d",
                                where, base + offset - skipped_from, base + offset)
                return buf, base, offset
            kept = max(start, len(buf) - (HEADER_BYTES - 1))  # a header may start in the last 11 bytes
            more = read(self.chunk_bytes)
            if not more:
                log.warning("%s: no valid record header in the last %d bytes of the stream; skipped them",
                            where, base + len(buf) - skipped_from)
                return b"", base + len(buf), 0
            buf, base, start = buf[kept:] + more, base + kept, 0


def _record_data(pieces: list[bytes], total: int) -> tuple[list[bytes], bytes]:
    """The data of the record held in `pieces` (`total` bytes: header, data, footer) as parts:
    the pieces that lie wholly inside it as they are, slices of the others; and its footer."""
    data_end = total - FOOTER_BYTES
    parts, footer, end = [], b"", 0
    for piece in pieces:
        start, end = end, end + len(piece)
        first, last = max(start, HEADER_BYTES), min(end, data_end)
        if first < last:
            parts.append(piece if last - first == len(piece) else piece[first - start : last - start])
        if end > data_end:
            footer += piece[max(data_end - start, 0) :]
    return parts, footer


# Candidates are checked in blocks that grow from 256 offsets to 64 Ki: bounded memory (~30 bytes
# per offset in flight), and a search that ends near its start costs little.
_PROBED_ONE_BY_ONE = 64
_FIRST_BLOCK, _LAST_BLOCK = 1 << 8, 1 << 16
_FEW_RECORDS = 8  # fewer records' CRCs are compared one by one: numpy's fixed cost would dominate


@functools.cache
def _length_crc_tables() -> tuple[int, list[np.ndarray]]:
    """CRC-32C is linear: the CRC of an 8-byte length field is the CRC of eight zero bytes, XOR a
    contribution of each of its four 16-bit pieces, which depends only on the piece and where it
    sits. (crc32c of eight zeros, [the four pieces' 65,536-entry tables]), made from 2,048 CRCs
    the first time a stream needs resynchronising."""
    zero = crc32c(bytes(8))
    single = np.empty((8, 256), np.uint32)
    for where in range(8):
        for value in range(256):
            single[where, value] = crc32c(bytes(where) + bytes([value]) + bytes(7 - where)) ^ zero
    pieces = np.arange(1 << 16, dtype=np.uint32)
    low, high = pieces & np.uint32(0xFF), pieces >> np.uint32(8)
    return zero, [single[2 * p][low] ^ single[2 * p + 1][high] for p in range(4)]


def _headers_at(window: bytes, first: int, count: int, max_record_bytes: int) -> np.ndarray:
    """Which of the offsets first, first + 4, ... (`count` of them) hold a valid header: a
    possible length, then its masked CRC; as indices into that list. The window is read through
    views of it as 16- and 32-bit numbers at first's alignment: nothing is copied but what the
    table lookups make."""
    zero, tables = _length_crc_tables()
    words = np.frombuffer(window, "<u4", count=(len(window) - first % 4) // 4, offset=first % 4)
    halves = np.frombuffer(window, "<u2", count=(len(window) - first % 2) // 2, offset=first % 2)
    w, h = first // 4, first // 2
    low, high, stored = words[w : w + count], words[w + 1 : w + 1 + count], words[w + 2 : w + 2 + count]
    limit = min(max_record_bytes, 2**64 - 1)
    top, bottom = np.uint32(limit >> 32), np.uint32(limit & 0xFFFFFFFF)
    possible = (high < top) | ((high == top) & (low <= bottom))
    pieces = [halves[h + p : h + p + 2 * count : 2] for p in range(4)]
    few = np.count_nonzero(possible) * 8 < count  # (random bytes, a sane limit: almost none)
    if few:
        candidates = np.flatnonzero(possible)
        pieces, stored = [piece[candidates] for piece in pieces], stored[candidates]
    crc = tables[0][pieces[0]] ^ tables[1][pieces[1]] ^ tables[2][pieces[2]] ^ tables[3][pieces[3]]
    valid = mask_array(crc ^ np.uint32(zero)) == stored
    return candidates[valid] if few else np.flatnonzero(valid & possible)


def find_header(window: bytes, max_record_bytes: int = MAX_RECORD_BYTES, start: int = 0) -> int:
    """The first offset from `start` on where a whole, valid TFRecord header starts in `window` (a
    length of at most max_record_bytes followed by its masked CRC), or -1.

    With the reader's compiled part, in C; without it, the first offsets are tried one by one in
    Python, then the rest vectorised with numpy, in
    blocks that double from a few hundred offsets: a match near `start` costs about as much as
    the bytes before it, so resynchronising every few bytes through a long damaged stretch stays
    linear. The CRCs of a block's length fields are computed at once from tables (_headers_at),
    whatever the lengths: random bytes, runs of zeros, arrays of small integers, any
    max_record_bytes (bench.resync has the speeds).
    """
    compiled = compiled_framing()
    if compiled is not None:  # (the same search in C: docs/speed.md, Getting past damaged data)
        return compiled.find_header(window, start, min(max_record_bytes, 2**64 - 1))
    count = len(window) - HEADER_BYTES + 1  # offsets where a whole header fits
    # numpy's fixed cost per block would be most of the work when damaged headers come every few
    # bytes (docs/speed.md, Figures behind the code's choices: Resynchronising)
    for offset in range(start, min(count, start + _PROBED_ONE_BY_ONE)):
        length, length_crc = _HEADER.unpack_from(window, offset)
        if length <= max_record_bytes and masked_crc32c(window[offset : offset + 8]) == length_crc:
            return offset
    start += _PROBED_ONE_BY_ONE
    block = _FIRST_BLOCK
    while start < count:
        stop = min(count, start + block)
        found = [first + 4 * int(hits[0]) for first in range(start, min(start + 4, stop))
                 if (hits := _headers_at(window, first, (stop - first + 3) // 4, max_record_bytes)).size]
        if found:
            return min(found)
        start, block = stop, min(block * 2, _LAST_BLOCK)
    return -1
