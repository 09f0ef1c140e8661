"""The records the job reads: tf.train.Example with an encoded image and an int64 label, under
the feature names the job's hyperparameters default to (so data prepared by `launch prepare`
trains with no feature-name hyperparameters)."""

from __future__ import annotations

import tensorflow as tf

from train.config import HYPERPARAMETERS

IMAGE_FEATURE = HYPERPARAMETERS["image_feature"].default
LABEL_FEATURE = HYPERPARAMETERS["label_feature"].default


def encode_example(image: bytes, label: int, *, image_feature: str = IMAGE_FEATURE,
                   label_feature: str = LABEL_FEATURE) -> bytes:
    """A serialized tf.train.Example holding JPEG/PNG bytes and a class label."""
    return tf.train.Example(features=tf.train.Features(feature={
        image_feature: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        label_feature: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })).SerializeToString()
