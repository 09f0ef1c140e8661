"""PipeModeDataset against real FIFOs fed by real writer processes (tests/pipe_writer.py)."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from pipemode import (
    CorruptRecordError,
    PipeConfigError,
    PipeDataError,
    PipeModeDataset,
    PipeModeDatasetException,
    reader_error,
    recordio,
    tfrecord,
)
from pipemode.passes import state_file_name
from tests.conftest import REPO, random_records
from tests.timeouts import wait_s


def records_of(dataset) -> list[bytes]:
    return [x.numpy() for x in dataset]


def batches_of(dataset) -> list[list[bytes]]:
    return [list(b.numpy()) for b in dataset]


@pytest.fixture
def big_mixed_records():
    return random_records(10, 400, max_bytes=5000) + [os.urandom(6 << 20), b"", os.urandom(3 << 20)]


def test_every_record_arrives_exactly_including_empty_and_multi_megabyte_ones(job, big_mixed_records):
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode(big_mixed_records))])
    assert records_of(PipeModeDataset("train", "TFRecord")) == big_mixed_records


@pytest.mark.parametrize("batch_size, drop", [(1, False), (7, False), (64, True), (10_000, False)])
def test_batched_fast_path_gives_the_same_records_in_batches(job, big_mixed_records, batch_size, drop):
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode(big_mixed_records))])
    ds = PipeModeDataset("train", "TFRecord", batch_size=batch_size, drop_remainder=drop)
    assert ds.element_spec == tf.TensorSpec([batch_size if drop else None], tf.string)
    batches = batches_of(ds)
    whole = len(big_mixed_records) // batch_size * batch_size
    expected = big_mixed_records[:whole] if drop else big_mixed_records
    assert [r for b in batches for r in b] == expected
    assert all(len(b) == batch_size for b in batches[: whole // batch_size])


def test_several_objects_concatenate_into_one_stream(job):
    parts = [random_records(seed, 50) for seed in range(3)]
    job.add_channel("train")
    job.feed("train", [job.write(f"{i}.tfrecord", tfrecord.encode(p)) for i, p in enumerate(parts)])
    assert records_of(PipeModeDataset("train", "TFRecord")) == [r for p in parts for r in p]


def test_slow_writer_in_odd_sized_chunks_with_pauses(job):
    records = random_records(11, 60, max_bytes=300)
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode(records))], chunk_bytes=97, pause=0.002)
    assert records_of(PipeModeDataset("train", "TFRecord")) == records


def test_each_iteration_reads_the_next_pass(job):
    records = random_records(12, 30)
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode(records))])
    ds = PipeModeDataset("train", "TFRecord")
    for number in range(3):
        assert records_of(ds) == records
        assert (job.data_dir / f"train_{number}").exists()
    assert not (job.data_dir / "train_4").exists()


def test_repeat_reads_one_pass_per_repetition(job):
    records = random_records(13, 25)
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode(records))])
    assert records_of(PipeModeDataset("train", "TFRecord").repeat(3)) == records * 3


def test_a_second_dataset_on_the_channel_gets_the_next_pass(job):
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode([b"x"]))])
    first, second = PipeModeDataset("train", "TFRecord"), PipeModeDataset("train", "TFRecord")
    assert records_of(first) == [b"x"] and records_of(second) == [b"x"]
    assert (job.data_dir / "train_1").exists()


def test_two_channels_read_at_once(job):
    train, val = random_records(14, 500), random_records(15, 300)
    job.stream("train", train)
    job.stream("validation", val)
    pairs = tf.data.Dataset.zip(
        (PipeModeDataset("train", "TFRecord"), PipeModeDataset("validation", "TFRecord"))
    )
    got = [(a.numpy(), b.numpy()) for a, b in pairs]
    assert got == list(zip(train, val))


def test_recordio_wrapped_objects_are_the_records(job):
    magic = recordio.MAGIC_BYTES
    objects = [b"", b"plain", magic * 3, b"ab" + magic + b"cd" + magic, os.urandom(2 << 20)]
    job.add_channel("augmented", wrapper="RecordIO")
    job.feed("augmented", [job.write(f"{i}.bin", o) for i, o in enumerate(objects)], wrapper="RecordIO")
    assert records_of(PipeModeDataset("augmented", "RecordIO")) == objects


def test_tfrecord_files_wrapped_in_recordio(job):
    parts = [random_records(20, 40), [], random_records(21, 5, max_bytes=400_000)]
    job.add_channel("train", wrapper="RecordIO")
    job.feed("train", [job.write(f"{i}.tfrecord", tfrecord.encode(p)) for i, p in enumerate(parts)],
             wrapper="RecordIO")
    assert records_of(PipeModeDataset("train", "TFRecord")) == [r for p in parts for r in p]


def test_recordio_files_in_an_unwrapped_channel(job):
    payloads = random_records(22, 100) + [recordio.MAGIC_BYTES * 2]
    job.add_channel("rec")
    job.feed("rec", [job.write("a.rec", recordio.encode(payloads))])
    assert batches_of(PipeModeDataset("rec", "RecordIO", batch_size=1000)) == [payloads]


# --- failures: clear errors naming channel, FIFO, record, offset ------------------------------


def test_crc_mismatch_names_channel_fifo_record_and_offset(job):
    data = bytearray(tfrecord.encode([b"a" * 100, b"b" * 100, b"c" * 100]))
    data[116 + 40] ^= 1  # a byte of the second record's data
    job.add_channel("train")
    job.feed("train", [job.write("bad.tfrecord", bytes(data))])
    with pytest.raises(tf.errors.OpError) as info:
        records_of(PipeModeDataset("train", "TFRecord"))
    message = str(info.value)
    assert "CorruptRecordError" in message
    assert (
        f"corrupt record #1 at byte offset 116 of channel 'train' pass 0 "
        f"(FIFO {job.data_dir}/train_0): data CRC mismatch" in message
    )


def test_corrupt_records_can_be_skipped_and_are_counted(job, caplog):
    records = [bytes([i]) * 50 for i in range(10)]
    data = bytearray(tfrecord.encode(records))
    data[3 * 66 + 20] ^= 1
    data[7 * 66 + 20] ^= 1
    job.add_channel("train")
    job.feed("train", [job.write("bad.tfrecord", bytes(data))])
    ds = PipeModeDataset("train", "TFRecord", max_corrupted_records_to_skip=2)
    with caplog.at_level("WARNING"):
        got = records_of(ds)
    assert got == [r for i, r in enumerate(records) if i not in (3, 7)]
    assert caplog.text.count("SKIPPED corrupt record") == 2


def test_writer_dying_mid_record_is_a_truncation_error(job):
    records = [b"z" * 1000] * 20
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode(records))], die_after_bytes=10 * 1016 + 500)
    with pytest.raises(tf.errors.OpError, match=r"TruncatedRecordError: corrupt record #10 at byte offset 10160 .*the stream ended 500 bytes into a 1016-byte record"):
        records_of(PipeModeDataset("train", "TFRecord"))


def test_fifo_that_never_appears_times_out_with_a_clear_error(job):
    job.add_channel("train")
    started = time.monotonic()
    with pytest.raises(tf.errors.OpError) as info:
        records_of(PipeModeDataset("train", "TFRecord", wait_timeout=1.5))
    assert 1.5 <= time.monotonic() - started < 15
    message = str(info.value)
    assert f"PipeTimeoutError: FIFO {job.data_dir}/train_0 (channel 'train', pass 0) did not appear within 1.5 s" in message


def test_fifo_without_a_writer_times_out_with_a_clear_error(job):
    job.add_channel("train")
    os.mkfifo(job.data_dir / "train_0")
    with pytest.raises(tf.errors.OpError, match=r"no process opened FIFO .*train_0 .* for writing within 1 s"):
        records_of(PipeModeDataset("train", "TFRecord", wait_timeout=1))


@pytest.mark.parametrize(
    "setup, kwargs, message",
    [
        (lambda job: job.add_channel("other"), {}, r"channel 'train' is not in .*inputdataconfig.json; the job's channels are: other"),
        (lambda job: job.add_channel("train", mode="File"), {}, r"channel 'train' is in File mode, not Pipe"),
        (lambda job: job.add_channel("train"), {"record_format": "CSV"}, r"record_format 'CSV' is not supported; use one of TFRecord, RecordIO, TextLine"),
        (lambda job: job.add_channel("train"), {"max_corrupted_records_to_skip": -1}, r"must be >= 0"),
        (lambda job: None, {}, r"inputdataconfig.json does not exist"),
    ],
    ids=["missing-channel", "file-mode", "bad-format", "bad-skip", "no-config"],
)
def test_configuration_errors_are_raised_at_construction(job, setup, kwargs, message):
    setup(job)
    kwargs.setdefault("record_format", "TFRecord")
    # caught under AWS's name too, as code written for its PipeModeDataset does
    with pytest.raises(PipeModeDatasetException, match=message) as info:
        PipeModeDataset("train", **kwargs)
    assert isinstance(info.value, PipeConfigError)


@pytest.mark.slow
def test_state_dir_shares_pass_numbers_between_processes(job, tmp_path):
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode([b"one", b"two"]))])
    script = (
        "import sys; from pipemode import PipeModeDataset\n"
        f"ds = PipeModeDataset('train', 'TFRecord', state_dir={str(tmp_path / 'state')!r})\n"
        "print(len(list(ds)))\n"
    )
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(job.base)}
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, check=True,
                             capture_output=True, text=True, timeout=120).stdout
        assert out.strip().endswith("2")
    (state,) = (tmp_path / "state").iterdir()
    assert state.name == state_file_name("train", job.data_dir) and state.read_text() == "2"
    assert (job.data_dir / "train_1").exists()


@pytest.mark.slow
def test_element_spec_and_graph_mode_use(job):
    """The dataset works inside tf.function pipelines: parse_example on batches."""
    examples = [
        tf.train.Example(features=tf.train.Features(feature={
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))
        })).SerializeToString()
        for i in range(50)
    ]
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode(examples))])
    ds = PipeModeDataset("train", "TFRecord", batch_size=16).map(
        lambda b: tf.io.parse_example(b, {"label": tf.io.FixedLenFeature([], tf.int64)})["label"]
    )
    assert np.concatenate([b.numpy() for b in ds]).tolist() == list(range(50))


@pytest.mark.parametrize("writer", ["none", "silent"])
def test_an_interrupt_ends_a_wait_for_the_fifo_or_its_data_at_once(job, writer):
    import threading
    import time

    from pipemode import PipeReader

    job.add_channel("train")
    if writer == "silent":  # a writer that connects, writes one record, then says nothing more
        os.mkfifo(job.data_dir / "train_0")
        silent = open(os.open(job.data_dir / "train_0", os.O_RDWR), "wb", buffering=0)
        silent.write(tfrecord.encode([b"only one"]))
    interrupt = threading.Event()
    reader = PipeReader("train", "TFRecord", wait_timeout=240, interrupt=interrupt)
    threading.Timer(0.5, interrupt.set).start()
    started = time.monotonic()
    got = [r for batch in reader.read_pass() for r in batch]
    assert time.monotonic() - started < 5
    assert got == []  # (a chunk still being read when interrupted is dropped with the rest of the pass)
    assert reader.history[-1].interrupted


@pytest.mark.slow
def test_state_dir_defaults_to_aws_pipe_state_so_a_new_process_reads_the_next_fifo(job):
    """As AWS's: pass numbers in <base>/pipe_state, so a restarted script does not wait on a used FIFO."""
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode([b"one", b"two"]))], passes=2)
    script = "from pipemode import PipeModeDataset\nprint(len(list(PipeModeDataset('train', 'TFRecord'))))\n"
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(job.base)}
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=wait_s(120))
        assert out.returncode == 0 and out.stdout.strip().endswith("2"), out.stderr[-2000:]
    assert (job.base / "pipe_state" / state_file_name("train", job.data_dir)).read_text() == "2"
    # another folder's FIFOs of the same channel name start at their own pass 0
    other = job.base / "elsewhere"
    other.mkdir()
    os.mkfifo(other / "train_0")
    writer = subprocess.Popen(["sh", "-c", f"printf '' > {other / 'train_0'}"])
    ds = PipeModeDataset("train", "TFRecord", pipe_dir=other, wait_timeout=30)
    assert list(ds) == [] and writer.wait(timeout=30) == 0


def test_a_reader_error_inside_keras_fit_is_found_by_name(job):
    """tf.data turns our exception into a TensorFlow error; reader_error gives ours back."""
    data = bytearray(tfrecord.encode([b"a" * 100] * 3))
    data[116 + 40] ^= 1
    job.add_channel("train")
    job.feed("train", [job.write("bad.tfrecord", bytes(data))])
    ds = PipeModeDataset("train", "TFRecord", batch_size=2).map(
        lambda b: (tf.zeros([tf.size(b), 1]), tf.zeros([tf.size(b)])))
    import keras

    model = keras.Sequential([keras.Input([1]), keras.layers.Dense(1)])
    model.compile(loss="mse")
    with pytest.raises(tf.errors.OpError) as raised:
        model.fit(ds, epochs=1, verbose=0)
    found = reader_error(raised.value)
    assert type(found) is CorruptRecordError and isinstance(found, PipeDataError)
    assert str(found).startswith("corrupt record #1 at byte offset 116 of channel 'train' pass 0 (FIFO ")
    assert str(found).endswith("): data CRC mismatch in a record of 100 bytes")  # whole, nothing of TF
    assert reader_error(found) is found and reader_error(ValueError("other")) is None


def numbered_passes(sizes):
    """one_pass for generator_dataset: pass k holds records of `sizes` bytes, each starting with
    its pass number, in lists of 3; `closed` lists the passes whose generator was closed early."""
    started, closed = [], []

    def one_pass():
        number = len(started)
        started.append(number)
        records = [bytes([number]) * size for size in sizes]
        try:
            for first in range(0, len(records), 3):
                yield records[first:first + 3]
        except GeneratorExit:
            closed.append(number)
            raise

    return one_pass, started, closed


@pytest.mark.parametrize("size, way", [(100, "whole batches, split"), (300_000, "pieces, moved into batches")])
@pytest.mark.parametrize("drop", [False, True])
def test_batches_are_the_same_whichever_way_a_pass_is_batched(monkeypatch, size, way, drop):
    from pipemode import dataset as pipe_dataset

    monkeypatch.setattr(pipe_dataset, "CALL_BYTES", 1 << 20)  # 4 records of 300 KB: pieces
    one_pass, started, _ = numbered_passes([size] * 23)
    ds = pipe_dataset.generator_dataset(one_pass, batch_size=5, drop_remainder=drop).repeat(2)
    batches = batches_of(ds)
    per_pass = [5, 5, 5, 5] + ([] if drop else [3])
    assert [len(b) for b in batches] == per_pass * 2
    assert [b[0][0] for b in batches] == [0] * len(per_pass) + [1] * len(per_pass)
    assert started == [0, 1]


def test_an_empty_pass_gives_no_batches_and_the_next_pass_its_own():
    from pipemode.dataset import generator_dataset

    sizes = iter([[], [10] * 4])
    ds = generator_dataset(lambda: numbered_passes(next(sizes))[0](), batch_size=3)
    assert batches_of(ds) == []
    assert [len(b) for b in batches_of(ds)] == [3, 1]


def test_after_an_iteration_dropped_midway_the_next_reads_its_own_pass(monkeypatch):
    from pipemode import dataset as pipe_dataset

    monkeypatch.setattr(pipe_dataset, "CALL_BYTES", 1 << 20)
    for size in (100, 300_000):
        one_pass, started, _ = numbered_passes([size] * 40)
        ds = pipe_dataset.generator_dataset(one_pass, batch_size=4)
        dropped = iter(ds)
        assert next(dropped).numpy()[0][:1] == b"\0"
        del dropped
        batches = batches_of(ds)
        assert len(batches) == 10 and {b[0][0] for b in batches} == {1}, size
        assert started == [0, 1], size
