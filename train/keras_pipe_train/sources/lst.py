"""Images listed by MXNet .lst files (record_format=lst), read as they are in File or FastFile mode:
what SageMaker's built-in Image Classification algorithm (MXNet) trains on with ContentType
application/x-image: four channels, `train` and `validation` holding the images, `train_lst` and
`validation_lst` each holding the .lst file that lists its channel's images (the job reads every
file of a _lst channel as one).

A .lst line is tab-separated, as `im2rec --list` writes it (AWS's IC page, "Train with Image
Format"):

    index <TAB> label <TAB> relative path              5     1.000000    dog/dog1.jpg
    index <TAB> label_0 <TAB> ... label_K-1 <TAB> path      multi-label: one 0 or 1 per class

the index unique, the label a class id (its text: 1, or 1.000000 as im2rec writes it), the path
relative to the image channel's folder (SageMaker copies the S3 prefix there, keys kept as paths).
A multi-label job's line holds one 0 or 1 per class (label_format=multi_hot, as MXNet reads it and
AWS's multi-label notebook writes it), or with label_format=index (ContentType parameter
label-format=class-id) the image's class ids. Blank lines are not entries.

Each line becomes the tf.train.Example the rest of the pipeline reads, its image checked as every
record is (example.record_check: an image by its header, not too many pixels). A line that cannot
be read (too few columns, an index or label that is not a number, an index already listed, a path
outside the channel), an image that is not in the channel or not an image, a label out of range:
an error naming the .lst file and the line, or skipped and counted under
max_corrupted_records_to_skip. Pipe mode is refused (check_channels): the .lst names files that
the job must open, and a Pipe stream has the objects' bytes, not their names.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from keras_pipe_train.settings.channels import LST_OF, TRAIN, TRAINING
from keras_pipe_train.settings.contract import ChannelConfig, is_hidden
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.sources import listed
from keras_pipe_train.sources.manifest_labels import NUMBER_TEXT
from pipemode import options
from pipemode.errors import UnreadableError, UnusableRecordError
from pipemode.reader import PassStats

INDEX = re.compile(r"[+-]?[0-9]+")  # im2rec writes %d; MXNet reads it with int()


def lst_channel(channel: str) -> str:
    """The channel whose .lst lists the images of channel `channel` (train may be named training)."""
    return LST_OF[TRAIN if channel == TRAINING else channel]


def check_channels(channels: dict[str, ChannelConfig], hosts: int = 1) -> None:
    """record_format=lst: the train channel (and the validation channel, when there is one) has its
    _lst channel, each _lst channel its images' channel, and all of them are in File or FastFile
    mode, and FullyReplicated on several `hosts`; else a UserError saying what is wrong."""
    for role, lst in LST_OF.items():
        if role not in channels:
            if lst in channels:
                raise UserError(f"channel {lst!r} lists the images of a {role!r} channel, which the job does not have: "
                                f"give the {role!r} channel (the images), or leave {lst!r} out")
            continue
        if lst not in channels:
            raise UserError(f"record_format=lst: channel {channels[role].name!r} holds images that a .lst file lists, "
                            f"in a {lst!r} channel, which the job does not have: the built-in MXNet algorithm's four "
                            "channels are train, validation, train_lst and validation_lst")
        for channel in (channels[role], channels[lst]):
            if channel.input_mode == "Pipe":
                raise in_pipe(channel)
            if hosts > 1 and channel.distribution == "ShardedByS3Key":
                raise UserError(f"channel {channel.name!r} is ShardedByS3Key on {hosts} hosts, but record_format=lst: "
                                "each host needs the whole .lst file and every image it lists (each host reads its "
                                "share of the lines). Use FullyReplicated, as the built-in MXNet algorithm does")


def in_pipe(channel: ChannelConfig) -> UserError:
    return UserError(f"channel {channel.name!r} is in Pipe mode, but record_format=lst (images listed by a .lst file, "
                     "ContentType application/x-image): the .lst names image files the job must open, and a Pipe "
                     "stream holds the objects' bytes one after the other, without their names. Use File or FastFile "
                     "mode, as the built-in MXNet algorithm does; for Pipe mode, pack the images into .rec files "
                     "(im2rec, application/x-recordio) or list them in an augmented manifest")


@dataclasses.dataclass(frozen=True)
class Line:
    """One line of a .lst file: where it is, and its text as read."""

    file: str
    number: int  # from 1
    offset: int  # its first byte's, in the file
    data: bytes

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace").rstrip("\r")


def read_lines(files: list[str]) -> list[Line]:
    """Every non-blank line of the .lst `files`, in file order."""
    lines = []
    for name in files:
        try:
            with open(name, "rb") as f:
                data = f.read()
        except OSError as err:
            raise UnreadableError(f"cannot read .lst file {name}: {err.strerror}") from err
        offset = 0
        for number, raw in enumerate(data.split(b"\n"), start=1):
            if raw.strip():
                lines.append(Line(name, number, offset, raw))
            offset += len(raw) + 1
    return lines


def lst_files(folder: Path, channel: str) -> list[str]:
    """The files of a _lst channel's folder (hidden ones excepted), each read as a .lst file."""
    if not folder.is_dir():
        raise UserError(f"channel {channel!r} folder {folder} does not exist (the channel is in File/FastFile mode)")
    files = sorted(str(p) for p in folder.rglob("*") if p.is_file() and not is_hidden(p.relative_to(folder).parts))
    if not files:
        raise UserError(f"channel {channel!r} ({folder}) holds no files: it must hold the .lst file listing the "
                        "images")
    return files


class LstReader:
    """Reads the images the .lst `lines` list, from `folder` (the image channel's), once per
    `read_pass()`: each one the serialized Example of its bytes and its label(s), in lists
    (pipemode.batches). `encode(image, label, path)`: the Example, the label a class id or a list of
    them or of one value per class (label_format)."""

    def __init__(self, lines: list[Line], folder: Path, channel: str, *, num_classes: int, multi_label: bool,
                 label_format: str, encode: Callable[[bytes, int | list, str], bytes],
                 record_check: Callable[[bytes], str | None], max_corrupted_records_to_skip: int = 0,
                 max_record_bytes: int = 1 << 30, first_of: dict[str, Line] | None = None):
        self.lines, self.folder, self.channel = list(lines), folder, channel
        self.num_classes, self.multi_label, self.label_format = num_classes, multi_label, label_format
        self.encode, self.record_check = encode, record_check
        self.max_skips = options.max_corrupted_records_to_skip(max_corrupted_records_to_skip)
        self.max_record_bytes = max_record_bytes
        # each index's first line, over all lines (a worker reading its share still knows the others')
        self.first_of = first_of if first_of is not None else first_lines(lines)
        self.history: list[PassStats] = []

    def read_pass(self) -> Iterator[list[bytes]]:
        files = sorted({line.file for line in self.lines})
        return listed.read_pass(self.history, self.channel,
                                f"{len(self.lines)} images of {self.folder} listed by {', '.join(files) or 'no line'}",
                                self.max_skips, self._made())

    def _made(self) -> Iterator[listed.Made]:
        for line in self.lines:
            record, problem = self._example(line)
            yield (None, UnusableRecordError(f".lst file {line.file}", line.number - 1, line.offset,
                                             f"line {line.number} {_shown(line.text)}: {problem}")) \
                if problem else (record, None)

    def _example(self, line: Line) -> tuple[bytes, str | None]:
        parsed = self._parse(line)
        if isinstance(parsed, str):
            return b"", parsed
        labels, path = parsed
        name = self.folder / path
        try:
            with open(name, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > self.max_record_bytes:
                    return b"", f"image {path}: {size} bytes, more than an image of max_image_pixels can take"
                data = f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return b"", f"image {path} is not in channel {self.channel!r} (no file {name})"
        except OSError as err:
            raise UnreadableError(f"cannot read image {name} of channel {self.channel!r}: {err.strerror}") from err
        record = self.encode(data, labels, path)
        problem = self.record_check(record)
        return record, (f"image {path}: {problem}" if problem else None)

    def _parse(self, line: Line) -> tuple[int | list, str] | str:
        """(the label or labels, the image's path), or why the line cannot be read."""
        if b"\0" in line.data or _undecodable(line.data):
            return "not text (a .lst file is UTF-8 text: is this a .lst file?)"
        parts = [part.strip() for part in line.text.split("\t")]
        if len(parts) < 3:
            spaces = " (its columns are separated by spaces: a .lst file separates them by tabs)" \
                if len(line.text.split()) >= 3 else ""
            return (f"{len(parts)} tab-separated column{'s' if len(parts) > 1 else ''}; a .lst line has 3 or more: "
                    f"index, label(s), the image's path in channel {self.channel!r}{spaces}")
        index, values, path = parts[0], parts[1:-1], parts[-1]
        if not INDEX.fullmatch(index):
            return f"its index {index!r} is not an integer"
        first = self.first_of.get(str(int(index)))
        if first is not None and first != line:
            return (f"its index {int(index)} is also that of line {first.number} of {first.file}: each image's index "
                    "is unique")
        labels = self._labels(values)
        if isinstance(labels, str):
            return labels
        place = PurePosixPath(path)
        if not path or place.is_absolute() or ".." in place.parts:
            return (f"its path {path!r} is not one inside channel {self.channel!r} (a path relative to the channel's "
                    "folder)")
        return labels, path

    def _labels(self, values: list[str]) -> int | list | str:
        """The line's label(s) as the Example holds them, or why they cannot be read."""
        numbers = []
        for value in values:
            number = float(value) if NUMBER_TEXT.fullmatch(value) else math.nan
            if not math.isfinite(number):
                return f"its label {value!r} is not a number"
            numbers.append(number)
        if self.multi_label and self.label_format == "multi_hot":
            if len(numbers) != self.num_classes:
                return (f"it holds {len(numbers)} label value{'s' if len(numbers) > 1 else ''}; a multi-label .lst "
                        f"line holds one 0 or 1 per class ({self.num_classes}, num_classes), as MXNet reads it")
            wrong = next((v for v, n in zip(values, numbers) if not 0 <= n <= 1), None)
            return numbers if wrong is None else f"its label value {wrong!r} is not 0 or 1 (nor between them)"
        wrong = next((v for v, n in zip(values, numbers) if not n.is_integer() or n < 0), None)
        if wrong is not None:
            return f"its label {wrong!r} is not a class id (an integer from 0)"
        wrong = next((v for v, n in zip(values, numbers) if n >= self.num_classes), None)
        if wrong is not None:
            return (f"its label {wrong!r} is out of range: the job trains labels 0 to {self.num_classes - 1} "
                    f"(num_classes={self.num_classes})")
        ids = [int(n) for n in numbers]
        if self.multi_label:  # label_format=index: the image's class ids
            return sorted(ids)
        if len(ids) != 1:
            return (f"it holds {len(ids)} labels: a single-label .lst line holds one class id (for one 0 or 1 per "
                    "class, set hyperparameter multi_label=1)")
        return ids[0]


def first_lines(lines: list[Line]) -> dict[str, Line]:
    """Each index's first line (the index as int() reads it, in text)."""
    first: dict[str, Line] = {}
    for line in lines:
        index = line.text.split("\t", 1)[0].strip()
        if INDEX.fullmatch(index):
            first.setdefault(str(int(index)), line)
    return first


def reader(images: Path, lst_folder: Path, channel: str, lst_channel: str, *, seed: int | None,
           shard: tuple[int, int] | None, **options) -> LstReader:
    """The reader of image channel `channel` (folder `images`) listed by channel `lst_channel`'s
    files (folder `lst_folder`): its lines in file order, or shuffled by `seed`; with `shard`
    (count, index), only this worker's share of them."""
    lines = read_lines(lst_files(lst_folder, lst_channel))
    first = first_lines(lines)
    if seed is not None:  # the same order on every worker (same seed): their shares stay apart
        random.Random(seed).shuffle(lines)
    if shard:
        lines = lines[shard[1]::shard[0]]
    return LstReader(lines, images, channel, first_of=first, **options)


def _undecodable(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")
