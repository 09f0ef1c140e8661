"""A training job's channels: where each one's objects come from (a local folder or file, or an
s3://bucket/prefix), and SageMaker's options for it (input mode, record wrapper, compression,
distribution, shuffle seed), checked as SageMaker checks them. The command line describes them
with options (cli.arguments); `keras-pipe local` lays them out, `submit` and `tune` request them.

The `pretrained` channel (one weights file) and the `model` channel (a previous job's model.tar.gz,
for incremental training) hold what every host needs whole: the job-wide options do not apply to
them, they are in File mode, FullyReplicated, neither compressed nor wrapped (unless overridden).
"""

from __future__ import annotations

import dataclasses
import json
import re

from keras_pipe_launch.common import container_config
from keras_pipe_launch.common.usage import UsageError
from keras_pipe_train.settings import channels as job_channels
from keras_pipe_train.settings.contract import INPUT_MODES, RECORD_WRAPPERS

COMPRESSIONS = ("None", "Gzip")
DATA_TYPES = ("S3Prefix", "AugmentedManifestFile")
MANIFEST_CHANNELS = job_channels.EXAMPLES  # what --attribute-names makes augmented manifests
DISTRIBUTIONS = ("FullyReplicated", "ShardedByS3Key")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # SageMaker's ChannelName pattern


class ChannelError(UsageError):
    """A channel described wrongly: the message says which and how to fix it."""


@dataclasses.dataclass(frozen=True)
class ChannelSpec:
    name: str
    source: str
    input_mode: str = "Pipe"
    record_wrapper: str = "None"
    compression: str = "None"
    distribution: str = "FullyReplicated"
    shuffle_seed: int | None = None
    content_type: str | None = None
    # AugmentedManifestFile: `source` is one JSON Lines file (Ground Truth's output manifest), and
    # SageMaker streams the listed attributes of each line, one RecordIO record each
    data_type: str = "S3Prefix"
    attribute_names: tuple[str, ...] | None = None

    def __post_init__(self):
        # SageMaker's pattern lets '.' and '..' through: as folders under input/data they would be
        # input/data itself and input/, where the job's configuration lives
        if not _NAME.match(self.name) or self.name in (".", ".."):
            raise ChannelError(f"channel name {self.name!r}: use 1-64 letters, digits, '.', '_' or '-' "
                               "(and not '.' or '..')")
        for field, value, allowed in (("input-mode", self.input_mode, INPUT_MODES),
                                      ("record-wrapper", self.record_wrapper, RECORD_WRAPPERS),
                                      ("compression", self.compression, COMPRESSIONS),
                                      ("distribution", self.distribution, DISTRIBUTIONS)):
            if value not in allowed:
                raise ChannelError(f"channel {self.name}: --{field} {value!r} is not one of {', '.join(allowed)}")
        if self.data_type not in DATA_TYPES:
            raise ChannelError(f"channel {self.name}: S3DataType {self.data_type!r} is not one of "
                               f"{', '.join(DATA_TYPES)}")
        if self.data_type == "AugmentedManifestFile":
            if self.input_mode != "Pipe":
                raise ChannelError(f"channel {self.name}: an augmented manifest streams in Pipe mode only (SageMaker "
                                   f"refuses it in {self.input_mode} mode)")
            if self.record_wrapper != "RecordIO":
                raise ChannelError(f"channel {self.name}: an augmented manifest needs --record-wrapper RecordIO: with "
                                   "None, SageMaker streams each image and its label run together, with nothing to "
                                   "tell where one ends")
            if self.compression != "None":
                raise ChannelError(f"channel {self.name}: --compression {self.compression} is not for an augmented "
                                   "manifest (its lines point to the images; nothing says how SageMaker would "
                                   "decompress them)")
            if not self.attribute_names:
                raise ChannelError(f"channel {self.name}: an augmented manifest needs its attribute names "
                                   "(--attribute-names source-ref,label)")
        elif self.attribute_names:
            raise ChannelError(f"channel {self.name}: attribute names are for an augmented manifest channel only")
        if self.input_mode != "Pipe" and self.compression != "None":
            raise ChannelError(f"channel {self.name}: --compression Gzip works in Pipe mode only "
                               "(SageMaker decompresses while streaming)")
        if self.input_mode != "Pipe" and self.record_wrapper != "None":
            raise ChannelError(f"channel {self.name}: --record-wrapper RecordIO works in Pipe mode only")
        if self.shuffle_seed is not None and self.shuffle_seed < 0:
            raise ChannelError(f"channel {self.name}: --shuffle-seed must be >= 0")

    @property
    def is_s3(self) -> bool:
        return self.source.startswith("s3://")

    def input_data_config(self) -> dict:
        """This channel's entry in inputdataconfig.json, as SageMaker writes it in the container."""
        return container_config.channel_entry(self.input_mode, distribution=self.distribution,
                                              record_wrapper=self.record_wrapper, compression=self.compression,
                                              content_type=self.content_type)

    @property
    def is_manifest(self) -> bool:
        return self.data_type == "AugmentedManifestFile"


def channel_hyperparameters(channels: list[ChannelSpec], values: dict[str, str]) -> dict[str, str]:
    """The job's hyperparameters with attribute_names set from the manifest channels' AttributeNames
    (the job reads them there: inputdataconfig.json does not say), so that the two cannot drift;
    and a record_format the channels cannot carry refused here rather than by the job once started."""
    _check_record_format(channels, values)
    manifests = [c for c in channels if c.is_manifest]
    names = {c.attribute_names for c in manifests}
    if len(names) > 1:
        raise ChannelError("the manifest channels list different attribute names; the job reads one list for all")
    given = values.get("attribute_names")
    if not manifests:
        if given is not None:
            raise ChannelError("--hp attribute_names: give --attribute-names instead, which also makes the train and "
                               "validation channels augmented manifests")
        return values
    if [c.name for c in channels if c.name in MANIFEST_CHANNELS and not c.is_manifest]:
        raise ChannelError("the train and validation channels must both be augmented manifests, or neither")
    listed = json.dumps(list(manifests[0].attribute_names))
    if given is not None and _attribute_names(given) != manifests[0].attribute_names:
        raise ChannelError(f"--hp attribute_names={given} differs from the channels' attribute names ({listed}): leave "
                           "it out, --attribute-names sets it")
    return {**values, "attribute_names": listed}


def _attribute_names(value: str) -> tuple[str, ...] | None:
    """--hp attribute_names as the job reads it (None: a value it cannot read, which its check says)."""
    from keras_pipe_train.settings.config import HYPERPARAMETERS
    from keras_pipe_train.settings.errors import UserError

    try:
        return HYPERPARAMETERS["attribute_names"].parse("attribute_names", value)
    except UserError:
        return None


def _check_record_format(channels: list[ChannelSpec], values: dict[str, str]) -> None:
    from keras_pipe_train.settings import dialects
    from keras_pipe_train.settings.config import HYPERPARAMETERS
    from keras_pipe_train.settings.errors import UserError

    definition = HYPERPARAMETERS["record_format"]
    try:  # (as the job reads it: a built-in TensorFlow algorithm's request is class folders)
        read = dialects.translate(values).hyperparameters
        record_format = definition.parse("record_format", read.get("record_format", definition.default))
    except UserError:
        return  # (the hyperparameters' own check says what is wrong)
    for c in channels:
        if c.name not in MANIFEST_CHANNELS:
            continue
        if record_format == "class_folders" and c.input_mode == "Pipe":
            said = ("--hp record_format=class_folders" if "record_format" in values else
                    "the request is in the built-in TensorFlow algorithm's dialect, which reads class folders")
            raise ChannelError(f"channel {c.name} is in Pipe mode, but {said}: a Pipe stream does not say which folder "
                               "an image came from. Give --input-mode File (or FastFile)")
        if record_format == "recordio" and c.record_wrapper != "None":
            raise ChannelError(f"channel {c.name}: --record-wrapper {c.record_wrapper} with --hp "
                               "record_format=recordio: the .rec files are RecordIO already (leave the wrapper None)")


WHOLE_FILE_DEFAULTS = {"input_mode": "File", "distribution": "FullyReplicated", "compression": "None",
                       "record_wrapper": "None", "shuffle_seed": None}
WHOLE_FILE_CHANNELS = job_channels.WHOLE_FILES  # (they get WHOLE_FILE_DEFAULTS)


def check_names_apart(specs: list[ChannelSpec]) -> None:
    """A Pipe channel's FIFOs are input/data/<name>_0, _1, ...: no other channel may be called so."""
    for pipe in (s for s in specs if s.input_mode == "Pipe"):
        for other in specs:
            if re.fullmatch(rf"{re.escape(pipe.name)}_\d+", other.name):
                raise ChannelError(f"channel {other.name} has the name of a FIFO of Pipe channel {pipe.name} "
                                   f"(input/data/{pipe.name}_0, _1, ...): rename one of them")
