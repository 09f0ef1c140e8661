"""Hosting through the installed SageMaker Python SDK: the requests of sagemaker/hosting.py sent by its
Session and Transformer. SDK v3 carries v2's Session (sagemaker.core.helper.session_helper) and
Transformer (sagemaker.core.transformer) over with the same signatures, so one adapter serves both;
v2's own Model.deploy() and Model.transformer() call the very same methods. The tests record what each
SDK sends on a local server and compare it with --dry-run's requests.

Why not v3's ModelBuilder: it builds and deploys models for the model servers AWS ships (TorchServe,
Triton, DJL, TGI ...) and wants to choose or start one itself; this image brings its own server. Why
not v3's resource classes (sagemaker.core.resources.EndpointConfig ...): in 3.27 they send a
serverless endpoint's MemorySizeInMB as "MemorySizeInMb", which botocore refuses.
"""

from __future__ import annotations

import re

from keras_pipe_launch.sagemaker.hosting import (
    EndpointSpec,
    ModelSpec,
    TransformSpec,
    container,
    max_concurrent_transforms,
)
from keras_pipe_launch.sagemaker.request import RequestError
from keras_pipe_launch.sagemaker.sdk import before_v2, sdk_major_version


def deploy(spec: EndpointSpec) -> None:
    """Creates the model, its endpoint configuration and its endpoint (without waiting)."""
    sdk = _Sdk()
    _create_model(sdk, spec.model)
    serverless = spec.serverless_memory_mb is not None
    variant = sdk.production_variant(
        model_name=spec.model.name, instance_type=None if serverless else spec.instance_type,
        initial_instance_count=None if serverless else spec.instance_count,
        serverless_inference_config={"MemorySizeInMB": spec.serverless_memory_mb,
                                     "MaxConcurrency": spec.serverless_max_concurrency} if serverless else None)
    sdk.session.endpoint_from_production_variants(spec.model.name, [variant], tags=_tags(spec.model), wait=False)


def transform(spec: TransformSpec) -> None:
    """Creates the model and the transform job (without waiting)."""
    sdk = _Sdk()
    _create_model(sdk, spec.model)
    transformer = sdk.Transformer(
        spec.model.name, spec.instance_count, spec.instance_type, strategy="SingleRecord", assemble_with="None",
        output_path=spec.output_path, accept=spec.accept, max_concurrent_transforms=max_concurrent_transforms(spec),
        max_payload=spec.max_payload_mb, tags=_tags(spec.model), sagemaker_session=sdk.session)
    transformer.transform(spec.source, data_type=spec.data_type, content_type=spec.content_type,
                          compression_type="None", split_type="None", job_name=spec.model.name, wait=False,
                          logs=False)


class _Sdk:
    """The installed SDK's Session (on boto3's default session), container_def, production_variant
    and Transformer."""

    def __init__(self):
        import boto3

        if sdk_major_version() >= 3:
            from sagemaker.core.helper.session_helper import Session, container_def, production_variant
            from sagemaker.core.transformer import Transformer
        else:
            before_v2()
            from sagemaker.session import Session, container_def, production_variant
            from sagemaker.transformer import Transformer
        self.session = Session(boto_session=boto3.Session())
        self.container_def, self.production_variant, self.Transformer = container_def, production_variant, Transformer


def _create_model(sdk: _Sdk, spec: ModelSpec) -> None:
    if spec.model_package is not None:
        check_approved(sdk.session.sagemaker_client, spec.model_package)
    # (a model package's container: the SDKs' container_def wants an image; their create_model sends
    # the dict as given)
    definition = (container(spec) if spec.model_package is not None
                  else sdk.container_def(spec.image_uri, spec.model_data, env=dict(spec.environment),
                                         container_mode="MultiModel" if spec.multi_model else None))
    sdk.session.create_model(spec.name, role=spec.role, container_defs=definition, tags=_tags(spec),
                             enable_network_isolation=spec.network_isolation)


def check_approved(client, package: str) -> None:
    """Raises RequestError unless model package `package` is Approved: SageMaker deploys a
    versioned package only then (CreateModelPackage's ModelApprovalStatus: "For versioned models,
    the value of this parameter must be set to Approved to deploy the model"), and would say so only
    when the endpoint or transform job fails."""
    if not re.search(r"/\d+$", package):  # (an unversioned package, as AWS Marketplace's: no approval applies)
        return
    status = client.describe_model_package(ModelPackageName=package).get("ModelApprovalStatus")
    if status != "Approved":
        raise RequestError(f"model package {package} is {status}: SageMaker deploys only Approved versions; approve "
                           f"it with `aws sagemaker update-model-package --model-package-arn {package} "
                           "--model-approval-status Approved`")


def _tags(spec: ModelSpec) -> list | None:
    return [{"Key": k, "Value": v} for k, v in spec.tags] or None
