"""serving.json's schema (keras_pipe_train.settings.serving_schema): what the export writes reads
back the same; every form an export wrote before the schema had a version reads as the server
took it; a wrong field is named with its file; a version newer than the code is refused."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from keras_pipe_train.settings.config import DEFAULT_MAX_PIXELS
from keras_pipe_train.settings.serving_schema import (
    SCHEMA_VERSION,
    ServedCalibration,
    ServingFileError,
    ServingSettings,
    read,
)

MULTI_LABEL = ServingSettings(64, 1000, 0.3, "mxnet", ServedCalibration((2.5, 0.5), 400, (0.1, 0.6)))
SINGLE_LABEL = ServingSettings(32, DEFAULT_MAX_PIXELS, None, "keras-pipe", ServedCalibration(1.5, 300))
PLATT = ServingSettings(64, 1000, 0.3, "keras-pipe", ServedCalibration((2.5, 0.5), 400, (0.1, 0.6), "Platt scaling",
                                                                      (-1.5, 0.25)))


def test_the_schema_has_a_version_and_writes_it():
    assert SCHEMA_VERSION == 2 and ServingSettings(32).to_json()["version"] == SCHEMA_VERSION


@pytest.mark.parametrize("settings", [MULTI_LABEL, SINGLE_LABEL, PLATT, ServingSettings(224)])
def test_a_written_file_reads_back_the_same(settings, tmp_path):
    path = settings.write(tmp_path)
    assert path == tmp_path / "serving.json"
    found = read(tmp_path)
    assert found == settings and found.version == SCHEMA_VERSION
    assert ServingSettings.from_json(json.loads(json.dumps(settings.to_json()))) == settings


def test_the_written_keys_are_those_older_servers_read():
    """Every key of version 1 stays, named and shaped as before: a reader of the keys alone (a
    notebook's json.load) reads a version 2 file as it did."""
    assert MULTI_LABEL.to_json() == {
        "version": 2, "image_size": 64, "max_image_pixels": 1000, "multi_label": True, "threshold": 0.3,
        "dialect": "mxnet", "calibration": {"method": "temperature scaling", "temperature": [2.5, 0.5],
                                            "validation_examples": 400, "calibrated_thresholds": [0.1, 0.6]}}
    assert "calibrated_thresholds" not in SINGLE_LABEL.to_json()["calibration"]
    assert "bias" not in SINGLE_LABEL.to_json()["calibration"]  # (none: a version 2 file as it was before bias)
    assert PLATT.to_json()["calibration"]["bias"] == [-1.5, 0.25]


def test_a_version_2_calibration_without_a_bias_reads_as_none():
    data = {**MULTI_LABEL.to_json()}
    assert "bias" not in data["calibration"] and ServingSettings.from_json(data).calibration.bias is None


# each form export.py wrote before the schema (git log -p train/keras_pipe_train/model/export.py):
# 79a82fa's first serving.json; c6f9aae's, with the dialect; 90a45e6's, with the calibration
FIRST = {"image_size": 224, "max_image_pixels": 5000, "multi_label": False, "threshold": None}
WITH_DIALECT = {**FIRST, "dialect": "tensorflow"}
WITH_CALIBRATION = {**FIRST, "multi_label": True, "threshold": 0.5, "dialect": "keras-pipe", "calibration": {
    "method": "temperature scaling", "temperature": [2.0, 1.0], "validation_examples": 250,
    "calibrated_thresholds": [0.5, 0.5]}}


@pytest.mark.parametrize("data, expected", [
    (FIRST, ServingSettings(224, 5000)),
    (WITH_DIALECT, ServingSettings(224, 5000, dialect="tensorflow")),
    (WITH_CALIBRATION, ServingSettings(224, 5000, 0.5, "keras-pipe", ServedCalibration((2.0, 1.0), 250, (0.5, 0.5)))),
    ({**WITH_CALIBRATION, "calibration": None}, ServingSettings(224, 5000, 0.5)),
    # what the server took a key's absence for: the default image limit, keras-pipe, no calibration
    ({}, ServingSettings()),
    ({"max_image_pixels": 10, "threshold": None}, ServingSettings(None, 10)),
])
def test_every_older_form_reads_as_version_1(data, expected, tmp_path):
    (tmp_path / "serving.json").write_text(json.dumps(data) + "\n")
    found = read(tmp_path)
    assert found == expected and found.version == 1
    assert found.max_image_pixels == expected.max_image_pixels and found.dialect == expected.dialect


def test_a_version_1_file_ignores_keys_it_does_not_name_as_the_server_did():
    found = ServingSettings.from_json({**FIRST, "notes": "by hand"})
    assert found == ServingSettings(224, 5000)


def test_a_folder_without_serving_json_reads_none(tmp_path):
    assert read(tmp_path) is None


@pytest.mark.parametrize("change, message", [
    ({"max_image_pixels": "100"}, 'max_image_pixels must be a whole number of at least 1, got "100"'),
    ({"max_image_pixels": None}, "max_image_pixels must be a whole number of at least 1, got null"),
    ({"image_size": 0}, "image_size must be a whole number of at least 1, got 0"),
    ({"threshold": 1.5, "multi_label": True}, "threshold must be between 0 and 1, got 1.5"),
    ({"threshold": True, "multi_label": True}, "threshold must be a number, got true"),
    ({"multi_label": True}, "multi_label is true but threshold is null"),
    ({"multi_label": "no"}, 'multi_label must be true or false, got "no"'),
    ({"dialect": "pytorch"}, "serving.json's dialect is 'pytorch': this server answers in keras-pipe, mxnet, "
                             "tensorflow"),
    ({"calibration": {"temperature": 2.0, "validation_examples": 9}}, "calibration.method is missing"),
    ({"calibration": {"method": "temperature scaling", "temperature": -1, "validation_examples": 9}},
     "calibration.temperature must be above 0, got -1"),
    ({"calibration": {"method": "temperature scaling", "temperature": [1.0, "x"], "validation_examples": 9}},
     'calibration.temperature\\[1\\] must be a number, got "x"'),
    ({"calibration": {"method": "temperature scaling", "temperature": 1.0, "validation_examples": 9,
                      "calibrated_thresholds": [0.5, 2]}}, "calibration.calibrated_thresholds\\[1\\] must be between"),
    ({"calibration": [1.0]}, "calibration must be a JSON object, got \\[1.0\\]"),
    ({"calibration": {"method": "Platt scaling", "temperature": 1.0, "validation_examples": 9, "bias": [0.5, None]}},
     "calibration.bias\\[1\\] must be a number, got null"),
    ({"calibration": {"method": "Platt scaling", "temperature": 1.0, "validation_examples": 9, "bias": 0.5}},
     "calibration.bias must be a list of numbers, one per class, got 0.5"),
])
@pytest.mark.parametrize("version", [None, 2])
def test_a_bad_field_is_named_with_its_file(change, message, version, tmp_path):
    data = {**SINGLE_LABEL.to_json(), **change}
    if version is None:
        del data["version"]
    (tmp_path / "serving.json").write_text(json.dumps(data))
    with pytest.raises(ServingFileError, match=f"^{re.escape(str(tmp_path / 'serving.json'))}: {message}"):
        read(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"treshold": 0.5}, "treshold is not a key of serving.json version 2"),
    ({"calibration": {**SINGLE_LABEL.calibration.to_json(), "t": 1}}, "calibration.t is not a key of serving.json"),
    ({"dialect": None}, "serving.json's dialect is 'None'"),
])
def test_version_2_holds_its_keys_and_no_other(change, message):
    with pytest.raises(ServingFileError, match=message):
        ServingSettings.from_json({**SINGLE_LABEL.to_json(), **change})


@pytest.mark.parametrize("key", [k for k in SINGLE_LABEL.to_json() if k != "version"])
def test_version_2_holds_every_key(key):
    """(without "version" a file is version 1, which may lack any: test_every_older_form_reads_as_version_1)"""
    with pytest.raises(ServingFileError, match=f"serving.json: {key} is missing"):
        ServingSettings.from_json({k: v for k, v in SINGLE_LABEL.to_json().items() if k != key})


@pytest.mark.parametrize("version", [3, 10])
def test_a_newer_version_is_refused_saying_so(version, tmp_path):
    (tmp_path / "serving.json").write_text(json.dumps({**SINGLE_LABEL.to_json(), "version": version, "new": 1}))
    with pytest.raises(ServingFileError, match=f"serving.json is version {version} of serving.json, newer than "
                                               "this keras-pipe reads \\(up to 2\\)"):
        read(tmp_path)


@pytest.mark.parametrize("version", ["2", 0, 2.0, True])
def test_a_version_that_is_not_one_is_said(version):
    with pytest.raises(ServingFileError, match="serving.json: version must be a whole number of at least 1"):
        ServingSettings.from_json({**SINGLE_LABEL.to_json(), "version": version})


@pytest.mark.parametrize("text, message", [("{", "is not JSON"), ("[1, 2]", "its content must be a JSON object"),
                                           ("\xff", None)])
def test_a_file_that_is_not_a_json_object_is_said(text, message, tmp_path):
    (tmp_path / "serving.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ServingFileError, match=re.escape(str(tmp_path / "serving.json"))) as refused:
        read(tmp_path)
    assert message is None or message in str(refused.value)


def test_what_the_export_is_given_is_checked_before_it_is_written():
    with pytest.raises(ServingFileError, match="the serving.json being made: threshold must be between 0 and 1"):
        ServingSettings(32, threshold=2.0)
    with pytest.raises(ServingFileError, match="calibration.temperature must be a number"):
        ServingSettings(32, calibration=ServedCalibration(float("nan"), 10))


@pytest.mark.parametrize("temperature, threshold, bias", [(2.0, None, None), (np.array([2.5, 0.5, 1.0]), 0.3, None),
                                                     (np.array([2.5, 0.5, 1.0]), 0.3, np.array([1.0, -2.0, 0.0]))])
def test_the_calibration_the_job_serves_reads_back_as_it_was_written(temperature, threshold, bias):
    from keras_pipe_train.training.calibration import PLATT, TEMPERATURE, Calibration

    found = Calibration("true", temperature, True, "calibration=true", 300, {}, {}, threshold is not None, bias=bias,
                        method=TEMPERATURE if bias is None else PLATT)
    typed = found.serving(threshold)
    assert (typed.bias is None) == (bias is None)
    assert ServedCalibration.from_json(typed.to_json()) == typed
    assert typed.validation_examples == 300 and (typed.calibrated_thresholds is None) == (threshold is None)
    assert ServingSettings(32, threshold=threshold, calibration=typed).calibration == typed


@pytest.mark.parametrize("settings, message", [
    ({"threshold": None, "multi_label": False, "calibration": {"method": "temperature scaling", "temperature": [1.0, 2.0],
                                         "validation_examples": 9}},
     "a single-label model's calibration is one temperature, without bias or calibrated_thresholds"),
    ({"calibration": {"method": "Platt scaling", "temperature": [1.0, 2.0], "validation_examples": 9,
                      "bias": [0.1, 0.2, 0.3], "calibrated_thresholds": [0.5, 0.5]}},
     "calibration's per-class lists differ in length \\(temperature 2, bias 3, calibrated_thresholds 2\\)"),
    ({"calibration": {"method": "temperature scaling", "temperature": [1.0, 2.0], "validation_examples": 9,
                      "calibrated_thresholds": [0.5, 0.5, 0.5, 0.5, 0.5]}},
     "calibration's per-class lists differ in length \\(temperature 2, calibrated_thresholds 5\\)"),
    ({"calibration": {"method": "isotonic", "temperature": 1.0, "validation_examples": 9}},
     "calibration.method must be one of temperature scaling, Platt scaling, got \"isotonic\""),
    ({"calibration": {"method": "Platt scaling", "temperature": [1.0, 2.0], "validation_examples": 9}},
     "calibration.bias is missing with method 'Platt scaling'"),
    ({"calibration": {"method": "temperature scaling", "temperature": [1.0, 2.0], "validation_examples": 9,
                      "bias": [0.0, 0.0]}}, "calibration.bias is given with method 'temperature scaling'"),
])
def test_a_calibration_whose_parts_do_not_fit_each_other_or_the_model_is_refused(settings, message, tmp_path):
    """A rule the server would apply otherwise than it was fitted (a per-class temperature on a
    single-label model, lists of different lengths, a method it does not know) is refused."""
    data = {**ServingSettings(32, threshold=0.5).to_json(), **settings}
    (tmp_path / "serving.json").write_text(json.dumps(data))
    with pytest.raises(ServingFileError, match=f"^{re.escape(str(tmp_path / 'serving.json'))}: {message}"):
        read(tmp_path)
