"""Keeping secret values out of what the launcher prints.

Environment variables (and, less wisely, hyperparameters) are how a job gets tokens and passwords,
and `launch` prints what it runs (`submit --dry-run`, `local`'s command lines). Values that look
secret, by their name (GITHUB_TOKEN, sneaky_token, GH_PAT) or by their shape (a URL with a password,
a token with a known prefix), are replaced by a marker there; what is sent or run is unchanged.
(A container engine is given the values in a 0600 --env-file, never on its command line, which any
local user can read through `ps`: local.run.LocalRun.) SageMaker itself keeps a job's Environment
(and HyperParameters) in plain text: DescribeTrainingJob shows them to anyone who may describe
the job, which is why `submit` warns when one looks secret.
"""

from __future__ import annotations

import re

from keras_pipe_train.settings import url_credentials

REDACTED = "REDACTED"  # shell-safe: shlex leaves it unquoted in printed commands
# AWS_SECRET_ACCESS_KEY, GITHUB_TOKEN, DB_PASSWORD, WANDB_API_KEY, HF_TOKEN, MY_PRIVATE_KEY, ...
_SECRET_NAME = re.compile(
    r"SECRET|TOKEN|PASS(WORD|WD|PHRASE)?($|_)|PWD$|CREDENTIAL|PRIVATE|(^|_)AUTH|COOKIE|SESSION|"
    r"SIGNATURE|(^|_)(API_?|ACCESS_?)?KEY($|_)|DSN$|CONNECTION_STRING|(^|_)PAT($|_)",
    re.IGNORECASE,
)
# tokens whose prefix says what they are: GitHub, GitLab, Slack, OpenAI and Stripe, Hugging Face,
# AWS access key ids, Google API keys, JSON Web Tokens, PEM private keys
_SECRET_VALUE = re.compile(
    r"^\s*(gh[pousr]_|github_pat_|glpat-|xox[abpors]-|sk-|sk_live_|rk_live_|hf_|AKIA[0-9A-Z]{12}|ASIA[0-9A-Z]{12}|"
    r"AIza[\w-]{20}|eyJ[\w-]+\.eyJ|-----BEGIN [A-Z ]*PRIVATE KEY)"
)


def looks_secret(name: str, value: str = "") -> bool:
    return bool(_SECRET_NAME.search(name) or _SECRET_VALUE.match(value) or url_credentials.has_credentials(value))


def shown_value(name: str, value: str) -> str:
    """The value as it may be printed: a URL's user and password (scheme://user:pw@host: postgres://,
    https://, redis:// ...) and secret query values replaced by the marker, a secret-looking name's or
    a token's value replaced whole."""
    if _SECRET_NAME.search(name) or _SECRET_VALUE.match(value):
        return REDACTED
    return url_credentials.redacted_value(value, REDACTED)


def redacted(values: dict[str, str]) -> dict[str, str]:
    return {name: shown_value(name, str(value)) for name, value in values.items()}


def redacted_request(request: dict) -> dict:
    """A SageMaker request as --dry-run prints it: the values of its Environment, HyperParameters
    and StaticHyperParameters maps redacted, wherever they sit in it."""
    if isinstance(request, list):
        return [redacted_request(item) for item in request]
    if not isinstance(request, dict):
        return request
    return {key: redacted(value) if key in ("Environment", "HyperParameters", "StaticHyperParameters")
            and isinstance(value, dict) else redacted_request(value) for key, value in request.items()}


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
    name, sep, value = text.partition("=")
    return f"{name}={shown_value(name, value)}" if sep else text
