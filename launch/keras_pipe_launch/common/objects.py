"""The objects of a channel's source: a local folder or file, or every object under an S3 prefix.

S3 is reached with boto3's default configuration, so the standard variables apply: credentials,
AWS_DEFAULT_REGION, and AWS_ENDPOINT_URL for an S3-compatible server (MinIO, moto, ...).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
import unicodedata
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from keras_pipe_launch.common.untrusted import shown
from keras_pipe_train.settings.contract import is_hidden

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
READ_BYTES = 1 << 20
NAME_MAX = 255  # bytes in one file name (Linux, macOS)


class SourceError(ValueError):
    """A source that cannot be read: the message names it and says why."""


@dataclasses.dataclass(frozen=True)
class StoredObject:
    key: str  # path relative to the source: where File mode puts it, and the feeding order
    size: int
    location: str  # the full path or s3:// URI, for messages
    store: LocalStore | S3Store = dataclasses.field(repr=False, compare=False)
    etag: str | None = None  # S3's ETag (listed from S3): the same for the same bytes uploaded alike

    def open(self) -> BinaryIO:
        return self.store.open(self)

    def chunks(self) -> Iterator[bytes]:
        with self.open() as stream:
            yield from iter(lambda: stream.read(READ_BYTES), b"")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key prefix) of s3://bucket/prefix, or a SourceError saying what is wrong."""
    if not uri.startswith("s3://"):
        raise SourceError(f"{uri!r} is not an S3 URI: expected s3://bucket/prefix")
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise SourceError(
            f"{uri!r}: {bucket!r} is not a valid bucket name (3-63 lowercase letters, digits, '.' and '-')")
    if "//" in prefix:
        raise SourceError(f"{uri!r}: the key prefix contains '//'")
    return bucket, prefix


class LocalStore:
    def __init__(self, root: str):
        self.root = Path(root).expanduser()

    def list(self) -> list[StoredObject]:
        """Every file under the root, as the objects of an S3 prefix: hidden ones left out,
        symbolic links to files inside the root followed (their content is the object's). What
        cannot stand for an object is an error rather than left out: a dangling link, a link to a
        folder or out of the root (as prepare refuses it: a channel's folder names what it holds),
        a FIFO."""
        if self.root.is_file():
            return [StoredObject(self.root.name, self.root.stat().st_size, str(self.root), self)]
        if not self.root.is_dir():
            dangling = " (a dangling symbolic link)" if self.root.is_symlink() else ""
            raise SourceError(f"{shown(self.root)} does not exist{dangling}")
        found = []
        for folder, subfolders, files in os.walk(self.root, onerror=self._walk_error):
            subfolders[:] = [d for d in subfolders if not is_hidden([d])]
            for name in subfolders:
                if os.path.islink(os.path.join(folder, name)):
                    raise SourceError(f"{shown(os.path.join(folder, name))} is a symbolic link to a folder: give the "
                                      "folder itself as the source, or copy it in (links to folders are not followed)")
            for name in files:
                if not is_hidden([name]):
                    found.append(self._object(Path(folder) / name))
        if not found:
            raise SourceError(f"{shown(self.root)} holds no files")
        return sorted(found, key=lambda o: o.key)

    def _object(self, path: Path) -> StoredObject:
        try:
            info = path.stat()
        except FileNotFoundError:
            raise SourceError(f"{shown(path)} is a dangling symbolic link (to '{shown(os.readlink(path))}')") from None
        except OSError as err:
            raise SourceError(f"cannot read {shown(path)}: {err.strerror}") from err
        if not stat.S_ISREG(info.st_mode):
            raise SourceError(f"{shown(path)} is not a regular file (a FIFO, socket or device cannot be a channel's "
                              "object)")
        if path.is_symlink() and not path.resolve().is_relative_to(self.root.resolve()):
            raise SourceError(f"{shown(path)} is a symbolic link to {shown(path.resolve())}, outside "
                              f"{shown(self.root)}: copy the file in, or give its folder as the source")
        return StoredObject(path.relative_to(self.root).as_posix(), info.st_size, str(path), self)

    @staticmethod
    def _walk_error(err: OSError) -> None:
        raise SourceError(f"cannot list {shown(err.filename)}: {err.strerror}") from err

    def open(self, obj: StoredObject) -> BinaryIO:
        return open(obj.location, "rb")

    def local_path(self, obj: StoredObject) -> str:
        return obj.location

    def download(self, obj: StoredObject, dest: Path) -> None:
        """A copy of its own, as SageMaker downloads one: the job (or a container) may write to its
        channel folder, and a hard link would let it change the user's original."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        copy_file(obj.location, dest)


class S3Store:
    def __init__(self, uri: str, client=None):
        self.uri = uri
        self.bucket, self.prefix = parse_s3_uri(uri)
        self._client = client

    @property
    def client(self):
        if self._client is None:
            import boto3

            self._client = boto3.client("s3")
        return self._client

    def list(self) -> list[StoredObject]:
        from botocore.exceptions import BotoCoreError, ClientError

        # File mode keeps keys relative to the prefix's "folder" (up to its last '/')
        folder = self.prefix[: self.prefix.rfind("/") + 1]
        found = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix):
                for item in page.get("Contents", []):
                    if item["Key"].endswith("/") and item["Size"] == 0:
                        continue  # a "folder" marker made by the S3 console
                    found.append(StoredObject(item["Key"][len(folder):], item["Size"],
                                              f"s3://{self.bucket}/{item['Key']}", self, item.get("ETag")))
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            raise SourceError(f"cannot list {shown(self.uri)}: {shown(str(code or err))}") from err
        except BotoCoreError as err:
            raise SourceError(f"cannot list {shown(self.uri)}: {shown(str(err))}") from err
        if not found:
            raise SourceError(f"{shown(self.uri)} holds no objects: check the bucket and prefix")
        return sorted(found, key=lambda o: o.key)

    def open(self, obj: StoredObject) -> BinaryIO:
        key = obj.location[len(f"s3://{self.bucket}/"):]
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"]

    def local_path(self, obj: StoredObject) -> None:
        return None

    def download(self, obj: StoredObject, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, obj.location[len(f"s3://{self.bucket}/"):], str(dest))


def copy_file(source: str, dest: Path) -> None:
    """Copies with copy_file_range, which shares the blocks instead on file systems that can
    (btrfs, XFS: a reflink costs no time or space); else a plain copy."""
    with open(source, "rb") as src, open(dest, "wb") as out:
        try:
            while os.copy_file_range(src.fileno(), out.fileno(), 1 << 30):
                pass
            return
        except OSError:  # EXDEV on kernels before 5.3, ENOSYS, EINVAL on some file systems
            src.seek(0)
            out.seek(0)
            out.truncate()
        shutil.copyfileobj(src, out, READ_BYTES)


def staging_path(obj: StoredObject) -> PurePosixPath:
    """Where File mode puts `obj`, relative to the channel folder: at its key (relative to the
    channel's prefix), as SageMaker does. S3 keys are untrusted text: a key that could not be a
    file at such a path, faithfully and inside the folder, is refused."""
    key = obj.key
    problem = None
    if not key or key.startswith("/"):
        problem = "an empty name" if not key else "a leading '/'"
    elif "\0" in key:
        problem = "a NUL character"
    elif any(part in ("", ".", "..") for part in key.split("/")):
        problem = "an empty, '.' or '..' path segment"
    elif any(len(part.encode("utf-8", "surrogateescape")) > NAME_MAX for part in key.split("/")):
        problem = f"a path segment longer than {NAME_MAX} bytes"
    if problem:
        raise SourceError(f"object {shown(obj.location)} cannot be staged as a file in File mode: its key "
                          f"relative to the channel, {key!r}, has {problem}")
    return PurePosixPath(key)


def staging_plan(
    objects: list[StoredObject], case_insensitive: bool = False
) -> list[tuple[StoredObject, PurePosixPath]]:
    """(object, relative path) for every object, after checking that no two of them need the same
    path, or one a file where another needs a folder (`d/a` and `d/a/b`)."""
    fold = (lambda p: unicodedata.normalize("NFC", str(p)).casefold()) if case_insensitive else str
    plan = [(obj, staging_path(obj)) for obj in objects]
    files: dict[str, StoredObject] = {}
    for obj, path in plan:
        other = files.setdefault(fold(path), obj)
        if other is not obj:
            raise SourceError(f"objects {shown(other.location)} and {shown(obj.location)} would be the same file "
                              f"{shown(path)}{' on this case-insensitive file system' if case_insensitive else ''}")
    for obj, path in plan:
        for folder in path.parents[:-1]:  # all but '.'
            if fold(folder) in files:
                raise SourceError(f"object {shown(files[fold(folder)].location)} would be a file where object "
                                  f"{shown(obj.location)} needs a folder ({shown(folder)}/): File mode cannot stage "
                                  "both")
    return plan


def case_insensitive(folder: Path) -> bool:
    """Whether the file system holding `folder` ignores case (macOS and Windows by default): the
    same folder found again under a name in the other case. Writes nothing."""
    for path in (folder, *folder.parents):
        swapped = path.with_name(path.name.swapcase()) if path.name else path
        if path.name != swapped.name and path.exists():
            return swapped.exists() and os.path.samefile(path, swapped)
    return False


def store_for(source: str) -> LocalStore | S3Store:
    # anything that starts like an S3 URI is one, so that "s3:/bucket" or "S3://bucket" get the
    # S3 message rather than "no such file"
    return S3Store(source) if source.lower().startswith("s3:") else LocalStore(source)


def list_objects(source: str) -> list[StoredObject]:
    return store_for(source).list()


def stage(plan: list[tuple[StoredObject, PurePosixPath]], folder: Path) -> None:
    """Copies each object of `plan` to its relative path under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for obj, relative in plan:
        dest = folder.joinpath(*relative.parts)  # inside `folder`: staging_plan checked every key
        obj.store.download(obj, dest)
