"""The training job in-process: transfer learning really happens, phase by phase."""

import json
import logging
import re

import keras
import numpy as np
import pytest

from keras_pipe_train import job as training_job
from keras_pipe_train.model.classifier import build_backbone
from keras_pipe_train.settings import contract
from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.errors import DataError, UserError
from pipemode import tfrecord
from tests.job.conftest import write_hyperparameters


def run_job(fake_job, **hyperparameters):
    write_hyperparameters(fake_job, **hyperparameters)
    layout = contract.paths()
    config = JobConfig.from_hyperparameters(contract.read_hyperparameters(layout.hyperparameters))
    return training_job.run(config, layout, contract.read_input_data_config(layout.input_config),
                            contract.read_resource_config(layout.resource_config))


@pytest.fixture
def small_digits_job(job, digit_records):
    examples, _ = digit_records
    job.add_channel("train", mode="File")
    (job.data_dir / "train").mkdir()
    (job.data_dir / "train" / "part-0.tfrecord").write_bytes(tfrecord.encode(examples[:256]))
    return job


@pytest.fixture
def random_backbone_file(tmp_path):
    keras.utils.set_random_seed(3)
    backbone = build_backbone("mobilenet_v3_small", 32, None)
    path = tmp_path / "start.weights.h5"
    backbone.save_weights(path)
    return path, backbone


def exported_backbone(fake_job):
    backbone = build_backbone("mobilenet_v3_small", 32, None)
    backbone.load_weights(fake_job.base / "model" / "backbone.weights.h5")
    return backbone


def changed(before, after):
    return any(not np.array_equal(a.numpy(), b.numpy()) for a, b in zip(before.weights, after.weights))


COMMON = dict(num_classes=10, image_size=32, batch_size=32, augment="crop", shuffle_buffer=64)


@pytest.mark.slow
def test_phase_one_trains_the_head_and_leaves_the_backbone_as_loaded(small_digits_job, random_backbone_file):
    path, start = random_backbone_file
    run_job(small_digits_job, **COMMON, epochs=1, fine_tune_epochs=0, weights=str(path))
    after = exported_backbone(small_digits_job)
    for layer_before, layer_after in zip(start.layers, after.layers):
        assert not changed(layer_before, layer_after), f"{layer_before.name} changed in phase 1"
    head = keras.saving.load_model(small_digits_job.base / "model" / "model.keras").get_layer("classifier")
    # every class's bias moved off its zero start (each gets a gradient at every step)
    assert np.count_nonzero(head.get_weights()[1]) == COMMON["num_classes"]


@pytest.mark.slow
def test_phase_two_trains_exactly_the_top_layers_but_not_batchnorm(small_digits_job, random_backbone_file):
    path, start = random_backbone_file
    top = 15
    run_job(small_digits_job, **COMMON, epochs=1, fine_tune_epochs=1, fine_tune_layers=top,
            fine_tune_learning_rate=0.01, weights=str(path))
    after = exported_backbone(small_digits_job)
    first_top = len(start.layers) - top
    trained = []
    for index, (layer_before, layer_after) in enumerate(zip(start.layers, after.layers)):
        should_train = (index >= first_top and layer_before.weights
                        and not isinstance(layer_before, keras.layers.BatchNormalization))
        assert changed(layer_before, layer_after) == bool(should_train), layer_before.name
        trained += [layer_before.name] if should_train else []
    assert trained, "phase 2 trained no layer"


@pytest.mark.slow
def test_train_batchnorm_leaves_batchnorm_to_phase_two_which_trains_and_recomputes_it(small_digits_job,
                                                                                     random_backbone_file, caplog):
    """train_batchnorm=true (MXNet's use_pretrained_model=1): phase 1 leaves the backbone, its
    BatchNorm statistics included, as loaded (no precise BN for the head's epochs); phase 2 trains
    the BatchNorm layers among its top fine_tune_layers (scale, offset, and statistics recomputed),
    and leaves those below as loaded, their statistics too."""
    path, start = random_backbone_file
    caplog.set_level("INFO")
    top = 40
    run_job(small_digits_job, **COMMON, epochs=1, fine_tune_epochs=1, fine_tune_layers=top,
            fine_tune_learning_rate=0.01, weights=str(path), train_batchnorm="true")
    after = exported_backbone(small_digits_job)
    first_top = len(start.layers) - top
    norms = [(index >= first_top, b, a) for index, (b, a) in enumerate(zip(start.layers, after.layers))
             if isinstance(b, keras.layers.BatchNormalization)]
    assert {trains for trains, _, _ in norms} == {True, False}
    for trains, before, now in norms:  # scale, offset, and the statistics
        moved = [not np.array_equal(x.numpy(), y.numpy()) for x, y in zip(before.weights, now.weights)]
        assert moved == [trains] * 4, (before.name, trains, moved)
    said = caplog.text
    assert "BatchNorm included (train_batchnorm)" in said
    assert "batchnorm statistics of epoch 1 recomputed" not in said  # (the head's epoch)
    assert "batchnorm statistics of epoch 2 recomputed" in said, said[-3000:]


@pytest.mark.slow
def test_keep_epoch_models_exports_every_nth_epochs_model_as_it_was_after_that_epoch(small_digits_job,
                                                                                      random_backbone_file,
                                                                                      digit_records):
    """keep_epoch_models=2 (MXNet's checkpoint_frequency) over 4 epochs, the best epoch exported
    (export_epoch=best, as the MXNet dialect sets it): epochs 2 and 4's models in the export's
    epochs/ folder, each a .keras file plain Keras loads, each as it was after its epoch: the 4th is
    not the exported best epoch's (3rd: a learning rate too large for the 4th to improve on it)."""
    import json

    from tests.job.conftest import file_channel

    path, _ = random_backbone_file
    examples, _ = digit_records
    file_channel(small_digits_job, "validation", examples[256:384], shards=1)
    run_job(small_digits_job, **COMMON, epochs=2, fine_tune_epochs=2, weights=str(path), keep_epoch_models=2,
            export_epoch="best", early_stopping_metric="val_loss", optimizer="sgd", fine_tune_learning_rate=3.0)
    model_dir = small_digits_job.base / "model"
    assert sorted(p.name for p in (model_dir / "epochs").iterdir()) == ["epoch-0002.keras", "epoch-0004.keras"]
    second, fourth = (keras.saving.load_model(model_dir / "epochs" / name)
                      for name in ("epoch-0002.keras", "epoch-0004.keras"))
    exported = keras.saving.load_model(model_dir / "model.keras")
    final = json.loads((small_digits_job.base / "output" / "data" / "metrics.json").read_text())["final"]
    rows = {(row["phase"], row["epoch"]): row["val_loss"]
            for row in json.loads((small_digits_job.base / "output" / "data" / "metrics.json").read_text())["epochs"]}
    assert (final["phase"], final["epoch"]) == ("fine_tune", 3), rows  # (phase 2's first)
    assert changed(fourth, exported) and changed(second, exported)


def test_keep_epoch_models_beyond_the_epochs_is_refused_naming_the_requests_name():
    with pytest.raises(UserError, match=r"hyperparameter keep_epoch_models \(5\) must be at most the epochs trained "
                                        r"\(4\)"):
        JobConfig.from_hyperparameters({"num_classes": "3", "epochs": "2", "fine_tune_epochs": "2",
                                        "keep_epoch_models": "5"})
    mxnet = {"num_classes": "3", "num_training_samples": "30", "epochs": "3", "use_pretrained_model": "0"}
    assert JobConfig.from_hyperparameters({**mxnet, "checkpoint_frequency": "3"}).keep_epoch_models == 3
    with pytest.raises(UserError, match=r"hyperparameter checkpoint_frequency \(4\) must be at most"):
        JobConfig.from_hyperparameters({**mxnet, "checkpoint_frequency": "4"})
    with pytest.raises(UserError, match=r"hyperparameter checkpoint_frequency must be a positive integer, got '0'"):
        JobConfig.from_hyperparameters({**mxnet, "checkpoint_frequency": "0"})
    with pytest.raises(UserError, match="hyperparameters checkpoint_frequency and keep_epoch_models are one setting"):
        JobConfig.from_hyperparameters({**mxnet, "checkpoint_frequency": "1", "keep_epoch_models": "1"})


def test_the_final_metrics_are_the_last_phases_best_epochs_though_an_earlier_phase_numbers_its_epochs_alike(capsys):
    """Each phase numbers its epochs from 1: with early stopping, the exported model is the last
    phase's best epoch's, and its row (reprinted last, for SageMaker's final metrics) is that
    phase's, not the head phase's epoch of the same number."""
    from types import SimpleNamespace

    from keras_pipe_train.report.epoch_log import EpochLog
    from keras_pipe_train.training.early_stopping import Rule

    rows = [{"epoch": e, "phase": "head", "val_loss": loss} for e, loss in ((1, 0.5), (2, 0.6), (3, 0.7))]
    rows += [{"epoch": e, "phase": "fine_tune", "val_loss": loss} for e, loss in ((1, 0.3), (2, 0.4), (3, 0.45))]
    training = SimpleNamespace(epochs=EpochLog(None, False, tuple(rows), 6),
                               early_stopping=Rule("val_loss", 2, 0.0, 0.0, 1))
    assert training_job.final_metrics(training) is rows[3]
    # (all of its metric lines: this job's, Keras' and MXNet's forms)
    assert capsys.readouterr().out.strip().splitlines() == [
        "metrics: epoch=1 phase=fine_tune val_loss=0.3", "Epoch 1/6 - val_loss: 0.300000",
        "Epoch[0] Validation-loss=0.300000"]


@pytest.mark.slow
def test_a_preset_counts_the_pipe_channel_in_a_pass_of_its_own_then_trains_on_the_passes_after(
        job, digit_records, random_backbone_file, caplog):
    examples, _ = digit_records
    job.stream("train", examples[:300])
    job.stream("validation", examples[300:364])
    caplog.set_level(logging.INFO)
    run_job(job, preset="fast", num_classes=10, backbone="mobilenet_v3_small", image_size=32, batch_size=32,
            weights=str(random_backbone_file[0]), epochs=1, fine_tune_epochs=1, augment="crop", shuffle_buffer=64,
            label_check="false")
    log = caplog.text
    assert re.search(r"preset fast: 300 training examples, counted in [0-9.]+ s \(a pass of channel 'train', read but "
                     r"not decoded\)", log), log[-3000:]
    # what the preset chose for the rest: fast's recipe, for 300 examples at the given batch of 32 (10 steps
    # an epoch: warmup a twentieth of fine-tuning's 10)
    assert ("preset fast: fine_tune_layers=20, optimizer=adamw, learning_rate=0.001, fine_tune_learning_rate=0.0001, "
            "lr_schedule=cosine, warmup_steps=0, layer_decay=1.0, test_time_flip=false, label_smoothing=0.1") in log
    assert ("given, so kept: augment=crop, backbone=mobilenet_v3_small, batch_size=32, epochs=1, fine_tune_epochs=1, "
            "image_size=32") in log
    assert re.search(r"the job's settings, with preset fast's choices: preset=fast, .*fine_tune_layers=20, ", log)
    # the count read the train channel's pass 0 (its FIFO train_0); the two epochs, passes 1 and 2
    assert "reading channel 'train' pass 2" in log and "reading channel 'train' pass 3" not in log
    metrics = json.loads((job.base / "output/data/metrics.json").read_text())
    assert [row["phase"] for row in metrics["epochs"]] == ["head", "fine_tune"]
    page = (job.base / "output/data/report.html").read_text()
    assert "dialect keras-pipe, preset fast;" in page and "given, so kept: augment=crop" in page


def test_a_preset_that_counts_no_training_example_fails_naming_the_channel(job):
    job.stream("train", [])
    with pytest.raises(DataError, match="preset balanced: channel 'train' gave no training example to count"):
        run_job(job, preset="balanced", num_classes=3)


def test_a_file_channels_count_reads_each_record_once_and_ends_at_a_stop(job, digit_records):
    """The count a preset chooses by (datasets.count): every record of a File channel's objects once,
    none decoded; a stop ends it after the group being read, as a Pipe pass's own wait does."""
    import threading

    from keras_pipe_train.sources import datasets
    from tests.job.conftest import file_channel

    file_channel(job, "train", digit_records[0][:300], shards=3)
    layout = contract.paths()
    config = JobConfig.from_hyperparameters({"num_classes": "10", "preset": "fast"})
    channel = contract.read_input_data_config(layout.input_config)["train"]
    assert datasets.count(datasets.Source(channel), layout, config) == 300
    stop = threading.Event()
    stop.set()
    assert 0 < datasets.count(datasets.Source(channel), layout, config, stop) < 300
