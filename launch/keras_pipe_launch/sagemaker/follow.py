"""Following a SageMaker job until it ends: its status changes and every host's CloudWatch log
lines (training, processing and transform jobs; an endpoint until it is in service), or a tuning
job's counts and best training job."""

from __future__ import annotations

import json
import os
import sys
import time

from keras_pipe_launch.common.untrusted import log_line, shown

POLL_S = float(os.environ.get("LAUNCH_POLL_SECONDS", "15"))
TUNING_POLL_S = float(os.environ.get("LAUNCH_POLL_SECONDS", "30"))


def follow_training_job(name: str) -> int:
    """Prints the training job's status changes and CloudWatch log lines until it ends; 0 if it completed."""
    import boto3

    describe = boto3.client("sagemaker").describe_training_job
    job = watch("keras-pipe submit", name, lambda: describe(TrainingJobName=name), "TrainingJob",
                lambda job: job.get("ResourceConfig", {}).get("InstanceCount", 1))
    status = job["TrainingJobStatus"]
    if status == "Completed":
        model = job.get("ModelArtifacts", {}).get("S3ModelArtifacts", "?")
        print(f"keras-pipe submit: model: {shown(str(model))}", file=sys.stderr)
        return 0
    print(f"keras-pipe submit: {name} {status.lower()}: {shown(str(job.get('FailureReason', 'no reason given')))}",
          file=sys.stderr)
    return 1


def follow_transform_job(name: str) -> int:
    """Prints the transform job's status changes and log lines until it ends; 0 if it completed."""
    import boto3

    describe = boto3.client("sagemaker").describe_transform_job
    job = watch("keras-pipe transform", name, lambda: describe(TransformJobName=name), "TransformJob",
                lambda job: job.get("TransformResources", {}).get("InstanceCount", 1))
    status = job["TransformJobStatus"]
    if status == "Completed":
        output = job.get("TransformOutput", {}).get("S3OutputPath", "?")
        print(f"keras-pipe transform: answers under {shown(str(output))}", file=sys.stderr)
        return 0
    print(f"keras-pipe transform: {name} {status.lower()}: {shown(str(job.get('FailureReason', 'no reason given')))}",
          file=sys.stderr)
    return 1


def follow_endpoint(name: str) -> int:
    """Prints the endpoint's status changes and its server's log lines until it is in service or
    failed; 0 if in service."""
    import boto3

    describe = boto3.client("sagemaker").describe_endpoint
    # an endpoint logs to a group of its own, one stream per instance: VARIANT/INSTANCE-ID
    logs = JobLogs(boto3.client("logs"), "AllTraffic", f"/aws/sagemaker/Endpoints/{name}")
    endpoint = watch("keras-pipe deploy", name, lambda: describe(EndpointName=name), "Endpoint", lambda _: 1, logs)
    status = endpoint["EndpointStatus"]
    if status == "InService":
        print(f"keras-pipe deploy: {name} is in service: aws sagemaker-runtime invoke-endpoint --endpoint-name "
              f"{name} --content-type application/x-image --body fileb://photo.jpg answer.json", file=sys.stderr)
        return 0
    print(f"keras-pipe deploy: {name} {status.lower()}: {shown(str(endpoint.get('FailureReason', 'no reason given')))}",
          file=sys.stderr)
    return 1


# where each kind's following ends: a job's end, an endpoint's creation's end
_ENDED = ("Completed", "Failed", "Stopped", "InService", "OutOfService")


def watch(who: str, name: str, describe, kind: str, instance_count, logs: JobLogs | None = None) -> dict:
    """Prints a `kind` job's (TrainingJob, ProcessingJob, TransformJob; or an Endpoint) status
    changes and log lines until it ends; returns its last description. `describe()` describes it,
    `instance_count(description)` says how many hosts write logs (their lines are then prefixed with
    the host); `logs`: where they are, if not in /aws/sagemaker/{kind}s, streams JOB/HOST-EPOCH."""
    import boto3

    logs = logs or JobLogs(boto3.client("logs"), name, f"/aws/sagemaker/{kind}s")
    status = None
    while True:
        job = describe()
        if job[f"{kind}Status"] != status:
            status = job[f"{kind}Status"]
            print(f"{who}: {name}: {status} ({job.get('SecondaryStatus', '')})".replace(" ()", ""), file=sys.stderr)
        several_hosts = instance_count(job) > 1
        for host, message in logs.new_lines():
            print(f"[{host}] {message}" if several_hosts else message)
        if status in _ENDED:
            return job
        time.sleep(POLL_S)


class JobLogs:
    """A job's CloudWatch log lines, every host's, in time order, each line once.

    Why not the SDKs' own followers: v3's TrainingJob.wait(logs=True) prints each line through a
    logger at INFO (unseen unless the application configures logging) as "stream:\nline" inside a
    rich live panel, and shows nothing until every host has a log stream; v2's logs_for_job exists
    only in v2. What they do well, reading every page, boto3's paginator does here (one page is at
    most 10,000 lines or 1 MB: a busy job writes more between two polls)."""

    def __init__(self, client, stream_prefix: str, group: str = "/aws/sagemaker/TrainingJobs"):
        self.client, self.stream_prefix, self.group = client, stream_prefix, group
        self.since = 0  # ms: the newest timestamp printed
        self.printed_at_since: set[str] = set()  # event ids printed with that timestamp

    def new_lines(self) -> list[tuple[str, str]]:
        """(host, line) of each event not printed yet, escaped: the job's image (anyone's code)
        wrote them, and may have written a terminal's escape codes."""
        from botocore.exceptions import ClientError

        pages = self.client.get_paginator("filter_log_events").paginate(
            logGroupName=self.group, logStreamNamePrefix=f"{self.stream_prefix}/", startTime=self.since)
        try:
            events = [e for page in pages for e in page["events"] if e["eventId"] not in self.printed_at_since]
        except ClientError as err:  # tried again at the next poll: following must outlive a throttled call
            if err.response["Error"]["Code"] != "ResourceNotFoundException":  # (no group before the first log)
                print(f"keras-pipe: warning: reading the job's logs: {shown(str(err))}", file=sys.stderr)
            return []
        events.sort(key=lambda e: (e["timestamp"], e["logStreamName"]))
        if events:
            newest = events[-1]["timestamp"]
            if newest != self.since:
                self.since, self.printed_at_since = newest, set()
            self.printed_at_since |= {e["eventId"] for e in events if e["timestamp"] == newest}
        # streams are named JOB/algo-N-EPOCH
        return [(shown(e["logStreamName"].split("/", 1)[-1].rsplit("-", 1)[0]), log_line(e["message"])) for e in events]


def follow_tuning_job(name: str) -> int:
    """Prints the tuning job's progress (its training jobs by status) until it ends, then the best
    training job; 0 if the tuning job completed."""
    import boto3

    sagemaker = boto3.client("sagemaker")
    said = None  # the last progress line printed
    while True:
        job = sagemaker.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
        status = job["HyperParameterTuningJobStatus"]
        counters = job.get("TrainingJobStatusCounters", {})
        best = job.get("BestTrainingJob", {})
        line = (f"{status}: training jobs " + ", ".join(f"{k.lower()} {v}" for k, v in counters.items() if v)
                + (f"; best so far {best['TrainingJobName']} "
                   f"{_metric(best)}" if best else ""))
        if line != said:
            print(f"keras-pipe tune: {name}: {line}", file=sys.stderr)
            said = line
        if status in ("Completed", "Failed", "Stopped"):
            break
        time.sleep(TUNING_POLL_S)
    if best:
        print(f"keras-pipe tune: best training job {best['TrainingJobName']}: {_metric(best)}; hyperparameters "
              f"{json.dumps(best.get('TunedHyperParameters', {}))}", file=sys.stderr)
        print(best["TrainingJobName"])
    if status == "Completed":
        return 0
    print(f"keras-pipe tune: {name} {status.lower()}: {shown(str(job.get('FailureReason', 'no reason given')))}",
          file=sys.stderr)
    return 1


def _metric(best: dict) -> str:
    final = best.get("FinalHyperParameterTuningJobObjectiveMetric") or {}
    return f"{final.get('MetricName', '?')}={final.get('Value', '?')}"
