"""The model: backbones, weights from files, preprocessing inside the model, freezing rules."""

import gc
import warnings

import keras
import numpy as np
import pytest

from keras_pipe_train.model import classifier as M
from keras_pipe_train.settings.backbones import BACKBONES
from keras_pipe_train.settings.errors import UserError


def weights_of(layer_or_model):
    return [w.numpy() if hasattr(w, "numpy") else np.asarray(w) for w in layer_or_model.weights]


@pytest.fixture
def weights_file(tmp_path):
    keras.utils.set_random_seed(7)
    source = M.build_backbone("mobilenet_v3_small", 32, None)
    path = tmp_path / "backbone.weights.h5"
    source.save_weights(path)
    return path, source


@pytest.mark.slow
def test_backbone_weights_loaded_from_a_file_equal_the_files(weights_file):
    path, source = weights_file
    keras.utils.set_random_seed(8)  # a different random start, to be overwritten
    loaded = M.build_backbone("mobilenet_v3_small", 32, str(path))
    for expected, got in zip(weights_of(source), weights_of(loaded), strict=True):
        np.testing.assert_array_equal(expected, got)


@pytest.mark.slow
def test_a_resource_warning_from_the_garbage_collector_while_loading_is_not_a_mismatch(weights_file):
    """The collector finalises unrelated objects whenever it runs, and their ResourceWarnings land
    in the loader's catch_warnings: (CI once failed a fitting file on one)."""
    path, source = weights_file

    def unrelated(phase, info):
        if phase == "start":
            warnings.warn("Implicitly cleaning up <TemporaryDirectory '/tmp/elsewhere'>", ResourceWarning, stacklevel=1)

    thresholds = gc.get_threshold()
    gc.callbacks.append(unrelated)
    gc.set_threshold(1)  # (a collection every allocation or so: many while the file loads)
    try:
        loaded = M.build_backbone("mobilenet_v3_small", 32, str(path))
    finally:
        gc.callbacks.remove(unrelated)
        gc.set_threshold(*thresholds)
    for expected, got in zip(weights_of(source), weights_of(loaded), strict=True):
        np.testing.assert_array_equal(expected, got)


@pytest.mark.slow
def test_a_weights_file_of_another_backbone_is_a_clear_error(weights_file):
    path, _ = weights_file
    with pytest.raises(UserError, match="does not fit backbone mobilenet_v3_large"):
        M.build_backbone("mobilenet_v3_large", 32, str(path))
    with pytest.raises(UserError, match="does not exist"):
        M.build_backbone("mobilenet_v3_small", 32, str(path.with_name("absent.weights.h5")))


@pytest.mark.parametrize("name", list(BACKBONES))
def test_each_backbones_input_scaling_is_its_keras_preprocess_input(name):
    """The model scales [0, 255] RGB as the application's own preprocess_input does; for those that
    scale inside the application (builtin), Keras' preprocess_input passes the images through."""
    images = np.random.default_rng(0).uniform(0, 255, (2, 5, 5, 3)).astype(np.float32)
    if BACKBONES[name].built_here:  # (no application of its own: Keras' preprocess_input in its table's mode)
        expected = keras.applications.imagenet_utils.preprocess_input(images.copy(), mode=BACKBONES[name].preprocessing)
    else:
        module = getattr(keras.applications, getattr(keras.applications, BACKBONES[name].application).__module__
                         .rsplit(".", 1)[-1])
        expected = module.preprocess_input(images.copy())
    scaling = M.input_scaling(name)
    if BACKBONES[name].preprocessing == "builtin":
        assert scaling is None
        np.testing.assert_array_equal(expected, images)
    else:
        assert float(np.abs(expected - images).max()) > 1  # (it does change them)
        np.testing.assert_allclose(scaling(images).numpy(), expected, rtol=1e-5, atol=1e-4)


def test_the_backbone_table_is_keras_applications_and_the_resnets_built_here():
    """Every name builds a Keras application, and every Keras application has a name; the others
    are the ResNets built here, which Keras has not."""
    from keras_pipe_train.model import resnets

    applications = {name for name in dir(keras.applications) if name[0].isupper()}
    assert sorted(b.application for b in BACKBONES.values() if not b.built_here) == sorted(applications)
    for backbone in BACKBONES.values():
        assert backbone.name == backbone.name.lower() and " " not in backbone.name
        if backbone.built_here:
            assert backbone.name.startswith("resnet") and backbone.application not in applications
            assert callable(getattr(resnets, backbone.application))


def test_a_backbone_that_cannot_load_a_weights_file_says_so(weights_file):
    path, _ = weights_file
    with pytest.raises(UserError, match="backbone efficientnet_b0 cannot be restored from a weights file"):
        M.build_backbone("efficientnet_b0", 32, str(path))


def test_unfreeze_top_never_trains_batchnorm_and_counts_from_the_top():
    backbone = M.build_backbone("mobilenet_v3_small", 32, None)
    names = M.unfreeze_top(backbone, 12)
    top = backbone.layers[-12:]
    assert names == [layer.name for layer in top if layer.weights and not isinstance(layer, keras.layers.BatchNormalization)]
    assert not any(layer.trainable for layer in backbone.layers if isinstance(layer, keras.layers.BatchNormalization))
    assert not any(layer.trainable for layer in backbone.layers[:-12])
    everything = M.unfreeze_top(backbone, 10_000)  # more than it has: all but BatchNorm
    assert len(everything) == sum(1 for layer in backbone.layers if layer.weights and not isinstance(layer, keras.layers.BatchNormalization))
    assert M.unfreeze_top(backbone, 0) == []


def smallest_of_each_family() -> list[str]:
    families = {}
    for backbone in BACKBONES.values():
        families.setdefault(backbone.family, backbone.name)  # (each family's first: its smallest)
    return list(families.values())


def trained_a_step(name: str) -> tuple[keras.Model, np.ndarray]:
    """The family's `name` backbone with a head, at the smallest size it takes, after one step of
    training (eagerly: tracing a large backbone's gradient costs a minute here, and the loop's
    traced step is the same for every model, tests/job/training/test_loop.py); (the model, its inputs)."""
    import tensorflow as tf

    size = max(32, BACKBONES[name].min_size)
    keras.utils.set_random_seed(0)
    backbone = M.build_backbone(name, size, None)
    classifier = M.build_classifier(name, backbone, 3, 0.0, batchnorm_frozen=False)
    M.prepare_from_scratch(backbone)
    assert M.backbone_of(classifier) is backbone
    images = np.random.default_rng(1).uniform(0, 255, (4, size, size, 3)).astype(np.float32)
    before = [w.copy() for w in classifier.get_weights()]
    with tf.GradientTape() as tape:
        loss = keras.losses.sparse_categorical_crossentropy(np.array([0, 1, 2, 0]), classifier(images, training=True))
    keras.optimizers.SGD(0.01).apply(tape.gradient(loss, classifier.trainable_variables),
                                     classifier.trainable_variables)
    assert np.isfinite(loss.numpy()).all()
    assert any(not np.array_equal(a, b) for a, b in zip(before, classifier.get_weights()))
    return classifier, images


@pytest.mark.slow
@pytest.mark.parametrize("name", smallest_of_each_family())
def test_every_family_builds_trains_a_step_and_saves_a_model_that_loads_with_plain_keras(name, tmp_path):
    """The smallest backbone of each family (the others differ from it in widths and depths only):
    a step of training changes it, and its model.keras (what the export writes, and incremental
    training loads) loads without this project's code and answers as it does."""
    classifier, images = trained_a_step(name)
    classifier.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    np.testing.assert_allclose(loaded(images).numpy(), classifier(images).numpy(), atol=1e-5)


@pytest.mark.slow
# (scaled: builtin, tf, caffe; torch, and the layers of the ResNets built here)
@pytest.mark.parametrize("name", ["mobilenet_v3_small", "mobilenet", "vgg16", "resnet20"])
def test_the_exported_savedmodel_answers_a_jpeg_as_the_keras_model_does(name, tmp_path):
    """The export's SavedModel, one backbone for each way of scaling the input (torch's is the
    same layer as tf's and caffe's, with other numbers: test_each_backbones_input_scaling...), and
    one built here (resnets.py: plain Keras layers, as the applications')."""
    import tensorflow as tf

    from keras_pipe_train.model.export import export

    classifier, images = trained_a_step(name)
    size = images.shape[1]
    serving = tf.saved_model.load(str(export(classifier, ("a", "b", "c"), size, tmp_path / "model")))
    jpeg = tf.io.encode_jpeg(tf.cast(images[0], tf.uint8)).numpy()
    answer = serving.signatures["serving_default"](image_bytes=tf.constant([jpeg]))
    decoded = tf.image.resize(tf.cast(tf.io.decode_jpeg(jpeg, channels=3), tf.float32), [size, size])
    np.testing.assert_allclose(answer["probabilities"].numpy(), classifier(decoded[None]).numpy(), atol=1e-4)
    assert answer["probabilities"].shape == (1, 3)


@pytest.mark.slow
def test_the_saved_classifier_loads_with_plain_keras(tmp_path):
    backbone = M.build_backbone("resnet50", 32, None)
    classifier = M.build_classifier("resnet50", backbone, 3, 0.0)
    classifier.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")  # no custom objects needed
    x = np.random.default_rng(1).uniform(0, 255, (1, 32, 32, 3)).astype(np.float32)
    np.testing.assert_allclose(loaded(x).numpy(), classifier(x).numpy(), rtol=1e-5)
