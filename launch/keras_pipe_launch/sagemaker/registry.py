"""A training job's model in SageMaker's Model Registry (`keras-pipe register`): a model package
in a model package group, described once, validated, then turned into the requests sent:
CreateModelPackageGroup (when the group is missing) and CreateModelPackage.

The package carries what deploying it needs (its inference specification: this image, the model's
model.tar.gz, the content types the image's `serve` takes and the answers it gives, instance
types), the job's evaluation as ModelMetrics, and an approval status. `keras-pipe deploy` and
`transform` take its ARN (CreateModel with the package as the container).

ModelMetrics' ModelQuality statistics point at model_quality.json in S3: the job's evaluation in
the form SageMaker Model Monitor writes a model's quality in, which SageMaker Studio's model
registry shows (AWS's "Model quality metrics" page: each metric a value and a standard deviation,
a confusion matrix of counts keyed by class), with its SHA-256 as ContentDigest. evaluation.json
whole (each class's scores, the calibration) sits beside it, named in CustomerMetadataProperties.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re

from keras_pipe_launch.sagemaker.hosting import ACCEPTS, IMAGE_CONTENT_TYPES, _check_instances, _instance_types, _s3
from keras_pipe_launch.sagemaker.request import RequestError, check_image

APPROVAL_STATUSES = ("PendingManualApproval", "Approved", "Rejected")
# what a package says it may be deployed on (CreateModelPackage lists them; SageMaker's console
# offers them): CPUs for small models, the GPUs this image runs on (docs/image.md)
INSTANCE_TYPES = ("ml.m5.large", "ml.m5.xlarge", "ml.m5.2xlarge", "ml.c5.xlarge", "ml.c5.2xlarge",
                  "ml.g4dn.xlarge", "ml.g5.xlarge")
_GROUP = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
# a group of another account (a central registry): used as it is, never created
GROUP_ARN = re.compile(r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]+:\d{12}:model-package-group/"
                       r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
MAX_ENVIRONMENT = 16  # a package's container takes at most 16 variables (AWS's API reference; botocore says 100)
MODEL_QUALITY = "model_quality.json"
SUMMARY_METRICS = ("accuracy", "top_k_accuracy", "f1", "loss", "ece")  # (of evaluation.json's, those a package lists)
EVALUATION = "evaluation.json"


@dataclasses.dataclass(frozen=True)
class PackageSpec:
    """A model package: the group, the image and model data, what it says of itself."""

    group: str
    image_uri: str
    model_data: str
    job: str | None = None  # the training job it comes from
    approval: str = "PendingManualApproval"
    description: str | None = None
    realtime_instance_types: tuple[str, ...] = INSTANCE_TYPES
    transform_instance_types: tuple[str, ...] = INSTANCE_TYPES
    environment: tuple[tuple[str, str], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()
    quality: tuple[str, str] | None = None  # model_quality.json: (its S3 URI, its content's sha256)
    metadata: tuple[tuple[str, str], ...] = ()  # CustomerMetadataProperties


def validate(spec: PackageSpec) -> list[str]:
    """Raises RequestError for what SageMaker would refuse; returns warnings."""
    check_image(spec.image_uri)
    if not (_GROUP.match(spec.group) or GROUP_ARN.match(spec.group)):
        raise RequestError(f"--model-package-group {spec.group!r}: 1-63 letters, digits and hyphens, or a model "
                           "package group's ARN (arn:aws:sagemaker:REGION:ACCOUNT:model-package-group/NAME)")
    if len(spec.environment) > MAX_ENVIRONMENT:
        raise RequestError(f"{len(spec.environment)} --env variables: a model package's container takes at most "
                           f"{MAX_ENVIRONMENT}")
    if spec.approval not in APPROVAL_STATUSES:
        raise RequestError(f"--approval-status {spec.approval!r}: one of {', '.join(APPROVAL_STATUSES)}")
    _s3("the model data", spec.model_data)
    if not (spec.realtime_instance_types or spec.transform_instance_types):
        raise RequestError("--instance-type: none given fits an endpoint or a transform job")
    if spec.quality is None:
        return ["the job wrote no evaluation.json (no validation channel, or an older image): the package has no "
                "ModelMetrics"]
    return []


def instance_types(given: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(those for endpoints, those for transform jobs) of `given` (each checked as SageMaker's
    instance types for either; ml.t2.medium is one for endpoints alone)."""
    realtime = tuple(dict.fromkeys(t for t in given if t in _instance_types("ProductionVariantInstanceType")))
    transform = tuple(dict.fromkeys(t for t in given if t in _instance_types("TransformInstanceType")))
    for instance_type in given:
        shape = "ProductionVariantInstanceType" if instance_type in realtime else "TransformInstanceType"
        _check_instances(instance_type, 1, shape, "hosting or batch transform")
    return realtime, transform


def is_arn(group: str) -> bool:
    return group.startswith("arn:")


def group_request(spec: PackageSpec) -> dict:
    """CreateModelPackageGroup, sent when the group (a name, not an ARN) is missing. It holds the
    tags: SageMaker refuses Tags on a package in a group ("If you supply ModelPackageGroupName,
    your model package belongs to the model group you specify and you cannot supply a tag
    argument": CreateModelPackage's reference)."""
    request = {"ModelPackageGroupName": spec.group,
               "ModelPackageGroupDescription": "image classifiers trained by keras-pipe"}
    if spec.tags:
        request["Tags"] = tags(spec)
    return request


def package_request(spec: PackageSpec) -> dict:
    """CreateModelPackage: a version in spec.group."""
    container = {"Image": spec.image_uri, "ModelDataUrl": spec.model_data, "Framework": "TENSORFLOW"}
    if spec.environment:
        container["Environment"] = dict(spec.environment)
    request = {
        "ModelPackageGroupName": spec.group,
        "ModelPackageDescription": spec.description or (f"training job {spec.job}" if spec.job else spec.model_data),
        "InferenceSpecification": {
            "Containers": [container],
            "SupportedContentTypes": list(IMAGE_CONTENT_TYPES),
            "SupportedResponseMIMETypes": list(ACCEPTS),
        },
        "ModelApprovalStatus": spec.approval,
        "Domain": "COMPUTER_VISION",
        "Task": "IMAGE_CLASSIFICATION",
    }
    for member, types in (("SupportedRealtimeInferenceInstanceTypes", spec.realtime_instance_types),
                          ("SupportedTransformInstanceTypes", spec.transform_instance_types)):
        if types:
            request["InferenceSpecification"][member] = list(types)
    if spec.quality is not None:
        uri, sha256 = spec.quality
        request["ModelMetrics"] = {"ModelQuality": {"Statistics": {
            "ContentType": "application/json", "S3Uri": uri, "ContentDigest": f"sha256:{sha256}"}}}
    if spec.metadata:
        request["CustomerMetadataProperties"] = dict(spec.metadata)
    return request


def tags(spec: PackageSpec) -> list[dict]:
    return [{"Key": k, "Value": v} for k, v in spec.tags]


def metadata_value(value: str) -> bool:
    """Whether CustomerMetadataProperties may hold `value`: 1-256 letters, digits, spaces and
    _.:/=+-@ (the API's pattern, in Java's \\p classes, which botocore's check and api_limits leave to
    SageMaker)."""
    return 1 <= len(value) <= 256 and re.fullmatch(r"[\w\s.:/=+\-@]*", value) is not None


def beside(model_data: str, name: str) -> str:
    """The S3 URI of file `name` in the folder of the job's model.tar.gz (SageMaker's JOB/output/)."""
    return f"{model_data.rsplit('/', 1)[0]}/{name}"


def digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def model_quality(evaluation: dict) -> dict:
    """evaluation.json's numbers in SageMaker Model Monitor's model quality form: a single-label
    job's as multiclass_classification_metrics (accuracy, the support-weighted precision, recall
    and F-scores, the confusion matrix, true class by predicted class); a multi-label job's the
    weighted scores alone, over its labels (Model Monitor defines the form for one label per
    image). A class's score that is undefined (null in evaluation.json: a class never predicted,
    or absent from the validation set) counts 0, as scikit-learn's zero_division does. Standard
    deviations are "NaN", as Model Monitor writes them under 200 samples: one validation pass
    gives none."""
    per_class = [(_score(row.get("precision")), _score(row.get("recall")), int(row.get("support") or 0))
                 for row in evaluation.get("per_class") or []]
    support = sum(count for _, _, count in per_class)

    def weighted(score) -> float:
        return sum(score(precision, recall) * count for precision, recall, count in per_class) / support \
            if support else 0.0

    def f_beta(beta: float):
        def score(precision: float, recall: float) -> float:
            total = beta * beta * precision + recall
            return (1 + beta * beta) * precision * recall / total if total else 0.0
        return score

    metrics = {"weighted_precision": weighted(lambda precision, recall: precision),
               "weighted_recall": weighted(lambda precision, recall: recall),
               "weighted_f0_5": weighted(f_beta(0.5)), "weighted_f1": weighted(f_beta(1.0)),
               "weighted_f2": weighted(f_beta(2.0))}
    if not evaluation.get("multi_label"):
        if (accuracy := _score((evaluation.get("metrics") or {}).get("accuracy"), None)) is not None:
            metrics["accuracy"] = accuracy
    found = {name: {"value": value, "standard_deviation": "NaN"} for name, value in metrics.items()}
    matrix = (evaluation.get("confusion_matrix") or {}).get("counts")
    if matrix is not None and not evaluation.get("multi_label"):
        names = evaluation.get("classes") or []
        found["confusion_matrix"] = {true: dict(zip(names, row)) for true, row in zip(names, matrix)}
    return {"version": 0.0, "dataset": {"item_count": evaluation.get("examples", support)},
            "multiclass_classification_metrics": found}


def _score(value, undefined: float | None = 0.0) -> float | None:
    """A score of evaluation.json as a number: null, NaN or not a number is `undefined`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return undefined
    return float(value)


def summary(evaluation: dict) -> dict[str, str]:
    """The evaluation in a few CustomerMetadataProperties (text, as the API keeps them)."""
    found = {"classes": str(len(evaluation.get("classes") or []))}
    if isinstance(evaluation.get("examples"), int):
        found["validation_images"] = str(evaluation["examples"])
    for name, value in (evaluation.get("metrics") or {}).items():
        if name in SUMMARY_METRICS and (score := _score(value, None)) is not None:
            found[f"validation_{name}"] = f"{score:.4f}"
    return found


def quality_json(evaluation: dict) -> bytes:
    return (json.dumps(model_quality(evaluation), indent=1) + "\n").encode()
