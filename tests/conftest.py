"""Shared fixtures: a fake /opt/ml under tmp_path, real FIFO writer processes, record makers."""

from __future__ import annotations

import base64
import collections
import functools
import json
import os
import random
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path

import pytest

from keras_pipe_launch import container_config

REPO = Path(__file__).resolve().parent.parent
# SageMaker SDK v2 in its own virtualenv beside .venv (v3): `make test` creates it
SDK2_PYTHON = REPO / ".venv-sdk2" / "bin" / "python"


def sdk2_python() -> Path:
    if not SDK2_PYTHON.exists():
        pytest.skip(f"{SDK2_PYTHON} is missing: `make test` creates it (requirements/sdk2.txt)")
    return SDK2_PYTHON
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# moto's request recorder (read when moto is imported): a temp file, not ./moto_recording
os.environ.setdefault("MOTO_RECORDER_FILEPATH", os.path.join(tempfile.mkdtemp(prefix="moto-"), "recording"))


@pytest.fixture(autouse=True)
def _sagemaker_base_dir(monkeypatch, tmp_path_factory):
    """No test touches this machine's /opt/ml: the SageMaker base folder is a fresh temporary one
    unless a test sets its own (PipeModeDataset keeps pass numbers in <base>/pipe_state, as AWS's
    does, so a shared folder would carry them from one test to the next)."""
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path_factory.mktemp("opt_ml")))


class FakeJob:
    """A SageMaker job directory (what /opt/ml is inside the container)."""

    def __init__(self, base: Path):
        self.base = base
        self.config_dir = base / "input" / "config"
        self.data_dir = base / "input" / "data"
        self.config_dir.mkdir(parents=True)
        self.data_dir.mkdir(parents=True)
        self.channels: dict[str, dict] = {}
        self._feeders: list[subprocess.Popen] = []

    def add_channel(self, name: str, mode: str = "Pipe", wrapper: str = "None", **options) -> None:
        """`options`: container_config.channel_entry's (distribution, compression, content_type)."""
        self.channels[name] = container_config.channel_entry(mode, record_wrapper=wrapper, **options)
        container_config.write(self.config_dir, channels=self.channels)

    def feed(self, channel: str, files, *, passes=None, wrapper="None", chunk_bytes=0, pause=0.0,
             die_after_bytes=None) -> subprocess.Popen:
        """Starts a real writer process feeding `channel` pass after pass (as SageMaker does)."""
        cmd = [sys.executable, "-m", "keras_pipe_launch.pipe_feeder", "--dir", str(self.data_dir),
               "--channel", channel, "--record-wrapper", wrapper]
        if passes is not None:
            cmd += ["--passes", str(passes)]
        if chunk_bytes:
            cmd += ["--chunk-bytes", str(chunk_bytes), "--pause", str(pause)]
        if die_after_bytes is not None:
            cmd += ["--die-after-bytes", str(die_after_bytes)]
        proc = subprocess.Popen(cmd + [str(f) for f in files], cwd=REPO,
                                stderr=subprocess.DEVNULL)
        self._feeders.append(proc)
        return proc

    def write(self, name: str, data: bytes) -> Path:
        path = self.base / "objects" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        return path

    def stop_feeders(self) -> None:
        for proc in self._feeders:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def job(tmp_path, monkeypatch):
    fake = FakeJob(tmp_path / "opt_ml")
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(fake.base))
    yield fake
    fake.stop_feeders()


def run_logged(command: list[str], timeout: float, **options) -> subprocess.CompletedProcess:
    """subprocess.run capturing text output; a process that outlives `timeout` is killed and the
    test fails showing what it printed (a bare pytest timeout shows nothing of it)."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options)
    except subprocess.TimeoutExpired as err:
        def tail(data) -> str:
            text = data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
            return text[-4000:]

        raise AssertionError(f"{' '.join(map(str, command))} did not finish within {timeout} s.\n"
                             f"stdout:\n{tail(err.stdout)}\nstderr:\n{tail(err.stderr)}") from None


def start_train(job: FakeJob, **env: str) -> subprocess.Popen:
    """container/train on `job`'s fake /opt/ml, in a subprocess whose output (stdout and stderr)
    reads line by line as it comes; `env`: more environment variables."""
    return subprocess.Popen([sys.executable, str(REPO / "container" / "train")], cwd=job.base,
                            env={**os.environ, "SAGEMAKER_BASE_DIR": str(job.base), "PYTHONUNBUFFERED": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until(process: subprocess.Popen, marker: str, timeout: float = 300) -> list[str]:
    """The lines `process` printed up to the first holding `marker` (it keeps running)."""
    lines, deadline = [], time.monotonic() + timeout
    for line in process.stdout:
        lines.append(line)
        if marker in line:
            return lines
        assert time.monotonic() < deadline, f"no {marker!r} in {timeout} s"
    raise AssertionError(f"the job ended before {marker!r}:\n" + "".join(lines[-40:]))


def random_records(seed: int, count: int, max_bytes: int = 3000) -> list[bytes]:
    """Records of random sizes, always including an empty one."""
    rng = random.Random(seed)
    return [b""] + [rng.randbytes(rng.randint(0, max_bytes)) for _ in range(count - 1)]


def stream_reader(data: bytes):
    """read(n) over `data` with a FIFO reader's contract: n bytes, fewer only at the end."""
    pos = 0

    def read(n: int) -> bytes:
        nonlocal pos
        out = data[pos : pos + n]
        pos += len(out)
        return out

    return read


@pytest.fixture(scope="session")
def digit_records():
    """(serialized tf.train.Examples of the 1797 digits as 32x32 JPEGs, labels)."""
    from keras_pipe_launch.sample_data import digit_examples, load_digits

    images, labels = load_digits()
    return digit_examples(images, labels, 32), labels.tolist()


def write_hyperparameters(job: FakeJob, **values) -> None:
    """As SageMaker writes them: every value a string."""
    container_config.write(job.config_dir, hyperparameters={k: v if isinstance(v, str) else json.dumps(v)
                                                            for k, v in values.items()})


@pytest.fixture(scope="session")
def head_only_weights(tmp_path_factory):
    """Any backbone weights file: with weights given, phase 1 trains only the head (fast steps)."""
    import keras

    from keras_pipe_train.model import build_backbone

    keras.utils.set_random_seed(1)
    path = tmp_path_factory.mktemp("weights") / "backbone.weights.h5"
    build_backbone("mobilenet_v3_small", 32, None).save_weights(path)
    return path


@functools.cache
def png_bomb(width: int = 16000, height: int = 16000) -> bytes:
    """A valid grayscale PNG of zeros, about 1 MB, that decodes to width x height pixels (768 MB of
    RGB at the default size): a decompression bomb."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    deflate = zlib.compressobj(1)
    row = bytes(1 + width)  # filter byte + pixels
    pixels = b"".join(deflate.compress(row) for _ in range(height)) + deflate.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", pixels) + chunk(b"IEND", b""))


def image_bytes(kind: str, width: int = 53, height: int = 37, **options) -> bytes:
    """An image of random pixels in any format Pillow writes (JPEG, PNG, GIF, BMP, WEBP, TIFF...)."""
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(width * height).integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, kind, **options)
    return out.getvalue()


@pytest.fixture(scope="session")
def moto_endpoint():
    """moto's S3 server on 127.0.0.1 (a real HTTP server: boto3 and subprocesses reach it)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(moto_endpoint, monkeypatch, request):
    """A fresh bucket on the moto server; AWS_* variables point boto3 (and children) at it."""
    import boto3

    for key, value in {"AWS_ENDPOINT_URL": moto_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3")
    name = "test-" + request.node.name.lower().replace("_", "-")[:40].strip("-") + f"-{random.randrange(10**6)}"
    client.create_bucket(Bucket=name)
    return client, name


def launch_cli(command: str, *args, python=sys.executable, env=None) -> subprocess.CompletedProcess:
    """`python -m keras_pipe_launch COMMAND ARGS...` in a subprocess, as a user runs it."""
    return subprocess.run([str(python), "-m", "keras_pipe_launch", command, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env)


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


# --- keras-pipe local on the digits ------------------------------------------------------------------

def launch_local(*args, cwd, timeout=280, env=None):
    return run_logged([sys.executable, "-m", "keras_pipe_launch", "local", *args], timeout, cwd=cwd, env=env)


@pytest.fixture
def digit_folders(tmp_path, digit_records):
    """train/ (600 records) and validation/ (200), two TFRecord files each, under tmp_path."""
    from pipemode import tfrecord

    examples, _ = digit_records
    for name, part in (("train", examples[:600]), ("validation", examples[1400:1600])):
        (tmp_path / name).mkdir()
        for i in range(2):
            (tmp_path / name / f"part-{i}.tfrecord").write_bytes(tfrecord.encode(part[i::2]))
    return tmp_path


QUICK = ["--hp", "num_classes=10", "--hp", "image_size=32", "--hp", "weights=none", "--hp", "batch_size=32"]


# --- the training image (container tests) --------------------------------------------------------

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
    problem = engine_problem()
    if problem:
        pytest.skip(f"container tests skipped: {problem}")
    build = subprocess.run(
        [*shlex.split(ENGINE), "build", "--network", "host", "--ulimit", "nofile=1024:1024",
         "--ulimit", "nproc=1024:1024", "-v", "/etc/ssl/certs:/etc/ssl/certs:ro",
         "--build-arg", f"BASE_IMAGE={BASE}", "--build-arg", "REQUIREMENTS=requirements/cpu.txt",
         "-t", TAG, str(REPO)], capture_output=True, text=True, timeout=1800)
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
                                timeout=900)
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


def file_channel(fake_job: FakeJob, name: str, records: list[bytes], shards: int = 2) -> None:
    from pipemode import tfrecord

    fake_job.add_channel(name, mode="File")
    (fake_job.data_dir / name).mkdir()
    for i in range(shards):
        (fake_job.data_dir / name / f"part-{i:05d}.tfrecord").write_bytes(tfrecord.encode(records[i::shards]))


def run_train(fake_job: FakeJob, timeout: int = 280) -> subprocess.CompletedProcess:
    """Runs `train` on the fake job. The time limit stays under pytest's (300 s) so that a job that
    hangs fails with its own output shown rather than a bare pytest timeout."""
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(fake_job.base)}
    return run_logged([sys.executable, str(REPO / "container" / "train")], timeout, env=env, cwd=fake_job.base)


def job_pid(host_dir) -> int:
    """The job process of one host: the one whose environment points at the host's /opt/ml."""
    marker = f"SAGEMAKER_BASE_DIR={host_dir}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                return int(pid)
        except OSError:
            continue
    raise AssertionError(f"no process runs {host_dir}")


def audited(audit_file):
    """{run pid: {epoch: {"batches": {index: digests}, "trained": steps}}}"""
    runs = collections.defaultdict(lambda: collections.defaultdict(lambda: {"batches": {}, "trained": 0}))
    for entry in map(json.loads, audit_file.read_text().splitlines()):
        epoch = runs[entry["pid"]][entry["epoch"]]
        if "trained_steps" in entry:
            epoch["trained"] = max(epoch["trained"], entry["trained_steps"])
        else:
            epoch["batches"][entry["batch"]] = entry["records"]
    return runs


def trained_records(epoch) -> list[str]:
    """The records of the batches this run trained on (prefetched batches beyond are not)."""
    return [d for index, digests in epoch["batches"].items() if index < epoch["trained"] for d in digests]


# --- keras-pipe prepare ---------------------------------------------------------------------------

def prepared_features() -> dict:
    """The features `keras-pipe prepare` writes, for tf.io.parse_single_example."""
    import tensorflow as tf

    return {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64)}


@pytest.fixture
def photos(tmp_path):
    """A folder of class folders: 200 digits as JPEG, PNG in one class, plus two bad files."""
    import tensorflow as tf

    from keras_pipe_launch.sample_data import digit_jpeg, load_digits

    images, labels = load_digits()
    root = tmp_path / "photos"
    for i, (image, label) in enumerate(zip(images[:200], labels[:200])):
        folder = root / f"digit{label}"
        folder.mkdir(parents=True, exist_ok=True)
        if label == 7:
            (folder / f"{i}.png").write_bytes(tf.io.encode_png(tf.io.decode_jpeg(digit_jpeg(image))).numpy())
        else:
            (folder / f"{i}.jpg").write_bytes(digit_jpeg(image))
    (root / "digit3" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (root / "digit5" / "readme.txt").write_text("not an image")
    return root, labels[:200]
