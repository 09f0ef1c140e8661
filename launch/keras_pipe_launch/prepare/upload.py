"""A prepared dataset uploaded to S3, each file once: a file already there with the same content
(its SHA-256, kept in the object's metadata by an earlier upload) is not sent again."""

from __future__ import annotations

import concurrent.futures
import hashlib
import sys
from pathlib import Path

from keras_pipe_launch.common.objects import parse_s3_uri
from keras_pipe_launch.common.untrusted import shown


def upload(folder: Path, destination: str, workers: int = 8) -> tuple[int, int]:
    """Uploads every file under `folder` to the s3:// prefix; returns (uploaded, unchanged)."""
    import threading

    import boto3
    from boto3.s3.transfer import TransferConfig
    from tqdm import tqdm

    bucket, prefix = parse_s3_uri(destination)
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    client = boto3.client("s3")
    config = TransferConfig(max_concurrency=workers, multipart_threshold=64 << 20, multipart_chunksize=64 << 20)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    uploaded, unchanged, lock = 0, 0, threading.Lock()
    bar = tqdm(total=total, desc="upload", unit="B", unit_scale=True, disable=None)

    def count(n):
        with lock:  # (boto3 calls back from its transfer threads)
            bar.update(n)

    def one(path: Path) -> bool:
        key = prefix + path.relative_to(folder).as_posix()
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if stored_digest(client, bucket, key) == digest:
            count(path.stat().st_size)
            return False
        client.upload_file(str(path), bucket, key, ExtraArgs={"Metadata": {"sha256": digest}},
                           Config=config, Callback=count)
        return True

    with bar, concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for changed in pool.map(one, files):
            uploaded += changed
            unchanged += not changed
    print(f"upload: {uploaded} files uploaded, {unchanged} already there unchanged, to {shown(destination)}",
          file=sys.stderr)
    return uploaded, unchanged


def stored_digest(client, bucket: str, key: str) -> str | None:
    """The SHA-256 an earlier upload kept in the object's metadata; None when there is no object."""
    from botocore.exceptions import ClientError

    try:
        return client.head_object(Bucket=bucket, Key=key).get("Metadata", {}).get("sha256")
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise
        return None
