"""Exports (export_formats; model/conversions.py): TFLite and ONNX, converted from the model as
served, run by their own runtimes (the TFLite interpreter, ONNX Runtime), compared with the
SavedModel, and kept or dropped by their bars."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_train.model import conversions
from keras_pipe_train.model.export import served_probabilities
from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.settings.serving_schema import ServedCalibration


def small_classifier(classes: int, activation: str) -> keras.Model:
    keras.utils.set_random_seed(5)
    images = keras.Input((16, 16, 3))
    x = keras.layers.Rescaling(1 / 127.5, -1)(images)
    x = keras.layers.Conv2D(32, 3, activation="relu")(x)
    x = keras.layers.Conv2D(64, 3, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(images, keras.layers.Dense(classes, activation=activation, name="classifier")(x))


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).uniform(0, 255, (64, 16, 16, 3)).astype(np.float32)


@pytest.mark.parametrize("threshold, served", [(None, "own"), (0.5, "own"), (None, "calibrated and flipped"),
                                               (0.5, "calibrated and flipped")])
def test_each_format_answers_as_the_savedmodel_and_quantized_weights_shrink_the_file(tmp_path, images, threshold,
                                                                                     served):
    model = small_classifier(4, "softmax" if threshold is None else "sigmoid")
    head = model.get_layer("classifier")
    head.set_weights([head.get_weights()[0] * 20, head.get_weights()[1]])  # (answers away from the threshold)
    calibration = ServedCalibration(2.5, 100, bias=(0.1, -0.2, 0.0, 0.3)) if served != "own" else None
    answer = served_probabilities(model, calibration, threshold is not None, flip=served != "own")
    conversions.write_classifier(model, answer, 16, threshold, tmp_path)
    reference = tf.saved_model.load(str(tmp_path)).signatures[conversions.SIGNATURE]
    expected = {name: value.numpy() for name, value in reference(images=tf.constant(images)).items()}
    np.testing.assert_allclose(expected["probabilities"], answer(images)[0].numpy(), rtol=1e-5, atol=1e-6)
    if served != "own":  # (the calibration and the flips are in it)
        assert not np.allclose(expected["probabilities"], model(images).numpy(), atol=1e-3)
    decided = answer(images)[1].numpy()
    assert (expected["predictions"] == (decided.argmax(-1) if threshold is None else decided >= threshold)).all()
    sizes = {}
    for export_format in conversions.EXPORT_FORMATS:
        converted = conversions.convert(tmp_path, export_format, images[:32])
        sizes[export_format] = len(converted)
        runner = conversions.runner(converted, export_format)
        answered = runner(images)
        comparison = conversions.Comparison()
        labels = decided.argmax(-1) if threshold is None else (decided >= 0.5).astype(np.float32)
        comparison.add(expected, answered, labels)
        figures = comparison.figures()
        assert figures["images"] == 64 and figures["savedmodel_accuracy"] == 1.0
        if export_format in ("tflite", "onnx"):  # (the same computation, in another runtime's kernels)
            assert figures["agreement"] == 1.0 and figures["max_probability_difference"] < 1e-5, figures
            assert comparison.failed(conversions.BARS[export_format]) is None
        else:  # (the weights did change; a random model's answers near its decisions' edges may flip: the
            # activations in int8 too, more of them, up to 7 of the 64 multi-label images' 4 classes)
            least = 0.85 if export_format == "tflite_full_int8" else 0.9
            assert 0 < figures["max_probability_difference"] < 0.05 and figures["agreement"] > least, figures
        if export_format == "tflite_full_int8":  # (integer kernels throughout: float only in and out)
            kinds = [t["dtype"] for t in runner.interpreter.get_tensor_details()]
            assert kinds.count(np.float32) == 2 and kinds.count(np.int8) > 5, kinds
    # (the weights dominate this model's file: float16 halves it, int8 quarters it)
    assert sizes["tflite_float16"] < 0.6 * sizes["tflite"] and sizes["tflite_int8"] < 0.35 * sizes["tflite"], sizes
    assert sizes["tflite_full_int8"] < 0.4 * sizes["tflite"], sizes  # (its quantization's scales too)
    assert 0.9 * sizes["tflite"] < sizes["onnx"] < 1.2 * sizes["tflite"], sizes  # (float32 weights, both)


def test_a_comparison_past_its_bar_says_why():
    comparison = conversions.Comparison()
    reference = {"probabilities": np.array([[0.9, 0.1], [0.2, 0.8]]), "predictions": np.array([0, 1])}
    comparison.add(reference, {"probabilities": np.array([[0.4, 0.6], [0.2, 0.8]]), "predictions": np.array([1, 1])},
                   np.array([0, 1]))
    assert comparison.figures() == {"images": 2, "agreement": 0.5, "max_probability_difference": pytest.approx(0.5),
                                    "accuracy": 0.5, "savedmodel_accuracy": 1.0}
    assert comparison.failed(conversions.BARS["tflite_int8"]) == ("it decides 50.00% of the images as the SavedModel does, "
                                                           "below 98.0%")
    near = conversions.Comparison()
    near.add(reference, {"probabilities": reference["probabilities"] + 0.002, "predictions": np.array([0, 1])}, None)
    assert near.failed(conversions.BARS["tflite"]) == "a probability differs from the SavedModel's by 0.002, not below 0.001"
    assert near.failed(conversions.BARS["tflite_float16"]) is None
    worse = conversions.Comparison()  # (98 of 100 alike, the bar's least, but the two it moved were right)
    labels = np.arange(100) % 2
    ours = {"probabilities": np.eye(2)[labels], "predictions": labels}
    moved = labels.copy()
    moved[:2] = 1 - moved[:2]
    worse.add(ours, {"probabilities": np.eye(2)[moved], "predictions": moved}, labels)
    assert worse.failed(conversions.BARS["tflite_int8"]) == "its accuracy is 2.00% below the SavedModel's, more than 1%"
    broken = conversions.Comparison()  # (an export whose answers are not numbers: the first conversion tried gave NaN)
    broken.add(reference, {"probabilities": np.full((2, 2), np.nan), "predictions": np.array([0, 1])}, None)
    assert broken.figures()["max_probability_difference"] == float("inf")
    assert broken.failed(conversions.BARS["tflite"]) == broken.failed(conversions.BARS["tflite_int8"]) == (
        "some of its probabilities are not numbers")


def test_export_formats_are_read_as_a_list_of_known_formats():
    read = lambda value: JobConfig.from_hyperparameters({"num_classes": 3, "export_formats": value}).export_formats  # noqa: E731
    assert read("none") == () and read("[]") == () and JobConfig.from_hyperparameters({"num_classes": 3}).export_formats == ()
    assert read("tflite, TFLite_int8,tflite") == ("tflite", "tflite_int8")
    assert read('["tflite_float16", "ONNX"]') == ("tflite_float16", "onnx")
    with pytest.raises(UserError, match="hyperparameter export_formats must be none or a comma-separated list of "
                                        "tflite, tflite_float16, tflite_int8, tflite_full_int8, onnx; tflite_uint8 "
                                        "unknown"):
        read("tflite,tflite_uint8")


# how far each export's probabilities may stray from the SavedModel's on photos it was not checked on
PREDICTED_WITHIN = {"tflite": 1e-5, "onnx": 1e-5, "tflite_float16": 2e-3, "tflite_int8": 2e-3,
                    "tflite_full_int8": 3e-2}


@pytest.mark.slow
def test_keras_pipe_export_then_predict_answer_as_the_savedmodel(tmp_path, s3_bucket):
    """`keras-pipe export s3://.../model.tar.gz --formats <all five> --validation records -o exports`
    then `keras-pipe predict exports/<each> photos/`, the installed commands as users type them:
    each export checked on the records and said; the same rows as the model folder's (within each
    format's rounding), the images prepared as exports.json says; a stray file refused."""
    import csv
    import io
    import sys
    import tarfile
    from pathlib import Path

    from keras_pipe_train.sources.example import encode_example
    from pipemode import tfrecord
    from tests.conftest import image_bytes, run_logged
    from tests.serve.conftest import CLASSES, exported

    client, bucket = s3_bucket
    model_dir = exported(tmp_path / "model")
    photos = tmp_path / "photos"
    photos.mkdir()
    for i, (kind, width, height) in enumerate([("JPEG", 40, 30), ("PNG", 20, 60), ("JPEG", 300, 200)]):
        (photos / f"{i}.{kind.lower()}").write_bytes(image_bytes(kind, width, height))
    command = str(Path(sys.executable).parent / "keras-pipe")
    with tarfile.open(tmp_path / "model.tar.gz", "w:gz") as archive:
        for path in sorted(model_dir.iterdir()):
            archive.add(path, arcname=path.name)
    client.upload_file(str(tmp_path / "model.tar.gz"), bucket, "jobs/first/output/model.tar.gz")
    records = tmp_path / "validation" / "part-00000.tfrecord"
    records.parent.mkdir()
    records.write_bytes(tfrecord.encode([encode_example(image_bytes("JPEG", 20 + i, 30), i % len(CLASSES))
                                         for i in range(40)]))
    formats = list(PREDICTED_WITHIN)
    out = run_logged([command, "export", f"s3://{bucket}/jobs/first/output/model.tar.gz", "--formats", ",".join(formats),
                      "--validation", str(records.parent), "-o", "exports"], 270, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    said = out.stdout.splitlines()
    for export_format in formats:
        line = next(line for line in said if line.startswith(f"exports/{conversions.FILES[export_format]}: "))
        assert "decides 100.00% of 40 validation images" in line, out.stdout
    exports = tmp_path / "exports"
    described = json.loads((exports / "exports.json").read_text())
    assert sorted(described["exports"]) == sorted(formats) and described["class_names"] == list(CLASSES)
    assert described["multi_label"] is False and described["threshold"] is None
    (photos / "broken.jpg").write_bytes(b"\xff\xd8 not really")

    def predicted(model_path: Path) -> list[dict]:
        out = run_logged([command, "predict", str(model_path), str(photos), "--format", "jsonl"], 270, cwd=tmp_path)
        assert out.returncode == 1 and f"keras-pipe predict: {photos / 'broken.jpg'}: is not an image" in out.stderr
        return [json.loads(line) for line in out.stdout.splitlines()]

    served = predicted(model_dir)
    assert len(served) == 3
    for export_format, within in PREDICTED_WITHIN.items():
        answers = predicted(exports / conversions.FILES[export_format])
        assert [a["path"] for a in answers] == [a["path"] for a in served], export_format
        for ours, theirs in zip(served, answers, strict=True):
            np.testing.assert_allclose(theirs["probabilities"], ours["probabilities"], atol=within,
                                       err_msg=export_format)
            if within <= 1e-5:  # (float32: the same answer, to its rounding)
                assert {k: v for k, v in theirs.items() if k not in ("probabilities", "top_k")} == {
                    k: v for k, v in ours.items() if k not in ("probabilities", "top_k")}, export_format
    export = exports / conversions.FILES["tflite"]
    csv_out = run_logged([command, "predict", str(export), str(photos / "0.jpeg")], 270, cwd=tmp_path)
    rows = list(csv.reader(io.StringIO(csv_out.stdout)))
    assert csv_out.returncode == 0 and rows[0] == ["path", "predicted", "probability", *CLASSES], csv_out.stderr
    # (a file of another name beside it, or a broken one: said, exit 2)
    stray = tmp_path / "stray.onnx"
    stray.write_bytes(b"not a model")
    out = run_logged([command, "predict", str(stray), str(photos / "0.jpeg")], 270, cwd=tmp_path)
    assert out.returncode == 2 and f"{stray} is not one of the job's exports: model.tflite" in out.stderr, out.stderr


@pytest.mark.slow
def test_a_keras_hub_transformer_converts_and_answers_as_the_savedmodel(tmp_path):
    """A ViT from keras-hub (tests/job/model/hub_presets.py), its preset's scaling and test-time flips
    inside: each format decides as the SavedModel does."""
    from keras_pipe_train.model import hub
    from keras_pipe_train.model.classifier import build_classifier
    from tests.job.model.hub_presets import make

    make("vit", str(tmp_path / "vit"))
    backbone, scaling = hub.build_backbone(str(tmp_path / "vit"), 32, "imagenet")
    model = build_classifier(str(tmp_path / "vit"), backbone, 4, 0.0, scaling=scaling, image_size=32)
    head = model.get_layer("classifier")
    # (answers away from the decisions' edges: int8 weights may move one of 64, not two)
    head.set_weights([np.random.default_rng(1).normal(0, 5, w.shape) for w in head.get_weights()])
    size = model.input_shape[1]
    images = tf.image.resize(np.random.default_rng(0).uniform(0, 255, (64, 32, 32, 3)), (size, size)).numpy()
    conversions.write_classifier(model, served_probabilities(model, None, False, flip=True), size, None, tmp_path / "c")
    reference = tf.saved_model.load(str(tmp_path / "c")).signatures[conversions.SIGNATURE]
    expected = {name: value.numpy() for name, value in reference(images=tf.constant(images)).items()}
    for export_format in conversions.EXPORT_FORMATS:
        comparison = conversions.Comparison()
        converted = conversions.convert(tmp_path / "c", export_format, images[:32])
        comparison.add(expected, conversions.runner(converted, export_format)(images), None)
        failed = comparison.failed(conversions.BARS[export_format])
        if export_format == "tflite_full_int8":
            # (its LayerNorms, softmaxes and GELUs in int8 move this random ViT's answers too far: 81 % alike
            # here; the job drops such an export, saying why)
            print("full-integer ViT:", comparison.figures(), failed)
            continue
        assert failed is None, (export_format, comparison.figures())


def test_no_export_is_tried_at_a_stop():
    import threading
    from types import SimpleNamespace

    from keras_pipe_train.after_training import conversions as step

    stop = threading.Event()
    assert step._skipped(SimpleNamespace(stop=stop), "tflite") is None
    stop.set()
    assert step._skipped(SimpleNamespace(stop=stop), "onnx") == "a stop request came before it"


def test_a_model_trained_with_mixed_precision_exports_its_float32_twin(tmp_path, images):
    """Mixed precision (on with a GPU) computes in float16, which TFLite's converter does not take:
    the job and `keras-pipe export` convert the model's float32 twin, the same weights, and each
    export answers as the float32 model does."""
    from keras_pipe_train.after_training.folder_exports import export_folder
    from keras_pipe_train.model.classifier import backbone_of, build_classifier
    from keras_pipe_train.model.export import export

    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(3)
        backbone = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255),
                                     keras.layers.Conv2D(8, 3, strides=2, activation="relu")], name="tiny")
        mixed = build_classifier("mobilenet_v3_small", backbone, 4, 0.0, batchnorm_frozen=False)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    head = mixed.get_layer("classifier")
    head.set_weights([np.random.default_rng(2).normal(0, 3, w.shape) for w in head.get_weights()])
    assert backbone_of(mixed).layers[-1].compute_dtype == "float16"
    twin = conversions.in_float32(mixed)
    assert twin is not mixed and all(layer.compute_dtype == "float32" for layer in [*twin.layers,
                                                                                  *backbone_of(twin).layers])
    for ours, theirs in zip(twin.get_weights(), mixed.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert conversions.in_float32(twin) is twin  # (float32 already: itself)
    np.testing.assert_allclose(twin(images).numpy(), mixed(images).numpy().astype(np.float32), atol=2e-2)
    # the CLI's path: model.keras written as the job writes it, loaded with its float16 layers
    export(mixed, ("a", "b", "c", "d"), 16, tmp_path / "model")
    found = export_folder(tmp_path / "model", ("tflite", "onnx"), [], tmp_path / "model" / "exports")
    assert all("dropped" not in figures for figures in found.values()), found
    for export_format in ("tflite", "onnx"):
        content = (tmp_path / "model/exports" / conversions.FILES[export_format]).read_bytes()
        np.testing.assert_allclose(conversions.runner(content, export_format)(images)["probabilities"],
                                   twin(images).numpy(), atol=1e-5)


def test_a_rerun_leaves_no_file_of_an_export_it_dropped(tmp_path):
    """A local job run again in its folder (keras-pipe local --resume) writes model/exports/ anew."""
    conversions.write(tmp_path / "exports", {"tflite": b"first", "tflite_int8": b"first", "onnx": b"first"})
    paths = conversions.write(tmp_path / "exports", {"tflite": b"second"})
    assert sorted(p.name for p in (tmp_path / "exports").iterdir()) == ["model.tflite"]
    assert paths == {"tflite": tmp_path / "exports/model.tflite"} and paths["tflite"].read_bytes() == b"second"


@pytest.mark.slow
def test_a_multi_label_model_folder_exports_unchecked_without_validation_records(tmp_path):
    """`keras-pipe export MODEL --formats tflite` with no --validation: the export is written into the
    model's own exports/, said unchecked, its exports.json the multi-label model's threshold."""
    from keras_pipe_train.after_training.folder_exports import export_folder
    from tests.serve.conftest import CLASSES, exported

    model_dir = exported(tmp_path / "model", threshold=0.5)
    found = export_folder(model_dir, ("tflite",), [], model_dir / "exports")
    assert found["tflite"]["unchecked"] == "no validation images given to compare it on (--validation)", found
    described = json.loads((model_dir / "exports" / "exports.json").read_text())
    assert described["multi_label"] is True and described["threshold"] == 0.5
    assert described["class_names"] == list(CLASSES) and (model_dir / "exports" / "model.tflite").is_file()
