"""Reading a Pipe-mode channel pass by pass, in plain Python (no TensorFlow here)."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator

from pipemode import channels, options
from pipemode.corruption import CorruptionPolicy
from pipemode.errors import Interrupted, PipeConfigError
from pipemode.fifo import open_fifo
from pipemode.passes import PassCounter
from pipemode.recordio import Combine, RecordIODecoder
from pipemode.textline import TextLineDecoder
from pipemode.tfrecord import MAX_RECORD_BYTES, RecordCheck, TFRecordDecoder

log = logging.getLogger(__name__)

RECORD_FORMATS = ("TFRecord", "RecordIO", "TextLine")
DEFAULT_WAIT_TIMEOUT_S = 600.0


@dataclasses.dataclass
class PassStats:
    channel: str
    number: int
    path: str
    records: int = 0
    bytes: int = 0
    skipped: int = 0
    seconds: float = 0.0
    interrupted: bool = False  # ended early: the reader's interrupt event was set

    def summary(self) -> str:
        rate = self.bytes / self.seconds / 1e6 if self.seconds else 0.0
        return (
            f"channel {self.channel!r} pass {self.number} ({self.path}): {self.records} records, "
            f"{self.bytes / 1e6:.1f} MB in {self.seconds:.2f} s ({rate:.0f} MB/s), "
            f"{self.skipped} corrupt records skipped"
        )


class PipeReader:
    """One Pipe-mode channel: checks its configuration, then reads one pass per `read_pass()`.

    The record format and the channel's RecordWrapperType together say how to split the stream:

        record_format  RecordWrapperType  the stream is                 records are
        TFRecord       None               TFRecord files, concatenated  the TFRecords
        TFRecord       RecordIO           each TFRecord file wrapped    the TFRecords inside
        RecordIO       None               RecordIO files, concatenated  the RecordIO payloads
        RecordIO       RecordIO           each S3 object wrapped        the objects (payloads)
        TextLine       None               text files, concatenated      the lines (no newline)
        TextLine       RecordIO           each text file wrapped        the lines of each file

    An augmented manifest's channel (S3DataType AugmentedManifestFile, RecordWrapperType RecordIO)
    streams one RecordIO record per listed attribute of each manifest line: read it as RecordIO
    with `group_records` set to the number of attributes, and `combine` making each line's
    payloads into one record (RecordIODecoder.groups).
    """

    def __init__(
        self,
        channel: str,
        record_format: str = "RecordIO",
        *,
        pipe_dir: str | os.PathLike | None = None,
        config_dir: str | os.PathLike | None = None,
        state_dir: str | os.PathLike | None = None,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT_S,
        max_corrupted_records_to_skip: int = 0,
        check_crc: bool = True,
        max_record_bytes: int = MAX_RECORD_BYTES,
        benchmark: bool = False,
        record_check: RecordCheck | None = None,
        interrupt: threading.Event | None = None,
        group_records: int = 1,
        combine: Combine | None = None,
    ):
        if record_format not in RECORD_FORMATS:
            raise PipeConfigError(
                f"record_format {record_format!r} is not supported; use one of {', '.join(RECORD_FORMATS)}"
            )
        if (group_records != 1 or combine) and (record_format != "RecordIO" or not combine or group_records < 1):
            raise PipeConfigError("group_records and combine go together, with record_format RecordIO (one "
                                  f"record per attribute of an augmented manifest's line); got {record_format}, "
                                  f"group_records={group_records}, combine={combine!r}")
        max_corrupted_records_to_skip = options.max_corrupted_records_to_skip(max_corrupted_records_to_skip)
        max_record_bytes = options.max_record_bytes(max_record_bytes)
        if not wait_timeout > 0:
            raise PipeConfigError(f"wait_timeout must be > 0 seconds, got {wait_timeout}")
        self.channel = channel
        self.record_format = record_format
        self.pipe_dir = os.fspath(pipe_dir or channels.input_data_dir())
        self.config = _pipe_channel(channel, config_dir or channels.input_config_dir())
        self.wait_timeout = wait_timeout
        self.max_skips = max_corrupted_records_to_skip
        self.check_crc = check_crc
        self.max_record_bytes = max_record_bytes
        self.benchmark = benchmark
        self.record_check = record_check
        self.interrupt = interrupt
        self.group_records, self.combine = group_records, combine
        self.history: list[PassStats] = []
        self._passes = PassCounter(channel, self.pipe_dir, os.fspath(state_dir) if state_dir else None)

    def read_pass(self) -> Iterator[list[bytes]]:
        """Yields the records of the next pass, in lists (one per chunk read).

        The pass number is claimed when iteration starts, not when this is called, so an
        iterator that is created but never advanced costs no pass.
        """
        number = self._passes.claim()
        path = os.path.join(self.pipe_dir, f"{self.channel}_{number}")
        where = f"channel {self.channel!r} pass {number} (FIFO {path})"
        stats = PassStats(self.channel, number, path)
        self.history.append(stats)
        policy = CorruptionPolicy(self.max_skips)
        started = time.perf_counter()
        finished = False
        try:
            with open_fifo(path, self.wait_timeout, f"channel {self.channel!r}, pass {number}", self.interrupt) as fifo:
                log.info("reading %s", where)

                def read(n: int) -> bytes:
                    data = fifo.read(n)
                    stats.bytes += len(data)
                    return data

                for records in self._decode(read, where, policy):
                    stats.records += len(records)
                    yield records
                finished = True
        except Interrupted:  # a stop was requested: the pass ends here, as if it were over
            stats.interrupted = True
        finally:
            stats.seconds = time.perf_counter() - started
            stats.skipped = policy.skipped
            ended = "finished" if finished else "interrupted" if stats.interrupted else "stopped reading"
            log.info("%s %s", ended, stats.summary())
        if self.benchmark:
            print(stats.summary(), flush=True)

    def _decode(self, read, where: str, policy: CorruptionPolicy) -> Iterator[list[bytes]]:
        if self.record_format == "RecordIO" and self.combine:
            yield from RecordIODecoder(policy).groups(read, where, self.group_records, self.combine, self.record_check,
                                                      self.max_record_bytes)
            return
        if self.record_format == "RecordIO":
            yield from RecordIODecoder(policy).records(read, where, self.record_check)
            return
        if self.record_format == "TextLine":
            inner = TextLineDecoder(policy, self.max_record_bytes, self.record_check)
        else:
            inner = TFRecordDecoder(
                policy, check_crc=self.check_crc, max_record_bytes=self.max_record_bytes,
                record_check=self.record_check,
            )
        if self.config.record_wrapper != "RecordIO":
            yield from inner.decode(read, where)
            return
        for stream in RecordIODecoder(policy).streams(read, where):
            yield from inner.decode(stream.read, stream.where, stream.size)


def _pipe_channel(channel: str, config_dir) -> channels.ChannelConfig:
    configs = channels.read_input_data_config(config_dir)
    if channel not in configs:
        raise PipeConfigError(
            f"channel {channel!r} is not in {os.path.join(config_dir, 'inputdataconfig.json')}; "
            f"the job's channels are: {', '.join(sorted(configs)) or 'none'}"
        )
    config = configs[channel]
    if config.input_mode != "Pipe":
        raise PipeConfigError(
            f"channel {channel!r} is in {config.input_mode} mode, not Pipe: its data is in "
            f"input/data/{channel}/ as files (read those with tf.data.TFRecordDataset), or set "
            f"the channel's InputMode to Pipe"
        )
    return config
