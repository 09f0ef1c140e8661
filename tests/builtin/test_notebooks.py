"""AWS's sample notebooks for SageMaker's built-in image classifiers, run here end to end: each
notebook's request as it sends it (tests/builtin/notebooks.py), its channels laid out as it lays
them out, trained by container/train; the exported model served by `serve` and asked by the
notebook's own client code (the cells copied in tests/builtin/cells.py), which must
get each photo's class. The photos are of colours with noise, at a small size: the networks still
run at the notebooks' image shapes.

Each runs unchanged. The pretrained weights they start from are made here and put where the image
keeps them: for the TensorFlow notebook, JumpStart's pretrained model in its `model` channel (a
SavedModel in JumpStart's layout, tests/job/model/jumpstart_reference.py; without that channel,
Keras' MobileNetV2 with weights in $KERAS_HOME), and for the MXNet notebooks that start from
ImageNet weights (lst format, multi-label, Ground Truth; use_pretrained_model=1) a ResNet-18 of MXNet
Gluon's model zoo, built by MXNet itself with random weights (.venv-mxnet) and converted by the
command an offline user types (`python -m keras_pipe_train.model --import-gluon`), as the image's
BAKE_WEIGHTS=resnet18 converts the model zoo's ImageNet file.

The photos are few (what CI has time for: about 10 photos a second at 224 pixels), so each
MXNet job trains a ResNet-18 for a handful of steps, every layer and its BatchNorm as the built-in
does (train_batchnorm): it validates right because its BatchNorm statistics are recomputed with each
epoch's final weights (precise_batchnorm.py; before that, these jobs fit their training photos and
validated at chance). The multi-label notebook's
learning rate of 0.001 leaves its photos of two colours near 0.5 after the ten steps CI can afford:
its test asks for each photo's colours ranked first (it says what was measured). The lst-format,
multi-label and Ground Truth jobs' records are also audited: their first epoch trained and
validated on exactly the records of their channels."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.builtin import notebooks
from tests.builtin.cells import a1_cell_31_get_label, a1_cell_45, a9_cell_35, a10_cell_61, b1_cell_44
from tests.conftest import REPO, FakeJob, mxnet_python, run_logged
from tests.job.conftest import run_train, write_hyperparameters
from tests.job.model.test_gluon_weights import weights_command
from tests.job.sources.test_builtin_channels import RECORDIO, example, ground_truth_lines, lst_channels, read_as
from tests.serve.conftest import Server
from tests.serve.test_builtin_clients import PIXELS, S3, IdentitySerializer, Predictor, Runtime
from tests.timeouts import wait_s

# The notebooks' requests as written train a ResNet-18 at 224 pixels for up to 30 epochs: 130-150 s
# on CI's two cores beside the other worker, and past 250 s on a slower day here (the Ground Truth
# notebook's job ran out of pyproject.toml's 300 s): each test gets 600 s, its job 540 s
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

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
labels = rng.integers(0, len(colors), 480)
images = np.clip(colors[labels][:, None, None, :] + rng.integers(-60, 60, (480, 32, 32, 3)), 0, 255) / 127.5 - 1
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
backbone(images.astype("float32"), training=True)
with h5py.File(sys.argv[1], "w") as f:  # the legacy form of Keras' downloaded ImageNet files
    legacy_h5_format.save_weights_to_hdf5_group(f, backbone)
"""


@pytest.fixture(scope="module")
def keras_home(tmp_path_factory):
    """MobileNetV2's "ImageNet" weights where the image keeps them (tests/job/model/test_imagenet_weights.py
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


@pytest.fixture(scope="module")
def gluon_resnet18_home(tmp_path_factory):
    """$KERAS_HOME with a ResNet-18 of Gluon's model zoo converted into it: MXNet's own resnet18_v1,
    randomly initialised (no ImageNet here), imported as an offline user imports the model zoo's
    file. Returns the environment a job needs to find it."""
    home, folder = tmp_path_factory.mktemp("gluon-home"), tmp_path_factory.mktemp("gluon")
    made = run_logged([str(mxnet_python()), str(REPO / "tests/job/model/gluon_reference.py"), "18", "32", str(folder),
                       "plain"], wait_s(240))
    assert made.returncode == 0, made.stderr[-2000:]
    imported = weights_command("--import-gluon", str(folder / "resnet18_v1.params"), keras_home=home)
    assert imported.returncode == 0, imported.stderr[-2000:]
    return {"KERAS_HOME": str(home)}


def asked_by_cell_44(model: Path, tmp_path) -> tuple[list[str], list[str]]:
    """The TensorFlow notebook's client (cell 44, Accept application/json;verbose) asking the served
    model about two new photos of each colour: (the labels it shows, the colours asked)."""
    asked = photos(tmp_path / "asked", 2, seed=2)
    shown = []
    with serving(model, tmp_path / "serve.log") as server:
        images = {path: f"{color}/{i}.jpg" for color in COLORS for i, path in enumerate(asked[color])}
        b1_cell_44(Predictor(server), images, HTML=str, display=shown.append)
    predicted = [html.split("Predicted Label: ")[1].split("</figcaption>")[0] for html in shown]
    return predicted, [color for color in COLORS for _ in asked[color]]


def jumpstart_model(folder: Path, image_size: int, *flags: str) -> Path:
    """A pretrained model in JumpStart's layout (tests/job/model/jumpstart_reference.py), as the
    file the SDK's model_uri channel copies into the job (its S3 key's last part)."""
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "train-tensorflow-ic-imagenet-mobilenet-v2-100-224-classification-4.tar.gz"
    made = run_logged([sys.executable, str(REPO / "tests/job/model/jumpstart_reference.py"), str(archive),
                       str(image_size), *flags], wait_s(120))
    assert made.returncode == 0, made.stderr[-2000:]
    return archive


def test_the_tensorflow_notebook_trains_on_its_model_channel_and_its_client_gets_each_class(tmp_path):
    """Amazon_TensorFlow_Image_Classification.ipynb: JumpStart's default hyperparameters sent whole
    (epochs set to 5), `Estimator(model_uri=...)`'s `model` channel (application/x-sagemaker-model,
    File mode) holding JumpStart's pretrained model, `fit({"training": ...})` on one folder per
    class, the fine-tuned model asked with Accept application/json;verbose (cell 44). Unchanged:
    the pretrained model is one in JumpStart's layout made here (random weights), at 64 px as its
    model info says, and its top layer alone is trained (train_only_top_layer=True)."""
    job = FakeJob(tmp_path / "opt_ml")
    job.add_channel("training", mode="File")
    job.add_channel("model", mode="File", content_type="application/x-sagemaker-model")
    jumpstart_model(job.data_dir / "model", 64)
    photos(job.data_dir / "training", 64, seed=1)
    write_hyperparameters(job, **notebooks.tensorflow_jumpstart_defaults())
    out = run_train(job)
    log = out.stdout + out.stderr
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "dialect tensorflow: the hyperparameters are read with the built-in TensorFlow" in log
    assert "backbone: the SavedModel in channel 'model' (train-tensorflow-ic-imagenet-mobilenet-v2" in log
    assert "images are 64 px, as" in log
    model = job.base / "model"
    assert json.loads((model / "classes.json").read_text()) == list(COLORS)
    assert json.loads((model / "serving.json").read_text())["dialect"] == "tensorflow"
    assert json.loads((model / "serving.json").read_text())["image_size"] == 64
    assert not (model / "model.keras").exists()  # (a .keras file cannot hold the SavedModel's graph)
    predicted, expected = asked_by_cell_44(model, tmp_path)
    assert predicted == expected, predicted


def test_the_tensorflow_notebooks_request_with_train_only_top_layer_false_fine_tunes_the_jumpstart_model(tmp_path):
    """The same request with train_only_top_layer=False (JumpStart: hub.KerasLayer(trainable=True)):
    every epoch trains the SavedModel's own layer too, BatchNorm in training mode, and the job
    validates and exports as before."""
    job = FakeJob(tmp_path / "opt_ml")
    job.add_channel("training", mode="File")
    job.add_channel("model", mode="File", content_type="application/x-sagemaker-model")
    jumpstart_model(job.data_dir / "model", 48)
    photos(job.data_dir / "training", 32, seed=1)
    write_hyperparameters(job, **{**notebooks.tensorflow_jumpstart_defaults(), "train_only_top_layer": "False",
                                  "epochs": "2"})
    out = run_train(job)
    log = out.stdout + out.stderr
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "phase 2: fine-tuning 1 backbone layers (savedmodel ... savedmodel) for 2 epochs" in log
    assert "metrics: epoch=2 phase=fine_tune" in log
    assert (job.base / "model" / "1" / "saved_model.pb").is_file()


def test_the_tensorflow_notebooks_request_without_its_model_channel_trains_a_keras_mobilenet_v2(tmp_path,
                                                                                               keras_home):
    """The TensorFlow notebook's request without `model_uri`'s channel: JumpStart's default
    hyperparameters sent whole (epochs set to 5), `fit({"training": ...})` on one folder per class,
    asked with Accept application/json;verbose (cell 44). The backbone is then Keras' MobileNetV2
    (the notebook's model's network), its pretrained weights in the image (made here, as the image's
    BAKE_WEIGHTS would have them), its top layer alone trained (train_only_top_layer=True)."""
    job = FakeJob(tmp_path / "opt_ml")
    job.add_channel("training", mode="File")
    photos(job.data_dir / "training", 64, seed=1)
    write_hyperparameters(job, **notebooks.tensorflow_jumpstart_defaults())
    out = run_train(job, KERAS_HOME=str(keras_home))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "dialect tensorflow: the hyperparameters are read with the built-in TensorFlow" in out.stdout + out.stderr
    assert "batchnorm statistics" not in out.stdout + out.stderr  # (a pretrained backbone's stay as they are)
    model = job.base / "model"
    assert json.loads((model / "classes.json").read_text()) == list(COLORS)
    assert json.loads((model / "serving.json").read_text())["dialect"] == "tensorflow"
    predicted, expected = asked_by_cell_44(model, tmp_path)
    assert predicted == expected, predicted


RGB = {**PIXELS, "cyan": (25, 230, 230), "magenta": (230, 25, 230)}


def photo_bytes(rng, colors: str | tuple[str, ...], size: int = 48, noise: int = 60) -> bytes:
    """A JPEG photo of a colour, or of colours side by side (a tuple of names), with noise of up to
    `noise` in each channel."""
    from PIL import Image

    colors = (colors,) if isinstance(colors, str) else colors
    stripes = np.array_split(np.arange(size), len(colors))
    base = np.zeros((size, size, 3))
    for color, columns in zip(colors, stripes):
        base[:, columns] = RGB[color]
    pixels = np.clip(base + rng.integers(-noise, noise, (size, size, 3)), 0, 255)
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


def trained(job: FakeJob, hyperparameters: dict, audit_dir=None, said: tuple[str, ...] = (), **env: str) -> str:
    """container/train on `job` with `hyperparameters` (its records audited into `audit_dir` when
    given) and `env`, which must say each of `said`; its epochs' metric lines and the export's."""
    write_hyperparameters(job, **hyperparameters)
    out = run_train(job, 540, **({"TRAIN_AUDIT_DIR": str(audit_dir)} if audit_dir else {}), **env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for words in ("dialect mxnet: the hyperparameters are read with the built-in MXNet", *said):
        assert words in out.stdout, words
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


def transformed(model_dir, asked: dict[str, list[str]], tmp_path, classes) -> dict[str, list[str]]:
    """What the notebooks' batch transform get_label (cell 31) reads of the .out files a batch
    transform server (SAGEMAKER_BATCH=true) wrote for each of the `asked` photos: {class: classes}."""
    output = tmp_path / "bucket" / "transform" / "output"
    output.mkdir(parents=True)
    with serving(model_dir, tmp_path / "serve-batch.log", SAGEMAKER_BATCH="true") as server:
        for paths in asked.values():  # (the transform job: each file POSTed as it is, no Accept)
            for path in paths:
                status, body, _ = server.request("POST", "/invocations", Path(path).read_bytes(),
                                                 Content_Type="application/x-image")
                assert status == 200, body[:500]
                (output / f"{Path(path).name}.out").write_bytes(body)
    return {color: [a1_cell_31_get_label(S3(tmp_path / "bucket"), "bucket", f"transform/output/{Path(path).name}.out",
                                         list(classes))[0] for path in paths] for color, paths in asked.items()}


LST_CLASSES = ("blue", "cyan", "green", "magenta", "red", "yellow")  # (its top_k is 5: more classes than that)


def test_the_mxnet_lst_format_notebook_trains_on_images_and_lst_files_and_its_clients_get_each_class(
        job, tmp_path, monkeypatch, gluon_resnet18_home):
    """Image-classification-lst-format.ipynb: channels train, validation, train_lst and
    validation_lst, all application/x-image, File mode; its request (ResNet-18 at 3,206,206 after a
    resize to 256, 6 epochs of batches of 128 at learning rate 0.01, top_k 5, checkpoint_frequency 2:
    epochs 2, 4 and 6 kept, use_pretrained_model 1). Asked by its real-time cell 49 and its batch
    transform's get_label (cell 36), the same lines as the full-training notebook's cells 45, 31."""
    train, validation = labelled(LST_CLASSES, 6, 1), labelled(LST_CLASSES, 2, 2)
    lst_channels(job, "train", [(image, [label]) for image, label in train], 0)
    lst_channels(job, "validation", [(image, [label]) for image, label in validation], 1000)
    log = trained(job, notebooks.mxnet_lst_format(len(LST_CLASSES), len(train)),
                  tmp_path / "audit", said=("channel train: application/x-image: images, listed by channel "
                                            "train_lst's .lst; read as record_format=lst",
                                            "backbone=resnet18", "image_size=206", "resize=256", "top_k=5",
                                            "BatchNorm included (train_batchnorm)"), **gluon_resnet18_home)
    read_as(tmp_path / "audit", [example(image, label) for image, label in train],
            [example(image, label) for image, label in validation])
    # checkpoint_frequency=2: every second epoch's model kept in model.tar.gz, as the built-in keeps them
    assert sorted(p.name for p in (job.base / "model" / "epochs").iterdir()) == [
        "epoch-0002.keras", "epoch-0004.keras", "epoch-0006.keras"]
    asked = asked_files(tmp_path / "test_inputs", LST_CLASSES, count=1)
    expected = {color: [color] * len(paths) for color, paths in asked.items()}
    with serving(job.base / "model", tmp_path / "serve.log") as server:
        runtime = Runtime(server)
        got = {color: [a1_cell_45(runtime, "ic-endpoint", path, list(LST_CLASSES))[0] for path in paths]
               for color, paths in asked.items()}
    assert got == expected, log
    monkeypatch.chdir(tmp_path)
    assert transformed(job.base / "model", asked, tmp_path, LST_CLASSES) == expected, log


def test_the_ground_truth_notebooks_job_trains_on_its_augmented_manifest_in_pipe_mode_and_its_client_gets_each_class(
        job, tmp_path, monkeypatch, gluon_resnet18_home):
    """The Ground Truth demo's training job: AugmentedManifestFile channels (AttributeNames
    ["source-ref", "category"], which reach the job nowhere: the first record of each line is the
    image, the second its label, as 3, "3" or 3.0), application/x-recordio, RecordWrapperType
    RecordIO, Pipe mode; its request (ResNet-18 at 224, 30 epochs of batches of 32 at learning rate
    0.01, lr_scheduler_step 10,20, use_pretrained_model 1). Asked by its cell 61,
    each photo in test_inputs/."""
    train, validation = labelled(COLORS, 2, 1), labelled(COLORS, 1, 2)
    for role, images in (("train", train), ("validation", validation)):
        job.add_channel(role, wrapper="RecordIO", content_type=RECORDIO)
        job.feed(role, [job.write(f"{role}-{i:05d}-{j}", value) for i, line in enumerate(ground_truth_lines(images))
                        for j, value in enumerate(line)], wrapper="RecordIO")
    log = trained(job, notebooks.mxnet_ground_truth(len(COLORS), len(train)),
                  tmp_path / "audit", said=("channel train: application/x-recordio, RecordIO-wrapped: an augmented "
                                            "manifest, image then label; read as attribute_names=source-ref,label",
                                            "epochs=30", "lr_scheduler_step=(10, 20)",
                                            "batchnorm statistics of epoch 30 recomputed with its final weights on "
                                            "its last 6 training images"), **gluon_resnet18_home)
    read_as(tmp_path / "audit", [example(image, label) for image, label in train],
            [example(image, label) for image, label in validation])
    asked = asked_files(tmp_path / "test_inputs", COLORS)
    monkeypatch.chdir(tmp_path)
    with serving(job.base / "model", tmp_path / "serve.log") as server:
        runtime = Runtime(server)
        got = {color: [a10_cell_61(runtime, "ic-endpoint", list(COLORS), [Path(path).name]) for path in paths]
               for color, paths in asked.items()}
    assert got == {color: [color] * len(paths) for color, paths in asked.items()}, log


MIXES = (("red",), ("green",), ("blue",), ("green", "red"), ("blue", "green"), ("blue", "red"))


def multi_hot(colors) -> list[int]:
    return [int(color in colors) for color in COLORS]


def test_the_mxnet_multi_label_notebook_trains_on_lst_files_of_one_value_per_class_and_its_client_ranks_each_photos_classes_first(
        job, tmp_path, capsys, gluon_resnet18_home):
    """Image-classification-multilabel-lst.ipynb: train, validation, train_lst and validation_lst,
    application/x-image, whose .lst lines hold one 0 or 1 per class (read multi-hot, as MXNet reads
    them, with no hyperparameter saying so); its request (ResNet-18 at 224 after a resize to 256, 5
    epochs of batches of 128 at learning rate 0.001, multi_label 1, use_weighted_loss 1,
    augmentation_type crop_color_transform, precision_dtype float32, use_pretrained_model 1). Photos
    of one colour or two side by side, 132 of them: two steps an epoch (128 photos, then 4), ten in
    all. Its cell 35 prints each class's probability for each photo.

    What ten steps at learning rate 0.001 give, from a randomly initialised "pretrained" ResNet-18
    trained whole, BatchNorm included, without dropout (as the built-in; measured here): each
    photo's colours score above the colours it lacks; a photo of one colour has that colour alone
    above 0.5 (0.78 to 0.98, the others 0.06 to 0.30); a photo of two colours has its two at 0.39 to
    0.70, one of them under 0.5 in one of the three. (Trained from scratch, with Keras'
    initialisation and a 0.2 dropout, its two were at 0.42 to 0.75, and under 0.5 in 2 of 9 such
    photos.) So the test asks what held: each photo's colours are its top classes, and one colour's
    photo has its colour alone above 0.5."""
    rng = np.random.default_rng(1)
    photo = functools.partial(photo_bytes, rng, noise=15)  # (less noise than elsewhere: a colour learnt in ten steps)
    train = [(photo(colors), multi_hot(colors)) for colors in MIXES for _ in range(22)]
    validation = [(photo(colors), multi_hot(colors)) for colors in MIXES]
    lst_channels(job, "train", train, 0, im2rec=False)
    lst_channels(job, "validation", validation, 1000, im2rec=False)
    log = trained(job, notebooks.mxnet_multi_label(len(COLORS), len(train)),
                  tmp_path / "audit", said=("multi_label=1: label_format=multi_hot",), **gluon_resnet18_home)
    read_as(tmp_path / "audit", [example(image, [float(v) for v in labels], multi_hot=True) for image, labels in train],
            [example(image, [float(v) for v in labels], multi_hot=True) for image, labels in validation])
    folder = tmp_path / "asked"
    folder.mkdir()
    asked = {}
    for colors in MIXES:
        path = folder / f"{'-'.join(colors)}.jpg"
        path.write_bytes(photo(colors))
        asked[colors] = str(path)
    with serving(job.base / "model", tmp_path / "serve.log") as server:
        ic_classifier = Predictor(server, IdentitySerializer(content_type="application/x-image"))
        got = {colors: a9_cell_35(ic_classifier, path, list(COLORS)) for colors, path in asked.items()}
    printed = capsys.readouterr().out
    assert printed.startswith("blue:") and printed.count("red:") == len(MIXES), printed
    for colors, prob in got.items():
        assert len(prob) == len(COLORS) and all(0 <= p <= 1 for p in prob), (colors, prob, log)
        ranked = [color for _, color in sorted(zip(prob, COLORS), reverse=True)]
        assert set(ranked[:len(colors)]) == set(colors), (colors, dict(zip(COLORS, prob)), log)
        if len(colors) == 1:
            assert [color for p, color in zip(prob, COLORS) if p > 0.5] == list(colors), (colors, prob, log)
