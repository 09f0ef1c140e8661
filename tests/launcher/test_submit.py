"""`keras-pipe submit`: the request SageMaker's SDK v3 and v2 really send (recorded by moto's server on
127.0.0.1), equal to --dry-run's; every field; every validation error; following a job."""

import contextlib
import functools
import json
import os
import re
import time

import pytest

from keras_pipe_train.training.metrics import METRIC_DEFINITIONS
from tests.conftest import sdk2_python
from tests.launcher.conftest import dry_run_request, launch_cli, sent_through_sdk

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train:latest"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
BASIC = ["--image-uri", IMAGE, "--role", ROLE, "--train", "s3://data/train/", "--output-path", "s3://data/jobs/",
         "--hp", "num_classes=10"]
FULL = [
    "--image-uri", IMAGE, "--role", ROLE,
    "--train", "s3://data/prepared/train/", "--validation", "s3://data/prepared/validation/",
    "--pretrained", "s3://data/weights/backbone.weights.h5",
    "--input-mode", "Pipe", "--distribution", "ShardedByS3Key", "--shuffle-seed", "7",
    "--record-wrapper", "RecordIO", "--compression", "Gzip",
    "--channel-option", "validation:distribution=FullyReplicated", "--channel-option", "validation:shuffle-seed=3",
    "--instance-type", "ml.g5.12xlarge", "--instance-count", "2", "--volume-size", "100",
    "--max-run", "6h", "--spot", "--max-wait", "12h", "--checkpoint-s3-uri", "s3://data/checkpoints/run1/",
    "--tensorboard-s3-uri", "s3://data/tensorboard/run1/", "--output-path", "s3://data/jobs/",
    "--hp", "num_classes=10", "--hp", "backbone=efficientnet_v2_b0", "--hp", "epochs=5",
    "--hp", "weights=pretrained", "--hp", "learning_rate=0.0005",
    "--env", "TF_CPP_MIN_LOG_LEVEL=1", "--tag", "team=vision", "--tag", "project=pipe",
    "--network-isolation", "--base-job-name", "digits-run",
]


launch = functools.partial(launch_cli, "submit")
dry_run = functools.partial(dry_run_request, "submit")


def same_request(a: dict, b: dict) -> None:
    """Equal, but for the seconds in the job names (each run names its job at its own time)."""
    for request in (a, b):
        assert re.fullmatch(r"[a-z0-9-]+-\d{14}", request["TrainingJobName"]), request["TrainingJobName"]
    strip = lambda r: {**r, "TrainingJobName": r["TrainingJobName"][:-14]}  # noqa: E731
    assert strip(a) == strip(b)


@pytest.mark.slow
@pytest.mark.parametrize("args", [BASIC, FULL], ids=["basic", "full"])
def test_sdk_v3_sends_exactly_the_dry_run_request(aws, moto_endpoint, args):
    request, out = sent_through_sdk("submit", "CreateTrainingJob", args, aws, moto_endpoint)
    same_request(request, dry_run(*args))
    assert out.stdout.strip() == request["TrainingJobName"]


@pytest.mark.slow
@pytest.mark.parametrize("args", [BASIC, FULL], ids=["basic", "full"])
def test_sdk_v2_sends_the_same_request_as_v3(aws, moto_endpoint, args):
    request, _ = sent_through_sdk("submit", "CreateTrainingJob", args, aws, moto_endpoint, python=sdk2_python())
    same_request(request, dry_run(*args))


def test_every_field_of_the_job_description_is_in_the_request():
    request = dry_run(*FULL)
    channel = lambda name: next(c for c in request["InputDataConfig"] if c["ChannelName"] == name)  # noqa: E731
    assert channel("train") == {
        "ChannelName": "train", "InputMode": "Pipe", "CompressionType": "Gzip", "RecordWrapperType": "RecordIO",
        "ShuffleConfig": {"Seed": 7},
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/prepared/train/",
                                        "S3DataDistributionType": "ShardedByS3Key"}}}
    assert channel("validation")["DataSource"]["S3DataSource"]["S3DataDistributionType"] == "FullyReplicated"
    assert channel("validation")["ShuffleConfig"] == {"Seed": 3}
    assert channel("pretrained") == {  # one weights file for every host, whatever the job-wide options
        "ChannelName": "pretrained", "InputMode": "File",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/weights/backbone.weights.h5",
                                        "S3DataDistributionType": "FullyReplicated"}}}
    assert request["AlgorithmSpecification"]["TrainingInputMode"] == "Pipe"
    assert request["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    assert [d["Name"] for d in request["AlgorithmSpecification"]["MetricDefinitions"]] == [
        d["Name"] for d in METRIC_DEFINITIONS]
    assert request["RoleArn"] == ROLE
    assert request["ResourceConfig"] == {"InstanceType": "ml.g5.12xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100}
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 6 * 3600, "MaxWaitTimeInSeconds": 12 * 3600}
    assert request["EnableManagedSpotTraining"] is True
    assert request["CheckpointConfig"] == {"S3Uri": "s3://data/checkpoints/run1/", "LocalPath": "/opt/ml/checkpoints"}
    assert request["TensorBoardOutputConfig"] == {"S3OutputPath": "s3://data/tensorboard/run1/",
                                                  "LocalPath": "/opt/ml/output/tensorboard"}
    assert request["OutputDataConfig"] == {"S3OutputPath": "s3://data/jobs/", "CompressionType": "GZIP"}
    assert request["HyperParameters"] == {"num_classes": "10", "backbone": "efficientnet_v2_b0", "epochs": "5",
                                          "weights": "pretrained", "learning_rate": "0.0005"}
    assert request["Environment"] == {"TF_CPP_MIN_LOG_LEVEL": "1"}
    assert request["Tags"] == [{"Key": "team", "Value": "vision"}, {"Key": "project", "Value": "pipe"}]
    assert request["EnableNetworkIsolation"] is True
    assert request["TrainingJobName"].startswith("digits-run-")


def test_a_model_channel_for_incremental_training_is_one_file_every_host_gets():
    out = launch(*BASIC, "--model", "s3://data/jobs/digits-1/output/model.tar.gz", "--instance-count", "2",
                 "--distribution", "ShardedByS3Key", "--network-isolation", "--dry-run")
    assert out.returncode == 0, out.stderr
    channels = {c["ChannelName"]: c for c in json.loads(out.stdout)["InputDataConfig"]}
    assert channels["model"] == {
        "ChannelName": "model", "InputMode": "File",
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/jobs/digits-1/output/model.tar.gz",
                                        "S3DataDistributionType": "FullyReplicated"}}}
    # (its backbone's weights come from the model: no ImageNet download to warn about)
    assert "cannot download ImageNet weights" not in out.stderr and "channel model:" not in out.stderr


def test_dry_run_contacts_nothing():
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_DEFAULT_REGION": "us-east-1"}
    out = launch(*BASIC, "--dry-run", env=env)  # port 9 (discard): any call would fail
    assert out.returncode == 0, out.stderr
    assert "SageMaker SDK" not in out.stderr


@pytest.mark.parametrize("change, message", [
    ({"--train": "s3:/data/train"}, "channel train: 's3:/data/train' is not an S3 URI"),
    ({"--output-path": "s3://Bad_Bucket/x"}, "--output-path: 's3://Bad_Bucket/x': 'Bad_Bucket' is not a valid bucket name"),
    ({"--instance-type": "ml.g5.xxlarge"}, "--instance-type 'ml.g5.xxlarge' is not a SageMaker training instance type"),
    ({"--instance-type": "ml.m5.xlarge"}, "--instance-type ml.m5.xlarge has no GPU; pass --allow-cpu"),
    ({"--instance-type": "ml.trn1.2xlarge"}, "AWS Trainium/Inferentia do not run this TensorFlow image"),
    ({"--instance-count": "0"}, "--instance-count must be >= 1"),
    ({"--role": "SageMakerRole"}, "--role 'SageMakerRole': give the full role ARN"),
    ({"--image-uri": "keras-pipe-train"}, "--image-uri 'keras-pipe-train': expected REGISTRY/REPOSITORY[:TAG]"),
    ({"--spot": None}, "--spot needs --checkpoint-s3-uri"),
    ({"--spot": None, "--checkpoint-s3-uri": "s3://data/c/", "--max-run": "2h", "--max-wait": "1h"},
     "--max-wait (3600 s) must be at least --max-run (7200 s)"),
    ({"--max-wait": "1h"}, "--max-wait only applies to --spot jobs"),
    ({"--hp": "epochs=-2"}, "hyperparameter epochs must be >= 0, got -2"),
    ({"--hp": "optimiser=sgd"}, "unknown hyperparameter optimiser"),
    ({"--base-job-name": "my_job"}, "--base-job-name 'my_job': 1-48 letters, digits and hyphens"),
    ({"--channel-option": "valid:input-mode=File"}, "there is no channel valid"),
    ({"--input-mode": "File", "--compression": "Gzip"}, "Gzip works in Pipe mode only"),
])
def test_validation_errors_say_what_to_change(change, message):
    args = list(BASIC)
    for option, value in change.items():
        if option in args and value is not None:
            args[args.index(option) + 1] = value
        else:
            args += [option] if value is None else [option, value]
    out = launch(*args, "--dry-run")
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_cpu_instance_with_allow_cpu_and_warnings(tmp_path):
    out = launch(*BASIC, "--instance-type", "ml.c5.2xlarge", "--allow-cpu", "--network-isolation", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "--network-isolation with weights=imagenet" in out.stderr


def test_dry_run_redacts_secret_looking_values_and_warns_they_are_stored_in_plain_text():
    out = launch(*BASIC, "--env", "DB_PASSWORD=hunter2", "--env", "WANDB_API_KEY=k-123", "--env", "LOG_LEVEL=debug",
                 "--env", "DATABASE_URL=postgres://u:pw9@db:5432/x", "--env", "GH_PAT=abc987",
                 "--env", "CI_NOTE=ghp_0123456789", "--hp", "sneaky_token=tok456", "--no-validate", "--dry-run")
    assert out.returncode == 0, out.stderr
    request = json.loads(out.stdout)
    assert request["Environment"] == {"DB_PASSWORD": "REDACTED", "WANDB_API_KEY": "REDACTED", "LOG_LEVEL": "debug",
                                      "DATABASE_URL": "postgres://REDACTED@db:5432/x", "GH_PAT": "REDACTED",
                                      "CI_NOTE": "REDACTED"}
    assert request["HyperParameters"]["sneaky_token"] == "REDACTED"
    for secret in ("hunter2", "k-123", "pw9", "abc987", "ghp_0123456789", "tok456"):
        assert secret not in out.stdout + out.stderr, secret
    assert ("--env DB_PASSWORD, --env WANDB_API_KEY, --env DATABASE_URL, --env GH_PAT, --env CI_NOTE, "
            "--hp sneaky_token: SageMaker keeps a job's environment and hyperparameters in plain text") in out.stderr


def test_a_key_given_twice_is_an_error():
    out = launch(*BASIC, "--env", "A=1", "--env", "A=2", "--dry-run")
    assert out.returncode == 2 and "--env A is given twice ('1' and '2')" in out.stderr


def test_missing_region_is_an_error_before_any_call():
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_DEFAULT_REGION", "AWS_REGION")}
    out = launch(*BASIC, env=env)
    assert out.returncode == 2 and "no AWS region: pass --region" in out.stderr


@pytest.mark.slow
def test_wait_follows_the_job_until_it_completes(aws):
    out = launch(*BASIC, "--wait", env=aws)  # moto completes jobs at once
    name = out.stdout.strip().splitlines()[0]
    assert re.fullmatch(r"keras-pipe-\d{14}", name), out.stdout
    assert out.returncode == 0, out.stderr
    assert f"keras-pipe submit: {name}: Completed" in out.stderr
    assert f"keras-pipe submit: model: s3://data/jobs/{name}/output/model.tar.gz" in out.stderr


@pytest.mark.slow
def test_wait_prints_every_log_line_of_every_host_once_also_past_one_page(aws, monkeypatch, capsys):
    """CloudWatch gives at most 10,000 lines per call: a job that wrote more between two polls
    (here 12,000 lines, from two hosts, some sharing a timestamp) is printed whole, in time order."""
    import boto3
    from moto.sagemaker.models import sagemaker_backends

    from keras_pipe_launch.sagemaker.follow import follow_training_job as follow

    name = launch(*BASIC, env=aws).stdout.strip()
    sagemaker_backends["123456789012"]["us-east-1"].training_jobs[name].resource_config["InstanceCount"] = 2
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(key, aws[key])
    logs = boto3.client("logs")
    with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):  # (the server is the session's)
        logs.create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")
    start = int(time.time() * 1000) - 60_000  # (CloudWatch refuses events older than 14 days)
    for host in ("algo-1", "algo-2"):
        stream = f"{name}/{host}-1700000000"
        logs.create_log_stream(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream)
        events = [{"timestamp": start + i // 3, "message": f"{host} line {i}"} for i in range(6000)]
        logs.put_log_events(logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=stream, logEvents=events)
    assert follow(name) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 12_000 and len(set(lines)) == 12_000
    assert set(lines) == {f"[{h}] {h} line {i}" for h in ("algo-1", "algo-2") for i in range(6000)}
    assert lines[:2] == ["[algo-1] algo-1 line 0", "[algo-1] algo-1 line 1"]
    times = [int(line.rsplit(" ", 1)[1]) // 3 for line in lines]
    assert times == sorted(times)


@pytest.mark.slow
def test_wait_prints_the_failure_reason_of_a_failed_job(aws, monkeypatch, capsys):
    from moto.sagemaker.models import sagemaker_backends

    from keras_pipe_launch.sagemaker.follow import follow_training_job as follow

    out = launch(*BASIC, env=aws)
    name = out.stdout.strip()
    job = sagemaker_backends["123456789012"]["us-east-1"].training_jobs[name]
    job.training_job_status, job.failure_reason = "Failed", "Data error: CorruptRecordError: corrupt record #7"
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(key, aws[key])
    assert follow(name) == 1
    assert f"{name} failed: Data error: CorruptRecordError: corrupt record #7" in capsys.readouterr().err


@pytest.mark.slow
def test_an_aws_call_that_fails_is_said_in_a_line_not_a_traceback():
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    out = launch(*BASIC, "--region", "us-east-1", env=env)
    assert out.returncode == 1, out.stderr
    assert out.stderr.splitlines()[-1] == ('keras-pipe submit: a call to AWS failed: Could not connect to the endpoint '
                                           'URL: "http://127.0.0.1:9/"'), out.stderr


def test_a_value_past_the_apis_limits_is_refused_without_printing_it():
    secret = "s3cr3t-" + "x" * 1100
    out = launch(*BASIC, "--env", f"SERVICE_ACCOUNT={secret}", "--dry-run")
    assert out.returncode == 2, out.stderr
    assert "Environment[SERVICE_ACCOUNT] has 1107 characters; SageMaker allows at most 512" in out.stderr
    assert "s3cr3t" not in out.stdout + out.stderr


def test_mlflow_tracking_options_are_the_jobs_environment():
    arn = "arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/team"
    request = dry_run(*BASIC, "--mlflow-tracking-uri", arn, "--mlflow-experiment", "digits")
    assert request["Environment"] == {"MLFLOW_TRACKING_URI": arn, "MLFLOW_EXPERIMENT_NAME": "digits",
                                      "KERAS_PIPE_OUTPUT": "s3://data/jobs/"}
    out = launch(*BASIC, "--mlflow-experiment", "digits", "--dry-run")
    assert out.returncode == 2 and "give both" in out.stderr, out.stderr
    for uri in ("https://me:hunter2@mlflow.example.com", " https://me:hunt/er2@mlflow.example.com",
                "https://mlflow.example.com/?token=hunter2"):
        out = launch(*BASIC, "--mlflow-tracking-uri", uri, "--dry-run")
        assert out.returncode == 2 and "MLFLOW_TRACKING_PASSWORD" in out.stderr and "hunter2" not in out.stderr
