"""Augmented manifests (Ground Truth's output) in Pipe mode: each line's attributes, as SageMaker
streams them, made into the tf.train.Example the rest of the pipeline reads.

For a channel with S3DataType AugmentedManifestFile and RecordWrapperType RecordIO, SageMaker
streams, for every line of the manifest, one RecordIO record per name in the channel's
AttributeNames, in that order: for a name ending in "-ref", the bytes of the S3 object it points
to; for any other, the attribute's value. inputdataconfig.json does not say which channel is a
manifest, nor which attributes it lists (it holds TrainingInputMode, S3DistributionType,
RecordWrapperType and ContentType only), so the job is told by hyperparameter `attribute_names`:
the launcher sends the same list as the channels' AttributeNames, so the two cannot drift.

A line's attributes, by name (config.manifest_roles):
    <name>-ref          the image (one)
    <label>             the label: a class id (3, "3"), or for multi_label a list of them
                        ([0, 2], Ground Truth's), or label_format=multi_hot one 0/1 per class
                        ([1, 0, 1], the built-in MXNet algorithm's)
    <label>-metadata    optional: Ground Truth's metadata, whose class-name (class-map for multi-label)
                        is checked against hyperparameter class_names

The documentation shows a value streamed as its JSON text; a bare string (cat, 3) is read too.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from tensorflow.core.example import example_pb2, feature_pb2

from keras_pipe_train import manifest_labels as labels_of
from keras_pipe_train.config import JobConfig, manifest_roles

log = logging.getLogger(__name__)


def combiner(config: JobConfig) -> Callable[[list[bytes]], bytes]:
    """combine(payloads of one manifest line) -> the serialized tf.train.Example for it, under
    the job's image and label features; raises ValueError saying why the line cannot be used."""
    roles = manifest_roles(config.attribute_names)
    names = config.attribute_names
    named = config.class_names != tuple(str(i) for i in range(config.num_classes))
    unnamed_warning = threading.Event()

    def combine(payloads: list[bytes]) -> bytes:
        label_name = names[roles.label]
        value = _value(payloads[roles.label], label_name)
        labels = (labels_of.multi_hot(value, label_name, config.num_classes) if config.label_format == "multi_hot"
                  else labels_of.class_ids(value, label_name, config.multi_label))
        if roles.metadata is not None:
            names_in = labels_of.metadata_names(_value(payloads[roles.metadata], names[roles.metadata]),
                                                names[roles.metadata], labels)
            if named:
                for label, name in names_in.items():
                    if 0 <= label < config.num_classes and config.class_names[label] != name:
                        raise ValueError(f"its {names[roles.metadata]} calls class {label} {name!r}, but "
                                         f"hyperparameter class_names calls it {config.class_names[label]!r}")
            elif names_in and not unnamed_warning.is_set():
                unnamed_warning.set()
                log.warning("the manifest names the classes (%s in its %s) but hyperparameter class_names is not "
                            "set: the model will call them 0 to %d. Set class_names to name them in the model",
                            ", ".join(f"{k}: {v!r}" for k, v in sorted(names_in.items())[:5]),
                            names[roles.metadata], config.num_classes - 1)
        feature = {config.image_feature: feature_pb2.Feature(
            bytes_list=feature_pb2.BytesList(value=[payloads[roles.image]]))}
        if config.label_format == "multi_hot":
            feature[config.label_feature] = feature_pb2.Feature(float_list=feature_pb2.FloatList(value=labels))
        else:
            ids = labels if isinstance(labels, list) else [labels]
            feature[config.label_feature] = feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=ids))
        return example_pb2.Example(features=feature_pb2.Features(feature=feature)).SerializeToString(
            deterministic=True)

    return combine


def _value(payload: bytes, name: str):
    """An attribute's value: its JSON, or the text itself when it is not JSON."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"attribute {name!r} is not text (it starts with {payload[:16]!r}): is attribute_names "
                         "in the order of the channel's AttributeNames?") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"attribute {name!r} is JSON nested too deeply to read") from None
    except ValueError:
        return text.strip()
