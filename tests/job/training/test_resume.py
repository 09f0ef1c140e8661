"""Surviving interruption: SIGTERM mid-epoch, restart on the same checkpoints, exact resume.

The job's audit ($TRAIN_AUDIT_DIR) records which records each input batch held and how many
steps were trained; from it, every record of the interrupted epoch must be trained exactly once
over the two runs."""

import collections
import hashlib
import json
import signal
import time

import pytest

from pipemode import tfrecord
from tests.conftest import read_until
from tests.job.conftest import audited, file_channel, start_train, trained_records, write_hyperparameters
from tests.timeouts import wait_s

pytestmark = pytest.mark.slow
RECORDS = 320
BATCH = 16  # 20 steps per epoch


@pytest.mark.parametrize("mode", ["Pipe", "File"])
def test_sigterm_mid_epoch_then_restart_trains_each_record_of_that_epoch_exactly_once(
        job, digit_records, head_only_weights, tmp_path, mode):
    examples = digit_records[0][:RECORDS]
    everything = collections.Counter(hashlib.sha1(e).hexdigest() for e in examples)
    assert len(everything) == RECORDS  # distinct records, so that counting means something
    if mode == "Pipe":
        job.add_channel("train")
        source = job.write("train.tfrecord", tfrecord.encode(examples))
        job.feed("train", [source])
    else:
        file_channel(job, "train", examples, shards=3)
    write_hyperparameters(job, num_classes=10, image_size=32, epochs=2, batch_size=BATCH,
                          weights=str(head_only_weights), augment="crop", shuffle_buffer=100)
    audit = tmp_path / "audit"

    # run 1: stopped by SIGTERM in the middle of epoch 2
    first = start_train(job, TRAIN_AUDIT_DIR=str(audit))
    lines = read_until(first, "progress: epoch=2 step=10")
    stopped_at = time.monotonic()
    first.send_signal(signal.SIGTERM)
    output = "".join(lines) + first.communicate(timeout=wait_s(120))[0]
    assert first.returncode == 143, output[-3000:]
    assert time.monotonic() - stopped_at < 60  # well within SageMaker's 120 s
    assert "SIGTERM received: stopping after the current step" in output
    assert "stopped by request after step" in output and "of epoch 2" in output
    assert not (job.base / "output" / "failure").exists()  # a stop is not a failure
    saved = sorted(job.base.glob("checkpoints/*/ckpt-*"))[-1]
    progress = json.loads((saved / "progress.json").read_text())
    assert progress["epoch"] == 1 and 10 <= progress["steps"] < RECORDS // BATCH

    # run 2: a restarted container, its Pipe channel fed from the start again
    if mode == "Pipe":
        job.stop_feeders()
        for fifo in job.data_dir.glob("train_*"):
            fifo.unlink()
        job.feed("train", [source])
    second = start_train(job, TRAIN_AUDIT_DIR=str(audit))
    output2 = second.communicate(timeout=wait_s(270))[0]
    assert second.returncode == 0, output2[-3000:]
    assert (f"resuming from checkpoint {saved.name}: epoch 2 of 2, after {progress['steps']} steps "
            f"({progress['steps'] * BATCH} records of its pass)") in output2

    runs = audited(audit / "audit-algo-1.jsonl")
    run1, run2 = runs[first.pid], runs[second.pid]
    assert collections.Counter(trained_records(run1[0])) == everything  # epoch 1, uninterrupted
    assert run1[1]["trained"] == progress["steps"]
    assert min(run2[1]["batches"]) == progress["steps"]  # run 2 started after the trained batches
    interrupted = collections.Counter(trained_records(run1[1]) + trained_records(run2[1]))
    assert interrupted == everything, "a record of the interrupted epoch was trained twice or missed"
    assert [row["epoch"] for row in json.loads((job.base / "output/data/metrics.json").read_text())["epochs"]] == [1, 2]


def test_a_truncated_checkpoint_is_ignored_and_the_previous_one_used(job, digit_records, head_only_weights, tmp_path):
    file_channel(job, "train", digit_records[0][:96], shards=1)
    write_hyperparameters(job, num_classes=10, image_size=32, epochs=3, batch_size=BATCH,
                          weights=str(head_only_weights), augment="false")
    first = start_train(job, TRAIN_AUDIT_DIR=str(tmp_path / "audit"))
    assert first.wait(timeout=wait_s(270)) == 0, first.stdout.read()[-3000:]
    *_, previous, newest = sorted(job.base.glob("checkpoints/*/ckpt-*"))
    data = next(newest.glob("state.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # as if its upload was cut short
    write_hyperparameters(job, num_classes=10, image_size=32, epochs=4, batch_size=BATCH,
                          weights=str(head_only_weights), augment="false")
    second = start_train(job, TRAIN_AUDIT_DIR=str(tmp_path / "audit"))
    output = second.communicate(timeout=wait_s(270))[0]
    assert second.returncode == 0, output[-3000:]
    assert f"checkpoint {newest.name} is unreadable" in output and "using the previous one" in output
    assert f"resuming from checkpoint {previous.name}: epoch 3 of 4, after 0 steps" in output
    assert "metrics: epoch=3 phase=head" in output and "metrics: epoch=4 phase=head" in output
