"""record_format=class_folders: File/FastFile channels of images in class folders, as the built-in
Image Classification - TensorFlow algorithm takes them, trained on as they are."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json

import pytest

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.errors import UserError
from tests.conftest import image_bytes
from tests.held_out import LEARNS, TRAINED, assert_the_model_learned_each_digit
from tests.job.conftest import CONFIG, DATA, failed, run_train, write_hyperparameters

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_file_that_is_not_an_image_is_a_data_error_naming_it(job, digit_photos):
    photos, labels = digit_photos
    class_folders(job, "train", photos[:40], labels[:40])
    (job.data_dir / "train" / "two" / "notes.txt").write_text("not a photo")
    write_hyperparameters(job, **QUICK)
    failed(job, run_train(job), DATA,
           "Data error: UnusableRecordError: unusable record #")
    assert f"file {job.data_dir}/train/two/notes.txt: image/encoded is not an image" in \
        (job.base / "output" / "failure").read_text().splitlines()[0]


@pytest.mark.slow
def test_a_folder_that_is_not_a_class_of_class_names_is_a_data_error(job, digit_photos):
    photos, labels = digit_photos
    class_folders(job, "train", photos[:40], labels[:40])
    write_hyperparameters(job, **QUICK, class_names=json.dumps(NAMES[:9]))  # no "nine"
    out = run_train(job)
    text = failed(job, out, DATA, "Data error: UnusableRecordError")
    assert "its folder 'nine' is not one of the job's classes (zero, one, two" in text.splitlines()[0]


@pytest.mark.slow
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


def test_the_split_keeps_a_share_of_each_class_folder_drawn_by_the_seed(tmp_path):
    from keras_pipe_train.sources.class_folders import split

    counts = {"cat": 10, "dog": 5, "eel": 3, "owl": 1}
    files = [str(tmp_path / name / f"{i}.jpg") for name, count in counts.items() for i in range(count)]
    train, validation = split(files, tmp_path, 0.2, seed=7)
    assert sorted(train + validation) == sorted(files) and not set(train) & set(validation)
    held = {name: sum(f.startswith(str(tmp_path / name) + "/") for f in validation) for name in counts}
    assert held == {"cat": 2, "dog": 1, "eel": 1, "owl": 0}  # 20 % rounded; one image left to train on
    assert split(list(reversed(files)), tmp_path, 0.2, seed=7) == (train, validation)  # whatever the order given
    assert any(split(files, tmp_path, 0.2, seed=seed)[1] != validation for seed in range(8, 12))


@pytest.mark.slow
def test_a_training_channel_alone_trains_and_validates_on_its_split(job, digit_photos, tmp_path, monkeypatch):
    """The built-in TensorFlow algorithm's request: one channel named `training`, of class folders,
    and validation_split_ratio. The log says how many images went each way; the audit shows the
    validation images the same on every epoch and never trained on, each class's share held out."""
    from keras_pipe_train.sources.example import encode_example
    from tests.job.conftest import audited, trained_records

    photos, labels = digit_photos[0][:120], digit_photos[1][:120]
    class_folders(job, "training", photos, labels)
    # (resize, its interpolation and the crop: their path through a job's training and validation)
    write_hyperparameters(job, **{**QUICK, "epochs": 2, "augment": "crop,flip"}, backbone="vgg16",
                          validation_split_ratio=0.2, seed=7, resize=40, resize_interpolation="bicubic")
    monkeypatch.setenv("TRAIN_AUDIT_DIR", str(tmp_path / "audit"))
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:]
    per_class = {label: labels.count(label) for label in set(labels)}
    held = {label: min(int(0.2 * count + 0.5), count - 1) for label, count in per_class.items()}
    kept_apart = sum(held.values())
    assert "channels: training (File) as train" in out.stdout
    assert (f"validation_split_ratio=0.2 (no 'validation' channel): of the 120 files of channel 'training', "
            f"{kept_apart} kept apart for validation, {120 - kept_apart} trained on") in out.stdout
    # every record, as the job reads it (the folders' names sorted are the class ids)
    ids = {label: sorted(NAMES).index(NAMES[label]) for label in per_class}
    label_of = {hashlib.sha1(encode_example(photo, ids[label])).hexdigest(): label
                for photo, label in zip(photos, labels)}
    (run,) = audited(tmp_path / "audit" / "audit-algo-1.jsonl").values()
    trained = [set(trained_records(run[epoch])) for epoch in (0, 1)]
    validated = [run[epoch]["validated"] for epoch in (0, 1)]
    assert trained[0] == trained[1] and len(trained[0]) == 120 - kept_apart
    assert validated[0] and sorted(validated[0]) == sorted(validated[1]) and len(validated[0]) == kept_apart
    assert not trained[0] & set(validated[0])  # never trained on
    assert trained[0] | set(validated[0]) == set(label_of)
    assert collections.Counter(label_of[d] for d in validated[0]) == {k: v for k, v in held.items() if v}
    summary = json.loads((job.base / "output/data/metrics.json").read_text())
    assert all({"val_loss", "val_accuracy"} <= set(row) for row in summary["epochs"]) and len(summary["epochs"]) == 2
    assert json.loads((job.base / "output/data/evaluation.json").read_text())["examples"] == kept_apart


def test_a_validation_channel_wins_over_the_split_and_other_formats_need_one(job, digit_photos, caplog):
    from keras_pipe_train.settings import contract
    from keras_pipe_train.settings.contract import ChannelConfig
    from keras_pipe_train.sources import datasets

    photos, labels = digit_photos
    class_folders(job, "train", photos[:30], labels[:30])
    layout, train = contract.paths(job.base), ChannelConfig("train", "File")
    config = JobConfig.from_hyperparameters({**QUICK, "class_names": json.dumps(NAMES), "validation_split_ratio": "0.2"})
    channels = {"train": train, "validation": ChannelConfig("validation", "File")}
    with caplog.at_level("INFO"):
        assert datasets.sources(config, layout, channels) == (datasets.Source(train),
                                                              datasets.Source(channels["validation"]))
    assert "validation_split_ratio=0.2 is not used: the job validates on its 'validation' channel" in caplog.text
    assert datasets.sources(config, layout, {"train": train}) == (datasets.Source(train, "train"),
                                                                 datasets.Source(train, "validation"))
    with pytest.raises(UserError, match=r"validation_split_ratio=0.01 keeps none of the 30 files of channel 'train' "
                                        r"apart for validation: a class folder needs at least 50 images"):
        datasets.sources(dataclasses.replace(config, validation_split_ratio=0.01), layout, {"train": train})
    records = JobConfig.from_hyperparameters({"num_classes": "10", "validation_split_ratio": "0.2"})
    with pytest.raises(UserError, match=r"channel 'train' holds TFRecords: give the job a 'validation' channel"):
        datasets.sources(records, layout, {"train": ChannelConfig("train", "Pipe")})
    assert datasets.sources(records, layout, channels)[1] == datasets.Source(channels["validation"])


def test_the_label_checks_pass_names_each_images_path_and_the_trained_records_stay_as_they_were(job, digit_photos):
    """An examined pass (the label check's: datasets.EpochInput(examined=...)) gives each image's
    path in the channel, as the suspects' CSV and page name them; a pass trained on reads the
    Examples it always did (no source: their audit digests unchanged)."""
    import tensorflow as tf

    from keras_pipe_train.settings import contract
    from keras_pipe_train.sources import datasets
    from keras_pipe_train.sources.example import encode_example

    photos, labels = digit_photos[0][:20], digit_photos[1][:20]
    class_folders(job, "train", photos, labels)
    config = JobConfig.from_hyperparameters({**{k: str(v) for k, v in QUICK.items()}, "num_classes": "10",
                                             "class_names": ",".join(sorted(NAMES))})
    spec = contract.read_input_data_config(job.config_dir)["train"]
    context = tf.distribute.InputContext()
    batches = list(datasets.evaluation_input(spec, contract.paths(job.base), config, examined=16)(context))
    paths = [path.decode() for batch in batches for path in batch[4].numpy()]
    expected = sorted(f"{NAMES[label]}/{'scans/' if i % 7 == 0 else ''}IMG {i:04d}.JPG"
                      for i, label in enumerate(labels))
    assert sorted(paths) == expected
    assert all((job.data_dir / "train" / path).read_bytes() in photos for path in paths)
    ids = {name: index for index, name in enumerate(sorted(NAMES))}
    trained, _ = datasets.records(spec, contract.paths(job.base), config)
    assert sorted(r.numpy() for r in trained) == sorted(encode_example(photo, ids[NAMES[label]])
                                                        for photo, label in zip(photos, labels))
