"""pipemode._framing, the compiled fast path of the TFRecord decoder, against the pure-Python one.

It must accept exactly what the Python code accepts and stop exactly where the Python code would
report a problem, for every CRC path it has: SSE4.2 for records up to 2 KB, google-crc32c for
longer ones, and the table that CPUs without SSE4.2 use. (test_tfrecord runs the whole decoder,
errors and skipping included, both ways.)
"""

from __future__ import annotations

import random
import struct

import google_crc32c
import pytest

from pipemode import tfrecord
from pipemode.corruption import CorruptionPolicy
from pipemode.crc import crc32c, masked_crc32c
from pipemode.errors import CorruptRecordError
from tests.conftest import stream_reader

framing = tfrecord._framing
pytestmark = pytest.mark.skipif(framing is None, reason="pipemode._framing is not built in this install")

# Around the CRC paths' limits (64: the table's, 2048: SSE4.2's), and a photo-sized record
LENGTHS = [0, 1, 7, 8, 9, 63, 64, 65, 1000, 2047, 2048, 2049, 5000, 100_000]


@pytest.fixture(params=["hardware CRC", "table CRC"])
def crc_path(request):
    framing.use_hardware_crc(request.param == "hardware CRC")
    yield request.param
    framing.use_hardware_crc(True)


def scan(buf: bytes, pos: int = 0, max_record_bytes: int = tfrecord.MAX_RECORD_BYTES):
    return framing.scan(buf, pos, max_record_bytes, crc32c)


def offsets(records: list[bytes]) -> list[int]:
    return [sum(tfrecord.OVERHEAD_BYTES + len(r) for r in records[:i]) for i in range(len(records) + 1)]


def test_the_crc_matches_google_crc32c_at_every_length(crc_path):
    rng = random.Random(1)
    for n in [*range(0, 130), 2048, 4099, 65536]:
        data = rng.randbytes(n)
        assert framing.crc32c(data) == google_crc32c.value(data), n


def test_well_formed_records_of_every_length_come_out_whole(crc_path):
    records = [random.Random(n).randbytes(n) for n in LENGTHS] * 2
    data = tfrecord.encode(records)
    assert scan(data) == (records, len(data), True)


def test_a_record_cut_anywhere_stops_the_scan_cleanly_before_it(crc_path):
    records = [bytes([i]) * n for i, n in enumerate(LENGTHS)]
    data = tfrecord.encode(records)
    starts = offsets(records)
    for cut in sorted({1, 11, 12, 13, *(s - 1 for s in starts[1:]), *(s + 5 for s in starts[:-1])}):
        got, stop, clean = scan(data[:cut])
        complete = max(i for i, s in enumerate(starts) if s <= cut)
        assert (got, stop, clean) == (records[:complete], starts[complete], True), cut


def test_it_starts_where_it_is_told():
    records = [b"a" * 10, b"b" * 20, b"c" * 30]
    data = tfrecord.encode(records)
    start = offsets(records)[1]
    assert scan(data, start) == (records[1:], len(data), True)
    assert scan(data, len(data)) == ([], len(data), True)


@pytest.mark.parametrize("part", ["length", "length crc", "data", "data crc"])
def test_it_stops_at_exactly_the_record_the_python_decoder_reports(crc_path, part):
    records = [bytes([i]) * n for i, n in enumerate(LENGTHS) if n]
    data = tfrecord.encode(records)
    starts = offsets(records)
    for i, record in enumerate(records):
        inside = {"length": 2, "length crc": 9, "data": tfrecord.HEADER_BYTES,
                  "data crc": tfrecord.HEADER_BYTES + len(record)}[part]
        at = starts[i] + inside
        damaged = data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :]
        got, stop, clean = scan(damaged)
        assert (got, stop, clean) == (records[:i], starts[i], False), (part, i)
        # and the Python decoder reports that very record, at that offset
        decoder = tfrecord.TFRecordDecoder(CorruptionPolicy(0))
        with pytest.raises(CorruptRecordError) as error:
            list(decoder.decode(stream_reader(damaged), "x"))
        assert (error.value.record, error.value.offset) == (i, starts[i])


def test_a_length_over_max_record_bytes_stops_it(crc_path):
    data = tfrecord.encode([b"x" * 10, b"y" * 1000])
    assert scan(data, 0, 999) == ([b"x" * 10], 26, False)
    assert scan(data, 0, 1000) == ([b"x" * 10, b"y" * 1000], len(data), True)


@pytest.mark.parametrize("length", [2**63, 2**64 - 1, 2**64 - 4])
def test_a_huge_length_with_a_valid_crc_is_not_an_overflow(crc_path, length):
    """With max_record_bytes raised to the limit, a crafted length near 2**64 must read as a record
    running past the chunk (the Python decoder then reads, and finds the stream short), not wrap
    around into a short one."""
    field = struct.pack("<Q", length)
    data = tfrecord.encode([b"ok"]) + field + struct.pack("<I", masked_crc32c(field)) + b"z" * 64
    assert scan(data, 0, 2**64 - 1) == ([b"ok"], 18, True)


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError):
        framing.scan(bytearray(b"abc"), 0, 10, crc32c)
    with pytest.raises(TypeError):
        framing.scan(b"abc", 0, 10)
    with pytest.raises(ValueError):
        framing.scan(b"abc", 4, 10, crc32c)
    with pytest.raises(ZeroDivisionError):  # an error from the CRC function goes through
        framing.scan(tfrecord.encode([b"q" * 3000]), 0, 10_000, lambda record: 1 // 0)


def test_the_decoder_uses_it_only_where_it_applies(monkeypatch):
    policy = CorruptionPolicy(0)
    assert tfrecord.TFRecordDecoder(policy)._compiled is framing
    assert tfrecord.TFRecordDecoder(policy, check_crc=False)._compiled is None
    assert tfrecord.TFRecordDecoder(policy, record_check=lambda r: None)._compiled is None
    monkeypatch.setenv(tfrecord.PURE_PYTHON_ENV, "1")
    assert tfrecord.TFRecordDecoder(policy)._compiled is None
