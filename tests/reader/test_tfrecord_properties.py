"""The TFRecord decoder against a reference written from the format, on streams Hypothesis makes:
valid records, then mutated (bits flipped, the stream cut anywhere, junk between records, forged
headers whose length CRC is valid), read through the compiled framing and without it, in chunks
of any size. Every way must give the reference's records, in its order, then its error (kind,
record number, byte offset), or none. The compiled part's sanitizer run reruns this file
(test_sanitizers.py).

Each property runs once per path: the compiled one ("compiled") and the pure-Python one. Where
pipemode._framing is not built, the compiled case is still collected, and skips saying so (a
skip that CI's strict mode turns into a failure), rather than vanishing from the run.

Most records drawn are short (under 300 bytes: many records and edges per stream); a few streams
hold records of 2-20 KB, past the compiled part's SMALL_RECORD_BYTES (2048, _framing.c), whose
data CRCs it checks through google-crc32c rather than SSE4.2 (or, on the table path of CPUs
without SSE4.2, every CRC of more than 64 bytes)."""

from __future__ import annotations

import os
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipemode import tfrecord
from pipemode.corruption import CorruptionPolicy
from pipemode.crc import crc32c, masked_crc32c
from pipemode.errors import CorruptRecordError, PipeConfigError, TruncatedRecordError, UnusableRecordError
from tests.conftest import stream_reader

WHERE = "test stream"


# --- the reference: the format (tensorflow/core/lib/io/record_reader.cc), read one byte at a time -----

def header_ok(data: bytes, at: int, max_record_bytes: int, check_crc: bool = True) -> bool:
    """A whole header at `at`: its length possible and, when checked, its length CRC right."""
    if len(data) - at < 12:
        return False
    length, length_crc = struct.unpack_from("<QI", data, at)
    return length <= max_record_bytes and (not check_crc or masked_crc32c(data[at : at + 8]) == length_crc)


def reference(data: bytes, *, max_record_bytes: int, max_skips: int, check_crc: bool = True,
              size_known: bool = False, check=None):
    """(records, (error kind, record number, offset) or None), as the reader documents it: a bad
    header is a corrupt record, after which reading resumes at the next offset where a valid header
    starts (its CRC always checked) or the stream's rest is skipped; a record that the stream ends
    inside is truncated (or, when the stream's size is known, a corrupt one at once, and
    resynchronised past); a bad data CRC or a record `check` refuses is skipped whole. Up to
    max_skips of these are skipped; the next is the error."""
    records, skipped, number, pos = [], 0, 0, 0

    def fail(kind, at):
        nonlocal skipped
        if skipped >= max_skips:
            return records, (kind, number, at)
        skipped += 1
        return None

    def resync(after):
        return next((p for p in range(after + 1, len(data) - 11) if header_ok(data, p, max_record_bytes)), len(data))

    while pos < len(data):
        if len(data) - pos < 12:
            return fail(TruncatedRecordError, pos) or (records, None)
        if not header_ok(data, pos, max_record_bytes, check_crc):
            if outcome := fail(CorruptRecordError, pos):
                return outcome
            number, pos = number + 1, resync(pos)
            continue
        length = struct.unpack_from("<Q", data, pos)[0]
        end = pos + 12 + length + 4
        if end > len(data):
            if not size_known:
                return fail(TruncatedRecordError, pos) or (records, None)
            if outcome := fail(CorruptRecordError, pos):
                return outcome
            number, pos = number + 1, resync(pos)
            continue
        record = data[pos + 12 : pos + 12 + length]
        if check_crc and masked_crc32c(record) != struct.unpack_from("<I", data, end - 4)[0]:
            kind = CorruptRecordError
        elif check is not None and check(record):
            kind = UnusableRecordError
        else:
            kind = None
            records.append(record)
        if kind and (outcome := fail(kind, pos)):
            return outcome
        number, pos = number + 1, end
    return records, None


# --- the decoder under test ---------------------------------------------------------------------

def decoded(data: bytes, *, compiled: bool, chunk_bytes: int, max_record_bytes: int, max_skips: int,
            check_crc: bool = True, size_known: bool = False, check=None):
    """What TFRecordDecoder gives: (records until the error, (kind, record, offset) or None)."""
    previous = os.environ.get(tfrecord.PURE_PYTHON_ENV)
    os.environ[tfrecord.PURE_PYTHON_ENV] = "0" if compiled else "1"
    try:
        decoder = tfrecord.TFRecordDecoder(CorruptionPolicy(max_skips), check_crc=check_crc,
                                           max_record_bytes=max_record_bytes, chunk_bytes=chunk_bytes,
                                           record_check=check)
        records = []
        try:
            for batch in decoder.decode(stream_reader(data), WHERE, len(data) if size_known else None):
                records += batch
        except CorruptRecordError as err:  # (truncated and unusable ones are kinds of it)
            return records, (type(err), err.record, err.offset)
        return records, None
    finally:
        if previous is None:
            os.environ.pop(tfrecord.PURE_PYTHON_ENV, None)
        else:
            os.environ[tfrecord.PURE_PYTHON_ENV] = previous


# Both paths, always: the compiled one skips where it is not built (need()), never drops out unseen
PATHS = pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "pure-python"])
NOT_BUILT = "pipemode._framing is not built in this install"


def need(compiled: bool) -> None:
    """Skips the compiled case where pipemode._framing is not built."""
    if compiled and tfrecord._framing is None:
        pytest.skip(NOT_BUILT)


def forged(length: int) -> bytes:
    """A header claiming `length` bytes, its length CRC valid: only what follows can tell it is a lie."""
    field = struct.pack("<Q", length)
    return field + struct.pack("<I", masked_crc32c(field))


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 7)),
    st.tuples(st.just("cut"), st.integers(0, 1 << 20)),
    st.tuples(st.just("junk"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("forge"), st.integers(0, 1 << 20),
              st.one_of(st.integers(0, 600), st.integers(0, 2**64 - 1))),
)


def mutated(records: list[bytes], mutations) -> bytes:
    data = bytearray(tfrecord.encode(records))
    for kind, at, *what in mutations:
        at = at % (len(data) + 1)
        if kind == "flip" and at < len(data):
            data[at] ^= 1 << what[0]
        elif kind == "cut":
            del data[at:]
        elif kind == "junk":
            data[at:at] = what[0]
        elif kind == "forge":
            data[at:at] = forged(what[0])
    return bytes(data)


streams = st.builds(mutated, st.lists(st.binary(max_size=300), max_size=10), st.lists(mutation, max_size=4))
limits = st.one_of(st.just(tfrecord.MAX_RECORD_BYTES), st.integers(1, 400), st.just(2**64 + 5))


@PATHS
@given(data=streams, chunk_bytes=st.integers(1, 2048), max_record_bytes=limits, max_skips=st.integers(0, 4),
       check_crc=st.booleans(), size_known=st.booleans())
def test_every_path_gives_the_references_records_then_its_error(compiled, data, chunk_bytes, max_record_bytes,
                                                                 max_skips, check_crc, size_known):
    need(compiled)
    expected = reference(data, max_record_bytes=max_record_bytes, max_skips=max_skips, check_crc=check_crc,
                         size_known=size_known)
    got = decoded(data, compiled=compiled, chunk_bytes=chunk_bytes, max_record_bytes=max_record_bytes,
                  max_skips=max_skips, check_crc=check_crc, size_known=size_known)
    assert got == expected, chunk_bytes


def refuses_odd_first_bytes(record: bytes) -> str | None:
    return "its first byte is odd" if record[:1] and record[0] % 2 else None


@PATHS
@given(data=streams, chunk_bytes=st.integers(1, 2048), max_skips=st.integers(0, 4))
def test_a_record_check_refuses_records_in_the_same_places_on_every_path(compiled, data, chunk_bytes, max_skips):
    need(compiled)
    expected = reference(data, max_record_bytes=tfrecord.MAX_RECORD_BYTES, max_skips=max_skips,
                         check=refuses_odd_first_bytes)
    got = decoded(data, compiled=compiled, chunk_bytes=chunk_bytes, max_record_bytes=tfrecord.MAX_RECORD_BYTES,
                  max_skips=max_skips, check=refuses_odd_first_bytes)
    assert got == expected


@PATHS
@given(window=st.binary(max_size=3000), start=st.integers(0, 3100), max_record_bytes=limits,
       planted=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 2**64 - 1)), max_size=3))
def test_find_header_finds_the_first_valid_header_in_c_and_in_numpy(compiled, window, start, max_record_bytes,
                                                                     planted):
    need(compiled)
    data = bytearray(window)
    for at, length in planted:
        data[at:at] = forged(length)
    data = bytes(data)
    expected = next((p for p in range(start, len(data) - 11) if header_ok(data, p, max_record_bytes)), -1)
    os.environ[tfrecord.PURE_PYTHON_ENV] = "0" if compiled else "1"
    try:
        assert tfrecord.find_header(data, max_record_bytes, start) == expected
    finally:
        os.environ.pop(tfrecord.PURE_PYTHON_ENV)


# --- records over 2 KB: the compiled part's other CRC path ----------------------------------------

SMALL_RECORD_BYTES = 2048  # _framing.c: longer records' data CRCs go through google-crc32c


def large_record(seed: int, size: int) -> bytes:
    # (from a seed: Hypothesis draws a few bytes, not 20 KB of them, and stays within its buffer)
    return random.Random(seed).randbytes(size)


over_the_limit = st.builds(large_record, st.integers(0, 2**32 - 1), st.integers(SMALL_RECORD_BYTES + 1, 20_000))
at_the_limit = st.builds(large_record, st.integers(0, 2**32 - 1),
                         st.sampled_from([SMALL_RECORD_BYTES - 1, SMALL_RECORD_BYTES, SMALL_RECORD_BYTES + 1]))


def shuffled(drawn) -> list[bytes]:
    short, long, more, rng = drawn
    records = short + [long] + more
    rng.shuffle(records)
    return records


# mostly short records, one over 2 KB, up to two more long or at the limit: a stream under ~62 KB
mixed_records = st.tuples(st.lists(st.binary(max_size=300), max_size=8), over_the_limit,
                          st.lists(st.one_of(over_the_limit, at_the_limit), max_size=2),
                          st.randoms(use_true_random=False)).map(shuffled)
large_streams = st.builds(mutated, mixed_records, st.lists(mutation, max_size=3))
# chunks shorter than a long record (it is completed across reads) and longer (scanned within one)
chunk_sizes = st.one_of(st.integers(1, 2048), st.integers(2048, 65536))
large_limits = st.one_of(st.just(tfrecord.MAX_RECORD_BYTES), st.integers(SMALL_RECORD_BYTES, 20_000))
CRC_PATHS = pytest.mark.parametrize("crc_path", ["compiled, SSE4.2 CRC", "compiled, table CRC", "pure-python"])


@CRC_PATHS
@settings(max_examples=max(10, settings.default.max_examples // 2))
@given(data=large_streams, chunk_bytes=chunk_sizes, max_record_bytes=large_limits, max_skips=st.integers(0, 3),
       size_known=st.booleans())
def test_records_over_2_kb_give_the_references_records_then_its_error_on_every_crc_path(
        crc_path, data, chunk_bytes, max_record_bytes, max_skips, size_known):
    compiled = crc_path.startswith("compiled")
    need(compiled)
    if compiled:
        tfrecord._framing.use_hardware_crc("SSE4.2" in crc_path)  # (no SSE4.2 on this CPU: the table, twice)
    try:
        expected = reference(data, max_record_bytes=max_record_bytes, max_skips=max_skips, size_known=size_known)
        got = decoded(data, compiled=compiled, chunk_bytes=chunk_bytes, max_record_bytes=max_record_bytes,
                      max_skips=max_skips, size_known=size_known)
    finally:
        if compiled:
            tfrecord._framing.use_hardware_crc(True)
    assert got == expected, chunk_bytes


@PATHS
@settings(max_examples=max(10, settings.default.max_examples // 10))
@given(records=mixed_records, chunk_bytes=chunk_sizes)
def test_streams_with_records_over_2_kb_do_reach_them_whole(compiled, records, chunk_bytes):
    """The draws above do hold records over 2 KB, an undamaged stream of them comes out whole, and
    the compiled part checks each of those through the CRC function it is given (its path for
    them), not with its own."""
    need(compiled)
    long = sorted(len(r) for r in records if len(r) > SMALL_RECORD_BYTES)
    assert long
    checked = []

    def counted(data):
        checked.append(len(data))
        return crc32c(data)

    tfrecord.crc32c = counted  # (what the decoder hands the compiled scan, looked up at each call)
    try:
        assert decoded(tfrecord.encode(records), compiled=compiled, chunk_bytes=chunk_bytes,
                       max_record_bytes=tfrecord.MAX_RECORD_BYTES, max_skips=0) == (records, None)
    finally:
        tfrecord.crc32c = crc32c
    if compiled:
        assert sorted(n for n in checked if n > SMALL_RECORD_BYTES) == long


# --- the cases of the issue that called for these, as plain tests ---------------------------------

@PATHS
def test_the_records_before_a_bad_one_are_given_the_same_way_on_every_path(compiled):
    need(compiled)
    data = bytes.fromhex("01000000000000000175de4161786ee42801000000000000000175de4162d98f0c05")
    for chunk_bytes in (1, 7, 32, 1 << 20):
        records, error = decoded(data, compiled=compiled, chunk_bytes=chunk_bytes,
                                 max_record_bytes=tfrecord.MAX_RECORD_BYTES, max_skips=0)
        assert records == [b"a"] and error == (CorruptRecordError, 1, 17), chunk_bytes


@PATHS
@pytest.mark.parametrize("value, message", [
    (-1, "max_record_bytes must be >= 1, got -1"), (0, "max_record_bytes must be >= 1, got 0"),
    (1.5e6, "max_record_bytes must be a whole number, got 1500000.0"),
    ("100", "max_record_bytes must be a whole number, got '100'"),
    (True, "max_record_bytes must be a whole number, got True")])
def test_a_bad_max_record_bytes_is_one_clear_error_on_every_path(compiled, value, message, monkeypatch):
    need(compiled)
    monkeypatch.setenv(tfrecord.PURE_PYTHON_ENV, "0" if compiled else "1")
    with pytest.raises(PipeConfigError, match=message):
        tfrecord.TFRecordDecoder(CorruptionPolicy(0), max_record_bytes=value)


@PATHS
def test_a_numpy_integer_max_record_bytes_is_a_number_like_any_other(compiled, monkeypatch):
    import numpy as np

    need(compiled)
    monkeypatch.setenv(tfrecord.PURE_PYTHON_ENV, "0" if compiled else "1")
    data = tfrecord.encode([b"x" * 50, b"y" * 150])
    assert decoded(data, compiled=compiled, chunk_bytes=64, max_record_bytes=np.int64(100), max_skips=1) == (
        [b"x" * 50], None)


@pytest.mark.parametrize("value, message", [(0, "chunk_bytes must be >= 1, got 0"),
                                            (2.0, "chunk_bytes must be a whole number, got 2.0")])
def test_a_chunk_size_that_would_read_nothing_is_refused(value, message):
    with pytest.raises(PipeConfigError, match=message):
        tfrecord.TFRecordDecoder(CorruptionPolicy(0), chunk_bytes=value)


FORGED_STREAM = r'''
import gc, os, resource, struct, sys
from pipemode import tfrecord
from pipemode.corruption import CorruptionPolicy
from pipemode.crc import crc32c, masked_crc32c
from pipemode.errors import TruncatedRecordError

field = struct.pack("<Q", 2 * 10**9)  # a forged header: 2 GB, its length CRC valid
header = field + struct.pack("<I", masked_crc32c(field))
total, sent = int(sys.argv[1]), 0
block = os.urandom(1 << 20) * 16  # data that is really there (untouched zero pages would not count)

def read(n):
    global sent
    out = b""
    if sent == 0:
        out, sent, n = header, len(header), n - len(header)
    n = max(0, min(n, total + len(header) - sent))
    sent += n
    return b"".join([out] + [block[i:i + min(n - i, len(block))] for i in range(0, n, len(block))])

gc.collect()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    for _ in tfrecord.TFRecordDecoder(CorruptionPolicy(0)).decode(read, "forged"):
        pass
except TruncatedRecordError:
    pass
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024 / total)
'''


@pytest.mark.slow
@PATHS
def test_a_forged_length_costs_the_bytes_that_came_not_what_it_claims_nor_twice_them(compiled):
    """2 GB claimed, 96 MB came: about 96 MB of extra memory (it used to be twice that, joined from
    pieces), never 2 GB."""
    import subprocess
    import sys

    need(compiled)
    env = {**os.environ, tfrecord.PURE_PYTHON_ENV: "0" if compiled else "1"}
    out = subprocess.run([sys.executable, "-c", FORGED_STREAM, str(96 << 20)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout) < 1.3, f"{float(out.stdout):.2f}x the data"
