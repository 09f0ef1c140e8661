"""The built image driven by SageMaker's own SDKs in their local mode, as users run it before paying
for instances: v2 Estimator with two hosts (one host: docs/image.md's snippet, run by tests/docs),
v3 ModelTrainer in LOCAL_CONTAINER mode; then each job's model.tar.gz hosted on the SDK's local
endpoint (v2 Model.deploy, v3's local CreateEndpoint) answering JPEGs, and v2's local batch transform
writing one answer per image file. The SDKs
start the containers with docker-compose, on a real Docker Engine (the `docker_engine` fixture: over
podman's Docker API, Compose missed a failing container's exit in 4 of 10 runs; docs/image.md).
Each run must end with the SDK's model.tar.gz (a SavedModel that serves, classes.json) and
output.tar.gz (metrics.json); a failing job must surface its reason and exit code through the SDK.

Where no Docker Engine or docker-compose works, these tests are skipped with the reason, never passed."""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

from tests.conftest import REPO, sdk2_python
from tests.engine import TAG
from tests.timeouts import wait_s

pytestmark = [pytest.mark.container, pytest.mark.slow, pytest.mark.timeout(1800)]

CLASSES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
# Python values, encoded by each SDK its own way (the v2 Estimator: str(), so the list arrives as
# "['zero', 'one', ...]" and False as "False")
HYPERPARAMETERS = {"class_names": CLASSES, "image_size": 32, "weights": "none", "batch_size": 32, "epochs": 1,
                   "mixed_precision": False, "augment": ["flip"]}


@pytest.fixture(scope="session")
def docker_api(docker_engine, tmp_path_factory):
    """The environment of an SDK local-mode run: the Docker Engine, dummy AWS credentials, no telemetry."""
    if not shutil.which("docker-compose"):
        pytest.skip("docker-compose is not installed (.ci/run installs it): the SDKs' local mode needs it")
    optout = tmp_path_factory.mktemp("sdk-config") / "sagemaker-config.yaml"
    optout.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n")
    return {**docker_engine, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1", "SAGEMAKER_USER_CONFIG_OVERRIDE": str(optout),
            "SAGEMAKER_SUPPRESS_V2_WARNING": "1"}


def run_with_sdk(python, sdk: str, env: dict, folder, hosts: int = 1, **hyperparameters) -> tuple[dict, str]:
    job = {"sdk": sdk, "image": TAG, "hosts": hosts, "output": str(folder / "out"),
           "channels": {"train": str(folder / "train"), "validation": str(folder / "validation")},
           "hyperparameters": {**HYPERPARAMETERS, **hyperparameters}}
    (folder / "out").mkdir()
    out = subprocess.run([str(python), str(REPO / "tests" / "image" / "sdk_local_run.py"), json.dumps(job)], cwd=folder,
                         env=env, capture_output=True, text=True, timeout=wait_s(1200))
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), log


def members(archive) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def assert_complete_artifacts(folder, tmp_path, validation) -> None:
    """model.tar.gz: a SavedModel under model/1 that serves, classes.json; output.tar.gz: metrics.json,
    whose val_accuracy is the one the SavedModel earns on the `validation` folder's records."""
    import numpy as np
    import tensorflow as tf
    from PIL import Image

    model = members(os.path.join(folder, "model.tar.gz"))
    assert json.loads(model["classes.json"]) == CLASSES
    assert "1/saved_model.pb" in model and "model.keras" in model, sorted(model)
    with tarfile.open(os.path.join(folder, "model.tar.gz")) as tar:
        tar.extractall(tmp_path / "model", filter="data")
    served = tf.saved_model.load(str(tmp_path / "model" / "1")).signatures["serving_default"]
    png = io.BytesIO()
    Image.fromarray(np.full((28, 28), 200, np.uint8)).save(png, format="PNG")
    answer = served(tf.constant([png.getvalue()]))
    assert sorted(answer) == ["class_ids", "classes", "probabilities"], sorted(answer)
    assert answer["probabilities"].shape == (1, 10)
    (class_id,) = answer["class_ids"].numpy()
    assert class_id == answer["probabilities"].numpy()[0].argmax() and answer["classes"].numpy()[0].decode() == CLASSES[
        class_id], answer
    output = members(os.path.join(folder, "output.tar.gz"))
    metrics = json.loads(output["data/metrics.json"])
    # scored here, image by image against the records' labels (one epoch from scratch is near
    # chance: a number in [0, 1] is no check, the same number as the model's answers is)
    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
    right = total = 0
    for batch in tf.data.TFRecordDataset(sorted(str(p) for p in validation.glob("*.tfrecord"))).batch(64):
        parsed = tf.io.parse_example(batch, features)
        ids = served(image_bytes=parsed["image/encoded"])["class_ids"]
        right += int(tf.reduce_sum(tf.cast(tf.cast(ids, tf.int64) == parsed["image/class/label"], tf.int32)))
        total += int(batch.shape[0])
    assert total == 200 and metrics["final"]["epoch"] == 1, (total, metrics)
    assert metrics["final"]["val_accuracy"] == pytest.approx(right / total, abs=0.0051), (right, metrics)  # 1 image
    assert "failure" not in output


def served_with_sdk(python, sdk: str, env: dict, model_data: str, folder) -> None:
    """The model.tar.gz on the SDK's local endpoint: each digit JPEG is answered with the class the
    SavedModel itself gives it; (v2) a local batch transform of a folder of them writes, for each
    file, FILE.out holding one JSON line, the same answer (SageMaker's documented output layout)."""
    import tensorflow as tf

    from keras_pipe_launch.sample_data import digit_jpeg, load_digits

    images, _ = load_digits()
    jpegs = [digit_jpeg(pixels) for pixels in images[1600:1604]]
    source, target = folder / "photos", folder / "answers"
    source.mkdir()
    target.mkdir()
    paths = [source / f"{i}.jpg" for i in range(len(jpegs))]
    for path, jpeg in zip(paths, jpegs):
        path.write_bytes(jpeg)
    job = {"sdk": sdk, "image": TAG, "serve": {"model_data": model_data, "images": [str(p) for p in paths],
                                               "transform": [str(source), str(target)]}}
    out = subprocess.run([str(python), str(REPO / "tests" / "image" / "sdk_local_run.py"), json.dumps(job)], cwd=folder,
                         env=env, capture_output=True, text=True, timeout=wait_s(900))
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] is None, log[-4000:]
    with tarfile.open(model_data) as tar:
        tar.extractall(folder / "served", filter="data")
    expected = tf.saved_model.load(str(folder / "served" / "1")).signatures["serving_default"](
        image_bytes=tf.constant(jpegs))["classes"].numpy()
    labels = [label.decode() for label in expected]
    assert [answer["predicted_label"] for answer in result["answers"]] == labels, result["answers"]
    for answer in result["answers"]:
        assert sorted(answer["labels"]) == sorted(CLASSES) and abs(sum(answer["probabilities"]) - 1) < 1e-4
    if sdk == "v2":
        assert sorted(os.listdir(target)) == sorted(f"{p.name}.out" for p in paths), os.listdir(target)
        for path, label in zip(paths, labels):
            (line,) = (target / f"{path.name}.out").read_text().splitlines()
            assert json.loads(line)["predicted_label"] == label


def test_v2_estimator_local_mode_two_hosts_finish_together_and_the_model_serves(docker_api, digit_folders, tmp_path):
    """(One host: docs/image.md's snippet, run by tests/docs.)"""
    result, log = run_with_sdk(sdk2_python(), "v2", docker_api, digit_folders, hosts=2)
    assert result["error"] is None, log[-4000:]
    # the SDK's str() forms, read as given: no class named "['zero'"
    assert "class_names=('zero', 'one', 'two'" in log and "mixed_precision=false" in log, log[-4000:]
    assert "MultiWorkerMirroredStrategy: 2 worker(s)" in log
    assert "waiting for the chief to export the model" in log
    assert_complete_artifacts(result["artifacts"], tmp_path, digit_folders / "validation")
    served_with_sdk(sdk2_python(), "v2", docker_api, os.path.join(result["artifacts"], "model.tar.gz"), tmp_path)


def test_v3_model_trainer_local_container_and_the_model_serves(docker_api, digit_folders, tmp_path):
    result, log = run_with_sdk(sys.executable, "v3", docker_api, digit_folders)
    assert result["error"] is None, log[-4000:]
    assert_complete_artifacts(result["artifacts"], tmp_path, digit_folders / "validation")
    served_with_sdk(sys.executable, "v3", docker_api, os.path.join(result["artifacts"], "model.tar.gz"), tmp_path)


def test_a_failing_job_surfaces_its_reason_through_the_sdk(docker_api, digit_folders):
    result, log = run_with_sdk(sdk2_python(), "v2", docker_api, digit_folders, epochs=-1)
    reason = "Configuration error: hyperparameter epochs must be >= 0, got -1"
    assert reason in log  # streamed by the SDK from the container
    failure = members(os.path.join(result["artifacts"], "output.tar.gz"))["failure"].decode()
    assert failure.startswith(reason), failure[:500]
    assert "model.tar.gz" not in os.listdir(result["artifacts"]) or not members(
        os.path.join(result["artifacts"], "model.tar.gz")), "a failed job exported a model"
    # the SDK raises with the job's exit code (on Docker Engine, every time: docs/image.md)
    assert result["error"] is not None and "Process exited with code: 2" in result["error"], result


def test_the_incremental_notebooks_sdk_cells_train_deploy_and_get_each_class(docker_api, tmp_path):
    """Image-classification-incremental-training-highlevel.ipynb's own SDK v2 cells under the SDK's
    local mode, unchanged but for instance_type "local", file:// folders for its S3 prefixes and
    this image for the built-in's: its Estimator, set_hyperparameters, its .rec channels
    (TrainingInput, application/x-recordio), fit, deploy, and its cell 35 asking the local endpoint
    for each photo's class (SDK v2's Predictor, IdentitySerializer("image/jpeg")). Its first job's
    hyperparameters as it sets them (a ResNet-18 from scratch at 224 pixels, 2 epochs of batches of
    256 at learning rate 0.1): on these 288 photos, 2 steps an epoch. Epoch 1 validated at 1.0 here,
    epoch 2 (at that learning rate) at 0, and the dialect exports the best epoch, as MXNet's does.
    (Before BatchNorm statistics were recomputed after each epoch, precise_batchnorm.py, epoch 2's
    validation loss was 1.5e6 and the test used the full-training notebook's request instead.)"""
    from tests.builtin import notebooks
    from tests.builtin.test_notebooks import COLORS, asked_files, labelled, rec_file

    count = 96  # (photos of each colour: 288)
    for role, photos, seed in (("train", count, 1), ("validation", 8, 2)):
        rec_file(tmp_path / role / f"{role}.rec", labelled(COLORS, photos, seed))
    asked = asked_files(tmp_path / "asked", COLORS)
    job = {"sdk": "v2", "image": TAG, "output": str(tmp_path / "out"), "notebook": {
        "hyperparameters": notebooks.mxnet_incremental_values(len(COLORS), count * len(COLORS), continued=False),
        "channels": {role: str(tmp_path / role) for role in ("train", "validation")}, "classes": list(COLORS),
        "images": [path for paths in asked.values() for path in paths]}}
    (tmp_path / "out").mkdir()
    out = subprocess.run([str(sdk2_python()), str(REPO / "tests" / "image" / "sdk_local_run.py"), json.dumps(job)],
                         cwd=tmp_path, env=docker_api, capture_output=True, text=True, timeout=wait_s(1200))
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] is None, log[-4000:]
    assert "dialect mxnet: the hyperparameters are read with the built-in MXNet" in log, log[-4000:]
    assert result["answers"] == [color for color in COLORS for _ in asked[color]], "\n".join(
        line for line in log.splitlines() if "metrics:" in line)
