"""TFRecord (or RecordIO) files, File and FastFile mode, read with the Pipe reader's own decoders.

tf.data.TFRecordDataset allocates whatever a record's length field says: a crafted length of 2**60
with a valid CRC crashes the whole process (exit 139, no failure file). Read here, the files get
what Pipe mode gets: lengths bounded, both CRCs checked, errors naming the file, the record and
its byte offset, the same opt-in skipping, and the same record_check.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Iterator

from pipemode import options
from pipemode.corruption import CorruptionPolicy
from pipemode.errors import UnreadableError
from pipemode.reader import PassStats
from pipemode.recordio import Combine, RecordIODecoder
from pipemode.tfrecord import MAX_RECORD_BYTES, RecordCheck, TFRecordDecoder

# Files read at once, their records taken in turn a chunk (~1 MiB) at a time: records of several
# files mix before any shuffle buffer, as tf.data's interleave would mix them.
CYCLE_LENGTH = 8


class FileReader:
    """Reads `files` in the order given, once per `read_pass()`, interleaving CYCLE_LENGTH of them.

    The order of the records is fixed by the order of the files: a pass read again is the same
    records in the same order (what exact resume relies on).
    """

    def __init__(
        self,
        files: list[str],
        channel: str,
        *,
        max_corrupted_records_to_skip: int = 0,
        check_crc: bool = True,
        max_record_bytes: int = MAX_RECORD_BYTES,
        record_check: RecordCheck | None = None,
        cycle_length: int = CYCLE_LENGTH,
        record_format: str = "TFRecord",
        combine: Combine | None = None,
    ):
        if record_format not in ("TFRecord", "RecordIO"):
            raise ValueError(f"record_format must be TFRecord or RecordIO, got {record_format!r}")
        self.files, self.channel = list(files), channel
        self.max_skips = options.max_corrupted_records_to_skip(max_corrupted_records_to_skip)
        self.check_crc, self.max_record_bytes = check_crc, options.max_record_bytes(max_record_bytes)
        self.record_check, self.cycle_length = record_check, cycle_length
        # RecordIO files: each record's payload, or with `combine`, what combine makes of it
        # (RecordIODecoder.groups, one record at a time)
        self.record_format, self.combine = record_format, combine
        self.history: list[PassStats] = []

    def read_pass(self) -> Iterator[list[bytes]]:
        """Yields the records of every file, in lists (one per chunk read)."""
        folder = os.path.commonpath([os.path.dirname(f) for f in self.files]) if self.files else "-"
        count = len(self.files)
        stats = PassStats(self.channel, len(self.history), f"{count} file{'s' if count != 1 else ''} in {folder}")
        self.history.append(stats)
        policy = CorruptionPolicy(self.max_skips)
        pending, reading = iter(self.files), collections.deque()
        started = time.perf_counter()
        try:
            for _ in range(self.cycle_length):
                self._open_next(pending, reading, policy, stats)
            while reading:
                stream, batches = reading.popleft()
                batch = next(batches, None)
                if batch is None:
                    stream.close()
                    self._open_next(pending, reading, policy, stats)
                    continue
                reading.append((stream, batches))
                stats.records += len(batch)
                yield batch
        finally:
            for stream, _ in reading:
                stream.close()
            stats.seconds = time.perf_counter() - started
            stats.skipped = policy.skipped

    def _open_next(self, pending, reading, policy, stats) -> None:
        name = next(pending, None)
        if name is None:
            return
        try:
            stream = open(name, "rb")
        except OSError as err:
            raise UnreadableError(f"cannot read file {name} of channel {self.channel!r}: {err.strerror}") from err

        def read(n: int) -> bytes:
            data = stream.read(n)
            stats.bytes += len(data)
            return data

        if self.record_format == "RecordIO":
            decoder = RecordIODecoder(policy)
            batches = (decoder.groups(read, f"file {name}", 1, self.combine, self.record_check, self.max_record_bytes)
                       if self.combine
                       else decoder.records(read, f"file {name}", self.record_check))
            reading.append((stream, batches))
            return
        decoder = TFRecordDecoder(policy, check_crc=self.check_crc, max_record_bytes=self.max_record_bytes,
                                  record_check=self.record_check)
        # (its size known: a damaged length that reaches past the file's end is corrupt at once)
        reading.append((stream, decoder.decode(read, f"file {name}", os.fstat(stream.fileno()).st_size)))
