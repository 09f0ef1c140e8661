"""Every way the job can fail: the failure file (reason first, traceback after) and the exit code."""

import json

import pytest

from tests.conftest import write_hyperparameters
from tests.test_job_e2e import file_channel, run_train
from train import failure
from train.errors import DataError, UserError
from train.pipe import tfrecord

CONFIG, DATA, INTERNAL = 2, 3, 1
OK = dict(num_classes=10, image_size=32, epochs=1, weights="none", batch_size=16, augment="false")


def failed(job, out, code: int, first_line: str) -> str:
    assert out.returncode == code, out.stdout[-2000:] + out.stderr[-2000:]
    text = (job.base / "output" / "failure").read_text()
    assert text.splitlines()[0].startswith(first_line), text[:1000]
    assert "Traceback" in text  # after the reason
    assert len(text.splitlines()[0]) < 1024  # what SageMaker shows as FailureReason
    return text


@pytest.fixture
def digits_file_job(job, digit_records):
    file_channel(job, "train", digit_records[0][:64], shards=1)
    return job


@pytest.mark.parametrize("hps, first_line", [
    (dict(OK, epochs=-1), "Configuration error: hyperparameter epochs must be >= 0, got -1"),
    (dict(OK, learning_rate="NaN"), "Configuration error: hyperparameter learning_rate must be a finite number, got nan"),
    (dict(OK, optimizer="sgd"), "Configuration error: unknown hyperparameter optimizer; the job accepts"),
    ({"epochs": 1}, "Configuration error: hyperparameter num_classes (or class_names) is required"),
    (dict(OK, weights="pretrained"), "Configuration error: hyperparameter weights=pretrained needs a 'pretrained' channel"),
    (dict(OK, weights="/nowhere/backbone.weights.h5"), "Configuration error: backbone weights file /nowhere/backbone.weights.h5 does not exist"),
])
def test_bad_configuration(digits_file_job, hps, first_line):
    write_hyperparameters(digits_file_job, **hps)
    failed(digits_file_job, run_train(digits_file_job), CONFIG, first_line)


def test_missing_train_channel_names_what_the_job_reads(job):
    job.add_channel("training", mode="File")
    write_hyperparameters(job, **OK)
    failed(job, run_train(job), CONFIG,
           "Configuration error: the job reads channels train (required), validation (optional), "
           "pretrained (optional: backbone weights); it got: training (the SageMaker SDK names a single "
           "input 'training': name it 'train')")


def test_missing_input_data_config(job):
    write_hyperparameters(job, **OK)
    failed(job, run_train(job), CONFIG, f"Configuration error: {job.config_dir}/inputdataconfig.json does not exist")


def test_corrupt_record_in_pipe_mode_names_the_record_and_offset(job, digit_records):
    examples = digit_records[0][:40]
    data = bytearray(tfrecord.encode(examples))
    offset = sum(16 + len(e) for e in examples[:25])
    data[offset + 30] ^= 0x01
    job.add_channel("train")
    job.feed("train", [job.write("bad.tfrecord", bytes(data))])
    write_hyperparameters(job, **OK)
    failed(job, run_train(job), DATA,
           f"Data error: CorruptRecordError: corrupt record #25 at byte offset {offset} of channel 'train' "
           f"pass 0 (FIFO {job.data_dir}/train_0): data CRC mismatch")


def test_corrupt_record_in_file_mode_names_the_file_and_offset(job, digit_records):
    examples = digit_records[0][:40]
    data = bytearray(tfrecord.encode(examples))
    offset = sum(16 + len(e) for e in examples[:7])
    data[offset + 30] ^= 0x01
    job.add_channel("train", mode="File")
    (job.data_dir / "train").mkdir()
    (job.data_dir / "train" / "part-0.tfrecord").write_bytes(bytes(data))
    write_hyperparameters(job, **OK)
    failed(job, run_train(job), DATA,
           f"Data error: corrupt record #7 at byte offset {offset} of file {job.data_dir}/train/part-0.tfrecord: "
           "data CRC mismatch")


def test_fifo_that_never_appears(job):
    job.add_channel("train")
    write_hyperparameters(job, **OK, pipe_wait_timeout=2)
    failed(job, run_train(job), DATA,
           f"Data error: PipeTimeoutError: FIFO {job.data_dir}/train_0 (channel 'train', pass 0) did not "
           "appear within 2 s")


def test_truncated_stream_from_a_dying_writer(job, digit_records):
    examples = digit_records[0][:40]
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode(examples))], die_after_bytes=5000)
    write_hyperparameters(job, **OK)
    failed(job, run_train(job), DATA, "Data error: TruncatedRecordError: corrupt record #")


def test_label_out_of_range(job, digit_records):
    file_channel(job, "train", digit_records[0][:64], shards=1)
    write_hyperparameters(job, **dict(OK, num_classes=5))  # the digits have labels up to 9
    failed(job, run_train(job), DATA, "Data error: LabelOutOfRange: channel 'train' has a label >= num_classes (5)")


def test_records_without_the_expected_features(digits_file_job):
    write_hyperparameters(digits_file_job, **dict(OK, image_feature="image/jpeg"))
    text = failed(digits_file_job, run_train(digits_file_job), DATA, "Data error: a record lacks a feature")
    assert "set hyperparameters image_feature and label_feature" in text.splitlines()[0]


def test_bugs_are_reported_as_internal_errors(tmp_path):
    assert failure.classify(ZeroDivisionError("division by zero")) == (
        "internal error", "ZeroDivisionError: division by zero (a bug in the training job, please report it)")
    assert failure.classify(UserError("x"))[0] == "configuration error"
    assert failure.classify(DataError("y"))[0] == "data error"
    code = failure.report(KeyError("k"), tmp_path / "out" / "failure")
    assert code == INTERNAL
    assert (tmp_path / "out" / "failure").read_text().startswith("Internal error: KeyError: 'k'")


def test_success_leaves_no_failure_file(digits_file_job):
    write_hyperparameters(digits_file_job, **OK)
    out = run_train(digits_file_job)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not (digits_file_job.base / "output" / "failure").exists()
    assert json.loads((digits_file_job.base / "output/data/metrics.json").read_text())["final"]["epoch"] == 1
