"""Ground Truth's class names: without hyperparameter class_names, a manifest job's model is named
by what its lines' label metadata says (class-name, class-map), gathered from every host, and the
log says so; a class that two lines name otherwise is a data error naming both lines."""

from __future__ import annotations

import json
import logging

import pytest

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.errors import DataError
from keras_pipe_train.sources import manifest
from tests.job.conftest import DATA, failed, run_train, write_hyperparameters

COLOURS = ["red", "green", "blue", "white"]
ATTRIBUTES = "source-ref,label,label-metadata"
QUICK = dict(num_classes=4, image_size=32, epochs=1, weights="none", batch_size=8, augment="false", backbone="vgg16")


@pytest.fixture(scope="module")
def images() -> tuple[list[bytes], list[int]]:
    """32 JPEGs of the digits 0 to 3, 8 of each, in turn: (images, their digits as class ids)."""
    from keras_pipe_launch.sample_data import digit_jpeg, load_digits

    digits, labels = load_digits()
    chosen = [[i for i, label in enumerate(labels) if label == digit][:8] for digit in range(4)]
    order = [chosen[digit][n] for n in range(8) for digit in range(4)]
    return [digit_jpeg(digits[i], 32) for i in order], [int(labels[i]) for i in order]


def lines_of(images: list[bytes], labels: list[int], names: list[str]) -> list[list[bytes]]:
    """Each line's streamed attributes: the image, its class id, Ground Truth's metadata naming it."""
    return [[image, json.dumps(label).encode(), json.dumps({
        "class-name": names[label], "confidence": 0.9, "type": "groundtruth/image-classification",
        "job-name": "labeling-job/colours", "human-annotated": "yes"}).encode()]
        for image, label in zip(images, labels)]


def stream_lines(job, channel: str, lines: list[list[bytes]]) -> None:
    job.add_channel(channel, wrapper="RecordIO")
    files = [job.write(f"{channel}-{i:05d}-{j}", value) for i, line in enumerate(lines) for j, value in enumerate(line)]
    job.feed(channel, files, wrapper="RecordIO")


@pytest.mark.slow
def test_without_class_names_the_model_is_named_by_the_manifests_metadata(job, images):
    stream_lines(job, "train", lines_of(*images, COLOURS))
    write_hyperparameters(job, attribute_names=ATTRIBUTES, **QUICK)
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:]
    assert json.loads((job.base / "model" / "classes.json").read_text()) == COLOURS
    assert ("class names: red, green, blue, white, from the manifest lines' label-metadata (class-name, class-map)"
            in out.stdout + out.stderr), out.stdout[-3000:]


@pytest.mark.slow
def test_a_class_two_lines_name_otherwise_is_a_data_error_naming_both_lines(job, images):
    lines = lines_of(*images, COLOURS)
    metadata = json.loads(lines[9][2])  # (line 10: class 1, which line 2 calls green)
    lines[9][2] = json.dumps({**metadata, "class-name": "lime"}).encode()
    stream_lines(job, "train", lines)
    write_hyperparameters(job, attribute_names=ATTRIBUTES, max_corrupted_records_to_skip=5, **QUICK)
    failed(job, run_train(job), DATA,
           f"Data error: UnusableRecordError: unusable record #27 at byte offset "
           f"{sum(len(v) + 8 + (-len(v) % 4) for line in lines[:9] for v in line)} of channel 'train' pass 0 (FIFO "
           f"{job.data_dir}/train_0): manifest line 10 of this pass (RecordIO records #27-#29): its label-metadata "
           f"calls class 1 'lime', but manifest line 2 of channel 'train' pass 0 (FIFO {job.data_dir}/train_0) "
           "(RecordIO records #3-#5) calls it 'green': a class has one name")


def config(**values) -> JobConfig:
    return JobConfig.from_hyperparameters({"num_classes": "4", "attribute_names": ATTRIBUTES, **values})


def seen_on(host: str, named: dict[int, str]) -> str:
    """A host's text for the gather: the names its lines gave, each with the line that gave it."""
    seen = manifest.ClassNames()
    seen.named = {label: (name, f"manifest line {label + 1} of channel 'train' pass 0")
                  for label, name in named.items()}
    return seen.to_text(host)


def test_the_names_every_host_read_are_merged_and_must_agree(caplog):
    """Each host reads its share of the lines (ShardedByS3Key): a class may be named on one host
    only. Every host gets every host's names (a collective), and settles the same names."""
    chief = manifest.ClassNames()
    chief.named = {0: ("red", "manifest line 1 of channel 'train' pass 0"),
                   1: ("green", "manifest line 2 of channel 'train' pass 0")}
    other = seen_on("algo-2", {1: "green", 3: "white"})
    with caplog.at_level(logging.INFO, logger="keras_pipe_train.sources.manifest"):
        names = manifest.class_names(config(), chief, "algo-1", lambda text: [text, other])
    assert names == ("red", "green", "2", "white")
    assert "class names: red, green, 2, white, from the manifest lines' label-metadata (class-name, class-map); no " \
           "line named class 2, called so" in caplog.text
    disagreeing = seen_on("algo-2", {1: "lime"})
    with pytest.raises(DataError, match=r"manifest line 2 of channel 'train' pass 0 on algo-2 calls class 1 'lime' in "
                                        r"its label-metadata, but manifest line 2 of channel 'train' pass 0 on algo-1 "
                                        "calls it 'green'"):
        manifest.class_names(config(), chief, "algo-1", lambda text: [text, disagreeing])
    # hyperparameter class_names, when given, names the model (each line's metadata is checked against it)
    given = config(class_names=json.dumps(["r", "g", "b", "w"]))
    assert manifest.class_names(given, chief, "algo-1", lambda text: [text, disagreeing]) == ("r", "g", "b", "w")


@pytest.mark.slow
def test_on_two_hosts_each_with_its_share_of_the_lines_the_model_has_every_hosts_names(tmp_path, images):
    """ShardedByS3Key deals the lines out in turn: the chief reads only classes 0 and 2 (red, blue),
    the other host only 1 and 3 (green, white); the model the chief exports is named by all four."""
    from tests.conftest import launch_local

    with open(tmp_path / "train.manifest", "w") as manifest_file:
        for i, (image, label) in enumerate(zip(*images)):
            (tmp_path / f"{i:03d}.jpg").write_bytes(image)
            manifest_file.write(json.dumps({"source-ref": f"{i:03d}.jpg", "label": label, "label-metadata": {
                "class-name": COLOURS[label], "type": "groundtruth/image-classification"}}) + "\n")
    hyperparameters = [option for name, value in QUICK.items() for option in ("--hp", f"{name}={value}")]
    out = launch_local("--train", "train.manifest", "--attribute-names", ATTRIBUTES, "--instance-count", "2",
                       "--distribution", "ShardedByS3Key", *hyperparameters, "--job-dir", "job", cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert json.loads((tmp_path / "job" / "algo-1" / "model" / "classes.json").read_text()) == COLOURS
    for host in ("algo-1", "algo-2"):  # (each settled the same names)
        assert (f"{host} | " in out.stdout and any(
            line.startswith(f"{host} | ") and "class names: red, green, blue, white, from the manifest lines'" in line
            for line in out.stdout.splitlines())), out.stdout[-4000:]
