"""The TextLine decoder against a reference written from its definition (AWS's reader: a line ends
at b"\\n", which is not part of it; b"\\r" is kept; the text after the last newline is one more
line), on text Hypothesis makes (any bytes, runs of newlines, carriage returns, RecordIO's magic
word), read a chunk of any size at a time, under any max_record_bytes, skip limit and record_check.
The decoder must give the reference's lines, in its order, then its error (kind, line number,
byte offset), or none; plain, and with each text file wrapped in a RecordIO record.

TextLine has no compiled part: these run in pure Python only.
"""

from __future__ import annotations

import contextlib

from hypothesis import given
from hypothesis import strategies as st

from pipemode import recordio, textline
from pipemode.corruption import CorruptionPolicy
from pipemode.errors import CorruptRecordError, UnusableRecordError
from pipemode.textline import TextLineDecoder
from tests.conftest import stream_reader
from tests.reader.test_recordio_properties import Policy

WHERE = "test stream"


# --- the reference, from the definition ---------------------------------------------------------------

def reference(data: bytes, max_record_bytes: int, max_skips: int, check=None, policy: Policy | None = None):
    """(lines, (error kind, line number, offset) or None): each line longer than max_record_bytes is
    a corrupt record, each that `check` refuses an unusable one; up to max_skips are skipped (or as
    `policy`, shared with other streams of the pass, allows), the next is the error. Lines are
    numbered from 0, bad ones included; a line's offset is its first byte's."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # (a final newline ends the last line; it does not start an empty one)
    policy, records, offset = policy or Policy(max_skips), [], 0
    try:
        for number, line in enumerate(lines):
            if len(line) > max_record_bytes:
                policy.fail(CorruptRecordError, number, offset)
            elif check is not None and check(line):
                policy.fail(UnusableRecordError, number, offset)
            else:
                records.append(line)
            offset += len(line) + 1
    except Policy.Raised as raised:
        return records, raised.args[0]
    return records, None


# --- the decoder under test -------------------------------------------------------------------------

@contextlib.contextmanager
def read_bytes(n: int):
    """The decoder's read size (1 MiB) set to n: lines, and long lines, cross reads."""
    kept = textline._READ_BYTES
    textline._READ_BYTES = n
    try:
        yield
    finally:
        textline._READ_BYTES = kept


def outcome(batches):
    records = []
    try:
        for batch in batches:
            records += batch
    except CorruptRecordError as err:  # (unusable ones are a kind of it)
        return records, (type(err), err.record, err.offset)
    return records, None


def decoded(data: bytes, read_size: int, max_record_bytes: int, max_skips: int, check=None):
    with read_bytes(read_size):
        decoder = TextLineDecoder(CorruptionPolicy(max_skips), max_record_bytes, check)
        return outcome(decoder.decode(stream_reader(data), WHERE))


# --- what Hypothesis makes --------------------------------------------------------------------------

pieces = st.one_of(st.binary(max_size=12), st.sampled_from([b"\n", b"\n\n", b"\r", b"\r\n", b"\n\r",
                                                            recordio.MAGIC_BYTES, b"x" * 40]))
texts = st.lists(pieces, max_size=16).map(b"".join)
read_sizes = st.one_of(st.integers(1, 50), st.just(1 << 20))
limits = st.one_of(st.just(2**31 - 1), st.integers(1, 45))


def refuses_odd_first_bytes(line: bytes) -> str | None:
    return "its first byte is odd" if line[:1] and line[0] % 2 else None


# --- the properties -----------------------------------------------------------------------------------

@given(data=texts, read_size=read_sizes)
def test_any_text_is_split_at_its_newlines_wherever_the_reads_end(data, read_size):
    lines, error = decoded(data, read_size, 2**31 - 1, 0)
    assert error is None and lines == reference(data, 2**31 - 1, 0)[0]
    assert b"\n".join(lines) + (b"\n" if data.endswith(b"\n") else b"") == data  # (nothing lost, nothing added)


@given(data=texts, read_size=read_sizes, max_record_bytes=limits, max_skips=st.integers(0, 4),
       check=st.booleans())
def test_the_decoder_gives_the_references_lines_then_its_error(data, read_size, max_record_bytes, max_skips, check):
    check = refuses_odd_first_bytes if check else None
    assert decoded(data, read_size, max_record_bytes, max_skips, check) == reference(data, max_record_bytes,
                                                                                     max_skips, check)


@given(before=st.lists(st.binary(max_size=8).map(lambda b: b.replace(b"\n", b"")), max_size=5),
       long=st.integers(11, 200), after=texts, read_size=read_sizes)
def test_a_line_over_the_limit_is_named_by_its_number_and_offset_however_it_is_read(before, long, after, read_size):
    head = b"".join(line + b"\n" for line in before)
    data = head + b"y" * long + b"\n" + after
    assert decoded(data, read_size, 10, 0) == (before, (CorruptRecordError, len(before), len(head)))
    lines, error = decoded(data, read_size, 10, 1)  # skipped: the next line is the one after it
    assert lines[: len(before)] == before and (error is None or error[1] > len(before))
    assert (lines, error) == reference(data, 10, 1)


@given(files=st.lists(texts, max_size=5), read_size=read_sizes, recordio_read_size=st.integers(1, 50),
       max_record_bytes=limits, max_skips=st.integers(0, 4))
def test_wrapped_text_files_are_read_each_on_its_own(files, read_size, recordio_read_size, max_record_bytes,
                                                     max_skips):
    """RecordWrapperType RecordIO: each file a record of its own, whose last line (with or without a
    newline) never runs into the next file's first; its lines numbered within the file. The files
    of one pass share one skip limit, as PipeReader reads them."""
    policy, expected, error = Policy(max_skips), [], None
    for number, text in enumerate(files):
        lines, error = reference(text, max_record_bytes, max_skips, policy=policy)
        expected += lines
        if error:
            error = (*error, f"{WHERE}, RecordIO record #{number}")
            break
    shared = CorruptionPolicy(max_skips)
    got, got_error = [], None
    kept = recordio._READ_BYTES
    recordio._READ_BYTES = recordio_read_size
    try:
        with read_bytes(read_size):
            data = recordio.encode(files)
            try:
                for stream in recordio.RecordIODecoder(shared).streams(stream_reader(data), WHERE):
                    for batch in TextLineDecoder(shared, max_record_bytes).decode(stream.read, stream.where,
                                                                                  stream.size):
                        got += batch
            except CorruptRecordError as err:
                got_error = (type(err), err.record, err.offset, err.where)
    finally:
        recordio._READ_BYTES = kept
    assert (got, got_error) == (expected, error)
