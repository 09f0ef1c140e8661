"""The training container's `train` end to end, on real images (the UCI digits as JPEGs), in Pipe
mode (FIFOs fed by a writer process) and in File mode, down to serving the exported model.

Accuracy threshold: 10 balanced classes make chance 10 %, and a model that learned nothing stays
within a few points of it (a random frozen backbone stayed at 8-11 % here). Held-out accuracy of
at least 50 % on 397 images is far outside chance (binomial sd ~1.5 points) yet leaves margin
below what these short CPU runs reach (59-76 % observed).
"""

import csv
import json
import os
import platform
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_train.settings import cpu_kernels
from pipemode import tfrecord
from tests.browser import open_page, painted
from tests.conftest import FakeJob, png_bomb
from tests.job.conftest import file_channel, run_train, served_probabilities, write_hyperparameters
from tests.timeouts import wait_s

# (the first test to use pretrained_backbone pays for its training, a job of its own, in its setup:
# a job, serving and two browsers after it do not fit in pyproject.toml's 300 s on loaded cores)
pytestmark = pytest.mark.timeout(600)
TRAIN = 1400  # digits 0..1399 train, 1400.. (397 images) are held out
MIN_ACCURACY = 0.5


@pytest.fixture(scope="session")
def pretrained_backbone(tmp_path_factory, digit_records):
    """A backbone trained from scratch on digits 0-4 by the job itself (weights=none)."""
    examples, labels = digit_records
    low = [e for e, y in zip(examples, labels) if y < 5]
    fake_job = FakeJob(tmp_path_factory.mktemp("pretrain") / "opt_ml")
    file_channel(fake_job, "train", low[:750])
    file_channel(fake_job, "validation", low[750:], shards=1)
    write_hyperparameters(fake_job, num_classes=5, image_size=32, epochs=8, weights="none",
                          augment="crop", batch_size=32)
    out = run_train(fake_job)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    final = json.loads((fake_job.base / "output/data/metrics.json").read_text())["final"]
    assert final["val_accuracy"] > 0.8, final  # 5 classes: chance is 20 %
    return fake_job.base / "model" / "backbone.weights.h5"


def serve(model_dir, validation_file, tmp_path) -> float:
    """Accuracy of the exported SavedModel on the held-out JPEGs, in a process that cannot import
    this project: only TensorFlow."""
    script = r"""
import json, sys, tensorflow as tf
assert not {"keras_pipe_train", "pipemode"} & set(sys.modules)
model = tf.saved_model.load(sys.argv[1])
serve = model.signatures["serving_default"]
features = {"image/encoded": tf.io.FixedLenFeature([], tf.string), "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
right = total = 0
for batch in tf.data.TFRecordDataset(sys.argv[2]).batch(64):
    parsed = tf.io.parse_example(batch, features)
    out = serve(image_bytes=parsed["image/encoded"])
    assert out["probabilities"].shape[1] == 10 and out["classes"].dtype == tf.string
    right += int(tf.reduce_sum(tf.cast(tf.cast(out["class_ids"], tf.int64) == parsed["image/class/label"], tf.int32)))
    total += int(batch.shape[0])
refused = []
for name in sys.argv[3:]:  # files the signature must refuse, from their header, before decoding
    try:
        serve(image_bytes=tf.constant([open(name, "rb").read()]))
    except tf.errors.InvalidArgumentError as err:
        refused.append(err.message)
print(json.dumps({"accuracy": right / total, "total": total, "refused": refused}))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    (tmp_path / "bomb.png").write_bytes(png_bomb())  # 1 MB that decodes to 768 MB
    (tmp_path / "page.jpg").write_bytes(b"<!DOCTYPE html><html>Not Found</html>")
    out = subprocess.run([sys.executable, "-c", script, str(model_dir), str(validation_file),
                          str(tmp_path / "bomb.png"), str(tmp_path / "page.jpg")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=wait_s(270))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["total"] == 397
    bomb, page = result["refused"]
    assert "the image has more than max_image_pixels (100000000) pixels" in bomb, bomb[-500:]
    assert "the image is not a JPEG, PNG, GIF, BMP or WebP image" in page, page[-500:]
    return result["accuracy"]


def check_outputs(fake_job: FakeJob, out: subprocess.CompletedProcess, epochs: int) -> dict:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("metrics: ")]
    assert len(lines) == epochs and all("val_accuracy=" in line for line in lines)
    model = fake_job.base / "model"
    for name in ("1/saved_model.pb", "model.keras", "backbone.weights.h5", "classes.json"):
        assert (model / name).is_file(), name
    assert json.loads((model / "classes.json").read_text()) == [str(d) for d in range(10)]
    assert list((fake_job.base / "output/tensorboard").rglob("events.out.tfevents.*"))
    assert not (fake_job.base / "output/failure").exists()
    report = json.loads((fake_job.base / "output/data/metrics.json").read_text())
    assert [row["epoch"] for row in report["epochs"]] == list(range(1, epochs + 1))
    # the exported model evaluated once more, in detail: the same numbers as its epoch's line
    evaluation = json.loads((fake_job.base / "output/data/evaluation.json").read_text())
    assert evaluation["epoch"] == report["final"]["epoch"] and evaluation["examples"] == 397
    assert evaluation["metrics"]["val_accuracy"] == pytest.approx(report["final"]["val_accuracy"], abs=1e-9)
    matrix = evaluation["confusion_matrix"]["counts"]
    assert sum(map(sum, matrix)) == 397 and sum(matrix[i][i] for i in range(10)) / 397 == pytest.approx(
        evaluation["metrics"]["val_accuracy"])
    assert [row["class"] for row in evaluation["per_class"]] == [str(d) for d in range(10)]
    for picture in ("learning_curves.png", "confusion_matrix.png"):
        assert (fake_job.base / "output/data" / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    check_report(fake_job, evaluation)
    return report["final"]


def check_report(fake_job: FakeJob, evaluation: dict) -> None:
    """report.html's gallery: every image the model gets wrong up to 24, worst first; TensorBoard's
    pictures of the job's end."""
    page = (fake_job.base / "output/data/report.html").read_text()
    wrong = evaluation["examples"] - sum(row[i] for i, row in enumerate(evaluation["confusion_matrix"]["counts"]))
    assert f"it gets {wrong:,} of the 397 validation images wrong" in page
    # (the label check's suspects have a gallery of their own, further down the page)
    mistakes = re.search(r'<section id="mistakes">.*?</section>', page, re.S).group(0)
    # (each with its heatmaps: of the class predicted and of the label, by Grad-CAM on the backbone's 4 x 4 stage)
    assert mistakes.count('<div class="tile">') == min(wrong, 24) == mistakes.count("data:image/jpeg;base64,") // 3
    assert mistakes.count('alt="heatmap of predicted ') == mistakes.count('alt="heatmap of label ') == min(wrong, 24)
    assert re.search(r"beside each: where the model found the evidence .* by Grad-CAM on MobileNetV3Small/\w+ "
                     r"\(4 x 4\)", mistakes), mistakes[:3000]
    losses = [float(x) for x in re.findall(r"<br>loss ([0-9.]+)</div>", mistakes)]
    assert losses == sorted(losses, reverse=True) and len(losses) == min(wrong, 24)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(fake_job.base / "output/tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    assert {"evaluation/confusion_matrix", "evaluation/worst_mistakes", "val_accuracy"} <= set(
        events.Tags()["tensors"])


HYPERPARAMETERS = dict(num_classes=10, image_size=32, epochs=2, fine_tune_epochs=1, fine_tune_layers=40,
                       fine_tune_learning_rate=1e-4, batch_size=32, augment="crop", weights="pretrained")


@pytest.mark.slow
def test_pipe_mode_job_learns_and_its_export_serves_jpegs(job, digit_records, pretrained_backbone, tmp_path):
    examples, _ = digit_records
    train_file = job.write("train.tfrecord", tfrecord.encode(examples[:TRAIN]))
    val_file = job.write("validation.tfrecord", tfrecord.encode(examples[TRAIN:]))
    job.add_channel("train")
    job.add_channel("validation")
    job.feed("train", [train_file])
    job.feed("validation", [val_file])
    job.add_channel("pretrained", mode="File")
    (job.data_dir / "pretrained").mkdir()
    shutil.copy(pretrained_backbone, job.data_dir / "pretrained")
    write_hyperparameters(job, **HYPERPARAMETERS)

    # (a shell's TF_ENABLE_ONEDNN_OPTS=1 changes nothing: the job chooses its CPU kernels, settings/cpu_kernels.py)
    out = run_train(job, TF_ENABLE_ONEDNN_OPTS="1")
    final = check_outputs(job, out, epochs=3)
    assert final["val_accuracy"] >= MIN_ACCURACY, final
    if platform.machine() in cpu_kernels.MACHINES:
        assert ("CPU kernels: oneDNN off for mobilenet_v3_small at 32 px, whose tiny tensors train faster without it "
                "(TF_ENABLE_ONEDNN_OPTS=0: docs/speed.md); TF_ENABLE_ONEDNN_OPTS=1 from the environment overridden"
                ) in out.stdout, out.stdout[:3000]
    served = serve(job.base / "model" / "1", val_file, tmp_path)
    # serving decodes and resizes exactly as validation did: the same accuracy
    assert abs(served - final["val_accuracy"]) <= 0.01, (served, final)
    assert "reading channel 'train' pass 2" in out.stdout  # one FIFO per epoch
    # the report as a person's browser shows it: nothing asked of the network, no console message,
    # and the gallery's pictures painted
    page = job.base / "output/data/report.html"
    opened = open_page(page, tmp_path / "browser")
    assert opened.console == [] and opened.requests == [], (opened.console, opened.requests)
    pictures, area = painted(page, tmp_path / "browser")
    assert pictures >= 1 and area >= pictures * 40 * 40, (pictures, area)
    randomised_heatmaps_differ(job.base / "model" / "model.keras", examples[TRAIN:TRAIN + 48])


def randomised_heatmaps_differ(model_file, records: list[bytes]) -> None:
    """Adebayo et al.'s sanity check on the demo's kind of model (MobileNetV3-Small, 32 px digits): the
    heatmaps of the trained model and of one whose head and last block (its top 10 layers with
    weights) are re-initialised rank the pixels differently (Spearman's rank correlation < 0.5 on
    average; docs/speed.md has the figure)."""
    import keras

    from tests.job.model.test_explain import sanity

    model = keras.saving.load_model(model_file, compile=False)
    images = np.stack([tf.io.decode_jpeg(tf.train.Example.FromString(record).features.feature["image/encoded"]
                                         .bytes_list.value[0], channels=3).numpy() for record in records])
    images = images.astype(np.float32)
    predicted = np.argmax(model.predict(images, verbose=0), axis=1)
    figures = sanity(model, images, predicted, 10)
    print(f"sanity check over {len(images)} images, Spearman's rank correlation of the trained model's heatmaps with "
          f"the randomised one's: {figures['randomised']:.3f}, with its own under N(0, 3) noise: "
          f"{figures['noise']:.3f}; not constant: {figures['alive']:.0%}")
    assert figures["randomised"] < 0.5 and figures["noise"] > 0.5 and figures["alive"] >= 0.9, figures


def flipped_labels(records: list[bytes], labels: list[int], rate: float, seed: int,
                   source=None) -> tuple[list[bytes], np.ndarray]:
    """The records with `rate` of their labels moved to another digit at random; which were. With
    `source`, each record says where its image came from: source(its index)."""
    from keras_pipe_train.sources.example import encode_example

    rng = np.random.default_rng(seed)
    flips = rng.random(len(records)) < rate
    changed = []
    for index, (record, label, flip) in enumerate(zip(records, labels, flips)):
        if flip or source:
            image = tf.train.Example.FromString(record).features.feature["image/encoded"].bytes_list.value[0]
            given = int((label + rng.integers(1, 10)) % 10) if flip else int(label)
            record = encode_example(image, given, source=source(index) if source else None)
        changed.append(record)
    return changed, flips


def source_of(index: int) -> str:
    """A training image's S3 URI, as `keras-pipe prepare` records it, in a key nobody sanitised."""
    return f"s3://photos-bucket/digits/scan ünï #{index:04d} (copy).jpg"


def fingerprint(record: bytes) -> str:
    image = tf.train.Example.FromString(record).features.feature["image/encoded"].bytes_list.value[0]
    return bytes(tf.fingerprint(tf.constant([image])).numpy()[0]).hex()


@pytest.mark.slow
def test_an_overconfident_job_is_calibrated_and_finds_the_labels_planted_wrong(job, digit_records, pretrained_backbone,
                                                                              tmp_path):
    """Fine-tuned long on few digits, 10 % of them labelled wrong on purpose, the model is
    overconfident on held-out ones. calibration=true fits its temperature on them: the
    cross-fitted ECE, NLL and Brier score fall, the accuracy stays, the SavedModel serves
    softmax(logits / T). label_error_folds=5 lists the planted flips among its suspects, in
    label_errors.csv, in a Ground Truth manifest of their S3 sources, and on the report page,
    which a browser shows."""
    examples, labels = digit_records
    train, flips = flipped_labels(examples[:400], labels[:400], 0.1, seed=2, source=source_of)
    file_channel(job, "train", train, shards=2)
    file_channel(job, "validation", examples[TRAIN:], shards=1)
    write_hyperparameters(job, **{**HYPERPARAMETERS, "weights": str(pretrained_backbone), "epochs": 1,
                                  "fine_tune_epochs": 10, "fine_tune_learning_rate": 1e-3, "augment": "none",
                                  "dropout": 0, "calibration": "true", "label_error_folds": 5,
                                  "export_formats": "tflite,tflite_float16,tflite_int8,tflite_full_int8,onnx"})
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    check_calibration(job, out)
    check_exports(job, out, examples[TRAIN:TRAIN + 64])
    rows = list(csv.DictReader(open(job.base / "output/data/label_errors.csv")))
    planted = {fingerprint(r) for r, flip in zip(train, flips) if flip}
    suspected = {row["fingerprint"] for row in rows if row["set"] == "train"}
    found = len(planted & suspected)
    print(f"label check: {len(suspected)} suspects, {found} of {len(planted)} planted flips")
    assert found / len(planted) >= 0.5 and found / len(suspected) >= 0.3, (found, len(planted), len(suspected))
    assert [int(row["rank"]) for row in rows if row["set"] == "train"] == list(range(1, len(suspected) + 1))
    check_suspects_manifest(job, rows, train)
    page = (job.base / "output/data/report.html").read_text()
    assert f"Train images: {len(suspected):,} of 400" in page and "Labels to check first" in page
    shown = min(24, len(suspected)) + min(24, sum(row["set"] == "validation" for row in rows))
    assert page.count('alt="image labelled') == shown
    # each shown with the heatmaps of its likely class and of its label, from the 32-pixel pictures kept
    labels = re.search(r'<section id="labels">.*?</section>', page, re.S).group(0)
    assert labels.count('alt="heatmap of likely ') == labels.count('alt="heatmap of label ') == shown
    assert labels.count("beside each: where the model found the evidence for the likely class, and for the label "
                        "(red most, blue none), by Grad-CAM on MobileNetV3Small/") == 2, labels[:3000]
    opened = open_page(job.base / "output/data/report.html", tmp_path / "browser")
    assert opened.console == [] and opened.requests == [], (opened.console, opened.requests)


@pytest.mark.slow
def test_a_jobs_own_defaults_name_the_validation_images_filed_under_the_wrong_class(job, digit_records,
                                                                                   pretrained_backbone):
    """A File-mode job, no label check asked for (label_check's default): 12 of 200 validation
    images filed under another digit are named in label_errors.csv and on the page, from the
    exported model's probabilities (they are out of sample), with recall 0.8 and precision 0.7 at
    least (issue 70's goal); the training images are not checked (label_error_folds=0), and said so."""
    examples, labels = digit_records
    low = [(e, y) for e, y in zip(examples, labels) if y < 5]
    validation = [e for e, _ in low[700:900]]
    rng = np.random.default_rng(4)
    misfiled = set(rng.choice(len(validation), 12, replace=False).tolist())
    from keras_pipe_train.sources.example import encode_example

    filed = [encode_example(tf.train.Example.FromString(record).features.feature["image/encoded"].bytes_list.value[0],
                            int((y + rng.integers(1, 5)) % 5)) if i in misfiled else record
             for i, (record, (_, y)) in enumerate(zip(validation, low[700:900]))]
    file_channel(job, "train", [e for e, _ in low[:700]], shards=2)
    file_channel(job, "validation", filed, shards=1)
    write_hyperparameters(job, num_classes=5, image_size=32, epochs=3, fine_tune_epochs=5, fine_tune_layers=1000,
                          fine_tune_learning_rate=5e-4, batch_size=32, weights=str(pretrained_backbone))
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # (a File-mode job that learns: 12 of the 200 labels are wrong, so 94 % is all it can score)
    assert json.loads((job.base / "output/data/metrics.json").read_text())["final"]["val_accuracy"] >= 0.85
    rows = list(csv.DictReader(open(job.base / "output/data/label_errors.csv")))
    suspected = {row["fingerprint"] for row in rows if row["set"] == "validation"}
    planted = {fingerprint(filed[i]) for i in misfiled}
    found = len(planted & suspected)
    print(f"validation check: {len(suspected)} suspects, {found} of {len(planted)} misfiled")
    assert found / len(planted) >= 0.8 and found / len(suspected) >= 0.7, (found, len(planted), len(suspected))
    assert {row["set"] for row in rows} == {"validation"}
    check = json.loads((job.base / "output/data/label_errors.json").read_text())
    assert check["folds"] == 0 and check["train_unchecked"].startswith("label_error_folds=0")
    assert check["validation_model_accuracy"] >= 0.85  # (beside the suspects: how far to trust them)
    page = (job.base / "output/data/report.html").read_text()
    assert f"Validation images: {len(suspected):,} of 200" in page and "Training images not checked" in page
    # calibration=auto (the default) does not soften a model whose errors are its labels': the
    # temperature that pays for the 12 would lower every right answer's probability
    calibration = json.loads((job.base / "output/data/evaluation.json").read_text())["calibration"]
    print("calibration:", calibration["reason"])
    assert not calibration["applied"] and calibration["setting"] == "auto", calibration["reason"]


def check_suspects_manifest(job: FakeJob, rows: list[dict], train: list[bytes]) -> None:
    """The training suspects (whose Examples name their S3 source) are in label_errors.manifest,
    as Ground Truth's image classification output lines, which prepare reads as a manifest; the
    validation ones (no source) only in the CSV, and counted so."""
    from keras_pipe_launch.prepare.sources import Reader, list_manifest

    source_by_print = {fingerprint(record): source_of(index) for index, record in enumerate(train)}
    suspects = [row for row in rows if row["set"] == "train"]
    assert all(row["source"] == source_by_print[row["fingerprint"]] for row in suspects)
    assert all(row["source"] == "" for row in rows if row["set"] == "validation")
    path = job.base / "output/data/label_errors.manifest"
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [line["source-ref"] for line in lines] == [row["source"] for row in suspects]
    for line, row in zip(lines, suspects):
        metadata = line["label-metadata"]
        assert str(line["label"]) == row["given_label"] == metadata["class-name"]  # (no class_names: the ids)
        assert metadata["type"] == "groundtruth/image-classification" and metadata["human-annotated"] == "no"
        assert metadata["confidence"] == float(row["given_probability"])
        assert line["label-check"]["likely-class-name"] == row["likely_label"] and line["label-check"]["rank"] == int(
            row["rank"])
    listing = list_manifest(str(path), Reader(), label_attribute="label")
    assert [(str(where), label) for where, label in listing.items] == [(line["source-ref"], line["label"])
                                                                       for line in lines]
    counts = json.loads((job.base / "output/data/label_errors.json").read_text())["manifest"]
    assert counts == {"suspects": len(suspects), "without_s3_source": len(rows) - len(suspects)}


def check_exports(job, out, examples: list[bytes]) -> None:
    """The four TFLite exports and the ONNX one of a calibrated job: exports.json and
    evaluation.json say how each compared with the SavedModel on the validation images; each is
    kept exactly when it meets its bar, and said either way; the float ones answer the JPEGs'
    images, decoded as exports.json says, as the SavedModel answers their bytes."""
    from keras_pipe_train.model import conversions
    from keras_pipe_train.sources import preprocess

    described = json.loads((job.base / "model/exports/exports.json").read_text())
    evaluation = json.loads((job.base / "output/data/evaluation.json").read_text())
    assert described["exports"] == {name: {**({} if "dropped" in figures else {"file": conversions.FILES[name]}),
                                           **figures}
                                    for name, figures in evaluation["exports"].items()}
    assert described["input"]["prepare"] == "the whole image resized to 32x32 (bilinear), its aspect ratio not kept"
    assert described["outputs"]["probabilities"].endswith("(calibrated)")
    for name, figures in evaluation["exports"].items():
        assert figures["images"] == 397 and figures["savedmodel_accuracy"] == pytest.approx(
            evaluation["metrics"]["val_accuracy"], abs=1e-6), (name, figures)
        kept = (job.base / "model/exports" / conversions.FILES[name]).is_file()
        assert kept == ("dropped" not in figures) == (conversions.verdict(figures, conversions.BARS[name]) is None), \
            figures
        assert (f"export {name}: " if kept else f"export {name} dropped: ") in out.stdout
    print("Exports:", evaluation["exports"])
    serve = tf.saved_model.load(str(job.base / "model/1")).signatures["serving_default"]
    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
    encoded = tf.io.parse_example(tf.constant(examples), features)["image/encoded"]
    images = preprocess.batch_of(lambda x: preprocess.for_eval(x, 32, None, "bilinear"), encoded, 32).numpy()
    served = serve(image_bytes=encoded)
    for name in ("tflite", "onnx"):
        assert "dropped" not in evaluation["exports"][name]
        assert evaluation["exports"][name]["max_probability_difference"] < 1e-4
        runner = conversions.runner((job.base / "model/exports" / conversions.FILES[name]).read_bytes(), name)
        answered = runner(images)
        np.testing.assert_allclose(answered["probabilities"], served["probabilities"].numpy(), atol=1e-5)
        assert (answered["predictions"] == served["class_ids"].numpy().reshape(-1)).all()


def check_calibration(job: FakeJob, out: subprocess.CompletedProcess) -> None:
    evaluation = json.loads((job.base / "output/data/evaluation.json").read_text())
    found = evaluation["calibration"]
    assert found["applied"] and found["reason"] == "calibration=true" and found["examples"] == 397
    # (on 2 x 198 examples and 15 bins the cross-fitted ECE is noisy: 0.099 -> 0.080 when written;
    # bench/label_errors.py measures the gain on more)
    assert found["before"]["ece"] > 0.02 and found["after"]["ece"] < found["before"]["ece"], found
    assert found["after"]["nll"] < found["before"]["nll"] and found["after"]["brier"] < found["before"]["brier"]
    # the NLL before is the job's own val_loss of the model exported, from the same logits
    assert found["before"]["nll"] == pytest.approx(evaluation["metrics"]["val_loss"], rel=1e-4)
    assert found["temperature"] > 1  # (overconfident: it softens)
    serving = json.loads((job.base / "model/serving.json").read_text())["calibration"]
    assert serving["temperature"] == found["temperature"]
    served, own = served_probabilities(job.base / "model", job.data_dir / "validation" / "part-00000.tfrecord")
    expected = np.exp(np.log(np.maximum(own, 1e-30)) / found["temperature"])
    expected /= expected.sum(axis=1, keepdims=True)
    assert np.abs(served - expected).max() < 1e-3
    assert (served.argmax(axis=1) == own.argmax(axis=1)).all()
    assert f"temperature {found['temperature']:.4g} applied (calibration=true)" in out.stdout
    text = (job.base / "output/data/report.html").read_text()
    assert "How far to trust its probabilities" in text and f"{found['before']['ece']:.4f}" in text
    assert (job.base / "output/data/reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
