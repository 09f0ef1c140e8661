"""The built-in MXNet image classifier's channels, as AWS's notebooks send them, trained on with no
hyperparameter of this job's: the format is the train channel's ContentType and RecordWrapperType
(keras_pipe_train.sources.content_types), read as the built-in reads it (AWS's IC page, "Input/Output
Interface"):

    application/x-recordio, RecordIO wrapper (Pipe)   an augmented manifest, image then label
    application/x-recordio (File)                     im2rec's .rec files
    application/x-image (File)                        images, listed by train_lst's .lst file
    application/x-sagemaker-model                     incremental training's `model` channel

Here: which format each content type gives (and what is refused, naming why), and the .lst
reader, line by line. The jobs that train on each of these channels as the notebooks lay them out,
their records audited (the digest of the serialized Example of every record trained and validated
on must be exactly those of the images and labels the test wrote), and served to the notebooks'
clients: tests/builtin (the full-training notebook's .rec files and the incremental notebook's
`model` channel in test_full_training_notebooks.py; the lst-format, multi-label and Ground Truth
notebooks' in test_notebooks.py). The helpers that lay the channels out are here, shared with them.
"""

from __future__ import annotations

import json
import struct

import pytest

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.errors import UserError
from tests.builtin import notebooks
from tests.conftest import REPO
from tests.job.conftest import CONFIG, audited, failed, run_train, trained_records, write_hyperparameters

DATA_DIR = REPO / "tests" / "data"
RECORDIO, IMAGE = "application/x-recordio", "application/x-image"
HEADER = struct.Struct("<IfQQ")  # MXNet's image record header (sources/mxnet_records.py)


def mxnet_images(name: str) -> list[tuple[bytes, list[float]]]:
    """(JPEG, labels) of each record of tests/data/`name` (written by MXNet's own writer)."""
    from pipemode import recordio
    from pipemode.corruption import CorruptionPolicy
    from tests.conftest import stream_reader

    data = (DATA_DIR / name).read_bytes()
    records = [r for batch in recordio.RecordIODecoder(CorruptionPolicy(0)).records(stream_reader(data), name)
               for r in batch]
    out = []
    for payload in records:
        flag, label, _, _ = HEADER.unpack_from(payload)
        labels = list(struct.unpack_from(f"<{flag}f", payload, HEADER.size)) if flag else [label]
        out.append((payload[HEADER.size + 4 * flag:], labels))
    return out


def digits() -> list[tuple[bytes, int]]:
    return [(image, int(labels[0])) for image, labels in mxnet_images("digits-mxnet.rec")]


def example(image: bytes, label, multi_hot: bool = False) -> str:
    """The digest the audit gives the Example of `image` and `label` (the job's default features)."""
    import hashlib

    from keras_pipe_train.sources.example import encode_example

    return hashlib.sha1(encode_example(image, label, multi_hot=multi_hot)).hexdigest()


def read_as(audit_dir, expected_train: list[str], expected_validation: list[str]) -> None:
    """The job's one epoch trained on exactly the records `expected_train` and validated on
    `expected_validation` (digests: example())."""
    (run,) = audited(audit_dir / "audit-algo-1.jsonl").values()
    assert sorted(trained_records(run[0])) == sorted(expected_train)
    assert sorted(run[0]["validated"]) == sorted(expected_validation)


def lst_lines(entries, im2rec: bool = True) -> str:
    """A .lst file of (index, labels, path), as im2rec --list writes it (labels "%f") or as AWS's
    multi-label notebook does (str() of each 0 or 1)."""
    return "".join(f"{index}\t" + "".join((f"{v:f}" if im2rec else str(v)) + "\t" for v in labels) + f"{path}\n"
                   for index, labels, path in entries)


def lst_channels(job, role: str, images: list[tuple[bytes, list]], first_index: int, content_type: str = IMAGE,
                 im2rec: bool = True) -> None:
    """Channel `role` holding the images under digits/, and `role`_lst its .lst file."""
    job.add_channel(role, mode="File", content_type=content_type)
    job.add_channel(f"{role}_lst", mode="File", content_type=content_type)
    (job.data_dir / role / "digits").mkdir(parents=True)
    (job.data_dir / f"{role}_lst").mkdir()
    entries = []
    for i, (image, labels) in enumerate(images):
        (job.data_dir / role / "digits" / f"d{first_index + i}.jpg").write_bytes(image)
        entries.append((first_index + i, labels, f"digits/d{first_index + i}.jpg"))
    (job.data_dir / f"{role}_lst" / f"{role}.lst").write_text(lst_lines(entries, im2rec))


def ground_truth_lines(images: list[tuple[bytes, int]]) -> list[list[bytes]]:
    """What SageMaker streams of each manifest line for AttributeNames ["source-ref", "category"]:
    the image, then the label, as Ground Truth writes it (3) or as AWS's IC page does ("3")."""
    forms = (lambda y: json.dumps(y), lambda y: json.dumps(str(y)), lambda y: f"{y}.0")
    return [[image, forms[i % 3](label).encode()] for i, (image, label) in enumerate(images)]


def test_the_built_ins_content_types_decide_the_format_and_nothing_else_does():
    from keras_pipe_train.settings.contract import ChannelConfig
    from keras_pipe_train.sources.content_types import from_channels

    def channels(content_type, *names, mode="File", wrapper="None"):
        return {name: ChannelConfig(name, mode, record_wrapper=wrapper, content_type=content_type)
                for name in ("train", "validation", *names)}

    mxnet = {**notebooks.mxnet_multi_label(10, 100), "weights": "none"}
    read = {}
    for content_type in (IMAGE, "image/jpeg", "image/png", "application/jpeg", "Application/X-Image"):
        read[content_type] = from_channels(mxnet, channels(content_type, "train_lst", "validation_lst"))
    assert {d.hyperparameters["record_format"] for d in read.values()} == {"lst"}
    config = JobConfig.from_hyperparameters(read[IMAGE].hyperparameters)
    assert (config.record_format, config.multi_label, config.label_format) == ("lst", True, "multi_hot")
    manifest = from_channels(mxnet, channels(f"{RECORDIO}; label-format=class-id", mode="Pipe", wrapper="RecordIO"))
    config = JobConfig.from_hyperparameters(manifest.hyperparameters)
    assert (config.attribute_names, config.label_format) == (("source-ref", "label"), "index")
    assert "read as attribute_names=source-ref,label, label_format=index" in manifest.note
    assert JobConfig.from_hyperparameters(from_channels(mxnet, channels(RECORDIO)).hyperparameters).label_format == \
        "multi_hot"  # (the built-in's .rec: one 0 or 1 per class)
    # the request's own record_format or attribute_names in the MXNet dialect: the built-in's labels too
    for own_format in ({"record_format": "recordio"}, {"record_format": "lst"}, {"attribute_names": "source-ref,c"}):
        assert JobConfig.from_hyperparameters({**mxnet, **own_format}).label_format == "multi_hot"
    assert JobConfig.from_hyperparameters({**mxnet, "record_format": "tfrecord"}).label_format == "index"  # (prepare's)
    # what the request says wins; this job's own dialect, and channels without a content type, are not read
    own = {**mxnet, "record_format": "tfrecord", "label_format": "index"}
    assert from_channels(own, channels(IMAGE)).hyperparameters == own
    plain = {"num_classes": "10"}
    assert from_channels(plain, channels(RECORDIO)).hyperparameters == plain
    assert from_channels(mxnet, channels(None)).note is None
    # what the built-in refuses or cannot mean
    with pytest.raises(UserError, match="ContentType application/x-image: images, which the built-in MXNet algorithm "
                                        "reads as a .lst file lists them, and so does this job: add a 'train_lst'"):
        from_channels(mxnet, channels(IMAGE))
    with pytest.raises(UserError, match="channels train and validation hold different formats"):
        from_channels(mxnet, {**channels(IMAGE, "train_lst"), "validation": ChannelConfig("validation", "File",
                                                                                          content_type=RECORDIO)})
    with pytest.raises(UserError, match="label-format must be multi-hot .* or class-id"):
        from_channels(mxnet, channels(f"{RECORDIO}; label-format=ids"))
    # the launcher's check, which has no channels, takes each notebook's request as it is sent
    for request in (notebooks.mxnet_lst_format(10, 100), notebooks.mxnet_multi_label(5, 100),
                    notebooks.mxnet_ground_truth(3, 100), notebooks.mxnet_full_training(10, 100)):
        JobConfig.from_hyperparameters({**request, "weights": "none"})


def test_lst_channels_in_pipe_mode_or_without_their_lst_are_refused_naming_why(job):
    lst_channels(job, "train", [(image, [label]) for image, label in digits()[:4]], 0)
    job.add_channel("train", mode="Pipe", content_type=IMAGE)
    write_hyperparameters(job, **{**notebooks.mxnet_lst_format(10, 4), "weights": "none"})
    text = failed(job, run_train(job), CONFIG, "Configuration error: channel 'train' is in Pipe mode, but "
                                               "record_format=lst")
    assert "the .lst names image files the job must open" in text.splitlines()[0]
    job.add_channel("train", mode="File", content_type=IMAGE)
    job.add_channel("validation", mode="File", content_type=IMAGE)
    failed(job, run_train(job), CONFIG, "Configuration error: channel 'validation' has ContentType application/x-image: "
                                        "images, which the built-in MXNet algorithm reads as a .lst file lists them")


def lst_reader(tmp_path, text: str, images: dict[str, bytes], max_skips: int = 0, **config):
    """The reader of an image channel holding `images` (path: bytes), listed by a .lst of `text`."""
    from keras_pipe_train.sources import example, lst

    (tmp_path / "train_lst").mkdir(parents=True)
    (tmp_path / "train_lst" / "train.lst").write_text(text)
    for path, data in images.items():
        (tmp_path / "train" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "train" / path).write_bytes(data)
    values = {"num_classes": 10, "multi_label": False, "label_format": "index", **config}
    multi_hot = values["label_format"] == "multi_hot"
    return lst.reader(tmp_path / "train", tmp_path / "train_lst", "train", "train_lst", seed=None, shard=None,
                      encode=lambda image, label, _: example.encode_example(image, label, multi_hot=multi_hot),
                      record_check=example.record_check("image/encoded", "image/class/label", values["num_classes"],
                                                        10**6, multi_label=values["multi_label"],
                                                        label_format=values["label_format"]),
                      max_corrupted_records_to_skip=max_skips, **values)


def read_all(reader) -> list[bytes]:
    return [record for batch in reader.read_pass() for record in batch]


BAD_LINES = {  # a line of the .lst -> what the error says of it
    "7 3 digits/d7.jpg": "1 tab-separated column; a .lst line has 3 or more: index, label(s), the image's path in "
                         "channel 'train' (its columns are separated by spaces",
    "x\t3\tdigits/d1.jpg": "its index 'x' is not an integer",
    "0\t4\tdigits/d1.jpg": "its index 0 is also that of line 1 of",
    "8\tcat\tdigits/d1.jpg": "its label 'cat' is not a number",
    "9\t2.5\tdigits/d1.jpg": "its label '2.5' is not a class id (an integer from 0)",
    "10\t1\t2\tdigits/d1.jpg": "it holds 2 labels: a single-label .lst line holds one class id",
    "11\t12\tdigits/d1.jpg": "its label '12' is out of range: the job trains labels 0 to 9 (num_classes=10)",
    "12\t1\tdigits/none.jpg": "image digits/none.jpg is not in channel 'train' (no file",
    "13\t1\t../outside.jpg": "its path '../outside.jpg' is not one inside channel 'train'",
    "14\t1\tnotes.txt": "image notes.txt: image/encoded is not an image",
}


def test_every_lst_line_and_image_is_checked_and_an_error_names_the_lst_file_and_line(tmp_path, caplog):
    (image, label), (other, _) = digits()[:2]
    images = {"digits/d0.jpg": image, "digits/d1.jpg": other, "notes.txt": b"not an image"}
    good = f"0\t{label:f}\tdigits/d0.jpg\n\n"  # (a blank line is no entry)
    text = good + "".join(line + "\n" for line in BAD_LINES)
    skipping = lst_reader(tmp_path, text, images, max_skips=len(BAD_LINES))
    with caplog.at_level("WARNING"):
        assert read_all(skipping) == [example_bytes(image, label)]
    assert skipping.history[0].skipped == len(BAD_LINES)
    lst_file = tmp_path / "train_lst" / "train.lst"
    for number, (line, problem) in enumerate(BAD_LINES.items(), start=3):
        assert f"of .lst file {lst_file}: line {number} {line!r}: {problem}" in caplog.text, (line, caplog.text[-3000:])
    # without skips: the first bad line ends the pass, naming the file, the line and its byte offset
    from pipemode.errors import UnusableRecordError

    strict = lst_reader(tmp_path / "strict", good + "7\t3\tdigits/missing.jpg\n", images)
    with pytest.raises(UnusableRecordError) as info:
        read_all(strict)
    assert str(info.value) == (f"unusable record #2 at byte offset {len(good)} of .lst file {tmp_path}/strict/train_lst/"
                               "train.lst: line 3 '7\\t3\\tdigits/missing.jpg': image digits/missing.jpg is not in "
                               f"channel 'train' (no file {tmp_path}/strict/train/digits/missing.jpg)")


def example_bytes(image: bytes, label, multi_hot: bool = False) -> bytes:
    from keras_pipe_train.sources.example import encode_example

    return encode_example(image, label, multi_hot=multi_hot)


def test_multi_label_lst_lines_one_value_per_class_or_class_ids(tmp_path):
    image = digits()[0][0]
    # (a line of two values for three classes, and one of a 2: skipped)
    lines = "0\t1\t0\t1\tp.jpg\n1\t1\t0\tp.jpg\n2\t1\t0\t2\tp.jpg\n"
    hot = lst_reader(tmp_path / "hot", lines, {"p.jpg": image}, max_skips=2, num_classes=3, multi_label=True,
                     label_format="multi_hot")
    assert read_all(hot) == [example_bytes(image, [1.0, 0.0, 1.0], multi_hot=True)]
    ids = lst_reader(tmp_path / "ids", "0\t2\t0\tp.jpg\n1\t1\tp.jpg\n", {"p.jpg": image}, num_classes=3,
                     multi_label=True, label_format="index")
    assert read_all(ids) == [example_bytes(image, [0, 2]), example_bytes(image, [1])]
