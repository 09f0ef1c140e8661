"""The records the job reads: tf.train.Example with an encoded image and an int64 label, under
the feature names the job's hyperparameters default to (so data prepared by `keras-pipe prepare`
trains with no feature-name hyperparameters), and the check each record passes before use."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.example import example_pb2

from keras_pipe_train.settings.config import HYPERPARAMETERS
from keras_pipe_train.sources import images
from pipemode.tfrecord import MAX_RECORD_BYTES

IMAGE_FEATURE = HYPERPARAMETERS["image_feature"].default
LABEL_FEATURE = HYPERPARAMETERS["label_feature"].default


# Where an image came from, when its Example says (optional: the job trains without it): an
# s3:// URI, or a path under the folder it was read from. `keras-pipe prepare` writes it, and the
# job reads it from class folders and .lst files; the label check names its suspects by it (and
# makes a Ground Truth manifest of those in S3).
SOURCE_FEATURE = "image/source"


def encode_example(image: bytes, label: int | Sequence[int] | Sequence[float], *, image_feature: str = IMAGE_FEATURE,
                   label_feature: str = LABEL_FEATURE, multi_hot: bool = False, source: str | None = None) -> bytes:
    """A serialized tf.train.Example holding JPEG/PNG bytes and a class label, or a multi-label
    image's class ids (any number of them, in one int64 list: the job's label_format=index), or
    with `multi_hot` its one value per class (a float list: label_format=multi_hot); with `source`,
    where the image came from (SOURCE_FEATURE)."""
    labels = [label] if isinstance(label, int) else list(label)
    values = (tf.train.Feature(float_list=tf.train.FloatList(value=labels)) if multi_hot
              else tf.train.Feature(int64_list=tf.train.Int64List(value=labels)))
    feature = {image_feature: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])), label_feature: values}
    if source is not None:
        # (a file name that is not UTF-8, which Python holds with surrogates: its own bytes)
        named = source.encode("utf-8", "surrogateescape")
        feature[SOURCE_FEATURE] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[named]))
    # (map order fixed: the same bytes in every process)
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


def max_record_bytes(max_pixels: int) -> int:
    """The longest record the job can use: an Example holding an image of at most max_pixels
    pixels, which no format the job reads stores in more than 8 bytes a pixel (16-bit RGBA PNG;
    JPEGs, and photos generally, take far less), plus room for the Example's other features. A
    damaged length beyond it is corruption at once, where the reader's default (2 GiB, a protobuf's
    limit) would have it read and hold up to 2 GiB first."""
    return min(MAX_RECORD_BYTES, 8 * max_pixels + (1 << 20))


def record_check(image_feature: str, label_feature: str, num_classes: int, max_pixels: int, *,
                 multi_label: bool = False, label_format: str = "index") -> Callable[[bytes], str | None]:
    """The reader's record_check for the job: why a record cannot be trained on, or None.

    Run on every record as it is read, before any TensorFlow op sees it, so that a bad record is
    an error naming its channel, file or FIFO, number and byte offset (or is skipped and counted
    under max_corrupted_records_to_skip) rather than a failure somewhere inside a batch. It parses
    the record, then reads the image's header (its cost per record: docs/speed.md, Figures behind
    the code's choices: The record check).
    """
    label_problem = _multi_label_problem if multi_label else _single_label_problem

    def check(record: bytes) -> str | None:
        try:
            features = example_pb2.Example.FromString(record).features.feature
        except DecodeError:
            return f"not a tf.train.Example (it starts with {record[:16]!r})"
        if image_feature not in features or len(features[image_feature].bytes_list.value) != 1:
            return _missing(features, image_feature, "one bytes value (the encoded image)")
        problem = label_problem(features, label_feature, num_classes, label_format)
        if problem:
            return problem
        problem = images.problem(features[image_feature].bytes_list.value[0], max_pixels)
        return f"{image_feature} {problem}" if problem else None

    return check


def _single_label_problem(features, name: str, num_classes: int, label_format: str) -> str | None:
    if name not in features or len(features[name].int64_list.value) != 1:
        return _missing(features, name, "one int64 value (the class label)")
    label = features[name].int64_list.value[0]
    if not 0 <= label < num_classes:
        return (f"label {label} ({name}) is out of range: the job trains labels 0 to {num_classes - 1} "
                f"(num_classes={num_classes})")
    return None


def _multi_label_problem(features, name: str, num_classes: int, label_format: str) -> str | None:
    """multi_label: class ids (label_format=index; none is allowed: an image of none of the
    classes) or one value per class (multi_hot), each kind under its own list type."""
    if name not in features:
        return _missing(features, name, "the image's class ids (an int64 list)" if label_format == "index"
                        else f"{num_classes} float values, one per class (multi_hot)")
    kind = features[name].WhichOneof("kind")
    if label_format == "index":
        if kind == "float_list":
            return (f"feature {name!r} holds {len(features[name].float_list.value)} float values, not class ids: "
                    "for one value per class, set hyperparameter label_format=multi_hot")
        if kind not in ("int64_list", None):  # (None: an empty feature, an image of no class)
            return f"feature {name!r} holds bytes, not class ids (an int64 list)"
        ids = list(features[name].int64_list.value)
        wrong = [i for i in ids if not 0 <= i < num_classes]
        if wrong:
            return (f"label {wrong[0]} ({name}) is out of range: the job trains labels 0 to {num_classes - 1} "
                    f"(num_classes={num_classes})")
        if len(set(ids)) < len(ids):
            return f"feature {name!r} lists a class id twice ({ids[:20]})"
        return None
    values = list(features[name].float_list.value)
    if kind != "float_list" or len(values) != num_classes:
        held = {"int64_list": "int64 values", "bytes_list": "bytes values"}.get(kind, "float values")
        count = len(getattr(features[name], kind).value) if kind else 0
        return (f"feature {name!r} must hold {num_classes} float values, one per class (label_format=multi_hot); it "
                f"holds {count} {held}" + (": for class ids, set label_format=index" if kind == "int64_list" else ""))
    if any(not 0.0 <= v <= 1.0 for v in values):
        return f"feature {name!r} holds a value outside [0, 1] ({[v for v in values if not 0 <= v <= 1][0]})"
    return None


def _missing(features, name: str, what: str) -> str:
    present = ", ".join(sorted(features)) or "no features"
    return (f"feature {name!r} must hold {what}; the record has: {present}. Set hyperparameters image_feature "
            "and label_feature to the names your TFRecords use")
