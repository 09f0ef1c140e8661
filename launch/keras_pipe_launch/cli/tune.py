"""`keras-pipe tune`: a hyperparameter tuning job over this image's training job.

    keras-pipe tune --image-uri 123456789012.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train \\
        --role arn:aws:iam::123456789012:role/SageMakerRole \\
        --train s3://bucket/data/train/ --validation s3://bucket/data/validation/ \\
        --output-path s3://bucket/tuning/ --instance-type ml.g5.xlarge --spot \\
        --hp num_classes=10 --hp epochs=5 \\
        --range learning_rate=1e-4:1e-2:log --range batch_size=32,64,128 --range dropout=0:0.5 \\
        --objective validation:accuracy --max-jobs 12 --max-parallel-jobs 3 --wait

Every training job of the tuning job is the one `keras-pipe submit` would start (same options), with the
--range hyperparameters chosen by SageMaker. A range is MIN:MAX[:SCALE] for an integer or number
hyperparameter (SCALE: auto, linear, log, reverse-log) or a comma-separated list of the values to
try, for any hyperparameter. Ranges are checked against the job's own schema: every bound and value
must be one the job accepts. --dry-run prints the CreateHyperParameterTuningJob request, checked
against botocore's model of the API, and contacts nothing; the installed SageMaker SDK (v3 or v2)
sends that same request.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from keras_pipe_launch.cli.job_options import add_job_arguments, dry_run_or_send, spec_from, use_region
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError
from keras_pipe_launch.sagemaker import tuning
from keras_pipe_launch.sagemaker.follow import follow_tuning_job
from keras_pipe_launch.sagemaker.request import RequestError
from keras_pipe_train.training.metrics import METRIC_DEFINITIONS


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("tune", help="start a hyperparameter tuning job on SageMaker",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_arguments(parser, what="tuning job")
    parser.add_argument("--range", action="append", default=[], metavar="NAME=MIN:MAX[:SCALE] or NAME=A,B,...",
                        help="a hyperparameter to tune (repeat for each)")
    parser.add_argument("--objective", default="validation:accuracy", choices=[d["Name"] for d in METRIC_DEFINITIONS],
                        help="the metric to optimise (default: validation:accuracy)")
    parser.add_argument("--objective-type", choices=("Maximize", "Minimize"), default=None,
                        help="default: Minimize for a loss, Maximize for an accuracy")
    parser.add_argument("--max-jobs", type=int, default=10, help="training jobs in all (default 10)")
    parser.add_argument("--max-parallel-jobs", type=int, default=2, help="training jobs at once (default 2)")
    parser.add_argument("--strategy", choices=tuning.STRATEGIES, default="Bayesian")
    parser.add_argument("--early-stopping", choices=("Off", "Auto"), default="Off",
                        help="Auto: SageMaker stops training jobs that are unlikely to beat the best so far")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the CreateHyperParameterTuningJob request; contact nothing")
    parser.add_argument("--wait", action="store_true", help="follow the tuning job until it ends; print the best job")
    parser.set_defaults(run=run)


def tuning_spec_from(args: argparse.Namespace) -> tuning.TuningSpec:
    job = spec_from(args)
    static = dict(job.hyperparameters)
    if job.checkpoint_s3_uri and "other_checkpoints" not in static:
        # The training jobs share the checkpoint prefix, each in its own subfolder
        # (train/keras_pipe_train/training/checkpoints.py): a job must resume its own checkpoints (spot)
        # and leave the other jobs' alone.
        static["other_checkpoints"] = "ignore"
    objective_type = args.objective_type or ("Minimize" if args.objective.endswith("loss") else "Maximize")
    return tuning.TuningSpec(
        job=dataclasses.replace(job, hyperparameters=tuple(static.items())),
        ranges=tuple(tuning.parse_range(text) for text in args.range), objective=args.objective,
        objective_type=objective_type, max_jobs=args.max_jobs, max_parallel_jobs=args.max_parallel_jobs,
        strategy=args.strategy, early_stopping=args.early_stopping)


def run(args: argparse.Namespace) -> int:
    from keras_pipe_train.settings.errors import UserError

    try:
        spec = tuning_spec_from(args)
        warnings = tuning.validate_tuning(spec, check_hyperparameters=not args.no_validate)
        use_region(args)
        name = spec.name()
        if args.mlflow_tracking_uri and not args.mlflow_experiment:  # (the tuning job's trainings, in one experiment)
            environment = {**dict(spec.job.environment), "MLFLOW_EXPERIMENT_NAME": name}
            spec = dataclasses.replace(spec, job=dataclasses.replace(spec.job, environment=tuple(environment.items())))
        request = tuning.create_tuning_job_request(spec, name)
        tuning.check_request(request)
    except (UsageError, RequestError, UserError) as err:
        print(f"keras-pipe tune: error: {shown(str(err))}", file=sys.stderr)
        return 2
    return dry_run_or_send("tune", "tuning job", args, warnings, request, lambda: _tune_with_sdk(spec, name),
                           follow_tuning_job)


def _tune_with_sdk(spec: tuning.TuningSpec, name: str) -> str:
    from keras_pipe_launch.sagemaker.sdk import tune

    tune(spec, name)
    return name
