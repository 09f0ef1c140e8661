"""MLflow tracking from the job, when MLFLOW_TRACKING_URI is set (SageMaker passes it in the
training request's Environment; `keras-pipe submit`, `tune` and `local` set it with
--mlflow-tracking-uri):

    MLFLOW_TRACKING_URI     an http(s):// server, a local folder (MLflow's file store, which
                            MLflow 3 keeps only when MLFLOW_ALLOW_FILE_STORE=true: set), or a
                            SageMaker managed MLflow tracking server's ARN (the sagemaker-mlflow
                            plugin signs its requests with the job's role)
    MLFLOW_EXPERIMENT_NAME  the run's experiment, created when missing (the launcher sets the
                            tuning job's name for a tuning job's trainings); MLflow's default
                            experiment without it

One run per training job, named after it, logged by the chief host alone (a job that resumes from
its own checkpoint, as a spot job's new instance does, goes on in its run; a job started over under
the same name gets a new run):
    params      every hyperparameter as the job read it, after its dialect's translation, and
                `dialect`
    metrics     each epoch's, at step = the epoch (1, 2, ...), as metrics.json has them
    tags        sagemaker.training_job_name, sagemaker.training_job_arn (TRAINING_JOB_ARN, which
                SageMaker sets), keras_pipe.output (where the job's model.tar.gz and output.tar.gz
                go: S3OutputPath/JOB/output/ from KERAS_PIPE_OUTPUT, which the launcher sets to the
                request's S3OutputPath, or a local job's folder), keras_pipe.host; on a failed run
                keras_pipe.failure (why), on a resumed one keras_pipe.changed_on_resume (the params
                changed since, kept as first logged)
    artifacts   output/: output/data's files (evaluation.json, metrics.json, report.html, its
                pictures, the label check's); model/: the exported model as an MLflow pyfunc model
                (MLmodel, code/keras_pipe_pyfunc.py, the SavedModel and classes.json), which
                `mlflow.pyfunc.load_model("runs:/RUN/model")` and `mlflow models serve` load
                with MLflow and TensorFlow alone

Tracking never fails or slows the job. Every call runs on a thread of its own, in order; the job
only hands them over. A call that fails (the server unreachable, refusing, or the credentials
wrong) is a warning in the log and in output/data/tracking.json, and the calls after it are
skipped: each would wait its own timeout. At the job's end the job waits for the calls still
queued at most FINISH_BUDGET_S (STOPPED_BUDGET_S when stopped), then leaves them. MLflow's HTTP requests time out after
HTTP_TIMEOUT_S, retried HTTP_RETRIES times, unless MLFLOW_HTTP_REQUEST_TIMEOUT and
MLFLOW_HTTP_REQUEST_MAX_RETRIES say otherwise. The job's start pays for importing mlflow
(docs/speed.md, Figures behind the code's choices: Importing mlflow). A tracking URI's user and
password never reach the log (redacted), nor does an error's text that holds them.

Why the model's MLmodel file is written here rather than by mlflow.pyfunc.log_model: that module
imports pandas, 60 MB more in the image for a YAML file of a documented format (MLflow's "Storage
format": a python_function flavor with a loader_module, its code and data); the tests load it with
MLflow's own mlflow.pyfunc.load_model.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import queue
import re
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from keras_pipe_train.settings.url_credentials import redacted, redacted_value

log = logging.getLogger(__name__)

URI = "MLFLOW_TRACKING_URI"
EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
OUTPUT = "KERAS_PIPE_OUTPUT"  # where the job's outputs go, as the launcher knows it (the job cannot)
FINISH_BUDGET_S = 120.0  # the most the job's end waits for the calls still queued
STOPPED_BUDGET_S = 15.0  # the same, for a job stopped (SIGTERM), which SageMaker kills 120 s later
HTTP_TIMEOUT_S, HTTP_RETRIES = 20, 2
MAX_PARAM = 6000  # characters of a param's value MLflow keeps
STATUS_NAME = "tracking.json"  # in output/data: where the run is, or why it is not
JOB_TAG = "sagemaker.training_job_name"
FAILURE_TAG = "keras_pipe.failure"


def enabled() -> bool:
    return bool(os.environ.get(URI, "").strip())


class Tracker:
    """The calls to MLflow, on a thread of their own (module docstring). A job that does not track
    (no MLFLOW_TRACKING_URI, or not the chief) has a NoTracker."""

    def __init__(self, client, run_name: str, experiment: str | None, tags: dict[str, str]):
        self.client, self.run_id = client, None
        self.run_name, self.experiment, self.tags = run_name, experiment, tags
        self.problem: str | None = None
        self._begun = False
        self._calls: queue.Queue[tuple[Callable[[], None], bool] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="mlflow-tracking", daemon=True)
        self._thread.start()

    def _put(self, call: Callable[[], None], always: bool = False) -> None:
        """Queues `call`; after a failed call only those marked `always` are made (ending the run)."""
        self._calls.put((call, always))

    def _work(self) -> None:
        while (item := self._calls.get()) is not None:
            call, always = item
            if self.problem is None or always:
                try:
                    call()
                except Exception as err:  # (anything MLflow or the network raise: tracking never fails the job)
                    problem = redacted(f"{type(err).__name__}: {err}")[:2000]
                    self.problem = self.problem or problem
                    log.warning("MLflow tracking at %s failed, the job goes on without it: %s",
                                redacted_value(os.environ.get(URI, "")), problem)

    def begin(self, config, resuming: bool) -> None:
        """Queues the run's start with `config`'s hyperparameters (as set up: a JumpStart model's
        backbone and image size put in): a new run, or, for a job `resuming` from its own
        checkpoint (a spot job's new instance, `keras-pipe local --resume`), the run its earlier
        start made, with only the params it lacks added (MLflow refuses a param changed)."""
        self._begun = True
        params = params_of(config)
        self._put(lambda: self._start(params, resuming))

    def _start(self, params: dict[str, str], resuming: bool) -> None:
        from mlflow.entities import Param

        experiment_id = self._experiment_id()
        earlier = (self.client.search_runs([experiment_id], f"tags.`{JOB_TAG}` = '{self.run_name}'",
                                           max_results=1, order_by=["attributes.start_time DESC"])
                   if resuming else [])
        if earlier:
            self.run_id = earlier[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            if FAILURE_TAG in earlier[0].data.tags:  # (an earlier start's failure, which this start may not share)
                self.client.delete_tag(self.run_id, FAILURE_TAG)
            logged = earlier[0].data.params
            changed = sorted(key for key, value in params.items() if key in logged and logged[key] != value[:MAX_PARAM])
            if changed:
                self.client.set_tag(self.run_id, "keras_pipe.changed_on_resume", ", ".join(changed)[:MAX_PARAM])
            params = {key: value for key, value in params.items() if key not in logged}
        else:
            self.run_id = self.client.create_run(experiment_id, run_name=self.run_name, tags=self.tags).info.run_id
        items = [Param(key, value[:MAX_PARAM]) for key, value in params.items()]
        for first in range(0, len(items), 100):  # (MLflow's most params in one batch)
            self.client.log_batch(self.run_id, params=items[first:first + 100])
        log.info("MLflow tracking: run %s (%s) in experiment %s at %s", self.run_id, self.run_name,
                 self.experiment or "Default", redacted_value(os.environ.get(URI, "")))

    def _experiment_id(self) -> str:
        """The experiment's id, created when missing. A tuning job's trainings start together: one
        creates it, the others find it created (RESOURCE_ALREADY_EXISTS) and look again."""
        from mlflow.exceptions import MlflowException

        if not self.experiment:
            return "0"  # (MLflow's default experiment)
        if found := self.client.get_experiment_by_name(self.experiment):
            return found.experiment_id
        try:
            return self.client.create_experiment(self.experiment)
        except MlflowException as err:
            found = self.client.get_experiment_by_name(self.experiment) if err.error_code == "RESOURCE_ALREADY_EXISTS" \
                else None
            if found is None:
                raise
            return found.experiment_id

    def epoch(self, step: int, values: dict) -> None:
        """Queues an epoch's metrics (its numeric values) at `step`."""
        from mlflow.entities import Metric

        now = int(datetime.datetime.now().timestamp() * 1000)
        metrics = [Metric(_metric_key(key), float(value), now, step) for key, value in values.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "epoch"]
        self._put(lambda: self.client.log_batch(self.run_id, metrics=metrics))

    def finish(self, status: str, output_data: Path, model_dir: Path | None, budget_s: float = FINISH_BUDGET_S,
               config=None, reason: str | None = None) -> None:
        """Queues the outputs, the run's end (`status`: FINISHED, FAILED or KILLED, with `reason`
        as a tag; a stopped job's end before its outputs) and the model, then waits for the queue
        at most `budget_s`; says where the run is, or why not, in output/data. A run not begun (the
        job failed setting up) is begun with `config` first. The run is ended even after a call
        failed: it stays RUNNING only when its server does not answer within the budget."""
        if not self._begun and config is not None:
            self.begin(config, resuming=False)
        # (a stopped job has 15 s: the run's end first, its outputs after it if time is left)
        if status == "KILLED":
            self._put(lambda: self._end(status, reason), always=True)
        self._put(lambda: self._log_outputs(output_data))
        if status != "KILLED":
            self._put(lambda: self._end(status, reason), always=True)
        if model_dir is not None and (model_dir / "1").is_dir():
            self._put(lambda: self._log_model(model_dir))  # (last: the largest, and the run already ended)
        self._calls.put(None)
        self._thread.join(budget_s)
        if self._thread.is_alive():
            self.problem = self.problem or f"the calls to MLflow were not done within {budget_s:.0f} s: left unfinished"
            log.warning("MLflow tracking: %s", self.problem)
        write_status(output_data, self.run_id, self.problem)

    def _end(self, status: str, reason: str | None) -> None:
        if self.run_id is None:
            return
        if reason:
            self.client.set_tag(self.run_id, FAILURE_TAG, redacted(reason)[:MAX_PARAM])
        self.client.set_terminated(self.run_id, status)

    def _log_outputs(self, output_data: Path) -> None:
        if output_data.is_dir():
            for path in sorted(output_data.iterdir()):
                if path.is_file() and path.name != STATUS_NAME:
                    self.client.log_artifact(self.run_id, str(path), "output")

    def _log_model(self, model_dir: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="mlflow-model-") as staging:
            pyfunc_model(model_dir, Path(staging) / "model")
            self.client.log_artifacts(self.run_id, str(Path(staging) / "model"), "model")


class NoTracker:
    def begin(self, config, resuming: bool) -> None:
        pass

    def epoch(self, step: int, values: dict) -> None:
        pass

    def finish(self, status: str, output_data: Path, model_dir: Path | None, budget_s: float = 0,
               config=None, reason: str | None = None) -> None:
        pass


def start(is_chief: bool, job_name: str, host: str) -> Tracker | NoTracker:
    """The job's tracker: a Tracker on the chief when MLFLOW_TRACKING_URI is set (its run begun by
    Tracker.begin, or at its end)."""
    if not (enabled() and is_chief):
        return NoTracker()
    # MLflow 3 sends usage telemetry to Databricks unless told not to: a training job reports nothing
    # to anyone its user did not name (MLFLOW_DISABLE_TELEMETRY=false in the job's environment allows it)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(HTTP_TIMEOUT_S))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(HTTP_RETRIES))
    if not os.environ[URI].strip().startswith("arn:"):
        # AWS's sagemaker-mlflow plugin (0.5.0) reads every tracking URI as an ARN to make a header of it,
        # and MLflow warns on each request when that fails: noise, once per call, for any other server
        # (aws/sagemaker-mlflow#15)
        logging.getLogger("mlflow.tracking.request_header.registry").setLevel(logging.ERROR)
    if _is_local_path(os.environ[URI].strip()):
        # MLflow 3 keeps its file store "in maintenance mode" and refuses it unless asked; the image has no
        # SQLAlchemy for sqlite:// (mlflow-skinny): a folder is what a job without a server can write to
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=os.environ[URI].strip())
    except Exception as err:  # (mlflow missing, or no plugin for the URI's scheme: the job goes on)
        log.warning("MLflow tracking at %s cannot start, the job goes on without it: %s",
                    redacted_value(os.environ[URI]), redacted(f"{type(err).__name__}: {err}"))
        return NoTracker()
    return Tracker(client, job_name, os.environ.get(EXPERIMENT, "").strip() or None, tags_of(job_name, host))


def _is_local_path(uri: str) -> bool:
    return uri.startswith(("/", "./", "../", "file:")) or "://" not in uri and not uri.startswith("arn:")


def params_of(config) -> dict[str, str]:
    """Every hyperparameter as the job read it (the dialect's translation done), as text."""
    import dataclasses

    from keras_pipe_train.settings.config import READING_NOTES

    return {field.name: _text(getattr(config, field.name)) for field in dataclasses.fields(config)
            if field.name not in READING_NOTES}


def _text(value) -> str:
    if isinstance(value, (tuple, list)):
        return json.dumps(list(value), ensure_ascii=False)
    return "" if value is None else str(value)


def tags_of(job_name: str, host: str) -> dict[str, str]:
    tags = {JOB_TAG: job_name, "keras_pipe.host": host,
            "mlflow.source.name": "keras-pipe train", "mlflow.source.type": "JOB"}
    if os.environ.get("TRAINING_JOB_ARN"):
        tags["sagemaker.training_job_arn"] = os.environ["TRAINING_JOB_ARN"]
    if output := os.environ.get(OUTPUT, "").strip():
        # SageMaker writes a job's model.tar.gz and output.tar.gz under OutputDataConfig's S3OutputPath/JOB/output/
        tags["keras_pipe.output"] = f"{output.rstrip('/')}/{job_name}/output/" if output.startswith("s3://") else output
    return tags


def _metric_key(name: str) -> str:
    """A metric's name as MLflow accepts it (letters, digits, _ - . / and spaces)."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]", "_", name)


def write_status(output_data: Path, run_id: str | None, problem: str | None) -> None:
    try:
        output_data.mkdir(parents=True, exist_ok=True)
        (output_data / STATUS_NAME).write_text(json.dumps({
            "tracking_uri": redacted_value(os.environ.get(URI, "")), "run_id": run_id, "logged": problem is None,
            **({"warning": problem} if problem else {})}, indent=1) + "\n")
    except OSError as err:
        log.warning("could not write %s: %s", output_data / STATUS_NAME, err)


def pyfunc_model(model_dir: Path, out: Path) -> Path:
    """`model_dir` (the job's export) as an MLflow pyfunc model folder at `out` (module docstring)."""
    from keras_pipe_train.report import keras_pipe_pyfunc

    data = out / keras_pipe_pyfunc.DATA
    data.mkdir(parents=True)
    _linked_copy(model_dir / "1", data / "1")
    shutil.copy2(model_dir / "classes.json", data / "classes.json")
    (out / "code").mkdir()
    shutil.copy2(keras_pipe_pyfunc.__file__, out / "code" / "keras_pipe_pyfunc.py")
    version = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    requirements = _requirements()
    # the environments `mlflow models serve` (and MLflow's other model tools) build for the model:
    # virtualenv (MLflow's default) or conda, both from these requirements (JSON is YAML: MLflow
    # reads these files and MLmodel with yaml.safe_load)
    (out / "requirements.txt").write_text("\n".join(requirements) + "\n")
    (out / "python_env.yaml").write_text(json.dumps({"python": version, "build_dependencies": ["pip"],
                                                     "dependencies": ["-r requirements.txt"]}, indent=1) + "\n")
    (out / "conda.yaml").write_text(json.dumps({"name": "mlflow-env", "channels": ["conda-forge"], "dependencies": [
        f"python={version}", "pip", {"pip": requirements}]}, indent=1) + "\n")
    (out / "MLmodel").write_text(json.dumps({
        "artifact_path": "model", "model_uuid": uuid.uuid4().hex,
        "utc_time_created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f"),
        "mlflow_version": _version("mlflow-skinny") or _version("mlflow") or "",
        "flavors": {"python_function": {"loader_module": "keras_pipe_pyfunc", "code": "code",
                                        "data": keras_pipe_pyfunc.DATA, "python_version": version,
                                        "env": {"conda": "conda.yaml", "virtualenv": "python_env.yaml"}}}},
        indent=1) + "\n")
    return out


def _linked_copy(source: Path, target: Path) -> None:
    """A copy of the SavedModel's folder, its files hard links where the file system allows."""
    def link_or_copy(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link_or_copy)


def _requirements() -> list[str]:
    """What the model needs: MLflow itself (whole: `mlflow models serve` needs its server, which
    mlflow-skinny lacks), this TensorFlow, and pandas (mlflow.pyfunc's)."""
    mlflow = _version("mlflow-skinny") or _version("mlflow")
    tensorflow = _version("tensorflow") or _version("tensorflow-cpu")  # (the image's is tensorflow-cpu on CPUs)
    return [f"mlflow=={mlflow}" if mlflow else "mlflow", f"tensorflow=={tensorflow}" if tensorflow else "tensorflow",
            f"pandas=={pandas}" if (pandas := _version("pandas")) else "pandas"]


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
