"""The SageMaker training container contract: /opt/ml paths and the input data configuration.

This is the only module that reads SageMaker's environment and knows where /opt/ml lives.
Everything else receives paths and settings as arguments.

The base directory is /opt/ml, or $SAGEMAKER_BASE_DIR when set (the variable AWS's
sagemaker-training toolkit uses). Unlike the toolkit, it is read on every call rather than at
import time, so tests and the local runner can point it at a job directory under tmp_path.

Reference: https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-running-container.html
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

from keras_pipe_train.settings.channels import TRAIN, TRAINING
from keras_pipe_train.settings.errors import UserError
from pipemode import channels

# The reader owns the part of the contract it needs (the base directory, inputdataconfig.json);
# the job builds on it, so both read the same files the same way.
BASE_DIR_ENV = channels.BASE_DIR_ENV
INPUT_MODES = channels.INPUT_MODES
RECORD_WRAPPERS = channels.RECORD_WRAPPERS
ChannelConfig = channels.ChannelConfig
read_input_data_config = channels.read_input_data_config
_read_json_object = channels.read_json_object




def channels_by_role(channels: dict[str, ChannelConfig]) -> dict[str, ChannelConfig]:
    """The channels under the names the job reads them by: a `training` channel (the built-in
    TensorFlow algorithm's) is the `train` channel when there is none; each keeps its own name, which
    its folder and FIFOs have. A job with both is a UserError naming both."""
    if TRAINING not in channels:
        return channels
    if TRAIN in channels:
        raise UserError(f"the job has both a '{TRAIN}' and a '{TRAINING}' channel: the job trains on one "
                        f"('{TRAINING}', the built-in TensorFlow algorithm's name, is read as 'train' when "
                        "there is no 'train'): give one of them")
    return {(TRAIN if name == TRAINING else name): channel for name, channel in channels.items()}


def is_hidden(parts: tuple[str, ...] | list[str]) -> bool:
    """Whether a file whose path (relative to a channel or source folder) has these parts is left
    out: a hidden file or folder (.DS_Store, .git, an editor's swap file, a staging folder) is never
    data. The one rule for the job's channel folders and the launcher's sources and image folders."""
    return any(part.startswith(".") for part in parts)


@dataclasses.dataclass(frozen=True)
class Paths:
    """Every path of the /opt/ml layout, derived from one base directory."""

    base: Path

    @property
    def input_config(self) -> Path:
        return self.base / "input" / "config"

    @property
    def input_data(self) -> Path:
        """Holds <channel>/ directories (File, FastFile) and <channel>_<N> FIFOs (Pipe)."""
        return self.base / "input" / "data"

    @property
    def hyperparameters(self) -> Path:
        return self.input_config / "hyperparameters.json"

    @property
    def input_data_config(self) -> Path:
        return self.input_config / "inputdataconfig.json"

    @property
    def resource_config(self) -> Path:
        return self.input_config / "resourceconfig.json"

    @property
    def model(self) -> Path:
        return self.base / "model"

    @property
    def output(self) -> Path:
        return self.base / "output"

    @property
    def output_data(self) -> Path:
        return self.output / "data"

    @property
    def failure(self) -> Path:
        return self.output / "failure"

    @property
    def checkpoints(self) -> Path:
        return self.base / "checkpoints"



def paths(base: str | os.PathLike | None = None) -> Paths:
    """The /opt/ml layout rooted at `base`, else $SAGEMAKER_BASE_DIR, else /opt/ml."""
    return Paths(Path(base) if base is not None else channels.base_dir())


def read_hyperparameters(path: str | os.PathLike | None = None) -> dict:
    """hyperparameters.json as written: every value a string ({"epochs": "3"}).

    Values are not decoded here: each SageMaker client encodes them its own way, and only the
    hyperparameter's type says how to read one ("8" is a number for batch_size, text for a class
    name): `keras_pipe_train.settings.config` does that. A missing file means no hyperparameters (SageMaker writes
    none when the job sets none).
    """
    path = Path(path) if path else paths().hyperparameters
    if not path.exists():
        return {}
    return _read_json_object(path)


@dataclasses.dataclass(frozen=True)
class ResourceConfig:
    """resourceconfig.json: which host this is, and all hosts of the job."""

    current_host: str = "algo-1"
    hosts: tuple[str, ...] = ("algo-1",)
    instance_type: str | None = None
    network_interface: str | None = None

    @property
    def is_chief(self) -> bool:
        return self.current_host == sorted(self.hosts)[0]


def read_resource_config(path: str | os.PathLike | None = None) -> ResourceConfig:
    """resourceconfig.json, or a single host when it is absent (a plain local run)."""
    path = Path(path) if path else paths().resource_config
    if not path.exists():
        return ResourceConfig()
    raw = _read_json_object(path)
    hosts = raw.get("hosts") or [raw.get("current_host", "algo-1")]
    current = raw.get("current_host", hosts[0])
    if current not in hosts:
        raise UserError(f"{path}: current_host {current!r} is not among hosts {hosts}")
    return ResourceConfig(
        current_host=current,
        hosts=tuple(hosts),
        instance_type=raw.get("current_instance_type"),
        network_interface=raw.get("network_interface_name"),
    )


CLUSTER_PORT = 2222
CLUSTER_ADDRESSES_ENV = "TRAIN_CLUSTER_ADDRESSES"
AUDIT_DIR_ENV = "TRAIN_AUDIT_DIR"


def cluster_addresses(resources: ResourceConfig) -> dict[str, str]:
    """host -> "address:port" for TensorFlow's cluster. On SageMaker the host names resolve
    (algo-1, algo-2, ...); a local multi-host run maps them to 127.0.0.1 ports through
    $TRAIN_CLUSTER_ADDRESSES (a JSON object), since they share one machine."""
    override = os.environ.get(CLUSTER_ADDRESSES_ENV)
    if override:
        try:
            addresses = json.loads(override)
        except ValueError as err:
            raise UserError(f"${CLUSTER_ADDRESSES_ENV} is not JSON: {err}") from err
        missing = [h for h in resources.hosts if h not in addresses]
        if missing:
            raise UserError(f"${CLUSTER_ADDRESSES_ENV} has no address for {', '.join(missing)}")
        return addresses
    return {host: f"{host}:{CLUSTER_PORT}" for host in resources.hosts}


def audit_dir() -> Path | None:
    """Where the job records which records it trained on ($TRAIN_AUDIT_DIR; off by default)."""
    value = os.environ.get(AUDIT_DIR_ENV)
    return Path(value) if value else None


JOB_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")  # SageMaker's TrainingJobName


def training_job_name() -> str:
    """The job's name (SageMaker sets TRAINING_JOB_NAME), or "local" outside SageMaker. It names
    the job's checkpoint folder, so anything but SageMaker's own form of name is refused."""
    name = os.environ.get("TRAINING_JOB_NAME") or "local"
    if not JOB_NAME.match(name):
        raise UserError(f"TRAINING_JOB_NAME {name!r} is not a SageMaker job name (1-63 letters, digits and hyphens)")
    return name
