"""`keras-pipe local` runs a request for SageMaker's built-in MXNet image classifier as AWS's notebook
sends it: the .lst notebook's four channels (Image-classification-lst-format.ipynb: train,
validation, train_lst, validation_lst, all application/x-image, File mode) and its hyperparameters
(but weights=none: this machine cannot download ImageNet weights; 1 epoch; the digits at 32 pixels,
image_shape 3,32,32 and resize 32, where the notebook asks 206 after 256), with no hyperparameter of
this job's saying the format: each channel's ContentType, set by --channel-option, reaches the job
in inputdataconfig.json as SageMaker writes it, and the job decides from it
(keras_pipe_train.sources.content_types; what it then trains on: tests/builtin)."""

from __future__ import annotations

import json

import pytest

from tests.builtin import notebooks
from tests.conftest import launch_local
from tests.job.sources.test_builtin_channels import IMAGE, digits, lst_lines

CHANNELS = ("train", "validation", "train_lst", "validation_lst")


@pytest.mark.slow
def test_the_lst_notebooks_request_runs_here_with_its_content_types(tmp_path):
    images = digits()
    for role, chosen, first in (("train", images[:24], 0), ("validation", images[200:212], 200)):
        (tmp_path / role / "digits").mkdir(parents=True)
        (tmp_path / "lists" / role).mkdir(parents=True)
        for i, (image, _) in enumerate(chosen):
            (tmp_path / role / "digits" / f"d{first + i}.jpg").write_bytes(image)
        (tmp_path / "lists" / role / f"{role}.lst").write_text(lst_lines(
            [(first + i, [label], f"digits/d{first + i}.jpg") for i, (_, label) in enumerate(chosen)]))
    # (one epoch here: checkpoint_frequency, 2 in the notebook, must then be 1, as AWS's page bounds it by epochs;
    # 32-pixel digits at 32 pixels: what is checked is how the channels are read, not a ResNet-18 at 206)
    request = {**notebooks.mxnet_lst_format(10, 24), "weights": "none", "epochs": "1", "checkpoint_frequency": "1",
               "image_shape": "3,32,32", "resize": "32"}
    options = [arg for channel in CHANNELS for arg in ("--channel-option", f"{channel}:content-type={IMAGE}")]
    out = launch_local("--train", "train", "--validation", "validation", "--channel", "train_lst=lists/train",
                       "--channel", "validation_lst=lists/validation", "--input-mode", "File", *options,
                       *[arg for name, value in request.items() for arg in ("--hp", f"{name}={value}")],
                       "--job-dir", "job", cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    written = json.loads((tmp_path / "job/algo-1/input/config/inputdataconfig.json").read_text())
    assert {name: entry["ContentType"] for name, entry in written.items()} == dict.fromkeys(CHANNELS, IMAGE)
    assert ("channel train: application/x-image: images, listed by channel train_lst's .lst; read as "
            "record_format=lst") in out.stdout
    assert (tmp_path / "job/algo-1/model/1/saved_model.pb").is_file()
