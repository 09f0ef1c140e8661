"""Label errors and calibration on digits with labels flipped on purpose: the job's label check
(label_error_folds=5) and its calibration (calibration=true), measured in one run on this machine.

    python -m bench.label_errors            # ~7 minutes on 2 CPU cores
    python -m bench.label_errors --quick    # a correctness check: one task, one rate, short jobs

Two tasks, each with 5 % and 10 % of the training labels moved to another class at random (seeded):
  transfer   `make demo`'s: a MobileNetV3-Small pretrained from scratch on digits 0-4, then a job
             learning digits 5-9 (classes the backbone never saw) from its weights, through
             Pipe-mode FIFOs, with the demo's recipe;
  in-domain  the backbone pretrained from scratch on 600 digits of all ten classes, then a job
             learning the ten digits on 600 others, validated on the last 597: a starting
             backbone whose features already tell the classes apart, as ImageNet's do for photos.
For each: the job's own suspects (label_errors.csv) against the flips planted (precision and
recall), and the same figures for this project's confident learning and for cleanlab's
find_label_issues on the same out-of-fold probabilities (recomputed here from the starting
backbone's features, as the job computes them: 5 folds, seed 0): filter_by="low_self_confidence",
the method the job uses, and cleanlab's default "prune_by_noise_rate". Calibration: the
validation set's ECE and NLL before and after (cross-fitted halves: each half calibrated by the
temperature fitted on the other). Cost: the label check's seconds against the job's training time.
Last, calibration where it matters: the in-domain task without flips, fine-tuned at a constant,
higher rate until it is overconfident (as the e2e test's job is), ECE and NLL before and after on
its 597 validation images.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.recipes import hps, in_job_folder
from keras_pipe_launch.demo.__main__ import TRANSFER_RECIPE, launch_local, make_data, pretraining, write_shards

RATES = (0.05, 0.10)
FOLDS = 5


def flip(labels: np.ndarray, classes: int, rate: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    flips = rng.random(len(labels)) < rate
    given = labels.copy()
    given[flips] = (labels[flips] + rng.integers(1, classes, flips.sum())) % classes
    return given, flips


def tasks(out: Path, quick: bool) -> list[dict]:
    """Each task's images and labels, and its pretraining job's arguments (run here)."""
    from keras_pipe_launch.sample_data import digit_jpeg, load_digits
    from keras_pipe_train.sources.example import encode_example

    images, labels = load_digits()
    jpegs = [digit_jpeg(image, 32) for image in images]
    high = [(j, int(y) - 5) for j, y in zip(jpegs, labels) if y >= 5]
    cut = int(len(high) * 0.8)
    found = [{"name": "transfer", "classes": [str(d) for d in range(5, 10)], "train": high[:cut],
              "validation": high[cut:], "pretrain": pretraining(out, 1 if quick else 8)}]
    if not quick:
        everything = list(zip(jpegs, labels.astype(int).tolist()))
        for name, part in (("train", everything[:540]), ("validation", everything[540:600])):
            write_shards(out / "data/digits-600" / name, [encode_example(j, y) for j, y in part], 4 if name == "train"
                         else 1)
        found.append({"name": "in-domain", "classes": [str(d) for d in range(10)], "train": everything[600:1200],
                      "validation": everything[1200:],
                      "pretrain": ("--train", str(out / "data/digits-600/train"), "--validation",
                                   str(out / "data/digits-600/validation"), "--input-mode", "File", "--hp",
                                   "weights=none", "--hp", "class_names=" + ",".join(map(str, range(10))),
                                   "--hp", "epochs=12", "--hp", "augment=crop")})
    return found


def fingerprints(jpegs: list[bytes]) -> list[str]:
    import tensorflow as tf

    return [bytes(row).hex() for row in tf.fingerprint(tf.constant(jpegs)).numpy()]


def starting_features(weights: Path, jpegs: list[bytes]) -> np.ndarray:
    """The images through the starting backbone, pooled, as the job's label check computes them."""
    import keras
    import tensorflow as tf

    from keras_pipe_train.model.classifier import build_backbone, build_classifier
    from keras_pipe_train.sources import preprocess

    backbone = build_backbone("mobilenet_v3_small", 32, str(weights))
    model = build_classifier("mobilenet_v3_small", backbone, 2, 0.0)
    features = keras.Model(model.inputs, model.get_layer("classifier").input)
    images = preprocess.batch_of(lambda x: preprocess.for_eval(x, 32, None, "bilinear"), tf.constant(jpegs), 32)
    return features(images, training=False).numpy()


def scored(suspected: np.ndarray, flips: np.ndarray) -> str:
    hits = int((suspected & flips).sum())
    precision = hits / max(int(suspected.sum()), 1)
    return f"P {precision:.2f} R {hits / max(int(flips.sum()), 1):.2f} ({int(suspected.sum())} suspects)"


def ece_floor(reliability: list[dict], draws: int = 4000, seed: int = 0) -> float:
    """The ECE a perfectly calibrated model would be measured at, on as many images with these
    confidences (each bin's examples at its mean confidence, right with that probability): what
    the set's size alone adds to an ECE, as ECE's estimate is biased upwards (Kumar et al., 2019,
    "Verified uncertainty calibration"). An ECE at the floor has nothing left to measure."""
    counts = np.array([b["examples"] for b in reliability])
    confidence = np.array([b["confidence"] for b in reliability])
    hits = np.random.default_rng(seed).binomial(counts, confidence, size=(draws, len(counts)))
    return float((np.abs(hits / counts - confidence) * counts).sum(axis=1).mean() / counts.sum())


OVERCONFIDENT = {"lr_schedule": "constant", "fine_tune_learning_rate": 2e-3, "fine_tune_epochs": 20}


def run_rate(out: Path, task: dict, rate: float, weights: Path, quick: bool, recipe_changes: dict | None = None):
    from cleanlab.filter import find_label_issues

    from keras_pipe_train.sources.example import encode_example
    from keras_pipe_train.training import label_errors

    jpegs = [j for j, _ in task["train"]]
    truth = np.array([y for _, y in task["train"]])
    given, flips = flip(truth, len(task["classes"]), rate, seed=int(rate * 1000))
    step = f"{task['name']}-{int(rate * 100)}" + ("-overconfident" if recipe_changes else "")
    write_shards(out / "data" / step / "train", [encode_example(j, int(y)) for j, y in zip(jpegs, given)], 4)
    write_shards(out / "data" / step / "validation", [encode_example(j, y) for j, y in task["validation"]], 1)
    changes = {"epochs": 1, "fine_tune_epochs": 1} if quick else recipe_changes or {}
    recipe = hps(TRANSFER_RECIPE, class_names=None, **changes)
    names = "class_names=" + ",".join(task["classes"])
    launch_local(step, "--train", str(out / "data" / step / "train"), "--validation",
                 str(out / "data" / step / "validation"), "--pretrained", str(weights), "--input-mode", "Pipe",
                 "--shuffle-seed", "1", "--hp", "weights=pretrained", "--hp", names, *recipe,
                 "--hp", f"label_error_folds={FOLDS}", "--hp", "calibration=true", out=out, show=False)
    data = out / step / "algo-1" / "output" / "data"
    rows = [row for row in csv.DictReader(open(data / "label_errors.csv")) if row["set"] == "train"]
    by_print = {p: i for i, p in enumerate(fingerprints(jpegs))}
    job_found = np.zeros(len(jpegs), bool)
    job_found[[by_print[row["fingerprint"]] for row in rows]] = True
    check = json.loads((data / "label_errors.json").read_text())
    trained = sum(row["seconds"] for row in json.loads((data / "metrics.json").read_text())["epochs"])
    started = time.perf_counter()
    probabilities = label_errors.out_of_fold(starting_features(weights, jpegs), given, len(task["classes"]), FOLDS,
                                             0).probabilities
    heads = time.perf_counter() - started
    ours = np.zeros(len(jpegs), bool)
    ours[label_errors.find(probabilities, given).indices] = True
    started = time.perf_counter()
    theirs = find_label_issues(given, probabilities, filter_by="low_self_confidence")
    cleanlab_s = time.perf_counter() - started
    default = find_label_issues(given, probabilities)
    calibration = json.loads((data / "evaluation.json").read_text())["calibration"]
    before, after = calibration["before"], calibration["after"]
    print(f"{task['name']}, {rate:.0%} flipped ({int(flips.sum())} of {len(jpegs)}); head accuracy on the true labels "
          f"{(probabilities.argmax(axis=1) == truth).mean():.1%}\n"
          f"  the job's suspects:           {scored(job_found, flips)}\n"
          f"  same probabilities, ours:     {scored(ours, flips)}; the same as cleanlab's on "
          f"{(ours == theirs).mean():.1%} of images\n"
          f"  cleanlab low_self_confidence: {scored(theirs, flips)} ({cleanlab_s * 1000:.0f} ms)\n"
          f"  cleanlab prune_by_noise_rate: {scored(default, flips)}\n"
          f"  cost: label check {check['seconds']:.1f} s / training {trained:.1f} s = {check['seconds'] / trained:.0%} "
          f"(here, the {FOLDS} heads alone: {heads:.1f} s)\n"
          f"  calibration (T = {calibration['temperature']:.3g}, {calibration['examples']} validation images): "
          f"ECE {before['ece']:.4f} -> {after['ece']:.4f} ({after['ece'] / max(before['ece'], 1e-12):.2f}x), "
          f"NLL {before['nll']:.4f} -> {after['nll']:.4f}\n"
          f"  the ECE a perfectly calibrated model would measure at those confidences on as many images: "
          f"{ece_floor(before['reliability']):.4f} -> {ece_floor(after['reliability']):.4f}", flush=True)


def run(out: Path, quick: bool) -> None:
    make_data(out)
    for task in tasks(out, quick):
        launch_local(f"pretrain-{task['name']}", *task["pretrain"], out=out, show=False)
        weights = out / f"pretrain-{task['name']}" / "algo-1" / "model" / "backbone.weights.h5"
        for rate in RATES[1:] if quick else RATES:
            run_rate(out, task, rate, weights, quick)
        if task["name"] == "in-domain":
            print("\nthe same, no flips, fine-tuned to overconfidence:",
                  ", ".join(f"{k}={v}" for k, v in OVERCONFIDENT.items()))
            run_rate(out, task, 0.0, weights, quick, OVERCONFIDENT)


def main(argv: list[str] | None = None) -> int:
    return in_job_folder("bench-label-errors-", __doc__, argv, run)


if __name__ == "__main__":
    sys.exit(main())
