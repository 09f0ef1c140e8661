"""`keras-pipe deploy`: a training job's model on a SageMaker endpoint, answering images.

    keras-pipe deploy --image-uri 123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train \\
        --role arn:aws:iam::123456789012:role/SageMakerRole \\
        --model-data s3://bucket/jobs/keras-pipe-20261124101500/output/model.tar.gz \\
        --instance-type ml.m5.xlarge --wait

    aws sagemaker-runtime invoke-endpoint --endpoint-name NAME --content-type application/x-image \\
        --body fileb://photo.jpg answer.json

Creates the model, an endpoint configuration and the endpoint, all named BASE-YYYYmmddHHMMSS (or
--name), on instances (--instance-type, --instance-count) or serverless (--serverless-memory MB:
billed per request, no GPU, requests up to 4 MB). The image's `serve` answers each image with every
class's probability, the top classes and the predicted one (docs/image.md, "Serving the model").
--dry-run prints the CreateModel, CreateEndpointConfig and CreateEndpoint requests, checked against
botocore's model of the API, and contacts nothing; the installed SageMaker SDK (v3 or v2) sends them.
An endpoint is billed until deleted: `aws sagemaker delete-endpoint --endpoint-name NAME`.

--multi-model hosts many models on one endpoint (Mode MultiModel): --model-data is then an S3
prefix, each model.tar.gz under it loaded on the first request that names it, and unloaded when
memory runs short (docs/image.md, "Serving the model"):

    aws sagemaker-runtime invoke-endpoint --endpoint-name NAME --target-model customer-a/model.tar.gz \
        --content-type application/x-image --body fileb://photo.jpg answer.json
"""

from __future__ import annotations

import argparse

from keras_pipe_launch.cli.model_options import add_model_arguments, checked_and_sent, model_spec_from
from keras_pipe_launch.sagemaker import hosting


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("deploy", help="host a trained model on a SageMaker endpoint",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, what="endpoint")
    parser.add_argument("--instance-type", default="ml.m5.xlarge", help="default: ml.m5.xlarge (4 vCPUs)")
    parser.add_argument("--instance-count", type=int, default=1)
    parser.add_argument("--serverless-memory", type=int, default=None, metavar="MB",
                        help="a serverless endpoint with this much memory: "
                             f"{', '.join(map(str, hosting.SERVERLESS_MEMORY_MB))}")
    parser.add_argument("--max-concurrency", type=int, default=5,
                        help="serverless: requests at once (1 to 200, default 5)")
    parser.add_argument("--multi-model", action="store_true",
                        help="a multi-model endpoint: --model-data is an S3 prefix of many model.tar.gz, each "
                             "loaded when a request first names it (InvokeEndpoint's TargetModel, relative to it)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    def describe():
        spec = hosting.EndpointSpec(model=model_spec_from(args), instance_type=args.instance_type,
                                    instance_count=args.instance_count, serverless_memory_mb=args.serverless_memory,
                                    serverless_max_concurrency=args.max_concurrency)
        return spec, hosting.validate_endpoint(spec), hosting.endpoint_requests(spec)

    return checked_and_sent("deploy", "endpoint", args, describe, _deploy, _follow)


def _deploy(spec, requests) -> None:
    from keras_pipe_launch.sagemaker.sdk_hosting import deploy

    deploy(spec)


def _follow(name: str) -> int:
    from keras_pipe_launch.sagemaker.follow import follow_endpoint

    return follow_endpoint(name)
