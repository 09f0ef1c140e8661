"""A dataset of TFRecord shards from images, on this machine: `keras-pipe prepare SOURCE OUT` (the
command line: cli.prepare; the same work at scale: prepare.processing and prepare.instance).

The images are listed (prepare.sources), shuffled (seeded) and split per class into train and
validation as listed, then each is checked by decoding it (prepare.images); unreadable or corrupt
ones are listed in OUT/rejected.txt and counted, never silently dropped (strict: an error). The
rest become tf.train.Examples under the feature names the job reads by default (image/encoded,
image/class/label), with where each image came from (image/source), written as they are ready into
shards of about shard_mb; memory stays bounded
whatever the dataset's size. The same inputs, options and seed give byte-identical shards.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import os
import random
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from keras_pipe_launch.prepare import data_report, duplicates, images, sources
from keras_pipe_launch.prepare.sources import Labels, Listing, ListingError, Location, shown
from keras_pipe_train.settings.config import (
    DEFAULT_MAX_PIXELS,  # (Pillow and TensorFlow load only when images are checked)
)


class PrepareError(ValueError):
    pass


def check_image(reader: sources.Reader, location: Location, max_pixels: int = DEFAULT_MAX_PIXELS,
                max_side: int | None = None, quality: int = images.DEFAULT_QUALITY) -> tuple[bytes | None, str | None]:
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
    return images.checked(data, max_pixels, max_side, quality)


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


def split(items: list[tuple[Location, Labels]], validation_fraction: float, seed: int,
          together: Sequence[Sequence[int]] = ()):
    """Shuffled, then split per class so every class has its share in validation; a class always
    keeps at least one image for training, however small it is. Decided on the listing, before any
    image is read: an image found unusable leaves a gap in its part, and never moves another one
    between train and validation (fixing a broken file and preparing again keeps the split).
    A multi-label image is split with its rarest class (the one a random split would most likely
    leave out of validation); images of no class, as a class of their own. `together`: groups of
    items (indices) that go to the same part (duplicates: no validation image is also a training
    image), drawn as one with the class of their first; with none, each item is drawn alone."""
    rng = random.Random(seed)
    frequency = collections.Counter(label for _, labels in items if isinstance(labels, tuple) for label in labels)

    def stratum(labels: Labels) -> int:
        if not isinstance(labels, tuple):
            return labels
        return min(labels, key=lambda label: (frequency[label], label)) if labels else -1

    by_class: dict[int, list] = collections.defaultdict(list)
    for unit in units(items, together):
        by_class[stratum(unit[0][1])].append(unit)
    train, validation = [], []
    for label in sorted(by_class):
        of_class = by_class[label]
        rng.shuffle(of_class)
        cut = min(round(len(of_class) * validation_fraction), len(of_class) - 1)
        validation += of_class[:cut]
        train += of_class[cut:]
    if frequency:  # multi-label: a class whose images all went with rarer ones keeps one to train on
        trained = {label for unit in train for _, labels in unit for label in labels}
        for label in sorted(frequency):
            moved = next((unit for unit in validation if any(label in labels for _, labels in unit)), None)
            if label not in trained and moved:
                validation.remove(moved)
                train.append(moved)
                trained.update(label for _, labels in moved for label in labels)
    train, validation = [item for unit in train for item in unit], [item for unit in validation for item in unit]
    rng.shuffle(train)
    rng.shuffle(validation)
    return train, validation


def units(items: list, together: Sequence[Sequence[int]]) -> list[list]:
    """The items as the split draws them: each group of `together` as one unit, in the place of
    its first member; every other item alone."""
    group_of = {index: group for group in together for index in group}
    drawn = []
    for index, item in enumerate(items):
        group = group_of.get(index)
        if group is None:
            drawn.append([item])
        elif index == min(group):
            drawn.append([items[i] for i in sorted(group)])
    return drawn


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
        self.records: list[int] = []  # each shard's
        self.count, self._file, self._size = 0, None, 0

    def add(self, example: bytes) -> None:
        from pipemode import tfrecord

        if self._file is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.paths.append(self.folder / f"{self.prefix}{len(self.paths):05d}.tfrecord")
            self.records.append(0)
            self._file, self._size = open(self.paths[-1], "wb"), 0
        record = tfrecord.encode_record(example)
        self._file.write(record)
        self._size += len(record)
        self.count += 1
        self.records[-1] += 1
        if self._size >= self.shard_bytes:
            self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_listing(source: str, reader: sources.Reader, multi_label: bool = False,
                 label_attribute: str | None = None) -> Listing:
    """The source's listing; files at its top, in no class folder, are said to be skipped."""
    try:
        listing = sources.list_source(source, reader, multi_label, label_attribute)
    except ListingError as err:
        raise PrepareError(str(err)) from None
    if listing.outside:
        count, where = len(listing.outside), source if source.endswith("/") else source + "/"
        named = ", ".join(shown(name) for name in listing.outside[:3]) + (", ..." if count > 3 else "")
        print(f"prepare: {count} file{'s' if count > 1 else ''} at the top of {shown(where)} "
              f"{'are' if count > 1 else 'is'} in no class folder: skipped ({named})", file=sys.stderr)
    return listing


def report_rejected(out: Path, rejected: list[tuple[Location, str]], files: int, strict: bool,
                    work: Path | None = None) -> None:
    """Lists the rejected images in rejected.txt (written in `work`, moved to `out` with the rest)."""
    if not rejected:
        return
    (work or out).mkdir(parents=True, exist_ok=True)
    (work or out).joinpath("rejected.txt").write_text(
        "".join(f"{shown(where)}\t{shown(why)}\n" for where, why in rejected))
    print(f"prepare: REJECTED {len(rejected)} of {files} files (listed in {shown(out / 'rejected.txt')}):",
          file=sys.stderr)
    for where, why in rejected[:10]:
        print(f"  {shown(where)}: {shown(why)}", file=sys.stderr)
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
        raise PrepareError(f"class{'es' if len(empty) > 1 else ''} {shown(', '.join(empty))}: no usable training "
                           "image, so the model would have an output it never learned; add images or remove the class")
    small = [name for label, name in enumerate(classes) if not validated[label]]
    if validation_fraction and small:
        print(f"prepare: warning: class{'es' if len(small) > 1 else ''} {shown(', '.join(small))} "
              f"{'have' if len(small) > 1 else 'has'} too few images for a validation share: none in validation, "
              "so validation accuracy says nothing about them", file=sys.stderr)


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """How each image is checked and stored (the same on one machine and on every instance)."""

    max_pixels: int = DEFAULT_MAX_PIXELS
    max_side: int | None = None
    quality: int = images.DEFAULT_QUALITY

    def check(self, reader: sources.Reader, location: Location) -> tuple[bytes | None, str | None]:
        return check_image(reader, location, self.max_pixels, self.max_side, self.quality)


@dataclasses.dataclass
class Written:
    """What write_examples made: each part's shards, examples per label (a multi-label image
    counts for each of its classes), examples, and the images rejected."""

    shards: dict[str, list[Path]]
    counts: dict[str, collections.Counter]
    rejected: list[tuple[Location, str]]
    examples: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    records: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # part -> each shard's examples

    def count(self, part: str) -> int:
        return self.examples[part]


def write_examples(queue: list[tuple[Location, Labels, str]], reader: sources.Reader, folder: Path,
                   options: ImageOptions, shard_bytes: int, workers: int, shard_prefix: str = "part-",
                   source_of: Callable[[Location], str] = str) -> Written:
    """Checks each (image, label, part) of `queue` (`workers` at a time) and appends the usable
    ones, in the queue's order, to the shards of folder/part/, each Example with where its image
    came from, `source_of` its location (the job's label check names its suspects so)."""
    from tqdm import tqdm

    from keras_pipe_train.sources.example import encode_example

    writers = {part: ShardWriter(folder / part, shard_bytes, shard_prefix) for part in ("train", "validation")}
    written = Written({}, {part: collections.Counter() for part in writers}, [])
    results = in_order(lambda job: options.check(reader, job[0]), queue, workers)
    try:
        with tqdm(total=len(queue), desc="prepare", unit="image", disable=None) as bar:
            for (where, label, part), (data, why) in zip(queue, results):
                if data is None:
                    written.rejected.append((where, why))
                else:
                    writers[part].add(encode_example(data, label, source=source_of(where)))
                    written.counts[part].update(label if isinstance(label, tuple) else (label,))
                    written.examples[part] += 1
                bar.update()
                bar.set_postfix(rejected=len(written.rejected), refresh=False)
    finally:
        for writer in writers.values():
            writer.close()
    written.shards = {part: writer.paths for part, writer in writers.items()}
    written.records = {part: writer.records for part, writer in writers.items()}
    return written


def recorded(location: Location, source: str) -> str:
    """Where an image came from, as its Example records it: its S3 URI (what a Ground Truth
    manifest of the job's suspects needs), or a local file's path under the source folder (a CSV's
    or a manifest's: under the folder it is in), however the source was typed: the machine's own
    folders are none of the dataset's business. A file outside that folder (a CSV may list any):
    its path as listed."""
    text = str(location)
    if text[:5].lower() == "s3://":
        return "s3://" + text[5:]
    base = Path(source) if Path(source).is_dir() else Path(source).parent
    relative = os.path.relpath(os.path.abspath(text), os.path.abspath(base))
    return text if relative.split(os.sep)[0] == os.pardir else Path(relative).as_posix()


def default_workers(source: str) -> int:
    # S3 reads wait on the network, local ones on the decoder (TensorFlow's ops release the GIL)
    return (os.cpu_count() or 1) * (4 if source.startswith("s3://") else 1)


def check_options(validation_fraction: float, max_side: int | None) -> None:
    if not 0 <= validation_fraction < 1:
        raise PrepareError("--validation-fraction must be in [0, 1)")
    if max_side is not None and max_side < 1:
        raise PrepareError("--max-side must be a positive number of pixels")


# what prepare writes in OUT (and all that --overwrite replaces)
DATASET_ENTRIES = ("train", "validation", "classes.json", "rejected.txt", data_report.JSON_NAME, data_report.HTML_NAME)
WORK_FOLDER = ".incomplete"
# the rejected images of a run that failed beside an earlier dataset (which it leaves as it was)
FAILED_RUN_REJECTED = ".rejected-by-failed-run.txt"


def check_out(out: Path, overwrite: bool) -> None:
    """OUT must be new or empty, or, with --overwrite, hold nothing but a dataset prepare wrote."""
    if out.exists() and not out.is_dir():
        raise PrepareError(f"{shown(out)} is a file: give an output folder")
    if not out.exists() or not any(out.iterdir()):
        return
    if not overwrite:
        raise PrepareError(f"{shown(out)} is not empty: give a new output folder, or --overwrite to replace the "
                           "dataset prepared there (the same sources, options and seed give the same bytes)")
    others = sorted(p.name for p in out.iterdir() if p.name not in (*DATASET_ENTRIES, WORK_FOLDER, FAILED_RUN_REJECTED))
    if others:
        raise PrepareError(f"--overwrite replaces only what keras-pipe prepare writes, and {shown(out)} also holds "
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
    print(f"prepare: the dataset prepared earlier in {shown(out)} is left as it was; this run's rejected images are "
          f"listed in {shown(out / FAILED_RUN_REJECTED)}", file=sys.stderr)


def prepare(source: Path | str, out: Path, *, validation_fraction: float = 0.1, shard_mb: float = 100,
            seed: int = 0, workers: int | None = None, strict: bool = False,
            max_pixels: int = DEFAULT_MAX_PIXELS, max_side: int | None = None,
            quality: int = images.DEFAULT_QUALITY, overwrite: bool = False, multi_label: bool = False,
            label_attribute: str | None = None, duplicate_distance: int | None = duplicates.DISTANCE) -> dict:
    """`multi_label`: SOURCE is a CSV of path,label,label,... rows, or a multi-label Ground Truth
    manifest; each Example holds its image's class ids (the job's multi_label=true,
    label_format=index). `label_attribute`: a manifest's label (default: found from its metadata).
    `duplicate_distance`: duplicates.py's; None: duplicates not looked for (each image read once)."""
    check_out(out, overwrite)
    check_options(validation_fraction, max_side)
    reader = sources.Reader()
    listing = read_listing(str(source), reader, multi_label, label_attribute)
    workers = workers or default_workers(str(source))
    prints, found = find_duplicates(listing, reader, max_pixels, duplicate_distance, workers)
    train, validation = split(listing.items, validation_fraction, seed, [group.members for group in found])
    queue = ([(where, label, "train") for where, label in train]
             + [(where, label, "validation") for where, label in validation])
    # The dataset is made in a hidden folder and moved into place once everything is checked: an
    # error at the end (a class left with no image) leaves no half-made dataset behind, and with
    # --overwrite, the earlier one as it was.
    work = out / WORK_FOLDER
    shutil.rmtree(work, ignore_errors=True)  # (left by a run that was killed)
    try:
        written = write_examples(queue, reader, work, ImageOptions(max_pixels, max_side, quality),
                                 int(shard_mb * 1e6), workers, source_of=lambda where: recorded(where, str(source)))
        rejected = list(listing.rejected) + written.rejected
        report_rejected(out, rejected, len(listing.items) + len(listing.rejected), strict, work)
        check_classes(listing.classes, written.counts["train"], written.counts["validation"], validation_fraction)
        report = data_report.build(str(source), listing.classes, listing.items, prints, found,
                                   {str(where): part for where, _, part in queue}, written.counts, len(rejected),
                                   duplicate_distance)
        write_data_report(work, out, report, listing, str(source), reader)
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
    return summarize(listing.classes, written, len(rejected), shards, str(out), multi_label)


def find_duplicates(listing: Listing, reader: sources.Reader, max_pixels: int, distance: int | None,
                    workers: int) -> tuple[list, list[duplicates.Group]]:
    """Every image's fingerprint and the groups of duplicates among them (duplicates.py); nothing
    when not asked (distance None): each image is then read once, not twice."""
    if distance is None:
        return [None] * len(listing.items), []
    from tqdm import tqdm

    locations = [where for where, _ in listing.items]
    with tqdm(total=len(locations), desc="duplicates", unit="image", disable=None) as bar:
        def mapped(function, items):
            for result in in_order(function, items, workers):
                bar.update()
                yield result

        prints = duplicates.fingerprints(locations, reader.read, max_pixels, mapped)
    return prints, duplicates.groups(prints, distance)  # (said with the data report: data_report.say)


def write_data_report(work: Path, out: Path, report: dict, listing: Listing, source: str,
                      reader: sources.Reader) -> None:
    by_name = {data_report.name_of(where, source): where for where, _ in listing.items}
    thumbnails = data_report.thumbnails_of(report, lambda name: reader.read(by_name[name]))
    data_report.write(work, report, thumbnails)
    data_report.say(report, str(out / data_report.HTML_NAME))


def summarize(classes: list[str], written: Written, rejected: int, shards: dict[str, list], where: str,
              multi_label: bool = False) -> dict:
    """Prints what was prepared and how to train on it; returns the same as a dict."""
    train, validation = written.count("train"), written.count("validation")
    option = class_names_option(classes) + (" --hp multi_label=true" if multi_label else "")
    print(f"prepare: {train} train and {validation} validation examples of {len(classes)} classes in "
          f"{sum(map(len, shards.values()))} shards under {shown(where)}; train with {shown(option)}",
          file=sys.stderr)
    return {"classes": classes, "train": train, "validation": validation, "rejected": rejected,
            "shards": {name: [str(p) for p in paths] for name, paths in shards.items()}}
