"""`keras-pipe prepare s3://SOURCE/ s3://OUT/ --instance-count N`: prepare at scale, as a SageMaker
Processing job over N instances of this project's image, or (--local) as N processes here, each
with the /opt/ml a Processing instance gets.

1. Here, once: OUT claimed (prepare.run_state), the source listed and split (prepare.plan), the
   plan written to OUT/plan/.
2. Each instance: its ShardedByS3Key share of the source objects, checked and written to shards
   named after the run and itself (prepare.instance); SageMaker uploads its output to OUT when
   the job ends.
3. Here, at the end: the instances' reports checked against the plan and merged (every image
   handled once, nothing else in OUT), the duplicates grouped from the instances' fingerprints
   (a validation image of a group with training images moved to train: prepare.moves), then
   OUT/classes.json, OUT/rejected.txt and the data's report written, as the one-machine prepare
   writes them, and the run marked complete. A run that fails or is stopped
   is marked incomplete; `--finish OUT` merges it later or removes what it left.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from keras_pipe_launch.common import container_config, untrusted
from keras_pipe_launch.common.engine import Engine, host_environment
from keras_pipe_launch.common.objects import list_objects, stage, staging_plan
from keras_pipe_launch.common.processes import Console, Supervisor, stopped_by_any_signal
from keras_pipe_launch.prepare import data_report, duplicates, moves, run_state
from keras_pipe_launch.prepare.dataset import PrepareError, check_classes, class_names_option
from keras_pipe_launch.prepare.duplicates import DISTANCE
from keras_pipe_launch.prepare.plan import (
    PARTS,
    PLAN_FILE,
    REPORTS,
    Plan,
    PlanError,
    make_plan,
    new_run_id,
    shard_names,
)
from keras_pipe_launch.prepare.reports import Merged, Merger, read_entries, report_name
from keras_pipe_launch.prepare.run_state import (
    COMPLETE,
    INCOMPLETE,
    RUNNING,
    RunState,
    RunStateError,
    output_prefix,
    output_uri,
)
from keras_pipe_launch.prepare.sources import Reader, shown
from keras_pipe_launch.sagemaker.request import RequestError

PROCESSING = "/opt/ml/processing"
# ContainerEntrypoint replaces the image's ENTRYPOINT (tini) too: tini is given again, so that a
# stopped job's SIGTERM reaches Python (the kernel gives PID 1 no default SIGTERM action).
ENTRYPOINT = ["/usr/bin/tini", "--", "python3", "-m", "keras_pipe_launch.prepare.instance"]


def check_output_is_new(client, out: str) -> None:
    bucket, prefix = output_prefix(out)
    if client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1).get("KeyCount"):
        said = shown(out)
        raise PrepareError(f"{said} already holds objects: give a new output prefix (shards of two runs would mix)"
                           + (f"; if an earlier run there did not end, `keras-pipe prepare --finish {said}` merges or "
                              "removes what it left" if run_state.read(client, out) else ""))


def check_apart(source: str, out: str) -> None:
    """OUT under SOURCE would make the plan, the shards and the reports source objects of the next
    listing (and of the job's own ShardedByS3Key input); SOURCE under OUT, part of the dataset."""
    source_bucket, source_prefix = output_prefix(source)
    out_bucket, out_prefix = output_prefix(out)
    if source_bucket == out_bucket and (out_prefix.startswith(source_prefix) or source_prefix.startswith(out_prefix)):
        raise PrepareError(f"{shown(out)} and {shown(source)} overlap: the output prefix must be outside the source "
                           "prefix (and the other way round)")


def instance_arguments(shard_mb: float, max_side: int | None, quality: int, max_pixels: int,
                       workers: int | None = None) -> list[str]:
    arguments = ["--shard-mb", f"{shard_mb:g}", "--jpeg-quality", str(quality), "--max-image-pixels", str(max_pixels)]
    arguments += ["--max-side", str(max_side)] if max_side else []
    return arguments + (["--workers", str(workers)] if workers else [])


def processing_job_request(name: str, source: str, out: str, *, image_uri: str, role: str, instance_count: int,
                           instance_type: str, volume_size_gb: int, max_run_s: int, arguments: list[str]) -> dict:
    """The CreateProcessingJob request: the source sharded by S3 key, the plan to every instance,
    each instance's processing/output/{train,validation,reports}/ uploaded to the same folders of
    OUT when the job ends."""
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
        # one output per folder an instance may write: nothing it leaves can land on OUT's plan or
        # run state (an output of OUT itself would upload whatever the instance put there)
        "ProcessingOutputConfig": {"Outputs": [{
            "OutputName": folder, "AppManaged": False,
            "S3Output": {"S3Uri": f"s3://{bucket}/{prefix}{folder}/", "LocalPath": f"{PROCESSING}/output/{folder}",
                         "S3UploadMode": "EndOfJob"}} for folder in (*PARTS, REPORTS)]},
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


def source_prefix(source: str) -> str:
    if not source.startswith("s3://") or source.lower().endswith((".csv", ".manifest", ".jsonl")):
        raise PrepareError(f"{shown(source)}: a Processing job prepares an s3:// prefix of class folders (its "
                           "instances share the objects under it); prepare a CSV or a manifest on one machine (a "
                           "manifest also trains as it is: docs/sources.md)")
    return source if source.endswith("/") else source + "/"


def start_run(source: str, out: str, *, instance_count: int, where: str, validation_fraction: float, seed: int,
              strict: bool, duplicate_distance: int | None = DISTANCE) -> tuple[RunState, Plan, list]:
    """Claims OUT (it must be new, and no other run may claim it meanwhile), lists and splits the
    source, and writes the plan; returns the run's state, the plan and the source's objects
    (checked to be files an instance can be given). A failure after the claim leaves OUT's state
    incomplete, with its reason."""
    source = source_prefix(source)
    out = output_uri(out)
    check_apart(source, out)
    reader = Reader()
    check_output_is_new(reader.s3, out)
    state = RunState(new_run_id(), source, out, instance_count, where, validation_fraction, strict)
    state.claim(reader.s3)
    try:
        plan = make_plan(source, reader, validation_fraction, seed, run=state.run, instance_count=instance_count,
                         duplicate_distance=duplicate_distance)
        objects = staging_plan(list_objects(plan.source))
        write_plan(plan, reader.s3, out)
    except BaseException:  # (nothing but the claim and the plan written yet: OUT is left new again)
        with contextlib.suppress(Exception):
            run_state.clean_up(reader.s3, state)
        raise
    return state, plan, objects


class Interrupted(PrepareError):
    """The run was stopped by the user; OUT is marked incomplete."""


class RunFailed(PrepareError):
    """The run failed (an instance, the job, or the merge's checks): exit code 1, not 2, since no
    option is to blame; the message says why and what OUT is left as."""


def interrupted(state: RunState) -> Interrupted:
    return Interrupted(f"interrupted: {shown(state.out)} is marked incomplete, its dataset unfinished; `keras-pipe "
                       f"prepare --finish {shown(state.out)}` merges it if its instances had all finished, or else "
                       "removes what the run left")


@contextlib.contextmanager
def incomplete_on_failure(state: RunState, client) -> Iterator[None]:
    """Whatever stops the run inside (an error, Ctrl-C) is written into OUT's state first; Ctrl-C
    (wherever it comes: staging the shares, creating the job, merging) is then said as an
    Interrupted naming OUT and the --finish that frees it."""
    try:
        yield
    except BaseException as err:
        stopped = isinstance(err, (KeyboardInterrupt, Interrupted))
        reason = "interrupted" if stopped else f"{type(err).__name__}: {err}"
        unsaved = None
        try:
            state.save(client, INCOMPLETE, reason)
        except Exception as saving:  # (the original error matters more than this one)
            unsaved = saving
        if isinstance(err, KeyboardInterrupt):
            raise (interrupted(state) if unsaved is None else Interrupted(
                f"interrupted; {shown(state.out)} could not be marked incomplete ({type(unsaved).__name__}: "
                f"{shown(str(unsaved))})")) from None
        raise


# --- here, as N processes -------------------------------------------------------------------------

INTERRUPTED = 130  # the exit code of a run stopped by Ctrl-C, SIGTERM or a closed terminal


def run_locally(plan: Plan, objects: list, out: str, job_dir: Path, arguments: list[str], out_stream=None,
                image: str | None = None) -> int:
    """Each instance as a process of its own (or, with `image`, a container of it running the
    Processing job's entry point), with its /opt/ml under job_dir/algo-N and its share
    (ShardedByS3Key: the i-th of every N objects in key order, as the local training runner
    shares them); then each one's output uploaded under OUT, as SageMaker does at the end.
    Returns 0, 1 when an instance failed, or INTERRUPTED."""
    console = Console(out_stream or sys.stdout)
    stage_instances(plan, objects, job_dir, console)
    supervisor = Supervisor(console)
    engine = Engine.from_environment() if image else None  # (found: prepare_locally required it)
    with supervisor.forwarding_signals():
        for host in plan.hosts:
            if engine:  # (no AWS credentials, no network needed: the instance reads and writes its /opt/ml)
                # the entry point replaced as SageMaker replaces it with ContainerEntrypoint
                command = [*engine.command, "run", "--rm", "--name", f"{job_dir.name}-{host}", "--hostname", host,
                           "-v", f"{(job_dir / host).resolve()}:/opt/ml", "--entrypoint", ENTRYPOINT[0],
                           *engine.run_args, image, *ENTRYPOINT[1:]]
                supervisor.start(host, command + arguments, dict(os.environ))
            else:
                env = {**host_environment(), "SAGEMAKER_BASE_DIR": str(job_dir / host), "PYTHONUNBUFFERED": "1"}
                supervisor.start(host, [sys.executable, "-m", "keras_pipe_launch.prepare.instance", *arguments], env)
        codes = supervisor.wait()
    if supervisor.interrupted:
        console.say("interrupted: the instances were stopped; nothing was uploaded")
        return INTERRUPTED
    failed = {host: code for host, code in codes.items() if code}
    for host, code in failed.items():
        reason = untrusted.read_text(job_dir / host / "output" / "message", 4096)
        console.say(f"{host} failed with exit code {code}: {(reason or 'no message').strip()}")
    if failed:
        return 1
    upload_outputs(plan, job_dir, out)
    return 0


def stage_instances(plan: Plan, objects: list, job_dir: Path, console: Console) -> None:
    """Each instance's /opt/ml under job_dir/algo-N, as a Processing instance gets it: its config,
    its share of the source objects, the plan."""
    hosts, count = plan.hosts, len(plan.hosts)
    for index, host in enumerate(hosts):
        base = job_dir / host
        container_config.write(base / "config", resources=container_config.resource_config(host, hosts))
        stage(objects[index::count], base / "processing/input/source")
        (base / "processing/input/plan").mkdir(parents=True)
        plan.write(base / "processing/input/plan" / PLAN_FILE)
        console.say(f"{host}: {len(objects[index::count])} source objects")


def upload_outputs(plan: Plan, job_dir: Path, out: str) -> None:
    """What each instance left in its processing/output, uploaded to the same folders of OUT, as
    SageMaker does when the job ends; all of it checked first (S3UploadMode EndOfJob): only regular
    files named as the instance's own shards or report, else a RunFailed and nothing uploaded."""
    try:
        outputs = {host: untrusted.regular_files(job_dir / host / "processing/output") for host in plan.hosts}
    except untrusted.UntrustedFileError as err:
        raise RunFailed(f"an instance left something that is not uploaded: {err}; nothing was uploaded") from None
    uploads = []
    for host, paths in outputs.items():
        shards = shard_names(plan.run, host)
        for path in paths:
            relative = path.relative_to(job_dir / host / "processing/output").as_posix()
            folder, _, name = relative.partition("/")
            own = relative == f"{REPORTS}/{report_name(plan.run, host)}" or (folder in PARTS and shards.fullmatch(name))
            if not own:  # (it would land anywhere in OUT: its plan, its state, another's shards)
                raise RunFailed(f"{host} left processing/output/{shown(relative)}, which is not one of its own shards "
                                "or its report: nothing was uploaded")
            uploads.append((path, relative))
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    client = Reader().s3
    bucket, prefix = output_prefix(out)
    for path, relative in uploads:
        try:
            client.upload_file(str(path), bucket, prefix + relative)
        # (a failed upload_file is boto3's S3UploadFailedError, which is none of botocore's errors)
        except (OSError, S3UploadFailedError, BotoCoreError, ClientError) as err:
            raise RunFailed(f"cannot upload {shown(path)} to s3://{shown(bucket)}/{shown(prefix + relative)}: "
                            f"{shown(str(err))}") from None


# --- at the end ----------------------------------------------------------------------------------

def finish(plan: Plan, state: RunState) -> dict:
    """Merges the instances' reports (under OUT/reports/) after checking each of them and what OUT
    holds against the plan, writes OUT/classes.json and OUT/rejected.txt, marks the run complete
    and says what was prepared. A PlanError says what does not add up."""
    client = Reader().s3
    bucket, prefix = output_prefix(state.out)
    said_out = shown(f"s3://{bucket}/{prefix}")  # (OUT, as messages say it)
    state.save(client, state.state, state.reason, ended=False)  # (still OUT's owner? before anything is written)
    merged, stored = merge_reports(client, plan, bucket, prefix)
    total = len(plan.items) + len(plan.rejected)
    if merged.rejected:
        text = "".join(f"{shown(where)}\t{shown(why)}\n" for where, why in merged.rejected)
        client.put_object(Bucket=bucket, Key=f"{prefix}rejected.txt", Body=text.encode())
        print(f"prepare: REJECTED {len(merged.rejected)} of {total} files (listed in {said_out}rejected.txt)",
              file=sys.stderr)
        for where, why in merged.rejected[:10]:
            print(f"  {shown(where)}: {shown(why)}", file=sys.stderr)
    if merged.unplanned_count:
        example = f" (e.g. {shown(merged.unplanned[0])})" if merged.unplanned else ""
        print(f"prepare: warning: {merged.unplanned_count} objects appeared under {shown(plan.source)} after it was "
              f"listed and were left out{example}", file=sys.stderr)
    if state.strict and merged.rejected:
        raise PrepareError(f"{len(merged.rejected)} images could not be used (--strict)")
    found = duplicate_groups(plan, merged)
    moving = moves.leaked(plan, list(plan.items), found)
    moves.recount(plan, merged, moving)
    check_classes(plan.classes, merged.counts["train"], merged.counts["validation"], state.validation_fraction)
    moves.move_to_train(client, merged, moving, bucket, prefix, stored)
    write_data_report(client, plan, merged, found, set(moving), bucket, prefix)
    client.put_object(Bucket=bucket, Key=f"{prefix}classes.json", Body=(json.dumps(plan.classes) + "\n").encode())
    state.save(client, COMPLETE)
    counts = {part: sum(counter.values()) for part, counter in merged.counts.items()}
    print(f"prepare: {counts['train']} train and {counts['validation']} validation examples of {len(plan.classes)} "
          f"classes in {sum(map(len, merged.shards.values()))} shards under {said_out}; train with "
          f"{shown(class_names_option(plan.classes))}", file=sys.stderr)
    return {"classes": plan.classes, **counts, "rejected": len(merged.rejected),
            "shards": {part: [f"s3://{bucket}/{prefix}{part}/{name}" for name in names]
                       for part, names in merged.shards.items() if names}}


def duplicate_groups(plan: Plan, merged: Merged) -> list[duplicates.Group]:
    """The groups of duplicates among all the instances' images (indices in the plan's order)."""
    if plan.duplicates is None:
        return []
    return duplicates.groups([merged.prints.get(key) for key in plan.items], plan.duplicates)


def write_data_report(client, plan: Plan, merged: Merged, found: list[duplicates.Group], moved: set[str],
                      bucket: str, prefix: str) -> None:
    """OUT/report.html and OUT/data_report.json, as one machine writes them, from the plan and the
    instances' fingerprints (`moved`: the validation keys moved to train, prepare.moves)."""
    keys = list(plan.items)
    items = [(plan.source + key, plan.items[key][0]) for key in keys]
    parts = {plan.source + key: "train" if key in moved else part for key, (_, part) in plan.items.items()}
    report = data_report.build(plan.source, plan.classes, items, [merged.prints.get(key) for key in keys], found,
                               parts, merged.counts, len(merged.rejected), plan.duplicates,
                               moved=frozenset(plan.source + key for key in moved))
    reader = Reader()
    thumbnails = data_report.thumbnails_of(report, lambda name: reader.read(plan.source + name))
    with tempfile.TemporaryDirectory() as folder:
        data_report.write(Path(folder), report, thumbnails)
        for name, kind in ((data_report.JSON_NAME, "application/json"), (data_report.HTML_NAME, "text/html")):
            client.upload_file(str(Path(folder) / name), bucket, prefix + name,
                               ExtraArgs={"ContentType": f"{kind}; charset=utf-8"})
    data_report.say(report, f"s3://{bucket}/{prefix}{data_report.HTML_NAME}")


def merge_reports(client, plan: Plan, bucket: str, prefix: str) -> tuple[Merged, dict[str, set[str]]]:
    """The instances' reports under OUT/reports/, each read from S3 and merged in turn, line by line
    (prepare.reports), checked against the plan and what OUT's train/ and validation/ hold (the
    names there: the merge's second value)."""
    stored: dict[str, set[str]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            folder, _, name = item["Key"][len(prefix):].partition("/")
            stored.setdefault(folder, set()).add(name)
    names = sorted(stored.get(REPORTS, ()))
    # (every name checked before any report is read: there may be any number of other objects there)
    shards = {part: stored.get(part, set()) for part in PARTS}
    merger = Merger(plan, names, shards)
    for name in names:
        body = client.get_object(Bucket=bucket, Key=f"{prefix}{REPORTS}/{name}")["Body"]
        with contextlib.closing(body):
            merger.add(name, read_entries(body, f"{merger.hosts[name]}'s report {REPORTS}/{shown(name)}"))
    return merger.result(), shards


def merged_or_incomplete(plan: Plan, state: RunState) -> dict:
    """finish(), with a failure to merge written into OUT's state and said as a PrepareError."""
    try:
        with incomplete_on_failure(state, Reader().s3):
            return finish(plan, state)
    except PlanError as err:
        raise RunFailed(f"{err}. {shown(state.out)} is marked incomplete; `keras-pipe prepare --finish "
                        f"{shown(state.out)}` removes what the run left") from None


def prepare_locally(source: str, out: str, *, instance_count: int, job_dir: Path, validation_fraction: float = 0.1,
                    seed: int = 0, strict: bool = False, arguments: list[str] = (), out_stream=None,
                    image: str | None = None, duplicate_distance: int | None = DISTANCE) -> dict:
    """The whole distributed prepare, its instances run here (what the tests run)."""
    if job_dir.exists() and not job_dir.is_dir():
        raise PrepareError(f"--job-dir {shown(job_dir)} is a file: give a new folder")
    if job_dir.exists() and any(job_dir.iterdir()):
        raise PrepareError(f"{shown(job_dir)} is not empty: give a new --job-dir")
    if image:
        Engine.from_environment().require()
    state, plan, objects = start_run(source, out, instance_count=instance_count, where="local",
                                     validation_fraction=validation_fraction, seed=seed, strict=strict,
                                     duplicate_distance=duplicate_distance)
    client = Reader().s3
    with incomplete_on_failure(state, client):
        code = run_locally(plan, objects, state.out, job_dir, list(arguments), out_stream, image)
        if code == INTERRUPTED:
            raise interrupted(state)
        if code:
            raise RunFailed(f"an instance failed (its reason above); nothing was merged, and {shown(state.out)} is "
                            f"marked incomplete: `keras-pipe prepare --finish {shown(state.out)}` removes what the run "
                            "left")
    return merged_or_incomplete(plan, state)


PROCESSING_LIMITS = {"instance_count": 100, "volume_size_gb": 16384, "max_run_s": 777600}


def check_processing_resources(instance_type: str, instance_count: int, volume_size_gb: int, max_run_s: int) -> None:
    """SageMaker's limits for a Processing job (its API reference: InstanceCount 1-100,
    VolumeSizeInGB 1-16384, MaxRuntimeInSeconds 1-777600; botocore's model has the instance types)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    if instance_type not in model.shape_for("ProcessingInstanceType").enum:
        raise RequestError(f"--instance-type {instance_type!r} is not a SageMaker Processing instance type "
                           "(e.g. ml.c5.4xlarge, ml.m5.4xlarge)")
    if not 1 <= instance_count <= PROCESSING_LIMITS["instance_count"]:
        raise RequestError(f"--instance-count must be 1 to {PROCESSING_LIMITS['instance_count']} for a Processing "
                           "job")
    if not 1 <= volume_size_gb <= PROCESSING_LIMITS["volume_size_gb"]:
        raise RequestError("--volume-size must be 1 to 16384 GB")
    if not 1 <= max_run_s <= PROCESSING_LIMITS["max_run_s"]:
        raise RequestError("--max-run must be 1 s to 9 days for a Processing job")


def run_on_sagemaker(request: dict, source: str, out: str, *, validation_fraction: float, seed: int,
                     strict: bool, duplicate_distance: int | None = DISTANCE) -> int:
    """Plans, creates the job through the installed SDK, follows it to its end, then merges."""
    from keras_pipe_launch.sagemaker.sdk import process, sdk_major_version

    instance_count = request["ProcessingResources"]["ClusterConfig"]["InstanceCount"]
    state, plan, _ = start_run(source, out, instance_count=instance_count, where="sagemaker",
                               validation_fraction=validation_fraction, seed=seed, strict=strict,
                               duplicate_distance=duplicate_distance)
    client = Reader().s3
    with incomplete_on_failure(state, client):
        # recorded before it is created: a command stopped while creating it still names the job
        # --finish must ask SageMaker about (a job that was never created: a run to remove)
        state.job = request["ProcessingJobName"]
        state.save(client, RUNNING, ended=False)
        print(f"keras-pipe prepare: submitting with SageMaker SDK v{sdk_major_version()}", file=sys.stderr)
        name = process(request)
    print(f"keras-pipe prepare: created processing job {name} (run {state.run})", file=sys.stderr)
    job = follow(name, instance_count, state)
    if job is None:
        return INTERRUPTED
    return merge_ended_job(job, plan, state)


def follow(name: str, instance_count: int, state: RunState) -> dict | None:
    """The job's last description once it ended, or None if the command was stopped first (Ctrl-C,
    SIGTERM, a closed terminal): the job goes on, and --finish merges it later."""
    import boto3

    from keras_pipe_launch.sagemaker.follow import watch

    describe = boto3.client("sagemaker").describe_processing_job
    try:
        with stopped_by_any_signal():
            return watch("keras-pipe prepare", name, lambda: describe(ProcessingJobName=name), "ProcessingJob",
                         lambda job: instance_count)
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):  # (the job goes on: the run is not over, but this command is)
            state.save(Reader().s3, RUNNING)
        print(f"\nkeras-pipe prepare: stopped following; the job {name} goes on (stop it with `aws sagemaker "
              f"stop-processing-job --processing-job-name {name}`). Its reports are not merged yet: once it has "
              f"ended, `keras-pipe prepare --finish {shown(state.out)}` merges them (or removes what a failed job "
              "left)",
              file=sys.stderr)
        return None


def merge_ended_job(job: dict, plan: Plan, state: RunState) -> int:
    name = job["ProcessingJobName"]
    if job["ProcessingJobStatus"] != "Completed":
        reason = job.get("FailureReason") or "no reason given"
        exit_message = job.get("ExitMessage")
        state.save(Reader().s3, INCOMPLETE, f"job {name} {job['ProcessingJobStatus'].lower()}: {reason}")
        print(f"keras-pipe prepare: {name} {job['ProcessingJobStatus'].lower()}: {shown(reason)}"
              + (f"\n  the instances said: {shown(exit_message.strip())}" if exit_message else "")
              + f"\n{shown(state.out)} is marked incomplete; `keras-pipe prepare --finish {shown(state.out)}` removes "
              "what the job left", file=sys.stderr)
        return 1
    merged_or_incomplete(plan, state)
    return 0


# --- later: `keras-pipe prepare --finish OUT` ---------------------------------------------------------

def finish_later(out: str) -> int:
    """Merges a run whose job ended after the command stopped following it; a run that cannot be
    merged (its job failed, an instance's report is missing or wrong) is removed from OUT instead,
    so that OUT can be used again. Refuses while the run's job is still running."""
    client = Reader().s3
    out = output_uri(out)
    state = run_state.read(client, out)
    if state is None:
        raise PrepareError(f"{shown(out)} holds no prepare run ({run_state.RUN_FILE}): nothing to finish")
    if state.state == COMPLETE:
        print(f"keras-pipe prepare: {shown(out)} is complete already (run {state.run})", file=sys.stderr)
        return 0
    alive = state.launcher_alive()
    if alive:
        pid = shown(str(state.launcher["pid"]))  # (what the state file says)
        raise PrepareError(f"the command that started run {state.run} still runs (pid {pid}): let it end, or stop "
                           "it, before --finish")
    status = None  # the job's, on SageMaker
    if state.where == "sagemaker" and state.job:
        status = processing_job_status(state.job)
        if status in ("InProgress", "Stopping"):
            raise PrepareError(f"the run's job {state.job} is still {status}: --finish once it has ended (or stop it)")
    elif state.state == RUNNING and alive is None:
        raise PrepareError(f"run {state.run} was started on {shown(str(state.launcher.get('host')))} and has not "
                           "ended by its state: run --finish there (this machine cannot tell whether it still runs)")
    elif state.state == RUNNING:
        print(f"keras-pipe prepare: run {state.run} did not end by itself (killed?); finishing it", file=sys.stderr)
    reason = f"job {state.job} {status.lower()}" if status not in (None, "Completed") else merge_later(client, state)
    if reason is None:
        return 0
    left = run_state.clean_up(client, state)
    print(f"keras-pipe prepare: run {state.run} cannot be merged ({shown(reason or 'no reason recorded')}): removed "
          f"what it left in {shown(out)}" + (f"; {len(left)} other objects are still there (e.g. {left[0]}): remove "
                                             "them to use it again" if left else ", which can be used again"),
          file=sys.stderr)
    return 1


def merge_later(client, state: RunState) -> str | None:
    """finish() for --finish: None once merged, else why the run cannot be merged. Whatever its
    plan and reports hold, that is a reason, never an error that would leave OUT stuck; only what
    may pass (S3 unreachable, OUT taken over by another command) stops --finish itself."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        plan = read_plan(client, state.out)
        if plan.run != state.run:
            raise PlanError(f"the plan in {shown(state.out)}plan/ is run {shown(plan.run)}'s, not {state.run}'s")
        finish(plan, state)
        return None
    except (PlanError, PrepareError) as err:  # (PrepareError: --strict, or a class without examples)
        return str(err)
    except (BotoCoreError, ClientError, RunStateError):
        raise
    except Exception as err:  # (what no check here foresaw)
        return f"{type(err).__name__}: {err}"


def processing_job_status(name: str) -> str:
    """The job's status, or "never created" where SageMaker does not know it."""
    import boto3
    from botocore.exceptions import ClientError

    try:
        return boto3.client("sagemaker").describe_processing_job(ProcessingJobName=name)["ProcessingJobStatus"]
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") == "ValidationException" and "not find" in str(err).lower():
            return "never created"
        raise


def read_plan(client, out: str) -> Plan:
    from botocore.exceptions import ClientError

    bucket, prefix = output_prefix(out)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / PLAN_FILE
        try:
            client.download_file(bucket, f"{prefix}plan/{PLAN_FILE}", str(path))
        except ClientError as err:  # (a missing plan: the run failed while listing)
            raise PlanError(f"its plan cannot be read ({shown(str(err))})") from None
        return Plan.read(path)
