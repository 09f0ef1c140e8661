"""The part of SageMaker's training contract a Pipe reader needs: where /opt/ml is, and what
inputdataconfig.json says of each channel.

The base directory is /opt/ml, or $SAGEMAKER_BASE_DIR when set (the variable AWS's
sagemaker-training toolkit uses). Unlike the toolkit, it is read on every call rather than at
import time, so tests and local runs can point it at a job directory anywhere.

Reference: https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-running-container.html
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from pipemode.errors import PipeConfigError

BASE_DIR_ENV = "SAGEMAKER_BASE_DIR"
DEFAULT_BASE_DIR = "/opt/ml"

INPUT_MODES = ("File", "FastFile", "Pipe")
RECORD_WRAPPERS = ("None", "RecordIO")


def base_dir() -> Path:
    """/opt/ml, or $SAGEMAKER_BASE_DIR when set."""
    return Path(os.environ.get(BASE_DIR_ENV) or DEFAULT_BASE_DIR)


def input_data_dir() -> Path:
    """Holds <channel>/ directories (File, FastFile) and <channel>_<N> FIFOs (Pipe)."""
    return base_dir() / "input" / "data"


def input_config_dir() -> Path:
    return base_dir() / "input" / "config"


def default_state_dir() -> Path:
    """Where PipeModeDataset keeps its pass numbers unless told otherwise (AWS's default)."""
    return base_dir() / "pipe_state"


@dataclasses.dataclass(frozen=True)
class ChannelConfig:
    """One channel of inputdataconfig.json.

    SageMaker writes `S3DistributionType` here (the CreateTrainingJob API calls it
    `S3DataDistributionType`); both spellings are accepted.
    """

    name: str
    input_mode: str
    record_wrapper: str = "None"
    distribution: str = "FullyReplicated"
    compression: str = "None"
    content_type: str | None = None

    @classmethod
    def from_json(cls, name: str, entry: dict, source: str) -> ChannelConfig:
        if not isinstance(entry, dict):
            raise PipeConfigError(f"{source}: channel {name!r} must be a JSON object, got {entry!r}")
        mode = entry.get("TrainingInputMode", "File")
        if mode not in INPUT_MODES:
            raise PipeConfigError(
                f"{source}: channel {name!r} has TrainingInputMode {mode!r}; "
                f"expected one of {', '.join(INPUT_MODES)}"
            )
        wrapper = entry.get("RecordWrapperType") or "None"
        if wrapper not in RECORD_WRAPPERS:
            raise PipeConfigError(
                f"{source}: channel {name!r} has RecordWrapperType {wrapper!r}; "
                f"expected one of {', '.join(RECORD_WRAPPERS)}"
            )
        return cls(
            name=name,
            input_mode=mode,
            record_wrapper=wrapper,
            distribution=entry.get("S3DistributionType")
            or entry.get("S3DataDistributionType")
            or "FullyReplicated",
            compression=entry.get("CompressionType") or "None",
            content_type=entry.get("ContentType"),
        )


def read_input_data_config(config_dir: str | os.PathLike | None = None) -> dict[str, ChannelConfig]:
    """Parses inputdataconfig.json from `config_dir` (default: <base>/input/config)."""
    path = Path(config_dir or input_config_dir()) / "inputdataconfig.json"
    raw = read_json_object(path)
    return {name: ChannelConfig.from_json(name, entry, str(path)) for name, entry in raw.items()}


def read_json_object(path: Path) -> dict:
    """One of the JSON files SageMaker writes under input/config, which must hold an object."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise PipeConfigError(
            f"{path} does not exist: SageMaker writes it for every training job; outside SageMaker, "
            f"create it (or set ${BASE_DIR_ENV} to a folder laid out like /opt/ml)"
        ) from None
    except (OSError, ValueError) as err:
        raise PipeConfigError(f"cannot read {path}: {err}") from err
    if not isinstance(raw, dict):
        raise PipeConfigError(f"{path} must hold a JSON object, got {type(raw).__name__}")
    return raw
