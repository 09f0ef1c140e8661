"""PipeModeDataset: a SageMaker Pipe-mode channel as a tf.data.Dataset, on current TensorFlow."""

from __future__ import annotations

import collections
import itertools
import os
import threading
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from pipemode import allocator, channels
from pipemode.reader import DEFAULT_WAIT_TIMEOUT_S, PipeReader
from pipemode.tfrecord import MAX_RECORD_BYTES


def PipeModeDataset(  # named like AWS's class: moving over is one import
    channel: str,
    record_format: str = "RecordIO",
    state_dir: str | os.PathLike | None = None,
    pipe_dir: str | os.PathLike | None = None,
    config_dir: str | os.PathLike | None = None,
    benchmark: bool = False,
    *,
    batch_size: int | None = None,
    drop_remainder: bool = False,
    max_corrupted_records_to_skip: int = 0,
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT_S,
    check_crc: bool = True,
    max_record_bytes: int = MAX_RECORD_BYTES,
    record_check: Callable[[bytes], str | None] | None = None,
    interrupt: threading.Event | None = None,
) -> tf.data.Dataset:
    """Reads SageMaker Pipe-mode channel `channel` as a tf.data.Dataset of serialized records.

    A drop-in replacement for `sagemaker_tensorflow.PipeModeDataset` (same leading arguments,
    same elements: scalar tf.string), for any TensorFlow 2.x: the reading is done in Python,
    fed to tf.data through `from_generator`, so no compiled op is tied to a TF version and
    nothing of the reader can end up in an exported model.

    Args:
      channel: the channel name, as in the job's InputDataConfig.
      record_format: "TFRecord", "RecordIO" or "TextLine" (see PipeReader for how it combines
        with the channel's RecordWrapperType). AWS's default, "RecordIO", is kept.
      state_dir: where pass numbers are kept, shared by all processes on the host, so that a
        second dataset, or a restarted process, reads the next FIFO rather than a used one.
        Default, as AWS's: /opt/ml/pipe_state (under $SAGEMAKER_BASE_DIR when set).
      pipe_dir, config_dir: default to /opt/ml/input/data and /opt/ml/input/config (under
        $SAGEMAKER_BASE_DIR when set).
      benchmark: print each pass's record count and throughput to stdout.
      batch_size: if set, elements are 1-D batches of up to `batch_size` records (the fast
        path: feed them to tf.io.parse_example); otherwise single records.
      drop_remainder: with batch_size, drop each pass's last, short batch.
      max_corrupted_records_to_skip: corrupt records tolerated per pass (each one logged and
        counted); 0 makes the first one an error naming the record and its byte offset.
      wait_timeout: seconds to wait for a pass's FIFO to appear and for its writer.
      check_crc: verify both CRCs of every TFRecord.
      max_record_bytes: a longer record (a TFRecord length, a text line) is corruption.
      record_check: called with every record; returns why it is unusable (say, its image is not
        one), or None. A rejected record is an error naming it and its byte offset, or skipped
        and counted like a corrupt one under max_corrupted_records_to_skip.
      interrupt: once set (say, by a SIGTERM handler), any wait for the FIFO or its data ends
        within a quarter of a second, and the pass ends there, as if it were over.

    Every iteration over the dataset (each Keras epoch, each `for` loop, each `repeat()`) reads
    the channel's next FIFO: <channel>_0, then <channel>_1, and so on.
    """
    reader = PipeReader(
        channel,
        record_format,
        pipe_dir=pipe_dir,
        config_dir=config_dir,
        state_dir=state_dir if state_dir is not None else channels.default_state_dir(),
        wait_timeout=wait_timeout,
        max_corrupted_records_to_skip=max_corrupted_records_to_skip,
        check_crc=check_crc,
        max_record_bytes=max_record_bytes,
        benchmark=benchmark,
        record_check=record_check,
        interrupt=interrupt,
    )
    return pipe_dataset(reader, batch_size=batch_size, drop_remainder=drop_remainder)


# Each from_generator call has a fixed overhead (the py_func machinery, whatever the size): ~8 MiB
# per call makes it a small share of the time per GB (docs/speed.md, Figures behind the code's
# choices: Generator calls). (Without allocator.keep_freed_memory, larger calls page-fault.)
CALL_BYTES = 8 << 20


def pipe_dataset(
    reader: PipeReader, batch_size: int | None = None, drop_remainder: bool = False
) -> tf.data.Dataset:
    """The tf.data view of `reader`: records, or batches of them when batch_size is set."""
    return generator_dataset(reader.read_pass, batch_size, drop_remainder)


def generator_dataset(
    one_pass: Callable[[], Iterator[list[bytes]]],
    batch_size: int | None = None,
    drop_remainder: bool = False,
) -> tf.data.Dataset:
    """Records from Python as a tf.data.Dataset: `one_pass()` is called for every iteration over
    the dataset and yields lists of records. Elements are single records, or batches of them."""
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    if batch_size is None:
        dataset = _groups_dataset(lambda: group(one_pass(), 1, CALL_BYTES)).unbatch()
    else:
        dataset = _batches(one_pass, batch_size, drop_remainder)
    options = tf.data.Options()
    # The FIFOs hold this host's data already (ShardedByS3Key splits it between hosts), and a
    # generator source cannot be split by file: never let a distribution strategy shard it.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def _groups_dataset(groups: Callable[[], Iterator[list[bytes]]]) -> tf.data.Dataset:
    """A dataset of 1-D string tensors, one per list that `groups()` yields."""

    def generate():
        # Here, not at import: TensorFlow sets its own trim threshold when the generator first runs.
        allocator.keep_freed_memory()
        for records in groups():
            # An object array hands tf.data the bytes objects themselves: one copy into the
            # tensor. (A plain list goes through a much slower conversion, docs/speed.md, Figures
            # behind the code's choices: Object arrays; and numpy's fixed-width bytes dtype would
            # strip trailing NUL bytes from records.)
            yield np.array(records, dtype=object)

    # prefetch(1): the generator makes the next group in a thread of its own while tf.data splits
    # or batches this one. Without it, from_generator is only called once the step after it has
    # used up the group, so Python (the slowest step, holding the GIL) would sit idle during every
    # rebatch (docs/speed.md, Figures behind the code's choices: prefetch(1)). It holds one group
    # (CALL_BYTES) more.
    return tf.data.Dataset.from_generator(
        generate, output_signature=tf.TensorSpec([None], tf.string)).prefetch(1)


# How a pass's batches are made, chosen on its first records (see _batches).
_WHOLE, _PIECES = 0, 1


def _batches(one_pass, batch_size: int, drop_remainder: bool) -> tf.data.Dataset:
    """Batches of `batch_size` records, made the faster of two ways for each pass's records.

    Small records: Python hands over several whole batches per call and rebatch() splits them
    (each record copied once more, cheaply). Large records: that copy costs more than it saves,
    and a whole batch per call holds it twice in memory (Python's list and its tensor), so Python
    hands over ~CALL_BYTES pieces and unbatch().batch() moves the records into batches without
    copying them (at a cost per record, which is why small records go the other way;
    docs/speed.md, Figures behind the code's choices: Two ways to batch).

    Which way is known only once the first records are read, so both are built, and a selector
    (choose_from_datasets) sends every batch of the pass through the one chosen: its generator
    starts the pass, reads until the first batch is complete or CALL_BYTES were read, and leaves
    the pass's groups to the chosen way's generator, which starts right after it (tf.data pulls
    the selector, then the input it names, in the same call).
    """
    handed_over: collections.deque = collections.deque()  # each pass's groups, made the chosen way

    def select():
        records = one_pass()
        first: list[bytes] = []
        size = 0
        for chunk in records:
            first += chunk
            size += sum(map(len, chunk))
            if len(first) >= batch_size or size >= CALL_BYTES:
                break
        way = _WHOLE if len(first) >= batch_size and size < CALL_BYTES else _PIECES
        rest = itertools.chain([first], records)
        multiple = batch_size if way == _WHOLE else 1
        handed_over.append(group(rest, multiple, CALL_BYTES))
        yield way

    def take():
        # The newest hand-over is this iteration's (whichever way it goes). Older ones are passes
        # of iterations dropped between the selector's call and this one: closing them closes
        # their FIFOs.
        mine = handed_over.pop()
        while handed_over:
            handed_over.popleft().close()
        return mine

    # One Python call per pass, then the same index for every batch in C++ (a generator yielding it
    # per batch would pay a Python call each, a large share of the time at small records;
    # docs/speed.md, Figures behind the code's choices: The selector)
    selector = tf.data.Dataset.from_generator(select, output_signature=tf.TensorSpec([], tf.int64)).flat_map(
        lambda way: tf.data.Dataset.from_tensors(way).repeat())
    whole = _groups_dataset(take).rebatch(batch_size, drop_remainder=drop_remainder)
    pieces = _groups_dataset(take).unbatch().batch(batch_size, drop_remainder=drop_remainder)
    return tf.data.Dataset.choose_from_datasets([whole, pieces], selector, stop_on_empty_dataset=True)


def group(chunks, multiple: int, target_bytes: int):
    """Regroups lists of records into lists of about `target_bytes`, each a whole multiple of
    `multiple` records (at least one multiple), except the last one of the stream."""
    pending: list[bytes] = []
    size = 0
    for chunk in chunks:
        pending += chunk
        size += sum(map(len, chunk))
        if size < target_bytes or len(pending) < multiple:
            continue
        cut = len(pending) - len(pending) % multiple
        out, pending = pending[:cut], pending[cut:]
        size = sum(map(len, pending))
        yield out
    if pending:
        yield pending
