"""`keras-pipe register` and the Model Registry's packages deployed: a SageMaker training job's model
registered on moto's server (S3 and SageMaker on 127.0.0.1), the package read back as SageMaker
describes it, its ModelMetrics' file in S3, and the package deployed (SDK v3) and run by batch
transform (SDK v2), each request as the SDK sent it equal to --dry-run's. moto implements every
call here: CreateModelPackageGroup, CreateModelPackage (versions 1, 2, ...), DescribeModelPackage,
CreateModel with a package's ARN as its container. What moto does not check and SageMaker does
(a package's image in ECR, its model data readable by the role) is left to SageMaker."""

import io
import json
import sys
import tarfile

import pytest

from tests.conftest import sdk2_python
from tests.launcher.conftest import dry_run_request, launch_cli, sent

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train:1"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
JOB = "keras-pipe-20261128100000"
# evaluation.json as a single-label job writes it (report/evaluation.py), worked by hand below
EVALUATION = {
    "epoch": 3, "examples": 10, "multi_label": False, "metrics": {"accuracy": 0.6, "loss": 0.61},
    "classes": ["daisy", "rose"],
    "per_class": [{"class": "daisy", "precision": 0.75, "recall": 0.5, "f1": 0.6, "support": 6},
                  {"class": "rose", "precision": 0.5, "recall": 0.75, "f1": 0.6, "support": 4}],
    "confusion_matrix": {"rows": "true class", "columns": "predicted class", "counts": [[3, 3], [1, 3]]},
}


def archive(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def clients(aws):
    import boto3

    options = dict(endpoint_url=aws["AWS_ENDPOINT_URL"], region_name="us-east-1", aws_access_key_id="testing",
                   aws_secret_access_key="testing")
    return boto3.client("s3", **options), boto3.client("sagemaker", **options)


def trained_job(aws, name: str = JOB, evaluation: dict | None = EVALUATION) -> None:
    """A completed training job on moto's server, its model.tar.gz and output.tar.gz in S3."""
    s3, sagemaker = clients(aws)
    s3.create_bucket(Bucket="models")
    s3.put_object(Bucket="models", Key=f"jobs/{name}/output/model.tar.gz", Body=archive({"1/saved_model.pb": b"g"}))
    outputs = {"report.html": b"<html></html>"}
    if evaluation is not None:
        outputs["evaluation.json"] = json.dumps(evaluation).encode()
    s3.put_object(Bucket="models", Key=f"jobs/{name}/output/output.tar.gz", Body=archive(outputs))
    sagemaker.create_training_job(
        TrainingJobName=name, RoleArn=ROLE, AlgorithmSpecification={"TrainingImage": IMAGE, "TrainingInputMode": "Pipe"},
        OutputDataConfig={"S3OutputPath": "s3://models/jobs/"},
        ResourceConfig={"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
        StoppingCondition={"MaxRuntimeInSeconds": 3600})


def register(*args, env):
    return launch_cli("register", *args, env=env)


@pytest.mark.slow
def test_a_jobs_model_registered_described_and_deployed_from_its_package(aws, moto_endpoint):
    trained_job(aws)
    s3, sagemaker = clients(aws)
    planned = register(JOB, "--model-package-group", "flowers", "--tag", "team=vision", "--dry-run", env=aws)
    assert planned.returncode == 0, planned.stderr
    out = register(JOB, "--model-package-group", "flowers", "--tag", "team=vision", env=aws)
    assert out.returncode == 0, out.stderr
    arn = out.stdout.strip()
    assert arn == "arn:aws:sagemaker:us-east-1:123456789012:model-package/flowers/1"
    assert "created model package group flowers" in out.stderr
    (sent_package,) = sent(moto_endpoint, "CreateModelPackage")
    assert sent_package.pop("ClientToken")  # (botocore's idempotency token, a new one per call)
    assert sent_package == json.loads(planned.stdout)["CreateModelPackage"]
    package = sagemaker.describe_model_package(ModelPackageName=arn)
    assert package["ModelApprovalStatus"] == "PendingManualApproval" and package["ModelPackageVersion"] == 1
    (container,) = package["InferenceSpecification"]["Containers"]
    assert container["Image"] == IMAGE and container["ModelDataUrl"] == f"s3://models/jobs/{JOB}/output/model.tar.gz"
    assert "application/x-image" in package["InferenceSpecification"]["SupportedContentTypes"]
    assert "application/jsonlines" in package["InferenceSpecification"]["SupportedResponseMIMETypes"]
    assert package["CustomerMetadataProperties"] == {
        "training_job": JOB, "classes": "2", "validation_images": "10", "validation_accuracy": "0.6000",
        "validation_loss": "0.6100", "evaluation": f"s3://models/jobs/{JOB}/output/evaluation.json"}
    statistics = package["ModelMetrics"]["ModelQuality"]["Statistics"]
    assert statistics["S3Uri"] == f"s3://models/jobs/{JOB}/output/model_quality.json"
    stored = s3.get_object(Bucket="models", Key=f"jobs/{JOB}/output/model_quality.json")["Body"].read()
    import hashlib

    assert statistics["ContentDigest"] == "sha256:" + hashlib.sha256(stored).hexdigest()
    quality = json.loads(stored)["multiclass_classification_metrics"]
    assert quality["accuracy"] == {"value": 0.6, "standard_deviation": "NaN"}
    assert quality["confusion_matrix"] == {"daisy": {"daisy": 3, "rose": 3}, "rose": {"daisy": 1, "rose": 3}}
    assert json.loads(s3.get_object(Bucket="models", Key=f"jobs/{JOB}/output/evaluation.json")["Body"].read()) == \
        EVALUATION

    # the tags are the group's: SageMaker takes none on a package in a group
    group = sagemaker.describe_model_package_group(ModelPackageGroupName="flowers")["ModelPackageGroupArn"]
    assert "Tags" not in sent_package and sent(moto_endpoint, "CreateModelPackageGroup")[0]["Tags"] == [
        {"Key": "team", "Value": "vision"}]

    # a second version, approved as registered; the group is there, and gets the new tag
    out = register(JOB, "--model-package-group", "flowers", "--approval-status", "Approved", "--tag", "stage=prod",
                   env=aws)
    assert out.returncode == 0 and out.stdout.strip().endswith("model-package/flowers/2"), out.stderr
    assert "created model package group" not in out.stderr
    assert {"Key": "stage", "Value": "prod"} in sagemaker.list_tags(ResourceArn=group)["Tags"]
    versions = sagemaker.list_model_packages(ModelPackageGroupName="flowers")["ModelPackageSummaryList"]
    assert sorted(v["ModelApprovalStatus"] for v in versions) == ["Approved", "PendingManualApproval"]

    # SageMaker deploys only an approved version: refused before anything is created
    out = launch_cli("deploy", "--model-package", arn, "--role", ROLE, "--name", "pending", env=aws)
    assert out.returncode == 2 and f"model package {arn} is PendingManualApproval" in out.stderr, out.stderr
    assert not [r for r in sent(moto_endpoint, "CreateModel") if r["ModelName"] == "pending"]
    arn = arn[:-1] + "2"
    # deployed (SDK v3) and run by batch transform (SDK v2) from the package: the SDK sends --dry-run's requests
    for command, python, more in (
            ("deploy", sys.executable, ["--instance-type", "ml.c5.xlarge"]),
            ("transform", sdk2_python(), ["--input", "s3://models/photos/", "--output-path", "s3://models/answers/"])):
        args = ["--model-package", arn, "--role", ROLE, *more, "--name", f"{command}-from-package"]
        out = launch_cli(command, *args, python=python, env=aws)
        assert out.returncode == 0, out.stderr[-3000:]
        (model,) = [r for r in sent(moto_endpoint, "CreateModel") if r["ModelName"] == f"{command}-from-package"]
        assert model == dry_run_request(command, *args)["CreateModel"]
        assert model["Containers"] == [{"ModelPackageName": arn, "Environment": {}}]
        assert sagemaker.describe_model(ModelName=f"{command}-from-package")["Containers"][0]["ModelPackageName"] \
            == arn


@pytest.mark.slow
def test_a_model_archives_uri_and_a_job_without_evaluation(aws):
    trained_job(aws, "keras-pipe-2", evaluation=None)
    uri = "s3://models/jobs/keras-pipe-2/output/model.tar.gz"
    out = register(uri, "--model-package-group", "flowers", env=aws)
    assert out.returncode == 2 and "--image-uri: the image that serves the model" in out.stderr, out.stderr
    out = register(uri, "--model-package-group", "flowers", "--image-uri", IMAGE, "--dry-run", env=aws)
    assert out.returncode == 0, out.stderr
    assert "the job wrote no evaluation.json" in out.stderr
    request = json.loads(out.stdout)["CreateModelPackage"]
    assert "ModelMetrics" not in request and request["CustomerMetadataProperties"] == {"training_job": "keras-pipe-2"}
    assert request["InferenceSpecification"]["Containers"][0]["ModelDataUrl"] == uri
    # an evaluation.json that is no JSON: said, named, nothing sent
    s3, _ = clients(aws)
    s3.put_object(Bucket="models", Key="jobs/keras-pipe-2/output/output.tar.gz",
                  Body=archive({"evaluation.json": b"{not json"}))
    out = register(uri, "--model-package-group", "flowers", "--image-uri", IMAGE, env=aws)
    assert out.returncode == 2 and "output/output.tar.gz: its evaluation.json is no JSON" in out.stderr, out.stderr


@pytest.mark.parametrize("args, message", [
    (["keras-pipe-404", "--model-package-group", "flowers"], "training job keras-pipe-404:"),
    ([JOB, "--model-package-group", "flowers_v2"], "--model-package-group 'flowers_v2': 1-63 letters"),
    ([JOB, "--model-package-group", "flowers", "--instance-type", "ml.inf2.xlarge"], "AWS Inferentia/Trainium"),
    (["s3://models/jobs/x/output/", "--model-package-group", "flowers"], "expected a training job's model.tar.gz"),
    ([JOB, "--model-package-group", "flowers", "--instance-type", "ml.q9.xlarge"], "'ml.q9.xlarge' is not a "
                                                                                  "SageMaker hosting or batch"),
])
def test_what_cannot_be_registered_is_said(aws, args, message):
    trained_job(aws)
    out = register(*args, "--dry-run", env=aws)
    assert out.returncode == 2 and message in out.stderr and out.stdout == "", out.stderr


@pytest.mark.parametrize("change, message", [
    (["--model-package", "flowers/1"], "--model-package 'flowers/1': expected a model package's ARN"),
    (["--model-package", "arn:aws:sagemaker:us-east-1:123456789012:model-package/flowers/1", "--image-uri", IMAGE],
     "--image-uri goes with --model-data: a model package names its own image"),
    (["--model-data", "s3://models/m.tar.gz"], "--image-uri: the image that serves --model-data"),
])
def test_deploying_a_package_is_checked_before_anything_is_sent(change, message, capsys):
    from keras_pipe_launch.cli import main

    assert main(["deploy", "--role", ROLE, *change, "--dry-run"]) == 2
    out = capsys.readouterr()
    assert message in out.err and out.out == "", out.err


def test_model_quality_is_model_monitors_form_of_the_evaluation():
    from keras_pipe_launch.sagemaker.registry import model_quality

    found = model_quality(EVALUATION)
    metrics = found["multiclass_classification_metrics"]
    # support-weighted: precision (0.75 x 6 + 0.5 x 4) / 10, recall (0.5 x 6 + 0.75 x 4) / 10
    assert metrics["weighted_precision"]["value"] == pytest.approx(0.65)
    assert metrics["weighted_recall"]["value"] == pytest.approx(0.6)
    assert metrics["weighted_f1"]["value"] == pytest.approx(0.6)
    # F2 of daisy: 5 x 0.75 x 0.5 / (4 x 0.75 + 0.5) = 0.5357; of rose: 5 x 0.5 x 0.75 / (2 + 0.75) = 0.6818
    assert metrics["weighted_f2"]["value"] == pytest.approx((0.5357143 * 6 + 0.6818182 * 4) / 10)
    assert metrics["accuracy"]["value"] == 0.6 and found["dataset"] == {"item_count": 10}
    multi = model_quality({**EVALUATION, "multi_label": True, "confusion_matrix": None})
    assert "accuracy" not in multi["multiclass_classification_metrics"]
    assert "confusion_matrix" not in multi["multiclass_classification_metrics"]
    # a class never predicted has no precision (null in evaluation.json): it counts 0, as scikit-learn's does
    unpredicted = {**EVALUATION, "per_class": [{**EVALUATION["per_class"][0], "precision": None},
                                               {**EVALUATION["per_class"][1], "precision": float("nan")}]}
    assert model_quality(unpredicted)["multiclass_classification_metrics"]["weighted_precision"]["value"] == 0.0


def test_instance_types_go_where_they_fit_and_a_group_of_another_account_is_used_as_it_is(aws):
    trained_job(aws)
    group = "arn:aws:sagemaker:us-east-1:210987654321:model-package-group/central"
    out = register(JOB, "--model-package-group", group, "--instance-type", "ml.t2.medium", "--instance-type",
                   "ml.c5.xlarge", "--dry-run", env=aws)
    assert out.returncode == 0, out.stderr
    requests = json.loads(out.stdout)
    assert list(requests) == ["CreateModelPackage"] and requests["CreateModelPackage"]["ModelPackageGroupName"] == group
    specification = requests["CreateModelPackage"]["InferenceSpecification"]
    assert specification["SupportedRealtimeInferenceInstanceTypes"] == ["ml.t2.medium", "ml.c5.xlarge"]
    assert specification["SupportedTransformInstanceTypes"] == ["ml.c5.xlarge"]  # (no ml.t2 for batch transform)


# What a notebook user writes to deploy a registered version with SDK v2 (AWS's model registry
# pages: ModelPackage(role=..., model_package_arn=...).deploy(...)), on the package `register` made
NOTEBOOK_DEPLOY = """
import sys
import boto3
from sagemaker import ModelPackage, Session

model = ModelPackage(role=sys.argv[2], model_package_arn=sys.argv[1], sagemaker_session=Session(boto3.Session()))
model.deploy(initial_instance_count=1, instance_type="ml.m5.xlarge", endpoint_name="from-notebook", wait=False)
"""


@pytest.mark.slow
def test_a_registered_version_deploys_with_the_sdks_own_model_package_class(aws, moto_endpoint, tmp_path):
    import subprocess

    trained_job(aws)
    out = register(JOB, "--model-package-group", "flowers", "--approval-status", "Approved", env=aws)
    assert out.returncode == 0, out.stderr
    arn = out.stdout.strip()
    script = tmp_path / "deploy.py"
    script.write_text(NOTEBOOK_DEPLOY)
    done = subprocess.run([str(sdk2_python()), str(script), arn, ROLE], env=aws, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    _, sagemaker = clients(aws)
    assert sagemaker.describe_endpoint(EndpointName="from-notebook")["EndpointStatus"] == "InService"
    (model,) = sent(moto_endpoint, "CreateModel")
    assert model["Containers"] == [{"ModelPackageName": arn}]
