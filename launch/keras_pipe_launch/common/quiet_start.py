"""TensorFlow's start-up notices kept out of the launcher's terminal.

`import tensorflow` (2.21) writes notices to the process's stderr from C++, before any Python
logging is set up, so neither `logging` nor TF_CPP_MIN_LOG_LEVEL (at any level from 1 to 3) stops
them: twice "WARNING: All log messages before absl::InitializeLog() is called are written to
STDERR" and the oneDNN notice, and CPU builds add the instruction-set one. A command that
prints three lines of results (`keras-pipe prepare`) would print six of those around them.

So the launcher's programs import TensorFlow with its stderr (file descriptor 2) sent through a
pipe for the duration of the import, to a small relay process that passes every line on to the
real stderr as it comes, except those INFO notices: warnings and errors still show, and a line
that stays without its newline for a moment is passed on as it is. A process, not a thread: the
relay outlives an import that aborts the process (TensorFlow's fatal "Check failed" lines, or its
"compiled to use AVX" refusal, then abort()), still shows what it said, and never waits on this
process's GIL (C code that writes more than the pipe holds while holding it would deadlock with a
thread). `TF_CPP_MIN_LOG_LEVEL=0`, TensorFlow's own way to ask for its INFO lines, shows them all
again. A training job's own log is left alone: SageMaker users read it in CloudWatch as TensorFlow
wrote it (`keras-pipe local` relays it the same way).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from keras_pipe_train.settings.first_import import around_first_import

# The notices dropped: absl's note on logging before its initialisation, any INFO line
# (I<MMDD> <time> <thread> <file>:<line>] ...: oneDNN, the CPU instruction sets; before absl is
# initialised the time is seconds since 1970), and the instruction-set notice's second line,
# which has no prefix
NOTICE = (rb"WARNING: All log messages before absl::InitializeLog\(\)|I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.]+:\d+\] "
          rb"|To enable the following instructions: ")
# How long the import's end waits for the relay to pass the last lines on: it ends as soon as the
# pipe has no writer left, unless a process started during the import holds it (that one's lines
# are then relayed as it writes them, after)
RELAY_END_S = 2.0

# The relay: stdin (the pipe) to stdout (the real stderr), line by line, NOTICE lines left out; a
# partial line is passed on once nothing more has come for 50 ms (a notice is written whole). It
# ignores Ctrl-C (it ends with the pipe), and once its output is gone (a closed terminal) it goes on
# reading, so that no writer ever blocks on a full pipe.
_RELAY = rf"""
import os, re, select, signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
notice, pending, lost = re.compile({NOTICE!r}), b"", False
def out(data):
    global lost
    while data and not lost:
        try:
            data = data[os.write(1, data):]
        except OSError:
            lost = True
while True:
    if pending and not select.select([0], [], [], 0.05)[0]:
        out(pending)
        pending = b""
        continue
    chunk = os.read(0, 65536)
    if not chunk:
        break
    *lines, pending = (pending + chunk).split(b"\n")
    out(b"".join(line + b"\n" for line in lines if not notice.match(line)))
if pending and not notice.match(pending):
    out(pending)
"""


def asked_for() -> bool:
    """Whether the user asked to see TensorFlow's INFO lines (TF_CPP_MIN_LOG_LEVEL=0)."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() == "0"


@contextlib.contextmanager
def notices_dropped(stream_fd: int = 2):
    """Within: what is written to `stream_fd` passes on line by line, the NOTICE lines left out."""
    sys.stderr.flush()
    kept = os.dup(stream_fd)
    try:
        read_end, write_end = os.pipe()
        try:
            relay = subprocess.Popen([sys.executable, "-I", "-S", "-c", _RELAY], stdin=read_end, stdout=kept,
                                     close_fds=True)
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        try:
            try:
                os.dup2(write_end, stream_fd)
            finally:
                os.close(write_end)
            yield
        finally:
            sys.stderr.flush()
            os.dup2(kept, stream_fd)  # (the pipe's last writer gone: the relay reads its end, then stops)
            try:
                relay.wait(RELAY_END_S)
            except subprocess.TimeoutExpired:
                _still_relaying.append(relay)  # (a process started during the import holds the pipe)
    finally:
        os.close(kept)


_still_relaying: list[subprocess.Popen] = []


def quiet_tensorflow_start() -> None:
    """From now on, TensorFlow's first import in this process drops its start-up notices (unless
    the user asked for them, or it is imported already)."""
    if not asked_for():
        around_first_import("tensorflow", notices_dropped, key="keras-pipe: TensorFlow's notices dropped")
