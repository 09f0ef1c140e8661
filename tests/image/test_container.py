"""The training image itself: built with the local base (docs/image.md), then run through
`keras-pipe local --image` with FIFOs created and fed on the host and read inside the container.

Where no container engine works, these tests are skipped with the reason, never passed."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import QUICK
from tests.engine import ENGINE, RUN_ARGS, TAG

# the first test also builds the image (pip installs TensorFlow into it): minutes on CI
pytestmark = [pytest.mark.container, pytest.mark.slow, pytest.mark.timeout(1800)]

def in_container(*args, cwd):
    env = {**os.environ, "LAUNCH_ENGINE": ENGINE, "LAUNCH_ENGINE_ARGS": RUN_ARGS}
    return [sys.executable, "-m", "keras_pipe_launch", "local", "--image", TAG, *args], dict(cwd=cwd, env=env)


def test_a_pipe_fed_job_runs_in_the_image_and_its_model_serves_there(image, digit_folders, monkeypatch):
    # (tracked in MLflow by the image's mlflow-skinny, into a folder of its /opt/ml: the container has no network)
    command, options = in_container("--train", "train", "--validation", "validation", "--hp", "epochs=2",
                                    *QUICK, "--job-dir", "job", "--mlflow-tracking-uri", "/opt/ml/output/mlruns",
                                    cwd=digit_folders)
    out = subprocess.run(command, capture_output=True, text=True, timeout=900, **options)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "launch | fed algo-1/train pass 1: 600 records" in out.stdout
    assert "algo-1 | metrics: epoch=2" in out.stdout
    model = digit_folders / "job" / "algo-1" / "model"  # written inside, through the bind mount
    for name in ("1/saved_model.pb", "model.keras", "classes.json", "serving.json"):
        assert (model / name).is_file(), name
    tracked_in_the_image(digit_folders / "job" / "algo-1" / "output" / "mlruns", monkeypatch)
    served_in_the_image(model)


def tracked_in_the_image(store, monkeypatch):
    """The run the job in the image logged to MLflow's file store: its params and metrics, and its
    model, which this machine's MLflow loads (its files found where the container wrote them)."""
    import mlflow.pyfunc
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(str(store))
    (run,) = client.search_runs(["0"])
    assert run.info.status == "FINISHED" and run.data.params["epochs"] == "2", run
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == [1, 2]
    artifacts = store / "0" / run.info.run_id / "artifacts"
    assert (artifacts / "output" / "report.html").is_file()
    loaded = mlflow.pyfunc.load_model(str(artifacts / "model"))
    assert loaded.metadata.flavors["python_function"]["loader_module"] == "keras_pipe_pyfunc"


def served_in_the_image(model):
    """`docker run IMAGE serve`, as SageMaker hosts a model: the model at /opt/ml/model, real HTTP
    (on the host network, at SAGEMAKER_BIND_TO_PORT), answers as the SavedModel's own; a bad
    request is a 400; SIGTERM (podman stop) ends it cleanly. The container's memory limit (1200 MB,
    as --memory sets its cgroup) is read inside it and weighed in the log; each request has its
    access log line."""
    import json

    import tensorflow as tf

    from keras_pipe_launch.sample_data import digit_jpeg, load_digits
    from tests.serve.conftest import Server, free_port

    port = free_port()
    limits = [a for a in shlex.split(RUN_ARGS) if a not in ("--network", "none")]
    started = subprocess.run([*shlex.split(ENGINE), "run", "-d", "--rm", *limits, "--network", "host",
                              "--memory", "1200m", "-e", f"SAGEMAKER_BIND_TO_PORT={port}",
                              "-v", f"{model}:/opt/ml/model:ro", TAG, "serve"], capture_output=True, text=True,
                             timeout=120)
    assert started.returncode == 0, started.stderr[-2000:]
    container = started.stdout.strip()
    try:
        server = Server.at(port)
        server.wait_until_healthy(logs=lambda: subprocess.run([*shlex.split(ENGINE), "logs", container],
                                                              capture_output=True, text=True).stderr[-3000:])
        images, _ = load_digits()
        jpegs = [digit_jpeg(pixels) for pixels in images[1600:1608]]
        expected = tf.saved_model.load(str(model / "1")).signatures["serving_default"](image_bytes=tf.constant(jpegs))
        for jpeg, label in zip(jpegs, expected["classes"].numpy()):
            status, answer, _ = server.request("POST", "/invocations", jpeg, Content_Type="application/x-image")
            assert status == 200 and json.loads(answer)["predicted_label"] == label.decode(), answer[:300]
        status, answer, _ = server.request("POST", "/invocations", b"not a jpeg", Content_Type="image/jpeg")
        assert status == 400 and "not an image" in json.loads(answer)["error"]
        # (a request's access line is written after its answer is sent, and reaches the engine's log
        # through the container's stdout pipe: read until the last one has come, 10 s at most)
        deadline = time.monotonic() + 10
        while True:
            logs = subprocess.run([*shlex.split(ENGINE), "logs", container], capture_output=True, text=True)
            logs = logs.stdout + logs.stderr  # (the access log on stdout, the server's own on stderr)
            if '"POST /invocations HTTP/1.1" 400 ' in logs or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert re.search(r"1 worker\(s\) \(\d+ CPUs \([^)]+\); no GPU: one worker, calling its model from a thread per "
                         r"core, \d+; "
                         r"(warning: )?the memory limit, 1200 MB, holds \d at about \d+ MB each", logs), logs[-3000:]
        assert logs.count('"POST /invocations HTTP/1.1" 200 ') == 8, logs[-3000:]
        assert '"POST /invocations HTTP/1.1" 400 ' in logs
    finally:
        stopped = subprocess.run([*shlex.split(ENGINE), "stop", "-t", "30", container], capture_output=True,
                                 text=True, timeout=120)
    assert stopped.returncode == 0, stopped.stderr[-2000:]


def test_a_failing_job_in_the_image_writes_its_failure_file(image, digit_folders):
    command, options = in_container("--train", "train", "--hp", "epochs=-3", *QUICK, "--no-validate",
                                    "--job-dir", "job", cwd=digit_folders)
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, **options)
    assert out.returncode == 2, out.stdout[-3000:]
    failure = (digit_folders / "job" / "algo-1" / "output" / "failure").read_text()
    assert failure.startswith("Configuration error: hyperparameter epochs must be >= 0, got -3")


def test_sigterm_stops_the_job_in_the_image_well_within_sagemakers_120_s(image, digit_folders):
    command, options = in_container("--train", "train", "--hp", "epochs=500", *QUICK, "--job-dir", "job",
                                    cwd=digit_folders)
    runner = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **options)
    for line in runner.stdout:
        if "metrics: epoch=1" in line:
            break
    sent = time.monotonic()
    runner.send_signal(signal.SIGTERM)  # what StopTrainingJob or a spot interruption does
    output, _ = runner.communicate(timeout=180)
    assert time.monotonic() - sent < 60, "the job did not stop on SIGTERM (PID 1 without tini?)"
    assert "launch | stopping: SIGTERM sent to the job" in output
    assert runner.returncode == 143, output[-2000:]


def test_prepare_at_scale_runs_each_instance_in_the_image(image, tmp_path, s3_bucket):
    """The Processing job's entry point, as SageMaker runs it: the image, its /opt/ml given."""
    from keras_pipe_launch.sample_data import digit_jpeg, load_digits

    client, bucket = s3_bucket
    images, labels = load_digits()
    for i, (pixels, label) in enumerate(zip(images[:60], labels[:60])):
        client.put_object(Bucket=bucket, Key=f"photos/digit{label}/{i}.jpg", Body=digit_jpeg(pixels))
    env = {**os.environ, "LAUNCH_ENGINE": ENGINE, "LAUNCH_ENGINE_ARGS": RUN_ARGS}
    out = subprocess.run([sys.executable, "-m", "keras_pipe_launch", "prepare", f"s3://{bucket}/photos/",
                          f"s3://{bucket}/prepared/", "--instance-count", "2", "--local", "--image", TAG,
                          "--job-dir", str(tmp_path / "jobs"), "--validation-fraction", "0"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "prepare: 60 train and 0 validation examples of 10 classes" in out.stderr
    for host in ("algo-1", "algo-2"):
        assert f"{host} | prepare {host}: 30 images given, 30 prepared" in out.stdout
    # each instance fingerprinted its share in the image (ImageHash is there): the merge's report measured all
    report = json.loads(client.get_object(Bucket=bucket, Key="prepared/data_report.json")["Body"].read())
    assert report["sizes"]["measured"] == 60 and report["duplicates"]["looked_for"], report["sizes"]


def test_the_images_reader_runs_its_compiled_part(image):
    """The image builds the reader's wheel in a stage with a compiler (Dockerfile) and keeps none:
    its reader frames TFRecords in C, and the same code runs without it where asked."""
    probe = ("from pipemode import tfrecord; import shutil; framing = tfrecord.compiled_framing(); "
             "print(framing.__name__ if framing else None, shutil.which('gcc'))")
    out = subprocess.run([*shlex.split(ENGINE), "run", "--rm", *shlex.split(RUN_ARGS), TAG, "python3", "-c", probe],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["pipemode._framing", "None"]  # compiled, and no compiler left in the image
    pure = subprocess.run([*shlex.split(ENGINE), "run", "--rm", *shlex.split(RUN_ARGS), "-e", "PIPEMODE_PURE_PYTHON=1",
                           TAG, "python3", "-c", probe], capture_output=True, text=True, timeout=300)
    assert pure.stdout.split()[0] == "None", pure.stdout + pure.stderr[-2000:]


def test_the_image_says_what_sagemakers_hosting_may_do_with_it(image):
    """Its labels: SAGEMAKER_BIND_TO_PORT may be set (inference pipelines), and it may be hosted on a
    multi-model endpoint (AWS's guide to bringing a container to one asks for this label)."""
    out = subprocess.run([*shlex.split(ENGINE), "image", "inspect", "--format", "{{json .Config.Labels}}", TAG],
                         capture_output=True, text=True, timeout=60)
    labels = json.loads(out.stdout)
    assert labels["com.amazonaws.sagemaker.capabilities.accept-bind-to-port"] == "true", labels
    assert labels["com.amazonaws.sagemaker.capabilities.multi-models"] == "true", labels


def test_a_keras_hub_preset_in_the_pretrained_channel_trains_in_the_image_without_a_network(image, digit_folders,
                                                                                          tmp_path):
    """keras-hub is in the image, and a preset given in the `pretrained` channel is used in place of
    the download its handle names (the container has no network: a download would fail)."""
    from tests.job.model import hub_presets

    hub_presets.make("vit", str(tmp_path / "vit"))
    hps = ["backbone=kaggle://keras/vit/keras/vit_base_patch16_224_imagenet", "num_classes=10",
           f"image_size={hub_presets.SIZE}", "batch_size=32", "epochs=1"]
    command, options = in_container("--train", "train", "--pretrained", str(tmp_path / "vit"),
                                    *[a for hp in hps for a in ("--hp", hp)], "--job-dir", "job", cwd=digit_folders)
    out = subprocess.run(command, capture_output=True, text=True, timeout=900, **options)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "the keras-hub preset in channel 'pretrained' (" in out.stdout and "in place of downloading it" in out.stdout
    assert "algo-1 | metrics: epoch=1" in out.stdout
    model = digit_folders / "job" / "algo-1" / "model"
    assert (model / "1" / "saved_model.pb").is_file() and (model / "backbone.weights.h5").is_file()
