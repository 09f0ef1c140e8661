"""`keras-pipe prepare s3://SOURCE/ s3://OUT/ --instance-count N`: prepare at scale, as a SageMaker
Processing job over N instances of this project's image, or (--local) as N processes here, each
with the /opt/ml a Processing instance gets.

1. Here, once: the source is listed and split (prepare.plan), the plan written to OUT/plan/.
2. Each instance: its ShardedByS3Key share of the source objects, checked and written to shards
   named after it (prepare.instance); SageMaker uploads its output to OUT when the job ends.
3. Here, at the end: the instances' reports merged and checked against the plan (every image
   handled once), then OUT/classes.json and OUT/rejected.txt written, as the one-machine prepare
   writes them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from keras_pipe_launch.common import container_config
from keras_pipe_launch.common.engine import Engine, host_environment
from keras_pipe_launch.common.objects import S3Store, SourceError, list_objects, parse_s3_uri, stage, staging_plan
from keras_pipe_launch.common.processes import Console, Supervisor
from keras_pipe_launch.prepare.dataset import PrepareError, check_classes, class_names_option
from keras_pipe_launch.prepare.plan import PLAN_FILE, REPORTS, Plan, PlanError, Report, make_plan, merge
from keras_pipe_launch.prepare.sources import Reader, shown
from keras_pipe_launch.sagemaker.request import RequestError

PROCESSING = "/opt/ml/processing"
# ContainerEntrypoint replaces the image's ENTRYPOINT (tini) too: tini is given again, so that a
# stopped job's SIGTERM reaches Python (the kernel gives PID 1 no default SIGTERM action).
ENTRYPOINT = ["/usr/bin/tini", "--", "python3", "-m", "keras_pipe_launch.prepare.instance"]


def output_prefix(out: str) -> tuple[str, str]:
    """(bucket, prefix ending in "/") of the s3:// output, which must hold nothing yet."""
    bucket, prefix = parse_s3_uri(out)
    return bucket, (prefix if not prefix or prefix.endswith("/") else prefix + "/")


def check_output_is_new(client, out: str) -> None:
    bucket, prefix = output_prefix(out)
    if client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount"):
        raise PrepareError(f"{out} already holds objects: give a new output prefix (shards of two runs would mix)")


def instance_arguments(shard_mb: float, max_side: int | None, quality: int, max_pixels: int,
                       workers: int | None = None) -> list[str]:
    arguments = ["--shard-mb", f"{shard_mb:g}", "--jpeg-quality", str(quality), "--max-image-pixels", str(max_pixels)]
    arguments += ["--max-side", str(max_side)] if max_side else []
    return arguments + (["--workers", str(workers)] if workers else [])


def processing_job_request(name: str, source: str, out: str, *, image_uri: str, role: str, instance_count: int,
                           instance_type: str, volume_size_gb: int, max_run_s: int, arguments: list[str]) -> dict:
    """The CreateProcessingJob request: the source sharded by S3 key, the plan to every instance,
    each instance's processing/output/ uploaded under OUT when the job ends."""
    bucket, prefix = output_prefix(out)

    def s3_input(input_name: str, uri: str, distribution: str) -> dict:
        return {"InputName": input_name, "AppManaged": False,
                "S3Input": {"S3Uri": uri, "LocalPath": f"{PROCESSING}/input/{input_name}", "S3DataType": "S3Prefix",
                            "S3InputMode": "File", "S3DataDistributionType": distribution,
                            "S3CompressionType": "None"}}

    return {
        "ProcessingJobName": name,
        "ProcessingInputs": [s3_input("source", source, "ShardedByS3Key"),
                             s3_input("plan", f"s3://{bucket}/{prefix}plan/", "FullyReplicated")],
        "ProcessingOutputConfig": {"Outputs": [{
            "OutputName": "prepared", "AppManaged": False,
            "S3Output": {"S3Uri": f"s3://{bucket}/{prefix}", "LocalPath": f"{PROCESSING}/output",
                         "S3UploadMode": "EndOfJob"}}]},
        "ProcessingResources": {"ClusterConfig": {"InstanceCount": instance_count, "InstanceType": instance_type,
                                                  "VolumeSizeInGB": volume_size_gb}},
        "StoppingCondition": {"MaxRuntimeInSeconds": max_run_s},
        "AppSpecification": {"ImageUri": image_uri, "ContainerEntrypoint": ENTRYPOINT,
                             "ContainerArguments": arguments},
        "RoleArn": role,
    }


def write_plan(plan: Plan, client, out: str) -> None:
    bucket, prefix = output_prefix(out)
    with tempfile.TemporaryDirectory() as folder:
        plan.write(Path(folder) / PLAN_FILE)
        client.upload_file(str(Path(folder) / PLAN_FILE), bucket, f"{prefix}plan/{PLAN_FILE}")


def planned(source: str, out: str, validation_fraction: float, seed: int) -> tuple[Plan, list]:
    """The plan, and the source's objects (checked to be files an instance can be given, before
    anything is written), after checking OUT is new."""
    reader = Reader()
    check_output_is_new(reader.s3, out)
    plan = make_plan(source, reader, validation_fraction, seed)
    objects = staging_plan(list_objects(plan.source))
    return plan, objects


# --- here, as N processes -------------------------------------------------------------------------

def run_locally(plan: Plan, objects: list, out: str, job_dir: Path, instance_count: int, arguments: list[str],
                out_stream=None, image: str | None = None) -> int:
    """Each instance as a process of its own (or, with `image`, a container of it running the
    Processing job's entry point), with its /opt/ml under job_dir/algo-N and its share
    (ShardedByS3Key: the i-th of every N objects in key order, as the local training runner
    shares them); then each one's output uploaded under OUT, as SageMaker does at the end."""
    hosts = [f"algo-{i}" for i in range(1, instance_count + 1)]
    console = Console(out_stream or sys.stdout)
    supervisor = Supervisor(console)
    for index, host in enumerate(hosts):
        base = job_dir / host
        container_config.write(base / "config", resources=container_config.resource_config(host, hosts))
        stage(objects[index::instance_count], base / "processing/input/source")
        (base / "processing/input/plan").mkdir(parents=True)
        plan.write(base / "processing/input/plan" / PLAN_FILE)
        console.say(f"{host}: {len(objects[index::instance_count])} source objects")
    engine = Engine.from_environment()
    with supervisor.forwarding_signals():
        for host in hosts:
            if image:  # (no AWS credentials, no network needed: the instance reads and writes its /opt/ml)
                # the entry point replaced as SageMaker replaces it with ContainerEntrypoint
                command = [*engine.command, "run", "--rm", "--name", f"{job_dir.name}-{host}", "--hostname", host,
                           "-v", f"{(job_dir / host).resolve()}:/opt/ml", "--entrypoint", ENTRYPOINT[0],
                           *engine.run_args, image, *ENTRYPOINT[1:]]
                supervisor.start(host, command + arguments, dict(os.environ))
            else:
                env = {**host_environment(), "SAGEMAKER_BASE_DIR": str(job_dir / host), "PYTHONUNBUFFERED": "1"}
                supervisor.start(host, [sys.executable, "-m", "keras_pipe_launch.prepare.instance", *arguments], env)
        codes = supervisor.wait()
    failed = {host: code for host, code in codes.items() if code}
    for host, code in failed.items():
        message = job_dir / host / "output" / "message"
        reason = message.read_text().strip() if message.exists() else "no message"
        console.say(f"{host} failed with exit code {code}: {reason}")
    if failed:
        return 1
    client = Reader().s3
    bucket, prefix = output_prefix(out)
    for host in hosts:  # S3UploadMode EndOfJob
        output = job_dir / host / "processing/output"
        for path in sorted(p for p in output.rglob("*") if p.is_file()):
            client.upload_file(str(path), bucket, prefix + path.relative_to(output).as_posix())
    return 0


# --- at the end ----------------------------------------------------------------------------------

def finish(plan: Plan, out: str, validation_fraction: float, strict: bool) -> dict:
    """Merges the instances' reports (under OUT/reports/), writes OUT/classes.json and
    OUT/rejected.txt, and says what was prepared."""
    client = Reader().s3
    bucket, prefix = output_prefix(out)
    store = S3Store(f"s3://{bucket}/{prefix}{REPORTS}/", client=client)
    try:
        objects = store.list()
    except SourceError as err:
        raise PlanError(f"no instance's report: {err} (the instances write one each when they succeed)") from None
    reports = [Report.read(store.open(obj).read()) for obj in objects]
    merged = merge(plan, reports)
    total = len(plan.items) + len(plan.rejected)
    if merged.rejected:
        text = "".join(f"{shown(where)}\t{why}\n" for where, why in merged.rejected)
        client.put_object(Bucket=bucket, Key=f"{prefix}rejected.txt", Body=text.encode())
        print(f"prepare: REJECTED {len(merged.rejected)} of {total} files (listed in s3://{bucket}/{prefix}"
              "rejected.txt)", file=sys.stderr)
        for where, why in merged.rejected[:10]:
            print(f"  {shown(where)}: {why}", file=sys.stderr)
    if merged.unplanned:
        print(f"prepare: warning: {len(merged.unplanned)} objects appeared under {plan.source} after it was listed "
              f"and were left out (e.g. {shown(merged.unplanned[0])})", file=sys.stderr)
    if strict and merged.rejected:
        raise PrepareError(f"{len(merged.rejected)} images could not be used (--strict)")
    check_classes(plan.classes, merged.counts["train"], merged.counts["validation"], validation_fraction)
    client.put_object(Bucket=bucket, Key=f"{prefix}classes.json", Body=(json.dumps(plan.classes) + "\n").encode())
    counts = {part: sum(counter.values()) for part, counter in merged.counts.items()}
    print(f"prepare: {counts['train']} train and {counts['validation']} validation examples of {len(plan.classes)} "
          f"classes in {sum(map(len, merged.shards.values()))} shards under s3://{bucket}/{prefix}; train with "
          f"{class_names_option(plan.classes)}", file=sys.stderr)
    return {"classes": plan.classes, **counts, "rejected": len(merged.rejected),
            "shards": {part: [f"s3://{bucket}/{prefix}{part}/{name}" for name in names]
                       for part, names in merged.shards.items() if names}}


def prepare_locally(source: str, out: str, *, instance_count: int, job_dir: Path, validation_fraction: float = 0.1,
                    seed: int = 0, strict: bool = False, arguments: list[str] = (), out_stream=None,
                    image: str | None = None) -> dict:
    """The whole distributed prepare, its instances run here (what the tests run)."""
    if job_dir.exists() and any(job_dir.iterdir()):
        raise PrepareError(f"{job_dir} is not empty: give a new --job-dir")
    plan, objects = planned(source, out, validation_fraction, seed)
    write_plan(plan, Reader().s3, out)
    if run_locally(plan, objects, out, job_dir, instance_count, list(arguments), out_stream, image):
        raise PrepareError("an instance failed (its reason above); nothing was merged")
    try:
        return finish(plan, out, validation_fraction, strict)
    except PlanError as err:
        raise PrepareError(str(err)) from None


def check_processing_resources(instance_type: str, volume_size_gb: int, max_run_s: int) -> None:
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    if instance_type not in model.shape_for("ProcessingInstanceType").enum:
        raise RequestError(f"--instance-type {instance_type!r} is not a SageMaker Processing instance type "
                           "(e.g. ml.c5.4xlarge, ml.m5.4xlarge)")
    if not 1 <= volume_size_gb <= 16384:
        raise RequestError("--volume-size must be 1 to 16384 GB")
    if not 1 <= max_run_s <= 777600:
        raise RequestError("--max-run must be 1 s to 9 days for a Processing job")


def run_on_sagemaker(request: dict, source: str, out: str, *, validation_fraction: float, seed: int,
                     strict: bool) -> int:
    """Plans, creates the job through the installed SDK, follows it to its end, then merges."""
    import boto3

    from keras_pipe_launch.sagemaker.follow import watch
    from keras_pipe_launch.sagemaker.sdk import process, sdk_major_version

    instance_count = request["ProcessingResources"]["ClusterConfig"]["InstanceCount"]
    plan, _ = planned(source, out, validation_fraction, seed)
    write_plan(plan, Reader().s3, out)
    print(f"keras-pipe prepare: submitting with SageMaker SDK v{sdk_major_version()}", file=sys.stderr)
    name = process(request)
    print(f"keras-pipe prepare: created processing job {name}", file=sys.stderr)
    describe = boto3.client("sagemaker").describe_processing_job
    try:
        job = watch("keras-pipe prepare", name, lambda: describe(ProcessingJobName=name), "ProcessingJob",
                    lambda job: instance_count)
    except KeyboardInterrupt:
        print(f"\nkeras-pipe prepare: stopped following; the job {name} goes on (stop it with `aws sagemaker "
              f"stop-processing-job --processing-job-name {name}`). Its reports are not merged: {out} gets no "
              "classes.json or rejected.txt, and nothing checked that every image was prepared", file=sys.stderr)
        return 130
    if job["ProcessingJobStatus"] != "Completed":
        reason = job.get("FailureReason") or "no reason given"
        exit_message = job.get("ExitMessage")
        print(f"keras-pipe prepare: {name} {job['ProcessingJobStatus'].lower()}: {reason}"
              + (f"\n  the instances said: {exit_message.strip()}" if exit_message else ""), file=sys.stderr)
        return 1
    try:
        finish(plan, out, validation_fraction, strict)
    except PlanError as err:
        raise PrepareError(str(err)) from None
    return 0
