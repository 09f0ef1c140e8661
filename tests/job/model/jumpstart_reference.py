"""A pretrained model in JumpStart's layout, made here with random weights: what the TensorFlow
notebook's Estimator(model_uri=...) puts in the `model` channel.

JumpStart's artifact script saves `tf.saved_model.save(hub.load(<TF Hub feature-vector URL>),
<model_dir>/1, signatures=None)` and its model info beside it (train/keras_pipe_train/model/jumpstart.py
cites both). A TF Hub image feature vector is a reusable SavedModel: `__call__(images, training=False)`
on images in [0, 1], with `variables`, `trainable_variables` and `regularization_losses` attributes.
This builds one of those (a small convolutional network with BatchNorm: TF Hub's models have them,
and fine-tuning must train them), loads it, and saves it again as the artifact script does.

    python jumpstart_reference.py OUT.tar.gz IMAGE_SIZE [--signature] [--finetuned] [--regularized]
"""

from __future__ import annotations

import json
import sys
import tarfile
import tempfile
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf


class _HubModule(tf.__internal__.tracking.AutoTrackable):
    """TF Hub's reusable SavedModel API around a Keras network."""

    def __init__(self, network: keras.Model, regularized: bool = False):
        super().__init__()
        self.network = network
        self.variables = list(network.variables)
        self.trainable_variables = list(network.trainable_variables)
        kernel = network.trainable_variables[0]
        self.regularization_losses = [tf.function(lambda: 0.01 * tf.reduce_sum(kernel ** 2), input_signature=[])
                                      ] if regularized else []
        self.__call__ = tf.function(self._call)
        for training in (True, False):
            self.__call__.get_concrete_function(tf.TensorSpec([None, None, None, 3], tf.float32), training=training)

    def _call(self, images, training=False):
        return self.network(images, training=training)


def network(seed: int = 0) -> keras.Model:
    """Pretrained for a few seconds to tell six colours apart (as ImageNet's features would),
    on noisy photos of each in [0, 1], as TF Hub's models take them."""
    keras.utils.set_random_seed(seed)
    images = keras.Input((None, None, 3))
    x = images
    for filters in (16, 32):
        x = keras.layers.Conv2D(filters, 3, strides=2, padding="same")(x)
        x = keras.layers.BatchNormalization(momentum=0.9)(x)  # (statistics settled in the few steps)
        x = keras.layers.ReLU()(x)
    # (a wide last layer, as MobileNet's 1280 features: a new head learns fast on many of them)
    x = keras.layers.ReLU()(keras.layers.Conv2D(256, 1)(x))
    x = keras.layers.GlobalAveragePooling2D()(x)
    features = keras.Model(images, keras.layers.BatchNormalization(momentum=0.9)(x))  # (features of ~unit size)
    colors = np.array([(0.9, 0.1, 0.1), (0.1, 0.9, 0.1), (0.1, 0.1, 0.9), (0.9, 0.9, 0.1), (0.1, 0.9, 0.9),
                       (0.9, 0.1, 0.9)], np.float32)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(colors), 1536)
    photos = np.clip(colors[labels][:, None, None, :] + rng.uniform(-0.25, 0.25, (len(labels), 32, 32, 3)), 0, 1)
    pretraining = keras.Sequential([features, keras.layers.Dense(len(colors), activation="softmax")])
    pretraining.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    pretraining.fit(photos.astype(np.float32), labels, batch_size=64, epochs=3, verbose=0)
    return features


def make(archive: Path, image_size: int, signature: bool = False, finetuned: bool = False,
         regularized: bool = False) -> None:
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        module = _HubModule(network(), regularized)
        signatures = None
        if signature:  # (a TF1-style Hub model, used through a named signature and an output key)
            spec = tf.TensorSpec([None, None, None, 3], tf.float32, name="images")
            signatures = {"image_feature_vector": tf.function(
                lambda images: {"default": module.network(images, training=False)}).get_concrete_function(spec)}
        tf.saved_model.save(module, str(work / "hub"), signatures=signatures)
        loaded = tf.saved_model.load(str(work / "hub"))  # (JumpStart: hub.load, then saved again)
        tf.saved_model.save(loaded, str(work / "model" / "1"), signatures=loaded.signatures if signature else None)
        info = {"image_size": [image_size, image_size], "pixel_scaling_method": "normalize", "finetuned": finetuned,
                "signature": "image_feature_vector" if signature else None,
                "output_key": "default" if signature else None}
        (work / "model" / "__model_info__.json").write_text(json.dumps(info))
        with tarfile.open(archive, "w:gz") as tar:
            for path in sorted((work / "model").rglob("*")):
                tar.add(path, arcname=str(path.relative_to(work / "model")), recursive=False)


if __name__ == "__main__":
    make(Path(sys.argv[1]), int(sys.argv[2]), "--signature" in sys.argv, "--finetuned" in sys.argv,
         "--regularized" in sys.argv)
