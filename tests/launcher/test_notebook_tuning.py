"""The MXNet notebooks' tuning path (`deploy_amt_model = True`): a HyperparameterTuner on
`validation:accuracy` over the ranges AWS's IC-tuning page lists, as the transfer-learning
notebook writes it (cell 22, sent by SageMaker's SDK v2, the SDK those notebooks use), with the one
change a custom image needs: the tuner's `metric_definitions` (docs/migration.md, What still
differs). The request reaches moto's server on 127.0.0.1, past botocore's validation of it against
the API's model; every training the tuning job would start must then be a request the job takes."""

import json
import os

import pytest

from tests.conftest import REPO, run_logged, sdk2_python
from tests.launcher.conftest import sent
from tests.timeouts import wait_s

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train:latest"

# Image-classification-transfer-learning-highlevel.ipynb (tests/builtin/notebooks.py's commit):
# cells 14, 16 and 22, with the image and channels of this test; the tuner's `metric_definitions` the
# one line added (SDK v2 sends the tuner's in the tuning job, never its estimator's: tuner.py)
NOTEBOOK = f'''
import sagemaker
from sagemaker.tuner import IntegerParameter, ContinuousParameter
from sagemaker.tuner import HyperparameterTuner
from keras_pipe_train.training.metrics import METRIC_DEFINITIONS

sess = sagemaker.Session()
role = "arn:aws:iam::123456789012:role/SageMakerRole"
training_image = "{IMAGE}"
s3_output_location = "s3://bucket/ic-transfer-learning/output"
ic = sagemaker.estimator.Estimator(
    training_image,
    role,
    instance_count=1,
    instance_type="ml.p3.2xlarge",
    volume_size=50,
    max_run=360000,
    input_mode="File",
    output_path=s3_output_location,
    sagemaker_session=sess,{{estimator_metrics}}
)
ic.set_hyperparameters(
    num_layers=18,
    use_pretrained_model=1,
    image_shape="3,224,224",
    num_classes=257,
    num_training_samples=15420,
    mini_batch_size=128,
    epochs=2,
    learning_rate=0.01,
    precision_dtype="float32",
)
data_channels = {{
    "train": sagemaker.inputs.TrainingInput("s3://bucket/ic-transfer-learning/train/", distribution="FullyReplicated",
                                            content_type="application/x-recordio", s3_data_type="S3Prefix"),
    "validation": sagemaker.inputs.TrainingInput("s3://bucket/ic-transfer-learning/validation/",
                                                 distribution="FullyReplicated",
                                                 content_type="application/x-recordio", s3_data_type="S3Prefix"),
}}
hyperparameter_ranges = {{
    "beta_1": ContinuousParameter(1e-6, 0.999, scaling_type="Auto"),
    "beta_2": ContinuousParameter(1e-6, 0.999, scaling_type="Auto"),
    "eps": ContinuousParameter(1e-8, 1.0, scaling_type="Auto"),
    "gamma": ContinuousParameter(1e-8, 0.999, scaling_type="Auto"),
    "learning_rate": ContinuousParameter(1e-6, 0.5, scaling_type="Auto"),
    "mini_batch_size": IntegerParameter(8, 64, scaling_type="Auto"),
    "momentum": ContinuousParameter(0.0, 0.999, scaling_type="Auto"),
    "weight_decay": ContinuousParameter(0.0, 0.999, scaling_type="Auto"),
}}
max_jobs = 6
max_parallel_jobs = 2
hp_tuner = HyperparameterTuner(
    ic,
    "validation:accuracy",
    hyperparameter_ranges,
    max_jobs=max_jobs,
    max_parallel_jobs=max_parallel_jobs,
    objective_type="Maximize",{{tuner_metrics}}
)
hp_tuner.fit(inputs=data_channels, job_name="{{job_name}}", wait=False)
'''


ADDED = "\n    metric_definitions=METRIC_DEFINITIONS,"


def tuning_request(aws, moto_endpoint, job_name: str, **added) -> dict:
    """The CreateHyperParameterTuningJob request the notebook's cells send (`added`: the line
    added to the Estimator's arguments, estimator_metrics, or the tuner's, tuner_metrics)."""
    import boto3

    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="bucket")
    env = {**aws, "PYTHONPATH": os.pathsep.join([str(REPO / "train"), aws.get("PYTHONPATH", "")])}
    code = NOTEBOOK.replace("{estimator_metrics}", added.get("estimator_metrics", "")).replace(
        "{tuner_metrics}", added.get("tuner_metrics", "")).replace("{job_name}", job_name)
    out = run_logged([str(sdk2_python()), "-c", code], wait_s(120), env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    (request,) = sent(moto_endpoint, "CreateHyperParameterTuningJob")
    return request


@pytest.mark.slow
def test_the_estimators_metric_definitions_alone_never_reach_the_tuning_job(aws, moto_endpoint):
    """Why docs/migration.md says the tuner: given to the Estimator only, SDK v2 sends none in the
    tuning job (and SageMaker refuses an objective no definition names, for a custom image)."""
    request = tuning_request(aws, moto_endpoint, "DEMO-ic-tl-estimator", estimator_metrics=ADDED)
    assert "MetricDefinitions" not in request["TrainingJobDefinition"]["AlgorithmSpecification"]


@pytest.mark.slow
def test_the_notebooks_tuner_on_validation_accuracy_sends_a_request_whose_trainings_the_job_takes(aws, moto_endpoint):
    request = tuning_request(aws, moto_endpoint, "DEMO-ic-tl-tuner", tuner_metrics=ADDED)
    config, definition = request["HyperParameterTuningJobConfig"], request["TrainingJobDefinition"]
    assert config["HyperParameterTuningJobObjective"] == {"Type": "Maximize", "MetricName": "validation:accuracy"}
    regexes = {d["Name"]: d["Regex"] for d in definition["AlgorithmSpecification"]["MetricDefinitions"]}
    assert "validation:accuracy" in regexes and definition["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    # the trainings: the static hyperparameters (the SDK's JSON-encoded strings) with each range at
    # its ends, as a tuning job sends them, read by the job as the built-in MXNet algorithm would
    from keras_pipe_train.settings.config import JobConfig

    static = definition["StaticHyperParameters"]
    ranges = config["ParameterRanges"]
    for end in ("MinValue", "MaxValue"):
        values = {r["Name"]: r[end] for kind in ("ContinuousParameterRanges", "IntegerParameterRanges")
                  for r in ranges[kind]}
        assert sorted(values) == ["beta_1", "beta_2", "eps", "gamma", "learning_rate", "mini_batch_size",
                                  "momentum", "weight_decay"]
        job = JobConfig.from_hyperparameters({**static, **values})
        assert job.dialect == "mxnet" and job.batch_size == int(values["mini_batch_size"])
    # and the line it reads: the job's metric line for validation accuracy, caught by that regex
    import re

    line = "metrics: epoch=2 phase=fine_tune train_loss=0.5 train_accuracy=0.8 val_loss=0.6 val_accuracy=0.75"
    assert re.search(regexes["validation:accuracy"], line).group(1) == "0.75"
    assert json.loads(static["num_layers"]) == 18
