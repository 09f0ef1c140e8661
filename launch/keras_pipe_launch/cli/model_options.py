"""The SageMaker model's options, which `keras-pipe deploy` and `keras-pipe transform` share (both
start by creating the model: the image and a training job's model.tar.gz, or a model package of
the Model Registry), and how both end
(job_options.dry_run_or_send: --dry-run prints the requests, otherwise the installed SDK sends them)."""

from __future__ import annotations

import argparse
import sys

from keras_pipe_launch.cli.job_options import dry_run_or_send, use_region
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError, key_values
from keras_pipe_launch.sagemaker import api_limits
from keras_pipe_launch.sagemaker.hosting import ModelSpec
from keras_pipe_launch.sagemaker.request import RequestError


def add_model_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--image-uri", default=None,
                        help="this project's image in ECR (its `serve` answers); with --model-data")
    parser.add_argument("--role", required=True, help="the SageMaker execution role ARN (reads the model data)")
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--model-data", metavar="S3_URI",
                       help="a training job's model.tar.gz (`keras-pipe submit --wait` prints it)")
    model.add_argument("--model-package", metavar="ARN",
                       help="a model package in SageMaker's Model Registry (`keras-pipe register` prints it), "
                            "which names the image and the model data")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="an environment variable of the server, e.g. SAGEMAKER_MODEL_SERVER_WORKERS=2")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--network-isolation", action="store_true", help="no network access for the container")
    parser.add_argument("--base-name", default="keras-pipe",
                        help=f"the model and its {what} are named BASE-YYYYmmddHHMMSS")
    parser.add_argument("--name", default=None, help=f"the model's and its {what}'s name, instead")
    parser.add_argument("--region", default=None, help="default: $AWS_DEFAULT_REGION")
    parser.add_argument("--dry-run", action="store_true", help="print the requests; contact nothing")
    parser.add_argument("--wait", action="store_true", help=f"follow the {what} until it is ready or ends")


def model_spec_from(args: argparse.Namespace) -> ModelSpec:
    multi_model = getattr(args, "multi_model", False)
    environment = key_values(args.env, "--env")
    if multi_model:  # (SageMaker sets it on such an endpoint itself; said here too, so the request shows it)
        environment = {**environment, "SAGEMAKER_MULTI_MODEL": "true"}
    return ModelSpec(image_uri=args.image_uri, role=args.role, model_data=args.model_data,
                     model_package=args.model_package, multi_model=multi_model,
                     environment=tuple(environment.items()),
                     tags=tuple(key_values(args.tag, "--tag").items()), network_isolation=args.network_isolation,
                     base_name=args.base_name, name=args.name).named()


def checked_and_sent(command: str, what: str, args: argparse.Namespace, describe, create, follow) -> int:
    """The whole of `keras-pipe deploy` and `transform`: describe() -> (spec, warnings, requests) checked
    (the user's mistakes: exit 2 before any call), each request against botocore's model, then
    printed (--dry-run) or sent with create(spec, requests) and followed with follow(name) (--wait)."""
    try:
        spec, warnings, requests = describe()
        use_region(args)
        for operation, request in requests.items():
            api_limits.check(request, operation)
    except (UsageError, RequestError) as err:
        print(f"keras-pipe {command}: error: {shown(str(err))}", file=sys.stderr)
        return 2
    return dry_run_or_send(command, what, args, warnings, requests,
                           lambda: create(spec, requests) or spec.model.name, follow)
