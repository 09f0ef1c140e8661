"""--hp KEY=VALUE options, as SageMaker passes hyperparameters (every value a string), checked
against the training job's own definitions (train/keras_pipe_train/settings/hyperparameters.py: one source
of truth)."""

from __future__ import annotations

from keras_pipe_launch.common.usage import key_values


def parse(items: list[str]) -> dict[str, str]:
    return key_values(items, "--hp")


def check(values: dict[str, str]) -> None:
    """Reads the values as the job does (raises keras_pipe_train.settings.errors.UserError)."""
    from keras_pipe_train.settings.config import JobConfig

    JobConfig.from_hyperparameters(values)
