"""record_format=class_folders: File/FastFile channels of images in class folders, as the built-in
Image Classification - TensorFlow algorithm takes them, trained on as they are."""

from __future__ import annotations

import json

import pytest

from keras_pipe_train.config import JobConfig
from keras_pipe_train.errors import UserError
from tests.conftest import image_bytes
from tests.held_out import LEARNS, TRAINED, assert_the_model_learned_each_digit
from tests.job.conftest import run_train, write_hyperparameters
from tests.job.test_failures import CONFIG, DATA, failed

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
QUICK = dict(record_format="class_folders", image_size=32, epochs=1, weights="none", batch_size=16, augment="false")


@pytest.fixture(scope="module")
def digit_photos():
    from keras_pipe_launch.sample_data import digit_jpeg, load_digits

    images, labels = load_digits()
    return [digit_jpeg(image, 32) for image in images[:TRAINED + 60]], [int(y) for y in labels[:TRAINED + 60]]


def class_folders(job, channel: str, photos, labels, mode: str = "File") -> None:
    """The channel as SageMaker copies an S3 prefix of class folders into it (keys kept as paths)."""
    job.add_channel(channel, mode=mode)
    root = job.data_dir / channel
    for i, (photo, label) in enumerate(zip(photos, labels)):
        folder = root / NAMES[label] / ("scans" if i % 7 == 0 else "")  # (images deeper down count too)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"IMG {i:04d}.JPG").write_bytes(photo)
    (root / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")  # hidden: never data


def test_class_folders_train_as_they_are_and_each_folder_is_its_class(job, digit_photos):
    """The classes are the folders' names sorted (eight, five, four, ...), not the digits' order:
    each held-out digit must come back as its folder's name, class by class."""
    photos, labels = digit_photos
    class_folders(job, "train", photos[:TRAINED], labels[:TRAINED])
    class_folders(job, "validation", photos[TRAINED:], labels[TRAINED:])
    (job.data_dir / "train" / "three" / "scan.png").write_bytes(image_bytes("PNG", 40, 30))
    (job.data_dir / "train" / "three" / "notes.txt").write_text("scanned on Monday")
    write_hyperparameters(job, **{**QUICK, **LEARNS}, max_corrupted_records_to_skip=1)
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "SKIPPED unusable record" in out.stdout and "notes.txt: image/encoded is not an image" in out.stdout
    assert f"class_names={tuple(sorted(NAMES))}" in out.stdout  # the folders' names, sorted
    assert json.loads((job.base / "model" / "classes.json").read_text()) == sorted(NAMES)
    # each class's held-out images at least 30 % right, all of them 70 % (chance: 10 %; tests/held_out.py)
    print("held out, each class:", assert_the_model_learned_each_digit(job.base / "model"))


def test_a_file_that_is_not_an_image_is_a_data_error_naming_it(job, digit_photos):
    photos, labels = digit_photos
    class_folders(job, "train", photos[:40], labels[:40])
    (job.data_dir / "train" / "two" / "notes.txt").write_text("not a photo")
    write_hyperparameters(job, **QUICK)
    failed(job, run_train(job), DATA,
           "Data error: UnusableRecordError: unusable record #")
    assert f"file {job.data_dir}/train/two/notes.txt: image/encoded is not an image" in \
        (job.base / "output" / "failure").read_text().splitlines()[0]


def test_a_folder_that_is_not_a_class_of_class_names_is_a_data_error(job, digit_photos):
    photos, labels = digit_photos
    class_folders(job, "train", photos[:40], labels[:40])
    write_hyperparameters(job, **QUICK, class_names=json.dumps(NAMES[:9]))  # no "nine"
    out = run_train(job)
    text = failed(job, out, DATA, "Data error: UnusableRecordError")
    assert "its folder 'nine' is not one of the job's classes (zero, one, two" in text.splitlines()[0]


def test_class_folders_in_pipe_mode_are_refused_with_the_reason(job, digit_photos):
    photos, labels = digit_photos
    class_folders(job, "train", photos[:20], labels[:20])
    job.add_channel("train", mode="Pipe")
    write_hyperparameters(job, **QUICK, class_names=json.dumps(NAMES))
    failed(job, run_train(job), CONFIG, "Configuration error: channel 'train' is in Pipe mode, but "
                                        "record_format=class_folders")


def test_the_launcher_checks_class_folder_jobs_without_their_classes():
    config = JobConfig.from_hyperparameters({"record_format": "class_folders", "top_k": "3"})
    assert config.class_names is None  # (the job reads them from its train channel)
    with pytest.raises(UserError, match="record_format=class_folders gives each image the one class"):
        JobConfig.from_hyperparameters({"record_format": "class_folders", "multi_label": "true"})
    with pytest.raises(UserError, match="num_classes \\(or class_names\\) is required"):
        JobConfig.from_hyperparameters({"record_format": "tfrecord"})
