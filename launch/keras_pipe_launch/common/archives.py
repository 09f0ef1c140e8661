"""A job's .tar.gz (model.tar.gz, output.tar.gz) unpacked here: a downloaded archive is not trusted."""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from pathlib import Path

from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError


def unpack(archive: Path, out: Path, wanted: Callable[[tarfile.TarInfo], bool], what: str) -> None:
    """The members of `archive` that `wanted` keeps, unpacked into `out` with tarfile's "data"
    filter (no links out, no absolute or ../ names, no devices); one that cannot be read is a
    UsageError saying it is no `what` (e.g. "model.tar.gz")."""
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = [member for member in tar.getmembers() if wanted(member)]
            out.mkdir(parents=True, exist_ok=True)
            tar.extractall(out, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError) as err:
        raise UsageError(f"{shown(str(archive))} cannot be read as {what} ({type(err).__name__}: "
                         f"{shown(str(err))})") from None
