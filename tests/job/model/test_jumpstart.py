"""JumpStart's pretrained TensorFlow model in the `model` channel as the backbone
(keras_pipe_train/model/jumpstart.py): read from its tarball or its unpacked files, called as
hub.KerasLayer calls it, fine-tuned through its own variables, checkpointed and exported; and
what is not such a model refused, naming it."""

import gc
import shutil
import sys
import tarfile
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_train.model import incremental, jumpstart
from keras_pipe_train.model.classifier import backbone_of, build_classifier
from keras_pipe_train.model.export import export
from keras_pipe_train.settings.errors import UserError
from tests.conftest import REPO, run_logged
from tests.job.model.test_incremental import channel_with, tar_of
from tests.timeouts import wait_s

SIZE = 32


def made(folder, *flags) -> bytes:
    """A JumpStart-layout tarball (jumpstart_reference.py), as bytes."""
    archive = folder / "model.tar.gz"
    result = run_logged([sys.executable, str(REPO / "tests/job/model/jumpstart_reference.py"), str(archive),
                         str(SIZE), *flags], wait_s(120))
    assert result.returncode == 0, result.stderr[-2000:]
    return archive.read_bytes()


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jumpstart")
    return {"plain": made(folder), "signature": made(folder, "--signature"),
            "finetuned": made(folder, "--finetuned"), "regularized": made(folder, "--regularized")}


def pretrained_from(tmp_path, archive: bytes) -> jumpstart.Pretrained:
    name = "train-tensorflow-ic-imagenet-mobilenet-v2-100-224-classification-4.tar.gz"
    found = incremental.load(channel_with(tmp_path, files={name: archive}))
    assert isinstance(found, jumpstart.Pretrained)
    return found


def classifier_on(pretrained, batchnorm_trains=False) -> keras.Model:
    backbone = jumpstart.build_backbone(pretrained, pretrained.image_size_for(224), batchnorm_trains)
    return build_classifier(jumpstart.NAME, backbone, 3, 0.0, batchnorm_frozen=not batchnorm_trains,
                            scaling=pretrained.scaling)


def photos(count=24, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, count)
    base = np.eye(3)[labels] * 200 + 25
    return (np.clip(base[:, None, None, :] + rng.uniform(-30, 30, (count, SIZE, SIZE, 3)), 0, 255)
            .astype(np.float32), labels)


@pytest.mark.slow
def test_its_model_info_sets_the_image_size_and_scaling_and_the_features_are_the_savedmodels(tmp_path, archives):
    """The model takes [0, 255] images, scales them to [0, 1] (normalize) and gives the
    SavedModel's own features: the same as calling the SavedModel itself on images / 255."""
    pretrained = pretrained_from(tmp_path, archives["plain"])
    assert (pretrained.image_size, pretrained.scaling, pretrained.image_size_for(224)) == (SIZE, "unit", SIZE)
    model = classifier_on(pretrained)
    assert model.name == "jumpstart_classifier" and model.input_shape == (None, SIZE, SIZE, 3)
    images, _ = photos(4)
    scaled = model.get_layer("unit_preprocessing")(images)
    loaded = tf.saved_model.load(str(pretrained.folder))
    np.testing.assert_allclose(backbone_of(model)(scaled, training=False), loaded(images / 255.0, training=False),
                               atol=1e-5)


@pytest.mark.slow
def test_fine_tuning_trains_the_savedmodels_own_variables_and_the_export_serves_them(tmp_path, archives):
    """train_only_top_layer=False's case: the backbone trainable, its BatchNorm in training mode.
    The SavedModel's variables are the ones that change (not copies, as Keras' TFSMLayer makes), a
    checkpoint restores them, and the exported serving SavedModel answers as the trained model."""
    pretrained = pretrained_from(tmp_path, archives["plain"])
    model = classifier_on(pretrained, batchnorm_trains=True)
    layer = backbone_of(model).get_layer("savedmodel")
    assert len(layer.trainable_weights) == 12 and len(layer.non_trainable_weights) == 6
    before = [w.numpy().copy() for w in layer.weights]
    images, labels = photos()
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    model.fit(images, labels, batch_size=8, epochs=1, verbose=0)
    after = [w.numpy() for w in layer.weights]
    assert all(np.abs(a - b).max() > 0 for a, b in zip(after, before))  # (moving statistics too: training mode)
    wanted = model.predict(images, verbose=0)
    checkpoint = tf.train.Checkpoint(model=model).write(str(tmp_path / "checkpoint" / "state"))
    for weight in layer.weights:
        weight.assign(np.zeros(weight.shape, np.float32))
    tf.train.Checkpoint(model=model).read(checkpoint).assert_consumed()
    np.testing.assert_allclose(model.predict(images, verbose=0), wanted, atol=1e-6)

    serving_dir = export(model, ("a", "b", "c"), SIZE, tmp_path / "exported")
    assert not (tmp_path / "exported" / "model.keras").exists()
    served = tf.saved_model.load(str(serving_dir)).signatures["serving_default"]
    pixels = images[:4].astype(np.uint8)
    answers = served(image_bytes=tf.constant([tf.io.encode_png(image).numpy() for image in pixels]))
    np.testing.assert_allclose(answers["probabilities"].numpy(), model(pixels.astype(np.float32)).numpy(), atol=1e-4)


@pytest.mark.slow
def test_a_model_used_through_a_signature_gives_its_output_key_and_does_not_train(tmp_path, archives):
    """A model info naming a signature and an output key (TF Hub's TF1-format models): its
    features are that output, and its weights stay frozen (JumpStart: hub.KerasLayer(trainable=False))."""
    pretrained = pretrained_from(tmp_path, archives["signature"])
    assert (pretrained.signature, pretrained.output_key) == ("image_feature_vector", "default")
    model = classifier_on(pretrained, batchnorm_trains=True)
    layer = backbone_of(model).get_layer("savedmodel")
    assert not layer.trainable_weights and layer.non_trainable_weights
    images, _ = photos(2)
    assert model(images).shape == (2, 3)


@pytest.mark.slow
def test_its_batchnorm_trains_only_with_train_batchnorm_while_its_weights_train(tmp_path, archives):
    """Its BatchNorm statistics move only in training mode, while the backbone trains (not in
    the head's phase, frozen) and train_batchnorm says so; its other weights train whenever the
    backbone does."""
    images, labels = photos()
    for batchnorm_trains, trainable, moves in ((True, False, False), (False, True, False), (True, True, True)):
        model = classifier_on(pretrained_from(tmp_path / f"{batchnorm_trains}-{trainable}", archives["plain"]),
                              batchnorm_trains)
        layer = backbone_of(model).get_layer("savedmodel")
        kinds = [w.trainable for w in layer.weights]  # (False: the moving statistics)
        backbone_of(model).trainable = trainable
        before = [w.numpy().copy() for w in layer.weights]
        model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
        model.fit(images, labels, batch_size=8, epochs=1, verbose=0)
        moved = [(kind, not np.array_equal(w.numpy(), b)) for kind, w, b in zip(kinds, layer.weights, before)]
        expected = [(kind, trainable if kind else moves) for kind in kinds]
        assert moved == expected, (batchnorm_trains, trainable, moved)


@pytest.mark.slow
def test_its_regularization_losses_count_while_it_trains(tmp_path, archives):
    """TF Hub's regularization_losses (here 0.01 * the first kernel's sum of squares) are added to
    the loss in training, when the backbone trains, as hub.KerasLayer adds them, with or without
    train_batchnorm; not otherwise."""
    model = classifier_on(pretrained_from(tmp_path, archives["regularized"]))
    layer = backbone_of(model).get_layer("savedmodel")
    images, _ = photos(2)
    expected = 0.01 * float(np.sum(layer.trainable_weights[0].numpy() ** 2))
    model(images, training=True)
    assert len(model.losses) == 1 and float(model.losses[0]) == pytest.approx(expected, rel=1e-5)
    model(images, training=False)
    assert not model.losses
    backbone_of(model).trainable = False
    model(images, training=True)
    assert not model.losses


def test_its_unpacked_files_are_read_as_well_as_its_tarball(tmp_path, archives):
    """A model channel on the S3 prefix of the unpacked tarball: 1/ and __model_info__.json."""
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "model.tar.gz").write_bytes(archives["plain"])
    with tarfile.open(tmp_path / "model.tar.gz") as tar:
        tar.extractall(folder, filter="data")
    found = incremental.load(folder)
    assert isinstance(found, jumpstart.Pretrained) and found.image_size == SIZE and found.folder == folder / "1"


@pytest.mark.slow
def test_its_unpacked_tarball_is_removed_without_a_warning_when_the_model_goes(tmp_path, archives):
    """(A TemporaryDirectory warned "Implicitly cleaning up" when collected: a ResourceWarning that
    a weights file's mismatch check running at that moment took for a mismatch.)"""
    found = pretrained_from(tmp_path, archives["plain"])
    unpacked = found.folder.parent
    assert unpacked.name.startswith("jumpstart-") and unpacked.is_dir()
    # (recorded: a warning raised as an error inside a finaliser would only be "unraisable")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del found
        gc.collect()
    assert not unpacked.exists()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_what_is_not_a_pretrained_model_to_start_from_is_refused_naming_it(tmp_path, archives):
    """JumpStart's fine-tuned model (finetuned: true), a model info that is not JumpStart's, an
    archive member named outside it or a link, two SavedModels, and reinitialize_top_layer=false."""
    with pytest.raises(UserError, match="is a model JumpStart fine-tuned .*finetuned: true"):
        pretrained_from(tmp_path / "finetuned", archives["finetuned"])
    saved_model = ("1/saved_model.pb", b"x", "file")
    cases = {
        "image_size must be \\[height, width\\]": (saved_model, ("__model_info__.json", b'{"image_size": 224}', "file")),
        "trains on square images only": (saved_model, ("__model_info__.json", b'{"Image_Size": [224, 299]}', "file")),
        "pixel_scaling_method is 'tf'": (saved_model, ("__model_info__.json", b'{"pixel_scaling_method": "tf"}',
                                                       "file")),
        "is not a JSON object": (saved_model, ("__model_info__.json", b"[1]", "file")),
        "outside the archive's folder": (saved_model, ("../escaped.txt", b"x", "file")),
        "is a link or a device": (saved_model, ("1/variables/variables.index", "/etc/passwd", "link")),
        "must hold one SavedModel .* it holds 2": (saved_model, ("2/saved_model.pb", b"x", "file")),
    }
    for index, (message, members) in enumerate(cases.items()):
        with pytest.raises(UserError, match=message):
            incremental.load(channel_with(tmp_path / str(index), files={"js.tar.gz": tar_of(*members)}))
    assert not list(tmp_path.rglob("escaped.txt"))
    # the unpacked export of a job that trained on one: its serving SavedModel is not a backbone
    exported = channel_with(tmp_path / "exported", files={"serving.json": b"{}", "classes.json": b'["a"]'})
    (exported / "1").mkdir()
    (exported / "1" / "saved_model.pb").write_bytes(b"x")
    with pytest.raises(UserError, match="a model this job trained on a pretrained SavedModel .* cannot be continued"):
        incremental.load(exported)


def test_a_savedmodel_that_cannot_be_a_backbone_is_a_clear_error(tmp_path, archives):
    """A SavedModel whose variables are damaged: named, with what TensorFlow said."""
    pretrained = pretrained_from(tmp_path, archives["plain"])
    for path in (pretrained.folder / "variables").glob("variables.data-*"):
        path.write_bytes(b"\0" * 16)
    with pytest.raises(UserError, match="SavedModel cannot be used as the backbone on 32 px images"):
        jumpstart.build_backbone(pretrained, SIZE)
    shutil.rmtree(pretrained.folder)


def test_its_heatmaps_are_integrated_gradients_through_the_savedmodel(tmp_path, archives):
    """A SavedModel backbone is no Keras model whose map Grad-CAM could read: the report's heatmaps
    are Integrated Gradients, its gradients followed through the SavedModel's function."""
    from keras_pipe_train.model import explain

    model = classifier_on(pretrained_from(tmp_path, archives["plain"]))
    images, labels = photos(4)
    explainer = explain.explainer(model)
    assert explainer.method == "Integrated Gradients"
    heat = explainer.heatmaps(images, labels)
    assert heat.shape == (4, SIZE, SIZE) and np.allclose(heat.max(axis=(1, 2)), 1), heat.max(axis=(1, 2))
