"""`keras-pipe-serve` (the image's `serve`) as SageMaker talks to it: GET /ping, POST /invocations
with every request form, every bad request a 4xx saying what was wrong, and the server still
serving, with the worker it started with, after all of them."""

import base64
import json
import platform
import re

import numpy as np
import pytest

from keras_pipe_train.settings import cpu_kernels, serving_schema
from tests.conftest import image_bytes, png_bomb
from tests.serve.conftest import CLASSES, SERVE, Server

pytestmark = pytest.mark.slow

JPEG = image_bytes("JPEG", 40, 30)
PNG = image_bytes("PNG", 31, 45)


def signature_answers(model_dir, images: list[bytes]) -> dict:
    """What the exported SavedModel itself says, called in-process (the server must agree)."""
    import tensorflow as tf

    serve = tf.saved_model.load(str(model_dir / "1")).signatures["serving_default"]
    return {k: v.numpy() for k, v in serve(image_bytes=tf.constant(images)).items()}


def post(server, body: bytes, content_type: str, **headers) -> tuple[int, dict | bytes]:
    status, answer, sent = server.request("POST", "/invocations", body, Content_Type=content_type, **headers)
    if sent.get("Content-Type") == "application/json":
        return status, json.loads(answer)
    return status, answer


def test_ping_is_200_with_an_empty_body(server):
    assert server.request("GET", "/ping")[:2] == (200, b"")


def test_the_worker_runs_the_jobs_cpu_kernels_and_says_so(server):
    """(settings/cpu_kernels.py: the served answers round as the job's own did)"""
    x86 = platform.machine() in cpu_kernels.MACHINES
    said = "CPU kernels: oneDNN on every x86-64 CPU (TF_ENABLE_ONEDNN_OPTS=1" if x86 else "TensorFlow's choice"
    assert said in server.log.read_text()


@pytest.mark.parametrize("content_type, image", [("application/x-image", JPEG), ("image/jpeg", JPEG),
                                                 ("image/png", PNG)])
def test_one_image_gets_every_classs_probability_and_the_top_classes(server, model_dir, content_type, image):
    status, answer = post(server, image, content_type)
    assert status == 200, answer
    expected = signature_answers(model_dir, [image])
    np.testing.assert_allclose(answer["probabilities"], expected["probabilities"][0], atol=1e-6)
    assert answer["labels"] == list(CLASSES)
    assert answer["predicted_label"] == expected["classes"][0].decode()
    ranked = sorted(zip(answer["probabilities"], CLASSES), reverse=True)
    assert answer["top_k"] == [{"label": c, "probability": p} for p, c in ranked]  # (3 classes: all of them)


def test_this_projects_dialect_answers_its_own_media_type_as_application_json(server, model_dir):
    """A model exported in this project's dialect (export()'s default) answers as before dialects;
    application/vnd.keras-pipe+json, the type that gets this answer from a built-in's dialect too
    (test_dialects.py), gets the same, and its JSON Lines form a line of it."""
    status, default, sent = server.request("POST", "/invocations", JPEG, Content_Type="image/jpeg")
    assert status == 200 and sent["Content-Type"] == "application/json"
    assert serving_schema.read(model_dir).dialect == "keras-pipe"
    status, body, sent = server.request("POST", "/invocations", JPEG, Content_Type="image/jpeg",
                                        Accept="application/vnd.keras-pipe+json")
    assert (status, body, sent["Content-Type"]) == (200, default, "application/vnd.keras-pipe+json")
    status, body, sent = server.request("POST", "/invocations", JPEG, Content_Type="image/jpeg",
                                        Accept="application/vnd.keras-pipe+jsonlines")
    assert (status, body, sent["Content-Type"]) == (200, default + b"\n", "application/vnd.keras-pipe+jsonlines")


def test_tf_servings_json_and_json_lines_answer_each_image_in_order(server, model_dir):
    expected = signature_answers(model_dir, [JPEG, PNG])["probabilities"]
    instances = {"instances": [{"b64": base64.b64encode(JPEG).decode()}, {"b64": base64.b64encode(PNG).decode()}]}
    status, answer = post(server, json.dumps(instances).encode(), "application/json",
                          X_Amzn_SageMaker_Custom_Attributes="top_k=1")
    assert status == 200, answer
    np.testing.assert_allclose([p["probabilities"] for p in answer["predictions"]], expected, atol=1e-6)
    assert [len(p["top_k"]) for p in answer["predictions"]] == [1, 1]
    lines = "\n".join(json.dumps({"b64": base64.b64encode(i).decode()}) for i in (PNG, JPEG, PNG)).encode()
    status, answer = post(server, lines, "application/jsonlines")  # batch transform, SplitType=Line
    assert status == 200, answer
    rows = [json.loads(line) for line in answer.decode().splitlines()]
    np.testing.assert_allclose([r["probabilities"] for r in rows], expected[[1, 0, 1]], atol=1e-6)


def test_every_bad_request_gets_its_4xx_and_the_server_keeps_serving(server, model_dir):
    truncated = JPEG[: len(JPEG) // 2]
    bad = [
        (("POST", "/invocations", b"hello", {"Content_Type": "image/jpeg"}), 400, "the body is not an image"),
        (("POST", "/invocations", truncated, {"Content_Type": "image/jpeg"}), 400, "the body is a truncated JPEG"),
        (("POST", "/invocations", png_bomb(), {"Content_Type": "image/png"}), 400,
         "16000x16000 PNG image, 256 megapixels: more than max_image_pixels (100000000)"),
        (("POST", "/invocations", JPEG, {"Content_Type": "text/csv"}), 415, "unsupported Content-Type 'text/csv'"),
        (("POST", "/invocations", b'{"instances": [', {"Content_Type": "application/json"}), 400, "not valid JSON"),
        (("POST", "/invocations", JPEG, {"Content_Type": "image/jpeg", "Accept": "text/csv"}), 406,
         "cannot answer in 'text/csv'"),
        (("POST", "/invocations", b"\0" * (2 * 1024 * 1024 + 1), {"Content_Type": "image/jpeg"}), 413,
         "this server takes at most 2097152"),
        (("POST", "/invocations", json.dumps([base64.b64encode(JPEG).decode(), "?"]).encode(),
          {"Content_Type": "application/json"}), 400, "image 2 is not valid base64"),
        (("POST", "/invocations", json.dumps([base64.b64encode(JPEG).decode(), base64.b64encode(b"GIF89a").decode()]
                                             ).encode(), {"Content_Type": "application/json"}), 400, "item 2 is"),
        (("GET", "/invocations", None, {}), 405, "/invocations takes POST"),
        (("GET", "/execution-parameters", None, {}), 404, "this server answers GET /ping and POST /invocations"),
    ]
    for (method, path, body, headers), status, message in bad:
        got, answer, sent = server.request(method, path, body, **headers)
        assert got == status, (message, answer[:500])
        assert sent["Content-Type"] == "application/json" and message in json.loads(answer)["error"], answer[:500]
        assert server.request("GET", "/ping")[0] == 200
    assert post(server, JPEG, "image/jpeg")[0] == 200
    log = server.log.read_text()
    assert len(re.findall(r"Booting worker", log)) == 1, log[-3000:]  # none died and was replaced
    assert "Traceback" not in log, log[-3000:]


def test_a_multi_label_model_answers_the_classes_above_its_threshold(multi_label_model_dir, tmp_path):
    server = Server(multi_label_model_dir, tmp_path / "serve.log", SAGEMAKER_MODEL_SERVER_WORKERS="1")
    try:
        server.wait_until_healthy()
        status, answer = post(server, JPEG, "image/jpeg")
    finally:
        assert server.stop() == 0, server.log.read_text()[-2000:]  # SIGTERM: a clean, graceful exit
    assert status == 200, answer
    expected = signature_answers(multi_label_model_dir, [JPEG])
    assert answer["threshold"] == 0.5
    assert answer["predicted_labels"] == [c for c, on in zip(CLASSES, expected["predicted"][0]) if on]
    np.testing.assert_allclose(answer["probabilities"], expected["probabilities"][0], atol=1e-6)


def test_a_calibrated_multi_label_model_says_each_classs_edge_in_the_probabilities_it_serves(tmp_path):
    """Its predictions are its own sigmoid's at the threshold; its probabilities are calibrated, a
    temperature per class: the answer gives each class's calibrated threshold, at or above which
    exactly the predicted classes are."""
    from tests.serve.conftest import exported

    model = exported(tmp_path / "model", threshold=0.45, temperature=[0.5, 2.0, 4.0])
    server = Server(model, tmp_path / "serve.log", SAGEMAKER_MODEL_SERVER_WORKERS="1")
    try:
        server.wait_until_healthy()
        answers = [post(server, image_bytes("JPEG", 20 + i, 30), "image/jpeg") for i in range(8)]
    finally:
        assert server.stop() == 0, server.log.read_text()[-2000:]
    edges = 1 / (1 + np.exp(-np.log(0.45 / 0.55) / np.array([0.5, 2.0, 4.0])))
    for status, answer in answers:
        assert status == 200, answer
        assert answer["threshold"] == 0.45 and answer["calibrated_thresholds"] == pytest.approx(edges)
        above = [c for c, p, edge in zip(CLASSES, answer["probabilities"], edges) if p >= edge]
        assert answer["predicted_labels"] == above
    # (why the edges are answered: a class calibrated above the threshold, yet not predicted)
    assert any(p >= 0.45 and c not in answer["predicted_labels"]
               for _, answer in answers for c, p in zip(CLASSES, answer["probabilities"]))


def test_a_calibrated_model_serves_its_calibrated_probabilities(tmp_path):
    """calibration's temperature is in the SavedModel: the server answers softmax(logits / T),
    with the same predicted label as the model's own probabilities."""
    from tests.serve.conftest import exported

    plain = signature_answers(exported(tmp_path / "plain"), [JPEG])["probabilities"][0]
    calibrated = exported(tmp_path / "calibrated", temperature=2.5)
    server = Server(calibrated, tmp_path / "serve.log", SAGEMAKER_MODEL_SERVER_WORKERS="1")
    try:
        server.wait_until_healthy()
        status, answer = post(server, JPEG, "image/jpeg")
    finally:
        assert server.stop() == 0, server.log.read_text()[-2000:]
    assert status == 200, answer
    expected = np.exp(np.log(plain) / 2.5) / np.exp(np.log(plain) / 2.5).sum()
    np.testing.assert_allclose(answer["probabilities"], expected, atol=1e-5)
    assert answer["predicted_label"] == CLASSES[int(np.argmax(plain))]
    assert max(answer["probabilities"]) < max(plain) - 0.05  # (less sure: T > 1)


@pytest.mark.parametrize("setting, message", [
    ({"args": ["--model-dir", "/nowhere"]}, "serve: /nowhere holds no SavedModel"),
    ({"env": {"SAGEMAKER_MODEL_SERVER_WORKERS": "two"}}, "serve: SAGEMAKER_MODEL_SERVER_WORKERS='two' is not a whole"),
    ({"env": {"SAGEMAKER_MAX_PAYLOAD_IN_MB": "-1"}}, "serve: SAGEMAKER_MAX_PAYLOAD_IN_MB must be 0 or more, got '-1'"),
])
def test_what_cannot_be_served_is_said_before_any_worker_starts(setting, message, model_dir):
    import os
    import subprocess

    out = subprocess.run([SERVE, "--model-dir", str(model_dir), *setting.get("args", [])], capture_output=True,
                         text=True, timeout=60, env={**os.environ, **setting.get("env", {})})
    assert out.returncode != 0 and message in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_the_model_is_found_where_the_job_writes_it_under_sagemaker_base_dir(tmp_path):
    """The job writes model/ under $SAGEMAKER_BASE_DIR (contract.paths): serve reads it from there."""
    import os
    import subprocess

    env = {key: value for key, value in os.environ.items() if key != "SM_MODEL_DIR"}
    out = subprocess.run([SERVE], capture_output=True, text=True, timeout=60,
                         env={**env, "SAGEMAKER_BASE_DIR": str(tmp_path)})
    assert out.returncode != 0 and f"serve: {tmp_path}/model holds no SavedModel" in out.stderr, out.stderr[-2000:]
    # SM_MODEL_DIR (then --model-dir) still says another
    out = subprocess.run([SERVE], capture_output=True, text=True, timeout=60,
                         env={**env, "SAGEMAKER_BASE_DIR": str(tmp_path), "SM_MODEL_DIR": str(tmp_path / "other")})
    assert f"serve: {tmp_path}/other holds no SavedModel" in out.stderr, out.stderr[-2000:]


def test_a_server_version_the_front_was_not_built_for_is_refused_before_any_worker_starts(model_dir, tmp_path):
    """Another uvicorn installed (a stand-in's metadata, found first on the path): serve says which
    it has and which it was built for, and starts nothing."""
    import os
    import subprocess

    dist = tmp_path / "site" / "uvicorn-0.99.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: uvicorn\nVersion: 0.99.0\n")
    out = subprocess.run([SERVE, "--model-dir", str(model_dir)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert out.returncode != 0, out.stderr[-2000:]
    assert "serve: uvicorn 0.99.0 is installed; this server was built for uvicorn>=0.54,<0.55" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "Booting worker" not in out.stderr + out.stdout
