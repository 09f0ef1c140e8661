"""`serve` with KERAS_PIPE_RUNTIME=onnx: the model's ONNX export (exports/model.onnx, made here as
`keras-pipe export` makes it) run by ONNX Runtime answers what the SavedModel answers, calibration
and multi-label thresholds included; without the export, or with a runtime it does not know, the
server refuses to start, saying why."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import image_bytes
from tests.serve.conftest import CLASSES, SERVE, Server, exported, free_port
from tests.serve.test_server import signature_answers

pytestmark = pytest.mark.slow

IMAGES = [image_bytes("JPEG", 40, 30), image_bytes("PNG", 31, 45), image_bytes("JPEG", 300, 200)]


@pytest.mark.parametrize("threshold", [None, 0.5])
def test_the_onnx_export_answers_as_the_savedmodel(tmp_path, threshold):
    from keras_pipe_train.after_training.folder_exports import export_folder

    model_dir = exported(tmp_path / "model", threshold=threshold, temperature=[2.0, 0.5, 1.0] if threshold else 2.0)
    export_folder(model_dir, ("onnx",), [], model_dir / "exports")
    server = Server(model_dir, tmp_path / "serve.log", SAGEMAKER_MODEL_SERVER_WORKERS="1", KERAS_PIPE_RUNTIME="onnx")
    try:
        server.wait_until_healthy()
        expected = signature_answers(model_dir, IMAGES)
        for index, image in enumerate(IMAGES):
            status, body, _ = server.request("POST", "/invocations", image, Content_Type="application/x-image")
            assert status == 200, body
            answer = json.loads(body)
            np.testing.assert_allclose(answer["probabilities"], expected["probabilities"][index], atol=1e-5)
            if threshold is None:
                assert answer["predicted_label"] == expected["classes"][index].decode()
            else:
                assert answer["predicted_labels"] == [c for c, on in zip(CLASSES, expected["predicted"][index]) if on]
    finally:
        server.stop()
    assert "KERAS_PIPE_RUNTIME=onnx: " in (tmp_path / "serve.log").read_text()
    if threshold is None:  # an exports.json naming other classes than the export answers: refused at load
        from keras_pipe_serve.export_predictor import ExportPredictor
        from keras_pipe_serve.predictor import ModelError

        described = json.loads((model_dir / "exports" / "exports.json").read_text())
        described["class_names"] = described["class_names"][:-1]
        (model_dir / "exports" / "exports.json").write_text(json.dumps(described))
        with pytest.raises(ModelError, match=rf"answers {len(CLASSES)} classes, but exports.json beside it names "
                                             rf"{len(CLASSES) - 1}: they are not of the same model"):
            ExportPredictor(model_dir / "exports" / "model.onnx")


def test_without_its_export_or_with_an_unknown_runtime_the_server_says_so_and_does_not_start(tmp_path):
    model_dir = exported(tmp_path / "model")
    shutil.rmtree(model_dir / "exports", ignore_errors=True)
    for runtime, said in [("onnx", f"KERAS_PIPE_RUNTIME=onnx serves {model_dir / 'exports/model.onnx'}, which does "
                                   "not exist: train with export_formats=onnx, or run `keras-pipe export"),
                          ("tensorrt", "serve: KERAS_PIPE_RUNTIME must be one of tensorflow, onnx, got 'tensorrt'")]:
        out = subprocess.run([SERVE, "--model-dir", str(model_dir), "--host", "127.0.0.1", "--port", str(free_port())],
                             env={**os.environ, "KERAS_PIPE_RUNTIME": runtime, "SAGEMAKER_MODEL_SERVER_WORKERS": "1"},
                             capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and said in out.stdout + out.stderr, (runtime, out.stdout[-2000:], out.stderr[-2000:])


def test_the_servers_master_finds_the_onnx_export_where_the_job_writes_it():
    from keras_pipe_serve.export_predictor import ONNX_EXPORT

    from keras_pipe_train.model import conversions

    assert ONNX_EXPORT == Path(conversions.FOLDER) / conversions.FILES["onnx"]
