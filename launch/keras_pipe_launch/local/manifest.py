"""An augmented manifest channel, streamed by `keras-pipe local` as SageMaker streams it.

SageMaker reads the manifest (JSON Lines, Ground Truth's output) and, for every line, writes one
RecordIO record per name of the channel's AttributeNames, in that order: for a name ending in
"-ref", the bytes of the object it points to; for any other, the attribute's value as JSON text.
Attributes not listed are left out. ShuffleConfig shuffles the lines (anew every pass);
ShardedByS3Key gives each host its share of the lines (the documentation does not say how
SageMaker splits a manifest between hosts: here, as objects are split, every N-th line after the
shuffle, so the shares never overlap).

The manifest is a local file or an S3 object. A ref in a local manifest is a path relative to its
folder (never leading out of it) or an s3:// URI, read without a local copy; a ref in a manifest in
S3 is an s3:// URI. What cannot be streamed is an error naming the manifest line: a line that is
not a JSON object, a listed attribute missing, a ref that is not a string or cannot be read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from keras_pipe_launch.common.objects import LocalStore, S3Store, SourceError, StoredObject, parse_s3_uri, store_for
from keras_pipe_launch.common.untrusted import shown

MAX_LINE_BYTES = 16 << 20  # a line of Ground Truth's output is well under a kilobyte or two


@dataclasses.dataclass(frozen=True)
class ManifestLine:
    """One line's listed attributes: each the object a -ref points to, or the value's JSON text."""
    number: int  # 1-based, as editors count
    values: tuple[StoredObject | bytes, ...]
    location: str  # "MANIFEST line N", for messages

    @property
    def key(self) -> str:  # (feeders order and report objects by key)
        return self.location


def read_manifest(source: str, attribute_names: tuple[str, ...]) -> list[ManifestLine]:
    """Every line of the manifest at `source` with its listed attributes, in order (blank lines
    skipped); a SourceError naming the line for anything that cannot be streamed."""
    store = store_for(source)
    if isinstance(store, S3Store):
        _, key = parse_s3_uri(source)
        if not key or key.endswith("/"):
            raise SourceError(f"{shown(source)}: an augmented manifest is one S3 object (s3://bucket/path/to/file."
                              "manifest), not a prefix")
        manifest = StoredObject(key, -1, source, store)
        refs = _Refs(None, store)
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise SourceError(f"{shown(source)}: an augmented manifest is one file (JSON Lines), "
                              + ("not a folder" if path.is_dir() else "and there is none"))
        manifest = LocalStore(str(path)).list()[0]
        refs = _Refs(path.parent, None)
    lines = []
    for number, text in _numbered_lines(manifest):
        if text.strip():
            lines.append(_line(number, text, attribute_names, refs, f"{source} line {number}"))
    if not lines:
        raise SourceError(f"{shown(source)} holds no manifest lines")
    return lines


def _numbered_lines(manifest: StoredObject) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for every line, each at most MAX_LINE_BYTES, read as it streams."""
    pending, number = b"", 0
    for chunk in manifest.chunks():
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            number += 1
            yield number, line
        if len(pending) > MAX_LINE_BYTES:
            raise SourceError(f"{shown(manifest.location)} line {number + 1} is longer than {MAX_LINE_BYTES >> 20} MB: "
                              "is it a manifest (JSON Lines)?")
    if pending:
        yield number + 1, pending


class _Refs:
    """Resolves -ref values: in a local manifest, paths under its folder (or s3:// URIs); in S3,
    s3:// URIs. One S3 client serves every ref."""

    def __init__(self, folder: Path | None, s3: S3Store | None):
        self.folder = folder.resolve() if folder else None
        self._s3 = s3
        self._buckets: dict[str, S3Store] = {}

    def object(self, ref, where: str, name: str) -> StoredObject:
        if not isinstance(ref, str) or not ref:
            raise SourceError(f"{where}: attribute {shown(name)} must be a path or s3:// URI, got {_short(ref)}")
        if ref.lower().startswith("s3:"):
            try:
                bucket, key = parse_s3_uri(ref)
            except SourceError as err:
                raise SourceError(f"{where}: {err}") from None
            if not key or key.endswith("/"):
                raise SourceError(f"{where}: {shown(name)} {shown(ref)} names no object")
            store = self._s3_store(bucket)
            return StoredObject(key, -1, f"s3://{bucket}/{key}", store)
        if self.folder is None:
            raise SourceError(f"{where}: {shown(name)} {shown(ref)} is not an s3:// URI; in a manifest in S3 every "
                              "ref is one")
        path = (self.folder / ref).resolve()
        if not path.is_relative_to(self.folder):
            raise SourceError(f"{where}: {shown(name)} {shown(ref)} leads out of the manifest's folder "
                              f"{shown(self.folder)}: refs of a local manifest are paths under it")
        try:
            info = path.stat()
        except OSError as err:
            raise SourceError(f"{where}: {shown(name)} {shown(ref)} cannot be read: {err.strerror}") from None
        if not stat.S_ISREG(info.st_mode):
            raise SourceError(f"{where}: {shown(name)} {shown(ref)} is not a regular file")
        return StoredObject(os.path.relpath(path, self.folder), info.st_size, str(path), _LOCAL)

    def _s3_store(self, bucket: str) -> S3Store:
        """A store per bucket (StoredObject.open reads its key from the store's bucket), one client."""
        if bucket not in self._buckets:
            self._s3 = self._s3 or S3Store(f"s3://{bucket}/")
            self._buckets[bucket] = S3Store(f"s3://{bucket}/", client=self._s3.client)
        return self._buckets[bucket]


_LOCAL = LocalStore("/")


def _line(number: int, text: bytes, attribute_names: tuple[str, ...], refs: _Refs, where: str) -> ManifestLine:
    try:
        entry = json.loads(text)
    except (ValueError, RecursionError):
        raise SourceError(f"{shown(where)} is not JSON: {shown(text[:80].decode('utf-8', 'replace'))}") from None
    if not isinstance(entry, dict):
        raise SourceError(f"{shown(where)} is not a JSON object but {_short(entry)}")
    values: list[StoredObject | bytes] = []
    for name in attribute_names:
        if name not in entry:
            present = ", ".join(sorted(entry)[:10]) or "none"
            raise SourceError(f"{shown(where)} has no attribute {shown(name)} (it has: {shown(present)}): every line "
                              "must hold every name of --attribute-names")
        if name.endswith("-ref"):
            values.append(refs.object(entry[name], shown(where), name))
        else:
            values.append(json.dumps(entry[name]).encode())
    return ManifestLine(number, tuple(values), where)


def _short(value) -> str:
    text = json.dumps(value)
    return shown(text if len(text) <= 60 else text[:57] + "...")
