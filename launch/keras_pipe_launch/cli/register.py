"""`keras-pipe register`: a training job's model as a model package in SageMaker's Model Registry.

    keras-pipe register keras-pipe-20261124101500 --model-package-group flowers
    keras-pipe register s3://bucket/jobs/keras-pipe-20261124101500/output/model.tar.gz \\
        --model-package-group flowers --image-uri 123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train

Creates a new version in the model package group (and the group, when it is missing) carrying:
its inference specification (the image, by default the job's training image, which serves too;
the job's model.tar.gz; the content types `serve` takes and the answers it gives; instance types
for endpoints and transform jobs), the job's evaluation as ModelMetrics (model_quality.json,
written beside the job's model.tar.gz from the evaluation.json of its output.tar.gz, and
evaluation.json itself), and an approval status (PendingManualApproval unless said). Prints the
package's ARN, which `keras-pipe deploy --model-package ARN` and `transform --model-package ARN`
take; approve it with `aws sagemaker update-model-package --model-package-arn ARN
--model-approval-status Approved`. JOB: a SageMaker training job's name (read with
DescribeTrainingJob: it must have completed), or the S3 URI of a job's model.tar.gz.
--dry-run reads the job and its evaluation and prints the requests, checked against botocore's
model of the API; it writes and creates nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from keras_pipe_launch.cli import report
from keras_pipe_launch.cli.job_options import use_region
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError, key_values
from keras_pipe_launch.sagemaker import api_limits, registry
from keras_pipe_launch.sagemaker.request import RequestError
from keras_pipe_train.settings.contract import JOB_NAME


@dataclasses.dataclass(frozen=True)
class Trained:
    """What registering needs of a training job: its model, its image, its output.tar.gz."""

    job: str | None
    model_data: str
    image_uri: str | None
    output_archive: str


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("register", help="put a training job's model in the SageMaker Model Registry",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", help="a SageMaker training job's name, or the S3 URI of its model.tar.gz")
    parser.add_argument("--model-package-group", required=True, metavar="NAME",
                        help="the group the package is a version of (created when missing), or its ARN "
                             "(another account's group: never created)")
    parser.add_argument("--image-uri", default=None,
                        help="the image that serves it (default: the job's training image)")
    parser.add_argument("--approval-status", default="PendingManualApproval", choices=registry.APPROVAL_STATUSES)
    parser.add_argument("--description", default=None, help="the package's description (default: its training job)")
    parser.add_argument("--instance-type", action="append", default=None, metavar="TYPE",
                        help="an instance type endpoints or transform jobs may use, each listed where it fits "
                             "(repeat it; default: "
                             f"{', '.join(registry.INSTANCE_TYPES)})")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment variable of the server")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                        help="a tag of the model package group (SageMaker takes none on a package in a group)")
    parser.add_argument("--region", default=None, help="default: $AWS_DEFAULT_REGION")
    parser.add_argument("--dry-run", action="store_true",
                        help="read the job and print the requests; write and create nothing")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        use_region(args, reads=True)  # (--dry-run reads the job too)
        trained = trained_model(args.job)
        evaluation = read_evaluation(trained.output_archive)
        spec = package_spec(args, trained, evaluation)
        warnings = registry.validate(spec)
        requests = {"CreateModelPackageGroup": registry.group_request(spec),
                    "CreateModelPackage": registry.package_request(spec)}
        if registry.is_arn(spec.group):  # (another account's group: used, never created)
            del requests["CreateModelPackageGroup"]
        for operation, request in requests.items():
            api_limits.check(request, operation)
    except (UsageError, RequestError) as err:
        print(f"keras-pipe register: error: {shown(str(err))}", file=sys.stderr)
        return 2
    except (BotoCoreError, ClientError) as err:
        print(f"keras-pipe register: a call to AWS failed: {shown(str(err))}", file=sys.stderr)
        return 1
    for warning in warnings:
        print(f"keras-pipe register: warning: {shown(warning)}", file=sys.stderr)
    if args.dry_run:
        print(json.dumps(requests, indent=2))
        return 0
    try:
        arn = send(spec, requests, evaluation)
    except (BotoCoreError, ClientError) as err:
        print(f"keras-pipe register: a call to AWS failed: {shown(str(err))}", file=sys.stderr)
        return 1
    print(arn)
    return 0


def trained_model(job: str) -> Trained:
    """The model of JOB: a SageMaker training job's name, or the S3 URI of a model.tar.gz."""
    if job.startswith("s3://"):
        if not job.endswith(".tar.gz"):
            raise UsageError(f"{job}: expected a training job's model.tar.gz, e.g. "
                             "s3://bucket/jobs/JOB/output/model.tar.gz")
        parts = job.split("/")
        name = parts[-3] if len(parts) >= 6 and parts[-2] == "output" and JOB_NAME.match(parts[-3]) else None
        return Trained(name, job, None, registry.beside(job, "output.tar.gz"))
    if not JOB_NAME.match(job):
        raise UsageError(f"{job!r} is no SageMaker training job name and no s3:// URI of a model.tar.gz")
    described = report.described(job)
    status = described.get("TrainingJobStatus")
    if status != "Completed":
        raise UsageError(f"training job {job} is {status}: only a completed job has a model to register")
    model_data = described.get("ModelArtifacts", {}).get("S3ModelArtifacts")
    if not model_data:
        raise UsageError(f"training job {job} has no model artifacts (DescribeTrainingJob's ModelArtifacts)")
    base = described["OutputDataConfig"]["S3OutputPath"].rstrip("/")
    return Trained(job, model_data, described.get("AlgorithmSpecification", {}).get("TrainingImage"),
                   f"{base}/{job}/output/output.tar.gz")


def read_evaluation(output_archive: str) -> dict | None:
    """evaluation.json from the job's output.tar.gz in S3; None when either is missing."""
    from keras_pipe_launch.common.archives import unpack

    with report.downloaded(output_archive, "keras-pipe-register-") as local:
        if local is None:
            return None
        unpack(local, local.parent / "out", lambda member: member.isfile() and member.name.lstrip("./") ==
               registry.EVALUATION and member.size <= report.MAX_MEMBER_BYTES, "an output.tar.gz")
        found = local.parent / "out" / registry.EVALUATION
        return evaluation_in(found, output_archive) if found.is_file() else None


def evaluation_in(found: Path, output_archive: str) -> dict:
    """The job's evaluation read from `found` (unpacked from `output_archive`), checked for the
    shape the package's metrics are made of."""
    try:
        evaluation = json.loads(found.read_text())
    except (UnicodeDecodeError, ValueError) as err:
        raise UsageError(f"{output_archive}: its {registry.EVALUATION} is no JSON ({err})") from None
    rows = evaluation.get("per_class", []) if isinstance(evaluation, dict) else None
    if not isinstance(rows, list) or not all(isinstance(row, dict) and isinstance(row.get("support", 0), int)
                                             for row in rows):
        raise UsageError(f"{output_archive}: its {registry.EVALUATION} is not a job's evaluation")
    return evaluation


def package_spec(args: argparse.Namespace, trained: Trained, evaluation: dict | None) -> registry.PackageSpec:
    image = args.image_uri or trained.image_uri
    if not image:
        raise UsageError("--image-uri: the image that serves the model (a model.tar.gz's URI does not say which)")
    metadata = {"training_job": trained.job} if trained.job else {}
    quality = None
    if evaluation is not None:
        quality = (registry.beside(trained.model_data, registry.MODEL_QUALITY),
                   registry.digest(registry.quality_json(evaluation)))
        metadata.update(registry.summary(evaluation))
        where = registry.beside(trained.model_data, registry.EVALUATION)
        if registry.metadata_value(where):  # (else named nowhere but S3)
            metadata["evaluation"] = where
    realtime, transform = registry.instance_types(args.instance_type or list(registry.INSTANCE_TYPES))
    return registry.PackageSpec(
        group=args.model_package_group, image_uri=image, model_data=trained.model_data, job=trained.job,
        approval=args.approval_status, description=args.description, realtime_instance_types=realtime,
        transform_instance_types=transform, environment=tuple(key_values(args.env, "--env").items()),
        tags=tuple(key_values(args.tag, "--tag").items()), quality=quality, metadata=tuple(metadata.items()))


def send(spec: registry.PackageSpec, requests: dict, evaluation: dict | None) -> str:
    """Uploads the metrics' files, creates the group if missing, then the package; its ARN. (With
    boto3: the SDKs' helpers, v2's Session.create_model_package_from_containers and v3's
    ModelPackage resource, build CreateModelPackage from arguments of their own; sending the
    request built and checked here keeps what --dry-run prints the request sent.)"""
    import boto3

    from keras_pipe_launch.common.objects import parse_s3_uri

    if evaluation is not None:
        s3 = boto3.client("s3")
        whole = (json.dumps(evaluation, indent=1) + "\n").encode()
        for uri, body in ((spec.quality[0], registry.quality_json(evaluation)),
                          (registry.beside(spec.model_data, registry.EVALUATION), whole)):
            s3.put_object(**dict(zip(("Bucket", "Key"), parse_s3_uri(uri))), Body=body, ContentType="application/json")
    sagemaker = boto3.client("sagemaker")
    group = ensure_group(sagemaker, spec, requests.get("CreateModelPackageGroup"))
    if spec.tags and group:  # (the group's tags: a package in a group takes none)
        sagemaker.add_tags(ResourceArn=group, Tags=registry.tags(spec))
    arn = sagemaker.create_model_package(**requests["CreateModelPackage"])["ModelPackageArn"]
    print(f"keras-pipe register: registered {shown(arn)} ({spec.approval})", file=sys.stderr)
    return arn


def ensure_group(sagemaker, spec: registry.PackageSpec, create: dict | None) -> str | None:
    """The group's ARN when it existed (its tags still to add); None when created here, with its
    tags. A group given by its ARN is used as it is."""
    from botocore.exceptions import ClientError

    if create is None:
        return spec.group
    try:
        return sagemaker.describe_model_package_group(ModelPackageGroupName=spec.group)["ModelPackageGroupArn"]
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") not in ("ValidationException", "ResourceNotFound"):
            raise
    try:
        sagemaker.create_model_package_group(**create)
        print(f"keras-pipe register: created model package group {spec.group}", file=sys.stderr)
        return None
    except ClientError:  # (created by another register at the same moment: the group is there all the same)
        return sagemaker.describe_model_package_group(ModelPackageGroupName=spec.group)["ModelPackageGroupArn"]
