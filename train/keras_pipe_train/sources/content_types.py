"""What the channels hold, read from their ContentType and RecordWrapperType as SageMaker's built-in
Image Classification algorithm (MXNet) reads them: a request in its dialect names no format of this
job's, and trains here unchanged (AWS's IC page, "Input/Output Interface"; docs/migration.md).

    train channel's ContentType          RecordWrapperType   what it holds            read as
    application/x-recordio               RecordIO (Pipe)     an augmented manifest:   attribute_names=
                                                             image, then label        source-ref,label
    application/x-recordio               None                im2rec's .rec files      record_format=recordio
    application/x-image, image/jpeg,     None                images, listed by the    record_format=lst
    image/png (application/jpeg)                             train_lst channel's .lst

A parameter `label-format=class-id` (or multi-hot, the default) in the ContentType says how a
multi-label job's labels are written: class ids ([0, 2]), or one 0/1 per class ([1, 0, 1]).

`from_channels` decides, for a request in the MXNet dialect whose own hyperparameters
(record_format, attribute_names) say nothing of the format, and returns the hyperparameters with
the decision in this job's names: the rest of the job reads them as if the request had said so.
The launcher checks a request without its channels (config.JobConfig.from_hyperparameters): what is
decided here is never something that check refuses. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json

from keras_pipe_train.settings import dialects
from keras_pipe_train.settings.channels import EXAMPLES, LST_OF, TRAIN, VALIDATION
from keras_pipe_train.settings.contract import ChannelConfig
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.settings.parsers import is_none, is_unset

RECORDIO = "application/x-recordio"
# the built-in's image content types (AWS's page); application/jpeg is what its high-level .lst
# notebook (Image-classification-lst-format-highlevel.ipynb) sends
IMAGE_TYPES = ("application/x-image", "image/jpeg", "image/png", "application/jpeg")
LABEL_FORMATS = {"multi-hot": "multi_hot", "class-id": "index"}  # the parameter's values, as this job names them
# the image and the label, in the order SageMaker streams a built-in job's AttributeNames: the
# built-in takes "image first, followed by label", whatever their names
MANIFEST_ATTRIBUTES = ("source-ref", "label")


@dataclasses.dataclass(frozen=True)
class ContentType:
    media_type: str  # lower case, without parameters
    label_format: str | None  # this job's name for the label-format parameter (None: not given)

    @classmethod
    def parse(cls, text: str, channel: str) -> ContentType:
        media_type, *parameters = (part.strip() for part in text.split(";"))
        values = {}
        for parameter in filter(None, parameters):
            key, _, value = parameter.partition("=")
            values[key.strip().lower()] = value.strip().strip('"').lower()
        given = values.get("label-format")
        if given is not None and given not in LABEL_FORMATS:
            raise UserError(f"channel {channel!r} has ContentType {text!r}: label-format must be multi-hot (one 0 or "
                            "1 per class, the default) or class-id (the class ids, as Ground Truth writes them)")
        return cls(media_type.lower(), LABEL_FORMATS.get(given))


@dataclasses.dataclass(frozen=True)
class Decision:
    hyperparameters: dict  # the request's, with the format decided added in this job's names
    note: str | None  # what the log says of it (None: nothing decided)


def from_channels(raw: dict, channels: dict[str, ChannelConfig]) -> Decision:
    """The request's hyperparameters with what its channels' content types say, as the built-in
    MXNet algorithm reads them (a request in its dialect): the format, when the request names none;
    a multi-label job's label format, when the train channel's ContentType gives label-format and
    the request does not."""
    if dialects.dialect_of(raw) != dialects.MXNET or TRAIN not in channels:
        return Decision(raw, None)
    decided, says = {}, None
    if is_none(raw.get("record_format")) and is_none(raw.get("attribute_names")):
        kinds = {role: _kind(role, channels) for role in EXAMPLES if role in channels}
        train, validation = kinds[TRAIN], kinds.get(VALIDATION)
        if train is not None and validation is not None and validation.hyperparameters != train.hyperparameters:
            raise UserError(f"channels train and validation hold different formats: train {train.says}, validation "
                            f"{validation.says}; the job reads one format for both, as the built-in does")
        if train is not None:
            decided, says = dict(train.hyperparameters), train.says
    content = ContentType.parse(channels[TRAIN].content_type or "", TRAIN)
    if content.label_format and is_none(raw.get("label_format")) and _multi_label(raw):
        decided["label_format"] = content.label_format
        says = says or channels[TRAIN].content_type
    if not decided:
        return Decision(raw, None)  # (no content type of the built-in's: this job's own TFRecords)
    shown = ", ".join(f"{name}={','.join(json.loads(value)) if name == 'attribute_names' else value}"
                      for name, value in decided.items())
    return Decision({**raw, **decided}, f"channel train: {says}; read as {shown} (the built-in MXNet algorithm's "
                                        "formats, by the channels' ContentType)")


@dataclasses.dataclass(frozen=True)
class _Kind:
    says: str  # what the content type says the channel holds, for the log
    hyperparameters: dict  # what the job is then told


def _kind(role: str, channels: dict[str, ChannelConfig]) -> _Kind | None:
    """What channel `role` (train, validation) holds, by its ContentType (None: none of the built-in's)."""
    channel = channels[role]
    if not channel.content_type:
        return None
    content = ContentType.parse(channel.content_type, channel.name)
    if content.media_type == RECORDIO and channel.record_wrapper == "RecordIO":
        return _Kind(f"{RECORDIO}, RecordIO-wrapped: an augmented manifest, image then label",
                     {"attribute_names": json.dumps(list(MANIFEST_ATTRIBUTES))})
    if content.media_type == RECORDIO:
        return _Kind(f"{RECORDIO}: MXNet RecordIO image files (im2rec's .rec)", {"record_format": "recordio"})
    if content.media_type in IMAGE_TYPES:
        lst = LST_OF[role]
        if lst not in channels:
            raise UserError(f"channel {channel.name!r} has ContentType {content.media_type}: images, which the "
                            f"built-in MXNet algorithm reads as a .lst file lists them, and so does this job: add a "
                            f"{lst!r} channel holding that .lst file (index, label, the image's path in channel "
                            f"{channel.name!r}: tab-separated, as im2rec --list writes it). For images in one folder "
                            "per class, set hyperparameter record_format=class_folders instead")
        return _Kind(f"{content.media_type}: images, listed by channel {lst}'s .lst",
                     {"record_format": "lst"})
    return None


def _multi_label(raw: dict) -> bool:
    from keras_pipe_train.settings.config import HYPERPARAMETERS

    definition = HYPERPARAMETERS["multi_label"]
    given = raw.get("multi_label")
    return definition.parse("multi_label", definition.default if is_unset(given) else given)
