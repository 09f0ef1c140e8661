"""The objects of a channel's source: a local folder or file, or every object under an S3 prefix.

S3 is reached with boto3's default configuration, so the standard variables apply: credentials,
AWS_DEFAULT_REGION, and AWS_ENDPOINT_URL for an S3-compatible server (MinIO, moto, ...).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
READ_BYTES = 1 << 20


class SourceError(ValueError):
    """A source that cannot be read: the message names it and says why."""


@dataclasses.dataclass(frozen=True)
class StoredObject:
    key: str  # path relative to the source: where File mode puts it, and the feeding order
    size: int
    location: str  # the full path or s3:// URI, for messages
    store: "LocalStore | S3Store" = dataclasses.field(repr=False, compare=False)

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
        if self.root.is_file():
            return [StoredObject(self.root.name, self.root.stat().st_size, str(self.root), self)]
        if not self.root.is_dir():
            raise SourceError(f"{self.root} does not exist")
        found = [
            StoredObject(p.relative_to(self.root).as_posix(), p.stat().st_size, str(p), self)
            for p in self.root.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(self.root).parts)
        ]
        if not found:
            raise SourceError(f"{self.root} holds no files")
        return sorted(found, key=lambda o: o.key)

    def open(self, obj: StoredObject) -> BinaryIO:
        return open(obj.location, "rb")

    def local_path(self, obj: StoredObject) -> str:
        return obj.location

    def download(self, obj: StoredObject, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(obj.location, dest)  # same file system: no copy (and works inside containers)
        except OSError:
            shutil.copyfile(obj.location, dest)


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
                                              f"s3://{self.bucket}/{item['Key']}", self))
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            raise SourceError(f"cannot list {self.uri}: {code or err}") from err
        except BotoCoreError as err:
            raise SourceError(f"cannot list {self.uri}: {err}") from err
        if not found:
            raise SourceError(f"{self.uri} holds no objects: check the bucket and prefix")
        return sorted(found, key=lambda o: o.key)

    def open(self, obj: StoredObject) -> BinaryIO:
        key = obj.location[len(f"s3://{self.bucket}/"):]
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"]

    def local_path(self, obj: StoredObject) -> None:
        return None

    def download(self, obj: StoredObject, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, obj.location[len(f"s3://{self.bucket}/"):], str(dest))


def store_for(source: str) -> LocalStore | S3Store:
    # anything that starts like an S3 URI is one, so that "s3:/bucket" or "S3://bucket" get the
    # S3 message rather than "no such file"
    return S3Store(source) if source.lower().startswith("s3:") else LocalStore(source)


def list_objects(source: str) -> list[StoredObject]:
    return store_for(source).list()
