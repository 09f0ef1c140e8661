"""`keras-pipe transform`: a training job's model run by SageMaker batch transform over images in S3.

    keras-pipe transform --image-uri 123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train \\
        --role arn:aws:iam::123456789012:role/SageMakerRole \\
        --model-data s3://bucket/jobs/keras-pipe-20261124101500/output/model.tar.gz \\
        --input s3://bucket/photos/ --output-path s3://bucket/predictions/ --wait

Every object under --input (or every object an S3 manifest lists: --manifest) is one image and one
request; SageMaker writes the answer to each, one JSON line (docs/image.md, "Serving the model"),
to --output-path with the object's key below --input and `.out` appended:
s3://bucket/photos/cats/1.jpg gives s3://bucket/predictions/cats/1.jpg.out. An object that is not an
image fails the job, naming it. Creates the model and the transform job, both named
BASE-YYYYmmddHHMMSS (or --name). --dry-run prints the CreateModel and CreateTransformJob requests,
checked against botocore's model of the API, and contacts nothing; the installed SageMaker SDK (v3
or v2) sends them.
"""

from __future__ import annotations

import argparse

from keras_pipe_launch.cli.model_options import add_model_arguments, checked_and_sent, model_spec_from
from keras_pipe_launch.sagemaker import hosting


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("transform", help="run a trained model over images in S3 (batch transform)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser, what="transform job")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", metavar="S3_PREFIX", help="the images: every object under this prefix")
    source.add_argument("--manifest", metavar="S3_URI",
                        help="the images: those a manifest lists ([{\"prefix\": \"s3://...\"}, \"key\", ...])")
    parser.add_argument("--output-path", required=True, metavar="S3_PREFIX", help="where the answers go")
    parser.add_argument("--content-type", default="application/x-image", choices=hosting.IMAGE_CONTENT_TYPES)
    parser.add_argument("--accept", default="application/jsonlines", choices=hosting.ACCEPTS,
                        help="each answer as a JSON line (default) or a JSON document, as the model's dialect "
                             "answers; application/vnd.keras-pipe+jsonlines (or +json): this project's full "
                             "answer (labels, top k) whatever the dialect")
    parser.add_argument("--instance-type", default="ml.m5.xlarge", help="default: ml.m5.xlarge (4 vCPUs)")
    parser.add_argument("--instance-count", type=int, default=1)
    parser.add_argument("--max-payload", type=int, default=hosting.DEFAULT_PAYLOAD_MB, metavar="MB",
                        help=f"the largest image, in MB (default {hosting.DEFAULT_PAYLOAD_MB})")
    parser.add_argument("--max-concurrent-transforms", type=int, default=None, metavar="N",
                        help="requests at once per instance (default: its vCPUs, within SageMaker's 100 MB "
                             "for N x --max-payload)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    def describe():
        by_prefix = args.input is not None
        spec = hosting.TransformSpec(
            model=model_spec_from(args), source=args.input if by_prefix else args.manifest,
            output_path=args.output_path, data_type="S3Prefix" if by_prefix else "ManifestFile",
            content_type=args.content_type,
            accept=args.accept, instance_type=args.instance_type, instance_count=args.instance_count,
            max_payload_mb=args.max_payload, max_concurrent_transforms=args.max_concurrent_transforms)
        return spec, hosting.validate_transform(spec), hosting.transform_requests(spec)

    return checked_and_sent("transform", "transform job", args, describe, _transform, _follow)


def _transform(spec, requests) -> None:
    from keras_pipe_launch.sagemaker.sdk_hosting import transform

    transform(spec)


def _follow(name: str) -> int:
    from keras_pipe_launch.sagemaker.follow import follow_transform_job

    return follow_transform_job(name)
