"""Multi-label: records holding any number of classes, a sigmoid per class, binary cross-entropy
(weighted with use_weighted_loss), and precision, recall, F1 and AUC on known labels."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.sources import example
from keras_pipe_train.sources.datasets import parser
from keras_pipe_train.training.distribute import Cluster
from keras_pipe_train.training.loop import Trainer
from keras_pipe_train.training.recipe import Loss
from keras_pipe_train.training.tasks import auc
from tests.conftest import image_bytes
from tests.timeouts import wait_s


def config(**values) -> JobConfig:
    return JobConfig.from_hyperparameters({"num_classes": 3, "multi_label": "true", **values})


def passthrough(classes=3) -> keras.Model:
    """A model whose outputs are its inputs (until it trains): the probabilities are the test's."""
    return keras.Sequential([keras.Input((classes,)), keras.layers.Dense(classes, kernel_initializer="identity")])


def trainer_for(model, loss: Loss, learning_rate=0.1) -> Trainer:
    trainer = Trainer(model, Cluster(tf.distribute.get_strategy(), 1, 0, True), mixed_precision=False, loss=loss,
                      make_optimizer=keras.optimizers.SGD)
    trainer.start_phase(learning_rate)
    return trainer


def batches(inputs, labels, size=2) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((np.asarray(inputs, np.float32), np.asarray(labels, np.float32))).batch(size)


# probabilities of 3 classes for 4 images, and their labels
PROBABILITIES = [[0.9, 0.2, 0.6], [0.1, 0.8, 0.4], [0.7, 0.6, 0.3], [0.2, 0.1, 0.05]]
LABELS = [[1, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 1]]


def test_metrics_on_known_labels():
    """At threshold 0.5: predicted {0,2} {1} {0,1} {} against {0,2} {1} {0} {2}."""
    scores, examples = trainer_for(passthrough(), Loss(multi_label=True)).evaluate(batches(PROBABILITIES, LABELS))
    assert examples == 4
    # per class: tp, fp, fn = class 0: 2, 0, 0; class 1: 1, 1, 0; class 2: 1, 0, 1
    expected = {
        # each class's share of images right, averaged (MXNet's multi-label accuracy): 4/4, 3/4, 3/4
        "val_accuracy": (1 + 3 / 4 + 3 / 4) / 3,
        "val_exact_match": 2 / 4,  # images with every class right: the first two
        "val_precision_micro": 4 / 5, "val_recall_micro": 4 / 5, "val_f1_micro": 8 / 10,
        "val_precision_macro": (1 + 1 / 2 + 1) / 3, "val_recall_macro": (1 + 1 + 1 / 2) / 3,
        "val_f1_macro": (1 + 2 / 3 + 2 / 3) / 3,
    }
    for name, value in expected.items():
        assert scores[name] == pytest.approx(value), name
    p, y = np.array(PROBABILITIES).ravel(), np.array(LABELS).ravel()
    bce = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    assert scores["val_loss"] == pytest.approx(bce.reshape(4, 3).mean(axis=1).mean(), rel=1e-5)
    # AUC: the share of (positive, negative) pairs ranked right, ties counting half
    positives, negatives = p[y == 1], p[y == 0]
    pairs = [(a > b) + 0.5 * (a == b) for a in positives for b in negatives]
    assert scores["val_auc"] == pytest.approx(np.mean(pairs), abs=1e-9)


def test_the_threshold_decides_what_counts_as_predicted():
    scores, _ = trainer_for(passthrough(), Loss(multi_label=True, threshold=0.35)).evaluate(
        batches(PROBABILITIES, LABELS))
    # now predicted {0,2} {1,2} {0,1} {}: class 2 gains a false positive
    assert scores["val_precision_micro"] == pytest.approx(4 / 6)
    assert scores["val_exact_match"] == pytest.approx(1 / 4)
    assert scores["val_accuracy"] == pytest.approx((1 + 3 / 4 + 2 / 4) / 3)


def test_auc_of_histograms():
    bins = np.zeros(200)
    assert auc(np.eye(200)[199], np.eye(200)[0]) == 1.0  # every positive above every negative
    assert auc(np.eye(200)[0], np.eye(200)[199]) == 0.0
    assert auc(np.eye(200)[100], np.eye(200)[100]) == 0.5  # all tied
    assert np.isnan(auc(bins, np.eye(200)[3]))  # no positive: no AUC


def test_the_weighted_loss_weighs_each_class_positives_by_its_negatives_over_positives():
    """use_weighted_loss: class 0 is positive in 3 of 4 images, class 1 in 1, class 2 in 2: their
    positive examples weigh 1/3, 3 and 1 (counted before the step's loss)."""
    labels = np.array([[1, 0, 1], [1, 1, 0], [1, 0, 1], [0, 0, 0]], np.float32)
    probabilities = np.array(PROBABILITIES, np.float32)
    trainer = trainer_for(passthrough(), Loss(multi_label=True, weighted=True), learning_rate=1e-12)
    results, _, _ = trainer.train_epoch(batches(probabilities, labels, size=4), 0, 0, 4)
    weights = np.array([1 / 3, 3.0, 1.0])
    positive, negative = -labels * np.log(probabilities), -(1 - labels) * np.log(1 - probabilities)
    expected = (positive * weights + negative).mean(axis=1).mean()
    assert results["train_loss"] == pytest.approx(expected, rel=1e-5)
    assert trainer.task.state.seen.numpy().tolist() == [3, 1, 2, 4]
    # validation's loss stays the plain one
    plain = (positive + negative).mean(axis=1).mean()
    assert trainer.evaluate(batches(probabilities, labels))[0]["val_loss"] == pytest.approx(plain, rel=1e-5)


def test_the_label_counts_survive_a_checkpoint(tmp_path):
    labels = np.array([[1, 0, 1], [1, 1, 0]], np.float32)
    trainer = trainer_for(passthrough(), Loss(multi_label=True, weighted=True), learning_rate=1e-12)
    trainer.train_epoch(batches(PROBABILITIES[:2], labels), 0, 0, 2)
    tf.train.Checkpoint(task=trainer.task.state).write(str(tmp_path / "state"))
    resumed = trainer_for(passthrough(), Loss(multi_label=True, weighted=True))
    tf.train.Checkpoint(task=resumed.task.state).read(str(tmp_path / "state")).assert_consumed()
    assert resumed.task.state.seen.numpy().tolist() == [2, 1, 1, 2]


def test_a_sigmoid_head_learns_two_labels_at_once():
    """Inputs that say which of 3 classes are present; after training, each image's classes and
    only they are predicted."""
    rng = np.random.default_rng(0)
    labels = (rng.random((64, 3)) < 0.5).astype(np.float32)
    inputs = labels * 2 - 1 + rng.normal(0, 0.1, (64, 3)).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, activation="sigmoid")])
    trainer = trainer_for(model, Loss(multi_label=True), learning_rate=1.0)
    for epoch in range(20):
        trainer.train_epoch(batches(inputs, labels, 16), epoch, 0, 16)
    scores, _ = trainer.evaluate(batches(inputs, labels, 16))
    assert scores["val_accuracy"] == 1.0 and scores["val_f1_macro"] == 1.0 and scores["val_auc"] == 1.0


# --- records --------------------------------------------------------------------------------------

def multi_label_record(labels, *, floats=False, image=None) -> bytes:
    """`floats`: a float list; None: `labels` are bytes, in a bytes list; else an int64 list."""
    feature = (tf.train.Feature(bytes_list=tf.train.BytesList(value=[labels])) if floats is None
               else tf.train.Feature(float_list=tf.train.FloatList(value=labels)) if floats
               else tf.train.Feature(int64_list=tf.train.Int64List(value=labels)))
    return tf.train.Example(features=tf.train.Features(feature={
        example.IMAGE_FEATURE: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image or image_bytes("JPEG", 8, 8)])),
        example.LABEL_FEATURE: feature})).SerializeToString()


@pytest.mark.parametrize("label_format, labels, floats, problem", [
    ("index", [0, 2], False, None),
    ("index", [], False, None),  # an image of none of the classes
    ("index", [3], False, "label 3 (image/class/label) is out of range: the job trains labels 0 to 2"),
    ("index", [1, 1], False, "lists a class id twice"),
    ("index", [1.0, 0.0, 1.0], True, "holds 3 float values, not class ids: for one value per class, set hyperparameter label_format=multi_hot"),
    ("index", b"cat", None, "holds bytes, not class ids (an int64 list)"),
    ("multi_hot", [1.0, 0.0, 1.0], True, None),
    ("multi_hot", [1.0, 0.0], True, "must hold 3 float values, one per class (label_format=multi_hot); it holds 2 float values"),
    ("multi_hot", [1, 0, 1], False, "it holds 3 int64 values: for class ids, set label_format=index"),
    ("multi_hot", [1.0, 2.0, 0.0], True, "holds a value outside [0, 1] (2.0)"),
    ("multi_hot", [1.0, float("nan"), 0.0], True, "holds a value outside [0, 1] (nan)"),
])
def test_each_record_is_checked_for_its_labels(label_format, labels, floats, problem):
    check = example.record_check(example.IMAGE_FEATURE, example.LABEL_FEATURE, 3, 10**6, multi_label=True,
                                 label_format=label_format)
    said = check(multi_label_record(labels, floats=floats))
    if problem is None:
        assert said is None
    else:
        assert said is not None and problem in said, said


def test_class_ids_and_multi_hot_rows_parse_to_the_same_labels():
    rows = {"index": [multi_label_record([0, 2]), multi_label_record([]), multi_label_record([1])],
            "multi_hot": [multi_label_record(v, floats=True) for v in ([1.0, 0, 1], [0.0, 0, 0], [0.0, 1, 0])]}
    for label_format, records in rows.items():
        _, labels = parser(config(label_format=label_format))(tf.constant(records))
        np.testing.assert_array_equal(labels.numpy(), [[1, 0, 1], [0, 0, 0], [0, 1, 0]])
        assert labels.dtype == tf.float32


@pytest.mark.parametrize("values, message", [
    ({"top_k": 2}, "top_k is for single-label jobs"),
    ({"multi_label": "false", "use_weighted_loss": "true"}, "use_weighted_loss weighs a multi_label job's classes"),
    ({"multi_label": "false", "label_format": "multi_hot"}, "label_format=multi_hot is for multi_label=true"),
    ({"multi_label": "false", "early_stopping_metric": "val_f1_macro"},
     "early_stopping_metric=val_f1_macro: the job reports it only with multi_label=true"),
    ({"early_stopping_metric": "val_top_k_accuracy"}, "reports it only with top_k set"),
    ({"multi_label_threshold": "0"}, "multi_label_threshold must be > 0"),
])
def test_settings_that_do_not_go_together_are_refused(values, message):
    with pytest.raises(UserError, match=message):
        config(**values)


def test_mxnets_forms_are_read():
    chosen = JobConfig.from_hyperparameters({"num_classes": "3", "multi_label": "1", "use_weighted_loss": "1"})
    assert chosen.multi_label and chosen.use_weighted_loss


# --- the job ---------------------------------------------------------------------------------------

SERVE = r"""
import json, sys, numpy as np, tensorflow as tf
assert not {"keras_pipe_train", "pipemode"} & set(sys.modules)
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
features = {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
answers = {}
for batch in tf.data.TFRecordDataset(sys.argv[2]).batch(16):
    out = serve(image_bytes=tf.io.parse_example(batch, features)["image/encoded"])
    for name, value in out.items():
        answers.setdefault(name, []).extend(value.numpy().tolist() if value.dtype != tf.string else
                                            [[c.decode() for c in row] for row in value.numpy()])
print(json.dumps(answers))
"""


def served_answers(job, records: list[bytes], tmp_path) -> dict:
    """The job's exported SavedModel's answers for `records`' images, in a process that cannot
    import this project (SERVE)."""
    import json
    import os
    import subprocess
    import sys

    from pipemode import tfrecord

    validation = job.write("served.tfrecord", tfrecord.encode(records))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    served = subprocess.run([sys.executable, "-c", SERVE, str(job.base / "model" / "1"), str(validation)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=wait_s(270))
    assert served.returncode == 0, served.stderr[-3000:]
    return json.loads(served.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_multi_label_job_in_pipe_mode_reports_its_metrics_and_exports_a_model_that_names_the_classes(
        job, tmp_path):
    """It learns the pairs (tests/held_out.py's recipe): its reported counts, F1 and AUC are the
    ones its exported model earns against the pairs' own digits, computed here, and beyond what a
    model that learned nothing can reach."""
    import json

    from keras_pipe_launch.sample_data import digit_pairs, load_digits, pair_examples
    from tests.held_out import LEARNS
    from tests.job.conftest import file_channel, run_train, write_hyperparameters

    images, labels = load_digits()
    pairs, classes = digit_pairs(images, labels, 664)
    records = pair_examples(pairs, classes)
    job.stream("train", records[:600])
    file_channel(job, "validation", records[600:], shards=1)
    names = [f"digit{d}" for d in range(10)]
    write_hyperparameters(job, class_names=names, multi_label=True, multi_label_threshold=0.3, **LEARNS,
                          early_stopping=True, early_stopping_metric="val_f1_micro")
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("metrics: ")]
    assert len(lines) >= 2
    for name in ("train_loss", "train_f1_micro", "train_auc", "val_accuracy", "val_precision_macro",
                 "val_recall_micro", "val_f1_macro", "val_auc"):
        assert f" {name}=" in lines[0], lines[0]
    final = json.loads((job.base / "output/data/metrics.json").read_text())["final"]
    evaluation = json.loads((job.base / "output/data/evaluation.json").read_text())
    assert evaluation["multi_label"] and evaluation["threshold"] == 0.3 and evaluation["examples"] == 64
    assert evaluation["metrics"]["val_f1_micro"] == pytest.approx(final["val_f1_micro"], abs=1e-9)
    assert evaluation["metrics"]["val_auc"] == pytest.approx(final["val_auc"], abs=1e-9)
    counts = evaluation["per_class_counts"]
    assert all(tp + fp + fn + tn == 64 for tp, fp, fn, tn in zip(
        counts["true_positives"], counts["false_positives"], counts["false_negatives"], counts["true_negatives"]))
    assert sum(row["support"] for row in evaluation["per_class"]) == 128  # two digits an image
    assert (job.base / "output/data/per_class.png").is_file() and (job.base / "output/data/learning_curves.png").is_file()

    # the exported model's answers for the validation images, scored here against the pairs' own
    # digits: the counts, F1 and AUC the job reported are the ones its model earns
    answer = served_answers(job, records[600:], tmp_path)
    probabilities = np.array(answer["probabilities"])
    assert probabilities.shape == (64, 10) and set(answer) == {"probabilities", "predicted", "classes"}
    np.testing.assert_array_equal(answer["predicted"], (probabilities >= 0.3).astype(int))
    for row, picked in zip(answer["classes"], answer["predicted"]):
        assert row == [name if on else "" for name, on in zip(names, picked)]
    truth = np.zeros((64, 10), bool)
    for row, pair in zip(truth, classes[600:]):
        row[list(pair)] = True
    predicted = probabilities >= 0.3
    tp, fp, fn = (predicted & truth).sum(0), (predicted & ~truth).sum(0), (~predicted & truth).sum(0)
    assert (counts["true_positives"], counts["false_positives"], counts["false_negatives"]) == (
        tp.tolist(), fp.tolist(), fn.tolist()), (tp, fp, fn, counts)
    f1 = 2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum())
    # AUC as the job counts it: the share of (positive, negative) pairs ranked right, probabilities
    # in 200 bins, pairs in one bin counting half (a probability served a rounding away from the
    # job's, across a bin's edge, moves it by its pairs with the next bin's values: well under 0.002)
    bins = np.minimum((probabilities * 200).astype(int), 199)
    positives, negatives = bins[truth], bins[~truth]
    auc = ((positives[:, None] > negatives) + 0.5 * (positives[:, None] == negatives)).mean()
    print(f"served: f1_micro={f1:.4f} auc={auc:.4f}; job: {evaluation['metrics']}")
    assert evaluation["metrics"]["val_f1_micro"] == pytest.approx(f1, abs=1e-6)
    assert evaluation["metrics"]["val_auc"] == pytest.approx(auc, abs=0.002)
    # Two digits of ten in each picture: answers that ignore the picture (constant, or random at any
    # rate) are right 1 time in 5 when they name a class, so their F1 is at most 1/3, their AUC 0.5.
    # This model: F1 0.63-0.74, AUC 0.89-0.92 over 4 seeds.
    assert f1 >= 0.5 and auc >= 0.75, (f1, auc)


@pytest.mark.slow
def test_a_calibrated_multi_label_job_serves_calibrated_probabilities_and_the_same_predictions(job, tmp_path):
    """calibration=true on a multi-label job: a temperature per class (the classes with fewer than
    10 positives among the 64 validation images keep their own probabilities); the served probabilities
    are calibrated, and the served predictions are still the threshold's on the model's own
    probabilities: the counts the job reported at 0.3 are the served predictions' counts, and each
    class is predicted from its calibrated threshold in serving.json."""
    import json

    from keras_pipe_launch.sample_data import digit_pairs, load_digits, pair_examples
    from tests.held_out import LEARNS
    from tests.job.conftest import file_channel, run_train, write_hyperparameters

    images, labels = load_digits()
    pairs, classes = digit_pairs(images, labels, 664)
    records = pair_examples(pairs, classes)
    file_channel(job, "train", records[:600])
    file_channel(job, "validation", records[600:], shards=1)
    write_hyperparameters(job, num_classes=10, multi_label=True, multi_label_threshold=0.3, **LEARNS,
                          calibration="true", export_formats="tflite,onnx")
    out = run_train(job)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    evaluation = json.loads((job.base / "output/data/evaluation.json").read_text())
    found = evaluation["calibration"]
    assert found["applied"] and len(found["temperature"]) == 10 and len(found["per_class_ece"]["after"]) == 10
    truth = np.zeros((64, 10), bool)
    for row, pair in zip(truth, classes[600:]):
        row[list(pair)] = True
    rare = truth.sum(0) < 10
    assert rare.any() and (~rare).any()  # (both kinds of class: the test means something)
    assert (np.array(found["temperature"])[rare] == 1.0).all()
    serving = json.loads((job.base / "model/serving.json").read_text())["calibration"]
    edges = np.array(serving["calibrated_thresholds"])
    temperatures = np.array(serving["temperature"])
    assert edges == pytest.approx(1 / (1 + np.exp(-np.log(0.3 / 0.7) / temperatures)))

    answer = served_answers(job, records[600:], tmp_path)
    probabilities, predicted = np.array(answer["probabilities"]), np.array(answer["predicted"], bool)
    # each class predicted from its calibrated threshold (float32 against float64 at the edge itself)
    close = np.isclose(probabilities, edges, atol=1e-6)
    assert ((probabilities >= edges) == predicted)[~close].all()
    counts = evaluation["per_class_counts"]
    tp, fp, fn = (predicted & truth).sum(0), (predicted & ~truth).sum(0), (~predicted & truth).sum(0)
    assert (counts["true_positives"], counts["false_positives"], counts["false_negatives"]) == (
        tp.tolist(), fp.tolist(), fn.tolist())
    check_float_exports(job, evaluation, records[600:], probabilities, predicted)


def check_float_exports(job, evaluation: dict, records: list[bytes], probabilities, predicted) -> None:
    """The float exports of a multi-label job (export_formats=tflite,onnx) decide every class of
    every validation image as the SavedModel does, and answer the served probabilities and
    predictions (calibrated probabilities; the model's own at the threshold) from the images
    prepared as exports.json says."""
    import json

    import tensorflow as tf

    from keras_pipe_train.model import conversions
    from keras_pipe_train.sources import preprocess

    exports = evaluation["exports"]
    print("Multi-label exports:", exports)
    described = json.loads((job.base / "model/exports/exports.json").read_text())
    size = described["input"]["shape"][1]
    assert described["multi_label"] and described["threshold"] == 0.3
    encoded = tf.io.parse_example(tf.constant(records), {"image/encoded": tf.io.FixedLenFeature([], tf.string)})
    images = preprocess.batch_of(lambda x: preprocess.for_eval(x, size, described["input"]["resize"], "bilinear"),
                                 encoded["image/encoded"], size).numpy()
    for name in ("tflite", "onnx"):
        figures = exports[name]
        assert "dropped" not in figures and figures["images"] == len(records), (name, figures)
        assert figures["agreement"] == 1 and figures["max_probability_difference"] < 1e-4, (name, figures)
        answered = conversions.runner((job.base / "model/exports" / conversions.FILES[name]).read_bytes(), name)(images)
        np.testing.assert_allclose(answered["probabilities"], probabilities, atol=1e-5)
        assert (answered["predictions"].astype(bool) == predicted).all(), name


COUNTED_ON_REPLICAS = """
import json, sys
import numpy as np, tensorflow as tf
replicas = int(sys.argv[1])
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from keras_pipe_train.training.distribute import Cluster
from keras_pipe_train.training.loop import Trainer
from keras_pipe_train.training.recipe import Loss
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if replicas > 1 else tf.distribute.get_strategy()
rng = np.random.default_rng(0)
inputs = rng.random((13, 3)).astype(np.float32)  # (13: the last batch is split unevenly, one replica short)
found = {}
for name, loss, labels in (
        ("multi", Loss(multi_label=True, weighted=True), (rng.random((13, 3)) < 0.4).astype(np.float32)),
        ("single", Loss(class_weights="balanced", top_k=2), (np.arange(13) % 3).astype(np.int64))):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(3, activation="sigmoid" if name == "multi" else "softmax")])
    trainer = Trainer(model, Cluster(strategy, 1, 0, True), False, loss=loss, make_optimizer=keras.optimizers.SGD)
    trainer.start_phase(0.5)
    data = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(4)
    results, _, _ = trainer.train_epoch(strategy.experimental_distribute_dataset(data), 0, 0, 4)
    scores, examples, counts, detail = trainer.evaluate_in_detail(strategy.experimental_distribute_dataset(data))
    found[name] = {"train": results, "val": scores, "examples": examples, "counts": counts.tolist(),
                   "detail": detail.tolist(), "seen": trainer.task.state.seen.numpy().tolist(),
                   "weights": [w.tolist() for w in model.get_weights()]}
print("FOUND", json.dumps(found))
"""


@pytest.mark.slow
def test_counts_weights_and_metrics_are_the_same_on_one_and_on_two_replicas():
    """The sums (metrics, label counts, the confusion matrix) are all-reduced: two replicas, one
    short of examples at the pass's end, count as one does, and train the same weights."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    found = {}
    for replicas in (1, 2):
        out = subprocess.run([sys.executable, "-c", COUNTED_ON_REPLICAS, str(replicas)], cwd=REPO, capture_output=True,
                             text=True, timeout=wait_s(270))
        assert out.returncode == 0, out.stderr[-3000:]
        found[replicas] = json.loads(out.stdout.split("FOUND ", 1)[1])
    for name in ("multi", "single"):
        one, two = found[1][name], found[2][name]
        assert one["examples"] == two["examples"] == 13
        assert one["seen"] == two["seen"] and one["seen"][-1] == 13
        np.testing.assert_allclose(one["counts"], two["counts"])
        np.testing.assert_allclose(one["detail"], two["detail"])
        for phase in ("train", "val"):
            for metric, value in one[phase].items():
                assert two[phase][metric] == pytest.approx(value, rel=1e-5, nan_ok=True), (name, metric)
        for a, b in zip(one["weights"], two["weights"]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
