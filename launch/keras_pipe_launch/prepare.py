"""`keras-pipe prepare`: images -> sharded TFRecords the training job reads, optionally uploaded.

    keras-pipe prepare ./photos ./prepared --upload s3://bucket/datasets/photos/
    keras-pipe prepare labels.csv ./prepared          # CSV rows: path,label (paths relative to it)
    keras-pipe prepare s3://bucket/photos/ ./prepared --max-side 512

SOURCE is a folder with one subfolder per class, a CSV of path,label (paths relative to it, or
s3:// URIs), or either of them in S3 (an s3:// prefix of class folders, an s3:// .csv): images
are read from S3 one by one as workers need them, never copied to disk first. The images are
shuffled (seeded) and split per class into train and validation as listed, then each is checked
by decoding it; unreadable or corrupt ones are listed in OUT/rejected.txt and counted, never
silently dropped (--strict makes any of them an error). The rest become tf.train.Examples under
the feature names the job reads by default (image/encoded, image/class/label), written as they
are ready into shards of about --shard-mb; memory stays bounded whatever the dataset's size.

--max-side PIXELS stores images whose longer side is larger shrunk to it, as JPEG (--jpeg-quality),
which makes every epoch's decoding much cheaper (8x for 2000x1500 photos, 23x for 12 MP ones): use it
when the photos are much larger than the model's image_size (2-3x image_size keeps room for crops);
leave it out to keep the original bytes (the job then decodes them at full size every epoch).

    OUT/train/part-00000.tfrecord ...     -> the train channel (s3://.../train/)
    OUT/validation/part-00000.tfrecord    -> the validation channel
    OUT/classes.json                      -> class names in label order: --hp class_names=...

The same inputs, options and seed give byte-identical shards, in any process and with any number of
workers, so re-running --upload skips every shard already in S3 with the same content (its SHA-256
is kept in the object's metadata). An OUT already used is refused; --overwrite replaces the dataset
prepared there.

At scale, an s3:// prefix of class folders into a new s3:// prefix, as a SageMaker Processing job
of the training image over N instances (or --local: N processes here), the same split and checks:

    keras-pipe prepare s3://bucket/photos/ s3://bucket/prepared/ --instance-count 8 \\
        --role arn:aws:iam::123456789012:role/SageMakerRole --image-uri ACCOUNT.dkr.ecr.REGION.amazonaws.com/IMAGE
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from keras_pipe_launch import image_sources, photos
from keras_pipe_launch.image_sources import Listing, ListingError, Location, shown
from keras_pipe_train.images import DEFAULT_MAX_PIXELS  # (Pillow and TensorFlow load only when images are checked)


class PrepareError(ValueError):
    pass


def check_image(reader: image_sources.Reader, location: Location, max_pixels: int = DEFAULT_MAX_PIXELS,
                max_side: int | None = None, quality: int = photos.DEFAULT_QUALITY) -> tuple[bytes | None, str | None]:
    """(bytes to store, None) for an image the job can use, else (None, why)."""
    if isinstance(location, Path):
        unreadable: tuple = (OSError,)
    else:  # (botocore only for S3: a Processing instance reads local files, and its image has no boto3)
        from botocore.exceptions import BotoCoreError, ClientError

        unreadable = (BotoCoreError, ClientError)
    try:
        data = reader.read(location)
    except unreadable as err:
        return None, f"unreadable: {getattr(err, 'strerror', None) or err}"
    return photos.checked(data, max_pixels, max_side, quality)


def in_order(function: Callable, items: Iterable, workers: int) -> Iterator:
    """function(item) for each item, run by `workers` threads, yielded in the items' order with at
    most 2 x workers results waiting: Executor.map would submit every item at once and hold all
    their results (Python 3.14 adds a buffersize for that; 3.11 has none)."""
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        pending: collections.deque = collections.deque()
        try:
            for item in items:
                pending.append(pool.submit(function, item))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def split(items: list[tuple[Location, int]], validation_fraction: float, seed: int):
    """Shuffled, then split per class so every class has its share in validation; a class always
    keeps at least one image for training, however small it is. Decided on the listing, before any
    image is read: an image found unusable leaves a gap in its part, and never moves another one
    between train and validation (fixing a broken file and preparing again keeps the split)."""
    rng = random.Random(seed)
    by_class: dict[int, list] = collections.defaultdict(list)
    for item in items:
        by_class[item[1]].append(item)
    train, validation = [], []
    for label in sorted(by_class):
        of_class = by_class[label]
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


class ShardWriter:
    """Examples appended to part-00000.tfrecord, part-00001... (`prefix` then the number) in
    `folder`, a new shard once one holds shard_bytes: nothing is kept in memory but the file being
    written."""

    def __init__(self, folder: Path, shard_bytes: int, prefix: str = "part-"):
        self.folder, self.shard_bytes, self.prefix = folder, shard_bytes, prefix
        self.paths: list[Path] = []
        self.count, self._file, self._size = 0, None, 0

    def add(self, example: bytes) -> None:
        from pipemode import tfrecord

        if self._file is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.paths.append(self.folder / f"{self.prefix}{len(self.paths):05d}.tfrecord")
            self._file, self._size = open(self.paths[-1], "wb"), 0
        record = tfrecord.encode_record(example)
        self._file.write(record)
        self._size += len(record)
        self.count += 1
        if self._size >= self.shard_bytes:
            self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_listing(source: str, reader: image_sources.Reader) -> Listing:
    try:
        return image_sources.list_source(source, reader)
    except ListingError as err:
        raise PrepareError(str(err)) from None


def report_rejected(out: Path, rejected: list[tuple[Location, str]], files: int, strict: bool,
                    work: Path | None = None) -> None:
    """Lists the rejected images in rejected.txt (written in `work`, moved to `out` with the rest)."""
    if not rejected:
        return
    (work or out).mkdir(parents=True, exist_ok=True)
    (work or out).joinpath("rejected.txt").write_text("".join(f"{shown(where)}\t{why}\n" for where, why in rejected))
    print(f"prepare: REJECTED {len(rejected)} of {files} files (listed in {out / 'rejected.txt'}):", file=sys.stderr)
    for where, why in rejected[:10]:
        print(f"  {shown(where)}: {why}", file=sys.stderr)
    if len(rejected) > 10:
        print(f"  ... and {len(rejected) - 10} more", file=sys.stderr)
    if strict:
        raise PrepareError(f"{len(rejected)} images could not be used (--strict)")


def check_classes(classes: list[str], trained: collections.Counter, validated: collections.Counter,
                  validation_fraction: float) -> None:
    """A class with no usable training image is an error (the model would have an output it never
    learned); one with none in validation, a warning."""
    empty = [name for label, name in enumerate(classes) if not trained[label]]
    if empty:
        raise PrepareError(f"class{'es' if len(empty) > 1 else ''} {', '.join(empty)}: no usable training image, "
                           "so the model would have an output it never learned; add images or remove the class")
    small = [name for label, name in enumerate(classes) if not validated[label]]
    if validation_fraction and small:
        print(f"prepare: warning: class{'es' if len(small) > 1 else ''} {', '.join(small)} "
              f"{'have' if len(small) > 1 else 'has'} too few images for a validation share: none in validation, "
              "so validation accuracy says nothing about them", file=sys.stderr)


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """How each image is checked and stored (the same on one machine and on every instance)."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    max_side: int | None = None
    quality: int = photos.DEFAULT_QUALITY

    def check(self, reader: image_sources.Reader, location: Location) -> tuple[bytes | None, str | None]:
        return check_image(reader, location, self.max_pixels, self.max_side, self.quality)


@dataclasses.dataclass
class Written:
    """What write_examples made: each part's shards, examples per label, and the images rejected."""

    shards: dict[str, list[Path]]
    counts: dict[str, collections.Counter]
    rejected: list[tuple[Location, str]]

    def count(self, part: str) -> int:
        return sum(self.counts[part].values())


def write_examples(queue: list[tuple[Location, int, str]], reader: image_sources.Reader, folder: Path,
                   options: ImageOptions, shard_bytes: int, workers: int, shard_prefix: str = "part-") -> Written:
    """Checks each (image, label, part) of `queue` (`workers` at a time) and appends the usable
    ones, in the queue's order, to the shards of folder/part/."""
    from tqdm import tqdm

    from keras_pipe_train.example import encode_example

    writers = {part: ShardWriter(folder / part, shard_bytes, shard_prefix) for part in ("train", "validation")}
    written = Written({}, {part: collections.Counter() for part in writers}, [])
    results = in_order(lambda job: options.check(reader, job[0]), queue, workers)
    try:
        with tqdm(total=len(queue), desc="prepare", unit="image", disable=None) as bar:
            for (where, label, part), (data, why) in zip(queue, results):
                if data is None:
                    written.rejected.append((where, why))
                else:
                    writers[part].add(encode_example(data, label))
                    written.counts[part][label] += 1
                bar.update()
                bar.set_postfix(rejected=len(written.rejected), refresh=False)
    finally:
        for writer in writers.values():
            writer.close()
    written.shards = {part: writer.paths for part, writer in writers.items()}
    return written


def default_workers(source: str) -> int:
    # S3 reads wait on the network, local ones on the decoder (TensorFlow's ops release the GIL)
    return (os.cpu_count() or 1) * (4 if source.startswith("s3://") else 1)


def check_options(validation_fraction: float, max_side: int | None) -> None:
    if not 0 <= validation_fraction < 1:
        raise PrepareError("--validation-fraction must be in [0, 1)")
    if max_side is not None and max_side < 1:
        raise PrepareError("--max-side must be a positive number of pixels")


# what prepare writes in OUT (and all that --overwrite replaces)
DATASET_ENTRIES = ("train", "validation", "classes.json", "rejected.txt")
WORK_FOLDER = ".incomplete"
# the rejected images of a run that failed beside an earlier dataset (which it leaves as it was)
FAILED_RUN_REJECTED = ".rejected-by-failed-run.txt"


def check_out(out: Path, overwrite: bool) -> None:
    """OUT must be new or empty, or, with --overwrite, hold nothing but a dataset prepare wrote."""
    if out.exists() and not out.is_dir():
        raise PrepareError(f"{out} is a file: give an output folder")
    if not out.exists() or not any(out.iterdir()):
        return
    if not overwrite:
        raise PrepareError(f"{out} is not empty: give a new output folder, or --overwrite to replace the dataset "
                           "prepared there (the same sources, options and seed give the same bytes)")
    others = sorted(p.name for p in out.iterdir() if p.name not in (*DATASET_ENTRIES, WORK_FOLDER, FAILED_RUN_REJECTED))
    if others:
        raise PrepareError(f"--overwrite replaces only what keras-pipe prepare writes, and {out} also holds "
                           f"{', '.join(map(repr, others[:5]))}{' ...' if len(others) > 5 else ''}: give another "
                           "output folder")


def replace_dataset(work: Path, out: Path) -> None:
    """The dataset made in `work` takes the place of what `out` held (nothing, or an earlier one)."""
    for name in (*DATASET_ENTRIES, FAILED_RUN_REJECTED):
        old = out / name
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        elif old.exists() or old.is_symlink():
            old.unlink()
        if (work / name).exists():
            (work / name).rename(old)


def keep_rejected_list(work: Path, out: Path) -> None:
    """A failed run leaves no dataset, but the list of the images it rejected (often the reason it
    failed): in OUT/rejected.txt, or beside an earlier dataset, which stays as it was, in a file of its own."""
    if not (work / "rejected.txt").exists():
        return
    if not any((out / name).exists() for name in DATASET_ENTRIES):
        (work / "rejected.txt").rename(out / "rejected.txt")
        return
    (work / "rejected.txt").rename(out / FAILED_RUN_REJECTED)
    print(f"prepare: the dataset prepared earlier in {out} is left as it was; this run's rejected images are "
          f"listed in {out / FAILED_RUN_REJECTED}", file=sys.stderr)


def prepare(source: Path | str, out: Path, *, validation_fraction: float = 0.1, shard_mb: float = 100,
            seed: int = 0, workers: int | None = None, strict: bool = False,
            max_pixels: int = DEFAULT_MAX_PIXELS, max_side: int | None = None,
            quality: int = photos.DEFAULT_QUALITY, overwrite: bool = False) -> dict:
    check_out(out, overwrite)
    check_options(validation_fraction, max_side)
    reader = image_sources.Reader()
    listing = read_listing(str(source), reader)
    train, validation = split(listing.items, validation_fraction, seed)
    queue = ([(where, label, "train") for where, label in train]
             + [(where, label, "validation") for where, label in validation])
    # The dataset is made in a hidden folder and moved into place once everything is checked: an
    # error at the end (a class left with no image) leaves no half-made dataset behind, and with
    # --overwrite, the earlier one as it was.
    work = out / WORK_FOLDER
    shutil.rmtree(work, ignore_errors=True)  # (left by a run that was killed)
    try:
        written = write_examples(queue, reader, work, ImageOptions(max_pixels, max_side, quality),
                                 int(shard_mb * 1e6), workers or default_workers(str(source)))
        rejected = list(listing.rejected) + written.rejected
        report_rejected(out, rejected, len(listing.items) + len(listing.rejected), strict, work)
        check_classes(listing.classes, written.counts["train"], written.counts["validation"], validation_fraction)
        for part, paths in written.shards.items():
            if not paths:
                shutil.rmtree(work / part, ignore_errors=True)
        (work / "classes.json").write_text(json.dumps(listing.classes) + "\n")
        replace_dataset(work, out)
    except BaseException:
        keep_rejected_list(work, out)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    shards = {part: [out / part / p.name for p in paths] for part, paths in written.shards.items() if paths}
    return summarize(listing.classes, written, len(rejected), shards, str(out))


def summarize(classes: list[str], written: Written, rejected: int, shards: dict[str, list], where: str) -> dict:
    """Prints what was prepared and how to train on it; returns the same as a dict."""
    train, validation = written.count("train"), written.count("validation")
    print(f"prepare: {train} train and {validation} validation examples of {len(classes)} classes in "
          f"{sum(map(len, shards.values()))} shards under {where}; train with {class_names_option(classes)}",
          file=sys.stderr)
    return {"classes": classes, "train": train, "validation": validation, "rejected": rejected,
            "shards": {name: [str(p) for p in paths] for name, paths in shards.items()}}


def upload(folder: Path, destination: str, workers: int = 8) -> tuple[int, int]:
    """Uploads every file under `folder` to the s3:// prefix; returns (uploaded, unchanged)."""
    import threading

    import boto3
    from boto3.s3.transfer import TransferConfig
    from tqdm import tqdm

    from keras_pipe_launch.objects import parse_s3_uri

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
    print(f"upload: {uploaded} files uploaded, {unchanged} already there unchanged, to {destination}",
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


def jpeg_quality(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a JPEG quality: give a whole number from 1 to 100")
    return int(text)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("prepare", help="images -> sharded TFRecords, optionally uploaded to S3",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="a folder of class folders, a CSV of path,label, or either in S3 (s3://...)")
    parser.add_argument("out", help="the output folder (new or empty, or see --overwrite); with --instance-count, "
                                    "a new s3:// prefix")
    parser.add_argument("--validation-fraction", type=float, default=0.1)
    parser.add_argument("--shard-mb", type=float, default=100, help="target shard size")
    parser.add_argument("--seed", type=int, default=0, help="for the shuffle and the split")
    parser.add_argument("--workers", type=int, default=None,
                        help="images checked in parallel (default: the CPUs; 4x that for an S3 source)")
    parser.add_argument("--max-side", type=int, default=None, metavar="PIXELS",
                        help="store images whose longer side is larger shrunk to it (aspect kept), as JPEG; "
                             "default: the original bytes")
    parser.add_argument("--jpeg-quality", type=jpeg_quality, default=photos.DEFAULT_QUALITY, metavar="1-100",
                        help=f"of the images --max-side shrinks (default {photos.DEFAULT_QUALITY})")
    parser.add_argument("--strict", action="store_true", help="fail if any image is unusable")
    parser.add_argument("--max-image-pixels", type=int, default=DEFAULT_MAX_PIXELS, metavar="PIXELS",
                        help="larger images (width x height, from their header) are rejected before decoding, as "
                             f"the job does (its max_image_pixels; default {DEFAULT_MAX_PIXELS})")
    parser.add_argument("--upload", metavar="S3_PREFIX", default=None, help="then upload OUT to s3://bucket/prefix/")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the dataset an earlier run prepared in OUT (nothing else is ever deleted)")
    from keras_pipe_launch import prepare_job

    prepare_job.add_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    from keras_pipe_launch.job_request import RequestError
    from keras_pipe_launch.objects import SourceError

    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if args.instance_count is not None:
            from keras_pipe_launch import prepare_job

            if args.overwrite:
                raise PrepareError("--overwrite is for a prepare on one machine: at scale, OUT must be a new prefix")

            return prepare_job.run(args)
        for option in ("dry_run", "local", "role", "image_uri", "job_dir", "image"):
            if getattr(args, option):
                raise PrepareError(f"--{option.replace('_', '-')} is for a prepare at scale: give --instance-count")
        if args.upload:
            from keras_pipe_launch.objects import parse_s3_uri

            parse_s3_uri(args.upload)  # before the work, not after
        prepare(args.source, Path(args.out), validation_fraction=args.validation_fraction, shard_mb=args.shard_mb,
                seed=args.seed, workers=args.workers, strict=args.strict, max_pixels=args.max_image_pixels,
                max_side=args.max_side, quality=args.jpeg_quality, overwrite=args.overwrite)
        if args.upload:
            upload(Path(args.out), args.upload)
    except (PrepareError, SourceError, RequestError) as err:
        print(f"keras-pipe prepare: error: {err}", file=sys.stderr)
        return 2
    except (BotoCoreError, ClientError) as err:
        print(f"keras-pipe prepare: {'upload' if args.upload else 'a call to AWS'} failed: {err}", file=sys.stderr)
        return 1
    return 0
