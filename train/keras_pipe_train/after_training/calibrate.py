"""The temperature for the served probabilities (training/calibration.py), fitted on the validation
channel's logits in one pass, the chief's alone, before the export."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import tensorflow as tf

from keras_pipe_train.after_training.trained import PASS_SHARE, Trained
from keras_pipe_train.model.classifier import logits_of
from keras_pipe_train.settings.serving_schema import ServedCalibration
from keras_pipe_train.training import calibration, gathered

log = logging.getLogger(__name__)

# the label check reads the validation images from this pass: each one's thumbnail is kept too
LABEL_THUMBNAIL = 64  # pixels: the longer side of a suspect's picture in the report
MAX_CHECKED = 100_000  # examples the label check looks at, at most: a uniform sample of those read


@dataclasses.dataclass(frozen=True)
class Calibrated:
    """What the calibration step found: the fit (None: none, or it failed), and its pass over the
    validation images (their logits, labels and, when the label check asks, thumbnails)."""

    calibration: calibration.Calibration | None = None
    validation: gathered.Gathered | None = None

    @property
    def served(self) -> ServedCalibration | None:
        """The rule the served probabilities' logits go through (None: not applied)."""
        return self.calibration.served if self.calibration else None

    def serving(self, threshold: float | None) -> ServedCalibration | None:
        """serving.json's calibration: None when there is none to apply."""
        return self.calibration.serving(threshold) if self.calibration else None


def calibrate(trained: Trained) -> Calibrated:
    """The fit, on validation's logits. Nothing without validation or at a stop request; a fit
    that fails is a warning (the model is then exported as trained). On several hosts the others
    wait for it in the export: PASS_SHARE of collective_timeout at most."""
    t = trained
    if not t.validation or t.stop.is_set():
        return Calibrated()
    seen = None
    try:
        checks = t.config.label_check and not t.config.multi_label  # (label_check.py reads this pass)
        make = t.examples(t.validation, examined=LABEL_THUMBNAIL if checks else 0)
        classes = t.model.output_shape[-1]
        limit = max(1, calibration.MAX_VALUES // classes)
        if checks:  # (each example's thumbnail is kept too)
            limit = min(limit, MAX_CHECKED)
        seen = gathered.gather(tf.function(logits_of(t.model), reduce_retracing=True),
                               make(tf.distribute.InputContext()), classes, limit, t.stop, t.budget(PASS_SHARE))
        if t.stop.is_set() or not len(seen):
            log.warning("no calibration: %s", "a stop request" if len(seen) else "the validation pass read nothing")
            return Calibrated()
        found = calibration.calibrate(seen.outputs, seen.labels, t.config.multi_label, t.config.calibration,
                                      t.config.seed, seen.cut)
    except Exception as err:
        log.warning("could not calibrate the model's probabilities (%s: %s): it is exported as trained",
                    type(err).__name__, err, exc_info=True)
        return Calibrated(validation=seen if seen is not None and len(seen) else None)
    before, after = found.before, found.after
    log.info("calibration on %d validation examples%s: %s, temperature %s %s (%s); cross-fitted ECE %.4f -> %.4f, "
             "NLL %.4f -> %.4f, Brier %.4f -> %.4f", found.examples,
             " (a sample of those read before the pass was cut short)" if found.cut else "", found.method,
             _shown(found.temperature), "applied" if found.applied else "not applied", found.reason,
             before["ece"], after["ece"], before["nll"], after["nll"], before["brier"], after["brier"])
    return Calibrated(found, seen)


def _shown(temperature) -> str:
    values = np.atleast_1d(temperature)
    return f"{values[0]:.4g}" if values.size == 1 else f"{values.min():.4g} to {values.max():.4g} by class"
