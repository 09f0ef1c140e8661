"""AWS's sample notebooks for SageMaker's built-in image classifiers, run here end to end: each
notebook's request as it sends it (tests/builtin/notebooks.py; `weights=none` added where the
built-in starts from pretrained weights, since this machine cannot download them: the one change
the issue allows), its channels laid out as it lays them out, trained by container/train; the
exported model served by `serve` and asked by the notebook's own client code (the cells copied in
tests/serve/test_builtin_clients.py), which must get each photo's class.

The photos are of colours with noise (the classes a network trained from scratch for a few steps
learns for sure), at a small size: the networks still run at the notebooks' image shapes."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.builtin import notebooks
from tests.conftest import FakeJob, run_logged
from tests.job.conftest import run_train, write_hyperparameters
from tests.serve.conftest import Server
from tests.serve.test_builtin_clients import PIXELS, Predictor, b1_cell_44
from tests.timeouts import wait_s

pytestmark = pytest.mark.slow

COLORS = ("blue", "green", "red")  # (class folders, in the alphabetical order the built-ins number them)


def photos(folder, count: int, seed: int, size: int = 48) -> dict[str, list]:
    """`count` JPEG photos of each colour in folder/<colour>/, with noise."""
    from PIL import Image

    rng, written = np.random.default_rng(seed), {}
    for color in COLORS:
        (folder / color).mkdir(parents=True)
        written[color] = []
        for i in range(count):
            pixels = np.clip(np.array(PIXELS[color]) + rng.integers(-60, 60, (size, size, 3)), 0, 255)
            path = folder / color / f"{i:03d}.jpg"
            Image.fromarray(pixels.astype(np.uint8)).save(path, "JPEG", quality=90)
            written[color].append(str(path))
    return written


def served(model_dir, log) -> Server:
    server = Server(model_dir, log, SAGEMAKER_MODEL_SERVER_WORKERS="1")
    server.wait_until_healthy()
    return server


PRETRAIN = r"""
import sys, h5py, keras, numpy as np
from keras.src.legacy.saving import legacy_h5_format
keras.utils.set_random_seed(5)
rng = np.random.default_rng(5)
colors = np.array([[230, 25, 25], [25, 230, 25], [25, 25, 230], [230, 230, 25], [25, 230, 230], [230, 25, 230]])
labels = rng.integers(0, len(colors), 1200)
images = np.clip(colors[labels][:, None, None, :] + rng.integers(-60, 60, (1200, 32, 32, 3)), 0, 255) / 127.5 - 1
backbone = keras.applications.MobileNetV2(include_top=False, weights=None, input_shape=(32, 32, 3))
model = keras.Sequential([backbone, keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(len(colors))])
model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(images.astype("float32"), labels, batch_size=32, epochs=3, verbose=0)
# MobileNetV2's BatchNorm keeps 0.999 of its moving statistics each step: after a few seconds of
# training they are still near their start, and inference would see no colour at all. Set to the
# statistics of a large batch instead, as ImageNet's long training leaves them.
for layer in backbone.layers:
    if isinstance(layer, keras.layers.BatchNormalization):
        layer.momentum = 0.0
backbone(images[:512].astype("float32"), training=True)
with h5py.File(sys.argv[1], "w") as f:  # the legacy form of Keras' downloaded ImageNet files
    legacy_h5_format.save_weights_to_hdf5_group(f, backbone)
"""


@pytest.fixture(scope="module")
def keras_home(tmp_path_factory):
    """MobileNetV2's "ImageNet" weights where the image keeps them (tests/job/test_imagenet_weights.py
    says why MobileNetV2's can be put there): a MobileNetV2 trained here on six colours for a few
    seconds, so that its features tell colours apart, as ImageNet's would. (Its weights do not
    depend on the input's size: the file Keras looks for at 224 pixels holds them.)"""
    home = tmp_path_factory.mktemp("keras-home")
    (home / "models").mkdir()
    made = run_logged([sys.executable, "-c", PRETRAIN,
                       str(home / "models" / "mobilenet_v2_weights_tf_dim_ordering_tf_kernels_1.0_224_no_top.h5")],
                      wait_s(200))
    assert made.returncode == 0, made.stderr[-2000:]
    return home


def test_the_tensorflow_notebook_trains_on_its_training_channel_and_its_client_gets_each_class(tmp_path, keras_home):
    """Amazon_TensorFlow_Image_Classification.ipynb: JumpStart's default hyperparameters sent whole
    (epochs set to 5), `fit({"training": ...})` on one folder per class, the fine-tuned model asked
    with Accept application/json;verbose (cell 44). Unchanged: the model's pretrained weights are in
    the image (made here, as the image's BAKE_WEIGHTS would have them), and its top layer alone is
    trained (train_only_top_layer=True)."""
    job = FakeJob(tmp_path / "opt_ml")
    job.add_channel("training", mode="File")
    photos(job.data_dir / "training", 64, seed=1)
    write_hyperparameters(job, **notebooks.tensorflow_jumpstart_defaults())
    out = run_train(job, KERAS_HOME=str(keras_home))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "dialect tensorflow: the hyperparameters are read with the built-in TensorFlow" in out.stdout + out.stderr
    model = job.base / "model"
    assert json.loads((model / "classes.json").read_text()) == list(COLORS)
    assert json.loads((model / "serving.json").read_text())["dialect"] == "tensorflow"
    asked = photos(tmp_path / "asked", 2, seed=2)
    server = served(model, tmp_path / "serve.log")
    try:
        shown = []
        images = {path: f"{color}/{i}.jpg" for color in COLORS for i, path in enumerate(asked[color])}
        b1_cell_44(Predictor(server), images, HTML=str, display=shown.append)
    finally:
        server.stop()
    predicted = [html.split("Predicted Label: ")[1].split("</figcaption>")[0] for html in shown]
    assert predicted == [color for color in COLORS for _ in asked[color]], predicted
