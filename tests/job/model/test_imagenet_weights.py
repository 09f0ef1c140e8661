"""weights=imagenet, the job's default, without the internet: Keras looks for an application's
ImageNet weights in $KERAS_HOME/models before it downloads them, and the image bakes them there
(Dockerfile: KERAS_HOME=/opt/keras, BAKE_WEIGHTS). These tests put a weights file there as the
image build would, made here (random weights of the right shapes: the tests never reach the
internet), and run the job with its default weights.

MobileNetV2 is the backbone here because its Keras application loads its ImageNet file without
checking the file's hash (the others check it against Google's file, which a file made here
cannot match, and would download it again)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, FakeJob
from tests.job.conftest import file_channel, write_hyperparameters
from tests.timeouts import wait_s

IMAGE_SIZE = 96  # one of MobileNetV2's ImageNet sizes: Keras names the file by it
WEIGHTS_FILE = f"mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_{IMAGE_SIZE}_no_top.h5"

MAKE_WEIGHTS = r"""
import sys, h5py, keras
from keras.src.legacy.saving import legacy_h5_format
keras.utils.set_random_seed(11)
model = keras.applications.MobileNetV2(include_top=False, weights=None, input_shape=(int(sys.argv[2]),) * 2 + (3,))
with h5py.File(sys.argv[1], "w") as f:  # the legacy form of Keras' downloaded ImageNet files
    legacy_h5_format.save_weights_to_hdf5_group(f, model)
"""

COMPARE = r"""
import sys, numpy as np, keras
from keras_pipe_train.model.classifier import build_backbone
expected = keras.applications.MobileNetV2(include_top=False, weights=sys.argv[1], input_shape=(int(sys.argv[3]),) * 2 + (3,))
saved = build_backbone("mobilenet_v2", int(sys.argv[3]), sys.argv[2])
pairs = list(zip(expected.weights, saved.weights, strict=True))
assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)
print(f"{len(pairs)} arrays equal")
"""


def make_keras_home(home, image_size: int = IMAGE_SIZE):
    """`home`, a $KERAS_HOME holding MobileNetV2's "ImageNet" weights for `image_size`, as the
    image's after BAKE_WEIGHTS (random weights of the right shapes, seeded)."""
    (home / "models").mkdir()
    name = f"mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_{image_size}_no_top.h5"
    made = subprocess.run([sys.executable, "-c", MAKE_WEIGHTS, str(home / "models" / name), str(image_size)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    return home


@pytest.fixture(scope="module")
def keras_home(tmp_path_factory):
    return make_keras_home(tmp_path_factory.mktemp("keras-home"))


def run_job(fake_job: FakeJob, keras_home) -> subprocess.CompletedProcess:
    # no route out: a download would fail at once rather than reach the internet
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(fake_job.base), "KERAS_HOME": str(keras_home),
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    return subprocess.run([sys.executable, str(REPO / "container" / "train")], env=env, cwd=fake_job.base,
                          capture_output=True, text=True, timeout=wait_s(240))


@pytest.mark.slow
def test_the_default_weights_are_the_imagenet_weights_in_keras_home(tmp_path, keras_home, digit_records):
    """No `weights` hyperparameter: the job starts from the ImageNet file in $KERAS_HOME; with only
    the head trained (fine_tune_epochs 0, the default), the backbone it saves is that file's."""
    examples, labels = digit_records
    fake_job = FakeJob(tmp_path / "opt_ml")
    file_channel(fake_job, "train", examples[:128])
    write_hyperparameters(fake_job, backbone="mobilenet_v2", num_classes=10, image_size=IMAGE_SIZE, epochs=1,
                          batch_size=32)
    out = run_job(fake_job, keras_home)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    compared = subprocess.run([sys.executable, "-c", COMPARE, str(keras_home / "models" / WEIGHTS_FILE),
                               str(fake_job.base / "model" / "backbone.weights.h5"), str(IMAGE_SIZE)],
                              capture_output=True, text=True, timeout=wait_s(120))
    assert compared.returncode == 0, compared.stderr[-3000:]


@pytest.mark.slow
def test_without_the_file_and_without_the_internet_the_job_says_how_to_bake_them(tmp_path, digit_records):
    examples, _ = digit_records
    fake_job = FakeJob(tmp_path / "opt_ml")
    file_channel(fake_job, "train", examples[:64])
    write_hyperparameters(fake_job, backbone="mobilenet_v2", num_classes=10, image_size=IMAGE_SIZE, epochs=1)
    empty_home = tmp_path / "keras-home"
    (empty_home / "models").mkdir(parents=True)
    out = run_job(fake_job, empty_home)
    assert out.returncode != 0
    failure = (fake_job.base / "output" / "failure").read_text()
    assert "could not load the ImageNet weights of mobilenet_v2" in failure, failure
    assert "BAKE_WEIGHTS" in failure, failure
