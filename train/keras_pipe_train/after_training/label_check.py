"""label_check: the likely label errors (training/label_errors.py) of the validation images, from the
exported model's (served) probabilities; with label_error_folds, of the training images too, from K
heads on the features of the backbone the job started from; written to output/data/label_errors.csv,
.manifest and .json."""

from __future__ import annotations

import logging
import time

import keras
import numpy as np
import tensorflow as tf

from keras_pipe_train.after_training.calibrate import LABEL_THUMBNAIL, MAX_CHECKED, Calibrated
from keras_pipe_train.after_training.trained import Trained
from keras_pipe_train.report import suspects
from keras_pipe_train.settings import contract
from keras_pipe_train.training import calibration, gathered, label_errors
from keras_pipe_train.training.traced import for_any_batch

log = logging.getLogger(__name__)

MAX_CHECKED_VALUES = 2 ** 26  # training features kept for the label check (128 MiB of float16)
# the label check's heads take at most this share of the training's time (the cost it is meant to
# keep under), or HEADS_MIN_S when the training was quicker (tracing and a few chunks of steps)
HEADS_SHARE = 0.25
HEADS_MIN_S = 60.0
FEATURES_SHARE = 0.6  # of the chief's budget on several hosts, for the training features' pass


def check_labels(trained: Trained, calibrated: Calibrated, budget_s: float | None) -> suspects.Checked | str:
    """The chief's check, within `budget_s` seconds (None: no bound); or why there is none (the
    report says it): not asked, a stop request, nothing to check (no validation, no folds), a
    multi-label job (the check finds one wrong class per image), or a check that failed (a warning)."""
    t, folds = trained, trained.config.label_error_folds
    if not t.config.label_check:
        return "label_check=false"
    if t.stop.is_set():
        return "a stop request came before it"
    if t.config.multi_label:
        log.info("label check: the check finds one wrong class per image; a multi-label job's labels are not checked")
        return "a multi-label job: the check finds one wrong class per image"
    seen = calibrated.validation
    if not folds and (seen is None or not len(seen)):
        log.info("label check: no validation images were read to check (label_error_folds would check the training "
                 "images)")
        return "no validation images were read to check (label_error_folds checks the training images)"
    started = time.perf_counter()
    ends = None if budget_s is None else time.monotonic() + budget_s
    try:
        sets, agreement = {}, None
        if seen is not None and len(seen):
            found, agreement = validation_suspects(calibrated)
            sets["validation"] = (seen, found)
        found, accuracy, unchecked = None, None, ("label_error_folds=0 (5, say, checks them too, by cross-validated "
                                                  "heads on the starting backbone's features)")
        if folds:
            # (on several hosts the features' pass takes FEATURES_SHARE of the budget: the heads need the rest)
            features = training_features(t, None if budget_s is None else FEATURES_SHARE * budget_s)
            unchecked = ("a stop request came during their pass" if t.stop.is_set()
                         else "" if len(features) else "their pass read none")
            if not unchecked:
                found, accuracy, unchecked = training_suspects(t, features, ends)
            if found is not None:
                sets["train"] = (features, found)
            else:
                log.warning("label check: the training images are not checked: %s", unchecked)
        checked = suspects.Checked(sets, t.config.class_names, folds, trained_features=t.start_weights is None,
                                   seconds=time.perf_counter() - started, unchecked=unchecked,
                                   heads_accuracy=accuracy, validation_accuracy=agreement)
        path = suspects.write(t.layout.output_data, checked, contract.training_job_name())
    except Exception as err:
        log.warning("could not check the labels (%s: %s)", type(err).__name__, err, exc_info=True)
        return f"the check failed ({type(err).__name__}: {err})"
    log.info("label check%s in %.1f s: %s; %s", f" ({folds} folds)" if folds else "", checked.seconds,
             checked.summary(), path)
    return checked


def validation_suspects(calibrated: Calibrated) -> tuple[label_errors.Suspects, float | None]:
    """The validation images' suspects on the served probabilities (those the calibration step
    found, when no calibration is served: the same probabilities), and the model's agreement with
    their labels."""
    seen = calibrated.validation
    probabilities = calibration.served_probabilities(seen.outputs, calibrated.served, False)
    own = calibrated.own_suspects if calibrated.served is None else None
    found = own if own is not None else label_errors.find(probabilities, seen.labels)
    return found, agreement_of(probabilities, seen.labels)


def agreement_of(probabilities: np.ndarray, labels: np.ndarray) -> float | None:
    """How often the model chose the label given (its rows with finite probabilities; None: none
    is): how far to trust the suspects, which the report says."""
    finite = np.isfinite(probabilities).all(axis=1)
    return float((probabilities[finite].argmax(axis=1) == labels[finite]).mean()) if finite.any() else None


def training_suspects(trained: Trained, features: gathered.Gathered, ends: float | None
                      ) -> tuple[label_errors.Suspects | None, float | None, str]:
    """The training images' suspects, from label_error_folds heads on their `features`, and the
    heads' held-out accuracy; or None, None and why not, when the heads were cut: by a stop
    request, or their time, at most HEADS_SHARE of the training's (HEADS_MIN_S at least), and never
    past `ends` (time.monotonic(): the budget of the chief's passes on several hosts)."""
    t, folds = trained, trained.config.label_error_folds
    allowed = max(HEADS_MIN_S, HEADS_SHARE * sum(row.get("seconds", 0.0) for row in t.rows))
    budget = f"{HEADS_SHARE:.0%} of the training's time, {HEADS_MIN_S:.0f} s at least"
    if ends is not None and ends - time.monotonic() < allowed:  # (several hosts: what is left of the chief's)
        allowed, budget = max(0.0, ends - time.monotonic()), "what was left of the chief's budget on several hosts"
    try:
        held = label_errors.out_of_fold(features.outputs.astype(np.float32), features.labels,
                                        t.model.output_shape[-1], folds, t.config.seed,
                                        stop=t.stop, deadline=time.monotonic() + allowed)
    except label_errors.Cut as cut:
        return None, None, f"their {folds} heads on {len(features):,} images were ended by {cut}" + (
            f" ({allowed:.0f} s: {budget})" if str(cut) == label_errors.BY_TIME else "")
    # (a class with fewer images than folds is held out while its head has seen few or none of it)
    least = max(label_errors.MIN_CLASS_EXAMPLES, folds)
    found = label_errors.find(held.probabilities, features.labels, least)
    if found.unjudged:
        log.info("label check: %d training images not judged: their %d classes have fewer than %d images, or the "
                 "heads do not tell them apart", found.unjudged, len(found.unjudged_classes), least)
    return found, held.accuracy, ""


def training_features(trained: Trained, budget_s: float | None) -> gathered.Gathered:
    """The training channel's images through the backbone the job started from (its weights put
    back for the pass, the trained ones after; from scratch or continuing a previous model, the
    trained backbone's: job.checks_start), pooled as the classifier reads them, with each image's
    fingerprint and thumbnail."""
    t = trained
    weights = t.backbone.get_weights()
    if t.start_weights is not None:
        t.backbone.set_weights(t.start_weights)
    try:
        head = t.model.get_layer("classifier")
        features = keras.Model(t.model.inputs, head.input)
        width = int(head.input.shape[-1])
        make = t.examples(t.train_source, examined=LABEL_THUMBNAIL)
        return gathered.gather(for_any_batch(lambda images: features(images, training=False)),
                               make(tf.distribute.InputContext()), width,
                               min(MAX_CHECKED, MAX_CHECKED_VALUES // width), t.stop, budget_s, np.float16)
    finally:
        t.backbone.set_weights(weights)
