"""The files SageMaker writes in /opt/ml/input/config before it starts a training container
(hyperparameters.json, inputdataconfig.json, resourceconfig.json), written as SageMaker writes
them. The local runner lays out each host's /opt/ml with them; tests and benchmarks that make a job
folder of their own use them too, so every job folder here has the same files in the same form.

Reference: docs/contract.md and
https://docs.aws.amazon.com/sagemaker/latest/dg/your-algorithms-training-algo-running-container.html
"""

from __future__ import annotations

import json
from pathlib import Path


def channel_entry(input_mode: str = "Pipe", *, distribution: str = "FullyReplicated", record_wrapper: str = "None",
                  compression: str = "None", content_type: str | None = None) -> dict:
    """One channel's entry in inputdataconfig.json. SageMaker leaves CompressionType out when there
    is none, and ContentType when none was given."""
    entry = {"TrainingInputMode": input_mode, "S3DistributionType": distribution, "RecordWrapperType": record_wrapper}
    if compression != "None":
        entry["CompressionType"] = compression
    if content_type:
        entry["ContentType"] = content_type
    return entry


def resource_config(current_host: str, hosts: list[str], *, instance_type: str = "local",
                    network_interface: str = "eth0") -> dict:
    """resourceconfig.json of one host of a one-group (homogeneous) cluster."""
    return {
        "current_host": current_host, "hosts": hosts, "network_interface_name": network_interface,
        "current_instance_type": instance_type, "current_group_name": "homogeneousCluster",
        "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": instance_type,
                             "hosts": hosts}],
    }


def write(config_dir: Path, *, hyperparameters: dict[str, str] | None = None, channels: dict[str, dict] | None = None,
          resources: dict | None = None) -> None:
    """Writes the given files into `config_dir` (made if missing); a file not given is left as it is.
    Hyperparameter values must already be strings, as SageMaker gives them."""
    if hyperparameters and not all(isinstance(v, str) for v in hyperparameters.values()):
        raise TypeError(f"hyperparameter values are strings in hyperparameters.json: {hyperparameters}")
    config_dir.mkdir(parents=True, exist_ok=True)
    for name, value in (("hyperparameters", hyperparameters), ("inputdataconfig", channels),
                        ("resourceconfig", resources)):
        if value is not None:
            (config_dir / f"{name}.json").write_text(json.dumps(value, indent=2) + "\n")
