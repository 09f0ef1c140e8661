"""File and FastFile channels of images in class folders (record_format=class_folders), read as
they are: the layout SageMaker's built-in Image Classification - TensorFlow algorithm trains on
(`train/cat/*.jpg`, `train/dog/*.jpg`), with no `keras-pipe prepare` first.

Each image becomes the tf.train.Example the rest of the pipeline reads (its bytes, the class id of
its folder), checked as prepare checks it and as every record is checked (example.record_check:
an image by its header, not too many pixels) before any TensorFlow op sees it. A file outside the
class folders, in a folder that is not a class, too large, or not an image is an error naming it,
or skipped and counted under max_corrupted_records_to_skip.

The classes are hyperparameter class_names, or else the train channel's folder names, sorted
(main.py reads them before the configuration is checked: with_folder_classes). With several hosts
and ShardedByS3Key a host may miss a class's folder altogether, so class_names is required there.
The train channel may be named `training`, as the built-in algorithm's is (contract.channels_by_role).
Without a validation channel, validation_split_ratio keeps a share of each class folder's images
apart for validation (`split`).
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

from keras_pipe_train.settings.channels import TRAIN
from keras_pipe_train.settings.contract import ChannelConfig, Paths, ResourceConfig, is_hidden
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.sources import listed
from pipemode import options
from pipemode.errors import UnreadableError, UnusableRecordError
from pipemode.reader import PassStats


def folder_classes(folder: Path) -> list[str]:
    """The class folders of a channel folder: its subfolders but hidden ones, sorted."""
    if not folder.is_dir():
        raise UserError(f"channel folder {folder} does not exist (record_format=class_folders reads File/FastFile "
                        "channels)")
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not is_hidden([p.name]))


def with_folder_classes(raw: dict, layout: Paths, channels: dict[str, ChannelConfig],
                        resources: ResourceConfig) -> dict:
    """The hyperparameters, with class_names set to the train channel's class folders when
    record_format=class_folders leaves them to the folders (the request's own record_format, or its
    dialect's: the built-in TensorFlow algorithm's is class folders)."""
    from keras_pipe_train.settings import dialects
    from keras_pipe_train.settings.config import HYPERPARAMETERS

    read = dialects.translate(raw, len(resources.hosts)).hyperparameters
    definition = HYPERPARAMETERS["record_format"]
    record_format = definition.parse("record_format", read.get("record_format", definition.default))
    given = HYPERPARAMETERS["class_names"].parse("class_names", read.get("class_names"))
    if record_format != "class_folders" or given is not None or TRAIN not in channels:
        return raw
    train = channels[TRAIN]
    if len(resources.hosts) > 1 and train.distribution == "ShardedByS3Key":
        raise UserError("record_format=class_folders on several hosts with ShardedByS3Key: a host may get none of a "
                        "class's images, and name the classes otherwise than the others: give hyperparameter "
                        "class_names")
    folder = layout.input_data / train.name  # ('training': the built-in TensorFlow algorithm's name for it)
    names = folder_classes(folder)
    if len(names) < 2:
        raise UserError(f"record_format=class_folders: channel {train.name!r} ({folder}) must hold one "
                        f"folder per class, at least two; it holds {len(names)} ({', '.join(names) or 'none'})")
    return {**raw, "class_names": json.dumps(names)}


def split(files: list[str], folder: Path, ratio: float, seed: int) -> tuple[list[str], list[str]]:
    """validation_split_ratio's split of a channel's `files` (under `folder`): (those trained on,
    those kept apart for validation), each sorted. Stratified: in each class folder, `ratio` of its
    files (rounded, and at least one left to train on), drawn by `seed` from its files in name
    order, so that the split is the same on every epoch and every host that has the same files.
    Files outside the class folders are split as one group of their own (the reader then names
    them as it always does)."""
    groups: dict[str, list[str]] = {}
    for name in sorted(files):
        parts = Path(os.path.relpath(name, folder)).parts
        groups.setdefault(parts[0] if len(parts) > 1 else "", []).append(name)
    train, validation = [], []
    for group, names in sorted(groups.items()):
        count = min(math.floor(ratio * len(names) + 0.5), len(names) - 1)
        # (seeded by text: the same draw in every process, whatever its hash seed)
        held = set(random.Random(f"{seed}/{group}").sample(range(len(names)), count))
        for index, name in enumerate(names):
            (validation if index in held else train).append(name)
    return sorted(train), sorted(validation)


class ClassFolderReader:
    """Reads `files` (under `folder`) in the order given, once per `read_pass()`: each one the
    serialized Example of its bytes and its folder's class id, in lists (pipemode.batches)."""

    def __init__(self, folder: Path, files: list[str], class_names: tuple[str, ...], channel: str, *,
                 encode: Callable[[bytes, int, str], bytes], record_check: Callable[[bytes], str | None],
                 max_corrupted_records_to_skip: int = 0, max_record_bytes: int = 1 << 30):
        self.folder, self.files, self.channel = folder, list(files), channel
        self.labels = {name: label for label, name in enumerate(class_names)}
        self.encode, self.record_check = encode, record_check
        self.max_skips = options.max_corrupted_records_to_skip(max_corrupted_records_to_skip)
        self.max_record_bytes = max_record_bytes
        self.history: list[PassStats] = []

    def read_pass(self) -> Iterator[list[bytes]]:
        return listed.read_pass(self.history, self.channel, f"{len(self.files)} images in {self.folder}",
                                self.max_skips, self._made())

    def _made(self) -> Iterator[listed.Made]:
        for number, name in enumerate(self.files):
            record, problem = self._example(name)
            yield (None, UnusableRecordError(f"channel {self.channel!r}", number, 0, f"file {name}: {problem}")) \
                if problem else (record, None)

    def _example(self, name: str) -> tuple[bytes, str | None]:
        parts = Path(os.path.relpath(name, self.folder)).parts
        if len(parts) < 2:
            return b"", "not in a class folder (record_format=class_folders: CHANNEL/CLASS/IMAGE)"
        if parts[0] not in self.labels:
            shown = ", ".join(list(self.labels)[:10]) + (", ..." if len(self.labels) > 10 else "")
            return b"", f"its folder {parts[0]!r} is not one of the job's classes ({shown})"
        try:
            with open(name, "rb") as f:
                if os.fstat(f.fileno()).st_size > self.max_record_bytes:
                    return b"", (f"{os.fstat(f.fileno()).st_size} bytes, more than an image of max_image_pixels "
                                 "can take")
                data = f.read()
        except OSError as err:
            raise UnreadableError(f"cannot read file {name} of channel {self.channel!r}: {err.strerror}") from err
        record = self.encode(data, self.labels[parts[0]], "/".join(parts))
        return record, self.record_check(record)
