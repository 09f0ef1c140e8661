"""The training job's options, which `keras-pipe submit` and `keras-pipe tune` share (a tuning job's
training jobs are the one submit would start), and how both end: --dry-run prints the request,
otherwise the installed SDK sends it and --wait follows the job."""

from __future__ import annotations

import argparse
import json
import os
import sys

from keras_pipe_launch.cli.arguments import add_channel_arguments, channels_from, duration
from keras_pipe_launch.common import hyperparameters, secrets
from keras_pipe_launch.common.channels import channel_hyperparameters
from keras_pipe_launch.common.processes import stopped_by_any_signal
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError, key_values
from keras_pipe_launch.sagemaker.request import JobSpec, RequestError


def add_job_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """The training job's options: `keras-pipe submit` and `keras-pipe tune` (whose training jobs they are)."""
    parser.add_argument("--image-uri", required=True, help="the training image in ECR")
    parser.add_argument("--role", required=True, help="the SageMaker execution role ARN")
    add_channel_arguments(parser)
    parser.add_argument("--output-path", required=True, help="s3:// prefix for model.tar.gz and output.tar.gz")
    parser.add_argument("--instance-type", default="ml.g5.xlarge")
    parser.add_argument("--instance-count", type=int, default=1)
    parser.add_argument("--allow-cpu", action="store_true", help="accept an instance type without GPU")
    parser.add_argument("--volume-size", type=int, default=30, metavar="GB")
    parser.add_argument("--max-run", type=duration, default=24 * 3600, metavar="DURATION", help="e.g. 86400, 6h, 2d")
    parser.add_argument("--spot", action="store_true", help="managed spot training (needs --checkpoint-s3-uri)")
    parser.add_argument("--max-wait", type=duration, default=None, metavar="DURATION",
                        help="spot: longest time to wait for capacity and run (default: --max-run)")
    parser.add_argument("--checkpoint-s3-uri", default=None, help="synced with /opt/ml/checkpoints")
    parser.add_argument("--tensorboard-s3-uri", default=None, help="synced with /opt/ml/output/tensorboard")
    add_hyperparameter_argument(parser)
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="an environment variable")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE")
    add_tracking_arguments(parser, "the tuning job's name" if what == "tuning job" else "MLflow's default")
    parser.add_argument("--network-isolation", action="store_true", help="no network access for the job")
    naming = "BASE-YYYYmmddHHMMSS" if what == "job" else "BASE-yymmdd-HHMMSS (at most 32 characters in all)"
    parser.add_argument("--base-job-name", default="keras-pipe", help=f"the {what} is named {naming}")
    parser.add_argument("--region", default=None, help="default: $AWS_DEFAULT_REGION")
    parser.add_argument("--no-validate", action="store_true",
                        help="do not check hyperparameters against this project's job (for other images)")


def add_hyperparameter_argument(parser: argparse.ArgumentParser) -> None:
    """--hp, with the job's hyperparameters listed at the end of the help (`submit`, `tune`, `local`)."""
    parser.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE",
                        help="a hyperparameter of the job: the job's are listed below")
    parser.epilog = hyperparameter_listing()


def hyperparameter_listing() -> str:
    """Each of the job's hyperparameters, with its default (NAME=DEFAULT) and the values it takes, as
    their definitions give them (train/keras_pipe_train/settings/hyperparameters.py)."""
    from keras_pipe_train.settings.config import HYPERPARAMETERS

    given = {name: name if h.default is None else f"{name}={h.default}" for name, h in HYPERPARAMETERS.items()}
    width = max(map(len, given.values()))
    lines = [f"  {given[name]:<{width}}  {h.accepts}".rstrip() for name, h in HYPERPARAMETERS.items()]
    return ("the job's hyperparameters (--hp NAME=VALUE), with their defaults and the values each takes\n"
            "(docs/job.md, Hyperparameters, says what each does):\n" + "\n".join(lines))


def add_tracking_arguments(parser: argparse.ArgumentParser, default_experiment: str) -> None:
    """MLflow tracking from the job (train/keras_pipe_train/report/tracking.py): `submit`, `tune`, `local`."""
    parser.add_argument("--mlflow-tracking-uri", default=None, metavar="URI",
                        help="the job logs its run to this MLflow tracking server: http(s)://..., or a SageMaker "
                             "managed MLflow tracking server's ARN (sets MLFLOW_TRACKING_URI)")
    parser.add_argument("--mlflow-experiment", default=None, metavar="NAME",
                        help=f"the run's MLflow experiment (sets MLFLOW_EXPERIMENT_NAME; default: "
                             f"{default_experiment})")


def tracking_environment(args: argparse.Namespace, output: str, experiment: str | None = None) -> dict[str, str]:
    """The job's environment for --mlflow-tracking-uri and --mlflow-experiment (`experiment`: the
    default one), and where its outputs go (tagged on the run); none without a tracking URI."""
    if not args.mlflow_tracking_uri:
        if args.mlflow_experiment:
            raise UsageError("--mlflow-experiment names the experiment of --mlflow-tracking-uri's server: give both")
        return {}
    if secrets.looks_secret("MLFLOW_TRACKING_URI", args.mlflow_tracking_uri):
        # (the URI is kept for --resume and shown by DescribeTrainingJob; MLflow reads these instead,
        # and the launcher keeps secret-looking --env values out of what it prints and keeps)
        raise UsageError("--mlflow-tracking-uri holds a user, a password or a token: give them as --env "
                         "MLFLOW_TRACKING_USERNAME=... --env MLFLOW_TRACKING_PASSWORD=... (or "
                         "MLFLOW_TRACKING_TOKEN=...: MLflow reads these)")
    named = args.mlflow_experiment or experiment
    return {"MLFLOW_TRACKING_URI": args.mlflow_tracking_uri, **({"MLFLOW_EXPERIMENT_NAME": named} if named else {}),
            "KERAS_PIPE_OUTPUT": output}


def spec_from(args: argparse.Namespace) -> JobSpec:
    channels = channels_from(args)
    values = channel_hyperparameters(channels, hyperparameters.parse(args.hp))
    return JobSpec(
        image_uri=args.image_uri, role=args.role, channels=tuple(channels),
        output_path=args.output_path, instance_type=args.instance_type, instance_count=args.instance_count,
        input_mode=args.input_mode, volume_size_gb=args.volume_size, max_run_s=args.max_run, spot=args.spot,
        max_wait_s=args.max_wait, checkpoint_s3_uri=args.checkpoint_s3_uri,
        tensorboard_s3_uri=args.tensorboard_s3_uri, hyperparameters=tuple(values.items()),
        environment=tuple({**key_values(args.env, "--env"), **tracking_environment(args, args.output_path)}.items()),
        tags=tuple(key_values(args.tag, "--tag").items()),
        network_isolation=args.network_isolation, base_job_name=args.base_job_name, allow_cpu=args.allow_cpu,
    )


def use_region(args: argparse.Namespace, reads: bool = False) -> None:
    """--region, else the environment's; none is an error unless nothing is sent (--dry-run) and
    nothing `reads` from AWS."""
    if args.region:
        os.environ["AWS_DEFAULT_REGION"] = args.region
    if (reads or not args.dry_run) and not (os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")):
        raise RequestError("no AWS region: pass --region or set AWS_DEFAULT_REGION")


def dry_run_or_send(command: str, what: str, args: argparse.Namespace, warnings: list[str], request: dict,
                    create, follow) -> int:
    """The end of `keras-pipe submit`, `tune`, `deploy` and `transform`: prints the warnings, then --dry-run prints
    `request` (with the secret-looking values of its environment and hyperparameters redacted); otherwise `create()`
    sends it through the installed SDK and returns the name, and --wait follows it with `follow`."""
    for warning in warnings:
        print(f"keras-pipe {command}: warning: {shown(warning)}", file=sys.stderr)
    if args.dry_run:
        print(json.dumps(secrets.redacted_request(request), indent=2))
        return 0
    from botocore.exceptions import BotoCoreError, ClientError

    from keras_pipe_launch.sagemaker.sdk import sdk_major_version

    try:
        print(f"keras-pipe {command}: submitting with SageMaker SDK v{sdk_major_version()}", file=sys.stderr)
        name = create()
        print(f"keras-pipe {command}: created {what} {name}", file=sys.stderr)
    except RequestError as err:
        print(f"keras-pipe {command}: error: {shown(str(err))}", file=sys.stderr)
        return 2
    except (BotoCoreError, ClientError) as err:  # (no network, no permission, a throttled API ...)
        print(f"keras-pipe {command}: a call to AWS failed: {shown(str(err))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nkeras-pipe {command}: interrupted before the {what} was created, or while it was", file=sys.stderr)
        return 130
    print(name)
    if not args.wait:
        return 0
    stop = {"training job": "stop-training-job --training-job-name",
            "tuning job": "stop-hyper-parameter-tuning-job --hyper-parameter-tuning-job-name",
            "endpoint": "delete-endpoint --endpoint-name",
            "transform job": "stop-transform-job --transform-job-name"}[what]
    try:
        with stopped_by_any_signal():
            return follow(name)
    except KeyboardInterrupt:
        print(f"\nkeras-pipe {command}: stopped following; the {what} {name} goes on (stop it with `aws sagemaker "
              f"{stop} {name}`)", file=sys.stderr)
        return 130
    except (BotoCoreError, ClientError) as err:
        print(f"keras-pipe {command}: following {name} failed (the {what} goes on): {shown(str(err))}", file=sys.stderr)
        return 1
