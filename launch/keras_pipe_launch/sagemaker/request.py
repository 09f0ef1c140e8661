"""A SageMaker training job, described once: validated, then turned into its CreateTrainingJob request.

`keras-pipe submit --dry-run` prints `create_training_job_request()`; the SDK adapters (sagemaker/sdk.py)
configure SageMaker's SDK v3 or v2 so that each sends exactly this request (tests capture what they
send on a local S3/SageMaker server and compare). Validation happens here, before any call.
"""

from __future__ import annotations

import dataclasses
import re
import time

from keras_pipe_launch.common.channels import WHOLE_FILE_CHANNELS, ChannelError, ChannelSpec
from keras_pipe_launch.common.objects import SourceError, parse_s3_uri
from keras_pipe_launch.common.secrets import looks_secret
from keras_pipe_train.settings.channels import MODEL, TRAIN
from keras_pipe_train.settings.contract import JOB_NAME
from keras_pipe_train.training.metrics import METRIC_DEFINITIONS

CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"
TENSORBOARD_LOCAL_PATH = "/opt/ml/output/tensorboard"
_ROLE = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}$")
_BASE_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,47}$")  # + "-YYYYmmddHHMMSS" <= 63
_IMAGE = re.compile(r"^[^\s]+/[^\s]+(:[\w.-]+|@sha256:[0-9a-f]{64})?$")


class RequestError(ValueError):
    """A training job request described wrongly: the message says what to change. (The job's own
    failures are keras_pipe_train.settings.errors.JobError and its kinds.)"""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    image_uri: str
    role: str
    channels: tuple[ChannelSpec, ...]
    output_path: str
    instance_type: str = "ml.g5.xlarge"
    instance_count: int = 1
    input_mode: str = "Pipe"
    volume_size_gb: int = 30
    max_run_s: int = 24 * 3600
    spot: bool = False
    max_wait_s: int | None = None
    checkpoint_s3_uri: str | None = None
    tensorboard_s3_uri: str | None = None
    hyperparameters: tuple[tuple[str, str], ...] = ()
    environment: tuple[tuple[str, str], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    network_isolation: bool = False
    base_job_name: str = "keras-pipe"
    job_name: str | None = None  # default: base_job_name-YYYYmmddHHMMSS, as the SDKs name jobs
    allow_cpu: bool = False

    def name(self) -> str:
        return self.job_name or f"{self.base_job_name}-{time.strftime('%Y%m%d%H%M%S')}"


def gpu_instance(instance_type: str) -> bool:
    family = instance_type.split(".")[1] if instance_type.count(".") == 2 else ""
    return family.startswith(("g", "p"))


def training_instance_types() -> list[str]:
    """Every SageMaker training instance type, from botocore's service model of the API."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return list(model.shape_for("TrainingInstanceType").enum)


def validate(spec: JobSpec) -> list[str]:
    """Raises RequestError for what would make the job fail or misbehave; returns warnings."""
    _check_names(spec)
    _check_resources(spec)
    _check_locations(spec)
    _check_spot(spec)
    return warnings(spec)


def check_image_and_role(image_uri: str, role: str) -> None:
    """What every job request of ours needs: an image URI and a role ARN in full."""
    check_image(image_uri)
    check_role(role)


def check_role(role: str) -> None:
    if not _ROLE.match(role):
        raise RequestError(f"--role {role!r}: give the full role ARN (arn:aws:iam::ACCOUNT:role/NAME); "
                           "a bare name makes the SDK call iam:GetRole")


def check_image(image_uri: str) -> None:
    if not _IMAGE.match(image_uri):
        raise RequestError(f"--image-uri {image_uri!r}: expected REGISTRY/REPOSITORY[:TAG], e.g. "
                           "123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train:latest")


def _check_names(spec: JobSpec) -> None:
    check_image_and_role(spec.image_uri, spec.role)
    if not _BASE_NAME.match(spec.base_job_name):
        raise RequestError(f"--base-job-name {spec.base_job_name!r}: 1-48 letters, digits and hyphens")
    if spec.job_name is not None and not JOB_NAME.match(spec.job_name):
        raise RequestError(f"--job-name {spec.job_name!r}: 1-63 letters, digits and hyphens")


def _check_resources(spec: JobSpec) -> None:
    if spec.instance_type not in training_instance_types():
        raise RequestError(f"--instance-type {spec.instance_type!r} is not a SageMaker training instance type "
                           "(e.g. ml.g5.xlarge, ml.g5.12xlarge, ml.p4d.24xlarge)")
    if spec.instance_type.startswith(("ml.trn", "ml.inf")):
        raise RequestError(f"--instance-type {spec.instance_type}: AWS Trainium/Inferentia do not run this "
                           "TensorFlow image; use a GPU type (ml.g*, ml.p*)")
    if not gpu_instance(spec.instance_type) and not spec.allow_cpu:
        raise RequestError(f"--instance-type {spec.instance_type} has no GPU; pass --allow-cpu if a CPU "
                           "instance is really what you want (the image then needs "
                           "REQUIREMENTS=requirements/cpu.txt or works slowly)")
    if spec.instance_count < 1:
        raise RequestError("--instance-count must be >= 1")
    if not 1 <= spec.volume_size_gb <= 16384:
        raise RequestError("--volume-size must be 1 to 16384 GB")
    if not 1 <= spec.max_run_s <= 28 * 24 * 3600:
        raise RequestError("--max-run must be 1 s to 28 days")


def _check_locations(spec: JobSpec) -> None:
    """Every S3 URI well formed, and a train channel among the channels."""
    for what, uri in (("--output-path", spec.output_path), ("--checkpoint-s3-uri", spec.checkpoint_s3_uri),
                      ("--tensorboard-s3-uri", spec.tensorboard_s3_uri)):
        if uri is not None:
            _s3(what, uri)
    if TRAIN not in [c.name for c in spec.channels]:
        raise RequestError("a train channel is required: --train s3://bucket/prefix")
    for channel in spec.channels:
        _s3(f"channel {channel.name}", channel.source)


def _check_spot(spec: JobSpec) -> None:
    if spec.spot:
        if not spec.checkpoint_s3_uri:
            raise RequestError("--spot needs --checkpoint-s3-uri: an interrupted spot job resumes from its checkpoints")
        if spec.max_wait_s is not None and spec.max_wait_s < spec.max_run_s:
            raise RequestError(f"--max-wait ({spec.max_wait_s} s) must be at least --max-run ({spec.max_run_s} s)")
    elif spec.max_wait_s is not None:
        raise RequestError("--max-wait only applies to --spot jobs")


def warnings(spec: JobSpec) -> list[str]:
    """What a valid request does that its author probably did not mean."""
    found = []
    if spec.instance_count > 1:
        for channel in spec.channels:
            streamed_whole = channel.input_mode == "Pipe" and channel.distribution == "FullyReplicated"
            if channel.name not in WHOLE_FILE_CHANNELS and streamed_whole:
                found.append(f"channel {channel.name}: with {spec.instance_count} instances and FullyReplicated, "
                             "every host streams all of it and keeps 1/N; --distribution ShardedByS3Key "
                             "streams each host only its share")
    secret = [f"--env {name}" for name, value in spec.environment if looks_secret(name, value)]
    secret += [f"--hp {name}" for name, value in spec.hyperparameters if looks_secret(name, str(value))]
    if secret:
        found.append(f"{', '.join(secret)}: SageMaker keeps a job's environment and hyperparameters in plain text, "
                     "and DescribeTrainingJob shows them to anyone allowed to describe the job; keep secrets in AWS "
                     "Secrets Manager and let the job's role read them")
    if spec.network_isolation and dict(spec.hyperparameters).get("weights", "imagenet") == "imagenet" \
            and MODEL not in [c.name for c in spec.channels]:
        found.append("--network-isolation with weights=imagenet: the job cannot download ImageNet weights; "
                     "bake them into the image (BAKE_WEIGHTS) or use a pretrained channel")
    return found


def _s3(what: str, uri: str) -> None:
    try:
        parse_s3_uri(uri)
    except SourceError as err:
        raise RequestError(f"{what}: {err}") from None


def create_training_job_request(spec: JobSpec, name: str | None = None) -> dict:
    """The CreateTrainingJob request for `spec`, field for field as the SDKs send it."""
    request = {
        "TrainingJobName": name or spec.name(),
        "AlgorithmSpecification": {
            "TrainingInputMode": spec.input_mode,
            "TrainingImage": spec.image_uri,
            "MetricDefinitions": [dict(d) for d in METRIC_DEFINITIONS],
        },
        "RoleArn": spec.role,
        "InputDataConfig": [channel_request(c) for c in spec.channels],
        "OutputDataConfig": {"S3OutputPath": spec.output_path, "CompressionType": "GZIP"},
        "ResourceConfig": {"InstanceType": spec.instance_type, "InstanceCount": spec.instance_count,
                           "VolumeSizeInGB": spec.volume_size_gb},
        "StoppingCondition": {"MaxRuntimeInSeconds": spec.max_run_s},
        "HyperParameters": dict(spec.hyperparameters),
    }
    if spec.spot:
        request["EnableManagedSpotTraining"] = True
        request["StoppingCondition"]["MaxWaitTimeInSeconds"] = spec.max_wait_s or spec.max_run_s
    if spec.checkpoint_s3_uri:
        request["CheckpointConfig"] = {"S3Uri": spec.checkpoint_s3_uri, "LocalPath": CHECKPOINT_LOCAL_PATH}
    if spec.tensorboard_s3_uri:
        request["TensorBoardOutputConfig"] = {"S3OutputPath": spec.tensorboard_s3_uri,
                                              "LocalPath": TENSORBOARD_LOCAL_PATH}
    if spec.environment:
        request["Environment"] = dict(spec.environment)
    if spec.tags:
        request["Tags"] = [{"Key": k, "Value": v} for k, v in spec.tags]
    if spec.network_isolation:
        request["EnableNetworkIsolation"] = True
    return request


def channel_request(channel: ChannelSpec) -> dict:
    entry = {
        "ChannelName": channel.name,
        "DataSource": {"S3DataSource": {"S3DataType": channel.data_type, "S3Uri": channel.source,
                                        "S3DataDistributionType": channel.distribution}},
        "InputMode": channel.input_mode,
    }
    if channel.attribute_names:
        entry["DataSource"]["S3DataSource"]["AttributeNames"] = list(channel.attribute_names)
    if channel.compression != "None":
        entry["CompressionType"] = channel.compression
    if channel.record_wrapper != "None":
        entry["RecordWrapperType"] = channel.record_wrapper
    if channel.shuffle_seed is not None:
        entry["ShuffleConfig"] = {"Seed": channel.shuffle_seed}
    if channel.content_type:
        entry["ContentType"] = channel.content_type
    return entry


__all__ = ["ChannelError", "RequestError", "JobSpec", "create_training_job_request", "validate"]
