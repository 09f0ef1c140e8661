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
    own = validated
    if validated is None or t.config.test_time_flip:
        if t.trainer.stop_requested():
            log.warning("no evaluation.json: the job was asked to stop; the model is exported")
            return None
        validated = t.trainer.evaluate_in_detail(
            t.cluster.strategy.distribute_datasets_from_function(t.examples(t.validation)),
            probabilities_of(t.model, flip=True) if t.config.test_time_flip else None)
        if t.trainer.stop_requested() or not validated[1]:  # (the same on every worker)
            log.warning("no evaluation.json: %s", "a stop request cut the final evaluation short" if validated[1]
                        else "the validation channel's last pass held no records")
            return None
    if not t.cluster.is_chief:
        return None
    try:
        found = evaluation.report(t.trainer.task, t.config.class_names, *validated, final.get("epoch"))
        if t.config.test_time_flip:
            without = {k: v for k, v in final.items() if k.startswith("val_")} if own is None else own[0]
            found["test_time_flip"] = {"without_flip": without}
            log.info("test_time_flip: the exported model, each image's logits averaged with its mirror image's: %s "
                     "(without: %s)", _shown(validated[0]), _shown(without))
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
