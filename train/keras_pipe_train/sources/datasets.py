"""The input pipeline: where the records come from (one function), then one chain for all modes.

    records --shard--> --shuffle--> batch --skip--> parse_example --> decode (+ augment) --> prefetch

Pipe, File and FastFile differ only in `records()`: the Pipe reader for FIFOs, its decoder for
files (tf.data.TFRecordDataset crashes the process on a crafted record length), both checking
every record (example.record_check) before TensorFlow sees it. Everything after is the same and
is tested on local TFRecord files. Which channel the training and validation examples come from,
and validation_split_ratio's split of the train channel when there is no validation channel:
`sources()`. Every epoch's pipeline is deterministic given its seed (file
order, shuffle and map order are fixed), which is what makes mid-epoch resume exact: a restarted
job rebuilds the epoch's pipeline and skips the batches it had already trained on, before decoding.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import threading
from pathlib import Path

import tensorflow as tf

from keras_pipe_train.settings.channels import TRAIN, VALIDATION
from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.contract import ChannelConfig, Paths, is_hidden
from keras_pipe_train.settings.errors import DataError, UserError
from keras_pipe_train.settings.tracing import as_written, traced
from keras_pipe_train.sources import auto_augment, class_folders, example, lst, manifest, mxnet_records, preprocess
from keras_pipe_train.sources.class_folders import ClassFolderReader
from keras_pipe_train.sources.recent_images import RecentImages
from pipemode import PipeReader, pipe_dataset
from pipemode.files import FileReader

AUTOTUNE = tf.data.AUTOTUNE
log = logging.getLogger(__name__)


def channel_files(folder: Path) -> list[str]:
    """Every data file of a File/FastFile channel: SageMaker copies (or mounts) the S3 prefix's
    objects there, keeping their relative paths. Hidden files are not data."""
    if not folder.is_dir():
        raise UserError(f"channel folder {folder} does not exist (the channel is in File/FastFile mode)")
    files = sorted(
        str(p) for p in folder.rglob("*")
        if p.is_file() and not is_hidden(p.relative_to(folder).parts)
    )
    if not files:
        raise UserError(f"channel folder {folder} holds no files: check the channel's S3 prefix")
    return files


def reader_for(channel: ChannelConfig, layout: Paths, config: JobConfig, *, seed: int = 0,
               shuffle_files: bool = False, shard: tuple[int, int] | None = None,
               interrupt: threading.Event | None = None, seen: manifest.ClassNames | None = None,
               side: str | None = None, sources: bool = False):
    """(the reader of the channel's serialized tf.train.Examples, the (count, index) shard of its
    records still to take, or None). No TensorFlow op runs here (preset counting runs before a
    multi-worker strategy, which must come before any op).
    With `shard` (count, index), only this worker's share of them. Once `interrupt` is set, a
    Pipe pass ends at once, even while waiting for its FIFO or data. `seen` gathers the class
    names a manifest's lines give. `side`: one side of validation_split_ratio's split of the
    channel, "train" or "validation" (None: the whole channel), given only by sources(), which checked
    that the channel can be split. `sources`: the Examples the job makes of class folders' and .lst
    files' images say where each came from (example.SOURCE_FEATURE: its path in the channel), for
    the label check's passes; the passes trained on keep their records as they were."""
    options = {
        "max_corrupted_records_to_skip": config.max_corrupted_records_to_skip,
        "max_record_bytes": example.max_record_bytes(config.max_image_pixels),
        "record_check": example.record_check(config.image_feature, config.label_feature, config.num_classes,
                                             config.max_image_pixels, multi_label=config.multi_label,
                                             label_format=config.label_format),
    }
    if config.attribute_names:
        reader = manifest_reader(channel, layout, config, interrupt, options, seen)
    elif config.record_format == "class_folders" and channel.input_mode == "Pipe":
        raise class_folders_in_pipe(channel)
    elif config.record_format == "lst" and channel.input_mode == "Pipe":
        raise lst.in_pipe(channel)
    elif config.record_format == "recordio" and channel.input_mode == "Pipe":
        if channel.record_wrapper != "None":
            raise UserError(f"channel {channel.name!r} has RecordWrapperType {channel.record_wrapper}, but "
                            "record_format=recordio: the .rec files are RecordIO already, and wrapped again each "
                            "would be one record. Set RecordWrapperType None")
        reader = PipeReader(channel.name, "RecordIO", pipe_dir=layout.input_data, config_dir=layout.input_config,
                            wait_timeout=config.pipe_wait_timeout, interrupt=interrupt,
                            combine=mxnet_records.combiner(config), **options)
    elif channel.input_mode == "Pipe":
        reader = PipeReader(channel.name, "TFRecord", pipe_dir=layout.input_data, config_dir=layout.input_config,
                            wait_timeout=config.pipe_wait_timeout, interrupt=interrupt, **options)
    else:
        reader, shard = file_reader(channel, layout, config, options, seed, shuffle_files, shard, side, sources)
    return reader, shard


def records(channel: ChannelConfig, layout: Paths, config: JobConfig, **options):
    """(the channel's serialized tf.train.Examples, one per element; the reader behind them): the
    records of reader_for(channel, layout, config, **options), its shard taken."""
    reader, shard = reader_for(channel, layout, config, **options)
    dataset = pipe_dataset(reader)
    return (dataset.shard(*shard) if shard else dataset), reader


def count(source: Source, layout: Paths, config: JobConfig, interrupt: threading.Event | None = None) -> int:
    """The examples of one pass of `source` on this host, read and checked but not decoded (a
    preset's measure of the training set: presets.py), in Python: one group of records held at a
    time, and no TensorFlow op. A Pipe channel streams one pass more for it."""
    reader, _ = reader_for(source.channel, layout, config, interrupt=interrupt, side=source.side)
    counted = 0
    for group in reader.read_pass():
        counted += len(group)
        if interrupt is not None and interrupt.is_set():  # (a Pipe pass ends itself; files' readers do not)
            break
    return counted


def file_reader(channel: ChannelConfig, layout: Paths, config: JobConfig, options: dict, seed: int,
                shuffle_files: bool, shard: tuple[int, int] | None, side: str | None = None,
                sources: bool = False) -> tuple:
    """A File/FastFile channel's reader, and the shard of its records still to take (None when each
    worker reads only files of its own). `side`, `sources`: records()'."""
    if config.record_format == "lst":  # (each worker reads its share of the .lst lines)
        return lst_reader(channel, layout, config, options, seed if shuffle_files else None, shard, sources), None
    files = channel_files(layout.input_data / channel.name)
    if side is not None:  # (before the shuffle and the shards: the same split on every epoch and host)
        files = split_files(files, layout.input_data / channel.name, config)[SIDES.index(side)]
    if config.record_format == "recordio":
        files = rec_files(files, channel.name)
    if shuffle_files:  # the same order on every worker (same seed): their shares stay apart
        random.Random(seed).shuffle(files)
    if shard and len(files) >= shard[0]:  # enough files: each worker reads only its own
        files, shard = files[shard[1]::shard[0]], None
    if config.record_format == "class_folders":
        return ClassFolderReader(layout.input_data / channel.name, files, config.class_names, channel.name,
                                 encode=lambda image, label, path: example.encode_example(
                                     image, label, image_feature=config.image_feature,
                                     label_feature=config.label_feature, source=path if sources else None),
                                 **options), shard
    if config.record_format == "recordio":
        return FileReader(files, channel.name, record_format="RecordIO", combine=mxnet_records.combiner(config),
                          **options), shard
    return FileReader(files, channel.name, **options), shard


def lst_reader(channel: ChannelConfig, layout: Paths, config: JobConfig, options: dict, seed: int | None,
               shard: tuple[int, int] | None, sources: bool = False) -> lst.LstReader:
    """A File/FastFile channel of images listed by its _lst channel's .lst file (sources/lst.py):
    its lines shuffled by `seed` (None: in file order), this worker's `shard` of them; `sources`:
    records()'."""
    listing = lst.lst_channel(channel.name)
    multi_hot = config.multi_label and config.label_format == "multi_hot"
    return lst.reader(layout.input_data / channel.name, layout.input_data / listing, channel.name, listing,
                      seed=seed, shard=shard, num_classes=config.num_classes, multi_label=config.multi_label,
                      label_format=config.label_format,
                      encode=lambda image, label, path: example.encode_example(
                          image, label, image_feature=config.image_feature, label_feature=config.label_feature,
                          multi_hot=multi_hot, source=path if sources else None), **options)


def class_folders_in_pipe(channel: ChannelConfig) -> UserError:
    return UserError(f"channel {channel.name!r} is in Pipe mode, but record_format=class_folders: a Pipe stream "
                     "does not say which folder each image came from. Use File or FastFile mode, or prepare the "
                     "images into TFRecords (keras-pipe prepare) for Pipe mode")


SIDES = ("train", "validation")  # validation_split_ratio's split: the examples trained on, those kept apart


def split_files(files: list[str], folder: Path, config: JobConfig) -> tuple[list[str], list[str]]:
    """(the files trained on, the files kept apart for validation): the class folders' split."""
    return class_folders.split(files, folder, config.validation_split_ratio, config.seed)


def check_splittable(channel: ChannelConfig, config: JobConfig) -> None:
    """validation_split_ratio splits the file list of a channel of class folders, known before the
    first epoch (sources/class_folders.py: split); any other channel is a UserError saying why."""
    if config.record_format == "class_folders" and not config.attribute_names:
        if channel.input_mode == "Pipe":
            raise class_folders_in_pipe(channel)
        return
    holds = ("Ground Truth manifest lines" if config.attribute_names else
             {"tfrecord": "TFRecords", "recordio": "MXNet RecordIO images",
              "lst": "images a .lst file lists"}[config.record_format])
    # A split of streamed records (by a hash of each) would stream the whole channel a second time
    # every epoch to validate on a fraction of it, and say how many went each way only afterwards;
    # prepare writes a validation split once, stratified, where the images' labels are known.
    raise UserError(f"hyperparameter validation_split_ratio={config.validation_split_ratio:g} splits a train "
                    "channel of images in class folders (record_format=class_folders, File or FastFile mode), whose "
                    f"files are listed before training; channel {channel.name!r} holds {holds}: give the job a "
                    "'validation' channel (keras-pipe prepare writes one beside the train channel), or set "
                    "validation_split_ratio=0")


@dataclasses.dataclass(frozen=True)
class Source:
    """Where an input's examples come from: a channel, and with validation_split_ratio one side of
    its split ("train" or "validation", SIDES); side None: all of it."""

    channel: ChannelConfig
    side: str | None = None


def sources(config: JobConfig, layout: Paths, channels: dict[str, ChannelConfig]) -> tuple[Source, Source | None]:
    """(where the training examples come from, where the validation examples do: None, nowhere).
    The validation channel when there is one; else, with validation_split_ratio, the train
    channel's share kept apart (said in the log: how many files go each way)."""
    train, ratio = channels[TRAIN], config.validation_split_ratio
    if VALIDATION in channels:
        if ratio:
            log.info("hyperparameter validation_split_ratio=%g is not used: the job validates on its 'validation' "
                     "channel", ratio)
        return Source(train), Source(channels[VALIDATION])
    if not ratio:
        return Source(train), None
    check_splittable(train, config)
    folder = layout.input_data / train.name
    kept, held = split_files(channel_files(folder), folder, config)
    if not held:
        raise UserError(f"hyperparameter validation_split_ratio={ratio:g} keeps none of the {len(kept)} files of "
                        f"channel {train.name!r} apart for validation: a class folder needs at least "
                        f"{max(2, math.ceil(0.5 / ratio))} images for one of them to be (and one left to train on); "
                        "give a 'validation' channel, or a larger ratio")
    log.info("validation_split_ratio=%g (no 'validation' channel): of the %d files of channel %r, %d kept apart for "
             "validation, %d trained on; the same every epoch (in each class folder, drawn by seed %d)", ratio,
             len(kept) + len(held), train.name, len(held), len(kept), config.seed)
    return Source(train, "train"), Source(train, "validation")


def manifest_reader(channel: ChannelConfig, layout: Paths, config: JobConfig, interrupt, options: dict,
                    seen: manifest.ClassNames | None = None) -> PipeReader:
    """An augmented manifest's channel: its records grouped by line into Examples (sources/manifest.py)."""
    names = ",".join(config.attribute_names)
    if channel.input_mode != "Pipe":
        raise UserError(f"channel {channel.name!r} is in {channel.input_mode} mode, but hyperparameter attribute_names "
                        f"({names}) says the train and validation channels are augmented manifests, which SageMaker "
                        "streams in Pipe mode only: set the channel's InputMode to Pipe, or unset attribute_names")
    if channel.record_wrapper != "RecordIO":
        raise UserError(f"channel {channel.name!r} has RecordWrapperType {channel.record_wrapper}: with "
                        f"attribute_names ({names}) it must be RecordIO, or SageMaker streams each image and its "
                        "label run together, with nothing to tell where one ends")
    return PipeReader(channel.name, "RecordIO", pipe_dir=layout.input_data, config_dir=layout.input_config,
                      wait_timeout=config.pipe_wait_timeout, interrupt=interrupt,
                      group_records=len(config.attribute_names), combine=manifest.combiner(config, seen), **options)


def rec_files(files: list[str], channel: str) -> list[str]:
    """A channel's MXNet RecordIO files: its .rec files; im2rec's .idx and .lst beside them are not
    data (said in the log). Any other file is read as one: it may be a .rec file named otherwise."""
    data = [f for f in files if not f.endswith((".idx", ".lst"))]
    if len(data) < len(files):
        log.info("channel %r: %d .idx/.lst files (im2rec's index and list) not read", channel, len(files) - len(data))
    if not data:
        raise UserError(f"channel {channel!r} holds only .idx/.lst files: record_format=recordio reads the .rec files")
    return data


def worker_shard(channel: ChannelConfig, context: tf.distribute.InputContext) -> tuple[int, int] | None:
    # ShardedByS3Key already gave each host its own objects; FullyReplicated gave all of them to
    # every host, so each worker keeps its share (in Pipe mode it still streams them all:
    # ShardedByS3Key is the better choice for several hosts).
    if context.num_input_pipelines > 1 and channel.distribution == "FullyReplicated":
        return context.num_input_pipelines, context.input_pipeline_id
    return None


def parser(config: JobConfig, sources: bool = False):
    """Parses a batch of serialized Examples into (encoded images, labels): class ids (int64,
    [batch]), or with multi_label, multi-hot rows (float32, [batch, classes]). Every record passed
    example.record_check when it was read: the features are there, the labels in range. With
    `sources`, (encoded images, labels, where each came from: "" where its Example does not say)."""
    if not config.multi_label:
        label = tf.io.FixedLenFeature([], tf.int64)
    elif config.label_format == "index":
        label = tf.io.VarLenFeature(tf.int64)
    else:
        label = tf.io.FixedLenFeature([config.num_classes], tf.float32)
    features = {config.image_feature: tf.io.FixedLenFeature([], tf.string), config.label_feature: label}
    if sources:
        features[example.SOURCE_FEATURE] = tf.io.FixedLenFeature([], tf.string, default_value="")

    def parse(batch):
        parsed = tf.io.parse_example(batch, features)
        labels = parsed[config.label_feature]
        if isinstance(labels, tf.SparseTensor):  # class ids -> one 0/1 per class
            labels = tf.cast(tf.sparse.to_indicator(labels, config.num_classes), tf.float32)
        if sources:
            return parsed[config.image_feature], labels, parsed[example.SOURCE_FEATURE]
        return parsed[config.image_feature], labels

    return parse


def epoch_seed(config: JobConfig, epoch: int) -> int:
    return config.seed * 1_000_003 + epoch


class EpochInput:
    """One channel's input for one epoch: the dataset function a tf.distribute strategy calls
    (once per worker, which builds its own pipeline, batched per replica), and the reader that
    function made, which says what the pass held when it held nothing."""

    def __init__(self, channel: ChannelConfig, layout: Paths, config: JobConfig, *, training: bool,
                 epoch: int = 0, skip_steps: int = 0, audit: Audit | None = None,
                 interrupt: threading.Event | None = None, seen: manifest.ClassNames | None = None,
                 side: str | None = None, recent: RecentImages | None = None, examined: int = 0):
        """`examined`: an evaluation pass whose batches also give each image's fingerprint (8 bytes
        of tf.fingerprint of its encoded bytes: which image it is), thumbnail (a JPEG of at most
        `examined` pixels a side) and source (example.SOURCE_FEATURE, "" when its Example has none):
        (images, labels, fingerprints, thumbnails, sources)."""
        self.examined = examined
        self.channel, self.layout, self.config = channel, layout, config
        self.recent = recent  # (training: keeps the pass's last images, for precise_batchnorm)
        self.training, self.epoch, self.skip_steps, self.audit = training, epoch, skip_steps, audit
        self.interrupt, self.seen, self.side = interrupt, seen, side
        self.reader: PipeReader | FileReader | None = None

    def __call__(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        config, seed = self.config, epoch_seed(self.config, self.epoch)
        dataset, self.reader = records(self.channel, self.layout, config, seed=seed, shuffle_files=self.training,
                                       shard=worker_shard(self.channel, context), interrupt=self.interrupt,
                                       seen=self.seen, side=self.side, sources=bool(self.examined))
        if self.training and config.shuffle_buffer:
            # Records are shuffled before batching: a Pipe stream arrives in S3 key order, and
            # shuffling batches would keep every batch's records together. Seeded per epoch, so a
            # resumed epoch gets the same order.
            dataset = dataset.shuffle(config.shuffle_buffer, seed=seed)
        batch = context.get_per_replica_batch_size(config.batch_size)
        dataset = dataset.batch(batch)
        # each step takes one batch per local replica
        local = context.num_replicas_in_sync // context.num_input_pipelines
        first = self.skip_steps * local
        # a resumed epoch decodes again the batches before `first` that the epoch's last images kept
        # for precise BN may include (only kept: skipped again once decoded), so that its statistics
        # are those of the uninterrupted epoch
        again = self.recent.batches_to_fill(batch, first, local) if self.recent and self.training else 0
        if first - again:
            dataset = dataset.skip(first - again)  # batches already trained on: skipped before decoding
        if self.audit:
            dataset = self.audit.tap(dataset, self.epoch, first - again, validation=not self.training,
                                     logged_from=first)
        size, augment = config.image_size, config.augment
        resize_to, interpolation = config.resize, config.resize_interpolation
        geometry = preprocess.Geometry(config.augmentation_random_rotation, config.augmentation_random_zoom,
                                       config.augmentation_random_aspect, config.augmentation_random_shear,
                                       config.augmentation_random_flip)
        if self.training:
            # each batch's augmentation seed: the epoch's, this worker's pipeline, the batch's index in
            # the pass (counted from the first, also when resuming after skipped ones)
            start = tf.constant([seed, context.input_pipeline_id], tf.int64)
            dataset = dataset.enumerate(start=first - again).map(
                as_written(lambda index, batch: (batch, tf.random.experimental.stateless_fold_in(start, index))))
            policy = auto_augment.Policy(config.randaugment_ops, config.randaugment_magnitude)
            dataset = decoded(dataset, config, lambda x, s: preprocess.for_train(
                x, size, augment, s, geometry, resize_to, interpolation, policy), seeded=True,
                same_as=("train", size, augment, geometry, resize_to, interpolation, policy))
            if not self.recent:
                return dataset
            return self.recent.tap(dataset).skip(again).prefetch(AUTOTUNE)
        return self._evaluation(dataset)

    def _evaluation(self, batches: tf.data.Dataset) -> tf.data.Dataset:
        """Validation's batches decoded as validation decodes them; an examined pass's with each
        image's fingerprint, thumbnail and source."""
        config = self.config
        size, resize_to, interpolation = config.image_size, config.resize, config.resize_interpolation

        def prepare(encoded):
            return preprocess.for_eval(encoded, size, resize_to, interpolation)

        if not self.examined:
            return decoded(batches, config, prepare, same_as=("eval", size, resize_to, interpolation))
        side, parse = self.examined, parser(config, sources=True)

        def examined(batch):
            encoded, labels, sources = parse(batch)
            images = preprocess.batch_of(prepare, encoded, size)
            return images, labels, tf.fingerprint(encoded), preprocess.thumbnails(images, side), sources

        return batches.map(as_written(examined), num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)

    def nothing_read(self, epoch: int) -> DataError:
        """The error for a pass that gave no records at all: nothing to train or validate on."""
        stats = self.reader.history[-1] if self.reader and self.reader.history else None
        held = "nothing"
        if stats:
            source = (f"Pipe pass {stats.number} (FIFO {stats.path})" if self.channel.input_mode == "Pipe"
                      else stats.path)
            held = f"its {source} held {stats.bytes} bytes and no records"
            if stats.skipped:
                held = (f"its {source} held {stats.bytes} bytes, and all {stats.skipped} records in them were "
                        "skipped as corrupt or unusable (max_corrupted_records_to_skip)")
        return DataError(
            f"channel {self.channel.name!r} delivered no records in epoch {epoch + 1}: {held}. A job cannot "
            f"{'train' if self.training else 'validate'} on nothing: check the channel's S3 prefix (empty or "
            "0-byte objects?)")


def training_input(channel: ChannelConfig, layout: Paths, config: JobConfig, epoch: int, skip_steps: int = 0,
                   audit: Audit | None = None, interrupt: threading.Event | None = None,
                   seen: manifest.ClassNames | None = None, side: str | None = None,
                   recent: RecentImages | None = None) -> EpochInput:
    return EpochInput(channel, layout, config, training=True, epoch=epoch, skip_steps=skip_steps, audit=audit,
                      interrupt=interrupt, seen=seen, side=side, recent=recent)


def evaluation_input(channel: ChannelConfig, layout: Paths, config: JobConfig,
                     interrupt: threading.Event | None = None, seen: manifest.ClassNames | None = None,
                     side: str | None = None, audit: Audit | None = None, epoch: int = 0,
                     examined: int = 0) -> EpochInput:
    """`audit`, `epoch`: the audit's validation batches are the epoch's. `examined`: EpochInput's."""
    return EpochInput(channel, layout, config, training=False, interrupt=interrupt, seen=seen, side=side,
                      audit=audit, epoch=epoch, examined=examined)


def decoded(batches: tf.data.Dataset, config: JobConfig, transform, seeded: bool = False,
            same_as: tuple = ()) -> tf.data.Dataset:
    """Batches of serialized examples -> (images, labels): parse, then `transform` each image; with
    `seeded`, the batches come with their seeds, and transform(image, seed) gets each image's own.
    `same_as`: what `transform` depends on, all of it (hashable): the batches' transform is then
    traced once in the process for that key (_TRACED_BATCH_TRANSFORMS), not once per dataset."""
    size, parse = config.image_size, parser(config)
    if not seeded:
        transformed = _traced_batches(same_as, lambda images: preprocess.batch_of(transform, images, size))
        dataset = batches.map(as_written(parse), num_parallel_calls=AUTOTUNE)
        dataset = dataset.map(as_written(lambda images, labels: (transformed(images), labels)),
                              num_parallel_calls=AUTOTUNE)
        return dataset.prefetch(AUTOTUNE)
    transformed = _traced_batches(same_as, lambda images, seed: preprocess.seeded_batch_of(transform, images, size,
                                                                                           seed))
    dataset = batches.map(as_written(lambda batch, seed: (*parse(batch), seed)), num_parallel_calls=AUTOTUNE)
    dataset = dataset.map(as_written(lambda images, labels, seed: (transformed(images, seed), labels)),
                          num_parallel_calls=AUTOTUNE)
    return dataset.prefetch(AUTOTUNE)


# Each pass builds its datasets anew (a Pipe pass reads a FIFO of its own), and tf.data traces a
# map's function for every dataset it is given to: building an epoch's training and validation
# passes (32 px digits, crop, flip and colour) took 0.24-0.31 s of CPU, 0.07 s with their
# transforms traced once (docs/speed.md). A tf.function called from the map's function is traced
# once, at its first dataset, and called by every later dataset's map as it is.
_TRACED_BATCH_TRANSFORMS: dict[tuple, tf.types.experimental.GenericFunction] = {}


def _traced_batches(same_as: tuple, transform):
    """`transform` as is without a key; with one, the tf.function traced for that key."""
    if not same_as:
        return transform
    if same_as not in _TRACED_BATCH_TRANSFORMS:
        _TRACED_BATCH_TRANSFORMS[same_as] = traced(transform)
    return _TRACED_BATCH_TRANSFORMS[same_as]


class Audit:
    """Which records each training batch held, and how many batches were trained (and which
    records each validation batch held: entries with "validation"): written to $TRAIN_AUDIT_DIR
    when set (to check exact resume, and what was validated on; it slows the input pipeline)."""

    def __init__(self, folder: Path, host: str):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"audit-{host}.jsonl"
        self._lock = threading.Lock()

    def write(self, entry: dict) -> None:
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")

    def tap(self, dataset: tf.data.Dataset, epoch: int, first_batch: int, validation: bool = False,
            logged_from: int = 0) -> tf.data.Dataset:
        """`logged_from`: batches before it pass unlogged (read again only for precise BN)."""
        def record(index, batch):
            if index < logged_from:
                return batch
            digests = [hashlib.sha1(r).hexdigest() for r in batch.numpy()]
            entry = {"epoch": epoch, "batch": int(index), "records": digests}
            self.write({**entry, "validation": True} if validation else entry)
            return batch

        def logged(index, batch):
            out = tf.py_function(record, [index, batch], tf.string)
            out.set_shape(batch.shape)
            return out

        return dataset.enumerate(start=first_batch).map(as_written(logged))
