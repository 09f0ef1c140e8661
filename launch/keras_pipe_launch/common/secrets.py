"""Keeping secret values out of what the launcher prints.

Environment variables are how a job gets tokens and passwords, and `launch` prints what it runs
(`submit --dry-run`, `local`'s command lines). Values of names that look secret are replaced by
a marker there; what is sent or run is unchanged. SageMaker itself keeps a job's Environment
(and HyperParameters) in plain text: DescribeTrainingJob shows them to anyone who may describe
the job, which is why `submit` warns when one looks secret.
"""

from __future__ import annotations

import re

REDACTED = "REDACTED"  # shell-safe: shlex leaves it unquoted in printed commands
# AWS_SECRET_ACCESS_KEY, GITHUB_TOKEN, DB_PASSWORD, WANDB_API_KEY, HF_TOKEN, MY_PRIVATE_KEY, ...
_SECRET_NAME = re.compile(
    r"SECRET|TOKEN|PASS(WORD|WD|PHRASE)?($|_)|PWD$|CREDENTIAL|PRIVATE|(^|_)AUTH|COOKIE|SESSION|"
    r"SIGNATURE|(^|_)(API_?|ACCESS_?)?KEY($|_)|DSN$|CONNECTION_STRING",
    re.IGNORECASE,
)


def looks_secret(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redacted(values: dict[str, str]) -> dict[str, str]:
    return {name: REDACTED if looks_secret(name) else value for name, value in values.items()}


def redacted_command(command: list[str]) -> list[str]:
    """A container command line with the values of secret-looking `-e NAME=VALUE` redacted
    (also `--env NAME=VALUE`, `--env=NAME=VALUE` and `-eNAME=VALUE`)."""
    out, after_flag = [], False
    for arg in command:
        if after_flag:
            out.append(_redact_assignment(arg))
        elif arg.startswith("--env="):
            out.append("--env=" + _redact_assignment(arg[len("--env="):]))
        elif arg.startswith("-e") and len(arg) > 2 and not arg.startswith("--"):
            out.append("-e" + _redact_assignment(arg[2:]))
        else:
            out.append(arg)
        after_flag = arg in ("-e", "--env")
    return out


def _redact_assignment(text: str) -> str:
    name, sep, _ = text.partition("=")
    return f"{name}={REDACTED}" if sep and looks_secret(name) else text
