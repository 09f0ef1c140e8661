"""MLflow tracking's parts that need no job (train/keras_pipe_train/report/tracking.py): credentials
redacted, the hyperparameters as params, a server that is down or never answers costing the job at
most its budget, and the exported model as an MLflow pyfunc folder. (A job tracked by a real
`mlflow server`, one host and two, and a job whose server is down: tests/launcher/test_mlflow_tracking.py.)"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from keras_pipe_train.report import tracking


def test_credentials_in_a_uri_are_redacted_wherever_they_are_in_the_text():
    assert tracking.redacted("https://user:p%40ss@mlflow.example.com/x") == "https://***@mlflow.example.com/x"
    assert tracking.redacted("failed: HTTPConnectionPool(host='h') url http://a:b@h:5000/api") == \
        "failed: HTTPConnectionPool(host='h') url http://***@h:5000/api"
    arn = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/team"
    assert tracking.redacted(arn) == arn and tracking.redacted("http://h:5000") == "http://h:5000"


def test_params_are_every_hyperparameter_as_the_job_read_it():
    from keras_pipe_train.settings.config import JobConfig

    config = JobConfig.from_hyperparameters({"num_layers": "18", "num_classes": "3", "epochs": "2",
                                             "image_shape": "3,64,64", "class_names": "cat,dog,ünï"})
    params = tracking.params_of(config)
    assert params["dialect"] == "mxnet" and params["backbone"] == "resnet18" and params["epochs"] == "2"
    assert params["class_names"] == '["cat", "dog", "ünï"]' and "dialect_notes" not in params
    assert all(isinstance(value, str) for value in params.values())


@pytest.fixture
def no_retries(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


def dead_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_server_that_is_down_is_one_warning_and_its_calls_are_skipped(tmp_path, monkeypatch, no_retries, caplog):
    from mlflow import MlflowClient

    uri = f"http://user:hidden@127.0.0.1:{dead_port()}"
    monkeypatch.setenv(tracking.URI, uri)
    tracker = tracking.Tracker(MlflowClient(uri), "job-1", "experiment", {"epochs": "2"}, {})
    for epoch in (1, 2):
        tracker.epoch(epoch, {"loss": 0.5, "phase": "head"})
    started = time.monotonic()
    tracker.finish("FINISHED", tmp_path / "data", None, budget_s=60)
    assert time.monotonic() - started < 30
    status = json.loads((tmp_path / "data" / tracking.STATUS_NAME).read_text())
    assert status["logged"] is False and status["run_id"] is None and "hidden" not in json.dumps(status)
    warnings = [r.getMessage() for r in caplog.records if "MLflow tracking" in r.getMessage()]
    assert len(warnings) == 1 and "hidden" not in warnings[0] and "the job goes on without it" in warnings[0]


def test_a_server_that_never_answers_costs_the_job_its_budget_and_no_more(tmp_path, monkeypatch, caplog):
    from mlflow import MlflowClient

    with socket.socket() as silent:  # (accepts connections, answers nothing)
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setenv(tracking.URI, uri)
        tracker = tracking.Tracker(MlflowClient(uri), "job-2", None, {}, {})
        started = time.monotonic()
        tracker.finish("FINISHED", tmp_path, None, budget_s=1.5)
        waited = time.monotonic() - started
    assert 1.4 <= waited < 10, waited
    status = json.loads((tmp_path / tracking.STATUS_NAME).read_text())
    assert status["logged"] is False and "not done within 2 s" in status["warning"]


def test_the_export_becomes_an_mlflow_pyfunc_model_folder(tmp_path):
    model_dir = tmp_path / "model"
    (model_dir / "1" / "variables").mkdir(parents=True)
    (model_dir / "1" / "saved_model.pb").write_bytes(b"graph")
    (model_dir / "1" / "variables" / "variables.index").write_bytes(b"index")
    (model_dir / "classes.json").write_text('["cat", "dog"]')
    out = tracking.pyfunc_model(model_dir, tmp_path / "staged" / "model")
    import yaml

    flavor = yaml.safe_load((out / "MLmodel").read_text())["flavors"]["python_function"]
    assert flavor["loader_module"] == "keras_pipe_pyfunc" and flavor["code"] == "code" and flavor["data"] == \
        "saved_model"
    assert (out / "code" / "keras_pipe_pyfunc.py").read_text() == Path(
        tracking.__file__).with_name("keras_pipe_pyfunc.py").read_text()
    assert (out / "saved_model" / "1" / "variables" / "variables.index").read_bytes() == b"index"
    assert json.loads((out / "saved_model" / "classes.json").read_text()) == ["cat", "dog"]
    requirements = (out / "requirements.txt").read_text().split()
    assert requirements[0].startswith("tensorflow==2.21") and requirements[1].startswith("pandas")
