"""`keras-pipe tune`: the CreateHyperParameterTuningJob request SageMaker's SDK v3 and v2 really send
(recorded by moto's server on 127.0.0.1), equal to --dry-run's and valid for botocore's model of the
API; ranges checked against the job's own schema; following a tuning job to its best training job."""

import difflib
import functools
import json
import re

import pytest

from tests.conftest import sdk2_python
from tests.launcher.conftest import dry_run_request, launch_cli, sent_through_sdk

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train:latest"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
JOB = ["--image-uri", IMAGE, "--role", ROLE, "--train", "s3://data/train/", "--validation", "s3://data/validation/",
       "--output-path", "s3://data/tuning/", "--hp", "num_classes=10"]
RANGES = ["--range", "learning_rate=1e-4:1e-2:log", "--range", "batch_size=32,64,128", "--range", "dropout=0:0.5",
          "--range", "fine_tune_epochs=1:4", "--range", "backbone=mobilenet_v3_small,efficientnet_v2_b0"]
# (its channels Ground Truth manifests: augmented manifest channels, tuned through both SDKs)
FULL = ["--image-uri", IMAGE, "--role", ROLE, "--train", "s3://data/labels/train.manifest",
        "--validation", "s3://data/labels/validation.manifest", "--attribute-names", "source-ref,label,label-metadata",
        "--output-path", "s3://data/tuning/", "--hp", "num_classes=10", *RANGES, "--instance-type", "ml.g5.2xlarge", "--instance-count", "2", "--distribution", "ShardedByS3Key",
        "--spot", "--max-run", "2h", "--checkpoint-s3-uri", "s3://data/checkpoints/", "--env", "LOG_LEVEL=debug",
        "--tag", "team=vision", "--network-isolation", "--hp", "weights=pretrained",
        "--pretrained", "s3://data/weights/backbone.weights.h5", "--objective", "validation:loss",
        "--max-jobs", "6", "--max-parallel-jobs", "3", "--strategy", "Random", "--early-stopping", "Auto",
        "--base-job-name", "digits"]


tune = functools.partial(launch_cli, "tune")
dry_run = functools.partial(dry_run_request, "tune")


def same_request(a: dict, b: dict) -> None:
    """Equal, but for the seconds in the names (each run names its tuning job at its own time)."""
    for request in (a, b):
        assert re.fullmatch(r"[a-z0-9-]+-\d{6}-\d{6}", request["HyperParameterTuningJobName"])
        assert len(request["HyperParameterTuningJobName"]) <= 32
    strip = lambda r: {**r, "HyperParameterTuningJobName": r["HyperParameterTuningJobName"][:-13]}  # noqa: E731
    a, b = (json.dumps(strip(r), indent=1, sort_keys=True).splitlines() for r in (a, b))
    assert a == b, "\n".join(difflib.unified_diff(a, b, "sent", "dry run", lineterm=""))


def test_dry_run_request_types_each_range_from_the_jobs_schema():
    request = dry_run(*JOB, *RANGES)
    config = request["HyperParameterTuningJobConfig"]
    assert config["ParameterRanges"] == {
        "IntegerParameterRanges": [{"Name": "fine_tune_epochs", "MinValue": "1", "MaxValue": "4", "ScalingType": "Auto"}],
        "ContinuousParameterRanges": [
            {"Name": "learning_rate", "MinValue": "1e-4", "MaxValue": "1e-2", "ScalingType": "Logarithmic"},
            {"Name": "dropout", "MinValue": "0", "MaxValue": "0.5", "ScalingType": "Auto"}],
        "CategoricalParameterRanges": [{"Name": "batch_size", "Values": ["32", "64", "128"]},
                                       {"Name": "backbone", "Values": ["mobilenet_v3_small", "efficientnet_v2_b0"]}],
    }
    assert config["HyperParameterTuningJobObjective"] == {"Type": "Maximize", "MetricName": "validation:accuracy"}
    assert config["ResourceLimits"] == {"MaxNumberOfTrainingJobs": 10, "MaxParallelTrainingJobs": 2}
    definition = request["TrainingJobDefinition"]
    assert definition["StaticHyperParameters"] == {"num_classes": "10"}
    names = [d["Name"] for d in definition["AlgorithmSpecification"]["MetricDefinitions"]]
    assert names[:6] == ["train:loss", "train:accuracy", "validation:loss", "validation:accuracy",
                         "train:top_k_accuracy", "validation:top_k_accuracy"]
    assert {"train:f1_micro", "validation:f1_macro", "validation:auc", "validation:exact_match"} < set(names)
    assert len(names) == 22  # (SageMaker takes 40 at most)
    assert [c["InputMode"] for c in definition["InputDataConfig"]] == ["Pipe", "Pipe"]


def test_trials_share_the_checkpoint_prefix_each_resuming_only_its_own():
    request = dry_run(*FULL)
    definition = request["TrainingJobDefinition"]
    assert definition["StaticHyperParameters"]["other_checkpoints"] == "ignore"
    assert definition["CheckpointConfig"] == {"S3Uri": "s3://data/checkpoints/", "LocalPath": "/opt/ml/checkpoints"}
    assert request["HyperParameterTuningJobConfig"]["HyperParameterTuningJobObjective"]["Type"] == "Minimize"
    manifests = [c for c in definition["InputDataConfig"] if c["ChannelName"] in ("train", "validation")]
    assert [c["DataSource"]["S3DataSource"]["AttributeNames"] for c in manifests] == [
        ["source-ref", "label", "label-metadata"]] * 2
    assert definition["StaticHyperParameters"]["attribute_names"] == '["source-ref", "label", "label-metadata"]'


@pytest.mark.slow
@pytest.mark.parametrize("args", [[*JOB, *RANGES], FULL], ids=["basic", "full"])
def test_sdk_v3_sends_exactly_the_dry_run_request(aws, moto_endpoint, args):
    request, out = sent_through_sdk("tune", "CreateHyperParameterTuningJob", args, aws, moto_endpoint)
    same_request(request, dry_run(*args))
    assert out.stdout.strip() == request["HyperParameterTuningJobName"]


@pytest.mark.slow
@pytest.mark.parametrize("args", [[*JOB, *RANGES], FULL], ids=["basic", "full"])
def test_sdk_v2_sends_the_same_request_as_v3(aws, moto_endpoint, args):
    request, _ = sent_through_sdk("tune", "CreateHyperParameterTuningJob", args, aws, moto_endpoint, python=sdk2_python())
    same_request(request, dry_run(*args))


@pytest.mark.parametrize("args, message", [
    (["--range", "learning_rate=0:0.1:log"], "learning_rate must be > 0"),
    (["--range", "learning_rate=0.1:0.01"], "MIN (0.1) must be below MAX (0.01)"),
    (["--range", "batch_size=1.5:8"], "batch_size must be an integer, got '1.5'"),
    (["--range", "batch_size=0:8"], "batch_size must be >= 1"),
    (["--range", "backbone=resnet50,alexnet"], "backbone must be one of"),
    (["--range", "backbone=a:b"], "backbone is not a number; list the values to try"),
    (["--range", "resize=original:512"], "--range resize: MIN:MAX takes numbers; give other values as a list"),
    (["--range", "learning_rate=1e-3:1e-1:cubic"], "SCALE one of auto, linear, log, reverse-log"),
    (["--range", "dropout=0.1:0.5:reverse-log", "--range", "epochs=1:3:reverse-log"], "reverse-log is for numbers"),
    (["--range", "epoch=1:3"], "--range epoch: not a hyperparameter of the job; numbers to tune: epochs,"),
    (["--range", "epochs=1:3", "--hp", "epochs=2"], "epochs: give each hyperparameter once"),
    (["--range", "epochs=1:3", "--range", "epochs=4:5"], "epochs: give each hyperparameter once"),
    (["--range", "epochs=0:3", "--hp", "fine_tune_epochs=0"], "nothing to train"),
    # rules across two ranges that fail only at opposite ends: the pairs' corners are tried
    (["--range", "epochs=1:5", "--range", "keep_epoch_models=1:5"],
     "a trial these ranges allow would fail (epochs=1, keep_epoch_models=5): "),
    (["--range", "image_size=96:224", "--range", "resize=100:256"],
     "a trial these ranges allow would fail (image_size=224, resize=100): "),
    # a categorical's middle value, which a pair of ends would not try
    (["--range", "early_stopping_metric=val_loss,val_auc,val_accuracy", "--range", "epochs=2:4"],
     "a trial these ranges allow would fail (early_stopping_metric=val_auc): "),
    (["--range", "epochs=1:3", "--max-parallel-jobs", "11"], "--max-parallel-jobs (11) must be 1 to --max-jobs (10)"),
    (["--range", "epochs=1:3", "--strategy", "Grid"], "Grid tries every combination"),
    (["--range", "epochs=1:3", "--tensorboard-s3-uri", "s3://data/tb/"], "tuning jobs have no TensorBoard output"),
    ([], "give at least one --range"),
    # past what botocore's validator checks (minimums only), from its model's maximums and patterns
    (["--range", "epochs=1:3", "--base-job-name", "a-base-job-name-of-31-characters"[:31]],
     "HyperParameterTuningJobName has 45 characters (a-base-job-name-of-31-characte"),
    (["--range", "epochs=1:3", "--tag", "k" * 129 + "=v"], "Tags[0].Key has 129 characters (kkk"),
    (["--range", "epochs=1:3", "--tag", "k" * 129 + "=v"], "); SageMaker allows at most 128"),
])
def test_bad_ranges_are_refused_before_any_call(args, message):
    out = tune(*JOB, *args, "--dry-run")
    assert out.returncode == 2, out.stdout
    assert message in out.stderr, out.stderr


def test_a_validation_objective_needs_a_validation_channel():
    no_validation = [a for a in JOB if a not in ("--validation", "s3://data/validation/")]
    out = tune(*no_validation, "--range", "epochs=1:3", "--dry-run")
    assert out.returncode == 2
    assert "--objective validation:accuracy is measured on the validation channel" in out.stderr


@pytest.mark.parametrize("objective, needed, said", [
    ("validation:top_k_accuracy", "top_k=3", "reports it only with hyperparameter top_k set (--hp top_k=5)"),
    ("validation:f1_macro", "multi_label=1", "reports it only with hyperparameter multi_label=true (--hp multi_label=true)"),
])
def test_an_objective_the_job_reports_only_when_asked_needs_that_and_is_then_tuned_on(objective, needed, said):
    out = tune(*JOB, "--range", "epochs=1:3", "--objective", objective, "--dry-run")
    assert out.returncode == 2 and said in out.stderr, out.stderr
    out = tune(*JOB, "--range", "epochs=1:3", "--objective", objective, "--hp", needed, "--dry-run")
    assert out.returncode == 0, out.stderr
    chosen = json.loads(out.stdout)["HyperParameterTuningJobConfig"]["HyperParameterTuningJobObjective"]
    assert chosen == {"Type": "Maximize", "MetricName": objective}


def test_the_built_in_algorithms_names_are_tuned_as_the_job_reads_them():
    request = dry_run(*JOB, "--range", "mini_batch_size=32,64", "--range", "eps=1e-8:1e-6:log",
                      "--range", "num_layers=50,101")
    ranges = request["HyperParameterTuningJobConfig"]["ParameterRanges"]
    assert {"Name": "mini_batch_size", "Values": ["32", "64"]} in ranges["CategoricalParameterRanges"]
    assert {"Name": "num_layers", "Values": ["50", "101"]} in ranges["CategoricalParameterRanges"]
    assert ranges["ContinuousParameterRanges"] == [{"Name": "eps", "MinValue": "1e-8", "MaxValue": "1e-6",
                                                    "ScalingType": "Logarithmic"}]
    out = tune(*JOB, "--range", "num_layers=18,19", "--dry-run")
    assert out.returncode == 2 and "--range num_layers: hyperparameter num_layers must be one of 18, 34, 50, 101, " \
                                   "152, 200, 20, 32, 44, 56, 110" in out.stderr, out.stderr


@pytest.mark.slow
def test_wait_follows_the_tuning_job_and_prints_the_best_training_job(aws, moto_endpoint):
    out = tune(*JOB, "--range", "epochs=1:3", "--wait", env=aws)
    # moto completes tuning jobs at once and knows no training jobs: the best job is absent, the
    # status line and exit code are what follow() makes of the description
    assert out.returncode == 0, out.stderr[-3000:]
    name = out.stdout.strip().splitlines()[0]
    assert re.search(rf"keras-pipe tune: {name}: Completed", out.stderr), out.stderr


def test_mlflow_tracking_puts_the_tuning_jobs_trainings_in_an_experiment_of_its_name():
    request = dry_run(*JOB, "--range", "epochs=1:3", "--mlflow-tracking-uri", "https://mlflow.example.com")
    assert request["TrainingJobDefinition"]["Environment"] == {
        "MLFLOW_TRACKING_URI": "https://mlflow.example.com",
        "MLFLOW_EXPERIMENT_NAME": request["HyperParameterTuningJobName"], "KERAS_PIPE_OUTPUT": "s3://data/tuning/"}
    request = dry_run(*JOB, "--range", "epochs=1:3", "--mlflow-tracking-uri", "https://mlflow.example.com",
                      "--mlflow-experiment", "digits")
    assert request["TrainingJobDefinition"]["Environment"]["MLFLOW_EXPERIMENT_NAME"] == "digits"


def test_presets_are_searched_as_any_categorical_and_a_preset_the_job_lacks_is_refused():
    request = dry_run(*JOB, "--range", "preset=fast,balanced,best", "--range", "backbone=convnext_tiny,dinov2_small")
    assert request["HyperParameterTuningJobConfig"]["ParameterRanges"]["CategoricalParameterRanges"] == [
        {"Name": "preset", "Values": ["fast", "balanced", "best"]},
        {"Name": "backbone", "Values": ["convnext_tiny", "dinov2_small"]}]
    out = tune("--dry-run", *JOB, "--range", "preset=fast,quick")
    assert out.returncode == 2 and "--range preset: hyperparameter preset must be one of none, fast, balanced, best; got 'quick'" in out.stderr, out.stderr
