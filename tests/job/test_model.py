"""The model: backbones, weights from files, preprocessing inside the model, freezing rules."""

import keras
import numpy as np
import pytest

from keras_pipe_train import model as M
from keras_pipe_train.errors import UserError


def weights_of(layer_or_model):
    return [w.numpy() if hasattr(w, "numpy") else np.asarray(w) for w in layer_or_model.weights]


@pytest.fixture
def weights_file(tmp_path):
    keras.utils.set_random_seed(7)
    source = M.build_backbone("mobilenet_v3_small", 32, None)
    path = tmp_path / "backbone.weights.h5"
    source.save_weights(path)
    return path, source


def test_backbone_weights_loaded_from_a_file_equal_the_files(weights_file):
    path, source = weights_file
    keras.utils.set_random_seed(8)  # a different random start, to be overwritten
    loaded = M.build_backbone("mobilenet_v3_small", 32, str(path))
    for expected, got in zip(weights_of(source), weights_of(loaded), strict=True):
        np.testing.assert_array_equal(expected, got)


def test_a_weights_file_of_another_backbone_is_a_clear_error(weights_file):
    path, _ = weights_file
    with pytest.raises(UserError, match="does not fit backbone mobilenet_v3_large"):
        M.build_backbone("mobilenet_v3_large", 32, str(path))
    with pytest.raises(UserError, match="does not exist"):
        M.build_backbone("mobilenet_v3_small", 32, str(path.with_name("absent.weights.h5")))


def test_caffe_preprocessing_matches_keras_resnet50_preprocess_input():
    images = np.random.default_rng(0).uniform(0, 255, (2, 5, 5, 3)).astype(np.float32)
    expected = keras.applications.resnet50.preprocess_input(images.copy())
    np.testing.assert_allclose(M.caffe_preprocessing()(images).numpy(), expected, rtol=1e-5, atol=1e-3)


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


@pytest.mark.slow
@pytest.mark.parametrize("name", list(M.BACKBONES))
def test_every_backbone_builds_a_classifier(name):
    backbone = M.build_backbone(name, 32, None)
    classifier = M.build_classifier(name, backbone, 4, 0.2)
    out = classifier(np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype(np.float32)).numpy()
    assert out.shape == (2, 4)
    np.testing.assert_allclose(out.sum(axis=1), 1, rtol=1e-5)
    assert M.backbone_of(classifier) is backbone


def test_the_saved_classifier_loads_with_plain_keras(tmp_path):
    backbone = M.build_backbone("resnet50", 32, None)
    classifier = M.build_classifier("resnet50", backbone, 3, 0.0)
    classifier.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")  # no custom objects needed
    x = np.random.default_rng(1).uniform(0, 255, (1, 32, 32, 3)).astype(np.float32)
    np.testing.assert_allclose(loaded(x).numpy(), classifier(x).numpy(), rtol=1e-5)
