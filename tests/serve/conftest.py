"""Models exported as the job exports them, and `serve` started as SageMaker starts it: the
installed command, a real gunicorn on a port of 127.0.0.1, real HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

CLASSES = ("cat", "dog", "bird")
SERVE = str(Path(sys.executable).parent / "keras-pipe-serve")  # the console script, as users run it


def exported(folder: Path, threshold: float | None = None, temperature=None, bias=None) -> Path:
    """A small classifier exported by the job's own export(): a one-convolution backbone with
    seeded random weights (a deep backbone untrained answers the same for every image), so that
    each image gets its own answer. `temperature`: its served probabilities calibrated by it (the
    same weights: the same model, calibrated); `bias`: one per class, added after the temperature
    (Platt scaling: multi-label)."""
    import keras

    from keras_pipe_train.model import classifier as M
    from keras_pipe_train.model.export import export
    from keras_pipe_train.training import calibration as C
    from keras_pipe_train.training.calibration import Calibration

    keras.utils.set_random_seed(3)
    backbone = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255),
                                 keras.layers.Conv2D(8, 3, strides=2, activation="relu")], name="tiny")
    classifier = M.build_classifier("mobilenet_v3_small", backbone, len(CLASSES), 0.0, batchnorm_frozen=False,
                                    activation="softmax" if threshold is None else "sigmoid")
    head = classifier.get_layer("classifier")  # (an untrained head starts at zero: every class as likely)
    head.set_weights([keras.random.normal(w.shape, stddev=3.0, seed=5).numpy() for w in head.get_weights()])
    calibration = None if temperature is None else Calibration(
        "true", np.asarray(temperature) if np.ndim(temperature) else temperature, True, "calibration=true", 100, {},
        {}, threshold is not None, bias=None if bias is None else np.asarray(bias, np.float64),
        method=C.TEMPERATURE if bias is None else C.PLATT).serving(threshold)
    export(classifier, CLASSES, 32, folder, threshold=threshold, calibration=calibration)
    return folder


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return exported(tmp_path_factory.mktemp("served") / "model")


@pytest.fixture(scope="session")
def multi_label_model_dir(tmp_path_factory) -> Path:
    return exported(tmp_path_factory.mktemp("served-multi") / "model", threshold=0.5)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """`serve` started here (the installed command) on a free port; or, with `at`, one started
    elsewhere (in a container) and only talked to."""

    def __init__(self, model: Path | None, log: Path | None, port: int | None = None, **env: str):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.process = None if model is None else subprocess.Popen(
            [SERVE, "--model-dir", str(model), "--host", "127.0.0.1"],
            env={**os.environ, "SAGEMAKER_BIND_TO_PORT": str(self.port), **env},
            stdout=open(log, "wb"), stderr=subprocess.STDOUT)

    @classmethod
    def at(cls, port: int) -> Server:
        return cls(None, None, port)

    def wait_until_healthy(self, timeout: float = 120, logs=None) -> float:
        logs = logs or (lambda: self.log.read_text()[-3000:])
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.process and self.process.poll() is not None:
                raise AssertionError(f"serve exited {self.process.returncode}: {logs()}")
            try:
                if self.request("GET", "/ping", timeout=2)[0] == 200:
                    return time.monotonic() - started
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"serve was not healthy in {timeout} s: {logs()}")

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 60,
                **headers: str) -> tuple[int, bytes, dict]:
        request = urllib.request.Request(self.url + path, data=body, method=method,
                                         headers={k.replace("_", "-"): v for k, v in headers.items()})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, answer.read(), dict(answer.headers)
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read(), dict(refused.headers)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """`serve` on the single-label model, one worker, bodies up to 2 MB (the 413 is then cheap)."""
    running = Server(model_dir, tmp_path_factory.mktemp("serve") / "serve.log", SAGEMAKER_MODEL_SERVER_WORKERS="1",
                     SAGEMAKER_MAX_PAYLOAD_IN_MB="2")
    running.wait_until_healthy()
    yield running
    running.stop()
