"""Several hosts: `keras-pipe local --instance-count 2` runs two real job processes that train together
with MultiWorkerMirroredStrategy over 127.0.0.1, each fed its own shard of a Pipe channel."""

import collections
import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from pipemode import tfrecord
from tests.conftest import QUICK, job_pid, launch_local, quick_head
from tests.job.conftest import audited, trained_records

pytestmark = pytest.mark.slow
TWO_HOSTS = ["--instance-count", "2", "--distribution", "ShardedByS3Key"]


def metric_lines(output: str, host: str) -> list[str]:
    """The host's per-epoch metric lines, less the wall time (which differs between hosts)."""
    return [re.sub(r" seconds=\S+", "", line.split(" | ", 1)[1])
            for line in output.splitlines() if line.startswith(f"{host} | metrics: ")]


def index_of(lines: list[str], prefix: str, text: str) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith(prefix) and text in line)


def test_two_hosts_train_one_model_on_disjoint_shards_and_only_the_chief_exports(digit_folders, digit_records):
    # a third object makes the shares uneven: the host with fewer records runs out of batches first,
    # and must neither hang in a collective nor stop the other early; with 3 steps per call, that
    # happens in the middle of a call (the other tests here run one step per call)
    extra = digit_records[0][600:700]
    audit = digit_folders / "audit"
    (digit_folders / "train" / "part-2.tfrecord").write_bytes(tfrecord.encode(extra))
    # early stopping that no epoch after the first can satisfy (a min_delta of 100): the phase of
    # 4 epochs stops after epoch 2 on both hosts together, each deciding from the same all-reduced
    # validation metrics (a host going on alone would wait in a collective)
    stopping = ["--hp", "early_stopping=true", "--hp", "early_stopping_patience=1", "--hp",
                "early_stopping_min_delta=100"]
    out = launch_local("--train", "train", "--validation", "validation", "--hp", "epochs=4", *stopping, *QUICK,
                       *TWO_HOSTS, "--hp", "steps_per_execution=3", "--job-dir", "job", cwd=digit_folders,
                       env={**os.environ, "TRAIN_AUDIT_DIR": str(audit)})
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    # ShardedByS3Key: objects are dealt out to the hosts in key order, every pass
    fed = {host: [int(n) for n in re.findall(rf"launch \| fed {host}/train pass \d+: (\d+) records", out.stdout)]
           for host in ("algo-1", "algo-2")}
    assert fed == {"algo-1": [400, 400], "algo-2": [300, 300]}, out.stdout[-4000:]
    # every record of the channel trained on exactly once per epoch, by one host or the other
    everything = collections.Counter(hashlib.sha1(r).hexdigest() for r in digit_records[0][:700])
    for epoch in (0, 1):
        trained = collections.Counter()
        for host in ("algo-1", "algo-2"):
            (run,) = audited(audit / f"audit-{host}.jsonl").values()
            trained.update(trained_records(run[epoch]))
        assert trained == everything, epoch
    # one model: gradients and metrics are summed over both hosts, so both print the same numbers
    chief, worker = metric_lines(out.stdout, "algo-1"), metric_lines(out.stdout, "algo-2")
    # (and, last, epoch 1's line again: the exported model's metrics, early stopping having put its
    # weights back)
    assert len(chief) == 3 and chief == worker and chief[-1] == chief[0], (chief, worker)
    for host in ("algo-1", "algo-2"):
        assert f"{host} | " in out.stdout and any(
            line.startswith(f"{host} | ") and "phase scratch ends after epoch 2 of 4" in line
            for line in out.stdout.splitlines()), host
    strategy = [line for line in out.stdout.splitlines() if "replica(s) in sync" in line]
    assert any(line.startswith("algo-1 | ") and line.endswith("MultiWorkerMirroredStrategy: 2 worker(s), 2 replica(s) "
                                                             "in sync; this is worker 0 (chief)") for line in strategy), strategy
    assert f"launch | algo-1 completed; model in {digit_folders}/job/algo-1/model" in out.stdout
    # the chief's report, its gallery from a pass of its own over its share of the validation
    # channel (100 records) while the worker waited to leave; the worker writes none
    page = (digit_folders / "job/algo-1/output/data/report.html").read_text()
    assert "the job's report: " in out.stdout and " of the 100 validation images wrong" in page, page[-3000:]
    assert not (digit_folders / "job/algo-2/output/data/report.html").exists()
    assert "launch | algo-2 completed\n" in out.stdout
    # hosts finish together: the worker waits for the chief's export before it exits (SageMaker, and
    # the SDK's local mode, end the job when hosts exit: the chief was once stopped mid-export)
    lines = out.stdout.splitlines()
    waiting = index_of(lines, "algo-2 | ", "waiting for the chief to export the model")
    exported = index_of(lines, "algo-1 | ", "exported the model to")
    assert waiting < exported < lines.index("launch | algo-2 completed"), out.stdout[-3000:]
    # and leaves after the chief: a host gone right after the last collective once failed its peer
    assert index_of(lines, "algo-2 | ", "done: waiting for the chief (127.0.0.1:") > exported
    assert index_of(lines, "launch | ", "algo-1 completed") < lines.index("launch | algo-2 completed")
    assert (digit_folders / "job/algo-1/model/1/saved_model.pb").is_file()
    assert not any((digit_folders / "job/algo-2/model").iterdir())


def test_a_worker_leaves_once_nothing_answers_at_the_chiefs_address():
    from keras_pipe_train.training.distribute import wait_until_gone

    chief = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{chief.getsockname()[1]}"
    started = time.monotonic()
    assert not wait_until_gone(address, wait_s=0.6, every_s=0.1)  # (answering: waited for, then given up)
    assert 0.6 <= time.monotonic() - started < 5
    threading.Timer(0.5, chief.close).start()
    started = time.monotonic()
    assert wait_until_gone(address, wait_s=30, every_s=0.1)
    assert 0.5 <= time.monotonic() - started < 5


def test_a_host_that_dies_fails_the_job_promptly_with_a_cluster_error(digit_folders, head_only_weights):
    # (the head alone trains: what is checked is what the hosts do when one of them dies, at any step)
    runner = subprocess.Popen([sys.executable, "-m", "keras_pipe_launch", "local", "--train", "train", "--hp", "epochs=100",
                               "--hp", "collective_timeout=60", *quick_head(digit_folders, head_only_weights),
                               *TWO_HOSTS, "--job-dir", "job"],
                              cwd=digit_folders, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in runner.stdout:
        seen.append(line)
        if line.startswith("algo-2 | metrics: epoch=1 "):
            os.kill(job_pid(digit_folders / "job" / "algo-2"), signal.SIGKILL)
            killed = time.monotonic()
            break
    else:
        pytest.fail("".join(seen)[-4000:])
    rest, _ = runner.communicate(timeout=200)
    output = "".join(seen) + rest
    assert time.monotonic() - killed < 120, output[-3000:]  # not the 100 epochs, nor a hang
    assert runner.returncode == 4, output[-4000:]
    assert "launch | algo-2 failed with exit code 137" in output
    failure = (digit_folders / "job/algo-1/output/failure").read_text()
    assert failure.startswith("Cluster error: the hosts lost each other ("), failure[:1000]
    assert "another host died or stopped answering" in failure.splitlines()[0]


def preset_notes(output: str, host: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in output.splitlines()
            if line.startswith(f"{host} | ") and "keras_pipe_train.training.preset: " in line]


def test_ctrl_c_stops_both_hosts_with_a_checkpoint_and_a_rerun_resumes_from_it(digit_folders, head_only_weights):
    """With a preset, which each host chooses by before any TensorFlow op (a multi-worker strategy
    must come first): each counts its share of the sharded objects, the counts are gathered, both
    choose from their sum, and the rerun counts again and chooses the same, so its checkpoint is
    the job's own."""
    # the same job name in both runs, as a restarted spot job keeps its name
    common = ["--train", "train", *quick_head(digit_folders, head_only_weights), *TWO_HOSTS, "--checkpoint-dir",
              "checkpoints", "--name", "interrupted", "--hp", "preset=fast", "--hp", "fine_tune_epochs=1", "--hp", "augment=crop"]
    runner = subprocess.Popen([sys.executable, "-m", "keras_pipe_launch", "local", *common, "--hp", "epochs=100",
                               "--job-dir", "first"], cwd=digit_folders, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in runner.stdout:
        seen.append(line)
        if line.startswith("algo-1 | metrics: epoch=1 "):
            runner.send_signal(signal.SIGINT)  # the hosts get SIGTERM at slightly different times
            break
    rest, _ = runner.communicate(timeout=200)
    output = "".join(seen) + rest
    assert runner.returncode == 143, output[-4000:]
    for host in ("algo-1", "algo-2"):
        assert f"launch | {host} stopped (exit code 143): its checkpoint is saved" in output
        assert not (digit_folders / "first" / host / "output" / "failure").exists()
    stopped = re.search(r"algo-1 \| .*stopped by request after (step \d+ of epoch \d+|epoch \d+)", output)
    assert stopped, output[-4000:]
    saved = sorted(p.name for p in (digit_folders / "checkpoints").glob("interrupted-*/ckpt-*"))
    assert saved, output[-4000:]
    notes = {host: preset_notes(output, host) for host in ("algo-1", "algo-2")}
    for lines in notes.values():
        assert re.fullmatch(r"preset fast: 600 training examples \(300 \+ 300 on the hosts' shares\), counted in "
                            r"[0-9.]+ s \(a pass of channel 'train', read but not decoded\)", lines[0]), lines
    assert notes["algo-1"][1:] == notes["algo-2"][1:] and notes["algo-1"][2].startswith("600 training examples: small")
    assert notes["algo-1"][4] == ("given, so kept: augment=crop, backbone=mobilenet_v3_small, batch_size=32, "
                                  "epochs=100, fine_tune_epochs=1, image_size=32"), notes

    # the restarted job (new hosts, the same checkpoints, as a spot restart) picks up from there
    out = launch_local(*common, "--hp", "epochs=3", "--job-dir", "second", cwd=digit_folders)
    assert out.returncode == 0, out.stdout[-4000:]
    assert f"resuming from checkpoint {saved[-1]}: epoch " in out.stdout, out.stdout[-4000:]
    assert "metrics: epoch=1 " not in out.stdout  # done before the stop, not trained again
    again = preset_notes(out.stdout, "algo-1")
    assert again[1:4] == notes["algo-1"][1:4] and again[4] == notes["algo-1"][4].replace("epochs=100", "epochs=3")
    # one model: both hosts print the same numbers; the head's 3 epochs, then fine-tuning's one
    assert metric_lines(out.stdout, "algo-1") == metric_lines(out.stdout, "algo-2")
    assert metric_lines(out.stdout, "algo-1")[-1].startswith("metrics: epoch=4 ")
    assert (digit_folders / "second/algo-1/model/1/saved_model.pb").is_file()
