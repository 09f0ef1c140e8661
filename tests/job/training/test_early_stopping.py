"""Early stopping in the job as SageMaker runs it: the epoch it stops at, the weights it exports,
and a stop by SIGTERM in the middle of an early-stopping run resumed to the same end.

A min_delta no change can reach makes the first epoch the best for good: the phase then stops
after exactly `patience` more epochs, and the model exported must be the first epoch's: the model
keep_epoch_models=1 kept as it was after epoch 1, before early stopping put any weights back."""

import json
import signal

import numpy as np
import pytest

from tests.conftest import read_until
from tests.job.conftest import file_channel, run_train, start_train, write_hyperparameters
from tests.timeouts import wait_s

pytestmark = pytest.mark.slow
RECIPE = dict(num_classes=10, image_size=32, batch_size=16, augment="false", shuffle_buffer=0)
STOPPING = dict(early_stopping="true", early_stopping_patience=2, early_stopping_min_delta=100)


def set_up(job, digit_records, weights, **values):
    file_channel(job, "train", digit_records[0][:320], shards=1)  # 20 steps an epoch
    file_channel(job, "validation", digit_records[0][1000:1064], shards=1)
    write_hyperparameters(job, weights=str(weights), **RECIPE, **values)


def exported_weights(job, epoch: int | None = None) -> list[np.ndarray]:
    """The model exported's weights; or of `epoch` (1-based), as keep_epoch_models kept it then."""
    import keras

    path = job.base / ("model/model.keras" if epoch is None else f"model/epochs/epoch-{epoch:04d}.keras")
    return keras.saving.load_model(path).get_weights()


def epochs_in_metrics(job) -> list[int]:
    return [row["epoch"] for row in json.loads((job.base / "output/data/metrics.json").read_text())["epochs"]]


def test_a_phase_stops_after_patience_epochs_without_improvement_and_exports_its_best(
        job, digit_records, head_only_weights):
    set_up(job, digit_records, head_only_weights, epochs=6, keep_epoch_models=1, **STOPPING)
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:]
    assert ("early stopping: val_loss has not improved on its best (val_loss" in out.stdout
            and "at epoch 1) for 2 epochs: phase head ends after epoch 3 of 6" in out.stdout)
    assert "early stopping: phase head keeps the weights of its best epoch, 1" in out.stdout
    assert epochs_in_metrics(job) == [1, 2, 3]
    for exported, best in zip(exported_weights(job), exported_weights(job, 1), strict=True):
        np.testing.assert_array_equal(exported, best)
    assert not all(np.array_equal(a, b) for a, b in zip(exported_weights(job), exported_weights(job, 3)))
    # the job's final metrics are the exported model's: in metrics.json, and as the last value of
    # each metric line SageMaker reads (what a tuning job ranks by)
    summary = json.loads((job.base / "output/data/metrics.json").read_text())
    assert summary["final"] == summary["epochs"][0]
    lines = [line for line in out.stdout.splitlines() if line.startswith("metrics: ")]
    assert [line.split()[1] for line in lines] == ["epoch=1", "epoch=2", "epoch=3", "epoch=1"]
    assert lines[-1] == lines[0]
    # evaluation.json is the exported epoch's (its validation pass's sums, kept: no pass of its own)
    evaluation = json.loads((job.base / "output/data/evaluation.json").read_text())
    assert evaluation["epoch"] == 1 and evaluation["metrics"]["val_loss"] == summary["final"]["val_loss"]


def test_stopped_mid_run_and_resumed_it_ends_and_exports_as_if_never_stopped(
        job, digit_records, head_only_weights):
    set_up(job, digit_records, head_only_weights, epochs=6, keep_epoch_models=1, **STOPPING)
    first = start_train(job)
    lines = read_until(first, "metrics: epoch=2 ")  # epoch 1 is the best; epoch 3 is under way
    first.send_signal(signal.SIGTERM)
    output = "".join(lines) + first.communicate(timeout=wait_s(120))[0]
    assert first.returncode == 143, output[-3000:]
    second = start_train(job)
    output2 = second.communicate(timeout=wait_s(270))[0]
    assert second.returncode == 0, output2[-3000:]
    assert "resuming from checkpoint" in output2 and "phase head ends after epoch 3 of 6" in output2
    assert epochs_in_metrics(job) == [1, 2, 3]
    # the exported epoch was validated by the first process: the second evaluates it once more
    evaluation = json.loads((job.base / "output/data/evaluation.json").read_text())
    summary = json.loads((job.base / "output/data/metrics.json").read_text())
    assert evaluation["epoch"] == 1
    assert evaluation["metrics"]["val_loss"] == pytest.approx(summary["final"]["val_loss"], rel=1e-6)
    # the best weights came back from the checkpoint: the restarted process never saw epoch 1 (the
    # first process kept its model, beside the checkpoints)
    for exported, best in zip(exported_weights(job), exported_weights(job, 1), strict=True):
        np.testing.assert_array_equal(exported, best)


def test_early_stopping_without_a_validation_channel_is_refused_before_training(job, digit_records, head_only_weights):
    file_channel(job, "train", digit_records[0][:32], shards=1)
    write_hyperparameters(job, weights=str(head_only_weights), **RECIPE, epochs=2, early_stopping="true")
    out = run_train(job)
    assert out.returncode == 2, out.stdout[-3000:]  # (a user error: main.py's exit codes)
    failure = (job.base / "output/failure").read_text()
    assert "early_stopping=true watches the validation metrics: add a 'validation' channel" in failure


def test_calibration_true_without_a_validation_channel_is_refused_before_training(job, digit_records,
                                                                                  head_only_weights):
    file_channel(job, "train", digit_records[0][:32], shards=1)
    write_hyperparameters(job, weights=str(head_only_weights), **RECIPE, epochs=1, calibration="true")
    out = run_train(job)
    assert out.returncode == 2, out.stdout[-3000:]
    failure = (job.base / "output/failure").read_text()
    assert "calibration=true fits a temperature on the validation set: add a 'validation' channel" in failure
    assert "metrics: " not in out.stdout  # (refused before the first epoch)


# --- export_epoch=best: the best epoch's model without early stopping ------------------------------

# A small ResNet trained from scratch: it learns the digits within a few epochs (about 25 %, 73 %,
# 91 % of the training images right after epochs 1 to 3), where a head on a random backbone learns
# nothing, so the validation curve below moves. Its BatchNorm statistics are the training's moving
# averages (precise_bn_examples=0): recomputed ones make epoch 1's model so good already that
# epochs 1 and 2 tie on these shifted labels (1/64 each, in CI), and the curve must peak at one.
PEAKING = dict(RECIPE, backbone="resnet20", weights="none", early_stopping_metric="val_accuracy",
               precise_bn_examples=0)


def set_up_peaking(job, digit_records, epochs, **values):
    """Validation labels shifted by one (digit d labelled d+1): the better training learns the
    digits, the fewer of these it gets "right", so validation accuracy peaks at epoch 1 (about 12 %,
    then 3 % and 0 %)."""
    from keras_pipe_launch.sample_data import digit_examples, load_digits

    images, labels = load_digits()
    file_channel(job, "train", digit_records[0][:320], shards=1)
    file_channel(job, "validation", digit_examples(images[1000:1064], (labels[1000:1064] + 1) % 10, 32), shards=1)
    write_hyperparameters(job, **PEAKING, epochs=epochs, **values)


def peaked(job) -> dict:
    summary = json.loads((job.base / "output/data/metrics.json").read_text())
    accuracies = [row["val_accuracy"] for row in summary["epochs"]]
    assert len(accuracies) == 3 and accuracies[0] > max(accuracies[1:]), accuracies  # (the data's design)
    return summary


def test_export_epoch_best_exports_the_peak_epoch_and_its_metric_lines_are_the_final_ones(job, digit_records):
    from tests.job.training.test_metrics import check_log

    set_up_peaking(job, digit_records, epochs=3, export_epoch="best", keep_epoch_models=1)
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:]
    summary = peaked(job)  # never stopped early: 3 epochs
    assert "export_epoch=best: phase scratch keeps the weights of its best epoch, 1 (val_accuracy" in out.stdout
    assert "the model exported is epoch 1's (export_epoch=best)" in out.stdout
    for exported, best in zip(exported_weights(job), exported_weights(job, 1), strict=True):
        np.testing.assert_array_equal(exported, best)
    assert summary["final"] == summary["epochs"][0]
    assert json.loads((job.base / "output/data/evaluation.json").read_text())["epoch"] == 1
    # every form of the metric lines, read by the launcher's definitions and the built-in algorithms'
    # users' regexes: each epoch's values, then the exported epoch's again, last (the final values)
    check_log(out.stdout, [*summary["epochs"], summary["epochs"][0]], top_k=False)


def test_export_epoch_last_exports_the_last_epoch_though_an_earlier_one_was_better(job, digit_records):
    from tests.job.training.test_metrics import check_log

    set_up_peaking(job, digit_records, epochs=3, keep_epoch_models=1)  # (export_epoch=last: the default)
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:]
    summary = peaked(job)
    assert summary["final"] == summary["epochs"][-1] and "keeps the weights of its best epoch" not in out.stdout
    assert json.loads((job.base / "output/data/evaluation.json").read_text())["epoch"] == 3
    check_log(out.stdout, summary["epochs"], top_k=False)  # (no epoch printed again)
    for exported, last in zip(exported_weights(job), exported_weights(job, 3), strict=True):
        np.testing.assert_array_equal(exported, last)
    assert not all(np.array_equal(a, b) for a, b in zip(exported_weights(job), exported_weights(job, 1)))


def test_export_epoch_best_without_validation_exports_the_last_epoch_and_says_so(
        job, digit_records, head_only_weights):
    file_channel(job, "train", digit_records[0][:32], shards=1)
    write_hyperparameters(job, weights=str(head_only_weights), **RECIPE, epochs=2, export_epoch="best")
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:]
    assert out.stdout.count("export_epoch=best: without validation") == 1
    assert "there is no val_loss to choose the best epoch by: the last epoch's model is exported" in out.stdout
    summary = json.loads((job.base / "output/data/metrics.json").read_text())
    assert summary["final"] == summary["epochs"][-1] and summary["final"]["epoch"] == 2
