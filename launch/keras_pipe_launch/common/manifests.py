"""Reading an augmented manifest (SageMaker Ground Truth's output: JSON Lines, one object per
image), line by line as it streams, for `keras-pipe local` (which streams its lines' attributes as
SageMaker does: local.manifest) and `keras-pipe prepare` (which takes its images and labels:
prepare.sources)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from keras_pipe_launch.common.objects import LocalStore, S3Store, SourceError, StoredObject, parse_s3_uri
from keras_pipe_launch.common.untrusted import shown

MAX_LINE_BYTES = 16 << 20  # a line of Ground Truth's output is well under a kilobyte or two


def manifest_object(source: str, s3_client=None) -> StoredObject:
    """The manifest at `source`, a local file or one S3 object (not a prefix)."""
    if source.lower().startswith("s3:"):
        _, key = parse_s3_uri(source)
        if not key or key.endswith("/"):
            raise SourceError(f"{shown(source)}: a manifest is one S3 object (s3://bucket/path/to/file.manifest), "
                              "not a prefix")
        return StoredObject(key, -1, source, S3Store(source, client=s3_client))
    store = LocalStore(source)
    if not store.root.is_file():
        raise SourceError(f"{shown(source)}: a manifest is one file (JSON Lines), "
                          + ("not a folder" if store.root.is_dir() else "and there is none"))
    return store.list()[0]


def entries(manifest: StoredObject) -> Iterator[tuple[int, str, dict]]:
    """(line number, "MANIFEST line N", the line's object) for every line that is not blank; a
    SourceError naming the line for one that is not a JSON object, or is too long to be one."""
    from botocore.exceptions import BotoCoreError, ClientError

    pending, number = b"", 0
    try:
        for chunk in manifest.chunks():
            pending += chunk
            *whole, pending = pending.split(b"\n")
            for line in whole:
                number += 1
                if line.strip():
                    yield number, f"{manifest.location} line {number}", _object(line, manifest.location, number)
            if len(pending) > MAX_LINE_BYTES:
                raise SourceError(f"{shown(manifest.location)} line {number + 1} is longer than "
                                  f"{MAX_LINE_BYTES >> 20} MB: is it a manifest (JSON Lines)?")
    except (ClientError, BotoCoreError, OSError) as err:
        raise SourceError(f"cannot read {shown(manifest.location)}: {shown(str(err))}") from None
    if pending.strip():
        yield number + 1, f"{manifest.location} line {number + 1}", _object(pending, manifest.location, number + 1)


def _object(line: bytes, name: str, number: int) -> dict:
    where = f"{name} line {number}"
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):
        raise SourceError(f"{shown(where)} is not JSON: {shown(line[:80].decode('utf-8', 'replace'))}") from None
    if not isinstance(entry, dict):
        raise SourceError(f"{shown(where)} is not a JSON object but {short(entry)}")
    return entry


def short(value) -> str:
    text = json.dumps(value)
    return shown(text if len(text) <= 60 else text[:57] + "...")
