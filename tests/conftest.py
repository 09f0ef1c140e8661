"""Fixtures and helpers the test folders share: reader/, job/, launcher/, image/, docs/, bench/.

What only one folder needs is in its own conftest. This one imports nothing of the project at its
top (the reader's tests run with the reader alone); a fixture that needs the job or the launcher
imports it when used.
"""

from __future__ import annotations

import functools
import json
import os
import random
import secrets
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import zlib
from pathlib import Path

import pytest

# each test's waits ending before its pytest timeout (tests/timeouts.py: wait_s; first, as the others
# import it); the image and the Docker Engine: fixtures tests/image and tests/docs share (one of each per
# session); how the workers share the tests; strict mode, where a skip fails (CI)
pytest_plugins = ["tests.timeouts", "tests.engine", "tests.scheduling", "tests.strict"]

REPO = Path(__file__).resolve().parent.parent
# SageMaker SDK v2 in its own virtualenv beside .venv (v3): `make test` creates it
SDK2_PYTHON = REPO / ".venv-sdk2" / "bin" / "python"


# MXNet's own Gluon in a virtualenv of its own (requirements/mxnet-reference.txt): `make test` creates it
MXNET_PYTHON = REPO / ".venv-mxnet" / "bin" / "python"


def mxnet_python() -> Path:
    if not MXNET_PYTHON.exists():
        pytest.skip(f"{MXNET_PYTHON} is missing: `make test` creates it (requirements/mxnet-reference.txt)")
    return MXNET_PYTHON


def sdk2_python() -> Path:
    if not SDK2_PYTHON.exists():
        pytest.skip(f"{SDK2_PYTHON} is missing: `make test` creates it (requirements/sdk2.txt)")
    return SDK2_PYTHON


os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
try:  # (the kernels the job chooses for the tests' own models, the demo's, before any test imports TensorFlow)
    from keras_pipe_train.settings.cpu_kernels import choose as choose_cpu_kernels

    choose_cpu_kernels(backbone="mobilenet_v3_small", image_size=32)
except ImportError:  # the reader's tests, with the reader alone
    pass
# moto's request recorder (read when moto is imported): a temp file, not ./moto_recording, and one
# per process: `make test`'s workers (tests/scheduling.py) each record their own server's requests
os.environ["MOTO_RECORDER_FILEPATH"] = os.path.join(tempfile.mkdtemp(prefix="moto-"), "recording")


@pytest.fixture(autouse=True)
def _sagemaker_base_dir(monkeypatch, tmp_path_factory):
    """No test touches this machine's /opt/ml: the SageMaker base folder is a fresh temporary one
    unless a test sets its own (PipeModeDataset keeps pass numbers in <base>/pipe_state, as AWS's
    does, so a shared folder would carry them from one test to the next)."""
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path_factory.mktemp("opt_ml")))


class FakeJob:
    """A SageMaker job directory (what /opt/ml is inside the container), its config files written
    as SageMaker writes them, its Pipe channels fed by real writer processes (tests/pipe_writer.py)."""

    def __init__(self, base: Path):
        self.base = base
        self.config_dir = base / "input" / "config"
        self.data_dir = base / "input" / "data"
        self.config_dir.mkdir(parents=True)
        self.data_dir.mkdir(parents=True)
        self.channels: dict[str, dict] = {}
        self._feeders: list[subprocess.Popen] = []

    def add_channel(self, name: str, mode: str = "Pipe", wrapper: str = "None", *,
                    distribution: str = "FullyReplicated", content_type: str | None = None) -> None:
        """The channel's entry in inputdataconfig.json, as SageMaker writes it."""
        self.channels[name] = {"TrainingInputMode": mode, "S3DistributionType": distribution,
                               "RecordWrapperType": wrapper}
        if content_type is not None:
            self.channels[name]["ContentType"] = content_type
        self.write_config(inputdataconfig=self.channels)

    def write_config(self, **files) -> None:
        """input/config/NAME.json for each NAME=content (hyperparameters: every value a string)."""
        for name, content in files.items():
            (self.config_dir / f"{name}.json").write_text(json.dumps(content, indent=2) + "\n")

    def feed(self, channel: str, files, *, passes=None, wrapper="None", chunk_bytes=0, pause=0.0,
             die_after_bytes=None, hold_pass=None) -> subprocess.Popen:
        """Starts a real writer process feeding `channel` pass after pass (as SageMaker does).
        `hold_pass`: pass N's FIFO is opened and never written; the writer's standard output (a
        pipe, text) then says "holding CHANNEL_N", once the job has opened it."""
        cmd = [sys.executable, str(REPO / "tests" / "pipe_writer.py"), "--dir", str(self.data_dir),
               "--channel", channel, "--record-wrapper", wrapper]
        if passes is not None:
            cmd += ["--passes", str(passes)]
        if chunk_bytes:
            cmd += ["--chunk-bytes", str(chunk_bytes), "--pause", str(pause)]
        if die_after_bytes is not None:
            cmd += ["--die-after-bytes", str(die_after_bytes)]
        if hold_pass is not None:
            cmd += ["--hold-pass", str(hold_pass)]
        proc = subprocess.Popen(cmd + [str(f) for f in files], cwd=REPO, stderr=subprocess.DEVNULL,
                                stdout=subprocess.PIPE if hold_pass is not None else None, text=True)
        self._feeders.append(proc)
        return proc

    def stream(self, channel: str, records: list[bytes], **feed_options) -> subprocess.Popen:
        """A Pipe channel `channel` streaming `records` (one TFRecord file), fed pass after pass."""
        self.add_channel(channel)
        return self.feed(channel, [self.write(f"{channel}.tfrecord", tfrecord_bytes(records))], **feed_options)

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


def tfrecord_bytes(records: list[bytes]) -> bytes:
    from pipemode import tfrecord

    return tfrecord.encode(records)


def model_tar_gz(folder: Path, archive: Path) -> Path:
    """`folder` (a job's /opt/ml/model) packed into `archive` as SageMaker packs model.tar.gz: its
    files and folders at the top."""
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False)
    return archive


@pytest.fixture
def job(tmp_path, monkeypatch):
    fake = FakeJob(tmp_path / "opt_ml")
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(fake.base))
    yield fake
    fake.stop_feeders()


def run_logged(command: list[str], timeout: float, **options) -> subprocess.CompletedProcess:
    """subprocess.run capturing text output; a process that outlives `timeout` (or what is left of
    the test's time: tests/timeouts.py) is killed and the test fails showing what it printed (a bare
    pytest timeout shows nothing of it)."""
    from tests.timeouts import wait_s  # (here: the plugin is imported first by pytest_plugins, as one)

    timeout = wait_s(timeout)
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **options)
    except subprocess.TimeoutExpired as err:
        def tail(data) -> str:
            text = data.decode(errors="replace") if isinstance(data, bytes) else (data or "")
            return text[-4000:]

        raise AssertionError(f"{' '.join(map(str, command))} did not finish within {timeout:.0f} s.\n"
                             f"stdout:\n{tail(err.stdout)}\nstderr:\n{tail(err.stderr)}") from None


def read_until(process: subprocess.Popen, marker: str, timeout: float = 270) -> list[str]:
    """The lines `process` printed up to the first holding `marker` (it keeps running). One that
    has not printed it within `timeout` (or what is left of the test's time: tests/timeouts.py),
    silent or not, is killed and the test fails showing what it printed."""
    from tests.timeouts import wait_s

    timeout = wait_s(timeout)
    lines, found = [], threading.Event()

    def read() -> None:  # (in a thread: a process that prints nothing blocks the read, not the test)
        for line in process.stdout:
            lines.append(line)
            if marker in line:
                found.set()
                return

    reader = threading.Thread(target=read, daemon=True, name="read_until")
    reader.start()
    reader.join(timeout)
    if found.is_set():
        return lines
    if reader.is_alive():
        process.kill()  # (its output then ends, and the thread with it)
        reader.join(10)
        raise AssertionError(f"no {marker!r} in {timeout:.0f} s:\n" + "".join(lines[-40:]))
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
    from keras_pipe_launch.sample_data import digit_examples, load_digits  # (the job's record format)

    images, labels = load_digits()
    return digit_examples(images, labels, 32), labels.tolist()


@pytest.fixture(scope="session")
def head_only_weights(tmp_path_factory):
    """Any backbone weights file: with weights given, phase 1 trains only the head (fast steps)."""
    import keras

    from keras_pipe_train.model.classifier import build_backbone

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
    # (a random suffix from the OS, not from `random`: a test that seeds it (keras.utils.set_random_seed) made two
    # cases of one test, whose names share their first 40 characters, draw the same bucket on one worker's moto)
    name = "test-" + request.node.name.lower().replace("_", "-")[:40].strip("-") + f"-{secrets.token_hex(4)}"
    client.create_bucket(Bucket=name)
    return client, name



# --- keras-pipe local on the digits ------------------------------------------------------------------

def launch_local(*args, cwd, timeout=270, env=None):
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


def quick_head(folder: Path, weights: Path) -> list[str]:
    """QUICK, starting from `weights` (a MobileNetV3-Small's) in a 'pretrained' channel under
    `folder`: phase 1 trains only the head, whose steps cost a fraction of training from scratch,
    for tests of what a job does around its training (a preset's count, a stop and a resume)."""
    (folder / "pretrained").mkdir(exist_ok=True)
    shutil.copy(weights, folder / "pretrained")
    return [value.replace("weights=none", "weights=pretrained") for value in QUICK] + [
        "--pretrained", str(folder / "pretrained"), "--hp", "backbone=mobilenet_v3_small"]


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



# --- keras-pipe prepare ---------------------------------------------------------------------------

def prepared_features() -> dict:
    """The features `keras-pipe prepare` writes, for tf.io.parse_single_example."""
    import tensorflow as tf

    return {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64),
            "image/source": tf.io.FixedLenFeature([], tf.string)}  # (where the image came from)


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
