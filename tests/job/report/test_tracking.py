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


@pytest.mark.parametrize("written, shown", [
    ("https://u:p@ss@h:5000/api", "https://***@h:5000/api"),  # (an unescaped @ in the password)
    ("https://u:pa/ss@h/api", "https://***@h/api"),  # (a / in it: urlsplit would see host "u")
    ("  https://u:p@h", "  https://***@h"),
    ("https://h/api?token=abc&run=1", "https://h/api?token=***&run=1"),
    ("'http://h/x?X-Amz-Signature=f00d'", "'http://h/x?X-Amz-Signature=***'"),
    ("s3://bucket/photos/cat@2x.png", "s3://bucket/photos/cat@2x.png"),  # (an @ in a path is no user)
])
def test_every_form_of_credentials_in_a_url_is_found_and_hidden(written, shown):
    from keras_pipe_train.settings import url_credentials

    assert url_credentials.redacted(written) == shown
    assert url_credentials.has_credentials(written) is (written != shown)


@pytest.mark.parametrize("setting, shown", [
    ("https://alice:pa'ss@mlflow.example.com", "https://***@mlflow.example.com"),  # (quotes and spaces: one URL)
    ('https://alice:p"a ss@mlflow.example.com/', "https://***@mlflow.example.com/"),
    ("http://u:p@[::1]:5000/", "http://***@[::1]:5000/"),
    ("http://host:5000/path/file@2x.png", "http://host:5000/path/file@2x.png"),  # (a port, then a path's @)
    ("http://mlflow:5000/#/experiments/1?user=a@b.com", "http://mlflow:5000/#/experiments/1?user=a@b.com"),
])
def test_a_setting_that_is_one_url_is_read_whole(setting, shown):
    from keras_pipe_train.settings import url_credentials

    assert url_credentials.redacted_value(setting) == shown
    assert url_credentials.has_credentials(setting) is (setting != shown)


def test_params_are_every_hyperparameter_as_the_job_read_it():
    from keras_pipe_train.settings.config import JobConfig

    config = JobConfig.from_hyperparameters({"num_layers": "18", "num_classes": "3", "epochs": "2",
                                             "image_shape": "3,64,64", "class_names": "cat,dog,ünï"})
    params = tracking.params_of(config)
    assert params["dialect"] == "mxnet" and params["backbone"] == "resnet18" and params["epochs"] == "2"
    assert params["class_names"] == '["cat", "dog", "ünï"]' and "dialect_notes" not in params
    assert all(isinstance(value, str) for value in params.values())


def job_config(**values):
    from keras_pipe_train.settings.config import JobConfig

    return JobConfig.from_hyperparameters({"num_classes": "2", **values})


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
    tracker = tracking.Tracker(MlflowClient(uri), "job-1", "experiment", {})
    tracker.begin(job_config(epochs="2"), resuming=False)
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
        tracker = tracking.Tracker(MlflowClient(uri), "job-2", None, {})
        tracker.begin(job_config(), resuming=False)
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
    assert requirements[0].startswith("mlflow==3.") and requirements[1].startswith("tensorflow==2.21")
    assert requirements[2].startswith("pandas")
    # the environments MLflow builds to serve it, read as MLflow reads them
    from mlflow.utils.environment import _PythonEnv

    assert _PythonEnv.from_yaml(out / "python_env.yaml").dependencies == ["-r requirements.txt"]
    conda = yaml.safe_load((out / "conda.yaml").read_text())
    assert conda["dependencies"][-1] == {"pip": requirements} and flavor["env"]["conda"] == "conda.yaml"


@pytest.fixture
def file_store(tmp_path, monkeypatch):
    """An MLflow file store in tmp_path (what a job without a server logs to), as MLFLOW_TRACKING_URI."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = str(tmp_path / "mlruns")
    monkeypatch.setenv(tracking.URI, uri)
    return uri


def tracked(uri: str, job: str, config, tmp_path: Path, resuming: bool, client=None, epochs: int = 1,
            status: str = "FINISHED", reason: str | None = None, budget_s: float = 60) -> str:
    from mlflow import MlflowClient

    tracker = tracking.Tracker(client or MlflowClient(uri), job, "experiment", tracking.tags_of(job, "algo-1"))
    tracker.begin(config, resuming=resuming)
    for epoch in range(1, epochs + 1):
        tracker.epoch(epoch, {"loss": 1.0 / epoch})
    tracker.finish(status, tmp_path / "data", None, budget_s=budget_s, reason=reason)
    return json.loads((tmp_path / "data" / tracking.STATUS_NAME).read_text())["run_id"]


def test_a_job_resumed_from_its_checkpoint_goes_on_in_its_run_and_one_started_over_gets_a_new_run(
        file_store, tmp_path):
    from mlflow import MlflowClient

    first = tracked(file_store, "job-1", job_config(epochs="2"), tmp_path, resuming=False, status="FAILED",
                    reason="OSError: no space left on device")
    # resumed with more epochs and a param the first start lacked: the run goes on, its params as first logged
    resumed = tracked(file_store, "job-1", job_config(epochs="4", label_smoothing="0.1"), tmp_path,
                      resuming=True, epochs=2)
    run = MlflowClient(file_store).get_run(first)
    assert resumed == first and run.info.status == "FINISHED" and run.data.params["epochs"] == "2"
    assert run.data.tags["keras_pipe.changed_on_resume"] == "epochs, label_smoothing"
    assert tracking.FAILURE_TAG not in run.data.tags  # (the earlier start's failure, not this one's)
    # started over (`keras-pipe local --fresh`), its hyperparameters changed: a run of its own, no refusal
    again = tracked(file_store, "job-1", job_config(epochs="3"), tmp_path, resuming=False)
    assert again != first and MlflowClient(file_store).get_run(again).data.params["epochs"] == "3"
    assert MlflowClient(file_store).get_run(again).info.status == "FINISHED"


def test_the_run_ends_with_its_status_and_reason_even_after_a_call_failed(file_store, tmp_path):
    from mlflow import MlflowClient

    class MetricsRefused(MlflowClient):  # (a server that takes the run's start, then refuses its metrics)
        def log_batch(self, run_id, metrics=(), **kwargs):
            if metrics:
                raise RuntimeError("503 Service Unavailable from https://u:topsecret@mlflow.example.com")
            return super().log_batch(run_id, metrics=metrics, **kwargs)

    run_id = tracked(file_store, "job-2", job_config(), tmp_path, resuming=False, client=MetricsRefused(file_store),
                     status="FAILED", reason="UserError: channel 'train' holds no records")
    run = MlflowClient(file_store).get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["keras_pipe.failure"] == \
        "UserError: channel 'train' holds no records"
    status = json.loads((tmp_path / "data" / tracking.STATUS_NAME).read_text())
    assert status["logged"] is False and "503" in status["warning"] and "topsecret" not in status["warning"]


def test_a_stopped_jobs_run_is_ended_before_its_outputs_are_sent(file_store, tmp_path):
    from mlflow import MlflowClient

    class SlowUploads(MlflowClient):
        def log_artifact(self, *args, **kwargs):
            time.sleep(5)

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "metrics.json").write_text("[]")
    # (the budget over before the upload is: the run is ended all the same)
    run_id = tracked(file_store, "job-5", job_config(), tmp_path, resuming=False, client=SlowUploads(file_store),
                     status="KILLED", budget_s=2)
    assert MlflowClient(file_store).get_run(run_id).info.status == "KILLED"


def test_a_job_that_failed_setting_up_still_has_its_run_with_the_hyperparameters_as_given(file_store, tmp_path):
    from mlflow import MlflowClient

    tracker = tracking.Tracker(MlflowClient(file_store), "job-3", None, tracking.tags_of("job-3", "algo-1"))
    tracker.finish("FAILED", tmp_path / "data", None, budget_s=60, config=job_config(epochs="5"),
                   reason="UserError: hyperparameter epochs=5 ...")
    run_id = json.loads((tmp_path / "data" / tracking.STATUS_NAME).read_text())["run_id"]
    run = MlflowClient(file_store).get_run(run_id)
    assert run.info.status == "FAILED" and run.data.params["epochs"] == "5" and run.info.experiment_id == "0"


def test_trainings_that_create_their_experiment_together_all_log_to_it(file_store, tmp_path):
    from mlflow import MlflowClient

    class Raced(MlflowClient):  # (another training creates the experiment between this one's look and create)
        looked = False

        def get_experiment_by_name(self, name):
            if not self.looked:
                self.looked = True
                MlflowClient(file_store).create_experiment(name)
                return None
            return super().get_experiment_by_name(name)

    run_id = tracked(file_store, "tuning-001", job_config(), tmp_path, resuming=False, client=Raced(file_store))
    experiment = MlflowClient(file_store).get_experiment_by_name("experiment")
    assert MlflowClient(file_store).get_run(run_id).info.experiment_id == experiment.experiment_id


def test_the_output_tag_says_where_sagemaker_puts_the_jobs_archives(monkeypatch):
    monkeypatch.setenv(tracking.OUTPUT, "s3://bucket/jobs/")
    assert tracking.tags_of("job-4", "algo-1")["keras_pipe.output"] == "s3://bucket/jobs/job-4/output/"
    monkeypatch.setenv(tracking.OUTPUT, "/home/me/local-jobs/job-4")
    assert tracking.tags_of("job-4", "algo-1")["keras_pipe.output"] == "/home/me/local-jobs/job-4"
