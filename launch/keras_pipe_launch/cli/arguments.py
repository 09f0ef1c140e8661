"""Options several commands parse the same way: KEY=VALUE lists are common.usage's; here, a
training job's channels (`keras-pipe local`, `submit`, `tune`) and durations.

    --train SOURCE --validation SOURCE --pretrained SOURCE --model SOURCE --channel NAME=SOURCE
    --input-mode Pipe --record-wrapper None --compression None --distribution FullyReplicated
    --shuffle-seed N          (these apply to every channel ...)
    --channel-option validation:input-mode=File   (... unless overridden for one)

SOURCE is a local folder or file, or an s3://bucket/prefix. The `pretrained` and `model` channels
get their own defaults (common.channels.WHOLE_FILE_DEFAULTS); --channel-option can still change them.
"""

from __future__ import annotations

import argparse
import json
import re

from keras_pipe_launch.common.channels import (
    COMPRESSIONS,
    DISTRIBUTIONS,
    MANIFEST_CHANNELS,
    WHOLE_FILE_CHANNELS,
    WHOLE_FILE_DEFAULTS,
    ChannelError,
    ChannelSpec,
    check_names_apart,
)
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import key_values
from keras_pipe_train.settings.channels import MODEL, PRETRAINED, TRAIN, VALIDATION
from keras_pipe_train.settings.contract import INPUT_MODES, RECORD_WRAPPERS

_OPTIONS = {"input-mode": "input_mode", "record-wrapper": "record_wrapper", "compression": "compression",
            "distribution": "distribution", "shuffle-seed": "shuffle_seed", "content-type": "content_type"}


# the job's channels a user gives by an option of their own (settings/channels.py), as the user has them
CHANNEL_OPTIONS = {TRAIN: "TFRecords", VALIDATION: "TFRecords",
                   PRETRAINED: "a backbone weights file, or a keras-hub preset: its folder or a .tar.gz of it",
                   MODEL: "a previous job's model.tar.gz, continued: incremental training"}


def add_channel_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("channels")
    for name, what in CHANNEL_OPTIONS.items():
        group.add_argument(f"--{name}", metavar="SOURCE", help=f"the {name} channel ({what}): a local path or "
                                                                "s3://bucket/prefix")
    group.add_argument("--channel", action="append", default=[], metavar="NAME=SOURCE", help="any other channel")
    group.add_argument("--input-mode", default="Pipe", choices=INPUT_MODES, help="for every channel (default: Pipe)")
    group.add_argument("--record-wrapper", default="None", choices=RECORD_WRAPPERS)
    group.add_argument("--compression", default="None", choices=COMPRESSIONS)
    group.add_argument("--distribution", default="FullyReplicated", choices=DISTRIBUTIONS)
    group.add_argument("--shuffle-seed", type=int, default=None,
                       help="shuffle the S3 keys of every pass with this seed")
    group.add_argument("--attribute-names", default=None, metavar="NAMES",
                       help="the train and validation sources are augmented manifests (Ground Truth's output, JSON "
                            "Lines), streamed in Pipe mode with these AttributeNames, e.g. source-ref,label or "
                            "source-ref,label,label-metadata (the image, its label, optionally its metadata)")
    group.add_argument("--channel-option", action="append", default=[], metavar="NAME:OPTION=VALUE",
                       help="override one option for one channel, e.g. validation:input-mode=File")


def channels_from(args: argparse.Namespace) -> list[ChannelSpec]:
    sources = {name: getattr(args, name) for name in CHANNEL_OPTIONS if getattr(args, name)}
    for name, source in key_values(args.channel, "--channel", "NAME=SOURCE").items():
        if not source:
            raise ChannelError(f"--channel {shown(name)}=: expected NAME=SOURCE")
        if name in sources:
            raise ChannelError(f"channel {name} is given twice (--{name} and --channel {name}=...)")
        sources[name] = source
    overrides: dict[str, dict] = {name: dict(WHOLE_FILE_DEFAULTS) if name in WHOLE_FILE_CHANNELS else {}
                                  for name in sources}
    for item in args.channel_option:
        match = re.match(r"^([^:]+):([a-z-]+)=(.*)$", item)
        if not match or match.group(2) not in _OPTIONS:
            raise ChannelError(f"--channel-option {item!r}: expected NAME:OPTION=VALUE with OPTION one of "
                               f"{', '.join(_OPTIONS)}")
        name, option, value = match.groups()
        if name not in sources:
            raise ChannelError(f"--channel-option {item!r}: there is no channel {shown(name)} "
                               f"(channels: {shown(', '.join(sources)) or 'none'})")
        overrides[name][_OPTIONS[option]] = value
    attribute_names = _attribute_names(getattr(args, "attribute_names", None))
    specs = []
    for name, source in sources.items():
        values = {"input_mode": args.input_mode, "record_wrapper": args.record_wrapper,
                  "compression": args.compression, "distribution": args.distribution,
                  "shuffle_seed": args.shuffle_seed, **overrides[name]}
        try:
            if values["shuffle_seed"] is not None:
                values["shuffle_seed"] = int(values["shuffle_seed"])
        except ValueError:
            raise ChannelError(
                f"channel {shown(name)}: shuffle-seed must be an integer, got {values['shuffle_seed']!r}") from None
        if attribute_names and name in MANIFEST_CHANNELS:  # (RecordIO, unless --channel-option says otherwise)
            values = {**values, "data_type": "AugmentedManifestFile", "attribute_names": attribute_names,
                      "record_wrapper": overrides[name].get("record_wrapper", "RecordIO")}
        specs.append(ChannelSpec(name=name, source=source, **values))
    if not specs:
        raise ChannelError("no channels: give at least --train SOURCE")
    check_names_apart(specs)
    return specs


def _attribute_names(text: str | None) -> tuple[str, ...] | None:
    """--attribute-names: comma-separated, or a JSON list (a name may hold a comma)."""
    if text is None:
        return None
    try:
        names = json.loads(text) if text.strip().startswith("[") else [n.strip() for n in text.split(",")]
    except ValueError:
        names = None
    if not isinstance(names, list) or not names or any(not isinstance(n, str) or not n for n in names):
        raise ChannelError(f"--attribute-names {shown(text)}: expected names separated by commas, e.g. "
                           "source-ref,label, or a JSON list")
    if len(names) > 16 or any(len(n) > 256 for n in names):  # (S3DataSource.AttributeNames' limits)
        raise ChannelError(f"--attribute-names {shown(text)}: SageMaker takes at most 16 names of at most 256 "
                           "characters")
    return tuple(names)


_DURATION = re.compile(r"^(\d+)([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

def duration(text: str) -> int:
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds, or a number with s, m, h or d (e.g. 6h)")
    return int(match.group(1)) * _UNITS[match.group(2)]
