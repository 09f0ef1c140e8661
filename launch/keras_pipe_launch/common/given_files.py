"""The files a command is given on its command line: files as they are, folders searched at any
depth (`keras-pipe predict`'s images, `keras-pipe export`'s records)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError


def files_of(given: list[str | Path], named: str = "", wanted: Callable[[Path], bool] = lambda path: True,
             kind: str = "file") -> list[Path]:
    """The files `given`, each folder's in order of their names: those `wanted`, hidden ones (".x",
    macOS' "._x" beside each file copied off its disks) left out. A UsageError, its path said after
    `named` (an option's name, say), for a path that does not exist or a folder with no `kind`."""
    files = []
    for name in given:
        path = Path(name)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*")
                           if p.is_file() and not p.name.startswith(".") and wanted(p))
            if not found:
                raise UsageError(f"{named}{shown(str(name))} holds no {kind}")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"{named}{shown(str(name))} does not exist")
    return files
