"""AWS's MXNet full-training notebook's job, and the incremental-training notebook's second job
continuing from its model, each run as its notebook sends it (tests/builtin/test_notebooks.py says
how: container/train on photos of colours, the model served by `serve`, asked by the notebooks' own
client cells). The second job needs the first one's model: the two share its job (the
`full_training` fixture; tests/scheduling.py keeps the module on one worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builtin import notebooks
from tests.builtin.cells import a1_cell_45, a8_cell_35, a10_cell_61
from tests.builtin.test_notebooks import COLORS, asked_files, labelled, rec_file, serving, trained, transformed
from tests.conftest import FakeJob, model_tar_gz
from tests.job.sources.test_builtin_channels import RECORDIO, example, read_as
from tests.serve.test_builtin_clients import IdentitySerializer, Predictor, Runtime

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # (its jobs: test_notebooks.py says why)

# A ResNet-18 trained from scratch at 224 pixels, about 10 photos a second on 2 cores: 32 photos of
# each colour, 2 batches of the notebook's 64 an epoch
TRAIN, VALIDATION = labelled(COLORS, 32, 1), labelled(COLORS, 8, 2)


def rec_channels(job: FakeJob) -> None:
    """The notebooks' train and validation channels: TRAIN and VALIDATION in a .rec file each
    (application/x-recordio, File mode)."""
    for role, images in (("train", TRAIN), ("validation", VALIDATION)):
        job.add_channel(role, mode="File", content_type=RECORDIO)
        rec_file(job.data_dir / role / f"{role}.rec", images)


@pytest.fixture(scope="module")
def full_training(tmp_path_factory):
    """Image-classification-fulltraining.ipynb's job: a ResNet-18 trained from scratch at 224 pixels
    for 2 epochs (batches of 64, learning rate 0.01; SGD with momentum 0.9 and weight decay 1e-4,
    MXNet's defaults, which the dialect gives), on .rec files in train and validation
    (application/x-recordio, File mode), its records audited. (The job, its log.)"""
    base = tmp_path_factory.mktemp("full-training")
    job = FakeJob(base / "opt_ml")
    rec_channels(job)
    log = trained(job, notebooks.mxnet_full_training(len(COLORS), len(TRAIN)), base / "audit",
                  said=("channel train: application/x-recordio: MXNet RecordIO image files (im2rec's .rec); read as "
                        "record_format=recordio", "backbone=resnet18", "image_size=224"))
    # its first epoch trained and validated on exactly the records of its .rec files
    read_as(base / "audit", [example(image, label) for image, label in TRAIN],
            [example(image, label) for image, label in VALIDATION])
    return job, log


def test_the_mxnet_full_training_notebook_trains_on_rec_files_and_its_clients_get_each_class(
        full_training, tmp_path, monkeypatch):
    """The model is asked by the notebook's real-time cell 45, the same argmax of the bare list that
    the incremental (cell 35, SDK v2's Predictor) and Ground Truth (cell 61) notebooks do, and by its
    batch transform's get_label (cell 31) on the .out files."""
    job, log = full_training
    asked = asked_files(tmp_path / "test_inputs", COLORS)
    expected = {color: [color] * len(paths) for color, paths in asked.items()}
    monkeypatch.chdir(tmp_path)
    with serving(job.base / "model", tmp_path / "serve.log") as server:
        runtime, ic_classifier = Runtime(server), Predictor(server)
        for cell in (lambda path: a1_cell_45(runtime, "ic-endpoint", path, list(COLORS))[0],
                     lambda path: a8_cell_35(ic_classifier, path, list(COLORS), IdentitySerializer),
                     lambda path: a10_cell_61(runtime, "ic-endpoint", list(COLORS), [Path(path).name])):
            assert {color: [cell(path) for path in paths] for color, paths in asked.items()} == expected, log
    assert transformed(job.base / "model", asked, tmp_path, COLORS) == expected, log


def test_the_incremental_notebooks_second_job_continues_the_model_in_its_model_channel_and_its_client_gets_each_class(
        full_training, job, tmp_path):
    """Image-classification-incremental-training-highlevel.ipynb's second job, as it sends it (2
    epochs of batches of 128 at learning rate 0.01, the first job's num_layers, image_shape and
    num_classes, as the IC page requires), with the first job's model.tar.gz in a `model` channel
    (application/x-sagemaker-model, File mode) and the same .rec channels; its model asked by the
    notebook's cell 35 (its first job, in SDK v2's local mode: tests/image/test_sdk_local.py)."""
    previous, _ = full_training
    rec_channels(job)
    job.add_channel("model", mode="File", content_type="application/x-sagemaker-model")
    (job.data_dir / "model").mkdir()
    model_tar_gz(previous.base / "model", job.data_dir / "model" / "model.tar.gz")
    log = trained(job, notebooks.mxnet_incremental(len(COLORS), len(TRAIN), continued=True),
                  said=("the classifier kept (the same classes)",))
    asked = asked_files(tmp_path / "test_inputs", COLORS)
    with serving(job.base / "model", tmp_path / "serve.log") as server:
        ic_classifier = Predictor(server)
        got = {color: [a8_cell_35(ic_classifier, path, list(COLORS), IdentitySerializer) for path in paths]
               for color, paths in asked.items()}
    assert got == {color: [color] * len(paths) for color, paths in asked.items()}, log
