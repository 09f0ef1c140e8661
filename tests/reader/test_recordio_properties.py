"""The RecordIO decoder against a reference written from the format (dmlc-core's recordio, as
SageMaker wraps records with RecordWrapperType RecordIO), on streams Hypothesis makes: payloads
(some holding 4-aligned magic words, which the writer cuts into multi-part records), then mutated
(bits flipped, the stream cut anywhere, junk between records, forged part headers of any flag and
length), read a chunk of any size at a time. The decoder must give the reference's payloads, in
its order, then its error (kind, record number, byte offset), or none; for records() and for
groups() (an augmented manifest's lines, one record per attribute).

The RecordIO framing has no compiled part: these run in pure Python only. (A TFRecord file
wrapped in a RecordIO record is decoded by the TFRecord decoder, both ways:
test_tfrecord_properties.py and test_wrapped_tfrecords_... below.)
"""

from __future__ import annotations

import contextlib
import os
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipemode import recordio, tfrecord
from pipemode.corruption import CorruptionPolicy
from pipemode.errors import CorruptRecordError, TruncatedRecordError, UnusableRecordError
from tests.conftest import stream_reader

WHERE = "test stream"
MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
WHOLE, FIRST, MIDDLE, LAST = 0, 1, 2, 3


# --- the reference: the format (dmlc-core src/recordio.cc), read one byte at a time -----------------

def header_at(data: bytes, at: int) -> tuple[int, int, int] | None:
    """(magic, flag, length) of the 8-byte part header at `at`, or None when fewer bytes are left."""
    if len(data) - at < 8:
        return None
    magic, lrec = struct.unpack_from("<II", data, at)
    return magic, lrec >> 29, lrec & ((1 << 29) - 1)


def resync(data: bytes, start: int) -> int:
    """The first 4-aligned offset from `start` on where a whole header with the magic word and the
    flag of a record's start (0 or 1) lies; else the stream's end (dmlc's own recovery)."""
    for at in range(start, len(data) - 7):
        if at % 4 == 0 and data[at : at + 4] == MAGIC_BYTES and header_at(data, at)[1] in (WHOLE, FIRST):
            return at
    return len(data)


def framed(data: bytes):
    """What the stream holds, in order: ("bad", number, offset, kind) for a header that cannot start
    a record (the bytes after it skipped to the next that can); ("record", number, offset, payload,
    kind), kind None for a whole one (its parts joined with the magic word put back between them),
    else the error that breaks it (the stream ends inside it, or a part that should follow does not)."""
    number, pos = 0, 0
    while pos < len(data):
        start, header = pos, header_at(data, pos)
        if header is None:
            yield "bad", number, start, TruncatedRecordError
            return
        magic, flag, length = header
        if magic != MAGIC or flag not in (WHOLE, FIRST):
            yield "bad", number, start, CorruptRecordError
            number, pos = number + 1, resync(data, start + 8)
            continue
        pos, payload, more, broken = start + 8, b"", flag == FIRST, None
        while True:
            if len(data) - pos < length + (-length % 4):  # the part, or its padding, is cut short
                pos, broken = len(data), TruncatedRecordError
                break
            payload += data[pos : pos + length]
            pos += length + (-length % 4)
            if not more:
                break
            header = header_at(data, pos)
            if header is None:
                pos, broken = len(data), TruncatedRecordError
                break
            magic, flag, length = header
            if magic != MAGIC or flag not in (MIDDLE, LAST):
                broken = CorruptRecordError  # (that header is searched again: it may start a record)
                break
            payload, pos, more = payload + MAGIC_BYTES, pos + 8, flag == MIDDLE
        yield "record", number, start, payload, broken
        number += 1
        if broken:
            pos = resync(data, pos)


class Policy:
    """CorruptionPolicy's rule: up to max_skips errors skipped, the next one raised."""

    class Raised(Exception):
        pass

    def __init__(self, max_skips: int):
        self.max_skips, self.skipped = max_skips, 0

    def fail(self, kind, number: int, offset: int) -> None:
        if self.skipped >= self.max_skips:
            raise self.Raised((kind, number, offset))
        self.skipped += 1


def reference_records(data: bytes, max_skips: int, check=None):
    """(payloads, (error kind, record number, offset) or None): RecordIODecoder.records."""
    policy, records = Policy(max_skips), []
    try:
        for what, number, offset, *rest in framed(data):
            if what == "bad":
                policy.fail(rest[0], number, offset)
                continue
            payload, broken = rest
            if broken:
                policy.fail(broken, number, offset)
            elif check is not None and check(payload):
                policy.fail(UnusableRecordError, number, offset)
            else:
                records.append(payload)
    except Policy.Raised as raised:
        return records, raised.args[0]
    return records, None


def reference_lines(data: bytes, size: int, max_skips: int, max_bytes: int, combine, check=None):
    """(records, error or None): RecordIODecoder.groups, every `size` payloads one manifest line.

    With size > 1, a record that cannot be framed (or is missing from the numbering) ends the pass
    with a CorruptRecordError, whatever the skip limit, once the policy has had its say; a line
    whose payload is longer than max_bytes, or that `combine` or `check` refuses, is an unusable
    record under the policy (numbered by its first record); a pass that ends inside a line is a
    TruncatedRecordError at that line's first record, raised after the lines before it."""
    policy, records, line, expected, first_offset = Policy(max_skips), [], [], 0, 0
    try:
        for what, number, offset, *rest in framed(data):
            if what == "bad":
                policy.fail(rest[0], number, offset)
                continue
            payload, broken = rest
            if not line:
                first_offset = offset
            if broken:
                policy.fail(broken, number, offset)
                if size == 1:
                    continue
            if size > 1 and (broken or number != expected):
                return records, (CorruptRecordError, number if broken else expected, offset)
            expected += 1
            line.append(None if len(payload) > max_bytes else payload)
            if len(line) < size:
                continue
            payloads, line = line, []
            try:
                if None in payloads:
                    raise ValueError("too long")
                record = combine(payloads)
                refused = check is not None and check(record)
            except ValueError:
                refused = True
            if refused:
                policy.fail(UnusableRecordError, number - size + 1, first_offset)
            else:
                records.append(record)
    except Policy.Raised as raised:
        return records, raised.args[0]
    if line:
        return records, (TruncatedRecordError, expected - len(line), first_offset)
    return records, None


# --- the decoder under test ---------------------------------------------------------------------

@contextlib.contextmanager
def read_bytes(n: int):
    """The decoder's read size (1 MiB) set to n: resynchronising and long payloads cross reads."""
    kept = recordio._READ_BYTES
    recordio._READ_BYTES = n
    try:
        yield
    finally:
        recordio._READ_BYTES = kept


def outcome(batches):
    """(records until the error, (kind, record, offset) or None)."""
    records = []
    try:
        for batch in batches:
            records += batch
    except CorruptRecordError as err:  # (truncated and unusable ones are kinds of it)
        return records, (type(err), err.record, err.offset)
    return records, None


def decoded_records(data: bytes, read_size: int, max_skips: int, check=None):
    with read_bytes(read_size):
        decoder = recordio.RecordIODecoder(CorruptionPolicy(max_skips))
        return outcome(decoder.records(stream_reader(data), WHERE, check))


def decoded_lines(data: bytes, read_size: int, size: int, max_skips: int, max_bytes: int, combine, check=None):
    with read_bytes(read_size):
        decoder = recordio.RecordIODecoder(CorruptionPolicy(max_skips))
        return outcome(decoder.groups(stream_reader(data), WHERE, size, combine, check, max_bytes))


# --- what Hypothesis makes ------------------------------------------------------------------------

# payloads of a few bytes, some with magic words at any offset: 4-aligned ones make multi-part records
payloads = st.lists(st.one_of(st.binary(max_size=13), st.just(MAGIC_BYTES)), max_size=5).map(b"".join)


def part_header(flag: int, length: int, magic: int = MAGIC) -> bytes:
    return struct.pack("<II", magic, (flag << 29) | length)


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 7)),
    st.tuples(st.just("cut"), st.integers(0, 1 << 20)),
    st.tuples(st.just("junk"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=20)),
    # a part header of any flag and a short length (or any), where a record is expected or not
    st.tuples(st.just("forge"), st.integers(0, 1 << 20), st.integers(0, 7),
              st.one_of(st.integers(0, 40), st.integers(0, (1 << 29) - 1)), st.booleans()),
)


def mutated(records: list[bytes], mutations) -> bytes:
    data = bytearray(recordio.encode(records))
    for kind, at, *what in mutations:
        at = at % (len(data) + 1)
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << what[0]
        elif kind == "cut":
            del data[at:]
        elif kind == "junk":
            data[at:at] = what[0]
        elif kind == "forge":
            flag, length, aligned = what
            at = at - at % 4 if aligned else at
            data[at:at] = part_header(flag, length)
    return bytes(data)


streams = st.builds(mutated, st.lists(payloads, max_size=10), st.lists(mutation, max_size=4))
read_sizes = st.one_of(st.integers(1, 40), st.just(1 << 20))


# --- the properties ---------------------------------------------------------------------------------

@given(records=st.lists(payloads, max_size=10), read_size=read_sizes)
def test_any_payloads_come_back_as_they_went_in_split_as_dmlc_splits_them(records, read_size):
    data = recordio.encode(records)
    assert reference_records(data, 0) == (records, None)  # (the reference is the format's, too)
    assert decoded_records(data, read_size, 0) == (records, None)
    cuts = [at for record in records for at in range(0, len(record) - 3, 4) if record[at : at + 4] == MAGIC_BYTES]
    assert len(data) == sum(8 + len(r) + -len(r) % 4 for r in records) + 4 * len(cuts)  # (one header per cut)


@given(data=streams, read_size=read_sizes, max_skips=st.integers(0, 4))
def test_the_decoder_gives_the_references_records_then_its_error(data, read_size, max_skips):
    assert decoded_records(data, read_size, max_skips) == reference_records(data, max_skips)


def refuses_odd_first_bytes(payload: bytes) -> str | None:
    return "its first byte is odd" if payload[:1] and payload[0] % 2 else None


@given(data=streams, read_size=read_sizes, max_skips=st.integers(0, 4))
def test_a_record_check_refuses_payloads_where_the_reference_does(data, read_size, max_skips):
    assert decoded_records(data, read_size, max_skips, refuses_odd_first_bytes) == reference_records(
        data, max_skips, refuses_odd_first_bytes)


@given(payload=payloads, cut=st.integers(1, 1 << 20), read_size=read_sizes)
def test_a_record_cut_short_anywhere_is_truncated_at_its_own_offset(payload, cut, read_size):
    head = recordio.encode([b"kept"])
    record = recordio.encode([payload])
    data = head + record[: cut % len(record)] if cut % len(record) else head + record[:1]
    assert decoded_records(data, read_size, 0) == ([b"kept"], (TruncatedRecordError, 1, len(head)))


@given(records=st.lists(payloads, min_size=1, max_size=6), which=st.integers(0, 5), byte=st.integers(0, 3),
       bit=st.integers(0, 7), read_size=read_sizes)
def test_bad_magic_is_corruption_at_that_header_and_the_next_records_follow_when_skipped(records, which, byte, bit,
                                                                                        read_size):
    which %= len(records)
    data = bytearray(recordio.encode(records))
    at = len(recordio.encode(records[:which]))
    data[at + byte] ^= 1 << bit
    data = bytes(data)
    assert decoded_records(data, read_size, 0) == (records[:which], (CorruptRecordError, which, at))
    # skipped, the decoder resumes at the next record (an aligned magic word in a payload is a cut:
    # a part header whose flag cannot start a record)
    assert decoded_records(data, read_size, 1) == (records[:which] + records[which + 1 :], None)


def combine(payloads: list[bytes]) -> bytes:
    """A line's payloads joined; a line whose last payload starts with "!" cannot be used."""
    if payloads[-1][:1] == b"!":
        raise ValueError("a bad label")
    return b"|".join(payloads)


lines_payloads = st.one_of(payloads, st.just(b"!"), st.binary(min_size=1, max_size=3).map(lambda b: b"!" + b))


@given(records=st.lists(lines_payloads, max_size=12), mutations=st.lists(mutation, max_size=3),
       size=st.integers(1, 3), read_size=read_sizes, max_skips=st.integers(0, 4),
       max_bytes=st.one_of(st.just(recordio.MAX_PART_BYTES), st.integers(0, 30)), check=st.booleans())
def test_records_are_grouped_into_manifest_lines_as_the_reference_groups_them(records, mutations, size, read_size,
                                                                             max_skips, max_bytes, check):
    data = mutated(records, mutations)
    check = refuses_odd_first_bytes if check else None
    assert decoded_lines(data, read_size, size, max_skips, max_bytes, combine, check) == reference_lines(
        data, size, max_skips, max_bytes, combine, check)


@given(lines=st.lists(st.lists(payloads, min_size=3, max_size=3), min_size=1, max_size=5),
       keep=st.integers(1, 1 << 20), read_size=read_sizes, max_skips=st.integers(0, 4))
def test_a_pass_cut_between_two_records_of_a_line_is_a_truncated_line_whatever_the_skip_limit(lines, keep,
                                                                                            read_size, max_skips):
    flat = [payload for line in lines for payload in line]
    keep = keep % len(flat) or 1
    if keep % 3 == 0:
        keep -= 1  # (cut inside a line: one or two of its three records came)
    data = recordio.encode(flat[:keep])
    line_start = keep - keep % 3
    joined = b"|".join  # (every whole line usable: the cut one is the only error)
    got = decoded_lines(data, read_size, 3, max_skips, recordio.MAX_PART_BYTES, joined)
    assert got[1] == (TruncatedRecordError, line_start, len(recordio.encode(flat[:line_start])))
    assert got == reference_lines(data, 3, max_skips, recordio.MAX_PART_BYTES, joined)


# --- a TFRecord file wrapped as one RecordIO record (RecordWrapperType RecordIO), both paths ---------

PATHS = pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pure-python"])


@PATHS
@given(files=st.lists(st.lists(st.binary(max_size=300), max_size=5), max_size=4), read_size=read_sizes,
       chunk_bytes=st.integers(1, 2048))
def test_wrapped_tfrecord_files_give_their_records_in_order_on_every_path(compiled, files, read_size, chunk_bytes):
    if compiled and tfrecord._framing is None:
        pytest.skip("pipemode._framing is not built in this install")
    data = recordio.encode([tfrecord.encode(records) for records in files])
    previous = os.environ.get(tfrecord.PURE_PYTHON_ENV)
    os.environ[tfrecord.PURE_PYTHON_ENV] = "0" if compiled else "1"
    try:
        with read_bytes(read_size):
            policy = CorruptionPolicy(0)
            inner = tfrecord.TFRecordDecoder(policy, chunk_bytes=chunk_bytes)
            assert (inner._compiled is not None) == compiled
            got = [record for stream in recordio.RecordIODecoder(policy).streams(stream_reader(data), WHERE)
                   for batch in inner.decode(stream.read, stream.where, stream.size) for record in batch]
    finally:
        if previous is None:
            os.environ.pop(tfrecord.PURE_PYTHON_ENV, None)
        else:
            os.environ[tfrecord.PURE_PYTHON_ENV] = previous
    assert got == [record for records in files for record in records]
