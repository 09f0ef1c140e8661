"""AWS's sample notebooks for SageMaker's built-in image classifiers, run here end to end: each
notebook's request as it sends it (tests/builtin/notebooks.py), its channels laid out as it lays
them out, trained by container/train; the exported model served by `serve` and asked by the
notebook's own client code (the cells copied in tests/builtin/cells.py), which must
get each photo's class. The photos are of colours with noise, at a small size: the networks still
run at the notebooks' image shapes.

Run so: the TensorFlow algorithm's JumpStart request (its pretrained weights made here, where the
image keeps them), and the MXNet full-training notebook's (a ResNet-18 from scratch). Not run so:
the MXNet notebooks that start from ImageNet weights (lst format, multi-label, Ground Truth), which
Keras has none of for a ResNet-18. With the `weights=none` the issue allows, each trains a ResNet-18
from scratch for its few epochs, and on the few hundred photos CI has time for (about 10 a second
at 224 pixels) that network fits its training photos (accuracy 1) while its BatchNorm's moving
statistics, which inference uses, do not yet describe them. Tried here: the lst notebook's job
validated at 0.33 (6 classes) after 6 epochs, the Ground Truth one's at 0.33 for 21 of its 30
epochs and 0.67 at the end, and the multi-label one's model missed classes of two-colour photos. Their requests, channels and formats are trained for an epoch and audited in
tests/job/test_builtin_channels.py; their client cells get each class from a model of colours in
tests/serve/test_builtin_clients.py."""

from __future__ import annotations

import contextlib
import io
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.builtin import notebooks
from tests.builtin.cells import a1_cell_31_get_label, a1_cell_45, a8_cell_35, a10_cell_61, b1_cell_44
from tests.conftest import FakeJob, run_logged
from tests.job.conftest import run_train, write_hyperparameters
from tests.serve.conftest import Server
from tests.serve.test_builtin_clients import PIXELS, S3, IdentitySerializer, Predictor, Runtime
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


@contextlib.contextmanager
def serving(model_dir, log, **env: str):
    """`serve` on the job's model, stopped at the end."""
    server = Server(model_dir, log, SAGEMAKER_MODEL_SERVER_WORKERS="1", **env)
    try:
        server.wait_until_healthy()
        yield server
    finally:
        server.stop()


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
    shown = []
    with serving(model, tmp_path / "serve.log") as server:
        images = {path: f"{color}/{i}.jpg" for color in COLORS for i, path in enumerate(asked[color])}
        b1_cell_44(Predictor(server), images, HTML=str, display=shown.append)
    predicted = [html.split("Predicted Label: ")[1].split("</figcaption>")[0] for html in shown]
    assert predicted == [color for color in COLORS for _ in asked[color]], predicted



# The MXNet full-training notebook's job trains a ResNet-18 from scratch at 224 pixels, about 10
# photos a second on 2 cores: it is given 288 photos, 5 batches of its 64 an epoch.
RECORDIO = "application/x-recordio"


def photo_bytes(rng, color: str, size: int = 48) -> bytes:
    """A JPEG photo of `color`, with noise."""
    from PIL import Image

    pixels = np.clip(np.array(PIXELS[color]) + rng.integers(-60, 60, (size, size, 3)), 0, 255)
    out = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def labelled(classes, count: int, seed: int) -> list[tuple[bytes, int]]:
    """`count` photos of each class (a colour), in class order: (JPEG, class id)."""
    rng = np.random.default_rng(seed)
    return [(photo_bytes(rng, color), label) for label, color in enumerate(classes) for _ in range(count)]


def rec_file(path, images: list[tuple[bytes, int]]) -> None:
    """An im2rec .rec file of `images`: MXNet's image header (flag 0, the label, the index), then
    the JPEG, each framed as MXNet's RecordIO frames it."""
    from pipemode import recordio

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(recordio.encode([struct.pack("<IfQQ", 0, float(label), index, 0) + image
                                      for index, (image, label) in enumerate(images)]))


def trained(job: FakeJob, hyperparameters: dict) -> str:
    """container/train on `job` with `hyperparameters`; its epochs' metric lines and the export's."""
    write_hyperparameters(job, **hyperparameters)
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "dialect mxnet: the hyperparameters are read with the built-in MXNet" in out.stdout
    return "\n".join(line for line in out.stdout.splitlines() if line.startswith("metrics:") or "exported is" in line)


def asked_files(folder, classes, count: int = 2, seed: int = 9) -> dict[str, list[str]]:
    """`count` new photos of each class, as files: {class: paths}."""
    folder.mkdir(parents=True)
    paths = {}
    for i, (image, label) in enumerate(labelled(classes, count, seed)):
        path = folder / f"{classes[label]}-{i}.jpg"
        path.write_bytes(image)
        paths.setdefault(classes[label], []).append(str(path))
    return paths


def test_the_mxnet_full_training_notebook_trains_on_rec_files_and_its_clients_get_each_class(job, tmp_path, monkeypatch):
    """Image-classification-fulltraining.ipynb: a ResNet-18 trained from scratch at 224 pixels for 2
    epochs (batches of 64, learning rate 0.01; SGD with momentum 0.9 and weight decay 1e-4, MXNet's
    defaults, which the dialect gives), on .rec files in train and validation
    (application/x-recordio, File mode). The model is asked by the notebook's real-time cell 45, the
    same argmax of the bare list that the incremental (cell 35, SDK v2's Predictor) and Ground Truth
    (cell 61) notebooks do, and by its batch transform's get_label (cell 31) on the .out files."""
    for role, count, seed in (("train", 96, 1), ("validation", 8, 2)):
        job.add_channel(role, mode="File", content_type=RECORDIO)
        rec_file(job.data_dir / role / f"{role}.rec", labelled(COLORS, count, seed))
    log = trained(job, notebooks.mxnet_full_training(len(COLORS), 96 * len(COLORS)))
    asked = asked_files(tmp_path / "test_inputs", COLORS)
    expected = {color: [color] * len(paths) for color, paths in asked.items()}
    monkeypatch.chdir(tmp_path)
    with serving(job.base / "model", tmp_path / "serve.log") as server:
        runtime, ic_classifier = Runtime(server), Predictor(server)
        for cell in (lambda path: a1_cell_45(runtime, "ic-endpoint", path, list(COLORS))[0],
                     lambda path: a8_cell_35(ic_classifier, path, list(COLORS), IdentitySerializer),
                     lambda path: a10_cell_61(runtime, "ic-endpoint", list(COLORS), [Path(path).name])):
            assert {color: [cell(path) for path in paths] for color, paths in asked.items()} == expected, log
    output = tmp_path / "bucket" / "transform" / "output"
    output.mkdir(parents=True)
    with serving(job.base / "model", tmp_path / "serve-batch.log", SAGEMAKER_BATCH="true") as server:
        for paths in asked.values():  # (the transform job: each file POSTed as it is, no Accept)
            for path in paths:
                status, body, _ = server.request("POST", "/invocations", Path(path).read_bytes(),
                                                 Content_Type="application/x-image")
                assert status == 200, body[:500]
                (output / f"{Path(path).name}.out").write_bytes(body)
    got = {color: [a1_cell_31_get_label(S3(tmp_path / "bucket"), "bucket", f"transform/output/{Path(path).name}.out",
                                        list(COLORS))[0] for path in paths] for color, paths in asked.items()}
    assert got == expected, log
