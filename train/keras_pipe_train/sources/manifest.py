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
                        is checked against hyperparameter class_names, or without it names the
                        classes in the model (ClassNames)

The documentation shows a value streamed as its JSON text; a bare string (cat, 3) is read too.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from tensorflow.core.example import example_pb2, feature_pb2

from keras_pipe_train.settings.config import JobConfig, manifest_roles
from keras_pipe_train.settings.errors import DataError
from keras_pipe_train.sources import manifest_labels as labels_of
from pipemode.errors import UnusableRecordError
from pipemode.recordio import Line

log = logging.getLogger(__name__)


def names_given(config: JobConfig) -> bool:
    """Whether hyperparameter class_names names the classes (else they are 0, 1, ...)."""
    return config.class_names != tuple(str(i) for i in range(config.num_classes))


class ClassNames:
    """The names the manifest's metadata gives the classes (class-name; class-map for multi-label),
    gathered from every line the job reads, each with the line that gave it first: the model's
    class names when hyperparameter class_names is not set. A line that calls a class otherwise
    than an earlier one ends the pass (a data error naming both lines): nothing says which of the
    two is right, so neither is skipped."""

    def __init__(self):
        self._lock = threading.Lock()
        self.named: dict[int, tuple[str, str]] = {}  # class id -> (its name, the line that first gave it)

    def note(self, names: dict[int, str], line: Line, attribute: str) -> None:
        with self._lock:
            for label, name in sorted(names.items()):
                first, where = self.named.setdefault(label, (name, str(line)))
                if first != name:
                    raise UnusableRecordError(line.where, line.first, line.offset, (
                        f"{line.in_pass}: its {attribute} calls class {label} {name!r}, but {where} calls it "
                        f"{first!r}: {ONE_NAME}"))

    def to_text(self, host: str) -> str:
        return json.dumps({"host": host, "named": {str(label): entry for label, entry in sorted(self.named.items())}})


ONE_NAME = "a class has one name (hyperparameter class_names names the classes, if the manifest cannot)"


def class_names(config: JobConfig, seen: ClassNames, host: str, gather: Callable[[str], list[str]]
                ) -> tuple[str, ...]:
    """The model's class names, where they come from said in the log: hyperparameter class_names;
    else, for a manifest whose label metadata is listed, the names its lines gave on every host
    (`gather`: every host's text, in host order, the same list on each; a class that two hosts'
    lines call otherwise is a DataError naming both lines, on every host alike); else 0, 1, ...
    With several hosts, each calls it at the same point (a collective)."""
    if not config.attribute_names:  # (not a manifest: the names are settled already)
        return config.class_names
    attribute = next((name for name in config.attribute_names if name.endswith("-metadata")), None)
    if names_given(config) or attribute is None:
        log.info("class names: %s (%s)", _listed(config.class_names), "hyperparameter class_names"
                 if names_given(config) else "numbers: hyperparameter class_names is not set, and attribute_names "
                 "lists no -metadata to name them")
        return config.class_names
    hosts = [json.loads(text) for text in gather(seen.to_text(host))]
    named: dict[int, tuple[str, str]] = {}
    for each in hosts:
        on = f" on {each['host']}" if len(hosts) > 1 else ""
        for label, (name, where) in sorted((int(label), entry) for label, entry in each["named"].items()):
            first, first_where = named.setdefault(label, (name, where + on))
            if first != name:
                raise DataError(f"{where}{on} calls class {label} {name!r} in its {attribute}, but {first_where} "
                                f"calls it {first!r}: {ONE_NAME}")
    names = tuple(named[i][0] if i in named else str(i) for i in range(config.num_classes))
    unnamed = [str(i) for i in range(config.num_classes) if i not in named]
    if not named:
        log.warning("class names: %s (numbers): no manifest line named a class in its %s, and hyperparameter "
                    "class_names is not set", _listed(names), attribute)
    else:
        log.info("class names: %s, from the manifest lines' %s (class-name, class-map)%s", _listed(names), attribute,
                 f"; no line named class{'es' if len(unnamed) > 1 else ''} {', '.join(unnamed[:10])}, called so"
                 if unnamed else "")
    return names


def _listed(names: tuple[str, ...]) -> str:
    return ", ".join(names[:20]) + (f", ... ({len(names)} classes)" if len(names) > 20 else "")


def combiner(config: JobConfig, seen: ClassNames | None = None) -> Callable[[list[bytes]], bytes]:
    """combine(payloads of one manifest line, where it is) -> the serialized tf.train.Example for
    it, under the job's image and label features; raises ValueError saying why the line cannot be
    used. Without hyperparameter class_names, the names the line's metadata gives go to `seen`."""
    roles = manifest_roles(config.attribute_names)
    names = config.attribute_names
    named = names_given(config)

    def combine(payloads: list[bytes], line: Line | None = None) -> bytes:
        label_name = names[roles.label]
        value = _value(payloads[roles.label], label_name)
        labels = (labels_of.multi_hot(value, label_name, config.num_classes) if config.label_format == "multi_hot"
                  else labels_of.class_ids(value, label_name, config.multi_label))
        if roles.metadata is not None:
            names_in = labels_of.metadata_names(_value(payloads[roles.metadata], names[roles.metadata]),
                                                names[roles.metadata], labels)
            names_in = {label: name for label, name in names_in.items() if 0 <= label < config.num_classes}
            if named:
                for label, name in names_in.items():
                    if config.class_names[label] != name:
                        raise ValueError(f"its {names[roles.metadata]} calls class {label} {name!r}, but "
                                         f"hyperparameter class_names calls it {config.class_names[label]!r}")
            elif seen is not None:
                seen.note(names_in, line, names[roles.metadata])
        feature = {config.image_feature: feature_pb2.Feature(
            bytes_list=feature_pb2.BytesList(value=[payloads[roles.image]]))}
        if config.label_format == "multi_hot":
            feature[config.label_feature] = feature_pb2.Feature(float_list=feature_pb2.FloatList(value=labels))
        else:
            ids = labels if isinstance(labels, list) else [labels]
            feature[config.label_feature] = feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=ids))
        return example_pb2.Example(features=feature_pb2.Features(feature=feature)).SerializeToString(
            deterministic=True)

    combine.wants_line = True  # (pipemode's groups() then says where each line is)
    return combine


def _value(payload: bytes, name: str):
    """An attribute's value: its JSON, or the text itself when it is not JSON."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"attribute {name!r} is not text (it starts with {payload[:16]!r}): is attribute_names "
                         "in the order of the channel's AttributeNames?") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"attribute {name!r} is JSON nested too deeply to read") from None
    except ValueError:
        return text.strip()
    if isinstance(value, str) and value.strip().startswith("["):
        # a list of labels written as a string, as AWS's IC page writes them ("class": "[1, 0, 1]")
        try:
            listed = json.loads(value)
        except (ValueError, RecursionError):
            return value
        return listed if isinstance(listed, list) else value
    return value
