"""Incremental training: a previous job's model.tar.gz (or model/ folder) in a `model` channel is
continued, its head kept for the same classes and replaced for others; what the channel holds is
read with care (only model.keras and classes.json, regular files, within limits)."""

import io
import json
import tarfile

import keras
import numpy as np
import pytest

from keras_pipe_train.model import incremental
from keras_pipe_train.model.classifier import backbone_of, build_backbone, build_classifier
from keras_pipe_train.model.export import export
from keras_pipe_train.settings.errors import UserError
from tests.conftest import model_tar_gz

CLASSES = ("zero", "one", "two")


def classifier(classes=CLASSES, seed=0, activation="softmax") -> keras.Model:
    keras.utils.set_random_seed(seed)
    return build_classifier("mobilenet_v3_small", build_backbone("mobilenet_v3_small", 32, None), len(classes), 0.2,
                            activation=activation)


@pytest.fixture(scope="module")
def previous_model(tmp_path_factory):
    """A job's model/ folder (export()), and its model.tar.gz as SageMaker makes it."""
    folder = tmp_path_factory.mktemp("previous") / "model"
    model = classifier(seed=1)
    export(model, CLASSES, 32, folder)
    return folder, model_tar_gz(folder, folder.parent / "model.tar.gz"), model


def channel_with(tmp_path, archive=None, files=None):
    folder = tmp_path / "model"
    folder.mkdir(parents=True)
    if archive:
        (folder / "model.tar.gz").write_bytes(archive.read_bytes())
    for name, data in (files or {}).items():
        (folder / name).write_bytes(data)
    return folder


def assert_same_weights(a, b) -> None:
    for x, y in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.slow
@pytest.mark.parametrize("form", ["archive", "folder"])
def test_the_same_classes_keep_the_head_and_the_backbone(form, previous_model, tmp_path):
    folder, archive, trained = previous_model
    channel = channel_with(tmp_path, archive) if form == "archive" else folder
    previous = incremental.load(channel)
    assert previous.classes == list(CLASSES) and previous.backbone_name == "mobilenet_v3_small"
    model = classifier(seed=2)
    assert incremental.continue_from(previous, model, "mobilenet_v3_small", CLASSES, False, "auto")
    assert_same_weights(model, trained)


@pytest.mark.slow
def test_other_classes_replace_the_head_and_keep_the_backbone(previous_model, tmp_path, caplog):
    _, archive, trained = previous_model
    previous = incremental.load(channel_with(tmp_path, archive))
    model = classifier(("cat", "dog"), seed=2)
    head = model.get_layer("classifier").get_weights()
    with caplog.at_level("INFO"):
        assert not incremental.continue_from(previous, model, "mobilenet_v3_small", ("cat", "dog"), False, "auto")
    assert_same_weights(backbone_of(model), backbone_of(trained))
    for kept, now in zip(head, model.get_layer("classifier").get_weights()):
        np.testing.assert_array_equal(kept, now)  # (this job's own new head, untouched)
    assert "the classifier replaced (the classes differ: it was trained for 3 classes (zero, one, two))" in caplog.text
    # the same classes as multi-label: another head too
    model = classifier(seed=2, activation="sigmoid")
    assert not incremental.continue_from(previous, model, "mobilenet_v3_small", CLASSES, True, "auto")


@pytest.mark.slow
def test_reinitialize_top_layer_replaces_or_insists_on_keeping(previous_model, tmp_path):
    _, archive, trained = previous_model
    previous = incremental.load(channel_with(tmp_path, archive))
    model = classifier(seed=2)
    assert not incremental.continue_from(previous, model, "mobilenet_v3_small", CLASSES, False, "true")
    assert not np.array_equal(model.get_layer("classifier").get_weights()[0],
                              trained.get_layer("classifier").get_weights()[0])
    with pytest.raises(UserError, match="reinitialize_top_layer=false keeps the previous classifier, which was "
                                        r"trained for 3 classes \(zero, one, two\); this job has 2 classes"):
        incremental.continue_from(previous, classifier(("a", "b")), "mobilenet_v3_small", ("a", "b"), False, "false")
    with pytest.raises(UserError, match="the previous model's backbone is mobilenet_v3_small, and this job's is "
                                        "resnet50: set hyperparameter backbone=mobilenet_v3_small"):
        incremental.continue_from(previous, model, "resnet50", CLASSES, False, "auto")


def tar_of(*members) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, content, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return data.getvalue()


def damaged(archive: bytes) -> bytes:
    """The gzip stream's middle overwritten: its headers read, a member's data does not."""
    middle = len(archive) // 2
    return archive[:middle] + bytes(4096) + archive[middle + 4096:]


def test_a_model_of_another_shape_is_refused(tmp_path):
    """Named as a classifier of this job, but with no backbone inside and no classifier layer."""
    impostor = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)], name="mobilenet_v3_small_classifier")
    channel = tmp_path / "model"
    channel.mkdir()
    impostor.save(channel / "model.keras")
    (channel / "classes.json").write_text(json.dumps(list(CLASSES)))
    with pytest.raises(UserError, match="is not a model this job exported"):
        incremental.load(channel)


@pytest.mark.slow
def test_what_the_channel_holds_is_read_with_care(previous_model, tmp_path):
    folder, archive, _ = previous_model
    model_bytes = (folder / "model.keras").read_bytes()
    cases = {
        "must hold one previous model: .* holds neither": {"notes.txt": b"hello"},
        "holds model.tar.gz, other.tar.gz": {"model.tar.gz": archive.read_bytes(), "other.tar.gz": b""},
        "cannot be read as a model.tar.gz": {"model.tar.gz": b"not gzip at all"},
        "holds no model.keras at its top": {"model.tar.gz": tar_of(("1/notes.txt", b"x", "file"))},
        "model.tar.gz's model.keras is not a regular file": {
            "model.tar.gz": tar_of(("model.keras", "/etc/passwd", "link"))},
        "holds a model.keras that Keras cannot load": {
            "model.tar.gz": tar_of(("model.keras", b"PK not a zip", "file"), ("classes.json", b"[]", "file"))},
        "has no readable classes.json": {"model.tar.gz": tar_of(("model.keras", model_bytes, "file"))},
        "classes.json is not a list of class names": {
            "model.tar.gz": tar_of(("model.keras", model_bytes, "file"), ("classes.json", b'{"a": 1}', "file"))},
        "is not a model this job exported": {
            "model.tar.gz": tar_of(("model.keras", model_bytes, "file"), ("classes.json", b'["a"]', "file"))},
        "model.tar.gz cannot be read as a model.tar.gz": {"model.tar.gz": damaged(tar_of(
            ("model.keras", model_bytes, "file"), ("classes.json", json.dumps(list(CLASSES)).encode(), "file")))},
    }
    for index, (message, files) in enumerate(cases.items()):
        channel = channel_with(tmp_path / str(index), files=files)
        with pytest.raises(UserError, match=message):
            incremental.load(channel)
    # a member that would land outside (../) is not a member the job reads: the rest loads, nothing is written
    escaping = tar_of(("../../escaped.txt", b"x", "file"), ("model.keras", model_bytes, "file"),
                      ("classes.json", json.dumps(list(CLASSES)).encode(), "file"))
    previous = incremental.load(channel_with(tmp_path / "escape", files={"model.tar.gz": escaping}))
    assert previous.classes == list(CLASSES)
    assert not list(tmp_path.rglob("escaped.txt"))


def test_a_builtin_mxnet_model_or_one_trained_on_jumpstarts_is_named_with_the_way_round(tmp_path):
    """What a model channel holds when it is not a model this job can continue: the built-in MXNet
    algorithm's model.tar.gz (its symbol, params and shapes), or this job's export of a model trained
    on a JumpStart SavedModel (its serving SavedModel, no model.keras). JumpStart's own pretrained
    model is read as a backbone instead (test_jumpstart.py)."""
    exported = tar_of(("1/saved_model.pb", b"x", "file"), ("1/variables/variables.index", b"x", "file"),
                      ("classes.json", b'["a", "b"]', "file"), ("serving.json", b"{}", "file"))
    mxnet = tar_of(("image-classification-symbol.json", b"{}", "file"),
                   ("image-classification-0010.params", b"x", "file"), ("model-shapes.json", b"[]", "file"))
    for name, files, words in (
            ("exported", {"model.tar.gz": exported}, "a model this job trained on a pretrained SavedModel .* "
             "cannot be continued"),
            ("mxnet", {"model.tar.gz": mxnet}, "It holds an MXNet model .* train anew with use_pretrained_model=1")):
        with pytest.raises(UserError, match=words):
            incremental.load(channel_with(tmp_path / name, files=files))


@pytest.mark.slow
def test_a_job_continues_the_model_in_its_model_channel_from_its_very_weights(job, previous_model, digit_records):
    """The job, given the previous model in a `model` channel (File mode, as SageMaker copies a
    model.tar.gz) and a learning rate too small to move it: its validation loss is the previous
    model's own on the same images."""
    import tensorflow as tf

    from keras_pipe_train.sources import preprocess
    from tests.job.conftest import file_channel, run_train, write_hyperparameters

    _, archive, trained = previous_model
    examples, labels = digit_records
    chosen = [(e, y) for e, y in zip(examples, labels) if y < 3][:120]
    file_channel(job, "train", [e for e, _ in chosen[:60]])
    file_channel(job, "validation", [e for e, _ in chosen[60:]], shards=1)
    job.add_channel("model", mode="File")
    (job.data_dir / "model").mkdir()
    (job.data_dir / "model" / "model.tar.gz").write_bytes(archive.read_bytes())
    write_hyperparameters(job, class_names=list(CLASSES), image_size=32, epochs=1, learning_rate=1e-12,
                          batch_size=20, augment="false")
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "the classifier kept (the same classes)" in out.stdout + out.stderr
    final = json.loads((job.base / "output/data/metrics.json").read_text())["final"]
    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
    encoded = [tf.io.parse_single_example(e, features)["image/encoded"] for e, _ in chosen[60:]]
    images = tf.stack([preprocess.for_eval(x, 32) for x in encoded])
    probabilities = trained(images, training=False).numpy()
    expected = -np.mean(np.log(probabilities[np.arange(60), [y for _, y in chosen[60:]]]))
    assert final["val_loss"] == pytest.approx(expected, rel=1e-4)
