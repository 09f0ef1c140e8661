"""What the launcher prints and writes never carries the control characters of text it does not
control: S3 keys and local file names (a terminal's escape codes, line breaks), what a report or a
state file says, the errors that echo them. Each is said as common.untrusted.shown() writes it
(`\\x1b[31m`, `\\n`), so a key cannot recolour or clear the terminal, nor forge a line of
rejected.txt or of the command's output."""

import csv
import json
import time

import pytest

from keras_pipe_launch.prepare import run_state
from keras_pipe_launch.prepare.plan import Plan, PlanError
from keras_pipe_launch.prepare.reports import Report, merge, report_name
from keras_pipe_launch.prepare.run_state import RunState
from tests.conftest import image_bytes
from tests.launcher.conftest import launch_cli

NAME = "bad\x1b[31m\nname"  # a terminal's escape code and a line break, as a file name or key may hold
SHOWN = "bad\\x1b[31m\\nname"  # ... as the launcher says it
# moto's server cannot route a key with a line feed (real S3 stores one): a carriage return, which
# sends a terminal back to the line's start (and splits lines as much), stands for it in S3
KEY = "bad\x1b[31m\rname"
SHOWN_KEY = "bad\\x1b[31m\\rname"


def assert_escaped(text: str, *said: str) -> None:
    """No raw escape code nor the line break of NAME or KEY in `text`, and each of `said` in it."""
    assert "\x1b" not in text, text
    assert "[31m\n" not in text and "[31m\r" not in text, text  # (even with the escape code escaped)
    for part in said:
        assert part in text, f"{part!r} not in:\n{text}"


def jpeg(index: int) -> bytes:
    return image_bytes("JPEG", 8 + index, 8)


@pytest.mark.slow
def test_prepare_on_one_machine_says_file_names_labels_and_out_escaped(tmp_path):
    """A CSV whose files' names hold escape codes and line breaks and one of whose labels (a class name)
    holds an escape code, into an OUT whose name holds one too."""
    folder = tmp_path / "images"
    folder.mkdir()
    rows = []
    for index, label in enumerate(["plain"] * 3 + ["red\x1b7"] * 3):
        (folder / f"{index}.jpg").write_bytes(jpeg(index))
        rows.append([f"images/{index}.jpg", label])
    (folder / f"{NAME}.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (folder / f"{NAME}.txt").write_text("not an image")
    rows += [[f"images/{NAME}.jpg", "plain"], [f"images/{NAME}.txt", "plain"], [f"images/gone-{NAME}.jpg", "plain"]]
    with open(tmp_path / "labels.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    out_dir = tmp_path / "prepared\x1b[2J"

    out = launch_cli("prepare", str(tmp_path / "labels.csv"), str(out_dir))
    assert out.returncode == 0, out.stderr
    assert_escaped(out.stdout + out.stderr,
                   "REJECTED 3 of 9 files", f"images/{SHOWN}.jpg: the file", f"images/{SHOWN}.txt: not an image file",
                   f"images/gone-{SHOWN}.jpg: unreadable", "prepared\\x1b[2J/rejected.txt",
                   "classes plain, red\\x1b7 have too few images",  # (the CSV's labels are the class names)
                   f"shards under {tmp_path}/prepared\\x1b[2J; train with --hp 'class_names=plain,red\\x1b7'")
    rejected = (out_dir / "rejected.txt").read_text()
    assert_escaped(rejected, f"images/{SHOWN}.jpg\t", f"images/{SHOWN}.txt\t")
    assert len(rejected.splitlines()) == 3 and all(line.count("\t") == 1 for line in rejected.splitlines())


@pytest.mark.slow
def test_prepare_at_scale_says_and_lists_keys_escaped(s3_bucket, tmp_path):
    client, bucket = s3_bucket
    for index in range(4):
        client.put_object(Bucket=bucket, Key=f"photos/{('cat', 'dog')[index % 2]}/{index}.jpg", Body=jpeg(index))
    client.put_object(Bucket=bucket, Key=f"photos/cat/{KEY}.jpg", Body=b"\xff\xd8\xff\xe0 not really a jpeg")
    client.put_object(Bucket=bucket, Key=f"photos/dog/{KEY}.txt", Body=b"not an image")
    # a key File mode cannot stage (an empty path segment): refused, naming it, before anything runs
    client.put_object(Bucket=bucket, Key=f"photos/cat//{KEY}.jpg", Body=jpeg(9))
    command = ["prepare", f"s3://{bucket}/photos/", f"s3://{bucket}/prepared/", "--instance-count", "1", "--local",
               "--validation-fraction", "0.5"]
    out = launch_cli(*command, "--job-dir", str(tmp_path / "refused"))
    assert out.returncode == 2, out.stderr
    assert_escaped(out.stdout + out.stderr, f"object s3://{bucket}/photos/cat//{SHOWN_KEY}.jpg cannot be staged")
    assert not client.list_objects_v2(Bucket=bucket, Prefix="prepared/").get("KeyCount")

    client.delete_object(Bucket=bucket, Key=f"photos/cat//{KEY}.jpg")
    out = launch_cli(*command, "--job-dir", str(tmp_path / "jobs"))
    assert out.returncode == 0, out.stderr
    # rejected at the listing (not an image by its name) and by the instance (its report's keys)
    assert_escaped(out.stdout + out.stderr, "REJECTED 2 of 6 files", f"s3://{bucket}/photos/cat/{SHOWN_KEY}.jpg: the file",
                   f"s3://{bucket}/photos/dog/{SHOWN_KEY}.txt: not an image file")
    rejected = client.get_object(Bucket=bucket, Key="prepared/rejected.txt")["Body"].read().decode()
    assert_escaped(rejected, f"s3://{bucket}/photos/cat/{SHOWN_KEY}.jpg\t", f"s3://{bucket}/photos/dog/{SHOWN_KEY}.txt\t")
    assert len(rejected.splitlines()) == 2


def test_local_says_a_channel_file_name_escaped(tmp_path):
    train = tmp_path / "train"
    train.mkdir()
    (train / "part-0.tfrecord").write_bytes(b"")
    (train / f"{NAME}.tfrecord").symlink_to(tmp_path / "gone\x1b[2J")
    out = launch_cli("local", "--train", str(train), "--hp", "num_classes=2", "--job-dir", str(tmp_path / "job"))
    assert out.returncode == 2, out.stderr
    assert_escaped(out.stdout + out.stderr,
                   f"error: {train}/{SHOWN}.tfrecord is a dangling symbolic link (to '{tmp_path}/gone\\x1b[2J')")
    assert not (tmp_path / "job").exists()


def test_what_a_report_or_a_state_file_says_is_said_escaped(s3_bucket):
    # an instance's report (its content: untrusted) naming another host
    plan = Plan("r1", ["algo-1"], "s3://b/photos/", ["cat", "dog"], {"cat/1.jpg": (0, "train")}, [])
    report = Report("r1", f"algo-1{NAME}", {"train": ["cat/1.jpg"]}, {"train": {0: 1}}, [], [], {}, {})
    with pytest.raises(PlanError) as raised:
        merge(plan, {report_name("r1", "algo-1"): report}, {})
    assert_escaped(str(raised.value), f"says it is algo-1{SHOWN}'s of run r1")

    # OUT's state file, with a field no state has (Python's error names it) ...
    client, bucket = s3_bucket
    state = RunState("0123abcd", f"s3://{bucket}/photos/", f"s3://{bucket}/out/", 2, "local", 0.1, False,
                     started=f"today{NAME}")
    body = json.loads(state.body()) | {f"field{NAME}": 1}
    client.put_object(Bucket=bucket, Key="out/prepare-run.json", Body=json.dumps(body).encode())
    out = launch_cli("prepare", "--finish", f"s3://{bucket}/out/")
    assert out.returncode == 2, out.stderr
    assert_escaped(out.stdout + out.stderr, f"unexpected keyword argument 'field{SHOWN}'")
    # ... and as another run's claim: when it was started is what its file says
    client.delete_object(Bucket=bucket, Key="out/prepare-run.json")
    state.claim(client)
    with pytest.raises(run_state.RunStateError) as raised:
        RunState("89abcdef", state.source, state.out, 2, "local", 0.1, False).claim(client)
    assert_escaped(str(raised.value), f"claimed by another prepare run at the same time (0123abcd, started today{SHOWN})")


def test_log_lines_a_job_writes_are_relayed_escaped_and_whole(moto_endpoint, monkeypatch):
    """A job's image is anyone's code: what it prints, here (a host's process) or in CloudWatch
    (followed by submit --wait and prepare at scale), reaches the terminal escaped, tabs kept;
    and a host's last lines are relayed before the runner says that it ended."""
    import io
    import os
    import sys

    import boto3

    from keras_pipe_launch.common.processes import Console, Supervisor
    from keras_pipe_launch.sagemaker.follow import JobLogs

    line = "\x1b]0;owned\x07title \x1b[2Jcleared\tkept"
    said = "\\x1b]0;owned\\x07title \\x1b[2Jcleared\tkept"
    out = io.StringIO()
    supervisor = Supervisor(Console(out))
    # (the last of many lines, written just before the process ends)
    script = f"import sys; sys.stdout.write('x\\n' * 20000 + {line!r} + '\\n')"
    supervisor.start("algo-1", [sys.executable, "-c", script], dict(os.environ))
    assert supervisor.wait() == {"algo-1": 0}
    assert out.getvalue().splitlines()[-1] == f"algo-1 | {said}"

    for key, value in {"AWS_ENDPOINT_URL": moto_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    logs = boto3.client("logs")
    group = "/test/escapes"  # (a group of its own: the server is shared by the session's tests)
    logs.create_log_group(logGroupName=group)
    logs.create_log_stream(logGroupName=group, logStreamName="escapes-job/algo-1-1700000000")
    logs.put_log_events(logGroupName=group, logStreamName="escapes-job/algo-1-1700000000",
                        logEvents=[{"timestamp": int(time.time() * 1000), "message": line + "\n"}])
    assert JobLogs(logs, "escapes-job", group).new_lines() == [("algo-1", said)]
