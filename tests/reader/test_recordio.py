"""RecordIO framing: dmlc's byte layout, multi-part records, padding, corruption and resync."""

import logging
import os
import struct

import pytest

from pipemode import recordio, tfrecord
from pipemode.corruption import CorruptionPolicy
from pipemode.errors import CorruptRecordError, TruncatedRecordError
from tests.conftest import random_records, stream_reader

MAGIC = recordio.MAGIC_BYTES
WHERE = "test stream"


def header(flag: int, length: int) -> bytes:
    return struct.pack("<II", 0xCED7230A, (flag << 29) | length)


def decode(data: bytes, skips: int = 0) -> tuple[list[bytes], CorruptionPolicy]:
    policy = CorruptionPolicy(skips)
    records = recordio.RecordIODecoder(policy).records(stream_reader(data), WHERE)
    return [r for batch in records for r in batch], policy


@pytest.mark.parametrize(
    "payload, expected",
    [
        (b"", header(0, 0)),
        (b"abc", header(0, 3) + b"abc\0"),
        (b"abcd", header(0, 4) + b"abcd"),
        # an aligned magic word cuts the payload: parts 1 and 3, the magic dropped
        (b"abcd" + MAGIC + b"ef", header(1, 4) + b"abcd" + header(3, 2) + b"ef\0\0"),
        # at the very start: an empty first part
        (MAGIC + b"xy", header(1, 0) + header(3, 2) + b"xy\0\0"),
        # twice: first, middle, last
        (MAGIC + b"1234" + MAGIC, header(1, 0) + header(2, 4) + b"1234" + header(3, 0)),
        # unaligned: no cut
        (b"a" + MAGIC + b"bcd", header(0, 8) + b"a" + MAGIC + b"bcd"),
    ],
    ids=["empty", "padded", "aligned", "cut", "cut-at-0", "cut-twice", "unaligned"],
)
def test_encoding_follows_dmlc(payload, expected):
    assert recordio.encode_record(payload) == expected
    assert decode(expected)[0] == [payload]


def test_round_trip_of_random_and_magic_laden_payloads():
    payloads = random_records(5, 200, max_bytes=100) + [
        MAGIC * 10, b"x" * 3 + MAGIC * 2, os.urandom(3 << 20), MAGIC + os.urandom(1001) + MAGIC
    ]
    assert decode(recordio.encode(payloads))[0] == payloads


def test_find_cuts_across_block_boundaries():
    payload = b"ab" + b"\0\0" + MAGIC + b"zz" * 6 + MAGIC + b"z" + MAGIC  # cuts at 4, 20; not 25
    for size in range(1, len(payload) + 1):
        blocks = [payload[i : i + size] for i in range(0, len(payload), size)]
        assert recordio.find_cuts(blocks) == recordio.find_cuts([payload]) == [4, 20]


def test_streams_read_payloads_in_pieces():
    payloads = [b"a" * 10 + MAGIC + b"b" * 10, b"", b"c" * 7]
    decoder = recordio.RecordIODecoder(CorruptionPolicy())
    got = []
    for stream in decoder.streams(stream_reader(recordio.encode(payloads)), WHERE):
        got.append(b"".join(iter(lambda stream=stream: stream.read(3), b"")))
    assert got == payloads


def test_tfrecords_inside_recordio_are_decoded_as_they_stream():
    files = [random_records(6, 30), [], random_records(7, 3, max_bytes=100_000)]
    stream = recordio.encode([tfrecord.encode(f) for f in files])
    decoder = tfrecord.TFRecordDecoder(CorruptionPolicy(), chunk_bytes=1000)
    got = [
        record
        for s in recordio.RecordIODecoder(decoder.policy).streams(stream_reader(stream), WHERE)
        for batch in decoder.decode(s.read, s.where)
        for record in batch
    ]
    assert got == [r for f in files for r in f]


# --- corruption -------------------------------------------------------------------------------


def test_bad_magic_is_an_error_naming_record_and_offset():
    data = bytearray(recordio.encode([b"one1", b"two2", b"three"]))
    data[24] ^= 0xFF  # the magic of the third record (two 12-byte records before it)
    with pytest.raises(CorruptRecordError, match=r"corrupt record #2 at byte offset 24 of test stream: bad magic"):
        decode(bytes(data))


@pytest.mark.parametrize("cut", [3, 8, 10, 13])
def test_truncated_stream_is_an_error(cut):
    data = recordio.encode([b"abcd", b"efgh1"])  # second record: header at 12, data 20-25, pad to 28
    with pytest.raises(TruncatedRecordError) as info:
        decode(data[: 12 + cut])
    assert (info.value.record, info.value.offset) == (1, 12)


def test_broken_multipart_sequence_is_an_error():
    data = header(1, 4) + b"abcd" + header(0, 4) + b"efgh"  # a first part, then a whole record
    with pytest.raises(CorruptRecordError, match="expected the next part of a multi-part record"):
        decode(data)
    with pytest.raises(CorruptRecordError, match="flag 3 cannot start a record"):
        decode(header(3, 0))


def test_skipping_resynchronises_on_the_next_aligned_magic(caplog):
    payloads = [b"a" * 8, b"b" * 5, b"c" * 9, b"d" * 4]
    data = bytearray(recordio.encode(payloads))
    data[16] ^= 0xFF  # magic of record #1
    with caplog.at_level(logging.WARNING):
        got, policy = decode(bytes(data), skips=1)
    assert got == [payloads[0], payloads[2], payloads[3]]
    assert policy.skipped == 1
    assert "skipped 8 bytes to the next RecordIO record" in caplog.text


def test_skipping_a_truncated_last_record():
    data = recordio.encode([b"keep", b"lost-in-transit"])
    got, policy = decode(data[:-6], skips=1)
    assert got == [b"keep"] and policy.skipped == 1


def test_skipping_a_broken_multipart_record_keeps_the_following_ones():
    data = header(1, 4) + b"abcd" + header(0, 4) + b"efgh" + recordio.encode([b"next"])
    got, policy = decode(data, skips=1)
    assert got == [b"efgh", b"next"] and policy.skipped == 1


def test_a_record_check_rejects_payloads_by_number_and_offset():
    from pipemode.errors import UnusableRecordError

    data = recordio.encode([b"one1", b"two2", b"three"])
    check = lambda payload: "no twos" if payload == b"two2" else None  # noqa: E731
    with pytest.raises(UnusableRecordError, match=r"unusable record #1 at byte offset 12 of test stream: no twos"):
        [r for batch in recordio.RecordIODecoder(CorruptionPolicy(0)).records(stream_reader(data), WHERE, check) for r in batch]
    decoder = recordio.RecordIODecoder(CorruptionPolicy(1))
    assert [r for batch in decoder.records(stream_reader(data), WHERE, check) for r in batch] == [b"one1", b"three"]
    assert decoder.policy.skipped == 1


# --- augmented manifests: one record per listed attribute, grouped by line ---------------------------


def lines(data: bytes, size: int = 2, skips: int = 0, check=None):
    """(the records RecordIODecoder.groups makes, the pass's policy): each line's payloads joined by '|'."""
    def combine(payloads):
        if payloads[-1] == b"bad":
            raise ValueError("a bad label")
        return b"|".join(payloads)

    policy = CorruptionPolicy(skips)
    got = recordio.RecordIODecoder(policy).groups(stream_reader(data), WHERE, size, combine, check)
    return [r for batch in got for r in batch], policy


def test_a_manifest_stream_is_grouped_by_line_in_the_attributes_order():
    payloads = [b"jpeg-0", b"3", b"jpeg-1" + MAGIC + b"..", b"[0, 2]", b"", b'"7"']
    got, _ = lines(recordio.encode(payloads))
    assert got == [b"jpeg-0|3", b"jpeg-1" + MAGIC + b"..|[0, 2]", b'|"7"']


def test_a_line_that_cannot_be_used_is_named_and_skipped_without_losing_the_alignment():
    from pipemode.errors import UnusableRecordError

    data = recordio.encode([b"a", b"1", b"b", b"bad", b"c", b"2"])
    with pytest.raises(UnusableRecordError, match=r"unusable record #2 at byte offset 24 of test stream: manifest "
                                                  r"line 2 of this pass \(RecordIO records #2-#3\): a bad label"):
        lines(data)
    got, policy = lines(data, skips=1)
    assert got == [b"a|1", b"c|2"] and policy.skipped == 1
    reject_c = lambda record: "no c" if record.startswith(b"c") else None  # noqa: E731
    with pytest.raises(UnusableRecordError, match=r"manifest line 3 of this pass \(RecordIO records #4-#5\): no c"):
        lines(recordio.encode([b"a", b"1", b"b", b"2", b"c", b"3"]), check=reject_c)


def test_a_pass_that_ends_inside_a_line_is_an_error_naming_it_whatever_the_skip_limit():
    data = recordio.encode([b"a", b"1", b"b", b"2", b"c"])
    for skips in (0, 5):
        with pytest.raises(TruncatedRecordError, match=r"corrupt record #4 at byte offset 48 of test stream: the pass "
                                                       r"ended after 1 of the 2 records of manifest line 3 of this"):
            lines(data, skips=skips)


def test_a_record_longer_than_the_limit_is_not_read_and_its_line_is_unusable():
    from pipemode.errors import UnusableRecordError

    data = recordio.encode([b"a" * 100, b"1", b"b" * 10, b"2"])
    policy = CorruptionPolicy(1)
    got = recordio.RecordIODecoder(policy).groups(stream_reader(data), WHERE, 2, b"|".join, max_bytes=50)
    assert [r for batch in got for r in batch] == [b"b" * 10 + b"|2"] and policy.skipped == 1
    with pytest.raises(UnusableRecordError, match="a record is longer than 50 bytes"):
        list(recordio.RecordIODecoder(CorruptionPolicy(0)).groups(stream_reader(data), WHERE, 2, b"|".join,
                                                                  max_bytes=50))


def test_a_damaged_record_ends_the_pass_even_when_skipping_is_allowed():
    data = bytearray(recordio.encode([b"aaaa", b"1111", b"bbbb", b"2222", b"cccc", b"3333"]))
    data[12 * 2] ^= 0xFF  # the magic of record #2: after it, which record is which attribute is unknown
    with pytest.raises(CorruptRecordError, match=r"cannot be matched to their manifest lines"):
        lines(bytes(data), skips=5)
