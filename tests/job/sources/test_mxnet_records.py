"""record_format=recordio: MXNet RecordIO image files as the built-in Image Classification - MXNet
algorithm takes them. tests/data/*.rec were written by MXNet 1.9.1's own writer and
mxnet.recordio.pack (tests/data/make_mxnet_rec.py, from the .lst lists beside them)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.sources import mxnet_records
from pipemode import recordio
from pipemode.corruption import CorruptionPolicy
from tests.conftest import REPO, stream_reader
from tests.held_out import LEARNS, assert_the_model_learned_each_digit
from tests.job.conftest import CONFIG, DATA, failed, run_train, write_hyperparameters

DATA_DIR = REPO / "tests" / "data"
QUICK = dict(record_format="recordio", num_classes=10, image_size=32, epochs=1, weights="none", batch_size=16,
             augment="false")


def payloads(name: str) -> list[bytes]:
    data = (DATA_DIR / name).read_bytes()
    return [r for batch in recordio.RecordIODecoder(CorruptionPolicy(0)).records(stream_reader(data), name)
            for r in batch]


def listed(name: str) -> list[list[str]]:
    return [row.split("\t")[1:-1] for row in (DATA_DIR / name).read_text().splitlines()]


def test_mxnet_image_records_become_examples_with_their_labels_and_images():
    from keras_pipe_train.sources.example import record_check

    combine = mxnet_records.combiner(JobConfig.from_hyperparameters(QUICK))
    check = record_check("image/encoded", "image/class/label", 10, 10**6)
    examples = [tf.train.Example.FromString(combine([p])) for p in payloads("digits-mxnet.rec")]
    assert len(examples) == 240
    labels = [e.features.feature["image/class/label"].int64_list.value[0] for e in examples]
    assert labels == [int(float(row[0])) for row in listed("digits.lst")]
    image = examples[0].features.feature["image/encoded"].bytes_list.value[0]
    assert tf.io.decode_jpeg(image).shape == (32, 32, 3)
    assert all(check(e.SerializeToString()) is None for e in examples)


def test_multi_label_records_hold_one_value_per_class():
    config = JobConfig.from_hyperparameters({**QUICK, "multi_label": "true", "label_format": "multi_hot"})
    combine = mxnet_records.combiner(config)
    got = [list(tf.train.Example.FromString(combine([p])).features.feature["image/class/label"].float_list.value)
           for p in payloads("pairs-mxnet.rec")]
    assert np.array_equal(np.array(got), np.array(listed("pairs.lst"), dtype=np.float32))
    single = mxnet_records.combiner(JobConfig.from_hyperparameters(QUICK))
    with pytest.raises(ValueError, match="it holds 10 labels .* a multi-label file needs hyperparameters multi_label"):
        single(payloads("pairs-mxnet.rec")[:1])
    with pytest.raises(ValueError, match=r"10 bytes, fewer than the image record header's 24: is this an image "
                                         r"RecordIO file \(im2rec's .rec\)\?"):
        single([b"\0" * 10])


@pytest.mark.slow
def test_a_rec_file_trains_in_file_mode_and_streamed_in_pipe_mode_and_each_record_is_its_class(job):
    """Each record's class is its header's label: held-out digits must come back as theirs, class
    by class (classes 0-9, named "0" to "9")."""
    job.add_channel("train", mode="File")
    (job.data_dir / "train").mkdir()
    for suffix in (".rec", ".idx"):  # (im2rec's index beside it: not data)
        shutil.copy(DATA_DIR / f"digits-mxnet{suffix}", job.data_dir / "train" / f"train{suffix}")
    for copy in (2, 3):  # its 240 images three times an epoch: enough steps to learn them
        shutil.copy(DATA_DIR / "digits-mxnet.rec", job.data_dir / "train" / f"train-{copy}.rec")
    job.add_channel("validation")  # Pipe, RecordWrapperType None: the .rec object streamed as it is
    job.feed("validation", [DATA_DIR / "digits-mxnet.rec"])
    write_hyperparameters(job, **{**QUICK, **LEARNS})
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "1 .idx/.lst files (im2rec's index and list) not read" in out.stdout
    assert "val_accuracy" in out.stdout
    # each class's held-out images at least 30 % right, all of them 70 % (chance: 10 %; tests/held_out.py)
    print("held out, each class:", assert_the_model_learned_each_digit(job.base / "model",
                                                                       names=[str(d) for d in range(10)]))


@pytest.mark.slow
def test_a_rec_channel_wrapped_again_is_refused(job):
    job.add_channel("train", wrapper="RecordIO")
    write_hyperparameters(job, **QUICK)
    failed(job, run_train(job), CONFIG, "Configuration error: channel 'train' has RecordWrapperType RecordIO, but "
                                        "record_format=recordio")


@pytest.mark.slow
def test_a_multi_label_file_read_as_single_label_is_a_data_error_naming_the_record(job):
    job.add_channel("train")
    job.feed("train", [DATA_DIR / "pairs-mxnet.rec"])
    write_hyperparameters(job, **QUICK)
    text = failed(job, run_train(job), DATA, "Data error: UnusableRecordError: unusable record #0 at byte offset 0 "
                                             "of channel 'train' pass 0")
    assert "it holds 10 labels (0, 0, 0" in text.splitlines()[0]
