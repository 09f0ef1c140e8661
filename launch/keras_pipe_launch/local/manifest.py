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
from pathlib import Path

from keras_pipe_launch.common.manifests import entries, manifest_object, short
from keras_pipe_launch.common.objects import LocalStore, S3Store, SourceError, StoredObject, parse_s3_uri
from keras_pipe_launch.common.untrusted import shown


@dataclasses.dataclass(frozen=True)
class ManifestLine:
    """One line's listed attributes: each the object a -ref points to, or the value's JSON text."""
    number: int  # 1-based, as editors count
    values: tuple[StoredObject | bytes, ...]
    location: str  # "MANIFEST line N", for messages


def read_manifest(source: str, attribute_names: tuple[str, ...]) -> list[ManifestLine]:
    """Every line of the manifest at `source` with its listed attributes, in order (blank lines
    skipped); a SourceError naming the line for anything that cannot be streamed."""
    manifest = manifest_object(source)
    if isinstance(manifest.store, S3Store):
        refs = _Refs(None, manifest.store)
    else:
        refs = _Refs(Path(manifest.location).parent, None)
    lines = [_line(number, entry, attribute_names, refs, where) for number, where, entry in entries(manifest)]
    if not lines:
        raise SourceError(f"{shown(source)} holds no manifest lines")
    return lines


class _Refs:
    """Resolves -ref values: in a local manifest, paths under its folder (or s3:// URIs); in S3,
    s3:// URIs. One S3 client serves every ref."""

    def __init__(self, folder: Path | None, s3: S3Store | None):
        self.folder = folder.resolve() if folder else None
        self._s3 = s3
        self._buckets: dict[str, S3Store] = {}

    def object(self, ref, where: str, name: str) -> StoredObject:
        if not isinstance(ref, str) or not ref:
            raise SourceError(f"{where}: attribute {shown(name)} must be a path or s3:// URI, got {short(ref)}")
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


def _line(number: int, entry: dict, attribute_names: tuple[str, ...], refs: _Refs, where: str) -> ManifestLine:
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
