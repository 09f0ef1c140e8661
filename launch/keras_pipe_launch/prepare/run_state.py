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
import time

from keras_pipe_launch.common.objects import parse_s3_uri
from keras_pipe_launch.prepare.plan import PARTS, REPORTS
from keras_pipe_launch.prepare.sources import shown

RUN_FILE = "prepare-run.json"
RUNNING, COMPLETE, INCOMPLETE = "running", "complete", "incomplete"


class RunStateError(ValueError):
    """OUT cannot be used, or has no run to finish: the message says why and what to do."""


def output_prefix(out: str) -> tuple[str, str]:
    """(bucket, prefix ending in "/") of the s3:// output."""
    bucket, prefix = parse_s3_uri(out)
    return bucket, (prefix if not prefix or prefix.endswith("/") else prefix + "/")


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
    job: str | None = None  # the Processing job's name, on SageMaker
    reason: str | None = None  # why the run is incomplete
    started: str = dataclasses.field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def body(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), indent=1) + "\n").encode()

    def claim(self, client) -> None:
        """Writes the state as OUT's first object, or refuses if another run wrote it first."""
        from botocore.exceptions import ClientError

        bucket, prefix = output_prefix(self.out)
        try:
            client.put_object(Bucket=bucket, Key=prefix + RUN_FILE, Body=self.body(), IfNoneMatch="*",
                              ContentType="application/json")
        except ClientError as err:
            # 412: the object exists; 409: another conditional write of it is in flight
            if err.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise
            other = read(client, self.out)
            raise RunStateError(f"{self.out} was claimed by another prepare run at the same time "
                                f"({other.run if other else 'unknown'}, started {other.started if other else '?'}): "
                                "give a new output prefix") from None

    def save(self, client, state: str, reason: str | None = None) -> None:
        self.state, self.reason = state, reason
        bucket, prefix = output_prefix(self.out)
        client.put_object(Bucket=bucket, Key=prefix + RUN_FILE, Body=self.body(), ContentType="application/json")


def read(client, out: str) -> RunState | None:
    """OUT's run state, or None where there is none."""
    from botocore.exceptions import ClientError

    bucket, prefix = output_prefix(out)
    try:
        body = client.get_object(Bucket=bucket, Key=prefix + RUN_FILE)["Body"].read(1 << 20)
    except ClientError as err:
        if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise
    try:
        document = json.loads(body)
        return RunState(**document)
    except (ValueError, TypeError) as err:
        raise RunStateError(f"{out}{RUN_FILE} is not a prepare run's state ({err})") from None


def clean_up(client, state: RunState) -> list[str]:
    """Deletes what the run left in OUT (its state, plan, reports, its shards, a rejected list)
    and returns the keys of what is left there, which the run did not write."""
    bucket, prefix = output_prefix(state.out)
    ours = (RUN_FILE, "plan/", f"{REPORTS}/", "classes.json", "rejected.txt",
            *(f"{part}/part-{state.run}-" for part in PARTS))  # (shard_prefix(run, host))
    left, doomed = [], []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix):]
            (doomed if relative.startswith(ours) else left).append(item["Key"])
    for first in range(0, len(doomed), 1000):
        client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in doomed[first:first + 1000]],
                                                     "Quiet": True})
    return [shown(f"s3://{bucket}/{key}") for key in left]
