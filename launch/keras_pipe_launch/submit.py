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
import json
import os
import re
import sys
import time

from keras_pipe_launch import channels as channel_args
from keras_pipe_launch import hyperparameters, secrets
from keras_pipe_launch.cli import UsageError, key_values
from keras_pipe_launch.job_request import JobSpec, RequestError, create_training_job_request, validate

_DURATION = re.compile(r"^(\d+)([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
POLL_S = float(os.environ.get("LAUNCH_POLL_SECONDS", "15"))


def duration(text: str) -> int:
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds, or a number with s, m, h or d (e.g. 6h)")
    return int(match.group(1)) * _UNITS[match.group(2)]


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("submit", help="start the training job on SageMaker",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_arguments(parser, what="job")
    parser.add_argument("--dry-run", action="store_true", help="print the CreateTrainingJob request; contact nothing")
    parser.add_argument("--wait", action="store_true", help="follow the job's status and logs until it ends")
    parser.set_defaults(run=run)


def add_job_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """The training job's options: `keras-pipe submit` and `keras-pipe tune` (whose training jobs they are)."""
    parser.add_argument("--image-uri", required=True, help="the training image in ECR")
    parser.add_argument("--role", required=True, help="the SageMaker execution role ARN")
    channel_args.add_arguments(parser)
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
    parser.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE", help="a hyperparameter")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="an environment variable")
    parser.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--network-isolation", action="store_true", help="no network access for the job")
    naming = "BASE-YYYYmmddHHMMSS" if what == "job" else "BASE-yymmdd-HHMMSS (at most 32 characters in all)"
    parser.add_argument("--base-job-name", default="keras-pipe", help=f"the {what} is named {naming}")
    parser.add_argument("--region", default=None, help="default: $AWS_DEFAULT_REGION")
    parser.add_argument("--no-validate", action="store_true",
                        help="do not check hyperparameters against this project's job (for other images)")


def spec_from(args: argparse.Namespace) -> JobSpec:
    return JobSpec(
        image_uri=args.image_uri, role=args.role, channels=tuple(channel_args.from_arguments(args)),
        output_path=args.output_path, instance_type=args.instance_type, instance_count=args.instance_count,
        input_mode=args.input_mode, volume_size_gb=args.volume_size, max_run_s=args.max_run, spot=args.spot,
        max_wait_s=args.max_wait, checkpoint_s3_uri=args.checkpoint_s3_uri,
        tensorboard_s3_uri=args.tensorboard_s3_uri, hyperparameters=tuple(hyperparameters.parse(args.hp).items()),
        environment=tuple(key_values(args.env, "--env").items()), tags=tuple(key_values(args.tag, "--tag").items()),
        network_isolation=args.network_isolation, base_job_name=args.base_job_name, allow_cpu=args.allow_cpu,
    )


def run(args: argparse.Namespace) -> int:
    from keras_pipe_train.errors import UserError

    try:
        spec = spec_from(args)
        warnings = validate(spec)
        if not args.no_validate:
            hyperparameters.check(dict(spec.hyperparameters))
        use_region(args)
    except (UsageError, RequestError, UserError) as err:
        print(f"keras-pipe submit: error: {err}", file=sys.stderr)
        return 2
    name = spec.name()
    request = create_training_job_request(spec, name)
    return dry_run_or_send("submit", "training job", args, warnings, request, request.get("Environment"),
                           lambda: _submit_with_sdk(spec, name), follow)


def _submit_with_sdk(spec: JobSpec, name: str) -> str:
    from keras_pipe_launch.sdk import submit

    return submit(spec, name)


def use_region(args: argparse.Namespace) -> None:
    """--region, else the environment's; none is an error unless nothing is sent (--dry-run)."""
    if args.region:
        os.environ["AWS_DEFAULT_REGION"] = args.region
    if not args.dry_run and not (os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION")):
        raise RequestError("no AWS region: pass --region or set AWS_DEFAULT_REGION")


def dry_run_or_send(command: str, what: str, args: argparse.Namespace, warnings: list[str], request: dict,
                    environment: dict | None, create, follow) -> int:
    """The end of `keras-pipe submit` and `keras-pipe tune`: prints the warnings, then --dry-run prints
    `request` (with the values of secret-looking `environment` names redacted); otherwise `create()`
    sends it through the installed SDK and returns the name, and --wait follows it with `follow`."""
    for warning in warnings:
        print(f"launch {command}: warning: {warning}", file=sys.stderr)
    if args.dry_run:
        if environment:
            environment.update(secrets.redacted(environment))
        print(json.dumps(request, indent=2))
        return 0
    from keras_pipe_launch.sdk import sdk_major_version

    try:
        print(f"launch {command}: submitting with SageMaker SDK v{sdk_major_version()}", file=sys.stderr)
        name = create()
        print(f"launch {command}: created {what} {name}", file=sys.stderr)
    except RequestError as err:
        print(f"launch {command}: error: {err}", file=sys.stderr)
        return 2
    print(name)
    return follow(name) if args.wait else 0


def follow(name: str) -> int:
    """Prints the training job's status changes and CloudWatch log lines until it ends; 0 if it completed."""
    import boto3

    describe = boto3.client("sagemaker").describe_training_job
    job = watch("keras-pipe submit", name, lambda: describe(TrainingJobName=name), "TrainingJob",
                lambda job: job.get("ResourceConfig", {}).get("InstanceCount", 1))
    status = job["TrainingJobStatus"]
    if status == "Completed":
        model = job.get("ModelArtifacts", {}).get("S3ModelArtifacts", "?")
        print(f"keras-pipe submit: model: {model}", file=sys.stderr)
        return 0
    print(f"keras-pipe submit: {name} {status.lower()}: {job.get('FailureReason', 'no reason given')}", file=sys.stderr)
    return 1


def watch(who: str, name: str, describe, kind: str, instance_count) -> dict:
    """Prints a `kind` job's (TrainingJob, ProcessingJob) status changes and log lines until it
    ends; returns its last description. `describe()` describes it, `instance_count(description)`
    says how many hosts write logs (their lines are then prefixed with the host)."""
    import boto3

    logs = JobLogs(boto3.client("logs"), name, f"/aws/sagemaker/{kind}s")
    status = None
    while True:
        job = describe()
        if job[f"{kind}Status"] != status:
            status = job[f"{kind}Status"]
            print(f"{who}: {name}: {status} ({job.get('SecondaryStatus', '')})".replace(" ()", ""), file=sys.stderr)
        several_hosts = instance_count(job) > 1
        for host, message in logs.new_lines():
            print(f"[{host}] {message}" if several_hosts else message)
        if status in ("Completed", "Failed", "Stopped"):
            return job
        time.sleep(POLL_S)


class JobLogs:
    """A job's CloudWatch log lines, every host's, in time order, each line once.

    Why not the SDKs' own followers: v3's TrainingJob.wait(logs=True) prints each line through a
    logger at INFO (unseen unless the application configures logging) as "stream:\nline" inside a
    rich live panel, and shows nothing until every host has a log stream; v2's logs_for_job exists
    only in v2. What they do well, reading every page, boto3's paginator does here (one page is at
    most 10,000 lines or 1 MB: a busy job writes more between two polls)."""

    def __init__(self, client, job_name: str, group: str = "/aws/sagemaker/TrainingJobs"):
        self.client, self.job_name, self.group = client, job_name, group
        self.since = 0  # ms: the newest timestamp printed
        self.printed_at_since: set[str] = set()  # event ids printed with that timestamp

    def new_lines(self) -> list[tuple[str, str]]:
        """(host, line) of each event not printed yet."""
        from botocore.exceptions import ClientError

        pages = self.client.get_paginator("filter_log_events").paginate(
            logGroupName=self.group, logStreamNamePrefix=f"{self.job_name}/", startTime=self.since)
        try:
            events = [e for page in pages for e in page["events"] if e["eventId"] not in self.printed_at_since]
        except ClientError as err:  # tried again at the next poll: following must outlive a throttled call
            if err.response["Error"]["Code"] != "ResourceNotFoundException":  # (no group before the first log)
                print(f"keras-pipe: warning: reading the job's logs: {err}", file=sys.stderr)
            return []
        events.sort(key=lambda e: (e["timestamp"], e["logStreamName"]))
        if events:
            newest = events[-1]["timestamp"]
            if newest != self.since:
                self.since, self.printed_at_since = newest, set()
            self.printed_at_since |= {e["eventId"] for e in events if e["timestamp"] == newest}
        # streams are named JOB/algo-N-EPOCH
        return [(e["logStreamName"].split("/", 1)[-1].rsplit("-", 1)[0], e["message"].rstrip()) for e in events]
