"""Feeds a Pipe-mode channel the way SageMaker does: one FIFO per pass, <channel>_0, _1, ...

For each pass: create the FIFO, wait for the job to open it, write every object of the channel
(concatenated as they are, or each wrapped as one RecordIO record), close it, go on to the next
pass. A reader that closes early ends its pass (EPIPE); the next pass starts as usual.

    python -m launch.pipe_feeder --dir JOB/input/data --channel train [--passes N] FILE...

The --chunk-bytes/--pause/--die-after-bytes options exist to test readers against slow and
dying writers.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import logging
import os
import signal
import stat
import sys
import time
from collections.abc import Iterator, Sequence

from train.pipe import recordio

log = logging.getLogger("launch.pipe_feeder")

_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_BLOCK = 1 << 20


class PipeFeeder:
    def __init__(
        self,
        fifo_dir: str,
        channel: str,
        objects: Sequence[str],
        *,
        record_wrapper: str = "None",
        chunk_bytes: int = 0,
        pause: float = 0.0,
        die_after_bytes: int | None = None,
    ):
        if record_wrapper not in ("None", "RecordIO"):
            raise ValueError(f"record_wrapper must be None or RecordIO, got {record_wrapper!r}")
        self.fifo_dir, self.channel, self.objects = fifo_dir, channel, list(objects)
        self.record_wrapper = record_wrapper
        self.chunk_bytes, self.pause = chunk_bytes, pause
        self.die_after_bytes = die_after_bytes
        self._written_total = 0

    def fifo_path(self, number: int) -> str:
        return os.path.join(self.fifo_dir, f"{self.channel}_{number}")

    def run(self, passes: int | None = None) -> None:
        """Feeds `passes` passes (forever when None)."""
        number = 0
        while passes is None or number < passes:
            self.feed_pass(number)
            number += 1

    def feed_pass(self, number: int) -> int:
        path = self.fifo_path(number)
        _make_fifo(path)
        fd = os.open(path, os.O_WRONLY)  # blocks until the job opens the FIFO for reading
        written = 0
        try:
            try:
                fcntl.fcntl(fd, _F_SETPIPE_SZ, _BLOCK)
            except OSError:
                pass
            for piece in self._pass_bytes():
                written += self._write(fd, piece)
        except BrokenPipeError:
            log.info("%s: the reader closed the FIFO after %d bytes", path, written)
        finally:
            os.close(fd)
        log.info("%s: pass %d fed, %d bytes", self.channel, number, written)
        return written

    def _pass_bytes(self) -> Iterator[bytes]:
        for name in self.objects:
            if self.record_wrapper == "RecordIO":
                yield from _recordio_wrapped(name)
            else:
                with open(name, "rb") as f:
                    yield from iter(lambda: f.read(_BLOCK), b"")

    def _write(self, fd: int, data: bytes) -> int:
        step = self.chunk_bytes or len(data) or 1
        view = memoryview(data)
        for start in range(0, len(data), step):
            piece = view[start : start + step]
            if self.die_after_bytes is not None:
                room = self.die_after_bytes - self._written_total
                if room <= len(piece):
                    _write_all(fd, piece[:room])
                    os.kill(os.getpid(), signal.SIGKILL)  # die like a crashed writer
            _write_all(fd, piece)
            self._written_total += len(piece)
            if self.pause:
                time.sleep(self.pause)
        return len(data)


def _write_all(fd: int, data) -> None:
    while data:
        data = data[os.write(fd, data):]


def _make_fifo(path: str) -> None:
    try:
        os.mkfifo(path)
    except FileExistsError:
        if not stat.S_ISFIFO(os.stat(path).st_mode):
            raise


def _recordio_wrapped(name: str) -> Iterator[bytes]:
    """The file as one RecordIO record, streamed: the bytes recordio.encode_record() makes.

    Part lengths must be known before each part is written, so a first read of the file finds
    where the payload is cut; the second streams the parts.
    """
    with open(name, "rb") as f:
        cuts = recordio.find_cuts(iter(lambda: f.read(_BLOCK), b""))
        size = f.tell()
        f.seek(0)

        def copy(start: int, end: int) -> Iterator[bytes]:
            f.seek(start)
            count = end - start
            while count > 0:
                block = f.read(min(count, _BLOCK))
                if not block:
                    raise EOFError(f"{name} shrank while being fed")
                count -= len(block)
                yield block

        yield from recordio.wrap(size, cuts, copy)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launch.pipe_feeder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("objects", nargs="+", help="files to feed, in order, every pass")
    parser.add_argument("--dir", required=True, help="where the FIFOs go (JOB/input/data)")
    parser.add_argument("--channel", required=True)
    parser.add_argument("--passes", type=int, default=None, help="default: until killed")
    parser.add_argument("--record-wrapper", choices=("None", "RecordIO"), default="None")
    parser.add_argument("--chunk-bytes", type=int, default=0, help="write in pieces of this size")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to sleep after each piece")
    parser.add_argument("--die-after-bytes", type=int, default=None,
                        help="SIGKILL this process after writing this many bytes in all")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="feeder: %(message)s", stream=sys.stderr)
    feeder = PipeFeeder(args.dir, args.channel, args.objects, record_wrapper=args.record_wrapper,
                        chunk_bytes=args.chunk_bytes, pause=args.pause,
                        die_after_bytes=args.die_after_bytes)
    try:
        feeder.run(args.passes)
    except KeyboardInterrupt:
        return 130
    except OSError as err:
        if err.errno == errno.ENOENT:
            print(f"feeder: {err}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
