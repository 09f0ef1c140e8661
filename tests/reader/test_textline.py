"""TextLine framing (AWS's third record format): the decoder on streams cut anywhere, then
PipeModeDataset over real FIFOs, plain and RecordIO-wrapped."""

import random

import pytest

from pipemode import CorruptRecordError, PipeModeDataset, UnusableRecordError, recordio
from pipemode.corruption import CorruptionPolicy
from pipemode.textline import TextLineDecoder


def pieces_reader(data: bytes, seed: int):
    """read(n) returning pieces of random sizes up to n, as a FIFO may."""
    rng, pos = random.Random(seed), 0

    def read(n: int) -> bytes:
        nonlocal pos
        size = min(n, rng.choice([1, 2, 7, 100, 4096, n]))
        out = data[pos : pos + size]
        pos += len(out)
        return out

    return read


def lines_of(data: bytes, seed: int = 0, max_record_bytes: int = 1 << 30, skips: int = 0, check=None):
    decoder = TextLineDecoder(CorruptionPolicy(skips), max_record_bytes, check)
    return [line for chunk in decoder.decode(pieces_reader(data, seed), "test stream") for line in chunk]


def expected_lines(data: bytes) -> list[bytes]:
    """AWS's reader: split at b"\\n"; text after the last newline is a line, a final newline adds none."""
    lines = data.split(b"\n")
    return lines[:-1] if lines[-1] == b"" else lines


@pytest.mark.parametrize("data", [
    b"", b"\n", b"one", b"one\n", b"one\ntwo", b"\n\nthree\n\n", b"crlf\r\nkept\r\n",
    b"a\x00b\nutf8 \xc3\xa9\n", b"x" * 3_000_000 + b"\n" + b"y" * 5,
])
def test_lines_split_as_aws_reader_does_wherever_the_stream_is_cut(data):
    for seed in range(5):
        assert lines_of(data, seed) == expected_lines(data)


def test_random_text_across_many_chunk_boundaries():
    rng = random.Random(3)
    data = b"".join(rng.choice([b"\n", b"\n\n", rng.randbytes(rng.randint(0, 3000)).replace(b"\n", b"")])
                    for _ in range(3000))
    assert lines_of(data, seed=9) == expected_lines(data)


def test_a_line_longer_than_max_record_bytes_is_corrupt_and_named():
    data = b"short\n" + b"z" * 5000 + b"\nafter\n"
    with pytest.raises(CorruptRecordError, match=r"record #1 at byte offset 6 of test stream: a line longer than max_record_bytes=1000"):
        lines_of(data, max_record_bytes=1000)
    # skipped when allowed, and the stream goes on at the next line, wherever the reads end
    for seed in range(5):
        assert lines_of(data, seed, max_record_bytes=1000, skips=1) == [b"short", b"after"]


def test_record_check_rejects_a_line_by_number_and_offset():
    check = lambda line: "not a number" if not line.isdigit() else None  # noqa: E731
    with pytest.raises(UnusableRecordError, match=r"record #2 at byte offset 4 of test stream: not a number"):
        lines_of(b"1\n2\nx\n4\n", check=check)
    assert lines_of(b"1\n2\nx\n4\n", check=check, skips=1) == [b"1", b"2", b"4"]


def test_textline_channel_through_fifos(job, tmp_path):
    files = [b"alpha\nbeta\n", b"gamma\n\ndelta"]
    job.add_channel("text")
    job.feed("text", [job.write(f"{i}.txt", data) for i, data in enumerate(files)], passes=2)
    ds = PipeModeDataset("text", record_format="TextLine")
    # unwrapped, the files are one stream: a file without a final newline runs into the next
    assert [x.numpy() for x in ds] == [b"alpha", b"beta", b"gamma", b"", b"delta"]
    assert [list(b.numpy()) for b in PipeModeDataset("text", "TextLine", batch_size=2)] == [
        [b"alpha", b"beta"], [b"gamma", b""], [b"delta"]]


def test_textline_in_a_recordio_wrapped_channel_keeps_files_apart(job):
    # (RecordIO's magic word, which its writer cuts records at, starts with a newline byte)
    files = [b"no final newline", b"two\nlines\n", b"", b"abc\n" + recordio.MAGIC_BYTES + b"def"]
    job.add_channel("text", wrapper="RecordIO")
    job.feed("text", [job.write(f"{i}.txt", data) for i, data in enumerate(files)], wrapper="RecordIO")
    assert [x.numpy() for x in PipeModeDataset("text", "TextLine")] == [
        b"no final newline", b"two", b"lines", b"abc", b"", recordio.MAGIC_BYTES[1:] + b"def"]
