"""Feeds a Pipe-mode channel the way SageMaker does: one FIFO per pass, <channel>_0, _1, ...

For each pass: create the FIFO, wait for the job to open it, write the channel's objects into it
(in key order, or shuffled anew every pass with ShuffleConfig; this host's share of them with
ShardedByS3Key; gunzipped with CompressionType Gzip; each wrapped as one RecordIO record with
RecordWrapperType RecordIO), close it, go on to the next pass. A reader that closes early ends
its pass (EPIPE) and the next one starts as usual. Nothing is held in memory beyond a 1 MiB chunk.

    python -m keras_pipe_launch.local.feeder --dir JOB/input/data --channel train [--passes N] SOURCE...

The --chunk-bytes/--pause/--die-after-bytes options exist to test readers against slow and dying
writers.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import logging
import os
import random
import signal
import stat
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence

from keras_pipe_launch.common.channels import ChannelSpec
from keras_pipe_launch.common.objects import StoredObject, list_objects
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.local.manifest import ManifestLine
from pipemode import recordio, tfrecord
from pipemode.fifo import grow_pipe

log = logging.getLogger("keras_pipe_launch.local.feeder")

_BLOCK = 1 << 20
PROGRESS_EVERY_S = 15.0


class FeedError(RuntimeError):
    """An object could not be fed (unreadable, not gzip, too big for RecordIO)."""


@dataclasses.dataclass
class PassReport:
    channel: str
    host: str
    number: int
    objects: int = 0
    bytes: int = 0
    records: int | None = None  # TFRecords, when the stream is TFRecord
    seconds: float = 0.0
    complete: bool = False  # False: the reader closed the FIFO before the end

    def summary(self) -> str:
        rate = self.bytes / self.seconds / 1e6 if self.seconds else 0.0
        what = f"{self.records} records" if self.records is not None else f"{self.objects} objects"
        per_s = f", {self.records / self.seconds:.0f} records/s" if self.records is not None and self.seconds else ""
        end = "" if self.complete else " (the job closed the FIFO early)"
        return (f"{self.host}/{self.channel} pass {self.number}: {what}, {self.bytes / 1e6:.1f} MB in "
                f"{self.seconds:.2f} s ({rate:.1f} MB/s{per_s}){end}")


class PipeFeeder:
    def __init__(
        self,
        fifo_dir: str,
        spec: ChannelSpec,
        objects: Sequence[StoredObject],
        *,
        host: str = "algo-1",
        host_index: int = 0,
        host_count: int = 1,
        spool_dir: str | None = None,
        stop: threading.Event | None = None,
        on_report: Callable[[PassReport], None] | None = None,
        chunk_bytes: int = 0,
        pause: float = 0.0,
        die_after_bytes: int | None = None,
    ):
        self.fifo_dir, self.spec, self.objects = fifo_dir, spec, list(objects)
        self.host, self.host_index, self.host_count = host, host_index, host_count
        self.spool_dir = spool_dir
        self.stop = stop or threading.Event()
        self.on_report = on_report or (lambda report: log.info("%s", report.summary()))
        self.chunk_bytes, self.pause, self.die_after_bytes = chunk_bytes, pause, die_after_bytes
        self._written_total = 0

    def objects_for_pass(self, number: int) -> list[StoredObject]:
        """This host's objects for pass `number`, in feeding order."""
        objects = list(self.objects)
        if self.spec.shuffle_seed is not None:
            # a fresh order every pass, the same for a given seed (and on every host, so that
            # ShardedByS3Key splits one shuffled list: the shards never overlap)
            random.Random(f"{self.spec.shuffle_seed}/{number}").shuffle(objects)
        if self.spec.distribution == "ShardedByS3Key":
            objects = objects[self.host_index::self.host_count]
        return objects

    def fifo_path(self, number: int) -> str:
        return os.path.join(self.fifo_dir, f"{self.spec.name}_{number}")

    def run(self, passes: int | None = None) -> None:
        """Feeds `passes` passes (until stopped when None)."""
        number = 0
        while (passes is None or number < passes) and not self.stop.is_set():
            if self.feed_pass(number) is None:
                return
            number += 1

    def feed_pass(self, number: int) -> PassReport | None:
        """Feeds one pass; None if stopped before the job opened the FIFO."""
        path = self.fifo_path(number)
        _make_fifo(path)
        fd = self._open_when_read(path)
        if fd is None:
            return None
        report = PassReport(self.spec.name, self.host, number)
        counter = TFRecordCounter()
        started = last = time.perf_counter()
        try:
            for obj in self.objects_for_pass(number):
                report.objects += 1
                for piece in self._object_bytes(obj):
                    self._write(fd, piece)
                    report.bytes += len(piece)
                    counter.feed(piece)
                    if time.perf_counter() - last > PROGRESS_EVERY_S:
                        last = time.perf_counter()
                        report.seconds, report.records = last - started, counter.count
                        self.on_report(report)
                    if self.stop.is_set():
                        return report
            report.complete = True
        except BrokenPipeError:
            pass  # the job closed its end: this pass is over
        finally:
            os.close(fd)
            report.seconds = time.perf_counter() - started
            report.records = counter.count if counter.valid and self.spec.record_wrapper == "None" else None
        self.on_report(report)
        return report

    def _open_when_read(self, path: str) -> int | None:
        """Opens the FIFO for writing once the job opens it for reading (polling, so that a stop
        request is noticed: a plain open() would block until a reader comes, maybe never)."""
        while True:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as err:
                if err.errno != errno.ENXIO:  # ENXIO: no reader yet
                    raise
            if self.stop.wait(0.02):
                return None
        os.set_blocking(fd, True)
        grow_pipe(fd)
        return fd

    def _object_bytes(self, obj: StoredObject | ManifestLine) -> Iterator[bytes]:
        if isinstance(obj, ManifestLine):
            yield from self._line_records(obj)
            return
        try:
            chunks = obj.chunks()
            if self.spec.compression == "Gzip":
                chunks = gunzip(chunks, obj.location)
            if self.spec.record_wrapper == "RecordIO":
                yield from self._recordio_wrapped(obj, chunks)
            else:
                yield from chunks
        except (OSError, zlib.error) as err:
            if isinstance(err, BrokenPipeError):
                raise
            raise FeedError(f"cannot feed {shown(obj.location)}: {shown(str(err))}") from err

    def _line_records(self, line: ManifestLine) -> Iterator[bytes]:
        """An augmented manifest's line: one RecordIO record per listed attribute (local.manifest)."""
        from botocore.exceptions import BotoCoreError, ClientError

        for value in line.values:
            if isinstance(value, bytes):
                yield recordio.encode_record(value)
                continue
            try:
                yield from self._recordio_wrapped(value, value.chunks())
            except (OSError, ClientError, BotoCoreError) as err:
                if isinstance(err, BrokenPipeError):
                    raise
                raise FeedError(f"cannot feed {shown(line.location)}: {shown(value.location)}: "
                                f"{shown(str(err))}") from err

    def _recordio_wrapped(self, obj: StoredObject, chunks: Iterator[bytes]) -> Iterator[bytes]:
        local = obj.store.local_path(obj) if self.spec.compression == "None" else None
        if local:
            yield from recordio_wrapped_file(local)
            return
        # part lengths must be known before each part is written: spool the object to disk first
        with tempfile.NamedTemporaryFile(dir=self.spool_dir, prefix="spool-") as spool:
            for chunk in chunks:
                spool.write(chunk)
            spool.flush()
            yield from recordio_wrapped_file(spool.name)

    def _write(self, fd: int, data: bytes) -> None:
        step = self.chunk_bytes or len(data) or 1
        view = memoryview(data)
        for start in range(0, len(data), step):
            piece = view[start:start + step]
            if self.die_after_bytes is not None and self._written_total + len(piece) >= self.die_after_bytes:
                _write_all(fd, piece[: self.die_after_bytes - self._written_total])
                os.kill(os.getpid(), signal.SIGKILL)  # die like a crashed writer
            _write_all(fd, piece)
            self._written_total += len(piece)
            if self.pause:
                time.sleep(self.pause)


def gunzip(chunks: Iterable[bytes], name: str) -> Iterator[bytes]:
    """Decompresses a gzip stream as it goes, several concatenated members included. Output comes
    in pieces of at most 1 MiB, however well the data compresses."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    between_members = True
    for data in chunks:
        while data:
            between_members = False
            out = decompressor.decompress(data, _BLOCK)
            if out:
                yield out
            if decompressor.eof:  # a member ended; another may follow in the same object
                data = decompressor.unused_data
                decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
                between_members = True
            else:
                data = decompressor.unconsumed_tail
    if not between_members:
        raise FeedError(f"{shown(name)}: the gzip stream is truncated")


def recordio_wrapped_file(name: str) -> Iterator[bytes]:
    """The file as one RecordIO record, streamed: the bytes recordio.encode_record() makes.

    Part lengths must be known before each part is written, so a first read of the file finds
    where the payload is cut; the second streams the parts.
    """
    with open(name, "rb") as f:
        cuts = recordio.find_cuts(iter(lambda: f.read(_BLOCK), b""))
        size = f.tell()
        if size > recordio.MAX_PART_BYTES:
            raise FeedError(f"{shown(name)}: {size} bytes; a RecordIO record must be shorter than 2**29 bytes")

        def copy(start: int, end: int) -> Iterator[bytes]:
            f.seek(start)
            count = end - start
            while count > 0:
                block = f.read(min(count, _BLOCK))
                if not block:
                    raise FeedError(f"{shown(name)} shrank while being fed")
                count -= len(block)
                yield block

        yield from recordio.wrap(size, cuts, copy)


class TFRecordCounter:
    """Counts the TFRecords of a byte stream as it passes, for progress reports. Stops counting
    (valid=False) at the first length whose CRC does not match: the stream is not TFRecord."""

    def __init__(self):
        self.count = 0
        self.valid = True
        self._skip = 0  # bytes left of the current record's data and footer
        self._header = b""

    def feed(self, data: bytes) -> None:
        pos, size = 0, len(data)
        while self.valid:
            if self._skip:
                step = min(self._skip, size - pos)
                self._skip -= step
                pos += step
                if self._skip:
                    return
            need = tfrecord.HEADER_BYTES - len(self._header)
            self._header += data[pos:pos + need]
            pos += min(need, size - pos)
            if len(self._header) < tfrecord.HEADER_BYTES:
                return
            length = tfrecord.header_length(self._header)
            if length is None:
                self.valid = False
                return
            self._header = b""
            self.count += 1
            self._skip = length + tfrecord.FOOTER_BYTES


def _write_all(fd: int, data) -> None:
    while data:
        data = data[os.write(fd, data):]


def _make_fifo(path: str) -> None:
    try:
        os.mkfifo(path)
    except FileExistsError:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keras_pipe_launch.local.feeder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sources", nargs="+", help="local files/folders or s3:// prefixes, fed in this order")
    parser.add_argument("--dir", required=True, help="where the FIFOs go (JOB/input/data)")
    parser.add_argument("--channel", required=True)
    parser.add_argument("--passes", type=int, default=None, help="default: until killed")
    parser.add_argument("--record-wrapper", choices=("None", "RecordIO"), default="None")
    parser.add_argument("--compression", choices=("None", "Gzip"), default="None")
    parser.add_argument("--shuffle-seed", type=int, default=None)
    parser.add_argument("--chunk-bytes", type=int, default=0, help="write in pieces of this size")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to sleep after each piece")
    parser.add_argument("--die-after-bytes", type=int, default=None,
                        help="SIGKILL this process after writing this many bytes in all")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="feeder: %(message)s", stream=sys.stderr)
    spec = ChannelSpec(args.channel, args.sources[0], record_wrapper=args.record_wrapper,
                       compression=args.compression, shuffle_seed=args.shuffle_seed)
    objects = [obj for source in args.sources for obj in list_objects(source)]
    feeder = PipeFeeder(args.dir, spec, objects, chunk_bytes=args.chunk_bytes, pause=args.pause,
                        die_after_bytes=args.die_after_bytes)
    try:
        feeder.run(args.passes)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
