"""The trained model hosted by SageMaker: a real-time or serverless endpoint (`keras-pipe deploy`) or a
batch transform job (`keras-pipe transform`), described once, validated, then turned into the requests
the SDKs send: CreateModel, then CreateEndpointConfig and CreateEndpoint, or CreateTransformJob.

The image's `serve` (train/keras_pipe_serve) answers them: one image per request (application/x-image),
one JSON answer per image. Everything is named after one stamp, BASE-YYYYmmddHHMMSS: the model, its
endpoint configuration and its endpoint, or the model and its transform job, so one name finds all.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time

from keras_pipe_launch.common.objects import SourceError, parse_s3_uri
from keras_pipe_launch.common.secrets import looks_secret
from keras_pipe_launch.sagemaker.request import RequestError, check_image_and_role, check_role
from keras_pipe_train.settings.contract import JOB_NAME

# serverless endpoints (CreateEndpointConfig's ServerlessConfig; AWS's documented limits)
SERVERLESS_MEMORY_MB = (1024, 2048, 3072, 4096, 5120, 6144)
SERVERLESS_MAX_CONCURRENCY = 200
# the image's server takes bodies up to SAGEMAKER_MAX_PAYLOAD_IN_MB (batch transform sets it from
# MaxPayloadInMB); SageMaker's real-time endpoints take at most 6 MB whatever the container says
DEFAULT_PAYLOAD_MB = 6
# CreateTransformJob: MaxPayloadInMB x MaxConcurrentTransforms must not pass 100 MB
TRANSFORM_PAYLOAD_BUDGET_MB = 100
IMAGE_CONTENT_TYPES = ("application/x-image", "image/jpeg", "image/png", "image/gif", "image/bmp", "image/webp")
# What the transform job asks the server for: a JSON line (or document) in the model's dialect (for
# a model trained in a built-in's, that built-in's answer), or this project's full answer whatever
# the dialect (labels, top k: keras_pipe_serve.payloads' RICH_LINES and RICH, spelled out here: the
# launcher does not install the server)
ACCEPTS = ("application/jsonlines", "application/json", "application/vnd.keras-pipe+jsonlines",
           "application/vnd.keras-pipe+json")
PACKAGE_ARN = re.compile(r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]+:\d{12}:model-package/[a-zA-Z0-9](-*[a-zA-Z0-9])*"
                         r"(/\d+)?$")
_BASE_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,47}$")  # + "-YYYYmmddHHMMSS" <= 63
# ml.m5.xlarge: 4 vCPUs, ml.c5.9xlarge: 36; large: 2 (true of every current family's sizes)
_SIZE = re.compile(r"^ml\.[a-z0-9-]+\.(\d*)(x?)large$")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The SageMaker model: the image, its role, and a training job's model.tar.gz; or a model
    package of the Model Registry (sagemaker/registry.py), which names both."""

    image_uri: str | None
    role: str
    model_data: str | None
    environment: tuple[tuple[str, str], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    network_isolation: bool = False
    base_name: str = "keras-pipe"
    name: str | None = None  # default: base_name-YYYYmmddHHMMSS
    model_package: str | None = None  # a model package's ARN, instead of image_uri and model_data
    # a multi-model endpoint's model (Mode MultiModel): model_data is the S3 prefix of many model.tar.gz
    multi_model: bool = False

    def named(self) -> ModelSpec:
        """This spec with its name fixed (now, unless given)."""
        return dataclasses.replace(self, name=self.name or f"{self.base_name}-{time.strftime('%Y%m%d%H%M%S')}")


@dataclasses.dataclass(frozen=True)
class EndpointSpec:
    """A real-time endpoint on instances, or a serverless one (serverless_memory_mb given)."""

    model: ModelSpec
    instance_type: str = "ml.m5.xlarge"
    instance_count: int = 1
    serverless_memory_mb: int | None = None
    serverless_max_concurrency: int = 5


@dataclasses.dataclass(frozen=True)
class TransformSpec:
    """A batch transform job: every object under `source` (an S3 prefix, or the objects a manifest
    lists) is one request; its answer lands at output_path/KEY.out."""

    model: ModelSpec
    source: str
    output_path: str
    data_type: str = "S3Prefix"  # or ManifestFile
    content_type: str = "application/x-image"
    accept: str = "application/jsonlines"
    instance_type: str = "ml.m5.xlarge"
    instance_count: int = 1
    max_payload_mb: int = DEFAULT_PAYLOAD_MB
    max_concurrent_transforms: int | None = None  # default: the instance's vCPUs, within the payload budget


@functools.cache
def _instance_types(shape: str) -> tuple[str, ...]:
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return tuple(model.shape_for(shape).enum)


def vcpus(instance_type: str) -> int | None:
    """The vCPUs of `instance_type` from its size (large: 2, xlarge: 4, Nxlarge: 4N); None if unknown."""
    match = _SIZE.match(instance_type)
    if not match:
        return None
    number, x = match.groups()
    if not x:
        return 2 if not number else None
    return 4 * int(number or 1)


def validate_model(spec: ModelSpec) -> list[str]:
    """Raises RequestError for what SageMaker would refuse or what could not work; returns warnings."""
    if spec.model_package is not None:
        if spec.image_uri:
            raise RequestError("--image-uri goes with --model-data: a model package names its own image")
        if not PACKAGE_ARN.match(spec.model_package):
            raise RequestError(f"--model-package {spec.model_package!r}: expected a model package's ARN, "
                               "arn:aws:sagemaker:REGION:ACCOUNT:model-package/GROUP/VERSION")
        check_role(spec.role)
    else:
        if not spec.image_uri:
            raise RequestError("--image-uri: the image that serves --model-data (or give --model-package)")
        check_image_and_role(spec.image_uri, spec.role)
        _check_model_data(spec.model_data, spec.multi_model)
    if not _BASE_NAME.match(spec.base_name):
        raise RequestError(f"--base-name {spec.base_name!r}: 1-48 letters, digits and hyphens")
    if spec.name is not None and not JOB_NAME.match(spec.name):
        raise RequestError(f"--name {spec.name!r}: 1-63 letters, digits and hyphens")
    secret = [f"--env {name}" for name, value in spec.environment if looks_secret(name, value)]
    if secret:
        return [f"{', '.join(secret)}: SageMaker keeps a model's environment in plain text, and DescribeModel "
                "shows it to anyone allowed to describe the model"]
    return []


def _check_model_data(model_data: str, multi_model: bool = False) -> None:
    _s3("--model-data", model_data)
    if multi_model:
        if not model_data.endswith("/"):
            raise RequestError(f"--model-data {model_data} with --multi-model: expected the S3 prefix (ending in /) "
                               "under which the models' model.tar.gz lie, each named by InvokeEndpoint's TargetModel "
                               "relative to it, e.g. s3://bucket/models/")
        return
    if not model_data.endswith(".tar.gz"):
        raise RequestError(f"--model-data {model_data}: expected a training job's model.tar.gz (SageMaker "
                           "unpacks it into /opt/ml/model), e.g. s3://bucket/jobs/JOB/output/model.tar.gz")


def validate_endpoint(spec: EndpointSpec) -> list[str]:
    found = validate_model(spec.model)
    if spec.model.multi_model and spec.model.model_package is not None:
        raise RequestError("--multi-model takes --model-data, an S3 prefix of models: a model package is one model")
    if spec.serverless_memory_mb is not None:
        if spec.model.multi_model:
            raise RequestError("--multi-model with --serverless-memory: SageMaker hosts multi-model endpoints on "
                               "instances only")
        if spec.serverless_memory_mb not in SERVERLESS_MEMORY_MB:
            raise RequestError(f"--serverless-memory {spec.serverless_memory_mb}: one of "
                               f"{', '.join(map(str, SERVERLESS_MEMORY_MB))} MB")
        if not 1 <= spec.serverless_max_concurrency <= SERVERLESS_MAX_CONCURRENCY:
            raise RequestError(f"--max-concurrency {spec.serverless_max_concurrency}: 1 to "
                               f"{SERVERLESS_MAX_CONCURRENCY}")
        return found + ["a serverless endpoint takes requests of at most 4 MB and has no GPU"]
    _check_instances(spec.instance_type, spec.instance_count, "ProductionVariantInstanceType", "hosting")
    if spec.model.multi_model and re.match(r"ml\.(g|p)\d", spec.instance_type):
        raise RequestError(f"--multi-model on {spec.instance_type}: SageMaker hosts multi-model endpoints on GPU "
                           "instances only with its Triton container; choose a CPU instance type (ml.m5, ml.c5 ...)")
    return found


def validate_transform(spec: TransformSpec) -> list[str]:
    found = validate_model(spec.model)
    _check_instances(spec.instance_type, spec.instance_count, "TransformInstanceType", "batch transform")
    _s3("--input", spec.source)
    _s3("--output-path", spec.output_path)
    if spec.data_type not in ("S3Prefix", "ManifestFile"):
        raise RequestError(f"data type {spec.data_type!r}: S3Prefix or ManifestFile")
    if spec.content_type not in IMAGE_CONTENT_TYPES:
        raise RequestError(f"--content-type {spec.content_type!r}: each object is one image: "
                           f"{', '.join(IMAGE_CONTENT_TYPES)}")
    if spec.accept not in ACCEPTS:
        raise RequestError(f"--accept {spec.accept!r}: {' or '.join(ACCEPTS)}")
    if not 1 <= spec.max_payload_mb <= TRANSFORM_PAYLOAD_BUDGET_MB:
        raise RequestError(f"--max-payload {spec.max_payload_mb}: 1 to {TRANSFORM_PAYLOAD_BUDGET_MB} MB "
                           "(the largest image, in MB, rounded up)")
    concurrent = max_concurrent_transforms(spec)
    if concurrent < 1 or concurrent * spec.max_payload_mb > TRANSFORM_PAYLOAD_BUDGET_MB:
        raise RequestError(f"--max-concurrent-transforms {concurrent} with --max-payload {spec.max_payload_mb}: "
                           f"at least 1, and together at most {TRANSFORM_PAYLOAD_BUDGET_MB} MB (SageMaker's limit "
                           "on their product)")
    # (an S3 prefix is a prefix of keys, not a folder: s3://b/photos takes s3://b/photos-out/ too)
    inside = spec.output_path.startswith(spec.source) or spec.output_path.rstrip("/") == spec.source.rstrip("/")
    if spec.data_type == "S3Prefix" and inside:
        raise RequestError(f"--output-path {spec.output_path} is inside --input {spec.source}: a later run would "
                           "take the answers (KEY.out) for images")
    return found


def max_concurrent_transforms(spec: TransformSpec) -> int:
    """As given, else one request per vCPU (the server runs a worker per CPU), within SageMaker's
    100 MB budget: SageMaker would otherwise send one request at a time (the image's
    /execution-parameters is not served; see keras_pipe_serve.app)."""
    if spec.max_concurrent_transforms is not None:
        return spec.max_concurrent_transforms
    return max(1, min(vcpus(spec.instance_type) or 1, TRANSFORM_PAYLOAD_BUDGET_MB // spec.max_payload_mb))


def _check_instances(instance_type: str, count: int, shape: str, what: str) -> None:
    if instance_type not in _instance_types(shape):
        raise RequestError(f"--instance-type {instance_type!r} is not a SageMaker {what} instance type "
                           "(e.g. ml.m5.xlarge, ml.c5.2xlarge, ml.g5.xlarge)")
    if instance_type.startswith(("ml.inf", "ml.trn")):
        raise RequestError(f"--instance-type {instance_type}: AWS Inferentia/Trainium do not run this "
                           "TensorFlow image; use a CPU (ml.m*, ml.c*) or GPU (ml.g*, ml.p*) type")
    if count < 1:
        raise RequestError("--instance-count must be >= 1")


def _s3(what: str, uri: str) -> None:
    try:
        parse_s3_uri(uri)
    except SourceError as err:
        raise RequestError(f"{what}: {err}") from None


def create_model_request(spec: ModelSpec) -> dict:
    """CreateModel for `spec` (named: ModelSpec.named())."""
    # (a model package's container goes in Containers: both SDKs' Session.create_model send it so)
    placed = {"Containers": [container(spec)]} if spec.model_package is not None else {
        "PrimaryContainer": container(spec)}
    request = {"ModelName": spec.name, **placed, "ExecutionRoleArn": spec.role}
    if spec.tags:
        request["Tags"] = _tags(spec)
    if spec.network_isolation:
        request["EnableNetworkIsolation"] = True
    return request


def container(spec: ModelSpec) -> dict:
    """The model's container: the image and its model data, or the model package that names them."""
    if spec.model_package is not None:
        return {"ModelPackageName": spec.model_package, "Environment": dict(spec.environment)}
    mode = {"Mode": "MultiModel"} if spec.multi_model else {}
    return {"Image": spec.image_uri, **mode, "ModelDataUrl": spec.model_data, "Environment": dict(spec.environment)}


def endpoint_requests(spec: EndpointSpec) -> dict[str, dict]:
    """{operation: request} for CreateModel, CreateEndpointConfig and CreateEndpoint, in that order."""
    model = spec.model
    variant = {"VariantName": "AllTraffic", "ModelName": model.name, "InitialVariantWeight": 1}
    if spec.serverless_memory_mb is not None:
        variant["ServerlessConfig"] = {"MemorySizeInMB": spec.serverless_memory_mb,
                                       "MaxConcurrency": spec.serverless_max_concurrency}
    else:
        variant.update(InitialInstanceCount=spec.instance_count, InstanceType=spec.instance_type)
    config = {"EndpointConfigName": model.name, "ProductionVariants": [variant]}
    # (both SDKs send CreateEndpoint's Tags even when empty)
    endpoint = {"EndpointName": model.name, "EndpointConfigName": model.name, "Tags": _tags(model)}
    if model.tags:
        config["Tags"] = _tags(model)
    return {"CreateModel": create_model_request(model), "CreateEndpointConfig": config, "CreateEndpoint": endpoint}


def transform_requests(spec: TransformSpec) -> dict[str, dict]:
    """{operation: request} for CreateModel and CreateTransformJob, in that order."""
    model = spec.model
    job = {
        "TransformJobName": model.name,
        "ModelName": model.name,
        # one image per object and per request: SingleRecord with no splitting is what a binary
        # object needs (SDK v2's local mode refuses MultiRecord on one)
        "MaxConcurrentTransforms": max_concurrent_transforms(spec),
        "MaxPayloadInMB": spec.max_payload_mb,
        "BatchStrategy": "SingleRecord",
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": spec.data_type, "S3Uri": spec.source}},
            "ContentType": spec.content_type,
            "CompressionType": "None",
            "SplitType": "None",
        },
        "TransformOutput": {"S3OutputPath": spec.output_path, "Accept": spec.accept, "AssembleWith": "None"},
        "TransformResources": {"InstanceType": spec.instance_type, "InstanceCount": spec.instance_count},
    }
    if model.tags:
        job["Tags"] = _tags(model)
    return {"CreateModel": create_model_request(model), "CreateTransformJob": job}


def _tags(spec: ModelSpec) -> list[dict]:
    return [{"Key": k, "Value": v} for k, v in spec.tags]
