"""Every way the job can fail: the failure file (reason first, traceback after) and the exit code."""

import json
import signal
import struct
import threading
import time

import pytest

from keras_pipe_train.settings import failure
from keras_pipe_train.settings.errors import DataError, UserError
from keras_pipe_train.sources.example import encode_example
from pipemode import tfrecord
from pipemode.crc import masked_crc32c
from tests.conftest import png_bomb, read_until
from tests.job.conftest import (
    CONFIG,
    DATA,
    INTERNAL,
    failed,
    file_channel,
    run_train,
    start_train,
    write_hyperparameters,
)
from tests.timeouts import wait_s

# vgg16: the backbone quickest to build and trace (16 plain layers, 6 s here against 16 s for the
# default): these jobs are about how they fail, most before their first step
OK = dict(num_classes=10, image_size=32, epochs=1, weights="none", batch_size=16, augment="false", backbone="vgg16")


@pytest.fixture
def digits_file_job(job, digit_records):
    file_channel(job, "train", digit_records[0][:64], shards=1)
    return job


@pytest.mark.slow
@pytest.mark.parametrize("hps, first_line", [
    (dict(OK, epochs=-1), "Configuration error: hyperparameter epochs must be >= 0, got -1"),
    (dict(OK, learning_rate="NaN"), "Configuration error: hyperparameter learning_rate must be a finite number, got 'NaN'"),
    (dict(OK, optimiser="sgd"), "Configuration error: unknown hyperparameter optimiser (did you mean optimizer?); the job accepts"),
    ({"epochs": 1}, "Configuration error: hyperparameter num_classes (or class_names) is required"),
    (dict(OK, weights="pretrained"), "Configuration error: hyperparameter weights=pretrained needs a 'pretrained' channel"),
    (dict(OK, weights="/nowhere/backbone.weights.h5"), "Configuration error: backbone weights file /nowhere/backbone.weights.h5 does not exist"),
])
def test_bad_configuration(digits_file_job, hps, first_line):
    write_hyperparameters(digits_file_job, **hps)
    failed(digits_file_job, run_train(digits_file_job), CONFIG, first_line)


@pytest.mark.slow
def test_missing_train_channel_names_what_the_job_reads(job):
    job.add_channel("testing", mode="File")
    write_hyperparameters(job, **OK)
    failed(job, run_train(job), CONFIG,
           "Configuration error: the job reads channels train (required), validation (optional), "
           "pretrained (optional: backbone weights), model (optional: a previous job's model, continued; or JumpStart's "
           "pretrained model, the backbone), train_lst "
           "(record_format=lst: the .lst listing the train channel's images), validation_lst (record_format=lst: the "
           ".lst listing the validation channel's images) (train may be named 'training', as the built-in TensorFlow "
           "algorithm names it); it got: testing")


def test_a_train_and_a_training_channel_together_are_refused_naming_both(job):
    """(a `training` channel alone is the train channel: test_class_folders.py trains on one)"""
    job.add_channel("train", mode="File")
    job.add_channel("training", mode="File")
    write_hyperparameters(job, **OK)
    failed(job, run_train(job), CONFIG, "Configuration error: the job has both a 'train' and a 'training' channel")


def test_missing_input_data_config(job):
    write_hyperparameters(job, **OK)
    failed(job, run_train(job), CONFIG, f"Configuration error: {job.config_dir}/inputdataconfig.json does not exist")


@pytest.mark.slow
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


@pytest.mark.slow
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
           f"Data error: CorruptRecordError: corrupt record #7 at byte offset {offset} of file "
           f"{job.data_dir}/train/part-0.tfrecord: data CRC mismatch")


@pytest.mark.slow
def test_fifo_that_never_appears(job):
    job.add_channel("train")
    write_hyperparameters(job, **OK, pipe_wait_timeout=2)
    failed(job, run_train(job), DATA,
           f"Data error: PipeTimeoutError: FIFO {job.data_dir}/train_0 (channel 'train', pass 0) did not "
           "appear within 2 s")


@pytest.mark.slow
def test_truncated_stream_from_a_dying_writer(job, digit_records):
    examples = digit_records[0][:40]
    job.add_channel("train")
    job.feed("train", [job.write("a.tfrecord", tfrecord.encode(examples))], die_after_bytes=5000)
    write_hyperparameters(job, **OK)
    failed(job, run_train(job), DATA, "Data error: TruncatedRecordError: corrupt record #")


@pytest.mark.slow
def test_label_out_of_range(job, digit_records):
    examples, labels = digit_records
    file_channel(job, "train", examples[:64], shards=1)
    write_hyperparameters(job, **dict(OK, num_classes=5))  # the digits have labels up to 9
    first = next(i for i, label in enumerate(labels) if label >= 5)
    offset = sum(16 + len(e) for e in examples[:first])
    failed(job, run_train(job), DATA,
           f"Data error: UnusableRecordError: unusable record #{first} at byte offset {offset} of file "
           f"{job.data_dir}/train/part-00000.tfrecord: label {labels[first]} (image/class/label) is out of range: "
           "the job trains labels 0 to 4 (num_classes=5)")


@pytest.mark.slow
def test_records_without_the_expected_features(digits_file_job):
    write_hyperparameters(digits_file_job, **dict(OK, image_feature="image/jpeg"))
    failed(digits_file_job, run_train(digits_file_job), DATA,
           f"Data error: UnusableRecordError: unusable record #0 at byte offset 0 of file "
           f"{digits_file_job.data_dir}/train/part-00000.tfrecord: feature 'image/jpeg' must hold one bytes value "
           "(the encoded image); the record has: image/class/label, image/encoded. Set hyperparameters "
           "image_feature and label_feature")


def test_bugs_are_reported_as_internal_errors(tmp_path):
    assert failure.classify(ZeroDivisionError("division by zero")) == (
        "internal error", "ZeroDivisionError: division by zero (a bug in the training job, please report it)")
    assert failure.classify(UserError("x"))[0] == "configuration error"
    assert failure.classify(DataError("y"))[0] == "data error"
    code = failure.report(KeyError("k"), tmp_path / "out" / "failure")
    assert code == INTERNAL
    assert (tmp_path / "out" / "failure").read_text().startswith("Internal error: KeyError: 'k'")


@pytest.mark.slow
def test_success_leaves_no_failure_file_and_a_setting_it_does_not_apply_is_said(digits_file_job):
    write_hyperparameters(digits_file_job, **OK, layer_decay=0.5)  # (fine-tuning's: not from scratch)
    out = run_train(digits_file_job)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "layer_decay=0.5 is not applied: it fine-tunes a pretrained backbone" in out.stdout + out.stderr
    assert "layer_decay: " not in out.stdout + out.stderr  # (no optimizer scaled anything)
    assert not (digits_file_job.base / "output" / "failure").exists()
    assert json.loads((digits_file_job.base / "output/data/metrics.json").read_text())["final"]["epoch"] == 1


# --- records that are framed well but cannot be trained on ----------------------------------------

HTML = b"<!DOCTYPE html><html><body>AccessDenied</body></html>"


def pipe_or_file_channel(job, mode: str, examples: list[bytes], name: str = "train") -> str:
    """The channel `name` holding `examples` in one object; returns how errors name that object."""
    if mode == "Pipe":
        job.add_channel(name)
        job.feed(name, [job.write(f"{name}.tfrecord", tfrecord.encode(examples))])
        return f"channel '{name}' pass 0 (FIFO {job.data_dir}/{name}_0)"
    file_channel(job, name, examples, shards=1)
    return f"file {job.data_dir}/{name}/part-00000.tfrecord"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["Pipe", "File"])
def test_a_record_whose_image_is_not_an_image_is_a_data_error_naming_it(job, digit_records, mode):
    examples = list(digit_records[0][:40])
    examples[10] = encode_example(HTML, 3)
    where = pipe_or_file_channel(job, mode, examples)
    write_hyperparameters(job, **OK)
    offset = sum(16 + len(e) for e in examples[:10])
    failed(job, run_train(job), DATA,
           f"Data error: UnusableRecordError: unusable record #10 at byte offset {offset} of {where}: "
           "image/encoded is not an image (it starts with b'<!DOCTYPE html><')")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["Pipe", "File"])
def test_unusable_records_are_skipped_and_counted_when_allowed(job, digit_records, mode):
    examples = list(digit_records[0][:40])
    examples[3], examples[30] = encode_example(HTML, 3), encode_example(png_bomb(), 1)
    pipe_or_file_channel(job, mode, examples)
    write_hyperparameters(job, **OK, max_corrupted_records_to_skip=2)
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "SKIPPED unusable record #3 " in out.stdout and "[1 of at most 2 corrupt records per pass]" in out.stdout
    assert "SKIPPED unusable record #30 " in out.stdout and "16000x16000 PNG image, 256 megapixels" in out.stdout


@pytest.mark.slow
def test_a_decompression_bomb_is_refused_before_it_is_decoded(job, digit_records):
    examples = list(digit_records[0][:40])
    examples[5] = encode_example(png_bomb(), 1)  # 1 MB that decodes to 768 MB
    where = pipe_or_file_channel(job, "Pipe", examples)
    write_hyperparameters(job, **OK)
    offset = sum(16 + len(e) for e in examples[:5])
    failed(job, run_train(job), DATA,
           f"Data error: UnusableRecordError: unusable record #5 at byte offset {offset} of {where}: image/encoded "
           "is a 16000x16000 PNG image, 256 megapixels: more than max_image_pixels (100000000); shrink it, or raise "
           "the limit")


@pytest.mark.slow
def test_a_crafted_length_in_file_mode_is_a_data_error_not_a_crash(job, digit_records):
    examples = digit_records[0][:40]
    header = struct.pack("<Q", 2**60)  # with a valid CRC: tf.data.TFRecordDataset segfaults on it
    data = tfrecord.encode(examples[:20]) + header + struct.pack("<I", masked_crc32c(header)) + tfrecord.encode(examples[20:])
    job.add_channel("train", mode="File")
    (job.data_dir / "train").mkdir()
    (job.data_dir / "train" / "crafted.tfrecord").write_bytes(data)
    write_hyperparameters(job, **OK)
    offset = sum(16 + len(e) for e in examples[:20])
    failed(job, run_train(job), DATA,
           f"Data error: CorruptRecordError: corrupt record #20 at byte offset {offset} of file "
           f"{job.data_dir}/train/crafted.tfrecord: impossible record length {2**60}")


# --- channels that hold nothing ------------------------------------------------------------------


@pytest.mark.slow
def test_a_file_channel_of_empty_objects_is_a_data_error(job):
    job.add_channel("train", mode="File")
    (job.data_dir / "train").mkdir()
    for name in ("a.tfrecord", "b.tfrecord"):
        (job.data_dir / "train" / name).write_bytes(b"")
    write_hyperparameters(job, **OK)
    failed(job, run_train(job), DATA,
           f"Data error: channel 'train' delivered no records in epoch 1: its 2 files in {job.data_dir}/train held "
           "0 bytes and no records. A job cannot train on nothing")
    assert not (job.base / "model" / "1").exists()


@pytest.mark.slow
def test_an_empty_pipe_pass_is_a_data_error_naming_the_pass(job):
    job.add_channel("train")
    job.feed("train", [job.write("empty.tfrecord", b"")])
    write_hyperparameters(job, **OK)
    failed(job, run_train(job), DATA,
           f"Data error: channel 'train' delivered no records in epoch 1: its Pipe pass 0 (FIFO {job.data_dir}/train_0) "
           "held 0 bytes and no records. A job cannot train on nothing")


@pytest.mark.slow
def test_an_empty_validation_pass_is_a_data_error_not_a_loss_of_zero(job, digit_records):
    file_channel(job, "train", digit_records[0][:64], shards=1)
    job.add_channel("validation")
    job.feed("validation", [job.write("empty.tfrecord", b"")])
    write_hyperparameters(job, **OK)
    failed(job, run_train(job), DATA,
           f"Data error: channel 'validation' delivered no records in epoch 1: its Pipe pass 0 (FIFO "
           f"{job.data_dir}/validation_0) held 0 bytes and no records. A job cannot validate on nothing")


@pytest.mark.slow
def test_a_channel_whose_every_record_was_skipped_says_so(job, digit_records):
    file_channel(job, "train", [encode_example(HTML, 1)] * 3, shards=1)
    write_hyperparameters(job, **OK, max_corrupted_records_to_skip=5)
    failed(job, run_train(job), DATA,
           f"Data error: channel 'train' delivered no records in epoch 1: its 1 file in {job.data_dir}/train held "
           f"{3 * (16 + len(encode_example(HTML, 1)))} bytes, and all 3 records in them were skipped as corrupt or "
           "unusable (max_corrupted_records_to_skip)")


# --- stopped while waiting for Pipe data ----------------------------------------------------------


def stop_when(process, marker: str, wait: float = 2.0) -> tuple[str, float]:
    """SIGTERM `wait` s after `marker` is logged; (the whole output, seconds from SIGTERM to exit)."""
    seen = read_until(process, marker)
    time.sleep(wait)
    process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    rest = process.communicate(timeout=wait_s(150))[0]
    return "".join(seen) + rest, time.monotonic() - sent


def stop_once_held(process, writer) -> tuple[str, float]:
    """SIGTERM once `writer` (FakeJob.feed's, with hold_pass) says the job opened the pass it holds,
    the job's output read meanwhile; (the whole output, seconds from SIGTERM to exit)."""
    output: list[str] = []
    drain = threading.Thread(target=lambda: output.extend(process.stdout), daemon=True)
    drain.start()
    try:
        read_until(writer, "holding ")
    except AssertionError as err:
        process.kill()
        drain.join(10)
        raise AssertionError(f"{err}\nthe job:\n{''.join(output)[-3000:]}") from None
    process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    process.wait(timeout=wait_s(150))
    seconds = time.monotonic() - sent
    drain.join(10)
    return "".join(output), seconds


@pytest.mark.slow
def test_sigterm_while_waiting_for_a_fifo_that_never_comes_stops_at_once(job):
    job.add_channel("train")  # no writer: SageMaker has not started streaming (pipe_wait_timeout is 600 s)
    write_hyperparameters(job, **OK)
    process = start_train(job)
    output, seconds = stop_when(process, "phase 1: no pretrained weights")
    assert process.returncode == 143, output[-3000:]
    assert seconds < 30, seconds  # not at SageMaker's SIGKILL, 120 s later
    assert "stopped by request before the first step: nothing to checkpoint" in output
    assert not (job.base / "output" / "failure").exists()


@pytest.mark.slow
def test_sigterm_while_waiting_for_the_next_pass_stops_with_a_checkpoint(job, digit_records):
    job.add_channel("train")
    # pass 0, then pass 1's FIFO, which the writer holds open and never writes: the SIGTERM comes once the
    # job has opened it (sent 2 s after epoch 1's metrics instead, it came during the checkpoint on a slow
    # machine, and the job stopped after epoch 1, before waiting for anything)
    writer = job.feed("train", [job.write("train.tfrecord", tfrecord.encode(digit_records[0][:64]))], passes=2,
                      hold_pass=1)
    write_hyperparameters(job, **dict(OK, epochs=3))
    process = start_train(job)
    output, seconds = stop_once_held(process, writer)
    assert process.returncode == 143, output[-3000:]
    assert seconds < 30, seconds
    assert "interrupted channel 'train' pass 1" in output
    assert "stopped by request after step 0 of epoch 2" in output
    (saved,) = sorted(job.base.glob("checkpoints/*/ckpt-*"))[-1:]
    assert json.loads((saved / "progress.json").read_text())["epoch"] == 1


@pytest.mark.slow
def test_sigterm_after_the_last_epoch_still_exports_the_model(job, digit_records):
    # SageMaker (and the SDK's local mode, when a host exits) may stop a job whose training is done:
    # the export, its result, must not be cut short
    file_channel(job, "train", digit_records[0][:64], shards=1)
    write_hyperparameters(job, **OK)
    process = start_train(job)
    output, _ = stop_when(process, "metrics: epoch=1 ", wait=0)  # then the checkpoint, then the export
    assert process.returncode == 0, output[-3000:]
    assert "the stop request came after training ended: exporting the model first" in output
    assert (job.base / "model" / "1" / "saved_model.pb").is_file()
    assert not (job.base / "output" / "failure").exists()


@pytest.mark.parametrize("error, message, kind, says", [
    ("UnavailableError", "Collective ops is aborted by: failed to connect to all addresses /job:worker/replica:0/task:1",
     "cluster error", "the hosts lost each other"),
    ("DeadlineExceededError", "Collective all-reduce timed out after 600 s", "cluster error", "another host died"),
    ("UnavailableError", "Socket closed while reading the weights file", "internal error", "a bug in the training job"),
    ("DataLossError", "corrupted record at 12", "data error", "corrupt data: corrupted record at 12"),
    ("InvalidArgumentError", "Could not parse example input, value: 'abc'\n\t [[{{node ParseExample}}]]",
     "data error", "not a valid tf.train.Example"),
    ("InvalidArgumentError", "Incompatible shapes: [32,10] vs. [32,5]", "internal error", "Incompatible shapes"),
    ("InvalidArgumentError", "Graph execution error:\n\nFeature: image/encoded (data type: string) is required but "
     "could not be found.", "data error", "set hyperparameters image_feature and label_feature"),
])
def test_tensorflow_errors_are_classified_by_their_class_and_message(error, message, kind, says):
    import tensorflow as tf

    err = getattr(tf.errors, error)(None, None, message)
    got_kind, reason = failure.classify(err)
    assert got_kind == kind and says in reason, (got_kind, reason)


def test_a_reader_error_inside_a_tensorflow_error_keeps_its_own_kind():
    import tensorflow as tf

    err = tf.errors.UnknownError(None, None, "TruncatedRecordError: corrupt record #3 at byte offset 40 of x: "
                                             "the stream ended 5 bytes into a 20-byte record")
    assert failure.classify(err) == ("data error", "TruncatedRecordError: corrupt record #3 at byte offset 40 of x: "
                                                   "the stream ended 5 bytes into a 20-byte record")
