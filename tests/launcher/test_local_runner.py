"""`keras-pipe local` and its feeder: exact delivery, shuffling, sharding, S3, Gzip, RecordIO, runs."""

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from keras_pipe_launch.common.channels import ChannelError, ChannelSpec
from keras_pipe_launch.common.engine import Engine
from keras_pipe_launch.common.objects import SourceError, list_objects
from keras_pipe_launch.local.feeder import FeedError, PipeFeeder
from keras_pipe_launch.local.run import LocalRun
from pipemode import PipeModeDataset, tfrecord
from tests.conftest import QUICK, job_pid, launch_local, quick_head, random_records, run_logged
from tests.serve.conftest import free_port


def make_objects(folder, count=8, size=1000):
    """Files whose bytes say which object they are (so the order fed can be read back)."""
    folder.mkdir(parents=True, exist_ok=True)
    contents = {}
    for i in range(count):
        data = bytes([65 + i]) * size
        (folder / f"obj-{i:02d}.bin").write_bytes(data)
        contents[f"obj-{i:02d}.bin"] = data
    return contents


def read_passes(fifo_dir, channel, passes, timeout=30, first=0):
    """What a reader gets from passes first..passes-1 of `channel`, read from the real FIFOs."""
    got = []
    for number in range(first, passes):
        path = os.path.join(fifo_dir, f"{channel}_{number}")
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            assert time.monotonic() < deadline, f"{path} never appeared"
            time.sleep(0.01)
        with open(path, "rb") as f:
            got.append(f.read())
    return got


def feed_in_background(feeder, passes):
    thread = threading.Thread(target=feeder.run, args=(passes,), daemon=True)
    thread.start()
    return thread


def order_of(data, size=1000):
    return [chr(data[i]) for i in range(0, len(data), size)]


def test_every_object_is_fed_exactly_once_per_pass_in_key_order(tmp_path):
    contents = make_objects(tmp_path / "src")
    spec = ChannelSpec("train", str(tmp_path / "src"))
    feeder = PipeFeeder(str(tmp_path), spec, list_objects(spec.source))
    feed_in_background(feeder, 3)
    for data in read_passes(tmp_path, "train", 3):
        assert data == b"".join(contents[k] for k in sorted(contents))


def test_shuffle_seed_gives_a_new_order_every_pass_and_the_same_orders_for_the_same_seed(tmp_path):
    make_objects(tmp_path / "src")
    spec = ChannelSpec("train", str(tmp_path / "src"), shuffle_seed=7)
    runs = []
    for run in range(2):
        fifo_dir = tmp_path / f"run{run}"
        fifo_dir.mkdir()
        feed_in_background(PipeFeeder(str(fifo_dir), spec, list_objects(spec.source)), 3)
        runs.append([order_of(data) for data in read_passes(fifo_dir, "train", 3)])
    assert runs[0] == runs[1]  # same seed, same orders
    for order in runs[0]:
        assert sorted(order) == list("ABCDEFGH")  # each pass: every object once
    assert len({tuple(order) for order in runs[0]}) == 3  # a new order every pass
    other = PipeFeeder(str(tmp_path), ChannelSpec("train", "x", shuffle_seed=8), list_objects(spec.source))
    assert [o.key for o in other.objects_for_pass(0)] != [o.key for o in PipeFeeder(str(tmp_path), spec, list_objects(spec.source)).objects_for_pass(0)]


@pytest.mark.parametrize("seed", [None, 3])
def test_sharded_by_s3_key_splits_every_pass_between_hosts_without_overlap(tmp_path, seed):
    make_objects(tmp_path / "src", count=11)
    objects = list_objects(str(tmp_path / "src"))
    spec = ChannelSpec("train", "x", distribution="ShardedByS3Key", shuffle_seed=seed)
    splits = []
    for number in range(3):
        shards = [{o.key for o in PipeFeeder("d", spec, objects, host_index=h, host_count=3).objects_for_pass(number)}
                  for h in range(3)]
        assert set.union(*shards) == {o.key for o in objects}
        assert sum(map(len, shards)) == len(objects)  # no overlap
        assert all(len(s) in (3, 4) for s in shards)  # about a third each
        splits.append(shards)
    if seed is None:
        assert splits[0] == splits[1] == splits[2]
    else:
        assert splits[0] != splits[1]  # ShuffleConfig: a different split every pass
    replicated = ChannelSpec("train", "x", distribution="FullyReplicated")
    assert len(PipeFeeder("d", replicated, objects, host_index=1, host_count=3).objects_for_pass(0)) == 11


def test_a_reader_that_stops_early_ends_the_pass_and_the_next_one_follows(tmp_path):
    make_objects(tmp_path / "src", count=4, size=3 << 20)
    spec = ChannelSpec("train", str(tmp_path / "src"))
    reports = []
    feeder = PipeFeeder(str(tmp_path), spec, list_objects(spec.source), on_report=reports.append)
    thread = feed_in_background(feeder, 2)
    while not (tmp_path / "train_0").exists():
        time.sleep(0.01)
    with open(tmp_path / "train_0", "rb") as f:
        assert len(f.read(1000)) == 1000  # then close, early
    assert len(read_passes(tmp_path, "train", 2, first=1)[0]) == 12 << 20
    thread.join(10)
    assert [r.complete for r in reports] == [False, True]


def test_gzip_and_recordio_feeds_read_back_by_the_pipe_reader(job, tmp_path):
    parts = [random_records(seed, 50) for seed in range(3)]
    (tmp_path / "gz").mkdir()
    for i, part in enumerate(parts):
        (tmp_path / "gz" / f"part-{i}.tfrecord.gz").write_bytes(gzip.compress(tfrecord.encode(part)))
    spec = ChannelSpec("train", str(tmp_path / "gz"), compression="Gzip", record_wrapper="RecordIO")
    job.write_config(inputdataconfig={"train": spec.input_data_config()})  # as keras-pipe local writes it
    feed_in_background(PipeFeeder(str(job.data_dir), spec, list_objects(spec.source), spool_dir=str(tmp_path)), 1)
    assert [x.numpy() for x in PipeModeDataset("train", "TFRecord")] == [r for p in parts for r in p]


def test_feeder_streams_the_same_bytes_as_the_encoder(tmp_path):
    from keras_pipe_launch.local.feeder import recordio_wrapped_file
    from pipemode import recordio

    for payload in (b"", b"abc", recordio.MAGIC_BYTES * 3 + b"x", os.urandom(3 << 20) + recordio.MAGIC_BYTES + b"tail"):
        path = tmp_path / "object"
        path.write_bytes(payload)
        assert b"".join(recordio_wrapped_file(str(path))) == recordio.encode_record(payload)


def test_gzip_with_several_members_and_a_bad_gzip_object(tmp_path):
    from keras_pipe_launch.local.feeder import gunzip

    data = os.urandom(5 << 20)
    stream = gzip.compress(data[:100]) + gzip.compress(data[100:])
    chunks = [stream[i:i + 777] for i in range(0, len(stream), 777)]
    assert b"".join(gunzip(chunks, "x")) == data
    with pytest.raises(FeedError, match="truncated"):
        b"".join(gunzip([stream[:-10]], "x"))


# --- S3, on moto's server ---------------------------------------------------------------------


def test_s3_channel_is_fed_exactly_including_an_object_larger_than_any_buffer(tmp_path, s3_bucket):
    client, bucket = s3_bucket
    objects = {"data/train/a.bin": os.urandom(100), "data/train/b.bin": os.urandom(3 << 20),
               "data/train/sub/c.bin": b"", "data/other/x.bin": b"not this", "data/train/": b""}
    for key, body in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=body)
    listed = list_objects(f"s3://{bucket}/data/train/")
    assert [(o.key, o.size) for o in listed] == [("a.bin", 100), ("b.bin", 3 << 20), ("sub/c.bin", 0)]
    spec = ChannelSpec("train", f"s3://{bucket}/data/train/")
    feed_in_background(PipeFeeder(str(tmp_path), spec, listed), 2)
    expected = objects["data/train/a.bin"] + objects["data/train/b.bin"]
    assert read_passes(tmp_path, "train", 2) == [expected, expected]


def test_s3_errors_are_clear(s3_bucket):
    _, bucket = s3_bucket
    with pytest.raises(SourceError, match=f"s3://{bucket}/nothing/here/ holds no objects"):
        list_objects(f"s3://{bucket}/nothing/here/")
    with pytest.raises(SourceError, match="cannot list s3://no-such-bucket-4242/x: NoSuchBucket"):
        list_objects("s3://no-such-bucket-4242/x")
    for uri, message in (("s3://Bad_Bucket/x", "not a valid bucket name"), ("s3:/b/x", "not an S3 URI"),
                         ("s3://ok-bucket/a//b", "contains '//'")):
        with pytest.raises(SourceError, match=message):
            list_objects(uri)


# --- channels and layout ----------------------------------------------------------------------


def test_channel_rules():
    with pytest.raises(ChannelError, match="Gzip works in Pipe mode only"):
        ChannelSpec("train", "x", input_mode="File", compression="Gzip")
    with pytest.raises(ChannelError, match="RecordIO works in Pipe mode only"):
        ChannelSpec("train", "x", input_mode="FastFile", record_wrapper="RecordIO")
    with pytest.raises(ChannelError, match="channel name 'a b'"):
        ChannelSpec("a b", "x")


@pytest.mark.parametrize("argv, message", [
    (["--train", "a", "--channel", "train=b"], "channel train is given twice (--train and --channel train=...)"),
    (["--channel", "extra=a", "--channel", "extra=b"], "--channel extra is given twice ('a' and 'b')"),
    (["--channel", "extra="], "--channel extra=: expected NAME=SOURCE"),
    (["--channel", "=a"], "--channel '=a': expected NAME=SOURCE"),
    (["--channel", "extra"], "--channel 'extra': expected NAME=SOURCE"),
])
def test_channel_arguments_given_wrongly(argv, message):
    import argparse

    from keras_pipe_launch.cli import arguments
    from keras_pipe_launch.common.usage import UsageError

    parser = argparse.ArgumentParser()
    arguments.add_channel_arguments(parser)
    with pytest.raises(UsageError) as raised:
        arguments.channels_from(parser.parse_args(argv))
    assert str(raised.value) == message


def test_layout_of_two_hosts_with_a_sharded_file_channel(tmp_path):
    contents = make_objects(tmp_path / "src", count=5)
    specs = [ChannelSpec("train", str(tmp_path / "src"), input_mode="File", distribution="ShardedByS3Key"),
             ChannelSpec("validation", str(tmp_path / "src"), input_mode="File")]
    run = LocalRun(tmp_path / "job", specs, {"epochs": "1"}, instance_count=2, out=open(os.devnull, "w"))
    run.prepare()
    import json

    shards = []
    for host in ("algo-1", "algo-2"):
        base = tmp_path / "job" / host
        resources = json.loads((base / "input/config/resourceconfig.json").read_text())
        assert (resources["current_host"], resources["hosts"]) == (host, ["algo-1", "algo-2"])
        assert json.loads((base / "input/config/hyperparameters.json").read_text()) == {"epochs": "1"}
        assert json.loads((base / "input/config/inputdataconfig.json").read_text())["train"] == {
            "TrainingInputMode": "File", "S3DistributionType": "ShardedByS3Key", "RecordWrapperType": "None"}
        shards.append({p.name for p in (base / "input/data/train").iterdir()})
        assert {p.name for p in (base / "input/data/validation").iterdir()} == set(contents)
        for folder in ("model", "output/data", "checkpoints"):
            assert (base / folder).is_dir()
    assert shards[0] | shards[1] == set(contents) and not shards[0] & shards[1]


def test_a_local_process_job_gets_none_of_the_hosts_aws_credentials(tmp_path, monkeypatch):
    make_objects(tmp_path / "src", count=1)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.setenv(name, "from-the-host")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    run = LocalRun(tmp_path / "job", [ChannelSpec("train", str(tmp_path / "src"))], {}, out=open(os.devnull, "w"),
                   environment={"AWS_ACCESS_KEY_ID": "given", "MY_TOKEN": "t"})
    command, env = run.command("algo-1")
    assert not {k: v for k, v in env.items() if v == "from-the-host"}
    assert env["AWS_SHARED_CREDENTIALS_FILE"] == env["AWS_CONFIG_FILE"] == os.devnull
    assert (env["AWS_ACCESS_KEY_ID"], env["MY_TOKEN"]) == ("given", "t")  # what --env gives, the job gets
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "1"  # the rest of the environment is inherited


def test_secret_values_never_reach_the_engines_command_line_nor_what_is_printed(tmp_path, monkeypatch):
    """--env values go to the engine in a 0600 --env-file: a command line is readable by any local
    user through `ps`, and the engine's own environment is not the job's. What LAUNCH_ENGINE_ARGS
    holds is printed redacted."""
    make_objects(tmp_path / "src", count=1)
    monkeypatch.setenv("LAUNCH_ENGINE_ARGS", "-e HF_TOKEN=abc --env=DB_PASSWORD=pw -eGITHUB_TOKEN=gh -e LEVEL=3 "
                                             "-e DATABASE_URL=postgres://u:pw2@db:5432/x")
    printed = tmp_path / "printed.txt"
    # the stand-in engine prints its arguments, then the env file's mode and content
    engine = tmp_path / "engine.sh"
    engine.write_text('#!/bin/sh\necho "$@"\nwhile [ "$1" != --env-file ]; do shift; done\n'
                      'stat -c "mode %a" "$2"\nsed "s/^/env: /" "$2"\n')
    engine.chmod(0o755)
    with open(printed, "w") as out:
        run = LocalRun(tmp_path / "job", [ChannelSpec("train", str(tmp_path / "src"), input_mode="File")], {},
                       image="some-image", engine=Engine.from_environment(str(engine)), out=out, name="secrets",
                       environment={"AWS_SECRET_ACCESS_KEY": "s3cr3t", "STAGE": "dev", "GH_PAT": "ghp_0123",
                                    "PATH": "/only/in/the/container"})
        assert run.run() == 0
    text = printed.read_text()
    starting = next(line for line in text.splitlines() if line.startswith("launch | starting algo-1: "))
    ran = next(line for line in text.splitlines() if line.startswith("algo-1 | run --rm"))
    for secret in ("abc", "pw", "gh", "s3cr3t", "ghp_0123", "pw2"):
        assert f"={secret}" not in starting and f":{secret}@" not in starting, starting
    for shown in ("-e HF_TOKEN=REDACTED", "--env=DB_PASSWORD=REDACTED", "-eGITHUB_TOKEN=REDACTED",
                  "-e LEVEL=3", "-e DATABASE_URL=postgres://REDACTED@db:5432/x", "--env-file"):
        assert shown in starting, starting
    assert "s3cr3t" not in ran and "ghp_0123" not in ran, ran  # not on the engine's command line either
    # the engine got every value, in a file only this user could read (and the engine ran, whatever PATH
    # the job gets); the file is gone once the job has ended
    for line in ("algo-1 | mode 600", "algo-1 | env: AWS_SECRET_ACCESS_KEY=s3cr3t", "algo-1 | env: GH_PAT=ghp_0123",
                 "algo-1 | env: PATH=/only/in/the/container", "algo-1 | env: TRAINING_JOB_NAME=secrets"):
        assert line in text, text
    assert not list((tmp_path / "job").glob(".*.env"))


# --- whole runs through `keras-pipe local` --------------------------------------------


@pytest.mark.slow
def test_a_pipe_mode_job_runs_end_to_end(digit_folders, head_only_weights):
    """... and its MLflow tracking server is down: the job ends as it would without one, with a
    warning (the URI with credentials, as another client may set it: the job redacts them)."""
    port = free_port()  # (nothing listens there)
    out = launch_local("--train", "train", "--validation", "validation", "--hp", "epochs=2",
                       *quick_head(digit_folders, head_only_weights),
                       "--job-dir", "job", "--env", f"MLFLOW_TRACKING_URI=http://user:pa55word@127.0.0.1:{port}",
                       "--env", "MLFLOW_HTTP_REQUEST_MAX_RETRIES=0", cwd=digit_folders)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"MLflow tracking at http://***@127.0.0.1:{port} failed, the job goes on without it" in out.stdout
    assert "pa55word" not in out.stdout + out.stderr
    status = json.loads((digit_folders / "job/algo-1/output/data/tracking.json").read_text())
    assert status["logged"] is False and "Connection" in status["warning"] and status["run_id"] is None
    for line in ("launch | channel train (Pipe): 2 objects from train",
                 "launch | fed algo-1/train pass 0: 600 records", "launch | fed algo-1/train pass 1: 600 records",
                 "launch | fed algo-1/validation pass 1: 200 records", "algo-1 | metrics: epoch=2",
                 f"launch | algo-1 completed; model in {digit_folders}/job/algo-1/model"):
        assert line in out.stdout, line
    assert (digit_folders / "job/algo-1/model/1/saved_model.pb").is_file()
    # the job's report, found by the installed command as a user types it
    report = run_logged([str(Path(sys.executable).parent / "keras-pipe"), "report", "job"], 60, cwd=digit_folders)
    assert report.returncode == 0 and report.stdout == "job/algo-1/output/data/report.html\n", report
    page = (digit_folders / report.stdout.strip()).read_text()
    assert "The validation images it gets most wrong" in page and " of the 200 validation images" in page


@pytest.mark.slow
def test_a_failing_job_shows_its_failure_file_and_exit_code(digit_folders):
    data = bytearray((digit_folders / "train" / "part-0.tfrecord").read_bytes())
    data[5000] ^= 1
    (digit_folders / "train" / "part-0.tfrecord").write_bytes(bytes(data))
    out = launch_local("--train", "train", "--hp", "epochs=1", *QUICK, "--job-dir", "job", cwd=digit_folders)
    assert out.returncode == 3, out.stdout[-3000:]
    assert "launch | algo-1 failed with exit code 3" in out.stdout
    assert "failure file" in out.stdout and "Data error: CorruptRecordError: corrupt record #" in out.stdout


def test_bad_arguments_fail_before_anything_starts(digit_folders):
    cases = [(["--train", "train", "--hp", "epochs=-1", *QUICK], "hyperparameter epochs must be >= 0"),
             (["--train", "nowhere", *QUICK], "nowhere does not exist"),
             (["--train", "train", "--channel-option", "val:input-mode=File", *QUICK], "there is no channel val"),
             (["--train", "train", "--input-mode", "File", "--compression", "Gzip", *QUICK], "Gzip works in Pipe mode only")]
    for args, message in cases:
        out = launch_local(*args, "--job-dir", "job", cwd=digit_folders, timeout=120)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
        assert not (digit_folders / "job").exists()


def interrupted_local_run(*args, when: str, cwd) -> tuple[int, str]:
    """`keras-pipe local ARGS`, Ctrl-C'd (SIGINT) once it printed a line holding `when`: (exit code, output)."""
    runner = subprocess.Popen([sys.executable, "-m", "keras_pipe_launch", "local", *args], cwd=cwd,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in runner.stdout:
        seen.append(line)
        if when in line:
            runner.send_signal(signal.SIGINT)
            break
    rest, _ = runner.communicate(timeout=180)
    return runner.returncode, "".join(seen) + rest


@pytest.mark.slow
def test_ctrl_c_is_forwarded_to_the_job_as_sigterm(digit_folders, head_only_weights):
    code, output = interrupted_local_run("--train", "train", "--hp", "epochs=200",
                                         *quick_head(digit_folders, head_only_weights), "--job-dir", "job",
                                         when="metrics: epoch=1", cwd=digit_folders)
    assert "launch | stopping: SIGTERM sent to the job" in output
    assert code == 143, output[-2000:]  # the job ended by SIGTERM (128 + 15)


@pytest.mark.slow
def test_closing_the_terminal_stops_the_job_instead_of_orphaning_it(digit_folders, head_only_weights):
    runner = subprocess.Popen([sys.executable, "-m", "keras_pipe_launch", "local", "--train", "train", "--hp", "epochs=200",
                               *quick_head(digit_folders, head_only_weights), "--job-dir", "job"], cwd=digit_folders,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in runner.stdout:
        if "metrics: epoch=1" in line:
            break
    job = job_pid(digit_folders / "job" / "algo-1")
    runner.stdout.close()  # the terminal is gone: every later write of the runner fails
    runner.send_signal(signal.SIGHUP)
    assert runner.wait(timeout=180) == 143  # the job's own status: stopped by SIGTERM, not killed
    assert not os.path.exists(f"/proc/{job}"), "the job outlived its runner"
    assert list((digit_folders / "job" / "checkpoints").rglob("progress.json"))  # it stopped with a checkpoint
    assert not (digit_folders / "job" / "algo-1" / "output" / "failure").exists()


# --- untrusted names: S3 keys, channel and job names, local sources -----------------------------


@pytest.mark.parametrize("key, problem", [
    ("../../../../../../../../../../tmp/escaped-{tag}", "has an empty, '.' or '..' path segment"),
    ("sub/../../escaped-{tag}", "has an empty, '.' or '..' path segment"),
    ("/escaped-{tag}", "has a leading '/'"),
    ("./escaped-{tag}", "has an empty, '.' or '..' path segment"),
    ("a//escaped-{tag}", "has an empty, '.' or '..' path segment"),
    ("x" * 256 + "-{tag}", "has a path segment longer than 255 bytes"),
])
def test_hostile_s3_keys_are_refused_before_anything_is_written(tmp_path, s3_bucket, key, problem):
    client, bucket = s3_bucket
    tag = os.urandom(4).hex()
    key = key.format(tag=tag)
    client.put_object(Bucket=bucket, Key="data/train/ok.tfrecord", Body=b"fine")
    client.put_object(Bucket=bucket, Key=f"data/train/{key}", Body=b"hostile")
    out = launch_local("--train", f"s3://{bucket}/data/train/", "--input-mode", "File", *QUICK, "--job-dir", "job",
                       cwd=tmp_path, timeout=120)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert (f"object s3://{bucket}/data/train/{key} cannot be staged as a file in File mode: its key relative "
            f"to the channel, {key!r}, {problem}") in out.stderr
    assert not (tmp_path / "job").exists()
    assert not list(tmp_path.rglob(f"*escaped-{tag}*")) and not os.path.exists(f"/tmp/escaped-{tag}")


def test_keys_that_would_collide_as_files_are_refused(tmp_path, s3_bucket):
    client, bucket = s3_bucket
    for key in ("d/a", "d/a/b"):
        client.put_object(Bucket=bucket, Key=f"data/{key}", Body=key.encode())
    run = LocalRun(tmp_path / "job", [ChannelSpec("train", f"s3://{bucket}/data/", input_mode="File")], {},
                   out=open(os.devnull, "w"))
    with pytest.raises(SourceError, match=rf"object s3://{bucket}/data/d/a would be a file where object "
                                          rf"s3://{bucket}/data/d/a/b needs a folder \(d/a/\)"):
        run.prepare()
    assert not (tmp_path / "job").exists()


def test_keys_that_differ_only_in_case_collide_on_a_case_insensitive_file_system():
    from keras_pipe_launch.common.objects import StoredObject, staging_plan

    objects = [StoredObject(key, 1, f"s3://b/p/{key}", None) for key in ("Part-1.tfrecord", "part-1.tfrecord")]
    assert len(staging_plan(objects)) == 2
    with pytest.raises(SourceError, match="would be the same file part-1.tfrecord on this case-insensitive"):
        staging_plan(objects, case_insensitive=True)


@pytest.mark.parametrize("args, message", [
    (["--channel", ".=src"], "channel name '.': use 1-64 letters"),
    (["--channel", "..=src"], "channel name '..': use 1-64 letters"),
    (["--channel", "train_0=src", "--channel-option", "train_0:input-mode=File"],
     "channel train_0 has the name of a FIFO of Pipe channel train"),
    (["--name", "../../escaped"], "--name '../../escaped': 1-63 letters, digits and hyphens"),
    (["--name", "a/b"], "--name 'a/b': 1-63 letters"),
])
def test_bad_channel_and_job_names_are_refused(tmp_path, args, message):
    make_objects(tmp_path / "src", count=1)
    out = launch_local("--train", "src", *args, *QUICK, cwd=tmp_path, timeout=120)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # nothing made, in here or above


def test_staged_files_are_copies_so_the_job_cannot_change_the_originals(tmp_path):
    contents = make_objects(tmp_path / "src", count=2)
    run = LocalRun(tmp_path / "job", [ChannelSpec("train", str(tmp_path / "src"), input_mode="File")], {},
                   out=open(os.devnull, "w"))
    run.prepare()
    for name, data in contents.items():
        staged = tmp_path / "job/algo-1/input/data/train" / name
        assert staged.read_bytes() == data and not staged.is_symlink() and staged.stat().st_nlink == 1
        staged.write_bytes(b"changed by the job")
        assert (tmp_path / "src" / name).read_bytes() == data


def test_local_sources_follow_links_to_files_inside_and_refuse_what_cannot_be_an_object(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "real.bin").write_bytes(b"outside content")
    source = tmp_path / "src"
    make_objects(source, count=1)
    (source / "kept").mkdir()
    (source / "kept" / "real.bin").write_bytes(b"linked content")
    (source / "linked.bin").symlink_to(source / "kept" / "real.bin")
    run = LocalRun(tmp_path / "job", [ChannelSpec("train", str(source), input_mode="File")], {},
                   out=open(os.devnull, "w"))
    run.prepare()
    staged = tmp_path / "job/algo-1/input/data/train/linked.bin"
    assert staged.read_bytes() == b"linked content" and not staged.is_symlink()

    for name, make, message in (
            ("dangling.bin", lambda p: p.symlink_to(tmp_path / "nowhere"), "is a dangling symbolic link"),
            ("folder-link", lambda p: p.symlink_to(outside), "is a symbolic link to a folder"),
            ("out.bin", lambda p: p.symlink_to(outside / "real.bin"), "is a symbolic link to .*/elsewhere/real.bin, "
                                                                      "outside .*/src: copy the file in"),
            ("fifo.bin", os.mkfifo, "is not a regular file")):
        make(source / name)
        with pytest.raises(SourceError, match=message):
            list_objects(str(source))
        os.unlink(source / name)


# --- a job stopped and resumed ----------------------------------------------------------------------

# every random part of training on: augmentation and dropout (QUICK's weights=none: BatchNorm trains too)
RESUMABLE = ["--train", "train", "--validation", "validation", *QUICK, "--hp", "epochs=2",
             "--hp", "augment=crop,flip,color"]


def final_weights(job_dir):
    import keras

    return keras.saving.load_model(job_dir / "algo-1" / "model" / "model.keras", compile=False).get_weights()


@pytest.mark.slow
def test_a_job_stopped_mid_epoch_and_rerun_with_the_same_name_ends_as_if_never_stopped(digit_folders):
    """docs/local.md: Ctrl-C, then the same command again. The rerun resumes from the checkpoint of
    the stop, to the record, and ends with the very weights an uninterrupted run ends with."""
    import numpy as np

    whole = launch_local(*RESUMABLE, "--name", "whole", cwd=digit_folders)
    assert whole.returncode == 0, whole.stdout[-3000:]

    code, output = interrupted_local_run(*RESUMABLE, "--name", "cut", when="progress: epoch=2 step=10 ",
                                         cwd=digit_folders)
    assert code == 143, output[-3000:]
    assert "launch | algo-1 stopped (exit code 143): its checkpoint is saved" in output
    assert ("launch | the job stopped with its checkpoints kept; continue it from the newest with: "
            "keras-pipe local --resume cut") in output
    stopped = re.search(r"stopped by request after step (\d+) of epoch 2", output)
    assert stopped and 10 <= int(stopped.group(1)) < 19, output[-3000:]  # 600 records, 32 a step: 19 a pass

    again = launch_local(*RESUMABLE, "--name", "cut", cwd=digit_folders)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "resuming job cut from its newest checkpoint in local-jobs/cut/checkpoints" in again.stdout
    assert f"epoch 2 of 2, after {stopped.group(1)} steps" in again.stdout, again.stdout[-3000:]
    assert "metrics: epoch=1 " not in again.stdout
    for resumed, uninterrupted in zip(final_weights(digit_folders / "local-jobs/cut"),
                                      final_weights(digit_folders / "local-jobs/whole"), strict=True):
        np.testing.assert_array_equal(resumed, uninterrupted)


@pytest.mark.slow
def test_resume_by_name_reruns_the_jobs_own_arguments_and_fresh_starts_it_over(digit_folders, head_only_weights):
    args = ["--train", "train", *quick_head(digit_folders, head_only_weights), "--hp", "epochs=1", "--name", "longer"]
    first = launch_local(*args, cwd=digit_folders)
    assert first.returncode == 0, first.stdout[-3000:]
    more = launch_local("--resume", "longer", "--hp", "epochs=2", cwd=digit_folders)
    assert more.returncode == 0, more.stdout[-3000:]
    assert "epoch 2 of 2, after 0 steps" in more.stdout and "metrics: epoch=2 " in more.stdout
    assert "launch | channel train (Pipe): 2 objects" in more.stdout  # its channels, from its folder
    again = launch_local(*args, "--fresh", cwd=digit_folders)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "starting job longer over in local-jobs/longer (--fresh)" in again.stdout
    assert "resuming from checkpoint" not in again.stdout and "metrics: epoch=1 " in again.stdout


def test_a_used_job_folder_is_resumed_or_started_over_only_when_it_can_be(digit_folders):
    """Refusals, before anything runs: no checkpoint to resume from; a folder that is not a local job's;
    --resume of a job that does not exist, or with arguments of its own."""
    used = digit_folders / "local-jobs" / "failed"
    used.mkdir(parents=True)
    (used / "local-job.json").write_text('{"name": "failed", "arguments": {}}')
    (used / "algo-1").mkdir()
    out = launch_local(*RESUMABLE, "--name", "failed", cwd=digit_folders, timeout=120)
    assert out.returncode == 2 and "left no checkpoint" in out.stderr and "--fresh starts the job over" in out.stderr
    assert (used / "algo-1").exists()
    foreign = digit_folders / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    out = launch_local(*RESUMABLE, "--job-dir", "mine", "--fresh", cwd=digit_folders, timeout=120)
    assert out.returncode == 2 and "no keras-pipe local job's" in out.stderr
    assert (foreign / "notes.txt").read_text() == "mine"
    out = launch_local("--resume", "nobody", cwd=digit_folders, timeout=120)
    assert out.returncode == 2 and "--resume nobody: no job of that name in local-jobs/nobody" in out.stderr
    out = launch_local("--resume", "failed", "--train", "elsewhere", cwd=digit_folders, timeout=120)
    assert out.returncode == 2 and "takes the job's own arguments from its folder" in out.stderr
    assert "(--train given)" in out.stderr


def test_secret_values_are_not_kept_for_resume_and_must_be_given_again(tmp_path):
    import argparse
    import json

    from keras_pipe_launch.cli.local import DEFAULTS
    from keras_pipe_launch.local.job_folder import JOB_FILE, LocalJobFolder

    args = argparse.Namespace(**{**DEFAULTS, "train": "train", "env": ["HF_TOKEN=hf_abc", "STAGE=dev",
                                                                       "DB=postgres://u:pw@db/x"],
                                 "hp": ["num_classes=2", "api_key=k1"], "job_dir": tmp_path / "job"})
    LocalJobFolder(tmp_path / "job", "kept", None).record(args)
    kept = (tmp_path / "job" / JOB_FILE).read_text()
    assert "hf_abc" not in kept and ":pw@" not in kept and "k1" not in kept
    assert json.loads(kept)["arguments"]["env"] == ["HF_TOKEN=REDACTED", "STAGE=dev", "DB=postgres://REDACTED@db/x"]
    out = launch_local("--resume", "kept", "--job-dir", str(tmp_path / "job"), "--env", "HF_TOKEN=hf_abc",
                       cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert ("the values of --hp api_key, --env DB were not kept (they look secret): give them again, e.g. "
            "--hp api_key=...") in out.stderr
