"""Ground Truth's augmented-manifest lines against a reference written from the documentation
(sources/manifest_labels.py, sources/manifest.py, docs/sources.md), on lines Hypothesis makes: labels of every JSON
type and text, metadata right and wrong, bytes that are not text, JSON nested too deep, streams cut
short. Three readers share the TF-free label parser (keras_pipe_train.sources.manifest_labels):

- the parser itself: a label is a class id (an integer from 0, an integral float, or the ASCII
  text of one), or for a multi-label job a list of them (sorted, none twice), or with
  label_format=multi_hot one value per class; anything else a ValueError naming the attribute;
- the job, reading a manifest's channel in Pipe mode: RecordIODecoder.groups makes each line's
  records (image, label, metadata) into an Example (manifest.combiner) that the job's record check
  then passes or not. Every line gives the reference's labels or an UnusableRecordError naming
  the line ("manifest line N of this pass"); a pass cut inside a line is a TruncatedRecordError
  naming it; nothing else is ever raised;
- `keras-pipe prepare`, listing a manifest file: each line's labels as the reference reads them, or
  the line rejected with its number, or a ListingError/SourceError naming the line (a line cut
  short is not JSON).

Only the pure-Python reader reads these (RecordIO has no compiled part).
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tests.hypothesis_profiles  # noqa: F401  (the "quick" profile, or HYPOTHESIS_PROFILE's)
from keras_pipe_train.sources import manifest_labels
from pipemode import recordio
from pipemode.corruption import CorruptionPolicy
from pipemode.errors import CorruptRecordError, TruncatedRecordError, UnusableRecordError
from tests.conftest import image_bytes, stream_reader
from tests.reader.test_recordio_properties import reference_lines

MAX_CLASS_ID = 2**31 - 1
NAME = "label"


# --- the reference, from the documentation ----------------------------------------------------------

class Refused(ValueError):
    """The reference's verdict: this line (or value) cannot be used."""


# the text of a number as JSON or a CSV writes it, ASCII digits only, around JSON's spaces
NUMBER = re.compile(r"[ \t\r\n]*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?[ \t\r\n]*")


def ref_class_id(value) -> int:
    if isinstance(value, str) and NUMBER.fullmatch(value):
        value = float(value)
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        value = int(value)
    if type(value) is not int or not 0 <= value <= MAX_CLASS_ID:
        raise Refused(f"not a class id: {value!r}")
    return value


def ref_class_ids(value, multi_label: bool):
    if not multi_label:
        if isinstance(value, list):
            raise Refused("a list, for a job that is not multi-label")
        return ref_class_id(value)
    ids = sorted(ref_class_id(item) for item in (value if isinstance(value, list) else [value]))
    if len(set(ids)) < len(ids):
        raise Refused("a class id twice")
    return ids


def ref_multi_hot(value, num_classes: int) -> list[float]:
    if not isinstance(value, list) or len(value) != num_classes:
        raise Refused("not one value per class")
    return [float(ref_class_id(item)) for item in value]


def ref_names(metadata, labels) -> dict[int, str]:
    """Ground Truth's metadata: class-map (multi-label) or class-name (single-label) name classes."""
    if not isinstance(metadata, dict):
        raise Refused("metadata that is not an object")
    if "class-map" in metadata:
        mapping = metadata["class-map"]
        if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
            raise Refused("a class-map that is not an object of names")
        return {ref_class_id(key): text for key, text in mapping.items()}
    if "class-name" in metadata and not isinstance(labels, list):
        if not isinstance(metadata["class-name"], str):
            raise Refused("a class-name that is not a name")
        return {labels: metadata["class-name"]}
    return {}


def outcome(function, *args):
    """What `function` gives: ("ok", value) or ("refused", message); any other exception goes through."""
    try:
        return "ok", function(*args)
    except ValueError as err:  # (Refused is one)
        return "refused", str(err)


# --- what Hypothesis makes ----------------------------------------------------------------------------

number_texts = st.one_of(
    st.integers(-3, 12).map(str), st.integers().map(str), st.floats().map(repr),
    st.builds(lambda space, sign, n, frac, exp: f"{space}{sign}{n}{frac}{exp}{space}",
              st.sampled_from(["", " ", "\t", "\n"]), st.sampled_from(["", "+", "-"]), st.integers(0, 40),
              st.sampled_from(["", ".", ".0", ".5", ".00001"]), st.sampled_from(["", "e0", "e1", "E-1", "e400"])),
    # what float() reads and a class id's text is not; and 5,000 digits (int() would refuse the text)
    st.sampled_from(["\u0663", "\uff13", "1_0", "\u00b2", "nan", "NaN", "inf", "-Infinity", "0x1", "1" * 5000, ""]),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2, 5), st.integers(), st.integers(0, 5).map(float),
                    st.floats(), st.just(MAX_CLASS_ID), st.just(MAX_CLASS_ID + 1), number_texts, st.text(max_size=6))
values = st.one_of(scalars, st.lists(scalars, max_size=4), st.lists(st.integers(0, 3), max_size=4),
                   st.lists(st.sampled_from([0, 1, 0.0, 1.0, "1", 2, 0.5]), min_size=3, max_size=3),
                   st.dictionaries(st.text(max_size=3), scalars, max_size=2))


@given(value=values, multi_label=st.booleans())
def test_a_label_is_a_class_id_exactly_where_the_reference_says(value, multi_label):
    expected = outcome(ref_class_ids, value, multi_label)
    got = outcome(manifest_labels.class_ids, value, NAME, multi_label)
    assert got[0] == expected[0], (got, expected)
    if got[0] == "ok":
        assert got[1] == expected[1]
    else:
        assert repr(NAME) in got[1]  # (which attribute)


@given(value=values, num_classes=st.integers(1, 4))
def test_a_multi_hot_label_is_one_value_per_class_exactly_where_the_reference_says(value, num_classes):
    expected = outcome(ref_multi_hot, value, num_classes)
    got = outcome(manifest_labels.multi_hot, value, NAME, num_classes)
    assert got[0] == expected[0], (got, expected)
    if got[0] == "ok":
        assert got[1] == expected[1]
    else:
        assert repr(NAME) in got[1]


# (a lone surrogate, "\ud800" in JSON, is a str that cannot be encoded, nor printed as it is)
class_names = st.one_of(st.sampled_from(["a", "b", "c", "zz", "\ud800", "new\nline"]), scalars)
metadata = st.one_of(
    st.fixed_dictionaries({"class-name": class_names}, optional={"confidence": st.floats(0, 1)}),
    st.fixed_dictionaries({"class-map": st.one_of(
        st.dictionaries(st.sampled_from(["0", "1", "2", "5", "1.0", "x", "-1", "\u0663"]), class_names, max_size=3),
        scalars)}),
    st.just({}), scalars, st.lists(scalars, max_size=2))


@given(value=metadata, labels=st.one_of(st.integers(0, 3), st.lists(st.integers(0, 3), max_size=3)))
def test_metadata_names_the_classes_exactly_where_the_reference_says(value, labels):
    expected = outcome(ref_names, value, labels)
    got = outcome(manifest_labels.metadata_names, value, "label-metadata", labels)
    assert got[0] == expected[0], (got, expected)
    if got[0] == "ok":
        assert got[1] == expected[1]
    else:
        assert "'label-metadata" in got[1]


# --- the job: a manifest channel's stream, line by line ---------------------------------------------------

NAMES = ["a", "b", "c"]
ATTRIBUTES = ["source-ref", NAME, f"{NAME}-metadata"]
# (hyperparameters, their name)
JOBS = {"single-label": {}, "single-label, classes unnamed": {"class_names": None},
        "multi-label": {"multi_label": "true"}, "multi-hot": {"multi_label": "true", "label_format": "multi_hot"}}


def job_config(kind: str):
    from keras_pipe_train.settings.config import JobConfig

    values = {"num_classes": str(len(NAMES)), "attribute_names": ",".join(ATTRIBUTES),
              "class_names": json.dumps(NAMES), **JOBS[kind]}
    return JobConfig.from_hyperparameters({k: v for k, v in values.items() if v is not None})


def ref_value(payload: bytes):
    """An attribute streamed: its JSON, or (not JSON) its text, stripped; bytes that are not UTF-8,
    or JSON nested too deep to read, are refused."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused("not text") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise Refused("nested too deep") from None
    except ValueError:
        return text.strip()


def ref_line(config, payloads: list[bytes]) -> tuple[bytes, list]:
    """(the image, its labels as the Example holds them) for a line the job trains on; Refused for one
    it cannot use, for any reason: its label, its metadata, its image, or a label out of range."""
    image, label, meta = payloads
    value = ref_value(label)
    if config.label_format == "multi_hot":
        labels = ref_multi_hot(value, config.num_classes)
        if any(not 0 <= v <= 1 for v in labels):
            raise Refused("a value outside [0, 1]")
    else:
        labels = ref_class_ids(value, config.multi_label)
        ids = labels if isinstance(labels, list) else [labels]
        if any(i >= config.num_classes for i in ids):
            raise Refused("a class id out of range")
    names = ref_names(ref_value(meta), labels)
    if config.class_names == tuple(NAMES):  # (class_names set: the metadata must agree with them)
        if any(0 <= k < config.num_classes and NAMES[k] != name for k, name in names.items()):
            raise Refused("metadata naming a class otherwise")
    if image != JPEG:
        raise Refused("not an image")
    return image, labels if isinstance(labels, list) else [labels]


def example_of(record: bytes) -> tuple[bytes, list]:
    from tensorflow.core.example import example_pb2

    features = example_pb2.Example.FromString(record).features.feature
    label = features["image/class/label"]
    return features["image/encoded"].bytes_list.value[0], list(getattr(label, label.WhichOneof("kind")).value)


JPEG = image_bytes("JPEG", 8, 8)


def json_bytes(value) -> bytes:
    return json.dumps(value).encode()


label_payloads = st.one_of(values.map(json_bytes), number_texts.map(str.encode), st.binary(max_size=6),
                           st.just(b"[" * 3000 + b"]" * 3000))
metadata_payloads = st.one_of(metadata.map(json_bytes), st.binary(max_size=6), st.just(b'{"class-name": "a"'))
lines = st.tuples(st.one_of(st.just(JPEG), st.just(JPEG), st.just(b"not an image")), label_payloads,
                  metadata_payloads).map(list)


@pytest.mark.parametrize("kind", list(JOBS))
@given(stream=st.lists(lines, max_size=8), dropped=st.integers(0, 2), cut=st.one_of(st.none(), st.integers(0, 1 << 16)),
       max_skips=st.integers(0, 3))
def test_each_streamed_line_is_the_references_example_or_an_error_naming_it(kind, stream, dropped, cut, max_skips):
    """The records of the lines (the last `dropped` of them lost, the bytes maybe `cut` anywhere),
    grouped, combined and checked as the job does."""
    from keras_pipe_train.sources import example, manifest

    config = job_config(kind)
    payloads = [payload for line in stream for payload in line]
    data = recordio.encode(payloads[: len(payloads) - dropped] if dropped <= len(payloads) else [])
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    check = example.record_check(config.image_feature, config.label_feature, config.num_classes,
                                 config.max_image_pixels, multi_label=config.multi_label,
                                 label_format=config.label_format)
    decoder = recordio.RecordIODecoder(CorruptionPolicy(max_skips))
    got, error = [], None
    try:
        for batch in decoder.groups(stream_reader(data), "test stream", len(ATTRIBUTES), manifest.combiner(config),
                                    check):
            got += [example_of(record) for record in batch]
    except CorruptRecordError as err:  # (nothing else may come out: no other type, no crash)
        error = err
    expected, expected_error = reference_lines(data, len(ATTRIBUTES), max_skips, recordio.MAX_PART_BYTES,
                                               lambda line: ref_line(config, line))
    assert got == expected
    assert (error and (type(error), error.record, error.offset)) == (expected_error or None)
    if isinstance(error, UnusableRecordError):  # a line refused: named by its place in the pass
        line = error.record // 3 + 1
        assert f"manifest line {line} of this pass (RecordIO records #{error.record}-#{error.record + 2})" in str(error)
    elif isinstance(error, TruncatedRecordError) and "the pass ended after" in str(error):
        assert f"of manifest line {error.record // 3 + 1} of this pass" in str(error)


# --- keras-pipe prepare: a manifest file, listed ----------------------------------------------------------

def ref_listing(texts: list[str], multi_label: bool):
    """("error", line number or None) where prepare must stop; else ("ok", {line number: labels},
    [rejected line numbers], classes)."""
    from keras_pipe_launch.prepare.sources import MAX_CLASSES

    entries = []
    for number, text in enumerate(texts, 1):
        if not text.strip():
            continue
        try:
            entry = json.loads(text)
        except (ValueError, RecursionError):
            return "error", number
        if not isinstance(entry, dict):
            return "error", number
        entries.append((number, entry))
    items, rejected, names = {}, [], {}
    for number, entry in entries:
        if NAME not in entry:
            rejected.append(number)
            continue
        if isinstance(entry[NAME], list) and not multi_label:
            return "error", number
        try:
            ids = ref_class_ids(entry[NAME], multi_label)
            meta = entry.get(f"{NAME}-metadata")
            named = ref_names(meta, ids) if meta else {}
        except Refused:
            rejected.append(number)
            continue
        for label, name in named.items():
            if not name.isprintable() or names.setdefault(label, name) != name:
                return "error", number
        items[number] = tuple(ids) if multi_label else ids
    seen = {i for labels in items.values() for i in (labels if multi_label else (labels,))}
    count = max(seen | set(names), default=-1) + 1
    if not 2 <= count <= MAX_CLASSES:
        return "error", None  # (the manifest as a whole: too few classes, or too many)
    classes = [names.get(i, str(i)) for i in range(count)]
    if len(set(classes)) < len(classes):
        return "error", None  # (two classes of one name)
    return "ok", items, rejected, classes


def manifest_line(index: int, label, meta, has_label: bool) -> dict:
    line = {"source-ref": f"img/{index}.jpg"}
    if has_label:
        line[NAME] = label
    if meta is not None:
        line[f"{NAME}-metadata"] = meta
    return line


manifest_lines = st.one_of(
    st.tuples(values, st.one_of(st.none(), metadata), st.sampled_from([True, True, True, False])),
    st.sampled_from(["not json", "[1, 2]", "7", "", "   ", '{"source-ref": "img/x.jpg", "label": 1',
                     "[" * 3000 + "]" * 3000]))


@given(drawn=st.lists(manifest_lines, max_size=8), multi_label=st.booleans(), cut=st.one_of(st.none(),
                                                                                           st.integers(1, 1 << 16)))
def test_prepare_lists_each_line_as_the_reference_reads_it_or_stops_naming_it(drawn, multi_label, cut):
    from keras_pipe_launch.common.objects import SourceError
    from keras_pipe_launch.prepare.sources import ListingError, Reader, list_manifest

    texts = [text if isinstance(text, str) else json.dumps(manifest_line(i, *text)) for i, text in enumerate(drawn)]
    if cut is not None and texts and texts[-1].startswith("{"):
        texts[-1] = texts[-1][: 1 + cut % (len(texts[-1]) - 1)]  # (a last line cut short: never a JSON object)
    expected = ref_listing(texts, multi_label)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "labels.manifest"
        path.write_text("\n".join(texts) + "\n")
        try:
            listing = list_manifest(str(path), Reader(), multi_label, NAME)
        except (ListingError, SourceError) as err:  # (nothing else may come out)
            assert expected[0] == "error", (str(err), expected)
            if expected[1] is not None:
                assert f"labels.manifest line {expected[1]}" in str(err), (str(err), expected)
            return
    assert expected[0] == "ok", (listing, expected)
    _, items, rejected, classes = expected
    by_line = {int(str(where).rsplit("/", 1)[1].split(".")[0]) + 1: labels for where, labels in listing.items}
    assert by_line == items
    assert sorted(int(re.search(r"line (\d+)", why)[1]) for _, why in listing.rejected) == rejected
    assert listing.classes == classes
