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

from train import images  # (Pillow and TensorFlow load only when images are checked)
from train.images import DEFAULT_MAX_PIXELS

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp"}


class PrepareError(ValueError):
    pass


def shown(path: Path | str) -> str:
    """A path as text that can be printed and written anywhere: file names are bytes, and one that
    is not UTF-8 (or holds a tab or a newline) would break rejected.txt or the terminal."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def list_folder(source: Path) -> tuple[list[str], list[tuple[Path, int]], list[tuple[Path, str]]]:
    """(class names, (image, label) pairs, rejected (path, why)) of a folder of class folders.

    Symbolic links are followed only where they stay inside the source folder: a link out of it
    is listed as rejected, never read (a dataset is often shared by people who did not make it)."""
    root = source.resolve()
    folders = sorted(p for p in source.iterdir() if p.is_dir() and not p.name.startswith("."))
    for folder in folders:
        if shown(folder.name) != folder.name:
            raise PrepareError(f"class folder {shown(folder)}: its name must be printable UTF-8 text (the class "
                               "names become the model's outputs); rename it")
        if not folder.resolve().is_relative_to(root):
            raise PrepareError(f"class folder {shown(folder)} is a symbolic link to {shown(folder.resolve())}, "
                               f"outside {shown(source)}: copy the images in, or give their folder as the source")
    if len(folders) < 2:
        raise PrepareError(f"{shown(source)} must hold one subfolder per class (at least two); found {len(folders)}")
    items, rejected = [], []
    for label, folder in enumerate(folders):
        for parent, subfolders, files in os.walk(folder):
            subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
            for name in subfolders:
                if os.path.islink(os.path.join(parent, name)):
                    rejected.append((Path(parent) / name, "a symbolic link to a folder (not followed)"))
            for name in sorted(f for f in files if not f.startswith(".")):
                path = Path(parent) / name
                if path.is_symlink() and not path.resolve().is_relative_to(root):
                    rejected.append((path, f"a symbolic link to {shown(path.resolve())}, outside the source folder"))
                else:
                    items.append((path, label))
    return [f.name for f in folders], items, rejected


def list_csv(source: Path) -> tuple[list[str], list[tuple[Path, int]], list[tuple[Path, str]]]:
    """(class names, (image, label) pairs, nothing rejected) of a CSV of path,label rows; paths
    relative to the CSV's folder. A path listed twice is an error (twice the weight, and maybe in
    both train and validation), so is an empty path or label."""
    rows: dict[Path, tuple[int, str]] = {}
    try:
        # utf-8-sig: Excel's "CSV UTF-8" starts with a byte-order mark, not part of the first cell
        with open(source, newline="", encoding="utf-8-sig") as f:
            for number, row in enumerate(csv.reader(f), 1):
                if not row or row[0].startswith("#"):
                    continue
                if len(row) != 2:
                    raise PrepareError(f"{source}:{number}: expected path,label; got {row}")
                if number == 1 and [cell.strip().lower() for cell in row] == ["path", "label"]:
                    continue  # a header
                text, label = row[0].strip(), row[1].strip()
                if not text or not label:
                    raise PrepareError(f"{source}:{number}: empty {'path' if not text else 'label'} in {row}")
                path = Path(os.path.normpath(source.parent / text))
                if path in rows:
                    first, other = rows[path]
                    again = f"again with label {label!r} (line {first}: {other!r})" if other != label else "again"
                    raise PrepareError(f"{source}:{number}: {shown(path)} is listed {again}; list each image once")
                rows[path] = (number, label)
    except UnicodeDecodeError as err:
        raise PrepareError(f"{source} is not UTF-8 text ({err.reason} at byte {err.start}): save it as UTF-8") from None
    names = sorted({label for _, label in rows.values()}, key=lambda n: (len(n), n) if n.isdigit() else (0, n))
    if len(names) < 2:
        raise PrepareError(f"{source} lists {len(names)} label(s); a classifier needs at least two")
    index = {name: i for i, name in enumerate(names)}
    return names, [(path, index[label]) for path, (_, label) in rows.items()], []


def check_image(path: Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[bytes | None, str | None]:
    """(bytes, None) for an image the job can use, else (None, why). The header is checked first
    (a decompression bomb is refused before it is decoded), then the whole image is decoded."""
    import tensorflow as tf

    from train import preprocess

    if path.suffix.lower() not in IMAGE_SUFFIXES:
        return None, f"not an image file (suffix {shown(path.suffix) or 'none'})"
    try:
        data = path.read_bytes()
    except OSError as err:
        return None, f"unreadable: {err.strerror or err}"
    problem = images.problem(data, max_pixels)
    if problem:
        return None, f"the file {problem}"
    try:
        preprocess.decode(tf.constant(data))
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as err:
        why = re.sub(r"\{\{[^}]*\}\}\s*", "", err.message.splitlines()[0])  # TF's op-location prefix
        return None, f"corrupt image: {why[:120]}"
    return data, None


def split(items: list[tuple[Path, int]], validation_fraction: float, seed: int):
    """Shuffled, then split per class so every class has its share in validation; a class always
    keeps at least one image for training, however small it is."""
    rng = random.Random(seed)
    train, validation = [], []
    for label in sorted({label for _, label in items}):
        of_class = [item for item in items if item[1] == label]
        rng.shuffle(of_class)
        cut = min(round(len(of_class) * validation_fraction), len(of_class) - 1)
        validation += of_class[:cut]
        train += of_class[cut:]
    rng.shuffle(train)
    rng.shuffle(validation)
    return train, validation


def class_names_option(classes: list[str]) -> str:
    """The --hp that gives the job these class names: comma-separated where that is unambiguous,
    else a JSON list (a name with a comma would be split in two), quoted for a shell."""
    import shlex

    plain = all(re.fullmatch(r"[^,\s\"'\[\]]+( [^,\s\"'\[\]]+)*", name) for name in classes)
    value = ",".join(classes) if plain else json.dumps(classes, ensure_ascii=False)
    return f"--hp {shlex.quote(f'class_names={value}')}"


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
            seed: int = 0, workers: int | None = None, strict: bool = False,
            max_pixels: int = DEFAULT_MAX_PIXELS) -> dict:
    from train.example import encode_example

    if out.exists() and any(out.iterdir()):
        raise PrepareError(f"{out} is not empty: give a new output folder")
    if not 0 <= validation_fraction < 1:
        raise PrepareError("--validation-fraction must be in [0, 1)")
    if source.is_dir():
        classes, items, rejected = list_folder(source)
    elif source.suffix.lower() == ".csv":
        classes, items, rejected = list_csv(source)
    else:
        raise PrepareError(f"{source} is neither a folder of class folders nor a .csv file")
    refused_listing = len(rejected)  # links out of the source: never read
    progress = Progress(len(items))
    checked: dict[Path, bytes] = {}
    # TensorFlow's decode ops release the GIL: threads check images in parallel
    with concurrent.futures.ThreadPoolExecutor(workers or os.cpu_count()) as pool:
        checks = pool.map(lambda item: check_image(item[0], max_pixels), items)
        for (path, _), (data, why) in zip(items, checks):
            if data is None:
                rejected.append((path, why))
            else:
                checked[path] = data
            progress.update(len(data or b""), data is None)
    out.mkdir(parents=True, exist_ok=True)
    if rejected:
        (out / "rejected.txt").write_text("".join(f"{shown(path)}\t{why}\n" for path, why in rejected))
        print(f"prepare: REJECTED {len(rejected)} of {len(items) + refused_listing} files (listed in {out / 'rejected.txt'}):",
              file=sys.stderr)
        for path, why in rejected[:10]:
            print(f"  {shown(path)}: {why}", file=sys.stderr)
        if len(rejected) > 10:
            print(f"  ... and {len(rejected) - 10} more", file=sys.stderr)
        if strict:
            raise PrepareError(f"{len(rejected)} images could not be used (--strict)")
    usable = [(path, label) for path, label in items if path in checked]
    empty = [name for label, name in enumerate(classes) if not any(y == label for _, y in usable)]
    if empty:
        raise PrepareError(f"class{'es' if len(empty) > 1 else ''} {', '.join(empty)}: no usable image, so the "
                           "model would have an output it never learned; add images or remove the class")
    train, validation = split(usable, validation_fraction, seed)
    in_validation = {label for _, label in validation}
    small = [name for label, name in enumerate(classes) if label not in in_validation]
    if validation_fraction and small:
        print(f"prepare: warning: class{'es' if len(small) > 1 else ''} {', '.join(small)} "
              f"{'have' if len(small) > 1 else 'has'} too few images for a validation share: none in validation, "
              "so validation accuracy says nothing about them", file=sys.stderr)
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
          f"{class_names_option(classes)}", file=sys.stderr)
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
    parser.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_PIXELS, metavar="PIXELS",
                        help="larger images (width x height, from their header) are rejected before decoding, as "
                             f"the job does (its max_image_pixels; default {DEFAULT_MAX_PIXELS})")
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
                seed=args.seed, workers=args.workers, strict=args.strict, max_pixels=args.max_image_pixels)
        if args.upload:
            upload(args.out, args.upload)
    except (PrepareError, SourceError) as err:
        print(f"launch prepare: error: {err}", file=sys.stderr)
        return 2
    except (BotoCoreError, ClientError) as err:
        print(f"launch prepare: upload failed: {err}", file=sys.stderr)
        return 1
    return 0
