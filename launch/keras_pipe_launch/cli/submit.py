"""`keras-pipe submit`: start the training job on SageMaker, in Pipe mode by default.

    keras-pipe submit --image-uri 123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train \\
        --role arn:aws:iam::123456789012:role/SageMakerRole \\
        --train s3://bucket/data/train/ --validation s3://bucket/data/validation/ \\
        --output-path s3://bucket/jobs/ --instance-type ml.g5.xlarge \\
        --spot --checkpoint-s3-uri s3://bucket/checkpoints/run1/ \\
        --hp num_classes=10 --hp epochs=5 --wait

Everything is checked before any AWS call: S3 URIs, the instance type (a GPU type unless
--allow-cpu), spot settings, hyperparameters (against the job's own schema). --dry-run prints the
CreateTrainingJob request and contacts nothing. The job is submitted with the SageMaker Python SDK
that is installed (v3 ModelTrainer, or v2 Estimator); both send the request --dry-run prints.
"""

from __future__ import annotations

import argparse
import sys

from keras_pipe_launch.cli.job_options import add_job_arguments, dry_run_or_send, spec_from, use_region
from keras_pipe_launch.common import hyperparameters
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError
from keras_pipe_launch.sagemaker import api_limits
from keras_pipe_launch.sagemaker.follow import follow_training_job
from keras_pipe_launch.sagemaker.request import JobSpec, RequestError, create_training_job_request, validate


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("submit", help="start the training job on SageMaker",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_arguments(parser, what="job")
    parser.add_argument("--dry-run", action="store_true", help="print the CreateTrainingJob request; contact nothing")
    parser.add_argument("--wait", action="store_true", help="follow the job's status and logs until it ends")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from keras_pipe_train.settings.errors import UserError

    try:
        spec = spec_from(args)
        warnings = validate(spec)
        if not args.no_validate:
            hyperparameters.check(dict(spec.hyperparameters))
        use_region(args)
    except (UsageError, RequestError, UserError) as err:
        print(f"keras-pipe submit: error: {shown(str(err))}", file=sys.stderr)
        return 2
    name = spec.name()
    request = create_training_job_request(spec, name)
    try:
        api_limits.check(request, "CreateTrainingJob")
    except RequestError as err:
        print(f"keras-pipe submit: error: {shown(str(err))}", file=sys.stderr)
        return 2
    return dry_run_or_send("submit", "training job", args, warnings, request, lambda: _submit_with_sdk(spec, name),
                           follow_training_job)


def _submit_with_sdk(spec: JobSpec, name: str) -> str:
    from keras_pipe_launch.sagemaker.sdk import submit

    return submit(spec, name)
