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
from keras_pipe_train.training import calibration, gathered, label_errors
from keras_pipe_train.training.traced import for_any_batch

log = logging.getLogger(__name__)

# the label check reads the validation images from this pass: each one's thumbnail is kept too
LABEL_THUMBNAIL = 64  # pixels: the longer side of a suspect's picture in the report
MAX_CHECKED = 100_000  # examples the label check looks at, at most: a uniform sample of those read
# and their logits kept, at most (128 MiB of float32): the check looks at more than the fit needs
# (calibration.MAX_VALUES), so that a job of many classes has its validation images checked, not a
# few of each class (1,000 classes: 33,554 images checked, the fit on a sample of 8,388 of them)
CHECKED_LOGITS = 2 ** 25


@dataclasses.dataclass(frozen=True)
class Calibrated:
    """What the calibration step found: the fit (None: none, or it failed), and its pass over the
    validation images (their logits, labels and, when the label check asks, thumbnails)."""

    calibration: calibration.Calibration | None = None
    validation: gathered.Gathered | None = None
    # the label check's suspects among `validation` on the model's own probabilities (auto weighed
    # them): label_check.py takes them as they are when no calibration is served
    own_suspects: label_errors.Suspects | None = None
    unmeasured: str = ""  # why there is no calibration, when there is none (evaluation.json and the page say it)

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
        return Calibrated(unmeasured="a stop request came before it" if t.validation else "no validation channel")
    seen = None
    try:
        checks = t.config.label_check and not t.config.multi_label  # (label_check.py reads this pass)
        make = t.examples(t.validation, examined=LABEL_THUMBNAIL if checks else 0)
        classes = t.model.output_shape[-1]
        fitted, limit = kept(classes, checks)
        seen = gathered.gather(for_any_batch(logits_of(t.model, t.config.test_time_flip)),
                               make(tf.distribute.InputContext()), classes, limit, t.stop, t.budget(PASS_SHARE))
        if t.stop.is_set() or not len(seen):
            why = "a stop request came during its pass" if len(seen) else "the validation pass read nothing"
            log.warning("no calibration: %s", why)
            return Calibrated(unmeasured=why)
        sample = fit_sample(len(seen), fitted, t.config.seed)
        suspects = suspects_of(seen) if checks else None
        found = calibration.calibrate(seen.outputs[sample], seen.labels[sample], t.config.multi_label,
                                      t.config.calibration, t.config.seed, seen.cut,
                                      None if suspects is None else mask_of(suspects, len(seen))[sample])
    except Exception as err:
        log.warning("could not calibrate the model's probabilities (%s: %s): it is exported as trained",
                    type(err).__name__, err, exc_info=True)
        return Calibrated(validation=seen if seen is not None and len(seen) else None,
                          unmeasured=f"the fit failed ({type(err).__name__}: {err}); the model is exported as trained")
    before, after = found.before, found.after
    log.info("calibration on %d validation examples%s: %s, temperature %s %s (%s); cross-fitted ECE %.4f -> %.4f, "
             "NLL %.4f -> %.4f, Brier %.4f -> %.4f", found.examples,
             " (a sample of those read before the pass was cut short)" if found.cut else "", found.method,
             _shown(found.temperature), "applied" if found.applied else "not applied", found.reason,
             before["ece"], after["ece"], before["nll"], after["nll"], before["brier"], after["brier"])
    return Calibrated(found, seen, suspects)


def kept(classes: int, checks: bool) -> tuple[int, int]:
    """The most examples the fit is made on, and the most the pass keeps (more when the label
    check reads the pass too)."""
    fitted = max(1, calibration.MAX_VALUES // classes)
    return fitted, min(MAX_CHECKED, max(fitted, CHECKED_LOGITS // classes)) if checks else fitted


def fit_sample(examples: int, most: int, seed: int) -> np.ndarray:
    """Which of the `examples` gathered the fit is made on: all, or `most` of them at random (the
    pass kept more for the label check)."""
    if examples <= most:
        return np.arange(examples)
    return np.sort(np.random.default_rng(seed).choice(examples, most, replace=False))


def suspects_of(seen: gathered.Gathered) -> label_errors.Suspects:
    """The validation examples the label check suspects, on the model's own probabilities: what
    calibration=auto weighs (training/calibration.py) before the label check names them."""
    return label_errors.find(calibration.tempered(seen.outputs, 1.0, False), seen.labels)


def mask_of(suspects: label_errors.Suspects, examples: int) -> np.ndarray:
    mask = np.zeros(examples, bool)
    mask[suspects.indices] = True
    return mask


def _shown(temperature) -> str:
    values = np.atleast_1d(temperature)
    return f"{values[0]:.4g}" if values.size == 1 else f"{values.min():.4g} to {values.max():.4g} by class"
