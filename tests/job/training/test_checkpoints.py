"""Whose checkpoints are in /opt/ml/checkpoints: a job resumes its own, refuses another job's unless
told what to do with them, shares the folder safely with other writers, and finds an unusable
folder before training rather than after an epoch."""

import json
import os
import resource
import subprocess
import sys

import keras
import pytest

from keras_pipe_train.training.checkpoints import KEEP, CheckpointError, Checkpoints, Progress
from tests.conftest import REPO, FakeJob, run_logged
from tests.job.conftest import file_channel, start_train, write_hyperparameters
from tests.timeouts import wait_s

CONFIG = 2
HPS = dict(num_classes=10, image_size=32, epochs=1, batch_size=32, augment="false")


def job_on(folder, shared, digit_records, **changes) -> FakeJob:
    """A fake /opt/ml whose checkpoints folder is `shared` (as SageMaker syncs one checkpoint_s3_uri)."""
    fake = FakeJob(folder / "opt_ml")
    file_channel(fake, "train", digit_records[0][:64], shards=1)
    shared.mkdir(exist_ok=True)
    (fake.base / "checkpoints").symlink_to(shared)
    return fake


def train(fake: FakeJob, name: str, head_only_weights, preexec_fn=None, **hps):
    write_hyperparameters(fake, **{**HPS, "weights": str(head_only_weights), **hps})
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(fake.base), "TRAINING_JOB_NAME": name}
    return run_logged([sys.executable, str(REPO / "container" / "train")], 270, env=env, cwd=fake.base,
                      preexec_fn=preexec_fn)


def first_line(fake: FakeJob) -> str:
    return (fake.base / "output" / "failure").read_text().splitlines()[0]


@pytest.mark.slow
def test_another_jobs_checkpoints_are_refused_then_ignored_or_continued_as_told(tmp_path, digit_records, head_only_weights):
    shared = tmp_path / "checkpoints"
    first = job_on(tmp_path / "first", shared, digit_records)
    assert train(first, "first", head_only_weights, epochs=2).returncode == 0
    (older,) = shared.glob("first-*")
    assert len(list(older.glob("ckpt-*"))) == 2

    # another job, other settings: refused before training, saying whose they are and what differs
    second = job_on(tmp_path / "second", shared, digit_records)
    out = train(second, "second", head_only_weights, epochs=2, learning_rate=0.01)
    assert out.returncode == CONFIG, out.stdout[-2000:]
    line = first_line(second)
    assert line.startswith(f"Configuration error: the checkpoint folder {second.base}/checkpoints holds "
                           f"checkpoints of another job: job 'first' ({older.name}/ckpt-000002, epoch 3, "), line
    assert "with other settings (learning_rate 0.001 -> 0.01)" in line and "other_checkpoints=ignore" in line
    assert not (second.base / "model" / "1").exists()
    # other settings cannot be continued ...
    out = train(second, "second", head_only_weights, epochs=2, learning_rate=0.01, other_checkpoints="resume")
    assert out.returncode == CONFIG and "holds no checkpoint written with this job's settings" in first_line(second)
    # ... but can be left alone: this job trains afresh in its own subfolder, the first job's stay
    out = train(second, "second", head_only_weights, epochs=2, learning_rate=0.01, other_checkpoints="ignore")
    assert out.returncode == 0, out.stdout[-2000:]
    assert "metrics: epoch=1 " in out.stdout and len(list(older.glob("ckpt-*"))) == 2
    assert [p.name.split("-")[0] for p in sorted(shared.iterdir())] == ["first", "second"]

    # the same settings as the first job, in a new job: continued when asked to (train longer)
    third = job_on(tmp_path / "third", shared, digit_records)
    out = train(third, "third", head_only_weights, epochs=2)
    assert out.returncode == CONFIG and "job 'first'" in first_line(third) and "the same settings" in first_line(third)
    out = train(third, "third", head_only_weights, epochs=3, other_checkpoints="resume")
    assert out.returncode == 0, out.stdout[-2000:]
    assert f"continuing checkpoint {older.name}/ckpt-000002 of job 'first'" in out.stdout
    assert "metrics: epoch=3 " in out.stdout and "metrics: epoch=1 " not in out.stdout


@pytest.mark.slow
def test_two_jobs_at_once_on_one_folder_each_keep_their_own_checkpoints(tmp_path, digit_records, head_only_weights):
    shared = tmp_path / "checkpoints"
    jobs = {name: job_on(tmp_path / name, shared, digit_records) for name in ("left", "right")}
    for fake in jobs.values():
        write_hyperparameters(fake, **{**HPS, "weights": str(head_only_weights), "epochs": 5, "other_checkpoints": "ignore"})
    running = [start_train(fake, TRAINING_JOB_NAME=name) for name, fake in jobs.items()]
    outputs = [p.communicate(timeout=wait_s(270))[0] for p in running]
    assert [p.returncode for p in running] == [0, 0], [o[-2000:] for o in outputs]
    for name in jobs:
        (own,) = shared.glob(f"{name}-*")
        assert [p.name for p in sorted(own.glob("ckpt-*"))] == [f"ckpt-{n:06d}" for n in range(6 - KEEP, 6)]
    assert not list(shared.rglob(".writing-*"))


SAVER = r"""
import sys, keras
from keras_pipe_train.training.checkpoints import Checkpoints, Progress
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
optimizer = keras.optimizers.Adam()
optimizer.build(model.trainable_variables)
checkpoints = Checkpoints(sys.argv[1], True, "same-job", {"seed": 0})
for i in range(int(sys.argv[2])):
    checkpoints.save(model, optimizer, Progress("head", i, 0, 32))
"""


@pytest.mark.slow
def test_the_same_job_saving_twice_at_once_never_collides(tmp_path):
    """Two processes of one job (started twice by mistake) on one folder: before the lock they
    computed the same next number and one crashed renaming onto the other's checkpoint."""
    savers = [subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path), "12"], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [s.communicate(timeout=wait_s(240))[0] for s in savers]
    assert [s.returncode for s in savers] == [0, 0], [o[-2000:] for o in outputs]
    (own,) = tmp_path.glob("same-job-*")
    names = sorted(p.name for p in own.glob("ckpt-*"))
    assert len(names) >= KEEP and all((own / n / "progress.json").is_file() for n in names)
    assert not list(own.glob(".writing-*"))


@pytest.mark.slow
def test_a_folder_that_cannot_be_written_fails_the_job_before_training(tmp_path, digit_records, head_only_weights):
    fake = job_on(tmp_path / "job", tmp_path / "unused", digit_records)
    (fake.base / "checkpoints").unlink()
    (fake.base / "checkpoints").write_text("a file where the folder should be")
    out = train(fake, "blocked", head_only_weights)
    assert out.returncode == CONFIG, out.stdout[-2000:]
    assert first_line(fake).startswith(f"Configuration error: the checkpoint folder {fake.base}/checkpoints cannot "
                                       "be written (Not a directory)")
    assert "metrics:" not in out.stdout


def test_a_folder_without_room_for_one_checkpoint_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match=r"has \d+ MB free, and a checkpoint of this model and its optimizer "
                                              r"takes about 1000000000000 MB: the disk is full; raise the volume size"):
        Checkpoints(tmp_path, True, "big", {}).check_writable(10**18)


@pytest.mark.slow
def test_a_write_that_fails_midway_is_reported_as_what_it_is_and_leaves_no_debris(tmp_path, digit_records, head_only_weights):
    fake = job_on(tmp_path / "job", tmp_path / "checkpoints", digit_records)

    def small_files():  # files may not grow past 1 MB: a checkpoint of this model is bigger
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    out = train(fake, "limited", head_only_weights, preexec_fn=small_files)
    assert out.returncode == CONFIG, out.stdout[-2000:] + out.stderr[-2000:]
    line = first_line(fake)
    assert line.startswith(f"Configuration error: could not write a checkpoint to {fake.base}/checkpoints/limited-"), line
    assert line.endswith("(File too large): a file grew past the size limit of this system (ulimit -f)"), line
    assert not list((tmp_path / "checkpoints").rglob(".writing-*")) and not list((tmp_path / "checkpoints").rglob("ckpt-*"))


def test_progress_files_say_whose_checkpoint_it_is(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    saved = Checkpoints(tmp_path, True, "mine", {"seed": 3}).save(model, optimizer, Progress("head", 1, 5, 32))
    written = json.loads((saved / "progress.json").read_text())
    assert (written["job"], written["settings"], written["epoch"], written["steps"]) == ("mine", {"seed": 3}, 1, 5)
    assert Checkpoints(tmp_path, True, "yours", {"seed": 3}).others()[0].path == saved


@pytest.mark.parametrize("error, hint", [
    (OSError(28, "No space left on device"), "the disk is full; raise the volume size"),
    (OSError(122, "Disk quota exceeded"), "the disk is full"),
    (OSError(13, "Permission denied"), "the folder is not writable by the job"),
    (OSError(30, "Read-only file system"), "the folder is not writable by the job"),
    (Exception("{{function_node SaveV2}} /opt/ml/checkpoints/x/state; No space left on device [Op:SaveV2]"),
     "the disk is full"),
    (Exception("/opt/ml/checkpoints/x; Permission denied"), "the folder is not writable"),
    (Exception("something else"), "check the folder and the disk it is on"),
])
def test_failed_writes_say_what_to_do(error, hint):
    from keras_pipe_train.training.checkpoints import _hint, _why

    assert _hint(error).startswith(hint)
    if not isinstance(error, OSError):
        assert "{{" not in _why(error) and "[Op:" not in _why(error)
