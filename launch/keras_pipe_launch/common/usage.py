"""The error for anything given wrongly on the command line (UsageError: the message says what and
how to fix it), and KEY=VALUE options read the one way every command reads them."""

from __future__ import annotations

from keras_pipe_launch.common.untrusted import shown


class UsageError(ValueError):
    """An argument given wrongly: the message names it and says how to fix it."""


def key_values(items: list[str], option: str, form: str = "KEY=VALUE") -> dict[str, str]:
    """`--hp a=1 --hp b=x=y` -> {"a": "1", "b": "x=y"}; a key given twice is an error, since
    SageMaker's maps (hyperparameters, environment, tags) keep one value per key."""
    values: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} {item!r}: expected {form}")
        if key in values:
            raise UsageError(f"{option} {shown(key)} is given twice ({values[key]!r} and {value!r})")
        values[key] = value
    return values
