"""RecordIO framing, as dmlc-core defines it and SageMaker uses for RecordWrapperType RecordIO.

Each record is one or more parts:
    uint32 magic 0xced7230a | uint32 lrec | payload | zero padding to a multiple of 4 bytes
where lrec's low 29 bits are the part's length and its top 3 bits a continuation flag
(0 whole record, 1 first part, 2 middle part, 3 last part). dmlc's writer cuts a payload
wherever the magic word occurs at a 4-aligned offset, so an aligned magic word only ever
starts a header; its reader joins the parts with the magic word put back between them
(dmlc-core src/recordio.cc). AWS's PipeModeDataset joins them without it, corrupting such
payloads; this module follows dmlc.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from collections.abc import Callable, Iterable, Iterator

from pipemode.batches import in_batches
from pipemode.corruption import CorruptionPolicy
from pipemode.errors import CorruptRecordError, TruncatedRecordError, UnusableRecordError

log = logging.getLogger(__name__)

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
_HEADER = struct.Struct("<II")
HEADER_BYTES = 8
WHOLE, FIRST, MIDDLE, LAST = 0, 1, 2, 3
MAX_PART_BYTES = (1 << 29) - 1
_READ_BYTES = 1 << 20  # see tfrecord.CHUNK_BYTES for why not more

Read = Callable[[int], bytes]
Combine = Callable[[list[bytes]], bytes]


@dataclasses.dataclass(frozen=True)
class Line:
    """Where the records of one line lie in a pass: what groups() gives a combine function that
    asks for it (`combine.wants_line = True`: it is then called as combine(payloads, line)), to
    say where a line was when a later one needs naming it (a class named otherwise there, say)."""

    where: str  # the pass (channel, pass number, FIFO)
    number: int  # the line's number in the pass's stream, from 1
    first: int  # its first RecordIO record's number in the pass, from 0
    last: int
    offset: int  # its first record's byte offset

    def __str__(self) -> str:
        return f"manifest line {self.number} of {self.where} (RecordIO records #{self.first}-#{self.last})"

    @property
    def in_pass(self) -> str:
        """The line as an error about a record of this very pass names it (its pass said before)."""
        return f"manifest line {self.number} of this pass (RecordIO records #{self.first}-#{self.last})"


def _padding(length: int) -> int:
    return -length % 4


def part_header(flag: int, length: int) -> bytes:
    return _HEADER.pack(MAGIC, (flag << 29) | length)


def find_cuts(blocks: Iterable[bytes]) -> list[int]:
    """Offsets of the 4-aligned magic words in a payload given as consecutive blocks: where
    dmlc's writer cuts it into parts (dmlc-core RecordIOWriter::WriteRecord)."""
    cuts, base, carry = [], 0, b""
    for block in blocks:
        data = carry + block
        found = data.find(MAGIC_BYTES)
        while found != -1:
            offset = base - len(carry) + found
            if offset % 4 == 0:
                cuts.append(offset)
            found = data.find(MAGIC_BYTES, found + 1)
        carry = data[-3:]  # a magic word can straddle two blocks, never hide in 3 bytes
        base += len(block)
    return cuts


def wrap(size: int, cuts: list[int], copy: Callable[[int, int], Iterable[bytes]]) -> Iterator[bytes]:
    """The pieces of one RecordIO record holding a payload of `size` bytes with magic words at
    `cuts`; copy(start, end) yields payload[start:end] and is called with increasing ranges."""
    if size > MAX_PART_BYTES:
        raise ValueError(f"RecordIO records must be shorter than 2**29 bytes, got {size}")
    start = 0
    for cut in cuts:
        yield part_header(FIRST if start == 0 else MIDDLE, cut - start)
        yield from copy(start, cut)
        start = cut + 4
    yield part_header(LAST if cuts else WHOLE, size - start)
    yield from copy(start, size)
    yield bytes(_padding(size))


def encode_record(payload: bytes) -> bytes:
    """One RecordIO record, split and padded exactly as dmlc's writer does."""
    return b"".join(wrap(len(payload), find_cuts([payload]), lambda a, b: (payload[a:b],)))


def encode(payloads: Iterable[bytes]) -> bytes:
    return b"".join(map(encode_record, payloads))


class _Input:
    """The stream under the decoder: counts its offset, and takes bytes back after a resync."""

    def __init__(self, read: Read):
        self._read = read
        self._pushed = b""
        self.offset = 0

    def read(self, n: int) -> bytes:
        if self._pushed:
            data, self._pushed = self._pushed[:n], self._pushed[n:]
            if len(data) < n:
                data += self._read(n - len(data))
        else:
            data = self._read(n)
        self.offset += len(data)
        return data

    def unread(self, data: bytes) -> None:
        self._pushed = data + self._pushed
        self.offset -= len(data)


class RecordStream:
    """The payload of one RecordIO record, read in order across its parts."""

    def __init__(self, decoder, inp: _Input, where: str, number: int, flag: int, length: int):
        self.number, self.offset = number, inp.offset - HEADER_BYTES
        self.where = f"{where}, RecordIO record #{number}"  # for errors in what the payload holds
        self.broken = False
        self._outer_where, self._decoder, self._inp = where, decoder, inp
        self._left, self._pad, self._more = length, _padding(length), flag == FIRST
        self._pending = b""
        # the payload's length when its record is whole (one part); a multi-part one's total is
        # known only at its end
        self.size: int | None = None if self._more else length

    def read(self, n: int) -> bytes:
        """Up to n bytes of the payload; fewer only at its end."""
        pieces = []
        while n > 0:
            if self._pending:
                piece, self._pending = self._pending[:n], self._pending[n:]
            elif self._left:
                want = min(n, self._left)
                piece = self._inp.read(want)
                self._left -= len(piece)
                if len(piece) < want:
                    pieces.append(piece)
                    self._fail(TruncatedRecordError, "the stream ended inside a RecordIO part")
                    break
            elif not self._next_part():
                break
            else:
                continue
            pieces.append(piece)
            n -= len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def read_all(self) -> bytes:
        if not self._more and not self._pending:  # a whole record: one read, no joins
            data = self.read(self._left)
            self._next_part()
            return data
        return b"".join(iter(lambda: self.read(_READ_BYTES), b""))

    def drain(self) -> None:
        while self.read(_READ_BYTES):
            pass

    def _next_part(self) -> bool:
        """Steps over the finished part's padding and onto the next part, if any."""
        if self.broken:
            return False
        if self._pad:
            if len(self._inp.read(self._pad)) < self._pad:
                self._fail(TruncatedRecordError, "the stream ended inside a RecordIO padding")
                return False
            self._pad = 0
        if not self._more:
            return False
        offset = self._inp.offset
        header = self._inp.read(HEADER_BYTES)
        if len(header) < HEADER_BYTES:
            self._fail(TruncatedRecordError, "the stream ended before the next part's header")
            return False
        magic, lrec = _HEADER.unpack(header)
        flag, length = lrec >> 29, lrec & MAX_PART_BYTES
        if magic != MAGIC or flag not in (MIDDLE, LAST):
            self._inp.unread(header)
            self._fail(
                CorruptRecordError,
                f"expected the next part of a multi-part record at byte offset {offset}, "
                f"found magic {magic:#010x} flag {flag}",
            )
            return False
        self._pending = MAGIC_BYTES
        self._left, self._pad, self._more = length, _padding(length), flag == MIDDLE
        return True

    def _fail(self, error_type, detail: str) -> None:
        self.broken = True
        self._left = self._pad = 0
        self._more = False
        self._decoder.policy.skip_or_raise(
            error_type(self._outer_where, self.number, self.offset, detail)
        )


def _read_at_most(stream: RecordStream, max_bytes: int) -> bytes | None:
    """The payload; None (the rest drained, unread) when it is longer than max_bytes."""
    if stream.size is not None and stream.size > max_bytes:
        stream.drain()
        return None
    pieces, total = [], 0
    while piece := stream.read(_READ_BYTES):
        total += len(piece)
        if total > max_bytes:
            stream.drain()
            return None
        pieces.append(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class RecordIODecoder:
    """Splits a RecordIO stream into records.

    `records()` yields the payloads themselves (RecordIO as the record format); `streams()`
    yields each record as a RecordStream, so that a TFRecord file wrapped as one RecordIO
    record (an S3 object in a RecordWrapperType=RecordIO channel) is decoded as it streams,
    without holding the whole object in memory.
    """

    def __init__(self, policy: CorruptionPolicy):
        self.policy = policy
        self.seen = 0  # records framed so far, corrupt ones included

    def records(self, read: Read, where: str, record_check=None) -> Iterator[list[bytes]]:
        """The payloads, in lists; `record_check(payload)` may reject one by saying why (see
        TFRecordDecoder), under the same corruption policy."""
        return in_batches(self._payloads(read, where, record_check))

    def _payloads(self, read: Read, where: str, record_check) -> Iterator[bytes]:
        for stream in self.streams(read, where):
            payload = stream.read_all()
            if stream.broken:
                continue
            if record_check and (problem := record_check(payload)):
                self.policy.skip_or_raise(UnusableRecordError(where, stream.number, stream.offset, problem))
                continue
            yield payload

    def groups(self, read: Read, where: str, size: int, combine: Combine,
               record_check=None, max_bytes: int = MAX_PART_BYTES) -> Iterator[list[bytes]]:
        """Every `size` consecutive payloads made into one record by `combine`, in lists: what an
        augmented manifest's channel streams, one RecordIO record per listed attribute of each
        line, in the order listed. combine(payloads) returns the record, or raises ValueError
        saying why the line cannot be used (skipped or raised as an UnusableRecordError naming
        the line, under the same corruption policy as record_check's rejections); any other error
        ends the pass. A combine function with `wants_line` set is also told where the line is
        (a Line).

        With `size` > 1, a record that cannot be framed is an error even when corrupt records may be
        skipped: the records after it can no longer be matched to their lines (nothing in a payload
        says which attribute it holds). So is a pass that ends inside a line. With `size` 1 (a
        transform of each record, say MXNet's image records into Examples), it is skipped or raised
        as any corrupt record is. A payload longer than `max_bytes` is not read into memory: its
        line is unusable.

        Lines are counted in the pass's stream: with ShuffleConfig, not the manifest file's order.
        """
        cut: list[TruncatedRecordError] = []  # (a line the pass ended inside: raised once the lines before are out)
        yield from in_batches(self._lines(read, where, size, combine, record_check, max_bytes, cut))
        if cut:  # (whatever the skip limit: the lines before may be misaligned too)
            raise cut[0]

    def _lines(self, read: Read, where: str, size: int, combine: Combine, record_check, max_bytes: int,
               cut: list) -> Iterator[bytes]:
        line, first_offset = [], 0
        lines = 0
        expected = 0  # the next record's number: one skipped by streams() (a bad header) is a gap
        for stream in self.streams(read, where):
            if not line:
                first_offset = stream.offset
            payload = _read_at_most(stream, max_bytes)
            if size == 1 and stream.broken:
                continue  # (the policy counted it, or raised)
            if size > 1 and (stream.broken or stream.number != expected):
                lost = stream.number if stream.broken else expected
                raise CorruptRecordError(
                    where, lost, stream.offset,
                    f"RecordIO record #{lost} (attribute {len(line) + 1} of {size} of manifest line "
                    f"{lines + 1}) is damaged, and the records after it cannot be matched to their manifest "
                    "lines: the pass cannot go on")
            expected += 1
            line.append(payload)
            if len(line) < size:
                continue
            lines += 1
            payloads, line = line, []
            at = Line(where, lines, stream.number - size + 1, stream.number, first_offset)
            try:
                if any(p is None for p in payloads):
                    raise ValueError(f"a record is longer than {max_bytes} bytes, more than the job takes (an "
                                     "image of max_image_pixels)")
                record = combine(payloads, at) if getattr(combine, "wants_line", False) else combine(payloads)
                problem = record_check(record) if record_check else None
            except ValueError as err:
                problem = str(err)
            if problem:
                line_said = f"{at.in_pass}: " if size > 1 else ""
                self.policy.skip_or_raise(UnusableRecordError(where, at.first, first_offset, line_said + problem))
                continue
            yield record
        if line:
            cut.append(TruncatedRecordError(
                where, expected - len(line), first_offset,
                f"the pass ended after {len(line)} of the {size} records of manifest line {lines + 1} of this pass "
                "(one per attribute listed): the stream is cut short, or attribute_names lists more attributes than "
                "the channel's AttributeNames"))

    def streams(self, read: Read, where: str) -> Iterator[RecordStream]:
        inp = _Input(read)
        while True:
            offset = inp.offset
            header = inp.read(HEADER_BYTES)
            if not header:
                return
            if len(header) < HEADER_BYTES:
                self.policy.skip_or_raise(
                    TruncatedRecordError(
                        where, self.seen, offset, f"the stream ended {len(header)} bytes into a header"
                    )
                )
                return
            magic, lrec = _HEADER.unpack(header)
            flag, length = lrec >> 29, lrec & MAX_PART_BYTES
            if magic != MAGIC or flag not in (WHOLE, FIRST):
                problem = f"bad magic {magic:#010x}" if magic != MAGIC else f"flag {flag} cannot start a record"
                self.policy.skip_or_raise(
                    CorruptRecordError(
                        where, self.seen, offset, f"{problem} (expected magic {MAGIC:#010x}, flag 0 or 1)"
                    )
                )
                self.seen += 1
                self._resync(inp, where)
                continue
            stream = RecordStream(self, inp, where, self.seen, flag, length)
            self.seen += 1
            yield stream
            stream.drain()
            if stream.broken:
                self._resync(inp, where)

    def _resync(self, inp: _Input, where: str) -> None:
        """Moves to the next 4-aligned magic word that starts a record (dmlc's own recovery)."""
        start = inp.offset
        window = b""
        while True:
            base = inp.offset - len(window)
            found = window.find(MAGIC_BYTES)
            while found != -1 and len(window) - found >= HEADER_BYTES:
                flag = _HEADER.unpack_from(window, found)[1] >> 29
                if (base + found) % 4 == 0 and flag in (WHOLE, FIRST):
                    inp.unread(window[found:])
                    log.warning("%s: skipped %d bytes to the next RecordIO record", where, inp.offset - start)
                    return
                found = window.find(MAGIC_BYTES, found + 1)
            keep = window[-(HEADER_BYTES - 1):] if found == -1 else window[found:]
            more = inp.read(_READ_BYTES)
            if not more:
                log.warning("%s: no RecordIO record in the last %d bytes; skipped them", where, inp.offset - start)
                return
            window = keep + more
