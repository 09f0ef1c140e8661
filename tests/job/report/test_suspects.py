"""The label check's files and page section (keras_pipe_train.report.suspects): every suspect in
the CSV with its source, those in S3 in a Ground Truth manifest, hostile sources kept as they are
in the files and escaped in the page."""

import csv
import dataclasses
import datetime
import json

import numpy as np
import pytest

from keras_pipe_train.report import suspects as S
from keras_pipe_train.training.gathered import Gathered
from keras_pipe_train.training.label_errors import Suspects

SOURCES = ("s3://bucket/cats/a b ü.jpg", "dogs/local file.jpg", "", 's3://bucket/x/<img src=x onerror="a()">.png',
           "s3://bucket/=HYPERLINK(1).jpg")


def checked() -> S.Checked:
    seen = Gathered(np.zeros((5, 2), np.float32), np.array([0, 1, 0, 1, 0]),
                    fingerprints=tuple(f"{i:016x}" for i in range(5)), thumbnails=(), sources=SOURCES)
    # suspects, the least likely given label first: examples 3, 0, 1, 4, 2
    found = Suspects(np.array([3, 0, 1, 4, 2]), np.array([0, 1, 0, 1, 1]), np.array([0.01, 0.05, 0.1, 0.2, 0.3]),
                     np.array([0.99, 0.9, 0.85, 0.7, 0.6]))
    return S.Checked({"train": (seen, found)}, ("cat", "dog"), 5, trained_features=False, seconds=1.5)


def test_the_csv_names_every_suspects_source_and_the_manifest_holds_those_in_s3(tmp_path):
    path = S.write(tmp_path, checked(), "job-7")
    rows = list(csv.DictReader(open(path, encoding="utf-8")))
    assert [row["source"] for row in rows] == [SOURCES[i] for i in (3, 0, 1, 4, 2)]
    assert list(rows[0]) == list(S.CSV_COLUMNS)
    assert [row["given_label"] for row in rows] == ["dog", "cat", "dog", "cat", "cat"]
    lines = [json.loads(line) for line in (tmp_path / S.MANIFEST_NAME).read_text(encoding="utf-8").splitlines()]
    assert [line["source-ref"] for line in lines] == [SOURCES[3], SOURCES[0], SOURCES[4]]
    first = lines[0]
    assert first["label"] == 1 and first["label-metadata"]["class-name"] == "dog"
    assert first["label-metadata"]["confidence"] == 0.01 and first["label-metadata"]["job-name"].endswith("/job-7")
    datetime.datetime.fromisoformat(first["label-metadata"]["creation-date"])
    assert first["label-check"] == {"set": "train", "rank": 1, "likely-label": 0, "likely-class-name": "cat",
                                    "likely-confidence": 0.99, "fingerprint": f"{3:016x}"}
    summary = json.loads((tmp_path / S.JSON_NAME).read_text())
    assert summary["manifest"] == {"suspects": 3, "without_s3_source": 2}
    assert summary["sets"]["train"] == {"examined": 5, "suspected": 5, "cut": False}


def test_a_check_of_images_without_sources_writes_an_empty_manifest(tmp_path):
    found = checked()
    seen, suspects = found.sets["train"]
    bare = Gathered(seen.outputs, seen.labels, seen.fingerprints)
    S.write(tmp_path, S.Checked({"train": (bare, suspects)}, found.class_names, 5, False, 1.0))
    assert (tmp_path / S.MANIFEST_NAME).read_text() == ""
    assert all(row["source"] == "" for row in csv.DictReader(open(tmp_path / S.CSV_NAME)))


def test_the_page_shows_each_sources_end_escaped():
    page = S.section(checked())
    assert "&lt;img src=x onerror=" in page and "<img src=x" not in page
    assert "a b ü.jpg" in page and "dogs/local file.jpg" in page
    assert S.MANIFEST_NAME in page


def test_training_images_left_unchecked_are_said_so_in_the_json_and_the_page(tmp_path):
    found = checked()
    why = "their 5 heads on 5 images were ended by their time budget (60 s: 25% of the training's time, 60 s at least)"
    partial = S.Checked({"validation": found.sets["train"]}, found.class_names, 5, False, 1.0, unchecked=why)
    S.write(tmp_path, partial)
    assert json.loads((tmp_path / S.JSON_NAME).read_text())["train_unchecked"] == why
    assert f"Training images not checked: {why}.".replace("'", "&#x27;") in S.section(partial)


def test_the_heads_held_out_accuracy_and_the_images_not_judged_are_in_the_json_and_the_page(tmp_path):
    found = checked()
    seen, suspects = found.sets["train"]
    unjudged = Suspects(suspects.indices, suspects.likely, suspects.given_probability, suspects.likely_probability,
                        unjudged=2, unjudged_classes=(1,), unreadable=1)
    with_heads = S.Checked({"train": (seen, unjudged)}, found.class_names, 5, False, 1.0, heads_accuracy=0.87654)
    S.write(tmp_path, with_heads)
    summary = json.loads((tmp_path / S.JSON_NAME).read_text())
    assert summary["train_heads_accuracy"] == 0.8765
    assert {key: summary["sets"]["train"][key] for key in ("unjudged", "unjudged_classes", "unreadable")} == {
        "unjudged": 2, "unjudged_classes": ["dog"], "unreadable": 1}
    page = S.section(with_heads)
    assert "label given for 87.7% of them" in page and "Not judged: 2 images of dog" in page
    assert "Left out: 1 image whose probabilities are not numbers" in page
    assert "fewer than two classes were left to judge" not in page
    # every image left out: said why no image could be suspected
    none = dataclasses.replace(unjudged, unjudged=len(seen) - 1)
    assert "fewer than two classes were left to judge, so none was" in S.section(
        S.Checked({"train": (seen, none)}, found.class_names, 5, False, 1.0))
    S.write(tmp_path, found)  # (none measured, none left out: neither said)
    assert "train_heads_accuracy" not in json.loads((tmp_path / S.JSON_NAME).read_text())
    assert "Not judged" not in S.section(found) and "label given for" not in S.section(found)


def test_the_models_agreement_with_the_validation_labels_is_in_the_json_and_the_page(tmp_path):
    """How far to trust the validation suspects (the outside review: a model right on 67 % with no
    label wrong had 55-92 of 600 images named): the model's agreement with the labels given."""
    found = checked()
    validation = S.Checked({"validation": found.sets["train"]}, found.class_names, 0, False, 1.0,
                           validation_accuracy=0.66666)
    S.write(tmp_path, validation)
    assert json.loads((tmp_path / S.JSON_NAME).read_text())["validation_model_accuracy"] == 0.6667
    page = S.section(validation)
    assert "the model chose the label given for 66.7% of them (the fewer, the more of the suspects are its own" in page
    S.write(tmp_path, found)
    assert "validation_model_accuracy" not in json.loads((tmp_path / S.JSON_NAME).read_text())


def test_a_set_examined_as_a_sample_says_of_how_many_images(tmp_path):
    found = checked()
    seen, suspects = found.sets["train"]
    sampled = Gathered(seen.outputs, seen.labels, seen.fingerprints, sources=seen.sources, read=1000)
    partial = S.Checked({"train": (sampled, suspects)}, found.class_names, 5, False, 1.0)
    S.write(tmp_path, partial)
    assert json.loads((tmp_path / S.JSON_NAME).read_text())["sets"]["train"]["read"] == 1000
    assert "Train images: 5 of 5 (a sample of 1,000)</h3>" in S.section(partial)
    assert partial.summary() == "train: 5 of 5 images suspected (a sample of 1,000)"


def test_a_check_not_made_says_why_on_the_page():
    """The outside review: a check that failed, or a stop request, was said to be label_check=false."""
    assert "not checked: the check failed (ValueError: boom)" in S.section("the check failed (ValueError: boom)")
    assert "not checked: a stop request came before it" in S.section("a stop request came before it")
    assert "not checked: label_check=false" in S.section(None)


def test_the_models_agreement_leaves_out_rows_that_are_not_numbers():
    from keras_pipe_train.after_training.label_check import agreement_of

    probabilities = np.array([[0.9, 0.1], [0.2, 0.8], [np.nan, np.nan], [0.6, 0.4]])
    assert agreement_of(probabilities, np.array([0, 0, 1, 0])) == pytest.approx(2 / 3)
    assert agreement_of(probabilities[2:3], np.array([1])) is None
