"""Reading what a container or an instance left behind, which the launcher does not trust: the
job's code may be anyone's, and a link it leaves would otherwise make the launcher upload or read
a file of this machine (a link to ~/.ssh uploaded to S3, a failure file linked to /dev/zero read
until memory runs out). Links are never followed, only regular files are read, and at most so much.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from keras_pipe_train.report.text import printable

MESSAGE_BYTES = 64 << 10  # a failure file or ExitMessage: SageMaker keeps 1 KB of it


def shown(location: str | os.PathLike | bytes, keep: str = "") -> str:
    """A path, key or message as text that can be printed and written anywhere: file names are
    bytes, and one that is not UTF-8 (or holds a tab, a newline or a terminal's escape code) would
    break rejected.txt or the terminal. The characters of `keep` are kept as they are."""
    try:
        text = os.fsencode(location).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a str with a lone surrogate (JSON's "\ud800"), which no bytes stand for
        text = os.fspath(location).encode("utf-8", "backslashreplace").decode()
    return printable(text, keep)


def log_line(line: str) -> str:
    """A line another program wrote (a job's or an instance's output, a CloudWatch event), to be
    relayed to this terminal: its escape codes (which could recolour, clear or retitle the
    terminal, or rewrite lines already shown) and other control characters are said, not sent;
    tabs, which only move the cursor forward, are kept."""
    return shown(line.rstrip(), keep="\t")


class UntrustedFileError(ValueError):
    """What was left is not something the launcher reads or uploads: the message says what and where."""


def read_text(path: Path, max_bytes: int = MESSAGE_BYTES) -> str | None:
    """The start of a regular file's text (None if there is none), without following a link in its
    last component, nor blocking on a FIFO; anything else is said instead of its content."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(mode):  # (a device node is not even opened: opening one can act on the device)
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
        return f"[{shown(path.name)} is {kind}: not read]"
    try:  # (and checked again once open: it may have been swapped meanwhile)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as err:  # (ELOOP: a symbolic link)
        kind = "a symbolic link" if os.path.islink(path) else f"unreadable ({err.strerror})"
        return f"[{shown(path.name)} is {kind}: not read]"
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return f"[{shown(path.name)} is not a regular file: not read]"
        data = f.read(max_bytes + 1)
    text = "\n".join(shown(line) for line in data[:max_bytes].decode("utf-8", "backslashreplace").splitlines())
    return text + (f"\n[... cut at {max_bytes} bytes]" if len(data) > max_bytes else "")


def regular_files(folder: Path) -> list[Path]:
    """Every file under `folder`, which must be a real folder; a symbolic link, a FIFO, a device or
    socket anywhere in it is an UntrustedFileError (none of it is followed or opened)."""
    try:
        info = os.lstat(folder)
    except FileNotFoundError:
        raise UntrustedFileError(f"{shown(folder)} is missing") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UntrustedFileError(f"{shown(folder)} is not a folder (a symbolic link or another kind of file): refused")

    def unreadable(err: OSError):
        raise UntrustedFileError(f"cannot list {shown(err.filename)}: {err.strerror}")

    found = []
    for parent, folders, files in os.walk(folder, followlinks=False, onerror=unreadable):
        for name in folders + files:
            path = Path(parent) / name
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                raise UntrustedFileError(f"{shown(path)} is a symbolic link (to {shown(os.readlink(path))}): refused")
            if stat.S_ISREG(mode):
                found.append(path)
            elif not stat.S_ISDIR(mode):
                raise UntrustedFileError(f"{shown(path)} is not a regular file (a FIFO, socket or device): refused")
    return sorted(found)
