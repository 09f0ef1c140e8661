"""The chief's report: the gallery of the validation images the exported model gets most wrong (one
more pass, the chief's alone), output/data/report.html (report/job_page.py) and TensorBoard's
pictures. A report that cannot be made is a warning: the model, metrics.json and evaluation.json
stand."""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import tensorflow as tf

from keras_pipe_train.after_training.calibrate import Calibrated
from keras_pipe_train.after_training.trained import PASS_SHARE, Trained
from keras_pipe_train.model import explain
from keras_pipe_train.model.export import served_probabilities
from keras_pipe_train.report import job_page, mistakes, suspects, tensorboard_pictures
from keras_pipe_train.settings import contract

log = logging.getLogger(__name__)

# the heatmaps' time: at most this share of the gallery's pass (issue 71 asks that they add at most
# 20 % to the report's time: on a large validation set, where the pass is long), and at least
# HEATMAPS_MIN_S (a small set's pass is too short to share: Grad-CAM on 24 mistakes took 0.7 s on
# the digits, the suspects' as long, 45 % of a 397-image report: docs/speed.md, Heatmaps)
HEATMAPS_SHARE = 0.2
HEATMAPS_MIN_S = 2.0


def gallery(trained: Trained, calibrated: Calibrated, spent: float = 0.0) -> job_page.Gallery | None:
    """The worst mistakes of the probabilities served (calibrated ones, where they are), within
    PASS_SHARE of the chief's budget less the `spent` seconds already counted against it; None at a
    stop request, or when the pass failed (a warning).

    The chief's own stop flag ends the pass, never stop_requested(): that is a collective, which the
    other hosts, waiting for the chief, would never join. With several hosts the pass reads the
    chief's own share of the channel."""
    t = trained
    if t.stop.is_set():
        return None
    started = time.monotonic()
    try:
        answer = served_probabilities(t.model, calibrated.served, t.config.multi_label, t.config.test_time_flip)
        served = calibrated.serving(t.config.multi_label_threshold if t.config.multi_label else None)
        threshold = served.calibrated_thresholds if served else None
        worst = mistakes.find(lambda images: answer(images)[0], t.trainer.task,
                              t.examples(t.validation)(tf.distribute.InputContext()), t.stop,
                              budget_s=t.budget(PASS_SHARE, spent), threshold=threshold)
    except Exception as err:
        log.warning("could not find the worst mistakes (%s: %s)", type(err).__name__, err, exc_info=True)
        return None
    if t.stop.is_set():
        return None
    found, explained, how = _explained(t, worst.worst_first(), time.monotonic() - started, spent)
    return job_page.Gallery(found, worst.seen, worst.wrong_count, worst.cut, explained, how)


def _explained(trained: Trained, worst: list[mistakes.Mistake], pass_s: float, spent: float):
    """The mistakes with their heatmaps (model/explain.py), within HEATMAPS_SHARE of the pass's
    seconds (HEATMAPS_MIN_S at least) and what is left of the chief's budget; how many have them,
    and by which method (or why none has)."""
    t = trained
    if not worst:
        return worst, 0, ""
    budget = max(HEATMAPS_MIN_S, HEATMAPS_SHARE * pass_s)
    left = t.budget(PASS_SHARE, spent + pass_s)
    if left is not None:
        budget = min(budget, left)
    started = time.monotonic()
    try:
        explainer = explain.explainer(t.model)
        found, explained = mistakes.explained(list(worst), explainer, max(0.0, budget - (time.monotonic() - started)),
                                              t.stop)
    except Exception as err:
        log.warning("could not draw the mistakes' heatmaps (%s: %s)", type(err).__name__, err, exc_info=True)
        return [dataclasses.replace(m, picture=None) for m in worst], 0, f"they failed ({type(err).__name__})"
    log.info("heatmaps of %d of the %d worst mistakes by %s on %s, in %.1f s", explained, len(worst),
             explainer.method, explainer.where, time.monotonic() - started)
    if not explained:
        return found, 0, f"their time budget ({budget:.1f} s) ended before the first"
    return found, explained, f"{explainer.method} on {explainer.where}"


def suspects_explained(trained: Trained, checked: suspects.Checked | str | None) -> suspects.Checked | str | None:
    """The label check's suspects shown on the page (each set's first MAX_SHOWN) with the heatmaps
    of their likely class and of their label, within HEATMAPS_SHARE of the check's seconds
    (HEATMAPS_MIN_S at least). Made from the pictures the check kept (LABEL_THUMBNAIL pixels a
    side, enlarged to the model's input where it is larger: the page says so), not another pass.
    A failure is a warning: the suspects stand without them."""
    t = trained
    if not isinstance(checked, suspects.Checked) or t.stop.is_set():
        return checked
    shown = {name: (seen, found) for name, (seen, found) in checked.sets.items() if len(found) and seen.thumbnails}
    if not shown:
        return checked
    started, size = time.monotonic(), t.config.image_size
    budget = max(HEATMAPS_MIN_S, HEATMAPS_SHARE * checked.seconds)
    try:
        explainer = explain.explainer(t.model)
        heatmaps, kept = {}, size
        for name, (seen, found) in shown.items():
            indices = [int(i) for i in found.indices[:suspects.MAX_SHOWN]]
            decoded = [tf.io.decode_jpeg(seen.thumbnails[i], channels=3) for i in indices]
            kept = min([kept, *(int(max(picture.shape[:2])) for picture in decoded)])
            pictures = np.stack([tf.image.resize(picture, (size, size)).numpy() for picture in decoded])
            asked = [[("likely", int(likely)), ("label", int(seen.labels[i]))]
                     for i, likely in zip(indices, found.likely)]
            heatmaps[name] = explain.drawn(explainer, pictures, asked, mistakes.HEATMAP,
                                           max(0.0, budget - (time.monotonic() - started)), t.stop)
    except Exception as err:
        log.warning("could not draw the suspects' heatmaps (%s: %s)", type(err).__name__, err, exc_info=True)
        return checked
    how = f"{explainer.method} on {explainer.where}" + (
        f", from the {kept}-pixel pictures the check kept, enlarged to the model's {size}" if kept < size else "")
    log.info("heatmaps of the suspects shown, by %s, in %.1f s", how, time.monotonic() - started)
    return dataclasses.replace(checked, heatmaps=heatmaps, explained_by=how)


def write(trained: Trained, found: dict, shown: job_page.Gallery | None, checked: suspects.Checked | str | None,
          writer) -> None:
    """report.html from the evaluation `found`, the gallery `shown` and the label check's
    `checked`; TensorBoard's pictures when `writer` (the chief's summary writer) is given."""
    t = trained
    checked = suspects_explained(t, checked)
    try:
        settings = {"dialect": t.config.dialect, **dataclasses.asdict(t.config)}
        path = job_page.write(t.layout.output_data, found, t.rows, settings, contract.training_job_name(), shown,
                              checked)
        log.info("the job's report: %s%s", path, "" if shown else " (no gallery)")
        if writer:
            tensorboard_pictures.pictures(writer, t.layout.output_data, shown, found, len(t.rows))
    except Exception as err:
        log.warning("could not write the job's report (%s: %s)", type(err).__name__, err, exc_info=True)
