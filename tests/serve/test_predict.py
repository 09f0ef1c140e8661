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
    assert "1 of 3 images could not be read" in out.stderr and "Traceback" not in out.stderr
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
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(model_dir.iterdir()):
            tar.add(path, arcname=path.name)
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
