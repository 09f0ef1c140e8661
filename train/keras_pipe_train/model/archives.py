"""A pretrained model's .tar.gz in a channel (JumpStart's SavedModel, a keras-hub preset), unpacked
without trusting its member names."""

from __future__ import annotations

import shutil
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from keras_pipe_train.settings.errors import UserError

MAX_BYTES = 8 << 30  # (a bound on what is unpacked; TF Hub's largest image models, BiT's, hold a few GB)


def unpack(archive: Path, work: Path, channel: str) -> None:
    """The archive's regular files and folders, at most MAX_BYTES in all: a member's name never
    writes outside `work` (absolute, or with ..), and links and devices are refused, not followed."""
    total = 0
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if member.name.startswith("/") or ".." in parts:
                    raise UserError(f"channel '{channel}': {archive.name} has a member named {member.name!r}, "
                                    "outside the archive's folder")
                if member.isdir():
                    continue
                if not member.isreg():
                    raise UserError(f"channel '{channel}': {archive.name}'s {member.name} is a link or a device, "
                                    "not a file: a pretrained model's archive holds files only")
                total += member.size
                if total > MAX_BYTES:
                    raise UserError(f"channel '{channel}': {archive.name} unpacks to more than {MAX_BYTES >> 30} GB")
                target = work.joinpath(*[p for p in parts if p != "."])
                target.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as source, open(target, "wb") as out:
                    shutil.copyfileobj(source, out)
            while tar.fileobj.read(1 << 20):  # (to the end of the gzip stream: its CRC checked)
                pass
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise UserError(f"channel '{channel}': {archive.name} cannot be read as a model's .tar.gz "
                        f"({type(err).__name__}: {err})") from err
