"""`python -m launch prepare`: images -> sharded TFRecords the training job reads, optionally uploaded.

    python -m launch prepare ./photos ./prepared --upload s3://bucket/datasets/photos/
    python -m launch prepare labels.csv ./prepared          # CSV rows: path,label (paths relative to it)

SOURCE is a folder with one subfolder per class, or a CSV of path,label. Every image is checked by
decoding it; unreadable or corrupt ones are listed in OUT/rejected.txt and counted, never silently
dropped (--strict makes any of them an error). The rest, shuffled (seeded) and split per class
into train and validation, become tf.train.Examples under the feature names the job reads by
default (image/encoded, image/class/label) in shards of about --shard-mb:

    OUT/train/part-00000.tfrecord ...     -> the train channel (s3://.../train/)
    OUT/validation/part-00000.tfrecord    -> the validation channel
    OUT/classes.json                      -> class names in label order: --hp class_names=...

The same inputs and seed give byte-identical shards, so re-running --upload skips every shard
already in S3 with the same content (its SHA-256 is kept in the object's metadata).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import hashlib
import json
import os
import random
import re
import sys
import time
from pathlib import Path

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".bmp"}


class PrepareError(ValueError):
    pass


def list_folder(source: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    classes = sorted(p.name for p in source.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise PrepareError(f"{source} must hold one subfolder per class (at least two); found {len(classes)}")
    items = [(path, label) for label, name in enumerate(classes)
             for path in sorted((source / name).rglob("*"))
             if path.is_file() and not path.name.startswith(".")]
    return classes, items


def list_csv(source: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    rows = []
    with open(source, newline="") as f:
        for number, row in enumerate(csv.reader(f), 1):
            if not row or row[0].startswith("#"):
                continue
            if len(row) != 2:
                raise PrepareError(f"{source}:{number}: expected path,label; got {row}")
            if number == 1 and row == ["path", "label"]:
                continue  # a header
            rows.append((source.parent / row[0].strip(), row[1].strip()))
    names = sorted({label for _, label in rows}, key=lambda n: (len(n), n) if n.isdigit() else (0, n))
    if len(names) < 2:
        raise PrepareError(f"{source} lists {len(names)} label(s); a classifier needs at least two")
    index = {name: i for i, name in enumerate(names)}
    return names, [(path, index[label]) for path, label in rows]


def check_image(path: Path) -> tuple[bytes | None, str | None]:
    """(bytes, None) for a decodable image, else (None, why)."""
    import tensorflow as tf

    if path.suffix.lower() not in IMAGE_SUFFIXES:
        return None, f"not an image file (suffix {path.suffix or 'none'})"
    try:
        data = path.read_bytes()
    except OSError as err:
        return None, f"unreadable: {err.strerror or err}"
    try:
        tf.io.decode_image(data, channels=3, expand_animations=False)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as err:
        why = re.sub(r"\{\{[^}]*\}\}\s*", "", err.message.splitlines()[0])  # TF's op-location prefix
        return None, f"corrupt image: {why[:120]}"
    return data, None


def split(items: list[tuple[Path, int]], validation_fraction: float, seed: int):
    """Shuffled, then split per class so every class has its share in validation."""
    rng = random.Random(seed)
    train, validation = [], []
    for label in sorted({label for _, label in items}):
        of_class = [item for item in items if item[1] == label]
        rng.shuffle(of_class)
        cut = round(len(of_class) * validation_fraction)
        validation += of_class[:cut]
        train += of_class[cut:]
    rng.shuffle(train)
    rng.shuffle(validation)
    return train, validation


class Progress:
    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.done, self.rejected, self.bytes = total, 0, 0, 0
        self.stream, self.started, self.last = stream, time.monotonic(), 0.0

    def update(self, size: int, rejected: bool) -> None:
        self.done += 1
        self.rejected += rejected
        self.bytes += size
        now = time.monotonic()
        if now - self.last > 0.2 or self.done == self.total:
            self.last = now
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            rate = self.done / max(now - self.started, 1e-9)
            print(f"\rprepare [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} images, "
                  f"{self.bytes / 1e6:.1f} MB, {self.rejected} rejected, {rate:.0f}/s", end="",
                  file=self.stream, flush=True)
            if self.done == self.total:
                print(file=self.stream)


def write_shards(folder: Path, examples: list[bytes], shard_bytes: int) -> list[Path]:
    from train.pipe import tfrecord

    folder.mkdir(parents=True, exist_ok=True)
    shards, current, size = [], [], 0

    def flush():
        path = folder / f"part-{len(shards):05d}.tfrecord"
        path.write_bytes(tfrecord.encode(current))
        shards.append(path)

    for example in examples:
        current.append(example)
        size += len(example) + 16
        if size >= shard_bytes:
            flush()
            current, size = [], 0
    if current or not shards:
        flush()
    return shards


def prepare(source: Path, out: Path, *, validation_fraction: float = 0.1, shard_mb: float = 100,
            seed: int = 0, workers: int | None = None, strict: bool = False) -> dict:
    from train.example import encode_example

    if out.exists() and any(out.iterdir()):
        raise PrepareError(f"{out} is not empty: give a new output folder")
    if not 0 <= validation_fraction < 1:
        raise PrepareError("--validation-fraction must be in [0, 1)")
    if source.is_dir():
        classes, items = list_folder(source)
    elif source.suffix.lower() == ".csv":
        classes, items = list_csv(source)
    else:
        raise PrepareError(f"{source} is neither a folder of class folders nor a .csv file")
    progress = Progress(len(items))
    checked: dict[Path, bytes] = {}
    rejected: list[tuple[Path, str]] = []
    # TensorFlow's decode ops release the GIL: threads check images in parallel
    with concurrent.futures.ThreadPoolExecutor(workers or os.cpu_count()) as pool:
        for (path, _), (data, why) in zip(items, pool.map(lambda item: check_image(item[0]), items)):
            if data is None:
                rejected.append((path, why))
            else:
                checked[path] = data
            progress.update(len(data or b""), data is None)
    out.mkdir(parents=True, exist_ok=True)
    if rejected:
        (out / "rejected.txt").write_text("".join(f"{path}\t{why}\n" for path, why in rejected))
        print(f"prepare: REJECTED {len(rejected)} of {len(items)} images (listed in {out / 'rejected.txt'}):",
              file=sys.stderr)
        for path, why in rejected[:10]:
            print(f"  {path}: {why}", file=sys.stderr)
        if len(rejected) > 10:
            print(f"  ... and {len(rejected) - 10} more", file=sys.stderr)
        if strict:
            raise PrepareError(f"{len(rejected)} images could not be used (--strict)")
    usable = [(path, label) for path, label in items if path in checked]
    train, validation = split(usable, validation_fraction, seed)
    shard_bytes = int(shard_mb * 1e6)
    written = {"train": write_shards(out / "train", [encode_example(checked[p], y) for p, y in train], shard_bytes)}
    if validation:
        written["validation"] = write_shards(out / "validation",
                                             [encode_example(checked[p], y) for p, y in validation], shard_bytes)
    (out / "classes.json").write_text(json.dumps(classes) + "\n")
    summary = {"classes": classes, "train": len(train), "validation": len(validation), "rejected": len(rejected),
               "shards": {name: [str(p) for p in paths] for name, paths in written.items()}}
    print(f"prepare: {len(train)} train and {len(validation)} validation examples of {len(classes)} classes "
          f"in {sum(map(len, written.values()))} shards under {out}; train with "
          f"--hp class_names={','.join(classes)}", file=sys.stderr)
    return summary


def upload(folder: Path, destination: str, workers: int = 8) -> tuple[int, int]:
    """Uploads every file under `folder` to the s3:// prefix; returns (uploaded, unchanged)."""
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.exceptions import ClientError

    from launch.objects import parse_s3_uri

    bucket, prefix = parse_s3_uri(destination)
    prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
    client = boto3.client("s3")
    config = TransferConfig(max_concurrency=workers, multipart_threshold=64 << 20, multipart_chunksize=64 << 20)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    sent, uploaded, unchanged, lock = 0, 0, 0, __import__("threading").Lock()

    def count(n):
        nonlocal sent
        with lock:
            sent += n
            print(f"\rupload {sent / 1e6:.1f}/{total / 1e6:.1f} MB", end="", file=sys.stderr, flush=True)

    def one(path: Path) -> bool:
        key = prefix + path.relative_to(folder).as_posix()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        try:
            head = client.head_object(Bucket=bucket, Key=key)
            if head.get("Metadata", {}).get("sha256") == digest:
                count(path.stat().st_size)
                return False
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        client.upload_file(str(path), bucket, key, ExtraArgs={"Metadata": {"sha256": digest}},
                           Config=config, Callback=count)
        return True

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for changed in pool.map(one, files):
            uploaded += changed
            unchanged += not changed
    print(f"\rupload: {uploaded} files uploaded, {unchanged} already there unchanged, to {destination}",
          file=sys.stderr)
    return uploaded, unchanged


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("prepare", help="images -> sharded TFRecords, optionally uploaded to S3",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="a folder of class folders, or a CSV of path,label")
    parser.add_argument("out", type=Path, help="the output folder (new or empty)")
    parser.add_argument("--validation-fraction", type=float, default=0.1)
    parser.add_argument("--shard-mb", type=float, default=100, help="target shard size")
    parser.add_argument("--seed", type=int, default=0, help="for the shuffle and the split")
    parser.add_argument("--workers", type=int, default=None, help="parallel image checks (default: CPUs)")
    parser.add_argument("--strict", action="store_true", help="fail if any image is unusable")
    parser.add_argument("--upload", metavar="S3_PREFIX", default=None, help="then upload OUT to s3://bucket/prefix/")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    from launch.objects import SourceError

    try:
        if args.upload:
            from launch.objects import parse_s3_uri

            parse_s3_uri(args.upload)  # before the work, not after
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        prepare(args.source, args.out, validation_fraction=args.validation_fraction, shard_mb=args.shard_mb,
                seed=args.seed, workers=args.workers, strict=args.strict)
        if args.upload:
            upload(args.out, args.upload)
    except (PrepareError, SourceError) as err:
        print(f"launch prepare: error: {err}", file=sys.stderr)
        return 2
    except (BotoCoreError, ClientError) as err:
        print(f"launch prepare: upload failed: {err}", file=sys.stderr)
        return 1
    return 0
