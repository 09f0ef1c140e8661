"""`keras-pipe predict`, the installed command as users type it: a model folder or model.tar.gz,
image files and folders, CSV or JSON Lines out; unreadable images named and left out."""

import csv
import dataclasses
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from keras_pipe_train.settings import serving_schema
from tests.conftest import image_bytes, run_logged
from tests.serve.conftest import CLASSES

pytestmark = pytest.mark.slow

KERAS_PIPE = str(Path(sys.executable).parent / "keras-pipe")


def keras_pipe(*args, cwd) -> subprocess.CompletedProcess:
    return run_logged([KERAS_PIPE, "predict", *map(str, args)], 270, cwd=cwd)


@pytest.fixture
def photos(tmp_path) -> Path:
    (tmp_path / "photos" / "a" / "deeper").mkdir(parents=True)
    (tmp_path / "photos" / "a" / "1.jpg").write_bytes(image_bytes("JPEG", 40, 30))
    (tmp_path / "photos" / "a" / "deeper" / "2.PNG").write_bytes(image_bytes("PNG", 20, 60))
    (tmp_path / "photos" / "a" / "notes.txt").write_text("not an image, not even looked at")
    (tmp_path / "photos" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    return tmp_path / "photos"


def test_a_model_folder_over_folders_and_files_to_csv(model_dir, photos, tmp_path):
    out = keras_pipe(model_dir, photos / "a", photos / "broken.jpg", cwd=tmp_path)
    assert out.returncode == 1, out.stderr[-2000:]  # one image could not be read
    assert f"keras-pipe predict: {photos / 'broken.jpg'}: is not an image" in out.stderr
    assert "1 of 3 images could not be read or predicted" in out.stderr and "Traceback" not in out.stderr
    rows = list(csv.reader(io.StringIO(out.stdout)))
    assert rows[0] == ["path", "predicted", "probability", *CLASSES]
    assert [r[0] for r in rows[1:]] == [str(photos / "a" / "1.jpg"), str(photos / "a" / "deeper" / "2.PNG")]
    for row in rows[1:]:
        probabilities = [float(p) for p in row[3:]]
        assert row[1] == CLASSES[int(np.argmax(probabilities))] and float(row[2]) == max(probabilities)
        assert sum(probabilities) == pytest.approx(1, abs=1e-5)


def test_a_model_tar_gz_to_json_lines_as_serve_answers(model_dir, photos, tmp_path):
    """(A model of the MXNet built-in's dialect: predict still writes this project's answer, which
    serve gives it for application/vnd.keras-pipe+jsonlines.)"""
    archive = tmp_path / "model.tar.gz"
    dataclasses.replace(serving_schema.read(model_dir), dialect="mxnet").write(tmp_path)
    with tarfile.open(archive, "w:gz") as tar:  # as SageMaker packs /opt/ml/model
        for path in sorted(model_dir.rglob("*")):
            source = tmp_path / "serving.json" if path.name == "serving.json" else path
            tar.add(source, arcname=str(path.relative_to(model_dir)), recursive=False)
    out = keras_pipe(archive, photos / "a" / "1.jpg", "--format", "jsonl", "--top-k", "2", "-o", "out.jsonl",
                     cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    [line] = (tmp_path / "out.jsonl").read_text().splitlines()
    answer = json.loads(line)
    assert answer["path"] == str(photos / "a" / "1.jpg") and answer["labels"] == list(CLASSES)
    assert len(answer["top_k"]) == 2 and answer["top_k"][0]["label"] == answer["predicted_label"]


def made(path: Path, content: bytes | None) -> Path:
    """A folder (content None) or a file."""
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "nowhere", "does not exist"),
    (lambda d: made(d / "empty", None), "holds no SavedModel"),
    (lambda d: made(d / "x.tar.gz", b"not a tar"), "cannot be read as a model.tar.gz"),
])
def test_a_model_that_is_not_one_is_a_clear_error(make, message, photos, tmp_path):
    out = keras_pipe(make(tmp_path), photos, cwd=tmp_path)
    assert out.returncode == 2 and message in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_an_archive_member_linking_out_is_refused(model_dir, photos, tmp_path):
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        link = tarfile.TarInfo("1/variables/evil")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    out = keras_pipe(archive, photos, cwd=tmp_path)
    assert out.returncode == 2 and "cannot be read as a model.tar.gz" in out.stderr, out.stderr[-2000:]


def probabilities_by_path(out: subprocess.CompletedProcess) -> dict[str, np.ndarray]:
    rows = list(csv.reader(io.StringIO(out.stdout)))
    return {row[0]: np.array([float(p) for p in row[3:]]) for row in rows[1:]}


@pytest.mark.parametrize("threshold", [None, 0.3])
def test_a_calibrated_model_answers_its_calibrated_probabilities(photos, tmp_path, threshold):
    """The same weights exported twice, the second with a temperature (as calibration=true fits
    one): predict answers softmax(logits / T) (sigmoid for multi-label), the same prediction, and
    serving.json says so."""
    from tests.serve.conftest import exported

    temperature = 2.5 if threshold is None else [2.5, 0.5, 1.0]
    plain = exported(tmp_path / "plain", threshold)
    calibrated = exported(tmp_path / "calibrated", threshold, temperature=temperature)
    written = serving_schema.read(calibrated).calibration.temperature
    assert written == (tuple(temperature) if isinstance(temperature, list) else temperature)
    before = probabilities_by_path(keras_pipe(plain, photos / "a", cwd=tmp_path))
    out = keras_pipe(calibrated, photos / "a", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    after = probabilities_by_path(out)
    assert before.keys() == after.keys() and len(after) == 2
    for path, raw in before.items():
        if threshold is None:
            expected = np.exp(np.log(raw) / temperature)
            expected /= expected.sum()
            assert np.argmax(after[path]) == np.argmax(raw)
        else:
            logits = np.log(raw / (1 - raw))
            expected = 1 / (1 + np.exp(-logits / np.array(temperature)))
        assert after[path] == pytest.approx(expected, abs=2e-4), (path, raw, after[path])
        assert not np.allclose(after[path], raw, atol=1e-3)  # (the temperature did something)


def test_explain_writes_each_images_heatmap_for_its_class_and_an_export_is_refused(model_dir, photos, tmp_path):
    """--explain DIR: one JPEG an image and a class predicted, named after the image (two images of
    one name both kept), the picture the model saw under its heatmap, at 256 pixels; how they were
    made said. An export (.tflite) has no gradients: refused before anything runs."""
    import tensorflow as tf

    (photos / "b").mkdir()
    (photos / "b" / "1.JPG").write_bytes(image_bytes("JPEG", 64, 64))  # (the same name, whatever a disk's case)
    out = keras_pipe(model_dir, photos / "a", photos / "b", "--format", "jsonl", "--explain", "heat maps",
                     cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    answers = {Path(json.loads(line)["path"]).relative_to(photos): json.loads(line)["predicted_label"]
               for line in out.stdout.splitlines()}
    assert set(answers) == {Path("a/1.jpg"), Path("a/deeper/2.PNG"), Path("b/1.JPG")}
    # (a one-convolution backbone: its only map is its stem's, where Grad-CAM says nothing of the class)
    assert "keras-pipe predict: 3 heatmap(s) in heat maps, by Integrated Gradients on the pixels" in out.stderr, \
        out.stderr
    written = sorted(p.name for p in (tmp_path / "heat maps").iterdir())
    assert written == sorted([f"1.{answers[Path('a/1.jpg')]}.jpg", f"2.{answers[Path('a/deeper/2.PNG')]}.jpg",
                              f"1.{answers[Path('b/1.JPG')]}-2.jpg"]), written
    for name in written:
        assert tf.io.decode_jpeg((tmp_path / "heat maps" / name).read_bytes()).shape == (256, 256, 3)
    # the same from its model.tar.gz, as SageMaker packs /opt/ml/model (unpacked once for both)
    archive = tmp_path / "model.tar.gz"
    tar_gz(model_dir, archive)
    packed = keras_pipe(archive, photos / "a", photos / "b", "--format", "jsonl", "--explain", "packed", cwd=tmp_path)
    assert packed.returncode == 0 and packed.stdout == out.stdout, packed.stderr
    assert sorted(p.name for p in (tmp_path / "packed").iterdir()) == written
    # refused before any prediction: a SavedModel folder alone (no model.keras, no preparation.json)
    refused = keras_pipe(model_dir / "1", photos / "a", "--explain", "elsewhere", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == "" and "--explain: " in refused.stderr, refused.stderr
    export = tmp_path / "model.tflite"
    export.write_bytes(b"TFL3")
    refused = keras_pipe(export, photos / "a", "--explain", "elsewhere", cwd=tmp_path)
    assert refused.returncode == 2 and "--explain needs the model's model.keras" in refused.stderr, refused.stderr
    assert not (tmp_path / "elsewhere").exists()


def at_the_endpoint(runtime, *args, cwd) -> subprocess.CompletedProcess:
    """`keras-pipe predict --endpoint ...` as a user with AWS credentials types it, its SageMaker
    runtime the one on 127.0.0.1 (tests/serve/sagemaker_runtime.py)."""
    import os

    env = {**os.environ, "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": runtime.url, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    return run_logged([KERAS_PIPE, "predict", *map(str, args)], 270, cwd=cwd, env=env)


def test_an_endpoint_is_asked_an_image_a_call_and_answers_the_rows_the_model_here_does(server, model_dir, photos,
                                                                                        tmp_path):
    """--endpoint NAME: each image one InvokeEndpoint call, answered as the same model here answers;
    an image the container refuses (413: past the endpoint's 2 MB) listed and left out; an endpoint
    that is not there, a usage error naming it."""
    from tests.serve.sagemaker_runtime import Runtime

    rng = np.random.default_rng(0)
    large = tf_png(rng.integers(0, 256, (1000, 1000, 3), dtype=np.uint8))  # (noise: ~3 MB, a valid PNG)
    assert 2 << 20 < len(large) < 6 << 20
    (photos / "a" / "large.png").write_bytes(large)
    runtime = Runtime({"digits": server.url})
    try:
        # (images after an option too, as users type them)
        asked = at_the_endpoint(runtime, "--endpoint", "digits", photos / "a", "--top-k", "2", photos / "broken.jpg",
                                cwd=tmp_path)
        assert asked.returncode == 1, asked.stderr
        assert f"{photos / 'a' / 'large.png'}: the endpoint answered 413: the body is" in asked.stderr, asked.stderr
        assert f"{photos / 'broken.jpg'}: is not an image" in asked.stderr and "Traceback" not in asked.stderr
        (photos / "a" / "large.png").unlink()
        here = keras_pipe(model_dir, "--format", "csv", photos / "a", cwd=tmp_path)
        ours, theirs = (list(csv.reader(io.StringIO(out.stdout))) for out in (asked, here))
        assert ours[0] == theirs[0] == ["path", "predicted", "probability", *CLASSES]
        assert [row[:2] for row in ours[1:]] == [row[:2] for row in theirs[1:]] and len(ours) == 3, (ours, theirs)
        for a, b in zip(ours[1:], theirs[1:]):
            assert np.allclose([float(p) for p in a[2:]], [float(p) for p in b[2:]], atol=2e-6), (a, b)
        # each image its own call, as the server takes them: the image as it is, this project's object, top_k
        assert len(runtime.invoked) == 3 and all(
            call["Content-Type"] == "application/x-image" and call["Accept"] == "application/vnd.keras-pipe+json"
            and call["X-Amzn-SageMaker-Custom-Attributes"] == "top_k=2" and call["target"] is None
            for call in runtime.invoked), runtime.invoked

        missing = at_the_endpoint(runtime, "--endpoint", "nope", photos / "a", cwd=tmp_path)
        assert missing.returncode == 2 and missing.stdout == "", missing.stderr
        assert "endpoint nope: ValidationError: Endpoint nope of account 123456789012 not found." in missing.stderr
        refused = at_the_endpoint(runtime, "--endpoint", "digits", photos / "a", "--explain", "heat", cwd=tmp_path)
        assert refused.returncode == 2 and "--explain needs the model's model.keras here" in refused.stderr
        refused = keras_pipe(model_dir, photos / "a", "--target-model", "a/model.tar.gz", cwd=tmp_path)
        assert refused.returncode == 2 and "give --endpoint too" in refused.stderr
        refused = at_the_endpoint(runtime, "--endpoint", "digits", model_dir, photos / "a", cwd=tmp_path)
        assert refused.returncode == 2 and "looks like a model: with --endpoint" in refused.stderr, refused.stderr
        refused = at_the_endpoint(runtime, "--endpoint", "digits", photos / "a", "--bogus", cwd=tmp_path)
        assert refused.returncode == 2 and "unrecognized arguments: --bogus" in refused.stderr, refused.stderr
    finally:
        runtime.close()


def test_a_multi_model_endpoints_target_model_is_loaded_on_its_first_call_and_answers_its_own_classes(
        model_dir, multi_label_model_dir, photos, tmp_path):
    """--target-model KEY on a multi-model endpoint: the model SageMaker loads from the endpoint's
    prefix on its first call answers, with its own classes (a multi-label one's JSON Lines: its
    predicted_labels); a key under which nothing lies is a usage error naming it."""
    from tests.serve.conftest import Server
    from tests.serve.sagemaker_runtime import Runtime

    prefix = tmp_path / "prefix"
    for key, folder in (("customer-a/model.tar.gz", model_dir), ("customer-b/model.tar.gz", multi_label_model_dir)):
        (prefix / key).parent.mkdir(parents=True)
        tar_gz(folder, prefix / key)
    (tmp_path / "opt-ml" / "model").mkdir(parents=True)
    server = Server(tmp_path / "opt-ml" / "model", tmp_path / "serve.log", SAGEMAKER_MULTI_MODEL="true",
                    SAGEMAKER_MODEL_SERVER_WORKERS="1")
    runtime = Runtime({"customers": server.url}, {"customers": prefix}, tmp_path / "opt-ml" / "models")
    try:
        server.wait_until_healthy()
        first = at_the_endpoint(runtime, "--endpoint", "customers", "--target-model", "customer-a/model.tar.gz",
                                photos / "a", cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        rows = list(csv.reader(io.StringIO(first.stdout)))
        assert rows[0] == ["path", "predicted", "probability", *CLASSES] and len(rows) == 3, rows
        second = at_the_endpoint(runtime, "--endpoint", "customers", "--target-model", "customer-b/model.tar.gz",
                                 photos / "a", "--format", "jsonl", cwd=tmp_path)
        assert second.returncode == 0, second.stderr
        lines = [json.loads(line) for line in second.stdout.splitlines()]
        assert len(lines) == 2 and all("predicted_labels" in line for line in lines), lines
        assert {call["target"] for call in runtime.invoked} == {"customer-a/model.tar.gz", "customer-b/model.tar.gz"}
        assert all(call["X-Amzn-SageMaker-Target-Model"] for call in runtime.invoked if "X-Amzn-SageMaker-Target-Model"
                   in call) and len(runtime.loaded) == 2
        untargeted = at_the_endpoint(runtime, "--endpoint", "customers", photos / "a", cwd=tmp_path)
        assert untargeted.returncode == 2 and "ValidationError: Request 0f6ad3ef is missing a target model header" \
            in untargeted.stderr, untargeted.stderr
        missing = at_the_endpoint(runtime, "--endpoint", "customers", "--target-model", "customer-c/model.tar.gz",
                                  photos / "a", cwd=tmp_path)
        assert missing.returncode == 2, missing.stderr
        assert "endpoint customers (target model customer-c/model.tar.gz): ValidationError: Failed to download" \
            in missing.stderr, missing.stderr
    finally:
        runtime.close()
        assert server.stop() == 0
    assert "loaded model" in server.log.read_text()


def tar_gz(folder: Path, archive: Path) -> None:
    """`folder`'s files as a model.tar.gz holds them, as SageMaker packs /opt/ml/model."""
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=path.name)


def tf_png(pixels: np.ndarray) -> bytes:
    import tensorflow as tf

    return tf.io.encode_png(pixels).numpy()
