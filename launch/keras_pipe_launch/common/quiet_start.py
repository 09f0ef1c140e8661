"""TensorFlow's start-up notices kept out of the launcher's terminal.

`import tensorflow` (2.21) writes notices to the process's stderr from C++, before any Python
logging is set up, so neither `logging` nor TF_CPP_MIN_LOG_LEVEL (levels 1-3 were tried) stops
them: twice "WARNING: All log messages before absl::InitializeLog() is called are written to
STDERR" and the oneDNN notice, and CPU builds add the instruction-set one. A command that
prints three lines of results (`keras-pipe prepare`) printed six of those around them.

So the launcher's commands import TensorFlow with its stderr (file descriptor 2) read through a
pipe for the duration of the import, and every line passes on to the real stderr as it comes,
except those INFO notices (warnings and errors still show, as does what came before a crash).
`TF_CPP_MIN_LOG_LEVEL=0`, TensorFlow's own way to ask for its INFO lines, shows them all again.
The training job's own log is left alone: SageMaker users read it in CloudWatch as TensorFlow
wrote it (`keras-pipe local` relays it the same way).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import threading

# The notices dropped: absl's note on logging before its initialisation, any INFO line
# (I<MMDD> <time> <thread> <file>:<line>] ...: oneDNN, the CPU instruction sets), and the
# instruction-set notice's second line, which has no prefix
NOTICE = re.compile(rb"WARNING: All log messages before absl::InitializeLog\(\)|I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ "
                    rb"[\w.]+:\d+\] |To enable the following instructions: ")


def asked_for() -> bool:
    """Whether the user asked to see TensorFlow's INFO lines (TF_CPP_MIN_LOG_LEVEL=0)."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() == "0"


@contextlib.contextmanager
def notices_dropped(stream_fd: int = 2):
    """Within: what is written to `stream_fd` passes on line by line, the NOTICE lines left out."""
    sys.stderr.flush()
    kept = os.dup(stream_fd)
    read_end, write_end = os.pipe()
    relay = threading.Thread(target=_relay, args=(read_end, kept), name="quiet-start", daemon=True)
    relay.start()
    os.dup2(write_end, stream_fd)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(kept, stream_fd)  # (the pipe's last writer gone: the relay reads its end, then stops)
        relay.join()
        os.close(kept)


def _relay(read_end: int, out_fd: int) -> None:
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            *lines, pending = (pending + chunk).split(b"\n")
            _write(out_fd, [line + b"\n" for line in lines])
        _write(out_fd, [pending] if pending else [])


def _write(out_fd: int, lines: list[bytes]) -> None:
    data = b"".join(line for line in lines if not NOTICE.match(line))
    while data:
        data = data[os.write(out_fd, data):]


class _QuietImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `tensorflow` (once) as the other finders do, and runs its import within notices_dropped."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # (the search below, and any later import, as usual)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        self.loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with notices_dropped():
            self.loader.exec_module(module)


def quiet_tensorflow_start() -> None:
    """From now on, TensorFlow's first import in this process drops its start-up notices (unless
    the user asked for them, or it is imported already)."""
    if "tensorflow" in sys.modules or asked_for() or any(isinstance(f, _QuietImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _QuietImport())
