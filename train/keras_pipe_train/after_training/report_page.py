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

# the heatmaps' time: at most this share of the gallery's pass, and of the label check's (issue 71
# asks that they add at most 20 % to the report's time: on a large validation set, where the pass is
# long), and at least HEATMAPS_MIN_S for each (a small set's pass is too short to share: Grad-CAM of
# the demo's 10 mistakes and 5 suspects takes 0.97 s, most of it fixed: docs/speed.md, Heatmaps)
HEATMAPS_SHARE = 0.2
HEATMAPS_MIN_S = 2.0


def gallery(trained: Trained, calibrated: Calibrated, spent: float = 0.0) -> job_page.Gallery | None:
    """The worst mistakes of the probabilities served (calibrated ones, where they are), within
    PASS_SHARE of the chief's budget less the `spent` seconds already counted against it; None at a
    stop request, or when the pass failed (a warning). The mistakes keep their pictures for their
    heatmaps, which `write` draws with the suspects'.

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
    mistaken = worst.worst_first()
    budget = max(HEATMAPS_MIN_S, HEATMAPS_SHARE * (time.monotonic() - started)) if mistaken else 0.0
    return job_page.Gallery(mistaken, worst.seen, worst.wrong_count, worst.cut, heatmaps_budget_s=budget)


def with_heatmaps(trained: Trained, shown: job_page.Gallery | None, checked: suspects.Checked | str | None,
                  left_s: float | None = None) -> tuple[job_page.Gallery | None, suspects.Checked | str | None]:
    """The gallery's mistakes with the heatmaps of their predicted class and of their label, and the
    label check's suspects shown (each set's first MAX_SHOWN) with those of their likely class and
    of their label (model/explain.py): one explainer, one run of calls for both (its calls cost
    most, not the pictures: docs/speed.md, Heatmaps). Within HEATMAPS_SHARE of the gallery's pass
    (the gallery's heatmaps_budget_s) and of the check's seconds, HEATMAPS_MIN_S at least for each,
    and never past `left_s` (what is left of the chief's budget on several hosts; None: no bound),
    the mistakes first. The suspects' are drawn from the pictures the check kept (LABEL_THUMBNAIL
    pixels a side, enlarged to the model's input where it is larger: the page says so), not
    another pass. A failure is a warning: the page stands without them."""
    t = trained
    mistaken = shown.mistakes if shown is not None else []
    suspected = {name: (seen, found) for name, (seen, found) in checked.sets.items() if len(found) and seen.thumbnails
                 } if isinstance(checked, suspects.Checked) else {}
    if not (mistaken or suspected):
        return _without_pictures(shown), checked
    if t.stop.is_set():
        return _without_pictures(shown, "a stop request came before them" if mistaken else ""), checked
    budget = (shown.heatmaps_budget_s if mistaken else 0.0) + (
        max(HEATMAPS_MIN_S, HEATMAPS_SHARE * checked.seconds) if suspected else 0.0)
    if left_s is not None:
        budget = min(budget, left_s)
    started, size = time.monotonic(), t.config.image_size
    try:
        explainer = explain.explainer(t.model)
        pictures, asked = [m.picture for m in mistaken], mistakes.asked(mistaken)
        spans, kept = _suspects_asked(suspected, size, pictures, asked)
        drawn = explain.drawn(explainer, np.stack(pictures), asked, mistakes.HEATMAP,
                              max(0.0, budget - (time.monotonic() - started)), t.stop)
    except Exception as err:
        log.warning("could not draw the heatmaps (%s: %s)", type(err).__name__, err, exc_info=True)
        return _without_pictures(shown, f"they failed ({type(err).__name__})"), checked
    how = f"{explainer.method} on {explainer.where}"
    log.info("heatmaps of %d of the %d worst mistakes and of %d suspects shown, by %s, in %.1f s",
             sum(1 for found in drawn[:len(mistaken)] if found), len(mistaken),
             sum(1 for found in drawn[len(mistaken):] if found), how, time.monotonic() - started)
    if shown is not None:
        found, explained = mistakes.explained(mistaken, drawn[:len(mistaken)], asked[:len(mistaken)])
        shown = dataclasses.replace(shown, mistakes=found, explained=explained, explained_by=how if explained else (
            "a stop request came before the first" if t.stop.is_set()
            else f"their time budget ({min(budget, shown.heatmaps_budget_s):.1f} s) ended before the first"
            if mistaken else ""))
    if spans:
        checked = dataclasses.replace(
            checked, heatmaps={name: drawn[a:b] for name, (a, b) in spans.items()},
            explained_by=how + (f", from the {kept}-pixel pictures the check kept, enlarged to the model's {size}"
                                if kept < size else ""))
    return shown, checked


def _suspects_asked(suspected: dict, size: int, pictures: list, asked: list) -> tuple[dict, int]:
    """Each set's suspects shown, their pictures (the check's thumbnails, at the model's `size`) and
    their classes asked (likely, label) added to `pictures` and `asked`; where each set's lie in
    them, and the fewest pixels a side the thumbnails kept."""
    spans, kept = {}, size
    for name, (seen, found) in suspected.items():
        indices = [int(i) for i in found.indices[:suspects.MAX_SHOWN]]
        decoded = [tf.io.decode_jpeg(seen.thumbnails[i], channels=3) for i in indices]
        kept = min([kept, *(int(max(picture.shape[:2])) for picture in decoded)])
        spans[name] = (len(pictures), len(pictures) + len(indices))
        pictures += [tf.image.resize(picture, (size, size)).numpy() for picture in decoded]
        asked += [[("likely", int(likely)), ("label", int(seen.labels[i]))] for i, likely in zip(indices, found.likely)]
    return spans, kept


def _without_pictures(shown: job_page.Gallery | None, why: str = "") -> job_page.Gallery | None:
    """The gallery without its mistakes' pictures, and without heatmaps (`why` none: the page says it)."""
    if shown is None:
        return None
    return dataclasses.replace(shown, mistakes=[dataclasses.replace(m, picture=None) for m in shown.mistakes],
                               explained=0, explained_by=why)


def write(trained: Trained, found: dict, shown: job_page.Gallery | None, checked: suspects.Checked | str | None,
          writer, left_s: float | None = None) -> None:
    """report.html from the evaluation `found`, the gallery `shown` and the label check's
    `checked`, with their heatmaps (within `left_s`: with_heatmaps); TensorBoard's pictures when
    `writer` (the chief's summary writer) is given."""
    t = trained
    try:
        shown, checked = with_heatmaps(t, shown, checked, left_s)
        settings = {"dialect": t.config.dialect, **dataclasses.asdict(t.config)}
        path = job_page.write(t.layout.output_data, found, t.rows, settings, contract.training_job_name(), shown,
                              checked)
        log.info("the job's report: %s%s", path, "" if shown else " (no gallery)")
        if writer:
            tensorboard_pictures.pictures(writer, t.layout.output_data, shown, found, len(t.rows))
    except Exception as err:
        log.warning("could not write the job's report (%s: %s)", type(err).__name__, err, exc_info=True)
