"""TextLine framing: records are the lines of the stream, as AWS's PipeModeDataset reads them.

A line ends at b"\\n", which is not part of the record; b"\\r" is kept (as AWS's reader does).
An empty line is an empty record; the text after the last newline, if any, is the last record (so
a final newline adds no empty record). A line longer than max_record_bytes is corrupt: without
that bound a stream with no newline would be held in memory whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from pipemode import options
from pipemode.corruption import CorruptionPolicy
from pipemode.errors import CorruptRecordError, UnusableRecordError

Read = Callable[[int], bytes]
_READ_BYTES = 1 << 20  # see tfrecord.CHUNK_BYTES for why not more


class TextLineDecoder:
    def __init__(self, policy: CorruptionPolicy, max_record_bytes: int, record_check=None):
        self.policy = policy
        self.max_record_bytes = options.max_record_bytes(max_record_bytes)
        self.record_check = record_check

    def decode(self, read: Read, where: str, size: int | None = None) -> Iterator[list[bytes]]:
        """The lines of the stream `read` returns, in lists (one per chunk read). (`size`, the
        stream's length when known, changes nothing here: a line ends at its newline.)"""
        parts: list[bytes] = []  # the start of a line whose end has not been read yet, in pieces
        size = 0  # their length (a list, so that a long line is not copied once per chunk)
        offset = 0  # the stream offset where that line starts
        number = 0  # lines so far
        dropping = False  # inside a too-long line already reported and skipped
        while chunk := read(_READ_BYTES):
            lines = chunk.split(b"\n")
            tail = lines.pop()
            if lines:
                head = lines[0]
                if dropping:  # the end of the skipped line: not a record
                    offset += size + len(head) + 1
                    lines = lines[1:]
                else:
                    lines[0] = b"".join(parts) + head if parts else head
                records, offset, number, error = self._checked(lines, offset, number, where)
                if records:
                    yield records
                if error is not None:
                    raise error
                parts, size, dropping = [], 0, False
            if tail:
                parts.append(tail)
                size += len(tail)
            if size > self.max_record_bytes and not dropping:
                self._too_long(where, number, offset)
                number += 1
                dropping = True
            if dropping:  # keep counting the skipped line's bytes, not the bytes themselves
                offset += size
                parts, size = [], 0
        if parts and not dropping:
            records, _, _, error = self._checked([b"".join(parts)], offset, number, where)
            if records:
                yield records
            if error is not None:
                raise error

    def _checked(self, lines: list[bytes], offset: int, number: int, where: str):
        """(the usable lines, the stream offset and line number after them, the error of the first
        line not skipped or None): the lines before a bad one are handed on before its error."""
        records = []
        for line in lines:
            try:
                if len(line) > self.max_record_bytes:
                    self._too_long(where, number, offset)
                elif self.record_check and (problem := self.record_check(line)):
                    self.policy.skip_or_raise(UnusableRecordError(where, number, offset, problem))
                else:
                    records.append(line)
            except CorruptRecordError as error:  # (unusable ones are a kind of it)
                return records, offset, number, error
            number += 1
            offset += len(line) + 1
        return records, offset, number, None

    def _too_long(self, where: str, number: int, offset: int) -> None:
        self.policy.skip_or_raise(CorruptRecordError(
            where, number, offset,
            f"a line longer than max_record_bytes={self.max_record_bytes} bytes (no newline within "
            f"it: is this channel's data really text lines?)"))
