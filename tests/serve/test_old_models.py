"""Models exported before serving.json had a version still serve: tests/data/old-models.tar.gz holds
two, exported by commit 5bbe12e's export() (tests/data/make_old_model.py), whose serving.json reads
as version 1 of its schema; `serve` answers each as that export's SavedModel answered then."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from keras_pipe_serve.predictor import ModelError, serving_settings

from keras_pipe_train.settings.serving_schema import ServedCalibration, ServingSettings, read
from tests.conftest import REPO
from tests.serve.conftest import CLASSES, Server

pytestmark = pytest.mark.slow

OLD_MODELS = REPO / "tests/data/old-models.tar.gz"


@pytest.fixture(scope="module")
def old(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("old-models")
    with tarfile.open(OLD_MODELS) as tar:
        tar.extractall(folder, filter="data")
    return folder


def served_answer(model: Path, image: bytes, log: Path) -> dict:
    server = Server(model, log, SAGEMAKER_MODEL_SERVER_WORKERS="1")
    try:
        server.wait_until_healthy()
        status, body, sent = server.request("POST", "/invocations", image, Content_Type="image/png")
    finally:
        assert server.stop() == 0, log.read_text()[-3000:]
    assert status == 200 and sent["Content-Type"] == "application/json", body[:500]
    return json.loads(body)


def test_the_old_files_are_version_1_and_read_by_the_schema(old):
    for name in ("single-label", "multi-label"):
        assert "version" not in json.loads((old / name / "serving.json").read_text())
    single, multi = read(old / "single-label"), read(old / "multi-label")
    assert single == ServingSettings(32) and single.version == 1
    assert multi.version == 1 and multi == ServingSettings(32, threshold=0.4, calibration=ServedCalibration(
        (2.5, 0.5, 1.0), 100, multi.calibration.calibrated_thresholds))
    assert multi.calibration.calibrated_thresholds == pytest.approx([0.4596, 0.3077, 0.4], abs=1e-4)
    assert OLD_MODELS.stat().st_size < 100_000


def test_an_old_single_label_model_serves_as_it_answered_when_exported(old, tmp_path):
    expected = json.loads((old / "expected.json").read_text())["single-label"]
    answer = served_answer(old / "single-label", (old / "probe.png").read_bytes(), tmp_path / "serve.log")
    assert answer["labels"] == list(CLASSES) and len(answer["probabilities"]) == len(CLASSES)
    assert sum(answer["probabilities"]) == pytest.approx(1, abs=1e-5)
    np.testing.assert_allclose(answer["probabilities"], expected["probabilities"], atol=1e-5)
    assert answer["predicted_label"] == CLASSES[expected["class_ids"]]
    assert [c["label"] for c in answer["top_k"]] == [CLASSES[i] for i in np.argsort(expected["probabilities"])[::-1]]


def test_an_old_calibrated_multi_label_model_serves_with_its_threshold_and_calibration(old, tmp_path):
    expected = json.loads((old / "expected.json").read_text())["multi-label"]
    answer = served_answer(old / "multi-label", (old / "probe.png").read_bytes(), tmp_path / "serve.log")
    assert answer["labels"] == list(CLASSES) and len(answer["probabilities"]) == len(CLASSES)
    np.testing.assert_allclose(answer["probabilities"], expected["probabilities"], atol=1e-5)
    assert answer["predicted_labels"] == [c for c, on in zip(CLASSES, expected["predicted"]) if on]
    assert answer["threshold"] == 0.4
    assert answer["calibrated_thresholds"] == list(read(old / "multi-label").calibration.calibrated_thresholds)


def test_a_serving_json_newer_than_the_server_is_refused_at_startup(old, tmp_path):
    settings = json.loads((old / "single-label" / "serving.json").read_text())
    (tmp_path / "serving.json").write_text(json.dumps({**settings, "version": 3}))
    with pytest.raises(ModelError, match="serving.json is version 3 of serving.json, newer than this keras-pipe"):
        serving_settings([tmp_path])
