"""Who owns a prepare-at-scale OUT, and how far its run got: OUT/prepare-run.json.

It is written first, with a conditional write (If-None-Match: *) that S3 lets only one writer
win, so two runs started on the same new OUT cannot both go on: the second is refused before it
lists the source (a listing-then-check would let both pass, then mix their shards). Its `state`
says what OUT holds: "running" while the job runs, "complete" once the merge checked everything
(only then does OUT hold classes.json: a dataset), "incomplete" when the run failed or was
interrupted, with the reason. `keras-pipe prepare --finish OUT` reads it to merge a run whose job
ended after the command stopped following it, or to remove what a failed run left (clean_up).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time

from keras_pipe_launch.common.objects import parse_s3_uri
from keras_pipe_launch.prepare.plan import PARTS, REPORTS, RUN_ID
from keras_pipe_launch.prepare.sources import shown
from keras_pipe_train.settings.contract import JOB_NAME

RUN_FILE = "prepare-run.json"
RUNNING, COMPLETE, INCOMPLETE = "running", "complete", "incomplete"


class RunStateError(ValueError):
    """OUT cannot be used, or has no run to finish: the message says why and what to do."""


def output_prefix(out: str) -> tuple[str, str]:
    """(bucket, prefix ending in "/") of the s3:// output."""
    bucket, prefix = parse_s3_uri(out)
    return bucket, (prefix if not prefix or prefix.endswith("/") else prefix + "/")


def output_uri(out: str) -> str:
    """The s3:// output as the run state names it: s3://bucket/prefix/."""
    return "s3://{}/{}".format(*output_prefix(out))


@dataclasses.dataclass
class RunState:
    run: str
    source: str
    out: str  # s3://bucket/prefix/
    instance_count: int
    where: str  # "sagemaker" | "local"
    validation_fraction: float
    strict: bool
    state: str = RUNNING
    job: str | None = None  # the Processing job's name, on SageMaker (recorded before it is created)
    reason: str | None = None  # why the run is incomplete
    started: str = dataclasses.field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    # the command that runs it: --finish refuses while that process lives (it may still merge or upload)
    launcher: dict = dataclasses.field(default_factory=lambda: {"host": socket.gethostname(), "pid": os.getpid()})
    # the ETag of the state as this command last wrote or read it (not stored): every later write
    # is conditional on it, so a command that lost OUT (a --finish removed or finished the run
    # meanwhile) cannot overwrite what another wrote since
    etag: str | None = dataclasses.field(default=None, compare=False)

    def launcher_alive(self) -> bool | None:
        """Whether the command that started the run still runs: True, False, or None when it ran on
        another machine (which this one cannot tell)."""
        pid = int(self.launcher.get("pid") or 0)
        if pid <= 0 or pid == os.getpid():  # (none: the command was done with the run; or this very process)
            return False
        if self.launcher.get("host") != socket.gethostname():
            return None
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):  # (gone; or another user's process has the pid now)
            return False
        return True

    def body(self) -> bytes:
        document = {key: value for key, value in dataclasses.asdict(self).items() if key != "etag"}
        return (json.dumps(document, indent=1) + "\n").encode()

    def claim(self, client) -> None:
        """Writes the state as OUT's first object, or refuses if another run wrote it first."""
        from botocore.exceptions import ClientError

        bucket, prefix = output_prefix(self.out)
        try:
            self.etag = client.put_object(Bucket=bucket, Key=prefix + RUN_FILE, Body=self.body(), IfNoneMatch="*",
                                          ContentType="application/json")["ETag"]
        except ClientError as err:
            # 412: the object exists; 409: another conditional write of it is in flight
            if err.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise
            other = read(client, self.out)
            started = shown(str(other.started)) if other else "?"  # (what the file says)
            raise RunStateError(f"{shown(self.out)} was claimed by another prepare run at the same time "
                                f"({other.run if other else 'unknown'}, started {started}): give a new output "
                                "prefix") from None

    def save(self, client, state: str, reason: str | None = None, *, ended: bool = True) -> None:
        """Writes the run's state; `ended`: the command is done with it (no pid for --finish to wait for)."""
        self.state, self.reason = state, reason
        if ended:
            self.launcher = {**self.launcher, "pid": None}
        bucket, prefix = output_prefix(self.out)
        from botocore.exceptions import ClientError

        try:
            condition = {"IfMatch": self.etag} if self.etag else {}  # (always, once claimed or read)
            self.etag = client.put_object(Bucket=bucket, Key=prefix + RUN_FILE, Body=self.body(), **condition,
                                          ContentType="application/json")["ETag"]
        except ClientError as err:
            # 412: changed since; 404: removed (by --finish); 409: another conditional write in flight
            if err.response.get("Error", {}).get("Code") not in (
                    "PreconditionFailed", "NoSuchKey", "404", "ConditionalRequestConflict"):
                raise
            raise RunStateError(f"{shown(self.out)}{RUN_FILE} was changed or removed by another command since this "
                                f"one wrote it (a --finish?): run {self.run} no longer owns {shown(self.out)}, and "
                                "writes nothing more there") from None


def read(client, out: str) -> RunState | None:
    """OUT's run state, or None where there is none."""
    from botocore.exceptions import ClientError

    bucket, prefix = output_prefix(out)
    try:
        answer = client.get_object(Bucket=bucket, Key=prefix + RUN_FILE)
        body, etag = answer["Body"].read(1 << 20), answer["ETag"]
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise
    try:
        state = RunState(**json.loads(body))
    except (ValueError, TypeError) as err:
        raise RunStateError(f"{shown(out)}{RUN_FILE} is not a prepare run's state ({shown(str(err))})") from None
    # it is data in S3, not the launcher's memory: a copied or edited file must not make --finish
    # merge into, or delete from, another prefix than the one given
    problems = []
    if state.out != output_uri(out):
        problems.append(f"it names another output ({shown(str(state.out))})")
    if not (isinstance(state.run, str) and RUN_ID.fullmatch(state.run)):
        problems.append("its run id is not one")
    if state.where not in ("sagemaker", "local") or state.state not in (RUNNING, COMPLETE, INCOMPLETE):
        problems.append("its where or state is unknown")
    if state.job is not None and not (isinstance(state.job, str) and JOB_NAME.fullmatch(state.job)):
        problems.append("its job name is not one")
    launcher = state.launcher if isinstance(state.launcher, dict) else {}
    if not (isinstance(state.launcher, dict) and isinstance(launcher.get("host"), str)
            and (launcher.get("pid") is None or type(launcher.get("pid")) is int)):
        problems.append("its launcher is not a host name and a process id")
    if not (isinstance(state.source, str) and state.source.startswith("s3://")):
        problems.append("its source is not an s3:// prefix")
    if not (type(state.instance_count) is int and state.instance_count >= 1):
        problems.append("its instance count is not one")
    if not (type(state.validation_fraction) in (int, float) and 0 <= state.validation_fraction < 1
            and type(state.strict) is bool):
        problems.append("its validation fraction or strict flag is not one")
    if not (state.reason is None or isinstance(state.reason, str)) or not isinstance(state.started, str):
        problems.append("its reason or start time is not text")
    if problems:
        raise RunStateError(f"{shown(out)}{RUN_FILE} cannot be this output's run state: {'; '.join(problems)}")
    state.etag = etag
    return state


def clean_up(client, state: RunState) -> list[str]:
    """Deletes what the run left in OUT (its state, plan, reports, its shards, a rejected list, the
    data's report) and returns the keys of what is left there, which the run did not write."""
    from keras_pipe_launch.prepare import data_report

    bucket, prefix = output_prefix(state.out)
    ours = (RUN_FILE, "plan/", f"{REPORTS}/", "classes.json", "rejected.txt", data_report.JSON_NAME,
            data_report.HTML_NAME, *(f"{part}/part-{state.run}-" for part in PARTS))  # (shard_prefix(run, host))
    left, doomed = [], []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix):]
            (doomed if relative.startswith(ours) else left).append(item["Key"])
    for first in range(0, len(doomed), 1000):
        answer = client.delete_objects(Bucket=bucket, Delete={
            "Objects": [{"Key": k} for k in doomed[first:first + 1000]], "Quiet": True})
        left += [error["Key"] for error in answer.get("Errors", [])]  # (each key that failed, said, not lost)
    return [shown(f"s3://{bucket}/{key}") for key in left]
