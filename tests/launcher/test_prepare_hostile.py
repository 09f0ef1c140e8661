"""A prepare at scale under hostile and unlucky conditions: two runs on one OUT, reports that do
not add up or were tampered with, what a container leaves behind, interruptions, and --finish."""

import collections
import dataclasses
import gzip
import io
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from keras_pipe_launch.common import untrusted
from keras_pipe_launch.prepare import run_state
from keras_pipe_launch.prepare.dataset import PrepareError
from keras_pipe_launch.prepare.duplicates import Fingerprint
from keras_pipe_launch.prepare.plan import Plan, PlanError
from keras_pipe_launch.prepare.processing import merged_or_incomplete, prepare_locally, start_run, write_plan
from keras_pipe_launch.prepare.reports import Merger, Report, merge, read_entries, report_name
from keras_pipe_launch.prepare.run_state import RunState
from tests.conftest import REPO, image_bytes
from tests.launcher.conftest import launch_cli
from tests.launcher.test_prepare_at_scale import upload_folder
from tests.timeouts import wait_s

HERE = Path(__file__).parent


def state_of(client, bucket: str, prefix: str = "prepared/") -> dict:
    return json.loads(client.get_object(Bucket=bucket, Key=f"{prefix}prepare-run.json")["Body"].read())


def keys_under(client, bucket: str, prefix: str) -> list[str]:
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]


# --- one OUT, two runs ----------------------------------------------------------------------------

@pytest.mark.slow
def test_two_runs_started_together_on_one_out_one_wins_and_the_other_refuses_before_listing(
        photos, s3_bucket, monkeypatch):
    root, _ = photos
    client, bucket = s3_bucket
    upload_folder(client, bucket, root, "photos/")
    listings = collections.Counter()
    from keras_pipe_launch.prepare import plan as plan_module

    real_make_plan = plan_module.make_plan

    def counted(*args, **kwargs):  # (counts the runs that got as far as listing SOURCE)
        listings[threading.current_thread().name] += 1
        return real_make_plan(*args, **kwargs)

    monkeypatch.setattr("keras_pipe_launch.prepare.processing.make_plan", counted)
    start, outcomes = threading.Barrier(2), {}

    def run(name):
        start.wait()
        try:
            outcomes[name] = start_run(f"s3://{bucket}/photos/", f"s3://{bucket}/prepared/", instance_count=2,
                                       where="local", validation_fraction=0.2, seed=0, strict=False)
        except (PrepareError, run_state.RunStateError) as err:
            outcomes[name] = err

    threads = [threading.Thread(target=run, args=(name,), name=name) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [name for name, outcome in outcomes.items() if isinstance(outcome, tuple)]
    assert len(won) == 1, outcomes
    (lost,) = set(outcomes) - set(won)
    assert "already holds objects" in str(outcomes[lost]) or "claimed by another prepare run" in str(outcomes[lost])
    assert listings == {won[0]: 1}  # the loser never listed SOURCE
    state, plan, _ = outcomes[won[0]]
    assert state_of(client, bucket)["run"] == plan.run == state.run

    # the window the first check cannot close: both found OUT new, then both claim it; S3's
    # conditional write lets one through
    new = [RunState(f"0000000{i}", f"s3://{bucket}/photos/", f"s3://{bucket}/other/", 2, "local", 0.1, False)
           for i in (1, 2)]
    new[0].claim(client)
    with pytest.raises(run_state.RunStateError, match=r"s3://.*/other/ was claimed by another prepare run .*00000001"):
        new[1].claim(client)


def tfrecords_in(data: bytes) -> int:
    """How many records a TFRecord file holds (its framing walked: length, its CRC, data, its CRC)."""
    count, position = 0, 0
    while position < len(data):
        (length,) = struct.unpack_from("<Q", data, position)
        position += 8 + 4 + length + 4
        count += 1
    assert position == len(data)
    return count


@pytest.mark.slow
def test_two_commands_started_together_on_one_out_one_prepares_it_and_the_other_refuses(s3_bucket, tmp_path):
    """Two real `keras-pipe prepare --instance-count 2 --local` at the same moment: OUT ends up holding
    the one dataset of the run that claimed it, never a mix."""
    client, bucket = s3_bucket
    for index in range(6):  # (few, tiny: the time goes to starting the instances)
        client.put_object(Bucket=bucket, Key=f"photos/{('cat', 'dog')[index % 2]}/{index}.jpg",
                          Body=image_bytes("JPEG", 8 + index, 8))
    runs = {name: subprocess.Popen(
        [sys.executable, "-m", "keras_pipe_launch", "prepare", f"s3://{bucket}/photos/", f"s3://{bucket}/prepared/",
         "--instance-count", "2", "--local", "--validation-fraction", "0.34", "--job-dir", str(tmp_path / name)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ("a", "b")}
    said = {name: run.communicate(timeout=wait_s(240)) for name, run in runs.items()}
    codes = {name: run.returncode for name, run in runs.items()}
    won = [name for name, code in codes.items() if code == 0]
    assert len(won) == 1, said
    (won,) = won
    (lost,) = set(runs) - {won}
    assert codes[lost] == 2, said
    assert re.search(rf"error: s3://{bucket}/prepared/ (already holds objects|was claimed by another prepare run)",
                     said[lost][1]), said[lost]
    assert not (tmp_path / lost).exists()  # (refused before it staged anything for its instances)

    # OUT: the winner's run (its plan, as its instances got it), complete, with its shards and reports only
    run = Plan.read(tmp_path / won / "algo-1/processing/input/plan/plan.json.gz").run
    state = state_of(client, bucket)
    assert (state["run"], state["state"]) == (run, "complete")
    keys = keys_under(client, bucket, "prepared/")
    shards = [key for key in keys if key.startswith(("prepared/train/", "prepared/validation/"))]
    assert shards and all(re.fullmatch(rf"prepared/(train|validation)/part-{run}-algo-[12]-\d{{5}}\.tfrecord", key)
                          for key in shards), keys
    assert sorted(set(keys) - set(shards)) == ["prepared/classes.json", "prepared/data_report.json",
                                               "prepared/plan/plan.json.gz", "prepared/prepare-run.json",
                                               "prepared/report.html", f"prepared/reports/{run}-algo-1.json.gz",
                                               f"prepared/reports/{run}-algo-2.json.gz"]
    # the examples the winner said it prepared are those in the shards, and those its instances reported
    told = re.search(r"prepare: (\d+) train and (\d+) validation examples of 2 classes in (\d+) shards", said[won][1])
    assert told, said[won]
    in_shards = collections.Counter()
    for key in shards:
        in_shards[key.split("/")[1]] += tfrecords_in(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    reported = collections.Counter()
    for host in ("algo-1", "algo-2"):
        header, *lines = map(json.loads, gzip.decompress(client.get_object(
            Bucket=bucket, Key=f"prepared/reports/{run}-{host}.json.gz")["Body"].read()).splitlines())
        assert (header["run"], header["host"]) == (run, host)
        for kind, part, *count in lines:
            reported[part] += count[-1] if kind == "count" else 0
    assert (in_shards["train"], in_shards["validation"], len(shards)) == tuple(map(int, told.groups()))
    assert reported == in_shards and in_shards.total() == 6


# --- reports that do not add up ------------------------------------------------------------------

PLAN = Plan("0a1b2c3d", ["algo-1", "algo-2"], "s3://b/photos/", ["cat", "dog"],
            {"cat/1.jpg": (0, "train"), "cat/2.jpg": (0, "validation"), "dog/3.jpg": (1, "train"),
             "dog/4.jpg": (1, "train")}, [("notes.txt", "not an image")])


def honest() -> dict[str, Report]:
    return {report_name("0a1b2c3d", "algo-1"): Report("0a1b2c3d", "algo-1", {"train": ["cat/1.jpg"], "validation": ["cat/2.jpg"]},
                                                {"train": {0: 1}, "validation": {0: 1}}, [], [],
                                                {"train": ["part-0a1b2c3d-algo-1-00000.tfrecord"],
                                                 "validation": ["part-0a1b2c3d-algo-1-00000.tfrecord"]},
                                                {"train": [1], "validation": [1]}),
            report_name("0a1b2c3d", "algo-2"): Report("0a1b2c3d", "algo-2", {"train": ["dog/3.jpg"], "validation": []},
                                                {"train": {1: 1}}, [("dog/4.jpg", "cannot decode")], ["dog/5.jpg"],
                                                {"train": ["part-0a1b2c3d-algo-2-00000.tfrecord"]}, {"train": [1]})}


STORED = {"train": {"part-0a1b2c3d-algo-1-00000.tfrecord", "part-0a1b2c3d-algo-2-00000.tfrecord"},
          "validation": {"part-0a1b2c3d-algo-1-00000.tfrecord"}}
A1, A2 = report_name("0a1b2c3d", "algo-1"), report_name("0a1b2c3d", "algo-2")


def tampered(change) -> tuple[dict, dict]:
    reports, stored = honest(), {part: set(names) for part, names in STORED.items()}
    change(reports, stored)
    return reports, stored


def setting(report: str, **fields):
    return lambda reports, stored: reports.__setitem__(report, dataclasses.replace(reports[report], **fields))


TAMPERED = {
    "invented counts": (setting(A1, counts={"train": {0: 5}, "validation": {0: 1}}),
                        r"algo-1's train counts per label \{0: 5\} are not those of the images it lists \(\{0: 1\}\)"),
    "a label beyond the classes": (setting(A2, counts={"train": {7: 1}}),
                                   r"algo-2's report: line 2 is not a report's line \(\['count', 'train', 7, 1\]\)"),
    "a validation key reported as train": (
        setting(A1, prepared={"train": ["cat/1.jpg", "cat/2.jpg"], "validation": []},
                counts={"train": {0: 2}}), "algo-1 reports s3://b/photos/cat/2.jpg in train; the plan has it in "
                                           "validation"),
    "a host beyond the job's": (lambda r, s: r.__setitem__(report_name("0a1b2c3d", "algo-99"),
                                                           dataclasses.replace(r[A2], host="algo-99")),
                                r"reports/0a1b2c3d-algo-99.json.gz is not the report of a host of this run"),
    "a report of another run": (lambda r, s: r.__setitem__(report_name("0a1b2c3e", "algo-1"), r[A1]),
                                "reports/0a1b2c3e-algo-1.json.gz is not the report of a host of this run"),
    "a report under another host's name": (setting(A2, host="algo-1"), "says it is algo-1's of run 0a1b2c3d"),
    "a host's report missing": (lambda r, s: r.pop(A2), "no report from algo-2"),
    "a key not in the plan": (setting(A2, prepared={"train": ["dog/3.jpg", "dog/9.jpg"]}),
                              "algo-2 reports s3://b/photos/dog/9.jpg, which is not an image of the plan"),
    "a key handled twice": (setting(A2, prepared={"train": ["dog/3.jpg", "cat/1.jpg"]}, counts={"train": {0: 1, 1: 1}}),
                            "s3://b/photos/cat/1.jpg was handled by both algo-1 and algo-2"),
    "a shard name with ../": (setting(A2, shards={"train": ["../../evil.tfrecord"]}),
                              r"algo-2 reports a shard ../../evil.tfrecord: not a name its shards have"),
    "another host's shard": (setting(A2, shards={"train": ["part-0a1b2c3d-algo-1-00000.tfrecord"]}),
                             "not a name its shards have"),
    "a shard that is not there": (lambda r, s: s["train"].discard("part-0a1b2c3d-algo-2-00000.tfrecord"),
                                  "algo-2 reports train/part-0a1b2c3d-algo-2-00000.tfrecord, which is not in the output"),
    "a stray object in train/": (lambda r, s: s["train"].add("part-00000.tfrecord"),
                                 r"train/ holds 1 objects no report lists \(e.g. part-00000.tfrecord\)"),
    "a planned image left out": (setting(A2, rejected=[]), "1 of the 4 planned images were handled by no instance "
                                                           r"\(s3://b/photos/dog/4.jpg\)"),
    "a planned image called unplanned": (setting(A2, unplanned=["dog/3.jpg"]), "as not in the plan; it is"),
    "shards that hold more than it prepared": (setting(A1, records={"train": [2], "validation": [1]}),
                                               "algo-1's train shards hold 2 examples, it prepared 1"),
    "another host's moved shard": (lambda r, s: s["train"].add("part-0a1b2c3d-algo-2-00000-moved.tfrecord"),
                                   r"train/ holds 1 objects no report lists \(e.g. part-0a1b2c3d-algo-2-00000-moved"),
}


def test_honest_reports_merge():
    merged = merge(PLAN, *tampered(lambda r, s: None))
    assert merged.counts == {"train": {0: 1, 1: 1}, "validation": {0: 1}}
    assert (merged.unplanned, merged.unplanned_count) == (["s3://b/photos/dog/5.jpg"], 1)
    assert sorted(merged.rejected) == [("s3://b/photos/dog/4.jpg", "cannot decode"),
                                       ("s3://b/photos/notes.txt", "not an image")]


@pytest.mark.parametrize("case", TAMPERED)
def test_reports_that_do_not_add_up_are_refused_naming_what(case):
    change, message = TAMPERED[case]
    with pytest.raises(PlanError, match=message):
        merge(PLAN, *tampered(change))


PRINT = Fingerprint(bytes(range(32)), 0x0123456789ABCDEF, 640, 480)
PRINTS = {A1: {"cat/1.jpg": PRINT, "cat/2.jpg": PRINT}, A2: {"dog/3.jpg": Fingerprint(b"\xff" * 32, None)}}


def fingerprinted(reports: dict, stored: dict) -> None:
    for name, prints in PRINTS.items():
        reports[name] = dataclasses.replace(reports[name], prints=dict(prints))


LOOKING = dataclasses.replace(PLAN, duplicates=4)  # (a plan that looks for duplicates)
PRINTS_TAMPERED = {
    "a prepared image's fingerprint left out": (
        setting(A1, prints={"cat/1.jpg": PRINT}), "algo-1 gives the fingerprints of 1 of the 2 images it prepared"),
    "a rejected image's fingerprint": (
        setting(A2, prints={"dog/3.jpg": PRINT, "dog/4.jpg": PRINT}),
        "algo-2 gives the fingerprint of s3://b/photos/dog/4.jpg, which it has not listed as prepared"),
    "another host's image's fingerprint": (
        setting(A2, prints={"dog/3.jpg": PRINT, "cat/1.jpg": PRINT}),
        "algo-2 gives the fingerprint of s3://b/photos/cat/1.jpg, which it has not listed as prepared"),
}


def test_fingerprints_merge_one_for_each_prepared_image_and_only_when_the_plan_asks():
    def merged(plan, *changes):
        def change(reports, stored):
            for one in changes:
                one(reports, stored)
        return merge(plan, *tampered(change))

    assert merged(LOOKING, fingerprinted).prints == {**PRINTS[A1], **PRINTS[A2]}
    with pytest.raises(PlanError, match="algo-1 gives the fingerprints of 0 of the 2 images it prepared; the plan "
                                        "looks for duplicates: one each"):
        merged(LOOKING)
    with pytest.raises(PlanError, match="algo-1 gives the fingerprints of 2 of the 2 images it prepared; the plan "
                                        "does not look for duplicates: none"):
        merged(PLAN, fingerprinted)
    for change, message in PRINTS_TAMPERED.values():
        with pytest.raises(PlanError, match=message):
            merged(LOOKING, fingerprinted, change)
    # lines as written, then each value's form checked as read
    header, *lines = dataclasses.replace(honest()[A1], prints=PRINTS[A1]).entries()
    assert lines[-1] == ["print", "cat/2.jpg", bytes(range(32)).hex(), "0123456789abcdef", 640, 480]
    for bad in (["print", "cat/1.jpg", "AB" * 32, None, None, None], ["print", "cat/1.jpg", "ab" * 31, None, None, None],
                ["print", "cat/1.jpg", "ab" * 32, "xyz", None, None], ["print", "cat/1.jpg", "ab" * 32, None, -1, 2],
                ["print", "cat/1.jpg", "ab" * 32, None, 2]):
        merger = Merger(LOOKING, [A1, A2], STORED)
        with pytest.raises(PlanError, match=r"line \d+ is not a report's line \(\['print'"):
            merger.add(A1, [header, *lines[:-2], bad])
    with pytest.raises(PlanError, match="algo-1 gives the fingerprint of s3://b/photos/cat/2.jpg twice"):
        Merger(LOOKING, [A1, A2], STORED).add(A1, [header, *lines, lines[-1]])


def test_a_shard_is_cut_only_if_it_holds_the_records_its_report_says(s3_bucket):
    """prepare.moves cuts a validation shard by its report's record count: a shard with more or fewer
    records, or bytes that are no TFRecords, is refused, naming it, and nothing is written; one that
    holds them is cut, the others' bytes kept in order."""
    from keras_pipe_launch.prepare import moves
    from pipemode.tfrecord import encode

    client, bucket = s3_bucket
    name = "part-0a1b2c3d-algo-1-00000.tfrecord"

    def merged_with(keys: list[str]):
        merged = merge(LOOKING, *tampered(fingerprinted))
        merged.in_shards[name] = keys  # (as if the instance had put three images in its validation shard)
        return merged

    for body, message in ((encode([b"a", b"b"]), "holds 2 records; its instance reported 1"),
                          (encode([b"a"])[:-1], "cannot be split into its records"),
                          (encode([b"a"]) + b"\0" * 20, "cannot be split into its records")):
        client.put_object(Bucket=bucket, Key=f"out/validation/{name}", Body=body)
        with pytest.raises(PlanError, match=f"s3://{bucket}/out/validation/{name} {message}"):
            moves.move_to_train(client, merged_with(["cat/2.jpg"]), ["cat/2.jpg"], bucket, "out/",
                                {"validation": {name}})
        assert not client.list_objects_v2(Bucket=bucket, Prefix="out/train/").get("KeyCount")
    client.put_object(Bucket=bucket, Key=f"out/validation/{name}", Body=encode([b"one", b"two", b"three"]))
    merged = merged_with(["cat/1b.jpg", "cat/2.jpg", "cat/3b.jpg"])
    moves.move_to_train(client, merged, ["cat/2.jpg"], bucket, "out/", {"validation": {name}})
    stored = {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
              for o in client.list_objects_v2(Bucket=bucket, Prefix="out/")["Contents"]}
    assert stored == {"out/train/part-0a1b2c3d-algo-1-00000-moved.tfrecord": encode([b"two"]),
                      "out/validation/part-0a1b2c3d-algo-1-00000-kept.tfrecord": encode([b"one", b"three"])}
    assert merged.shards == {"train": ["part-0a1b2c3d-algo-1-00000.tfrecord", "part-0a1b2c3d-algo-2-00000.tfrecord",
                                       "part-0a1b2c3d-algo-1-00000-moved.tfrecord"],
                             "validation": ["part-0a1b2c3d-algo-1-00000-kept.tfrecord"]}
    # a merge again (--finish) finds the move done; what no move made is refused
    again = merged_with(["cat/1b.jpg", "cat/2.jpg", "cat/3b.jpg"])
    done = {"train": {"part-0a1b2c3d-algo-1-00000-moved.tfrecord"}, "validation": {kept := moves.kept_shard(name)}}
    moves.move_to_train(client, again, ["cat/2.jpg"], bucket, "out/", done)
    assert again.shards == merged.shards
    for moving, stored, message in (
            ([], done, "validation/part-0a1b2c3d-algo-1-00000.tfrecord is gone"),
            (["cat/2.jpg"], {"train": set(), "validation": {kept}}, "is gone, and what it held is not in"),
            ([], {"validation": {name, kept}}, "the output holds what a merge made of validation/part-0a1b2c3d")):
        with pytest.raises(PlanError, match=message):
            moves.move_to_train(client, merged_with(["cat/1b.jpg", "cat/2.jpg", "cat/3b.jpg"]), moving, bucket,
                                "out/", stored)


def report_lines(*lines, end: bytes = b"") -> bytes:
    return gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode() + end)


def test_a_report_is_read_line_by_line_each_line_as_an_instance_writes_it(tmp_path):
    for report in honest().values():
        report.write(tmp_path)
    files = {name: (tmp_path / name).read_bytes() for name in honest()}

    def merged(reports: dict[str, bytes]):
        merger = Merger(PLAN, reports, STORED)
        for name, data in sorted(reports.items()):
            merger.add(name, read_entries(io.BytesIO(data), f"algo-N's report {name}"))
        return merger.result()

    assert merged(files) == merge(PLAN, *tampered(lambda r, s: None))
    header, *lines = honest()[A1].entries()
    cases = {
        "is not a gzip file": b"{}",
        "is not a gzip file, or a damaged or truncated one": files[A1][:-12],
        # 64 KB that expands to 64 MB on one line: refused once a line is longer than any report's
        "line 1 is longer than any line of a report": gzip.compress(b"[" + b" " * (64 << 20) + b"]\n"),
        r"line 1 is not JSON text \(RecursionError\)": gzip.compress(b"[" * 10_000 + b"]" * 10_000 + b"\n"),
        r"line 1 is not JSON text \(JSONDecodeError\)": gzip.compress(b'{"run": "0a1b2c3d",\n'),
        "line 2 is cut short": report_lines(header, end=b'["count", "train", 0, 1]'),
        "line 2 is not a line as an instance writes it": report_lines(header, end=b'["count",  "train", 0, 1]\n'),
        "does not start as a report does": report_lines({**header, "cpu_seconds": 3}, *lines),
        "is a report of version 1, not 3": report_lines({**header, "version": 1}, *lines),
        r"line 2 is not a report's line \(\['count', 'test', 0, 1\]\)": report_lines(header, ["count", "test", 0, 1]),
        "line 2 is not a report's line": report_lines(header, ["rejected", "cat/1.jpg", "x" * 501]),
        "line 3 is not a report's line": report_lines(header, *lines[:1], ["prepared", "train"]),
        "counts its train examples of class 0 twice": report_lines(header, *lines[:1], *lines[:1]),
        "names more unplanned objects than its report counts": report_lines(header, ["unplanned", "cat/9.jpg"]),
        "reports s3://b/photos/cat/1.jpg twice": report_lines(header, ["prepared", "train", "cat/1.jpg"],
                                                             ["prepared", "train", "cat/1.jpg"]),
    }
    for message, data in cases.items():
        with pytest.raises(PlanError, match=message):
            merged({**files, A1: data})


def planned_run(client, bucket: str, images: int, out: str = "prepared/") -> tuple[RunState, Plan]:
    """OUT as a run of 2 hosts leaves it once its plan is written: its state (claimed) and its plan."""
    plan = Plan("0a1b2c3d", ["algo-1", "algo-2"], f"s3://{bucket}/photos/", ["cat", "dog"],
                {f"{('cat', 'dog')[i % 2]}/{i:06d}.jpg": (i % 2, "train") for i in range(images)}, [])
    state = RunState(plan.run, plan.source, f"s3://{bucket}/{out}", 2, "local", 0.1, False)
    state.claim(client)
    write_plan(plan, client, state.out)
    return state, plan


def put_reports(client, bucket: str, plan: Plan, data: bytes, out: str = "prepared/") -> None:
    for host in plan.hosts:
        client.put_object(Bucket=bucket, Key=f"{out}reports/{report_name(plan.run, host)}", Body=data)


def test_a_report_that_cannot_be_parsed_is_a_clean_error_naming_its_instance_and_finish_cleans_up(s3_bucket):
    client, bucket = s3_bucket
    state, plan = planned_run(client, bucket, 4)
    nested = gzip.compress(b"[" * 200_000 + b"]" * 200_000)  # (a few hundred bytes: far under any size limit)
    put_reports(client, bucket, plan, nested)
    with pytest.raises(PrepareError, match=r"algo-1's report .* is marked incomplete; `keras-pipe prepare --finish"):
        merged_or_incomplete(plan, state)
    assert state_of(client, bucket)["state"] == "incomplete"
    out = launch_cli("prepare", "--finish", f"s3://{bucket}/prepared/")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "algo-1's report" in out.stderr and "which can be used again" in out.stderr, out.stderr
    assert not keys_under(client, bucket, "prepared/")


def test_a_report_costs_no_more_memory_than_its_lines_honestly_take(s3_bucket):
    """A plan of 20,000 images, and a report forged to hold 20 MB of JSON (a 1,000-character reason
    for each image: more than the whole plan could honestly produce, though under the bound a
    report once had): refused as soon as a line is more than an honest one, in a few MB."""
    import tracemalloc

    def peak_of_merging(state: RunState, plan: Plan) -> tuple[int, str]:
        tracemalloc.start()  # (moto's server runs in this process: what it allocates is counted too)
        try:
            with pytest.raises(PrepareError) as refused:
                merged_or_incomplete(plan, state)
            return tracemalloc.get_traced_memory()[1], str(refused.value)
        finally:
            tracemalloc.stop()

    client, bucket = s3_bucket
    # what the merge costs beside any report (an S3 client, the requests, moto's side of them)
    small, plan = planned_run(client, bucket, 4, "small/")
    put_reports(client, bucket, plan, report_lines({"format": "keras-pipe prepare report"}), "small/")
    baseline, _ = peak_of_merging(small, plan)
    state, plan = planned_run(client, bucket, 20_000)
    forged = {"run": plan.run, "host": "algo-1", "prepared": {}, "counts": {},
              "rejected": [[key, "x" * 1000] for key in plan.items], "unplanned": [], "shards": {}}
    text = json.dumps(forged).encode()
    assert len(text) > 20_000_000
    put_reports(client, bucket, plan, gzip.compress(text))
    peak, said = peak_of_merging(state, plan)
    assert peak - baseline < 2_000_000, f"+{(peak - baseline) / 1e6:.1f} MB to read a report of {len(text) / 1e6:.1f} MB"
    assert "algo-1's report" in said


def test_an_instance_keeps_only_its_share_of_the_plan(tmp_path):
    PLAN.write(tmp_path / "plan.json.gz")
    assert Plan.read(tmp_path / "plan.json.gz") == PLAN
    share = Plan.read(tmp_path / "plan.json.gz", keep={"dog/3.jpg", "notes.txt"}.__contains__)
    assert (share.items, share.rejected, share.run, share.hosts) == (
        {"dog/3.jpg": (1, "train")}, [("notes.txt", "not an image")], "0a1b2c3d", ["algo-1", "algo-2"])


@pytest.mark.parametrize("change, said", [
    (lambda header, lines: header.update(hosts=["algo-1", "../algo-2"]), "its hosts are not algo-1 to algo-N"),
    (lambda header, lines: header.update(hosts=[]), "its hosts are not algo-1 to algo-N"),
    (lambda header, lines: header.update(run="../0a1b"), "its run id is not one"),
    (lambda header, lines: header.update(source="/etc/"), "its source is not an s3:// prefix"),
    (lambda header, lines: header.update(classes="cat,dog"), "its classes are not a list of names"),
    (lambda header, lines: lines.__setitem__(0, ["cat/1.jpg", 2, "train"]), "an image's key, label or part is not one"),
    (lambda header, lines: lines.__setitem__(0, ["cat/1.jpg", True, "train"]), "an image's key, label or part"),
    (lambda header, lines: lines.__setitem__(0, ["cat/1.jpg", 0, "test"]), "an image's key, label or part"),
    (lambda header, lines: lines.__setitem__(4, ["notes.txt", 3]), "a refused file's key or reason is not text"),
    (lambda header, lines: header.update(items=9), "cannot read the plan"),  # (past its end)
])
def test_a_plan_read_back_is_refused_naming_what_is_wrong_with_it(change, said, tmp_path):
    """--finish and every instance read the plan back (from S3, or as the container was given it):
    an edited one must not name hosts, labels or parts a plan cannot have."""
    PLAN.write(tmp_path / "plan.json.gz")
    with gzip.open(tmp_path / "plan.json.gz", "rt") as f:
        header, *lines = map(json.loads, f)
    change(header, lines)
    with gzip.open(tmp_path / "plan.json.gz", "wt") as f:
        f.writelines(json.dumps(line) + "\n" for line in [header, *lines])
    with pytest.raises(PlanError, match=said):
        Plan.read(tmp_path / "plan.json.gz")


# --- what an instance leaves behind --------------------------------------------------------------

def test_untrusted_files_are_never_followed_nor_read_whole(tmp_path):
    (tmp_path / "big").write_bytes(b"x" * 100_000)
    assert untrusted.read_text(tmp_path / "big", 10) == "x" * 10 + "\n[... cut at 10 bytes]"
    (tmp_path / "zero").symlink_to("/dev/zero")
    assert untrusted.read_text(tmp_path / "zero") == "[zero is a symbolic link: not read]"
    os.mkfifo(tmp_path / "fifo")
    assert untrusted.read_text(tmp_path / "fifo") == "[fifo is not a regular file: not read]"  # (without blocking)
    assert untrusted.read_text(tmp_path / "absent") is None
    (tmp_path / "escape").write_bytes(b"bad \x1b[2J\x07 name\nline 2")
    assert untrusted.read_text(tmp_path / "escape") == "bad \\x1b[2J\\x07 name\nline 2"


@pytest.mark.slow
@pytest.mark.parametrize("act, said", [
    ("link-file:{secret}", r"processing/output/train/stolen is a symbolic link \(to .*/\.ssh/id_rsa\): refused"),
    ("link-folder:{home}", "processing/output is not a folder"),
    ("zero-message", "failed with exit code 1: [message is a symbolic link: not read]"),
    ("fifo-message", "failed with exit code 1: [message is not a regular file: not read]"),
    # a regular file, but where it would land in OUT: its plan, another run's or host's shards
    ("extra-file:plan/plan.json.gz", "left processing/output/plan/plan.json.gz, which is not one of its own shards "
                                     "or its report: nothing was uploaded"),
    ("extra-file:train/part-00000.tfrecord", "left processing/output/train/part-00000.tfrecord, which is not"),
])
def test_what_a_container_leaves_is_never_uploaded_through_a_link_nor_read_whole(
        act, said, photos, tmp_path, s3_bucket, monkeypatch, capsys):
    root, _ = photos
    client, bucket = s3_bucket
    upload_folder(client, bucket, root, "photos/")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE KEY")
    secret = home / ".ssh" / "id_rsa"
    monkeypatch.setenv("LAUNCH_ENGINE", f"{sys.executable} {HERE / 'hostile_engine.py'}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    with pytest.raises(PrepareError) as raised:
        prepare_locally(f"s3://{bucket}/photos/", f"s3://{bucket}/prepared/", instance_count=2,
                        job_dir=tmp_path / "jobs", image=act.format(secret=secret, home=home))
    shown = f"{raised.value}\n{capsys.readouterr().out}"
    assert said in shown or re.search(said, shown), shown
    assert not keys_under(client, bucket, "prepared/train/") and not keys_under(client, bucket, "prepared/validation/")
    uploaded = b"".join(client.get_object(Bucket=bucket, Key=k)["Body"].read()
                        for k in keys_under(client, bucket, "prepared/"))
    assert b"PRIVATE KEY" not in uploaded
    assert state_of(client, bucket)["state"] == "incomplete"


def test_a_missing_container_engine_is_said_before_anything_is_written(photos, tmp_path, s3_bucket):
    client, bucket = s3_bucket
    env = {**os.environ, "LAUNCH_ENGINE": "no-such-engine-here"}
    out = launch_cli("prepare", f"s3://{bucket}/photos/", f"s3://{bucket}/prepared/", "--instance-count", "2",
                     "--local", "--image", "any", "--job-dir", str(tmp_path / "jobs"), env=env)
    assert out.returncode == 2 and "no container engine 'no-such-engine-here'" in out.stderr, out.stderr
    assert not keys_under(client, bucket, "prepared/")
    root, _ = photos
    out = subprocess.run([sys.executable, "-m", "keras_pipe_launch", "local", "--train", str(root), "--image", "any",
                          "--hp", "num_classes=10", "--engine", "no-such-engine-here", "--job-dir", str(tmp_path / "job")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no container engine 'no-such-engine-here'" in out.stderr, out.stderr
    assert not (tmp_path / "job").exists()


# --- interruptions, and --finish -----------------------------------------------------------------

@pytest.mark.slow
def test_ctrl_c_during_local_instances_is_an_interruption_and_finish_then_frees_out(photos, tmp_path, s3_bucket):
    root, _ = photos
    client, bucket = s3_bucket
    upload_folder(client, bucket, root, "photos/")
    # each instance in a "container" of hostile_engine.py that holds it, once it has done its share, until it is
    # stopped: the Ctrl-C always comes while both run (sent after a fixed sleep instead, it came after the end
    # on a machine quick enough to prepare 200 images in that time)
    command = [sys.executable, "-m", "keras_pipe_launch", "prepare", f"s3://{bucket}/photos/",
               f"s3://{bucket}/prepared/", "--instance-count", "2", "--local", "--image", "hold",
               "--job-dir", str(tmp_path / "jobs")]
    job = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO),
                                "LAUNCH_ENGINE": f"{sys.executable} {HERE / 'hostile_engine.py'}"})
    lines, held = [], set()
    for line in job.stdout:
        lines.append(line)
        if " | hold: " in line:
            held.add(line.split(" | ", 1)[0])
            if held == {"algo-1", "algo-2"}:
                break
    assert held == {"algo-1", "algo-2"}, "".join(lines)
    job.send_signal(signal.SIGINT)
    rest, _ = job.communicate(timeout=120)
    shown = "".join(lines) + rest
    assert job.returncode == 130, shown
    assert "interrupted: " in shown and "its dataset unfinished" in shown and "failed with exit code" not in shown, shown
    # (both instances had done their share: nothing of it was uploaded)
    assert not keys_under(client, bucket, "prepared/train/") and not keys_under(client, bucket, "prepared/validation/")
    state = state_of(client, bucket)
    assert (state["state"], state["reason"]) == ("incomplete", "interrupted"), state
    out = launch_cli("prepare", "--finish", f"s3://{bucket}/prepared/")
    assert out.returncode == 1 and "which can be used again" in out.stderr, out.stderr
    assert not keys_under(client, bucket, "prepared/")


# Python, started as a terminal starts a foreground job: SIGINT unblocked and at its default action,
# which Python turns into KeyboardInterrupt. A process that starts with SIGINT ignored keeps ignoring
# it (a shell's background job), and this test's worker was seen to hand that on: in the full suite
# (2 of 2 runs), never alone, something run before in the same worker leaves SIGINT ignored
# (reproduced by ignoring it around this test; what leaves it so was not found).
AS_FOREGROUND_JOB = [sys.executable, "-c", "import os, signal, sys; signal.pthread_sigmask(signal.SIG_UNBLOCK, "
                     "[signal.SIGINT]); signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.executable, "
                     "[sys.executable, *sys.argv[1:]])"]


@pytest.mark.slow
def test_ctrl_c_while_the_shares_are_staged_says_that_out_is_incomplete_and_how_to_free_it(s3_bucket, tmp_path):
    client, bucket = s3_bucket
    for index in range(400):  # (tiny objects, but enough that staging them takes a while)
        client.put_object(Bucket=bucket, Key=f"photos/{('cat', 'dog')[index % 2]}/{index:03d}.jpg", Body=b"x")
    command = [*AS_FOREGROUND_JOB, "-m", "keras_pipe_launch", "prepare", f"s3://{bucket}/photos/",
               f"s3://{bucket}/prepared/", "--instance-count", "2", "--local", "--job-dir", str(tmp_path / "jobs")]
    job = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
    staging = tmp_path / "jobs" / "algo-1" / "processing" / "input" / "source"
    deadline = time.monotonic() + 120
    while not staging.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    job.send_signal(signal.SIGINT)
    shown, _ = job.communicate(timeout=120)
    assert job.returncode == 130, shown
    assert "algo-2: " not in shown, shown  # (stopped while staging: no instance had started)
    assert (f"interrupted: s3://{bucket}/prepared/ is marked incomplete, its dataset unfinished; `keras-pipe "
            f"prepare --finish s3://{bucket}/prepared/` merges it if its instances had all finished") in shown, shown
    state = state_of(client, bucket)
    assert (state["state"], state["reason"]) == ("incomplete", "interrupted"), state
    out = launch_cli("prepare", "--finish", f"s3://{bucket}/prepared/")
    assert out.returncode == 1 and "which can be used again" in out.stderr, out.stderr


@pytest.mark.slow
def test_finish_merges_a_run_that_ended_unfollowed_and_refuses_one_tampered_with(photos, tmp_path, s3_bucket):
    root, _ = photos
    client, bucket = s3_bucket
    upload_folder(client, bucket, root, "photos/")
    client.put_object(Bucket=bucket, Key="photos/digit1/\x1b[2Jcleared.txt", Body=b"a terminal's escape in a key")
    # (no duplicates looked for: a merge that moved some cannot be merged again, test_prepare_duplicates)
    result = prepare_locally(f"s3://{bucket}/photos/", f"s3://{bucket}/prepared/", instance_count=2,
                             job_dir=tmp_path / "jobs", validation_fraction=0.2, duplicate_distance=None)
    out = launch_cli("prepare", "--finish", f"s3://{bucket}/prepared/")
    assert out.returncode == 0 and "is complete already" in out.stderr, out.stderr
    # as if the command had stopped following before the merge: --finish merges
    state = run_state.read(client, f"s3://{bucket}/prepared/")
    state.save(client, run_state.RUNNING)
    client.delete_object(Bucket=bucket, Key="prepared/classes.json")
    out = launch_cli("prepare", "--finish", f"s3://{bucket}/prepared/")
    assert out.returncode == 0, out.stderr
    assert f"prepare: {result['train']} train and {result['validation']} validation examples" in out.stderr
    assert "\x1b" not in out.stderr and "\\x1b[2Jcleared.txt" in out.stderr  # (rejected: not an image)
    assert state_of(client, bucket)["state"] == "complete" and keys_under(client, bucket, "prepared/classes.json")
    # a stray shard in train/ (the channel would read it): not merged, and the run removed
    state = run_state.read(client, f"s3://{bucket}/prepared/")
    state.save(client, run_state.RUNNING)
    client.put_object(Bucket=bucket, Key="prepared/train/part-00000.tfrecord", Body=b"stray")
    out = launch_cli("prepare", "--finish", f"s3://{bucket}/prepared/")
    assert out.returncode == 1, out.stderr
    assert "train/ holds 1 objects no report lists (e.g. part-00000.tfrecord)" in out.stderr
    assert keys_under(client, bucket, "prepared/") == ["prepared/train/part-00000.tfrecord"]
    assert "1 other objects are still there" in out.stderr


@pytest.mark.slow
def test_finish_works_only_on_the_output_its_state_names_and_never_under_a_live_run(s3_bucket):
    client, bucket = s3_bucket
    state = RunState("0123abcd", f"s3://{bucket}/photos/", f"s3://{bucket}/original/", 2, "local", 0.1, False)
    state.claim(client)
    # a state copied (or edited) to another prefix must not make --finish merge into or delete from the first
    body = client.get_object(Bucket=bucket, Key="original/prepare-run.json")["Body"].read()
    client.put_object(Bucket=bucket, Key="copied/prepare-run.json", Body=body)
    out = launch_cli("prepare", "--finish", f"s3://{bucket}/copied/")
    assert out.returncode == 2 and "cannot be this output's run state: it names another output" in out.stderr, out.stderr
    # the command that started the run still runs here: --finish waits for it
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state.launcher = {"host": socket.gethostname(), "pid": sleeper.pid}
        state.save(client, run_state.RUNNING, ended=False)
        out = launch_cli("prepare", "--finish", f"s3://{bucket}/original/")
        assert out.returncode == 2 and f"still runs (pid {sleeper.pid})" in out.stderr, out.stderr
    finally:
        sleeper.kill()
        sleeper.wait()
    # ... or ran on another machine, which this one cannot see
    state.launcher = {"host": "another-machine", "pid": 12345}
    state.save(client, run_state.RUNNING, ended=False)
    out = launch_cli("prepare", "--finish", f"s3://{bucket}/original/")
    assert out.returncode == 2 and "was started on another-machine" in out.stderr, out.stderr
    assert keys_under(client, bucket, "original/") == ["original/prepare-run.json"]  # nothing removed
    # once that command is gone, the run (which never wrote a plan) is removed
    state.save(client, run_state.RUNNING)
    out = launch_cli("prepare", "--finish", f"s3://{bucket}/original/")
    assert out.returncode == 1 and "its plan cannot be read" in out.stderr, out.stderr
    assert not keys_under(client, bucket, "original/")
    # and the command that had it, were it still going, could not write there any more
    with pytest.raises(run_state.RunStateError, match="run 0123abcd no longer owns .*/original/"):
        state.save(client, run_state.COMPLETE)
    assert not keys_under(client, bucket, "original/")


@pytest.mark.parametrize("field, value, said", [
    ("launcher", {"host": "here", "pid": "12345; rm -rf /"}, "its launcher is not a host name and a process id"),
    ("launcher", {"pid": 12345}, "its launcher is not a host name and a process id"),
    ("launcher", ["here", 12345], "its launcher is not a host name and a process id"),
    ("reason", {"why": "not text"}, "its reason or start time is not text"),
    ("started", 1700000000, "its reason or start time is not text"),
    ("instance_count", "2", "its instance count is not one"),
    ("validation_fraction", 1.5, "its validation fraction or strict flag is not one"),
    ("strict", "yes", "its validation fraction or strict flag is not one"),
    ("source", "/home/someone/", "its source is not an s3:// prefix"),
])
def test_a_state_file_whose_values_have_the_wrong_type_is_refused_naming_which(field, value, said, s3_bucket):
    client, bucket = s3_bucket
    state = RunState("0123abcd", f"s3://{bucket}/photos/", f"s3://{bucket}/out/", 2, "local", 0.1, False)
    body = json.loads(state.body()) | {field: value}
    client.put_object(Bucket=bucket, Key="out/prepare-run.json", Body=json.dumps(body).encode())
    with pytest.raises(run_state.RunStateError, match=f"cannot be this output's run state: {said}"):
        run_state.read(client, f"s3://{bucket}/out/")


@pytest.mark.slow
def test_a_failed_upload_is_said_in_a_line_not_a_traceback(photos, tmp_path, s3_bucket, monkeypatch):
    """boto3's upload_file says a failed upload as S3UploadFailedError, which is none of botocore's
    errors: here a bucket that is not there (or no longer there, once the instances have run)."""
    root, _ = photos
    client, bucket = s3_bucket
    out = launch_cli("prepare", str(root), str(tmp_path / "out"), "--upload", f"s3://{bucket}-gone/datasets/")
    assert out.returncode == 1, out.stderr
    assert out.stderr.splitlines()[-1].startswith("keras-pipe prepare: upload failed: Failed to upload "), out.stderr
    assert "NoSuchBucket" in out.stderr and "Traceback" not in out.stderr, out.stderr
    # at scale, each instance's output uploaded once the instances have run: the bucket went meanwhile
    upload_folder(client, bucket, root, "photos/")
    monkeypatch.setenv("LAUNCH_ENGINE", f"{sys.executable} {HERE / 'hostile_engine.py'}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    with pytest.raises(PrepareError, match=rf"cannot upload .* to s3://{bucket}/prepared/.*NoSuchBucket"):
        prepare_locally(f"s3://{bucket}/photos/", f"s3://{bucket}/prepared/", instance_count=1,
                        job_dir=tmp_path / "jobs", image=f"drop-bucket:{bucket}")


def test_a_command_that_lost_its_out_writes_nothing_more_there(s3_bucket):
    client, bucket = s3_bucket
    mine = RunState("0123abcd", f"s3://{bucket}/photos/", f"s3://{bucket}/out/", 2, "local", 0.1, False)
    mine.claim(client)
    mine.save(client, run_state.RUNNING, ended=False)  # (its own writes follow one another)
    other = run_state.read(client, f"s3://{bucket}/out/")  # (as --finish reads it, then writes)
    other.save(client, run_state.INCOMPLETE, "finished by another command")
    with pytest.raises(run_state.RunStateError, match="was changed or removed by another command"):
        mine.save(client, run_state.COMPLETE)
    assert run_state.read(client, f"s3://{bucket}/out/").reason == "finished by another command"


def test_a_run_that_fails_while_planning_leaves_out_as_it_was(s3_bucket, tmp_path):
    client, bucket = s3_bucket
    client.put_object(Bucket=bucket, Key="flat/not-in-a-class-folder.jpg", Body=b"x")
    with pytest.raises(PrepareError):
        prepare_locally(f"s3://{bucket}/flat/", f"s3://{bucket}/prepared/", instance_count=2, job_dir=tmp_path / "j")
    assert not keys_under(client, bucket, "prepared/")  # neither claimed nor planned: free for the next try


def test_sigterm_or_a_closed_terminal_stop_the_follower_as_ctrl_c_does():
    script = ("import sys, time\nfrom keras_pipe_launch.common.processes import stopped_by_any_signal\n"
              "try:\n    with stopped_by_any_signal():\n        print('following', flush=True); time.sleep(60)\n"
              "except KeyboardInterrupt as stop:\n    print('stopped by', stop); sys.exit(130)\n")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        job = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert job.stdout.readline() == "following\n"
        job.send_signal(sig)
        out, _ = job.communicate(timeout=30)
        assert (job.returncode, out) == (130, f"stopped by {sig.name}\n")
