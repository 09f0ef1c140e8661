"""A prepare at scale, after the merge: the validation images that turn out to be duplicates of
training images, moved to train.

The plan splits before any image is read, keeping together only the copies the listing shows
(the same ETag): a near copy (resized, recompressed) or a copy uploaded unalike can land in
validation while its twin is in train, and validation would then score the model on a picture it
trained on. Only the merge sees every instance's fingerprints, when the shards are written: so the
merge moves each such validation image to train (train, since the rest of its group is there and
validation shards are the fewer bytes to rewrite). Each affected validation shard is read, its
records split by the keys the instance's report says it holds in order (reports.Merger), the moved
records written as a train shard of their own (part-RUN-moved-NNNNN.tfrecord) and the shard
rewritten without them (or deleted, when none is left). Records keep their bytes, CRCs included:
the framing is checked and cut, the Examples inside are neither parsed nor re-encoded.

Order: the move is the merge's last change to the data, once everything that may refuse it
(the classes' checks, the data's report) is done; and every moved shard is uploaded before any
validation shard is rewritten. A merge stopped after the first upload leaves a moved shard that
no report lists, which a later merge (--finish) refuses, removing the run: never a dataset that
holds an image twice, or lost one; it costs running the job again, which only a failure within
those few S3 requests, or the command killed among them, can cause.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence

from keras_pipe_launch.prepare.duplicates import Group
from keras_pipe_launch.prepare.plan import MOVED, Plan, PlanError, shard_prefix
from keras_pipe_launch.prepare.reports import Merged
from keras_pipe_launch.prepare.sources import shown


def moved_name(run: str, index: int) -> str:
    return f"{shard_prefix(run, MOVED)}{index:05d}.tfrecord"


def leaked(plan: Plan, keys: Sequence[str], found: Sequence[Group]) -> list[str]:
    """The validation keys of the groups that also have a member in train (`keys`: the plan's keys
    in the order the groups index them)."""
    moving = []
    for group in found:
        members = [keys[i] for i in group.members]
        if {plan.items[key][1] for key in members} == {"train", "validation"}:
            moving += [key for key in members if plan.items[key][1] == "validation"]
    return moving


def recount(plan: Plan, merged: Merged, moving: Sequence[str]) -> None:
    """`merged`'s counts per label as they are once `moving` is in train (the move's checks and
    report are made before it, the move last: see above)."""
    for key in moving:
        label = plan.items[key][0]
        merged.counts["validation"][label] -= 1
        merged.counts["train"][label] += 1


def move_to_train(client, plan: Plan, merged: Merged, moving: Sequence[str], bucket: str, prefix: str) -> None:
    """Moves the examples of `moving` (validation keys) into train shards of their own, and
    updates `merged`'s shards to say so."""
    moving_set = set(moving)
    affected = sorted(name for name, keys in merged.in_shards.items() if moving_set.intersection(keys))
    rewritten: dict[str, bytes | None] = {}
    for index, name in enumerate(affected):
        keys = merged.in_shards[name]
        records = _records(client, bucket, f"{prefix}validation/{name}", len(keys))
        moved = [record for key, record in zip(keys, records) if key in moving_set]
        kept = [record for key, record in zip(keys, records) if key not in moving_set]
        client.put_object(Bucket=bucket, Key=f"{prefix}train/{moved_name(plan.run, index)}", Body=b"".join(moved))
        merged.shards["train"].append(moved_name(plan.run, index))
        rewritten[name] = b"".join(kept) if kept else None
    for name, data in rewritten.items():  # (only once every moved record is in train: see above)
        if data is None:
            client.delete_object(Bucket=bucket, Key=f"{prefix}validation/{name}")
            merged.shards["validation"].remove(name)
        else:
            client.put_object(Bucket=bucket, Key=f"{prefix}validation/{name}", Body=data)
    print(f"prepare: moved {len(moving)} validation images to train, each a duplicate of a training image that "
          f"only the instances' fingerprints showed ({len(affected)} validation shards rewritten); the data's report "
          "lists them", file=sys.stderr)


def _records(client, bucket: str, key: str, expected: int) -> list[bytes]:
    """The shard's records, each as its whole framed bytes (header, data, CRCs), checked to be
    `expected` in number, as its instance reported."""
    from pipemode.corruption import CorruptionPolicy
    from pipemode.errors import PipeDataError
    from pipemode.tfrecord import TFRecordDecoder, encode_record

    data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    where = shown(f"s3://{bucket}/{key}")
    try:
        payloads = [record for chunk in TFRecordDecoder(CorruptionPolicy()).decode(io.BytesIO(data).read, where,
                                                                                   len(data)) for record in chunk]
    except PipeDataError as err:
        raise PlanError(f"{where} cannot be split into its records to move duplicates out of it: {err}") from None
    if len(payloads) != expected:
        raise PlanError(f"{where} holds {len(payloads)} records; its instance reported {expected}")
    framed = [encode_record(payload) for payload in payloads]
    if sum(map(len, framed)) != len(data):  # (re-framing gives the same bytes: the CRCs were checked)
        raise PlanError(f"{where} is not only TFRecords")
    return framed
