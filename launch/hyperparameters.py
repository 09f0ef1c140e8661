"""--hp KEY=VALUE options, as SageMaker passes hyperparameters (every value a string), checked
against the training job's own schema (train/config.py: one source of truth)."""

from __future__ import annotations

from launch.cli import key_values


def parse(items: list[str]) -> dict[str, str]:
    return key_values(items, "--hp")


def check(values: dict[str, str]) -> None:
    """Decodes the values as the job does, then validates them (raises train.errors.UserError)."""
    from train.config import JobConfig
    from train.contract import decode_hyperparameter

    JobConfig.from_hyperparameters({k: decode_hyperparameter(v) for k, v in values.items()})
