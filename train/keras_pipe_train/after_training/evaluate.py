"""The model as exported, on the validation channel, with the details the epochs' lines leave out
(each class's scores, the confusion matrix): output/data/evaluation.json and its pictures
(report/evaluation.py)."""

from __future__ import annotations

import logging

from keras_pipe_train.after_training.calibrate import Calibrated
from keras_pipe_train.after_training.trained import Trained
from keras_pipe_train.model.classifier import probabilities_of
from keras_pipe_train.report import evaluation

log = logging.getLogger(__name__)


def evaluate(trained: Trained, final: dict, validated: tuple | None, calibrated: Calibrated) -> dict | None:
    """The chief's evaluation of the exported model (written; None on the other hosts, without
    validation, or when it could not be made), from `validated`, the sums of the exported epoch's
    own validation pass (scores, examples, counts, detail). A resumed job exporting an epoch that an
    earlier run validated (`validated` None) makes one more pass, every host with it. It comes after
    the export, which nothing here can then cost the job; a stop request skips that pass (or, in
    Pipe mode, cuts it short), and a report that cannot be written is a warning. With
    test_time_flip the model exported answers with its mirror images' logits averaged in: that is
    the model judged, in a pass of its own, the epoch's own figures kept beside ("without_flip")."""
    t = trained
    if not t.validation:
        return None
    judged = _judged(t, validated)
    if judged is None or not t.cluster.is_chief:
        return None
    sums, flipped = judged
    try:
        found = evaluation.report(t.trainer.task, t.config.class_names, *sums, final.get("epoch"))
        if flipped:
            without = {k: v for k, v in final.items() if k.startswith("val_")} if validated is None else validated[0]
            found["test_time_flip"] = {"without_flip": without}
            log.info("test_time_flip: the exported model, each image's logits averaged with its mirror image's: %s "
                     "(without: %s)", _shown(sums[0]), _shown(without))
        elif t.config.test_time_flip:
            found["test_time_flip"] = {"not_measured": "the job was asked to stop before its pass ended: these are "
                                                       "the exported epoch's figures, without flips"}
        found["calibration"] = calibrated.calibration.as_json() if calibrated.calibration else None
        if calibrated.unmeasured:
            found["calibration_unmeasured"] = calibrated.unmeasured
        evaluation.write(t.layout.output_data, found, t.rows)
    except Exception as err:  # (the model and metrics.json are written: the job's result stands)
        log.warning("could not write evaluation.json (%s: %s)", type(err).__name__, err, exc_info=True)
        return None
    return found


def _shown(metrics: dict) -> str:
    return ", ".join(f"{name} {value:.4g}" for name, value in metrics.items())


def _judged(trained: Trained, own: tuple | None) -> tuple[tuple, bool] | None:
    """The sums evaluation.json reports, and whether they are test_time_flip's: the exported epoch's
    `own`, or a pass of their own where an earlier run validated that epoch (`own` None) or
    test_time_flip asks for one; `own` again when a stop request skips or cuts that pass short
    (None when there is no `own`). Every host makes the pass, and learns the same."""
    t, flip = trained, trained.config.test_time_flip
    if own is not None and not flip:
        return own, False
    if t.trainer.stop_requested():
        why = "the job was asked to stop"
    else:
        passed = t.trainer.evaluate_in_detail(
            t.cluster.strategy.distribute_datasets_from_function(t.examples(t.validation)),
            probabilities_of(t.model, flip=True) if flip else None)
        if not t.trainer.stop_requested() and passed[1]:  # (the same on every worker)
            return passed, flip
        why = ("a stop request cut the final evaluation short" if passed[1]
               else "the validation channel's last pass held no records")
    log.warning("%s: %s; the model is exported", "no evaluation.json" if own is None
                else "evaluation.json without test_time_flip's own pass", why)
    return None if own is None else (own, False)
