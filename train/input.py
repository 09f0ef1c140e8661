"""The input pipeline: where the records come from (one function), then one chain for all modes.

    records --shuffle--> batch --parse_example--> decode (+ augment) --> prefetch

Pipe, File and FastFile differ only in `records()`; everything after it is the same and is
tested on local TFRecord files.
"""

from __future__ import annotations

from collections.abc import Iterator
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


def records(
    channel: ChannelConfig,
    layout: Paths,
    *,
    batch_size: int | None = None,
    max_skips: int = 0,
    shuffle_files: bool = False,
    seed: int = 0,
    wait_timeout: float = 600.0,
) -> tf.data.Dataset:
    """The channel's serialized tf.train.Examples: single records, or batches when batch_size is set."""
    if channel.input_mode == "Pipe":
        return PipeModeDataset(
            channel.name, "TFRecord", pipe_dir=layout.input_data, config_dir=layout.input_config,
            batch_size=batch_size, max_corrupted_records_to_skip=max_skips, wait_timeout=wait_timeout,
        )
    files = channel_files(layout.input_data / channel.name)
    if max_skips:
        return generator_dataset(lambda: read_files(files, max_skips), batch_size)
    dataset = tf.data.Dataset.from_tensor_slices(files)
    if shuffle_files:
        dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(files), 8), num_parallel_calls=AUTOTUNE,
        deterministic=not shuffle_files,
    )
    return dataset.batch(batch_size) if batch_size else dataset


def parser(config: JobConfig, channel: str):
    """Parses a batch of serialized Examples into (encoded images, labels), checking labels."""
    features = {
        config.image_feature: tf.io.FixedLenFeature([], tf.string),
        config.label_feature: tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(batch):
        parsed = tf.io.parse_example(batch, features)
        labels = parsed[config.label_feature]
        allowed = (f"labels must be 0 to {config.num_classes - 1}: check hyperparameters "
                   f"num_classes and label_feature ({config.label_feature!r})")
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


def training_dataset(channel: ChannelConfig, layout: Paths, config: JobConfig) -> tf.data.Dataset:
    size, augment = config.image_size, config.augment
    dataset = records(channel, layout, max_skips=config.max_corrupted_records_to_skip,
                      shuffle_files=True, seed=config.seed, wait_timeout=config.pipe_wait_timeout)
    if config.shuffle_buffer:
        # Records are shuffled before batching: in Pipe mode the stream arrives in S3 key order,
        # and shuffling batches would keep every batch's records together.
        dataset = dataset.shuffle(config.shuffle_buffer, seed=config.seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(config.batch_size)
    dataset = dataset.map(parser(config, channel.name), num_parallel_calls=AUTOTUNE)
    dataset = dataset.map(
        lambda images, labels: (
            preprocess.batch_of(lambda x: preprocess.for_train(x, size, augment), images, size), labels),
        num_parallel_calls=AUTOTUNE,
    )
    return dataset.prefetch(AUTOTUNE)


def evaluation_dataset(channel: ChannelConfig, layout: Paths, config: JobConfig) -> tf.data.Dataset:
    size = config.image_size
    dataset = records(channel, layout, batch_size=config.batch_size,
                      max_skips=config.max_corrupted_records_to_skip, wait_timeout=config.pipe_wait_timeout)
    dataset = dataset.map(parser(config, channel.name), num_parallel_calls=AUTOTUNE)
    dataset = dataset.map(
        lambda images, labels: (
            preprocess.batch_of(lambda x: preprocess.for_eval(x, size), images, size), labels),
        num_parallel_calls=AUTOTUNE,
    )
    return dataset.prefetch(AUTOTUNE)


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

