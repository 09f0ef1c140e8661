"""The launcher's tests: `keras-pipe` run as a user runs it, and what it sends to SageMaker, as moto's
server on 127.0.0.1 recorded it."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import REPO, run_logged


def launch_cli(command: str, *args, python=sys.executable, env=None, timeout: float = 270
               ) -> subprocess.CompletedProcess:
    """`python -m keras_pipe_launch COMMAND ARGS...` in a subprocess, as a user runs it; one that
    hangs fails the test with what it printed (run_logged)."""
    return run_logged([str(python), "-m", "keras_pipe_launch", command, *args], timeout, cwd=REPO, env=env)


def dry_run_request(command: str, *args) -> dict:
    """The request `launch COMMAND ARGS... --dry-run` prints."""
    out = launch_cli(command, *args, "--dry-run")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def sent_through_sdk(command: str, operation: str, args, env: dict, moto_endpoint: str,
                     python=sys.executable) -> tuple[dict, subprocess.CompletedProcess]:
    """Runs `launch COMMAND ARGS...` against moto's server with the SDK of `python` (v3 in this
    virtualenv, v2 in sdk2_python()); (the one `operation` request it sent, the run)."""
    out = launch_cli(command, *args, python=python, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    version = "v3" if python == sys.executable else "v2"
    assert f"with SageMaker SDK {version}" in out.stderr
    (request,) = sent(moto_endpoint, operation)
    # standard output holds the name alone, whichever SDK sent it (`name=$(keras-pipe submit ...)`)
    assert out.stdout.strip() in request.values(), out.stdout
    return request, out


@pytest.fixture
def aws(moto_endpoint, tmp_path):
    """Environment for a submitting subprocess: moto's server, fake credentials, no telemetry."""
    optout = tmp_path / "sagemaker-config.yaml"
    optout.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n")
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "SAGEMAKER_VALIDATE_ROLE": "false",  # v3 would call iam:SimulatePrincipalPolicy, which moto lacks
           "SAGEMAKER_USER_CONFIG_OVERRIDE": str(optout), "LAUNCH_POLL_SECONDS": "0.2"}
    env.pop("AWS_PROFILE", None)
    for call in ("reset-recording", "start-recording"):
        urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/recorder/{call}", method="POST"))
    yield env
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/recorder/stop-recording", method="POST"))


def sent(moto_endpoint: str, operation: str) -> list[dict]:
    """The requests for SageMaker's `operation` the server received, as sent (moto's recording;
    start it with the `aws` fixture)."""
    text = urllib.request.urlopen(f"{moto_endpoint}/moto-api/recorder/download-recording").read().decode()
    return recorded(text, operation)


def recorded(recording: str, operation: str) -> list[dict]:
    """The requests for SageMaker's `operation` in a recording of moto's server (JSON lines)."""
    requests = []
    for entry in map(json.loads, filter(None, recording.splitlines())):
        if entry["headers"].get("X-Amz-Target") == f"SageMaker.{operation}":
            body = base64.b64decode(entry["body"]) if entry["body_encoded"] else entry["body"]
            requests.append(json.loads(body))
    return requests
