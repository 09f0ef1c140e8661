"""A prepare at scale, at the merge: the validation images that turn out to be duplicates of
training images, moved to train.

The plan splits before any image is read, keeping together only the copies the listing shows
(the same ETag): a near copy (resized, recompressed) or a copy uploaded unalike can land in
validation while its twin is in train, and validation would then score the model on a picture it
trained on. Only the merge sees every instance's fingerprints, once the shards are written: so the
merge moves each such validation image to train (train, since the rest of its group is there and
validation is the smaller part to rewrite).

A validation shard V with images to move is cut in two, by the keys its instance's report says it
holds, in order (reports.Merger; the report is trusted for that order, as for the shards
themselves): its moved records go to train/V-moved.tfrecord, the others to validation/V-kept.tfrecord
(none if none is left), then V is deleted. Records keep their bytes, CRCs included: the framing is
checked and cut, the Examples inside neither parsed nor re-encoded. One shard is in memory at a time.

Each shard's move is done again, whole, as long as V is there, and done once V is gone (its
-moved, and -kept, are uploaded before V is deleted): so a merge stopped anywhere in the moves, or
after them, is merged by --finish as if it had not stopped (the reports name the shards V; the
merge finds the same moves again from the same fingerprints).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence

from keras_pipe_launch.prepare.duplicates import Group
from keras_pipe_launch.prepare.plan import Plan, PlanError, kept_shard, moved_shard
from keras_pipe_launch.prepare.reports import Merged
from keras_pipe_launch.prepare.sources import shown


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
    """`merged`'s counts per label as they are once `moving` is in train."""
    for key in moving:
        label = plan.items[key][0]
        merged.counts["validation"][label] -= 1
        merged.counts["train"][label] += 1


def move_to_train(client, merged: Merged, moving: Sequence[str], bucket: str, prefix: str,
                  stored: dict[str, set[str]]) -> None:
    """Moves the examples of `moving` (validation keys; none: the checks only) to train, shard by
    shard (or finds a shard's move done), and updates `merged.shards` to say so. `stored`: the
    names in OUT's train/ and validation/ when the merge listed them, which may hold what an
    earlier merge of this run made (merged.Merger lets those names pass: they are checked here)."""
    moving_set = set(moving)
    train, validation = stored.get("train", set()), stored.get("validation", set())
    affected = [name for name in merged.shards["validation"] if moving_set.intersection(merged.in_shards.get(name, ()))]
    for name in merged.shards["validation"]:
        keys = merged.in_shards.get(name, [])
        left = set(keys) - moving_set
        if name in validation and name in affected:
            cut(client, bucket, prefix, name, keys, moving_set, kept_there=kept_shard(name) in validation)
        elif name in validation:
            if moved_shard(name) in train or kept_shard(name) in validation:
                raise PlanError(f"the output holds what a merge made of validation/{shown(name)}, which holds no image "
                                "to move")
        elif name not in affected or moved_shard(name) not in train or (kept_shard(name) in validation) != bool(left):
            raise PlanError(f"validation/{shown(name)} is gone, and what it held is not in {moved_shard(name)}"
                            + (f" and {kept_shard(name)}" if left else ""))
    merged.shards["train"] += [moved_shard(name) for name in affected]
    merged.shards["validation"] = [kept_shard(name) if name in affected else name
                                   for name in merged.shards["validation"]
                                   if name not in affected or set(merged.in_shards[name]) - moving_set]
    if moving:
        print(f"prepare: moved {len(moving)} validation images to train, each a duplicate of a training image that "
              f"only the instances' fingerprints showed ({len(affected)} validation shards cut in two); the data's "
              "report lists them", file=sys.stderr)


def cut(client, bucket: str, prefix: str, name: str, keys: Sequence[str], moving: set[str], kept_there: bool) -> None:
    """Validation shard `name`, holding the examples of `keys` in order, cut into train/its -moved
    (those of `moving`) and validation/its -kept (the others, if any), then deleted."""
    records = _records(client, bucket, f"{prefix}validation/{name}", len(keys))
    moved = b"".join(record for key, record in zip(keys, records) if key in moving)
    kept = b"".join(record for key, record in zip(keys, records) if key not in moving)
    del records
    client.put_object(Bucket=bucket, Key=f"{prefix}train/{moved_shard(name)}", Body=moved)
    if kept:
        client.put_object(Bucket=bucket, Key=f"{prefix}validation/{kept_shard(name)}", Body=kept)
    elif kept_there:  # (not made by this run's merge, which makes none of a shard it empties)
        client.delete_object(Bucket=bucket, Key=f"{prefix}validation/{kept_shard(name)}")
    delete_original(client, bucket, f"{prefix}validation/{name}")


def delete_original(client, bucket: str, key: str) -> None:
    client.delete_object(Bucket=bucket, Key=key)


def _records(client, bucket: str, key: str, expected: int) -> list[bytes]:
    """The shard's records, each as its whole framed bytes (header, data, CRCs), checked to be
    `expected` in number, as its instance reported."""
    from pipemode.corruption import CorruptionPolicy
    from pipemode.errors import PipeDataError
    from pipemode.tfrecord import TFRecordDecoder, encode_record

    data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    where = shown(f"s3://{bucket}/{key}")
    try:
        framed = [encode_record(record) for chunk in TFRecordDecoder(CorruptionPolicy()).decode(
            io.BytesIO(data).read, where, len(data)) for record in chunk]
    except PipeDataError as err:
        raise PlanError(f"{where} cannot be split into its records to move duplicates out of it: {err}") from None
    if len(framed) != expected:
        raise PlanError(f"{where} holds {len(framed)} records; its instance reported {expected}")
    return framed
