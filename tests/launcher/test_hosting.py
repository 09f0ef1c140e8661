"""`keras-pipe deploy` and `keras-pipe transform`: the requests SageMaker's SDK v3 and v2 really send
(recorded by moto's server on 127.0.0.1), equal to --dry-run's; validation; following until ready."""

import functools
import json
import os
import sys

import pytest

from tests.conftest import sdk2_python
from tests.launcher.conftest import dry_run_request, launch_cli, sent

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train:latest"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
MODEL = ["--image-uri", IMAGE, "--role", ROLE, "--model-data", "s3://data/jobs/digits-1/output/model.tar.gz"]
DEPLOYS = {
    "instances": [*MODEL, "--instance-type", "ml.c5.2xlarge", "--instance-count", "2",
                  "--env", "SAGEMAKER_MODEL_SERVER_WORKERS=4", "--tag", "team=vision", "--network-isolation"],
    "serverless": [*MODEL, "--serverless-memory", "3072", "--max-concurrency", "10"],
    "multi-model": ["--image-uri", IMAGE, "--role", ROLE, "--model-data", "s3://data/models/", "--multi-model",
                    "--instance-type", "ml.c5.2xlarge"],
}
TRANSFORMS = {
    "prefix": [*MODEL, "--input", "s3://data/photos/", "--output-path", "s3://data/predictions/"],
    "manifest": [*MODEL, "--manifest", "s3://data/lists/photos.manifest", "--output-path", "s3://data/predictions/",
                 "--content-type", "image/png", "--accept", "application/json", "--instance-type", "ml.g5.xlarge",
                 "--instance-count", "3", "--max-payload", "20", "--tag", "team=vision",
                 "--env", "SAGEMAKER_MODEL_SERVER_TIMEOUT=120"],
}
OPERATIONS = {"deploy": ("CreateModel", "CreateEndpointConfig", "CreateEndpoint"),
              "transform": ("CreateModel", "CreateTransformJob")}


def through_sdk(command: str, args: list[str], name: str, env: dict, moto_endpoint: str, python) -> dict:
    """{operation: the request the SDK of `python` sent} for `keras-pipe COMMAND ARGS --name NAME`."""
    out = launch_cli(command, *args, "--name", name, python=python, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == name
    assert f"with SageMaker SDK v{3 if python == sys.executable else 2}" in out.stderr
    requests = {}
    for operation in OPERATIONS[command]:
        (requests[operation],) = sent(moto_endpoint, operation)
    return requests


# (v2 and v3 go through the same adapter, each SDK's Session and Transformer: v2 twice, not four times)
@pytest.mark.slow
@pytest.mark.parametrize("sdk, command, case", [("v3", "deploy", c) for c in DEPLOYS] + [
    ("v3", "transform", c) for c in TRANSFORMS] + [("v2", "deploy", "instances"), ("v2", "deploy", "multi-model"),
                                                    ("v2", "transform", "manifest")])
def test_each_sdk_sends_exactly_the_dry_run_requests(aws, moto_endpoint, sdk, command, case):
    args = (DEPLOYS if command == "deploy" else TRANSFORMS)[case]
    name = f"{command}-{case}-{sdk}"
    python = sys.executable if sdk == "v3" else sdk2_python()
    assert through_sdk(command, args, name, aws, moto_endpoint, python) == dry_run_request(command, *args, "--name", name)


@pytest.mark.slow
def test_the_requests_say_what_was_asked():
    deploy = dry_run_request("deploy", *DEPLOYS["instances"], "--name", "n1")
    assert deploy["CreateModel"] == {
        "ModelName": "n1", "ExecutionRoleArn": ROLE, "EnableNetworkIsolation": True,
        "PrimaryContainer": {"Image": IMAGE, "ModelDataUrl": "s3://data/jobs/digits-1/output/model.tar.gz",
                             "Environment": {"SAGEMAKER_MODEL_SERVER_WORKERS": "4"}},
        "Tags": [{"Key": "team", "Value": "vision"}]}
    assert deploy["CreateEndpointConfig"]["ProductionVariants"] == [
        {"VariantName": "AllTraffic", "ModelName": "n1", "InitialVariantWeight": 1, "InitialInstanceCount": 2,
         "InstanceType": "ml.c5.2xlarge"}]
    assert deploy["CreateEndpoint"] == {"EndpointName": "n1", "EndpointConfigName": "n1",
                                        "Tags": [{"Key": "team", "Value": "vision"}]}
    multi = dry_run_request("deploy", *DEPLOYS["multi-model"])["CreateModel"]["PrimaryContainer"]
    assert multi == {"Image": IMAGE, "Mode": "MultiModel", "ModelDataUrl": "s3://data/models/",
                     "Environment": {"SAGEMAKER_MULTI_MODEL": "true"}}  # (what the image's serve reads)
    serverless = dry_run_request("deploy", *DEPLOYS["serverless"])["CreateEndpointConfig"]["ProductionVariants"]
    assert serverless == [{"VariantName": "AllTraffic", "ModelName": serverless[0]["ModelName"],
                           "InitialVariantWeight": 1, "ServerlessConfig": {"MemorySizeInMB": 3072, "MaxConcurrency": 10}}]
    job = dry_run_request("transform", *TRANSFORMS["prefix"])["CreateTransformJob"]
    # one image per object and per request; 4 at once on ml.m5.xlarge's 4 vCPUs
    assert (job["BatchStrategy"], job["MaxConcurrentTransforms"], job["MaxPayloadInMB"]) == ("SingleRecord", 4, 6)
    assert job["TransformInput"] == {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://data/photos/"}},
                                     "ContentType": "application/x-image", "CompressionType": "None", "SplitType": "None"}
    assert job["TransformOutput"] == {"S3OutputPath": "s3://data/predictions/", "Accept": "application/jsonlines",
                                      "AssembleWith": "None"}
    manifest = dry_run_request("transform", *TRANSFORMS["manifest"])["CreateTransformJob"]
    assert manifest["TransformInput"]["DataSource"]["S3DataSource"]["S3DataType"] == "ManifestFile"
    # 20 MB images: 5 at once is SageMaker's 100 MB budget (ml.g5.xlarge has 4 vCPUs: 4)
    assert (manifest["MaxConcurrentTransforms"], manifest["MaxPayloadInMB"]) == (4, 20)
    rich = dry_run_request("transform", *TRANSFORMS["prefix"], "--accept", "application/vnd.keras-pipe+jsonlines")
    assert rich["CreateTransformJob"]["TransformOutput"]["Accept"] == "application/vnd.keras-pipe+jsonlines"
    big = dry_run_request("transform", *TRANSFORMS["prefix"], "--instance-type", "ml.c5.9xlarge")["CreateTransformJob"]
    assert big["MaxConcurrentTransforms"] == 16  # 36 vCPUs, but 16 x 6 MB is the most within 100 MB


def test_the_transforms_accept_types_are_the_servers():
    from keras_pipe_serve import payloads

    from keras_pipe_launch.sagemaker import hosting

    assert hosting.ACCEPTS == ("application/jsonlines", "application/json", payloads.RICH_LINES, payloads.RICH)


def test_dry_run_contacts_nothing_and_redacts_secrets():
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_DEFAULT_REGION": "us-east-1"}
    out = launch_cli("deploy", *MODEL, "--env", "API_TOKEN=tok-123", "--dry-run", env=env)
    assert out.returncode == 0, out.stderr
    assert "SageMaker SDK" not in out.stderr and "tok-123" not in out.stdout + out.stderr
    assert json.loads(out.stdout)["CreateModel"]["PrimaryContainer"]["Environment"] == {"API_TOKEN": "REDACTED"}
    assert "--env API_TOKEN: SageMaker keeps a model's environment in plain text" in out.stderr


deploy = functools.partial(launch_cli, "deploy")
transform = functools.partial(launch_cli, "transform")


@pytest.mark.parametrize("command, change, message", [
    ("deploy", ["--model-data", "s3://data/jobs/digits-1/output/"], "--model-data s3://data/jobs/digits-1/output/: "
                                                                    "expected a training job's model.tar.gz"),
    ("deploy", ["--model-data", "s3:/x/model.tar.gz"], "--model-data: 's3:/x/model.tar.gz' is not an S3 URI"),
    ("deploy", ["--multi-model"], "--model-data s3://data/jobs/digits-1/output/model.tar.gz with --multi-model: "
                                  "expected the S3 prefix (ending in /)"),
    ("deploy", ["--model-data", "s3://data/models/", "--multi-model", "--serverless-memory", "2048"],
     "SageMaker hosts multi-model endpoints on instances only"),
    ("deploy", ["--model-data", "s3://data/models/", "--multi-model", "--instance-type", "ml.g5.xlarge"],
     "SageMaker hosts multi-model endpoints on GPU instances only with its Triton container"),
    ("deploy", ["--instance-type", "ml.g5.xxlarge"], "--instance-type 'ml.g5.xxlarge' is not a SageMaker hosting instance type"),
    ("deploy", ["--instance-type", "ml.inf2.xlarge"], "AWS Inferentia/Trainium do not run this TensorFlow image"),
    ("deploy", ["--instance-count", "0"], "--instance-count must be >= 1"),
    ("deploy", ["--serverless-memory", "1000"], "--serverless-memory 1000: one of 1024, 2048, 3072, 4096, 5120, 6144 MB"),
    ("deploy", ["--serverless-memory", "2048", "--max-concurrency", "201"], "--max-concurrency 201: 1 to 200"),
    ("deploy", ["--name", "my_model"], "--name 'my_model': 1-63 letters, digits and hyphens"),
    ("deploy", ["--base-name", "x" * 49], "1-48 letters, digits and hyphens"),
    ("deploy", ["--role", "SageMakerRole"], "--role 'SageMakerRole': give the full role ARN"),
    ("deploy", ["--env", "A=1", "--env", "A=2"], "--env A is given twice"),
    ("transform", ["--input", "s3://data/photos/", "--output-path", "s3://data/photos/out/"],
     "--output-path s3://data/photos/out/ is inside --input s3://data/photos/"),
    ("transform", ["--input", "s3://data/photos", "--output-path", "s3://data/photos-out/"],
     "--output-path s3://data/photos-out/ is inside --input s3://data/photos"),
    ("transform", ["--input", "photos/", "--output-path", "s3://data/p/"], "--input: 'photos/' is not an S3 URI"),
    ("transform", ["--input", "s3://data/photos/", "--output-path", "s3://data/p/", "--max-payload", "101"],
     "--max-payload 101: 1 to 100 MB"),
    ("transform", ["--input", "s3://data/photos/", "--output-path", "s3://data/p/", "--max-payload", "30",
                   "--max-concurrent-transforms", "4"], "--max-concurrent-transforms 4 with --max-payload 30"),
    ("transform", ["--input", "s3://data/photos/", "--output-path", "s3://data/p/", "--instance-type", "ml.m5.xxlarge"],
     "is not a SageMaker batch transform instance type"),
])
def test_validation_errors_say_what_to_change(command, change, message, capsys):
    from keras_pipe_launch.cli import main

    assert main([command, *MODEL, *change, "--dry-run"]) == 2  # (in this process: these are many)
    out = capsys.readouterr()
    assert message in out.err and out.out == "", out.err


@pytest.mark.slow
def test_wait_follows_the_endpoint_until_in_service_and_the_transform_job_until_it_completes(aws):
    out = deploy(*MODEL, "--wait", env=aws)  # moto creates endpoints and completes transform jobs at once
    assert out.returncode == 0, out.stderr
    name = out.stdout.strip()
    assert f"keras-pipe deploy: {name}: InService" in out.stderr
    assert f"aws sagemaker-runtime invoke-endpoint --endpoint-name {name} --content-type application/x-image" in out.stderr
    out = transform(*TRANSFORMS["prefix"], "--wait", env=aws)
    assert out.returncode == 0, out.stderr
    assert f"keras-pipe transform: {out.stdout.strip()}: Completed" in out.stderr
    assert "keras-pipe transform: answers under s3://data/predictions/" in out.stderr
