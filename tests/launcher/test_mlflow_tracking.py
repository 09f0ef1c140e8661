"""MLflow tracking from the job (train/keras_pipe_train/report/tracking.py), against a real MLflow
tracking server on 127.0.0.1 (`mlflow server`, a SQLite store, artifacts served by the server),
the job run as SageMaker runs it through `keras-pipe local --mlflow-tracking-uri`; the run read
back with MLflow's own client: params, each epoch's metrics, the artifacts, and the model loaded
by mlflow.pyfunc, which predicts what the job's own export predicts. (Two hosts, the chief alone
logging: docs/local.md, run as written by tests/docs. A job whose server is down:
tests/launcher/test_local_runner.py's Pipe-mode job. In the image: tests/image/test_container.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import QUICK, launch_local
from tests.serve.conftest import free_port
from tests.timeouts import wait_s

MLFLOW = str(Path(sys.executable).parent / "mlflow")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on 127.0.0.1: runs in SQLite, artifacts under the server's own folder, served
    to clients over HTTP (mlflow-artifacts:)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = open(root / "server.log", "w")
    server = subprocess.Popen([MLFLOW, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                               "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                               "--artifacts-destination", str(root / "artifacts")],
                              cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + wait_s(120)
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=5)
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
            time.sleep(0.5)
    yield url
    os.killpg(server.pid, 15)
    server.wait(timeout=30)


def runs_named(url: str, experiment: str, name: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(url)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment}"
    return client.search_runs([found.experiment_id], f"attributes.run_name = '{name}'")


def served_classes(model_dir: Path, images: list[bytes]) -> list[str]:
    import tensorflow as tf

    serve = tf.saved_model.load(str(model_dir / "1")).signatures["serving_default"]
    return [c.decode() for c in serve(image_bytes=tf.constant(images))["classes"].numpy()]


@pytest.mark.slow
def test_a_job_tracks_its_run_params_metrics_artifacts_and_a_model_mlflow_loads(mlflow_server, digit_folders,
                                                                                 digit_records, monkeypatch):
    import base64

    import mlflow.pyfunc
    import pandas as pd
    from mlflow import MlflowClient

    port = mlflow_server.rsplit(":", 1)[1]
    # (credentials, as a server behind basic auth takes them: never in the log)
    out = launch_local("--train", "train", "--validation", "validation", "--hp", "epochs=2", *QUICK,
                       "--hp", "seed=7", "--name", "tracked-1", "--env", "MLFLOW_TRACKING_USERNAME=someone",
                       "--env", "MLFLOW_TRACKING_PASSWORD=s3cret-Pass",
                       "--mlflow-tracking-uri", mlflow_server, "--mlflow-experiment", "digits", cwd=digit_folders)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "s3cret-Pass" not in out.stdout + out.stderr
    assert "MLflow tracking: run " in out.stdout and f"in experiment digits at {mlflow_server}" in out.stdout
    # refused before --fresh would empty the job's folder (read below)
    refused = launch_local("--train", "train", *QUICK, "--name", "tracked-1", "--fresh",
                           "--mlflow-tracking-uri", f"http://a:b@127.0.0.1:{port}", cwd=digit_folders)
    assert refused.returncode == 2 and "give them as --env MLFLOW_TRACKING_USERNAME" in refused.stderr
    (run,) = runs_named(mlflow_server, "digits", "tracked-1")
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["dialect"] == "keras-pipe" and params["epochs"] == "2" and params["image_size"] == "32"
    assert params["seed"] == "7" and params["num_classes"] == "10" and "dialect_notes" not in params
    tags = run.data.tags
    assert tags["sagemaker.training_job_name"] == "tracked-1" and tags["keras_pipe.host"] == "algo-1"
    assert tags["keras_pipe.output"] == str((digit_folders / "local-jobs/tracked-1").resolve())
    client = MlflowClient(mlflow_server)
    history = client.get_metric_history(run.info.run_id, "val_accuracy")
    metrics = json.loads((digit_folders / "local-jobs/tracked-1/algo-1/output/data/metrics.json").read_text())
    assert [(m.step, round(m.value, 6)) for m in history] == [
        (row["epoch"], round(row["val_accuracy"], 6)) for row in metrics["epochs"]]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "output")}
    assert {"output/evaluation.json", "output/metrics.json", "output/report.html",
            "output/confusion_matrix.png"} <= artifacts, artifacts
    status = json.loads((digit_folders / "local-jobs/tracked-1/algo-1/output/data/tracking.json").read_text())
    assert status == {"tracking_uri": mlflow_server, "run_id": run.info.run_id, "logged": True}
    # the model, as MLflow loads it: the classes the job's own export serves, for the same images
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # (where runs:/ URIs are looked up)
    model = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    images = _jpegs(digit_records)
    predicted = model.predict(pd.DataFrame({"image": images}))
    exported = served_classes(digit_folders / "local-jobs/tracked-1/algo-1/model", images)
    assert list(predicted["class"]) == exported
    assert [len(p) for p in predicted["probabilities"]] == [10] * len(images)
    # base64 text, as JSON (and `mlflow models serve`) carries bytes: the same answers
    again = model.predict([base64.b64encode(image).decode() for image in images])
    assert list(again["class"]) == exported


def _jpegs(digit_records) -> list[bytes]:
    """Twelve of the held-out digits' encoded images, from their Examples."""
    import tensorflow as tf

    examples, _ = digit_records
    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
    return [tf.io.parse_single_example(e, features)["image/encoded"].numpy() for e in examples[1400:1412]]
