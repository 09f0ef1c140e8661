"""The input pipeline: where the records come from (one function), then one chain for all modes.

    records --shard--> --shuffle--> batch --skip--> parse_example --> decode (+ augment) --> prefetch

Pipe, File and FastFile differ only in `records()`; everything after it is the same and is
tested on local TFRecord files. Every epoch's pipeline is deterministic given its seed (shuffle,
interleave and map order are fixed), which is what makes mid-epoch resume exact: a restarted job
rebuilds the epoch's pipeline and skips the batches it had already trained on, before decoding.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import tensorflow as tf

from train import preprocess
from train.config import JobConfig
from train.contract import ChannelConfig, Paths
from train.errors import UserError
from train.pipe import PipeModeDataset, generator_dataset
from train.pipe.corruption import CorruptionPolicy
from train.pipe.tfrecord import TFRecordDecoder

AUTOTUNE = tf.data.AUTOTUNE


def channel_files(folder: Path) -> list[str]:
    """Every data file of a File/FastFile channel: SageMaker copies (or mounts) the S3 prefix's
    objects there, keeping their relative paths. Hidden files are not data."""
    if not folder.is_dir():
        raise UserError(f"channel folder {folder} does not exist (the channel is in File/FastFile mode)")
    files = sorted(
        str(p) for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    if not files:
        raise UserError(f"channel folder {folder} holds no files: check the channel's S3 prefix")
    return files


def read_files(files: list[str], max_skips: int) -> Iterator[list[bytes]]:
    """The records of `files`, through the same decoder (and corruption policy) as Pipe mode."""
    for name in files:
        decoder = TFRecordDecoder(CorruptionPolicy(max_skips))
        with open(name, "rb") as f:
            yield from decoder.decode(f.read, f"file {name}")


def records(channel: ChannelConfig, layout: Paths, config: JobConfig, *, seed: int = 0,
            shuffle_files: bool = False, shard: tuple[int, int] | None = None) -> tf.data.Dataset:
    """The channel's serialized tf.train.Examples, one per element; with `shard` (count, index),
    only this worker's share of them."""
    max_skips = config.max_corrupted_records_to_skip
    if channel.input_mode == "Pipe":
        dataset = PipeModeDataset(channel.name, "TFRecord", pipe_dir=layout.input_data,
                                  config_dir=layout.input_config, max_corrupted_records_to_skip=max_skips,
                                  wait_timeout=config.pipe_wait_timeout)
        return dataset.shard(*shard) if shard else dataset
    files = channel_files(layout.input_data / channel.name)
    if shard and len(files) >= shard[0]:  # enough files: each worker reads only its own
        files, shard = files[shard[1]::shard[0]], None
    if max_skips:
        dataset = generator_dataset(lambda: read_files(files, max_skips))
    else:
        dataset = tf.data.Dataset.from_tensor_slices(files)
        if shuffle_files:
            dataset = dataset.shuffle(len(files), seed=seed)
        # deterministic: a resumed epoch must see its records in the same order
        dataset = dataset.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
                                     num_parallel_calls=AUTOTUNE, deterministic=True)
    return dataset.shard(*shard) if shard else dataset


def worker_shard(channel: ChannelConfig, context: tf.distribute.InputContext) -> tuple[int, int] | None:
    # ShardedByS3Key already gave each host its own objects; FullyReplicated gave all of them to
    # every host, so each worker keeps its share (in Pipe mode it still streams them all:
    # ShardedByS3Key is the better choice for several hosts).
    if context.num_input_pipelines > 1 and channel.distribution == "FullyReplicated":
        return context.num_input_pipelines, context.input_pipeline_id
    return None


def parser(config: JobConfig, channel: str):
    """Parses a batch of serialized Examples into (encoded images, labels), checking labels."""
    features = {
        config.image_feature: tf.io.FixedLenFeature([], tf.string),
        config.label_feature: tf.io.FixedLenFeature([], tf.int64),
    }
    allowed = (f"labels must be 0 to {config.num_classes - 1}: check hyperparameters "
               f"num_classes and label_feature ({config.label_feature!r})")

    def parse(batch):
        parsed = tf.io.parse_example(batch, features)
        labels = parsed[config.label_feature]
        checks = [
            tf.debugging.assert_non_negative(
                labels, message=f"LabelOutOfRange: channel {channel!r} has a negative label; {allowed}"),
            tf.debugging.assert_less(
                labels, tf.constant(config.num_classes, tf.int64),
                message=f"LabelOutOfRange: channel {channel!r} has a label >= num_classes "
                        f"({config.num_classes}); {allowed}"),
        ]
        with tf.control_dependencies(checks):
            return parsed[config.image_feature], tf.identity(labels)

    return parse


def epoch_seed(config: JobConfig, epoch: int) -> int:
    return config.seed * 1_000_003 + epoch


def training_input(channel: ChannelConfig, layout: Paths, config: JobConfig, epoch: int, skip_steps: int = 0,
                   audit: "Audit | None" = None) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """The dataset function of one training epoch, for strategy.distribute_datasets_from_function:
    each worker builds its own pipeline, batched per replica."""
    size, augment, seed = config.image_size, config.augment, epoch_seed(config, epoch)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        per_replica = context.get_per_replica_batch_size(config.batch_size)
        local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
        dataset = records(channel, layout, config, seed=seed, shuffle_files=True,
                          shard=worker_shard(channel, context))
        if config.shuffle_buffer:
            # Records are shuffled before batching: a Pipe stream arrives in S3 key order, and
            # shuffling batches would keep every batch's records together. Seeded per epoch, so a
            # resumed epoch gets the same order.
            dataset = dataset.shuffle(config.shuffle_buffer, seed=seed)
        dataset = dataset.batch(per_replica)
        first = skip_steps * local_replicas  # each step takes one batch per local replica
        if first:
            dataset = dataset.skip(first)  # batches already trained on: skipped before decoding
        if audit:
            dataset = audit.tap(dataset, epoch, first)
        return decoded(dataset, config, channel.name, lambda x: preprocess.for_train(x, size, augment))

    return dataset_fn


def evaluation_input(channel: ChannelConfig, layout: Paths, config: JobConfig):
    size = config.image_size

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = records(channel, layout, config, shard=worker_shard(channel, context))
        dataset = dataset.batch(context.get_per_replica_batch_size(config.batch_size))
        return decoded(dataset, config, channel.name, lambda x: preprocess.for_eval(x, size))

    return dataset_fn


def decoded(batches: tf.data.Dataset, config: JobConfig, channel: str, transform) -> tf.data.Dataset:
    """Batches of serialized examples -> (images, labels): parse, then `transform` each image."""
    size = config.image_size
    dataset = batches.map(parser(config, channel), num_parallel_calls=AUTOTUNE)
    dataset = dataset.map(lambda images, labels: (preprocess.batch_of(transform, images, size), labels),
                          num_parallel_calls=AUTOTUNE)
    return dataset.prefetch(AUTOTUNE)


class Audit:
    """Which records each training batch held, and how many batches were trained: written to
    $TRAIN_AUDIT_DIR when set (to check exact resume; it slows the input pipeline)."""

    def __init__(self, folder: Path, host: str):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"audit-{host}.jsonl"
        self._lock = threading.Lock()

    def write(self, entry: dict) -> None:
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")

    def tap(self, dataset: tf.data.Dataset, epoch: int, first_batch: int) -> tf.data.Dataset:
        def record(index, batch):
            digests = [hashlib.sha1(r).hexdigest() for r in batch.numpy()]
            self.write({"epoch": epoch, "batch": int(index), "records": digests})
            return batch

        def logged(index, batch):
            out = tf.py_function(record, [index, batch], tf.string)
            out.set_shape(batch.shape)
            return out

        return dataset.enumerate(start=first_batch).map(logged)


def file_of_corruption(folder: Path) -> str | None:
    """Where a File-mode channel is corrupt: TFRecordDataset's DataLossError names neither the file
    nor the record, so after one, the channel's files are re-read with our decoder, which does."""
    from train.pipe.errors import CorruptRecordError

    try:
        for _ in read_files(channel_files(folder), 0):
            pass
    except CorruptRecordError as err:
        return str(err)
    except (OSError, UserError):
        return None
    return None
