"""Channels of a training job, as the user describes them to `keras-pipe local` and `keras-pipe submit`.

    --train SOURCE --validation SOURCE --pretrained SOURCE --channel NAME=SOURCE
    --input-mode Pipe --record-wrapper None --compression None --distribution FullyReplicated
    --shuffle-seed N          (these apply to every channel ...)
    --channel-option validation:input-mode=File   (... unless overridden for one)

SOURCE is a local folder or file, or an s3://bucket/prefix. The `pretrained` channel holds one
weights file that every host needs: the job-wide options do not apply to it, it is in File mode,
FullyReplicated, neither compressed nor wrapped (--channel-option can still change that).
"""

from __future__ import annotations

import argparse
import dataclasses
import re

from keras_pipe_launch import container_config
from keras_pipe_launch.cli import UsageError, key_values
from keras_pipe_train.contract import INPUT_MODES, RECORD_WRAPPERS

COMPRESSIONS = ("None", "Gzip")
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


PRETRAINED_DEFAULTS = {"input_mode": "File", "distribution": "FullyReplicated", "compression": "None",
                       "record_wrapper": "None", "shuffle_seed": None}
_OPTIONS = {"input-mode": "input_mode", "record-wrapper": "record_wrapper", "compression": "compression",
            "distribution": "distribution", "shuffle-seed": "shuffle_seed", "content-type": "content_type"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("channels")
    for name in ("train", "validation", "pretrained"):
        group.add_argument(f"--{name}", metavar="SOURCE", help=f"the {name} channel: a local path or s3://bucket/prefix")
    group.add_argument("--channel", action="append", default=[], metavar="NAME=SOURCE", help="any other channel")
    group.add_argument("--input-mode", default="Pipe", choices=INPUT_MODES, help="for every channel (default: Pipe)")
    group.add_argument("--record-wrapper", default="None", choices=RECORD_WRAPPERS)
    group.add_argument("--compression", default="None", choices=COMPRESSIONS)
    group.add_argument("--distribution", default="FullyReplicated", choices=DISTRIBUTIONS)
    group.add_argument("--shuffle-seed", type=int, default=None,
                       help="shuffle the S3 keys of every pass with this seed")
    group.add_argument("--channel-option", action="append", default=[], metavar="NAME:OPTION=VALUE",
                       help="override one option for one channel, e.g. validation:input-mode=File")


def from_arguments(args: argparse.Namespace) -> list[ChannelSpec]:
    sources = {name: getattr(args, name) for name in ("train", "validation", "pretrained") if getattr(args, name)}
    for name, source in key_values(args.channel, "--channel", "NAME=SOURCE").items():
        if not source:
            raise ChannelError(f"--channel {name}=: expected NAME=SOURCE")
        if name in sources:
            raise ChannelError(f"channel {name} is given twice (--{name} and --channel {name}=...)")
        sources[name] = source
    overrides: dict[str, dict] = {name: {} for name in sources}
    if "pretrained" in overrides:
        overrides["pretrained"] = dict(PRETRAINED_DEFAULTS)
    for item in args.channel_option:
        match = re.match(r"^([^:]+):([a-z-]+)=(.*)$", item)
        if not match or match.group(2) not in _OPTIONS:
            raise ChannelError(f"--channel-option {item!r}: expected NAME:OPTION=VALUE with OPTION one of "
                               f"{', '.join(_OPTIONS)}")
        name, option, value = match.groups()
        if name not in sources:
            raise ChannelError(f"--channel-option {item!r}: there is no channel {name} "
                               f"(channels: {', '.join(sources) or 'none'})")
        overrides[name][_OPTIONS[option]] = value
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
                f"channel {name}: shuffle-seed must be an integer, got {values['shuffle_seed']!r}") from None
        specs.append(ChannelSpec(name=name, source=source, **values))
    if not specs:
        raise ChannelError("no channels: give at least --train SOURCE")
    check_names_apart(specs)
    return specs


def check_names_apart(specs: list[ChannelSpec]) -> None:
    """A Pipe channel's FIFOs are input/data/<name>_0, _1, ...: no other channel may be called so."""
    for pipe in (s for s in specs if s.input_mode == "Pipe"):
        for other in specs:
            if re.fullmatch(rf"{re.escape(pipe.name)}_\d+", other.name):
                raise ChannelError(f"channel {other.name} has the name of a FIFO of Pipe channel {pipe.name} "
                                   f"(input/data/{pipe.name}_0, _1, ...): rename one of them")
