"""test_time_flip: the model judged and served averages each image's logits with its mirror
image's, for softmax and sigmoid heads; so it answers an image and its mirror image alike. (A job
with it, served and evaluated: tests/job/model/test_hub.py.)"""

import keras
import numpy as np
import pytest

from keras_pipe_train.model.classifier import logits_of, probabilities_of
from tests.job.conftest import flipped


def classifier(activation: str) -> keras.Model:
    keras.utils.set_random_seed(3)
    images = keras.Input((6, 5, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu")(images)  # (not mirror-symmetric: its kernel is random)
    x = keras.layers.Flatten()(x)
    return keras.Model(images, keras.layers.Dense(3, activation=activation, name="classifier")(x))


@pytest.mark.parametrize("activation", ["softmax", "sigmoid"])
def test_the_logits_of_an_image_and_its_mirror_are_averaged_before_the_activation(activation):
    model = classifier(activation)
    images = np.random.default_rng(0).random((4, 6, 5, 3)).astype(np.float32)
    mirrored = images[:, :, ::-1].copy()
    plain = logits_of(model)
    np.testing.assert_allclose(np.asarray(logits_of(model, flip=True)(images)),
                               (np.asarray(plain(images)) + np.asarray(plain(mirrored))) / 2, rtol=1e-5, atol=1e-6)
    answered = np.asarray(probabilities_of(model, flip=True)(images))
    np.testing.assert_allclose(answered, flipped(model, images), rtol=1e-5, atol=1e-6)  # (the tests' own formula)
    np.testing.assert_allclose(answered, np.asarray(probabilities_of(model, flip=True)(mirrored)), rtol=1e-5,
                               atol=1e-6)  # (an image and its mirror: one answer)
    assert not np.allclose(np.asarray(probabilities_of(model)(images)), np.asarray(probabilities_of(model)(mirrored)),
                           atol=1e-4)  # (which the model alone does not give)
    np.testing.assert_allclose(np.asarray(probabilities_of(model)(images)), np.asarray(model(images)), rtol=1e-6)
