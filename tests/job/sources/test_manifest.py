"""Augmented manifests (Ground Truth's output) in Pipe mode: the job given a fake /opt/ml whose
FIFOs carry what SageMaker streams for a channel with S3DataType AugmentedManifestFile and
RecordWrapperType RecordIO: for each manifest line, one RecordIO record per listed attribute (the
image object's bytes, then the label's JSON, then its metadata's), fed by a real writer process."""

from __future__ import annotations

import json

import pytest

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.sources import manifest
from keras_pipe_train.sources.example import encode_example
from tests.held_out import LEARNS, TRAINED, assert_the_model_learned_each_digit
from tests.job.conftest import CONFIG, DATA, failed, run_train, write_hyperparameters

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
ATTRIBUTES = "source-ref,digit,digit-metadata"


def ground_truth_lines(images: list[bytes], labels: list[int]) -> list[list[bytes]]:
    """Each line's streamed attributes, as Ground Truth labels an image and SageMaker streams it."""
    return [[image, json.dumps(label).encode(), json.dumps({
        "class-name": NAMES[label], "confidence": 0.93, "type": "groundtruth/image-classification",
        "job-name": "labeling-job/digits", "human-annotated": "yes", "creation-date": "2026-11-02T10:11:12.000000",
    }).encode()] for image, label in zip(images, labels)]


def stream_manifest(job, channel: str, lines: list[list[bytes]], wrapper: str = "RecordIO", **feed) -> None:
    """Pipe channel `channel` streaming the lines' attributes, each its own RecordIO record."""
    job.add_channel(channel, wrapper=wrapper)
    files = [job.write(f"{channel}-{i:05d}-{j}", value) for i, line in enumerate(lines) for j, value in enumerate(line)]
    job.feed(channel, files, wrapper=wrapper, **feed)


@pytest.fixture(scope="module")
def digit_images(digit_records):
    from keras_pipe_launch.sample_data import digit_jpeg, load_digits

    images, labels = load_digits()
    return [digit_jpeg(image, 32) for image in images[:TRAINED + 60]], [int(y) for y in labels[:TRAINED + 60]]


def config(**values) -> JobConfig:
    return JobConfig.from_hyperparameters({"num_classes": "10", "attribute_names": ATTRIBUTES, **values})


@pytest.mark.slow
def test_the_container_trains_on_a_ground_truth_manifest_stream_and_each_line_is_its_class(job, digit_images):
    images, labels = digit_images
    stream_manifest(job, "train", ground_truth_lines(images[:TRAINED], labels[:TRAINED]))
    stream_manifest(job, "validation", ground_truth_lines(images[TRAINED:], labels[TRAINED:]))
    write_hyperparameters(job, attribute_names=json.dumps(ATTRIBUTES.split(",")), class_names=json.dumps(NAMES),
                          **LEARNS)
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "train_loss" in out.stdout and "val_accuracy" in out.stdout
    assert json.loads((job.base / "model" / "classes.json").read_text()) == NAMES
    # each held-out digit comes back as its class's name: each class's at least 30 % right, all of
    # them 70 % (chance: 10 %; tests/held_out.py)
    print("held out, each class:", assert_the_model_learned_each_digit(job.base / "model"))


@pytest.mark.slow
def test_a_manifest_line_makes_the_example_prepare_writes_for_the_same_image(digit_images):
    images, labels = digit_images
    combine = manifest.combiner(config(class_names=json.dumps(NAMES)))
    for line, image, label in zip(ground_truth_lines(images[:20], labels[:20]), images, labels):
        assert combine(line) == encode_example(image, label)


@pytest.mark.parametrize("value, label", [(b"3", 3), (b'"3"', 3), (b"3.0", 3), (b"3", 3), (b" 7 ", 7)])
def test_label_values_as_ground_truth_and_the_built_ins_write_them(value, label):
    combine = manifest.combiner(config(attribute_names="source-ref,class"))
    assert combine([b"jpeg", value]) == encode_example(b"jpeg", label)


@pytest.mark.parametrize("values, value, problem", [
    ({}, b"[0, 2]", "label attribute 'class' holds a list ([0, 2]): a multi-label manifest needs hyperparameter "
                    "multi_label=true"),
    ({}, b"1.5", "label attribute 'class' holds 1.5, not a class id"),
    ({}, b"true", "label attribute 'class' holds true, not a class id"),
    ({}, b"cat", "label attribute 'class' holds 'cat', not a class id"),
    ({}, b"\xff\xd8\xff", "attribute 'class' is not text"),
    ({"multi_label": "true", "label_format": "multi_hot"}, b"[1, 0]",
     "label attribute 'class' holds [1, 0]; label_format=multi_hot needs a list of 10 values"),
])
def test_a_label_that_is_not_valid_says_what_it_holds(values, value, problem):
    combine = manifest.combiner(config(attribute_names="source-ref,class", **values))
    with pytest.raises(ValueError) as info:
        combine([b"jpeg", value])
    assert str(info.value).startswith(problem)


def test_multi_label_lines_as_ground_truth_and_mxnet_write_them():
    from tensorflow.core.example import example_pb2

    ground_truth = manifest.combiner(config(multi_label="true"))
    metadata = json.dumps({"class-map": {"0": "zero", "2": "two"}, "type": "groundtruth/image-classification-multilabel",
                           "confidence-map": {"0": 0.9, "2": 0.8}}).encode()
    record = example_pb2.Example.FromString(ground_truth([b"jpeg", b"[0, 2]", metadata]))
    assert list(record.features.feature["image/class/label"].int64_list.value) == [0, 2]
    mxnet = manifest.combiner(config(multi_label="true", label_format="multi_hot", attribute_names="source-ref,class"))
    record = example_pb2.Example.FromString(mxnet([b"jpeg", b'"[1, 0, 1, 0, 0, 0, 0, 0, 0, 0]"'.strip(b'"')]))
    assert list(record.features.feature["image/class/label"].float_list.value) == [1, 0, 1, 0, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("value", [b"[1, 0, 1, 0, 0, 0, 0, 0, 0, 0]", b'"[1, 0, 1, 0, 0, 0, 0, 0, 0, 0]"'])
def test_a_label_list_written_as_a_string_as_aws_ic_page_writes_it(value):
    """The IC page's multi-label lines hold their labels as a string ("class": "[1, 0, 1]"): streamed
    as its text or as its JSON, it is the list."""
    from tensorflow.core.example import example_pb2

    mxnet = manifest.combiner(config(multi_label="true", label_format="multi_hot", attribute_names="source-ref,class"))
    record = example_pb2.Example.FromString(mxnet([b"jpeg", value]))
    assert list(record.features.feature["image/class/label"].float_list.value) == [1, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    ids = manifest.combiner(config(multi_label="true", attribute_names="source-ref,class"))
    record = example_pb2.Example.FromString(ids([b"jpeg", b'"[0, 2]"']))
    assert list(record.features.feature["image/class/label"].int64_list.value) == [0, 2]


def test_multi_label_ids_are_kept_sorted_as_prepare_writes_them_and_deep_json_is_refused():
    from tensorflow.core.example import example_pb2

    combine = manifest.combiner(config(multi_label="true", attribute_names="source-ref,class"))
    record = example_pb2.Example.FromString(combine([b"jpeg", b'[2, "0"]']))
    assert list(record.features.feature["image/class/label"].int64_list.value) == [0, 2]
    with pytest.raises(ValueError, match="lists a class id twice"):
        combine([b"jpeg", b"[2, 2.0]"])
    with pytest.raises(ValueError, match="nested too deeply"):
        combine([b"jpeg", b"[" * 100000 + b"]" * 100000])


def test_metadata_that_names_a_class_otherwise_than_class_names_is_refused():
    combine = manifest.combiner(config(class_names=json.dumps(NAMES)))
    line = [b"jpeg", b"3", json.dumps({"class-name": "cat"}).encode()]
    with pytest.raises(ValueError, match="its digit-metadata calls class 3 'cat', but hyperparameter class_names calls "
                                         "it 'three'"):
        combine(line)
    multi = manifest.combiner(config(class_names=json.dumps(NAMES), multi_label="true"))
    with pytest.raises(ValueError, match="calls class 2 'bird'"):
        multi([b"jpeg", b"[0, 2]", json.dumps({"class-map": {"0": "zero", "2": "bird"}}).encode()])


@pytest.mark.parametrize("names, problem", [
    ("source-ref", "must list one label attribute besides the image (and its -metadata); it lists 0"),
    ("image,label", "must list one image attribute, whose name ends in -ref; it lists 0"),
    ("source-ref,label,other", "must list one label attribute besides the image (and its -metadata); it lists 2 "
                               "(label, other)"),
    ("source-ref,label,class-metadata", "the only -metadata attribute the job reads is the label's (label-metadata)"),
    ("a-ref,b-ref,label", "must list one image attribute, whose name ends in -ref; it lists 2"),
])
def test_attribute_names_that_do_not_name_an_image_and_a_label_are_refused(names, problem):
    with pytest.raises(UserError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        config(attribute_names=names)


@pytest.mark.slow
def test_a_manifest_channel_without_recordio_wrapping_is_refused_before_reading(job, digit_images):
    images, labels = digit_images
    stream_manifest(job, "train", ground_truth_lines(images[:8], labels[:8]), wrapper="None")
    write_hyperparameters(job, attribute_names=ATTRIBUTES, num_classes=10, image_size=32, epochs=1, weights="none")
    failed(job, run_train(job), CONFIG,
           "Configuration error: channel 'train' has RecordWrapperType None: with attribute_names "
           "(source-ref,digit,digit-metadata) it must be RecordIO")


@pytest.mark.slow
def test_a_bad_label_is_a_data_error_naming_the_manifest_line(job, digit_images):
    images, labels = digit_images
    lines = ground_truth_lines(images[:40], labels[:40])
    lines[13][1] = b'"thirteen"'
    stream_manifest(job, "train", lines)
    write_hyperparameters(job, attribute_names=ATTRIBUTES, num_classes=10, image_size=32, epochs=1, weights="none")
    failed(job, run_train(job), DATA,
           f"Data error: UnusableRecordError: unusable record #39 at byte offset "
           f"{sum(len(v) + 8 + (-len(v) % 4) for line in lines[:13] for v in line)} of channel 'train' pass 0 (FIFO "
           f"{job.data_dir}/train_0): manifest line 14 of this pass (RecordIO records #39-#41): label attribute "
           "'digit' holds 'thirteen', not a class id")


@pytest.mark.slow
def test_a_stream_cut_inside_a_line_is_a_data_error(job, digit_images):
    images, labels = digit_images
    lines = ground_truth_lines(images[:40], labels[:40])
    stream_manifest(job, "train", lines[:-1] + [lines[-1][:2]])
    write_hyperparameters(job, attribute_names=ATTRIBUTES, num_classes=10, image_size=32, epochs=1, weights="none")
    failed(job, run_train(job), DATA, "Data error: TruncatedRecordError: corrupt record #117 at byte offset")
