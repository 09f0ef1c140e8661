"""Opening a Pipe-mode FIFO: wait for it to appear and for its writer, with a time limit.

tf.data.TFRecordDataset cannot read a FIFO on TF 2.21 ("Illegal seek": it reads with pread), so
the bytes are read here, in Python, in large chunks. Every wait (for the FIFO, its writer, its
data) is a poll in slices of 0.25 s that an interrupt event ends: a job told to stop (SIGTERM)
while SageMaker has not written yet stops within a second, not at SIGKILL.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import os
import select
import stat
import threading
import time

from pipemode.errors import Interrupted, PipeConfigError, PipeTimeoutError

# Pipes hold 64 KiB by default, so each read returns at most 64 KiB and writer and reader
# take turns in tiny steps. 1 MiB (Linux's default pipe-max-size for unprivileged users) lets each
# read take far more (docs/speed.md, Figures behind the code's choices: Pipe buffer). Either end
# of a pipe may resize it.
PIPE_BUFFER_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_POLL_SLICE_S = 0.25
# Reads up to this size reuse the stream's buffer; a larger one (a record of many MB) gets its own.
_KEPT_BUFFER_BYTES = 16 << 20

# Set at interpreter exit so that a reader still waiting for a FIFO (say, in the prefetch thread
# of an iterator Keras created and dropped) gives up at once instead of holding exit hostage.
_exiting = threading.Event()
atexit.register(_exiting.set)


def open_fifo(path: str, timeout: float, describe: str, interrupt: threading.Event | None = None) -> FifoStream:
    """Opens `path` for reading once it exists and a writer has connected.

    Raises PipeTimeoutError if that takes longer than `timeout` seconds, Interrupted as soon as
    `interrupt` is set (then or in any later wait for data). `describe` names the channel and pass
    in messages. Regular files are accepted too (handy for debugging).
    """
    waits = _Waits(interrupt)
    deadline = time.monotonic() + timeout
    mode = _wait_for_path(path, deadline, timeout, describe, waits)
    if not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
        raise PipeConfigError(f"{path} ({describe}) exists but is neither a FIFO nor a file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if stat.S_ISFIFO(mode):
            _wait_for_writer(fd, path, deadline, timeout, describe, waits)
            grow_pipe(fd)
        return FifoStream(fd, waits)
    except BaseException:
        os.close(fd)
        raise


class _Waits:
    """Every wait of one reader: in slices, ending early once the reader is interrupted or the
    interpreter exits."""

    def __init__(self, interrupt: threading.Event | None):
        self.interrupt = interrupt

    def pause(self, seconds: float) -> None:
        (self.interrupt or _exiting).wait(min(seconds, _POLL_SLICE_S))
        if _exiting.is_set() or (self.interrupt is not None and self.interrupt.is_set()):
            raise Interrupted("interrupted while waiting for Pipe-mode data")


class FifoStream:
    """A FIFO opened non-blocking, read in chunks. A read waits for data in slices (poll), so a
    stop request (SIGTERM) is acted on while the writer is silent, not once it writes again.

    Reads land in one buffer kept for the stream's life, then leave as one bytes object: a FIFO
    returns whatever the writer has put in so far (a few hundred KB per read), and os.read(n) would
    allocate n fresh bytes per call, shrink them, then join the pieces, page-faulting every
    byte in twice (docs/speed.md, Figures behind the code's choices: One read buffer).
    """

    def __init__(self, fd: int, waits: _Waits):
        self.fd, self._waits = fd, waits
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN | select.POLLHUP)
        self._buffer = bytearray()

    def read(self, n: int) -> bytes:
        """n bytes, fewer only at the end of the stream (its writer closed it)."""
        buffer = self._buffer if n <= _KEPT_BUFFER_BYTES else bytearray()
        if len(buffer) < n:
            buffer.extend(bytes(n - len(buffer)))
        view, got = memoryview(buffer), 0
        try:
            while got < n:
                try:
                    count = os.readv(self.fd, [view[got:n]])
                except BlockingIOError:  # nothing written yet
                    while not self._poller.poll(_POLL_SLICE_S * 1000):
                        self._waits.pause(0)
                    continue
                if not count:
                    break
                got += count
            return bytes(view[:got])
        finally:
            view.release()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> FifoStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _wait_for_path(path: str, deadline: float, timeout: float, describe: str, waits: _Waits) -> int:
    delay = 0.005
    while True:
        try:
            return os.stat(path).st_mode
        except FileNotFoundError:
            pass
        if time.monotonic() >= deadline:
            folder = os.path.dirname(path) or "."
            seen = sorted(os.listdir(folder)) if os.path.isdir(folder) else None
            raise PipeTimeoutError(
                f"FIFO {path} ({describe}) did not appear within {timeout:g} s (wait_timeout). "
                + (f"{folder} holds: {', '.join(seen) or 'nothing'}. " if seen is not None
                   else f"{folder} does not exist. ")
                + "SageMaker creates <channel>_0, _1, ... one per pass in Pipe mode: check the "
                "channel name and that the job's InputDataConfig sets it to Pipe."
            )
        waits.pause(delay)
        delay = min(delay * 2, _POLL_SLICE_S)


def _wait_for_writer(fd: int, path: str, deadline: float, timeout: float, describe: str, waits: _Waits) -> None:
    # On Linux, poll() on a FIFO opened O_RDONLY|O_NONBLOCK reports nothing until a writer has
    # connected (POLLHUP only comes after a writer that connected later has left), so this waits
    # for the writer's first bytes or its close, without blocking in open().
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while not poller.poll(_POLL_SLICE_S * 1000):
        if time.monotonic() >= deadline:
            raise PipeTimeoutError(
                f"no process opened FIFO {path} ({describe}) for writing within {timeout:g} s "
                "(wait_timeout)"
            )
        waits.pause(0)


def grow_pipe(fd: int) -> None:
    """Pipe buffer of PIPE_BUFFER_BYTES for the pipe `fd` is either end of (the reader here, the
    writer in the local feeder), where the system allows it."""
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BUFFER_BYTES)
    except OSError as err:  # EPERM over /proc/sys/fs/pipe-max-size, EBUSY: keep the default
        if err.errno not in (errno.EPERM, errno.EBUSY, errno.EINVAL):
            raise
