"""Which pass (which FIFO, <channel>_<N>) the next reader of a channel gets.

Every FIFO can be read once, by one reader. Each iteration over a Pipe dataset (a Keras epoch,
a second `for` loop, a `repeat()`) therefore claims the next pass number of its channel. Claims
are shared by every dataset over the channel in this process; with a `state_dir`, by every
process on the host too (through a locked file, as AWS's state_dir does).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from pathlib import Path

from pipemode.errors import PipeConfigError

_lock = threading.Lock()
_next_pass: dict[tuple[str, str], int] = {}


def state_file_name(channel: str, pipe_dir: str) -> str:
    """The state file of a channel's FIFOs in `pipe_dir`. FIFOs are named by folder and channel, so
    readers of the same channel name in two folders (two local jobs, tests, benchmarks) must not
    share pass numbers, even with one state_dir (AWS's keeps one file per channel name)."""
    digest = hashlib.sha256(os.path.realpath(pipe_dir).encode()).hexdigest()[:12]
    return f"{channel}.{digest}.next_pass"


class PassCounter:
    def __init__(self, channel: str, pipe_dir: str, state_dir: str | None = None):
        self._key = (os.path.realpath(pipe_dir), channel)
        self._state_file = Path(state_dir) / state_file_name(channel, pipe_dir) if state_dir else None
        if self._state_file:
            try:
                self._state_file.parent.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise PipeConfigError(
                    f"cannot create the pass-state folder {state_dir} ({err.strerror}): pass "
                    f"state_dir= a writable folder, or set $SAGEMAKER_BASE_DIR"
                ) from err

    def claim(self) -> int:
        """The next pass number of the channel, never handed out twice."""
        with _lock:
            if self._state_file is None:
                number = _next_pass.get(self._key, 0)
                _next_pass[self._key] = number + 1
                return number
            with open(self._state_file, "a+") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                f.seek(0)
                number = int(f.read().strip() or 0)
                f.seek(0)
                f.truncate()
                f.write(str(number + 1))
                return number
