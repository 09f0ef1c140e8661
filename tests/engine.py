"""The training image (container tests): built from this checkout on a local base with podman, and
a Docker Engine of the tests' own for the SageMaker SDKs' local mode (docs/image.md).

A plugin of the root conftest (pytest_plugins), not a folder's conftest: tests/image and tests/docs
both use these fixtures, and a fixture each folder imported was a fixture of each: two builds, two
Docker Engines each loading the image. Here each is made once per session."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.timeouts import wait_s

ENGINE = os.environ.get("LAUNCH_ENGINE") or "podman --runtime runc"
RUN_ARGS = os.environ.get("LAUNCH_ENGINE_ARGS") or "--ulimit nofile=1024:1024 --ulimit nproc=1024:1024 --network none"
BASE = os.environ.get("LOCAL_BASE_IMAGE", "localbase:bookworm")
TAG = "keras-pipe-train:test"


def engine_problem() -> str | None:
    engine = shlex.split(ENGINE)
    if not shutil.which(engine[0]):
        return f"{engine[0]} is not installed (.ci/run installs podman, runc and debootstrap as root)"
    if subprocess.run([*engine, "image", "exists", BASE], capture_output=True).returncode:
        return f"the local base image {BASE} is missing: run .ci/container-base"
    probe = subprocess.run([*engine, "run", "--rm", *shlex.split(RUN_ARGS), BASE, "true"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode:
        return f"{ENGINE} cannot run containers here: {probe.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="session")
def image():
    """The training image, built from this checkout on the local base (docs/image.md);
    skipped with the reason where no container engine works."""
    # (.ci/run builds the base and the image in the background as the tests start: wait for it)
    subprocess.run([str(REPO / ".ci" / "image-lock"), "true"], check=True, timeout=wait_s(1800))
    problem = engine_problem()
    if problem:
        pytest.skip(f"container tests skipped: {problem}")
    # (after .ci/run's build, every layer is cached)
    build = subprocess.run([str(REPO / ".ci" / "build-image"), TAG], env={**os.environ, "LAUNCH_ENGINE": ENGINE,
                                                                          "LOCAL_BASE_IMAGE": BASE},
                           capture_output=True, text=True, timeout=wait_s(1800))
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return TAG


@pytest.fixture(scope="session")
def docker_engine(image):
    """A Docker Engine of the tests' own, holding the training image (as `keras-pipe-train:test`
    and `keras-pipe-train`); the environment that reaches it (DOCKER_HOST).

    The SDKs' local mode runs Docker Compose, and Compose over podman's Docker API missed a failing
    container's exit in 4 of 10 runs: these tests need the engine users run. Debian's dockerd
    (docker.io) is started as root on a socket, data and exec folders of its own (short paths: its
    containerd's sockets live under the exec folder, and a socket path has at most 108 bytes), the
    image built by podman is loaded into it, and it is stopped at the end."""
    if not shutil.which("dockerd") or not shutil.which("docker"):
        pytest.skip("no Docker Engine: dockerd or docker is not installed (.ci/run installs docker.io)")
    if os.geteuid() != 0:
        pytest.skip("no Docker Engine: dockerd runs as root here, and these tests do not")
    folder = Path(tempfile.mkdtemp(prefix="dockerd-", dir="/tmp"))
    socket = folder / "docker.sock"
    env = {**os.environ, "DOCKER_HOST": f"unix://{socket}"}
    log = open(folder / "dockerd.log", "wb")
    daemon = subprocess.Popen(["dockerd", "--host", f"unix://{socket}", "--data-root", str(folder / "data"),
                               "--exec-root", str(folder / "exec"), "--pidfile", str(folder / "dockerd.pid")],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while subprocess.run(["docker", "info"], env=env, capture_output=True).returncode:
            if daemon.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"dockerd did not start: {(folder / 'dockerd.log').read_text()[-1500:]}")
            time.sleep(0.5)
        saved = subprocess.Popen([*shlex.split(ENGINE), "save", TAG], stdout=subprocess.PIPE)
        loaded = subprocess.run(["docker", "load"], stdin=saved.stdout, env=env, capture_output=True, text=True,
                                timeout=wait_s(900))
        saved.stdout.close()
        assert saved.wait(timeout=60) == 0 and loaded.returncode == 0, loaded.stderr[-2000:]
        name = loaded.stdout.strip().rsplit("Loaded image: ", 1)[-1]  # (podman names it localhost/...)
        for tag in (TAG, "keras-pipe-train"):
            subprocess.run(["docker", "tag", name, tag], env=env, check=True, capture_output=True)
        yield env
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


# Helpers several test modules share
