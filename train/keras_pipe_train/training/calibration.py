"""Probabilities that mean what they say: temperature scaling, fitted on the validation set.

Modern networks are overconfident (Guo et al. 2017, "On Calibration of Modern Neural Networks"),
and dividing the logits by one temperature T, fitted on held-out data by minimising the negative
log-likelihood, fixes most of it without changing any prediction: softmax(z / T) keeps the argmax
of softmax(z). A multi-label model's classes are each their own binary problem, so each class gets
its own temperature, sigmoid(z_c / T_c); a class with fewer than MIN_CLASS_SIDE positives or
negatives among the validation examples has too little to fit its own on (and one whose fit ends
at TEMPERATURE_RANGE's lower end has almost no errors), and takes the one fitted on every class pooled.
Its predictions stay those of multi_label_threshold on the uncalibrated probabilities, as
validated: the served decision per class is unchanged, and serving.json gives the calibrated
probability each class's threshold becomes.

No prediction changes, so accuracy (and every metric of the epochs' lines, which a tuning job
ranks by) stays the model's own; the probabilities served, the gallery's and these figures are the
calibrated ones.

The fit is scored honestly by cross-fitting: the validation examples are split in two halves at
random (seeded); a temperature fitted on each half calibrates the other, and the "after" figures
are those out-of-fold probabilities', against the "before" figures of the same examples. The
temperature exported is then fitted on all of them.

calibration=auto applies it when the validation set holds at least MIN_EXAMPLES examples, the
cross-fitted NLL is lower with it, and the fit is above TEMPERATURE_RANGE's lower end (a fit there
means a set with almost no errors: a temperature there would sharpen every answer to 0 or 1).
MIN_EXAMPLES: one parameter needs few examples to fit, but the cross-fitted check that decides
needs two halves of 100 for its own NLL difference to mean more than the split's luck.

The figures (each in evaluation.json): ECE (expected calibration error, over ECE_BINS equal-width
bins of confidence: the top class's probability for a single-label model, as Guo et al.; for a
multi-label one, each class's probability against its presence, over every (image, class) pair),
NLL, and the Brier score (the mean over examples of the summed squared differences to the one-hot
label; for multi-label, the mean over (example, class) pairs).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from keras_pipe_train.settings.serving_schema import ServedCalibration

log = logging.getLogger(__name__)

MIN_EXAMPLES = 200
MIN_CLASS_SIDE = 10  # multi-label: positives and negatives a class needs for a temperature of its own
TEMPERATURE_RANGE = (0.05, 20.0)
ECE_BINS = 15  # Guo et al.'s
MAX_VALUES = 2 ** 23  # logits kept for the fit (32 MiB of float32): examples = MAX_VALUES // classes
SEARCH_STEPS = 45  # golden-section steps: the interval shrinks by 0.618 each, to 4e-10 of its start


def tempered(logits: np.ndarray, temperature, multi_label: bool) -> np.ndarray:
    """The probabilities of `logits` divided by `temperature` (a number, or one per class)."""
    z = np.asarray(logits, np.float64) / np.asarray(temperature, np.float64)
    if multi_label:
        return 1 / (1 + np.exp(-z))
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _nll_by_inverse(logits: np.ndarray, labels: np.ndarray, beta: np.ndarray, multi_label: bool) -> np.ndarray:
    """The NLL at each inverse temperature of `beta` (single-label: a scalar's worth, shape [k];
    multi-label: one per class, shape [classes], each class's own mean binary NLL)."""
    if multi_label:
        signs = np.where(labels >= 0.5, 1.0, -1.0)
        return np.logaddexp(0, -signs * logits * beta).mean(axis=0)
    scaled = logits[None, :, :] * beta[:, None, None]
    top = scaled.max(axis=-1)
    lse = top + np.log(np.exp(scaled - top[..., None]).sum(axis=-1))
    return (lse - np.take_along_axis(scaled, labels[None, :, None], -1)[..., 0]).mean(axis=1)


def _search(logits: np.ndarray, labels: np.ndarray, multi_label: bool) -> np.ndarray:
    """The temperature of least NLL within TEMPERATURE_RANGE, by a golden-section search on the
    inverse temperature (the NLL is convex in it: a log-sum-exp of it, less a linear term): one, or
    for multi-label one per class."""
    width = logits.shape[1] if multi_label else 1
    low, high = np.full(width, 1 / TEMPERATURE_RANGE[1]), np.full(width, 1 / TEMPERATURE_RANGE[0])
    ratio = (np.sqrt(5) - 1) / 2

    def nll(beta):
        return _nll_by_inverse(logits, labels, beta, multi_label)

    c, d = high - ratio * (high - low), low + ratio * (high - low)
    fc, fd = nll(c), nll(d)
    for _ in range(SEARCH_STEPS):
        left = fc < fd  # (the minimum lies in [low, d]; else in [c, high])
        high, low = np.where(left, d, high), np.where(left, low, c)
        point = np.where(left, high - ratio * (high - low), low + ratio * (high - low))
        value = nll(point)  # (one new point per step: the other is the previous step's)
        c, d, fc, fd = (np.where(left, point, d), np.where(left, c, point),
                        np.where(left, value, fd), np.where(left, fc, value))
    return 1 / ((low + high) / 2)


def fit_temperature(logits: np.ndarray, labels: np.ndarray, multi_label: bool):
    """The temperature of least NLL on (logits, labels), within TEMPERATURE_RANGE: a float, or for
    multi-label one per class (np.ndarray), a class with too few positives or negatives, or with
    almost no errors, taking the one fitted on every class pooled."""
    logits = np.asarray(logits, np.float64)
    temperature = _search(logits, labels, multi_label)
    if not multi_label:
        return float(temperature[0])
    positives = (labels >= 0.5).sum(axis=0)
    own = ((positives >= MIN_CLASS_SIDE) & (len(labels) - positives >= MIN_CLASS_SIDE)
           & ~_at_edge(temperature))
    if own.all():
        return temperature
    pooled = _search(logits.reshape(-1, 1), labels.reshape(-1, 1), True)[0]
    return np.where(own, temperature, pooled)


def _at_edge(temperature) -> np.ndarray:
    """At the range's lower end: a fit that sharpens as far as it may, on a set with almost no
    errors. (The upper end is a model whose logits say little: a temperature there helps most.)"""
    return np.isclose(np.asarray(temperature), TEMPERATURE_RANGE[0], rtol=1e-3)


def at_bound(temperature) -> bool:
    """Whether a fit (a multi-label model's pooled one, where every class took it) ended at
    TEMPERATURE_RANGE's lower end."""
    return bool(np.all(_at_edge(temperature)))


def scores(logits: np.ndarray, labels: np.ndarray, multi_label: bool) -> dict:
    """ECE, NLL, Brier score and the reliability diagram's bins ({confidence, accuracy, examples}
    of each non-empty bin) of the probabilities of `logits` (already divided by any temperature)
    against `labels` (class ids, or multi-hot rows). The NLL is computed from the logits, exactly
    (as the job's val_loss is): a confident mistake's probability may round to 0 in float32."""
    z = np.asarray(logits, np.float64)
    p = tempered(z, 1.0, multi_label)
    if multi_label:
        truth = (labels >= 0.5).astype(np.float64)
        confidence, hit = p.reshape(-1), truth.reshape(-1)
        nll = float(np.logaddexp(0, -np.where(truth > 0, 1.0, -1.0) * z).mean())
        brier = float(((p - truth) ** 2).mean())
    else:
        confidence, hit = p.max(axis=-1), (p.argmax(axis=-1) == labels).astype(np.float64)
        top = z.max(axis=-1)
        log_sum = top + np.log(np.exp(z - top[:, None]).sum(axis=-1))
        nll = float((log_sum - z[np.arange(len(labels)), labels]).mean())
        onehot = np.eye(p.shape[1])[labels]
        brier = float(((p - onehot) ** 2).sum(axis=-1).mean())
    bins = np.minimum((confidence * ECE_BINS).astype(int), ECE_BINS - 1)
    reliability, ece = [], 0.0
    for b in range(ECE_BINS):
        inside = bins == b
        if inside.any():
            mean_confidence, accuracy = float(confidence[inside].mean()), float(hit[inside].mean())
            ece += inside.sum() / len(confidence) * abs(accuracy - mean_confidence)
            reliability.append({"bin": [b / ECE_BINS, (b + 1) / ECE_BINS], "confidence": mean_confidence,
                                "accuracy": accuracy, "examples": int(inside.sum())})
    return {"ece": float(ece), "nll": nll, "brier": brier, "reliability": reliability}


def per_class_ece(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Multi-label: each class's own ECE (its probability against its presence)."""
    return np.array([scores(logits[:, [c]], labels[:, [c]], True)["ece"] for c in range(labels.shape[1])])


def cross_fitted(logits: np.ndarray, labels: np.ndarray, multi_label: bool, seed: int) -> np.ndarray:
    """Out-of-fold calibrated logits: each half's, divided by the temperature fitted on the other."""
    order = np.random.default_rng(seed).permutation(len(labels))
    halves = order[: len(order) // 2], order[len(order) // 2:]
    out = np.empty(logits.shape, np.float64)
    for fit, score in (halves, halves[::-1]):
        out[score] = logits[score] / fit_temperature(logits[fit], labels[fit], multi_label)
    return out


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What was fitted, whether it is applied and why, and the figures before and after."""

    setting: str
    temperature: float | np.ndarray
    applied: bool
    reason: str
    examples: int
    before: dict
    after: dict  # cross-fitted: the temperature of the other half on each half's examples
    multi_label: bool
    cut: bool = False  # the pass ended at its time budget or memory bound: the first `examples` only
    per_class_ece: dict | None = None  # multi-label: {"before": [...], "after": [...]}

    def as_json(self) -> dict:
        t = self.temperature
        return {"setting": self.setting, "applied": self.applied, "reason": self.reason,
                "temperature": t.tolist() if isinstance(t, np.ndarray) else t, "examples": self.examples,
                "method": "temperature scaling, fitted by NLL on the validation set; after: cross-fitted halves",
                "cut": self.cut, "before": self.before, "after": self.after,
                **({"per_class_ece": self.per_class_ece} if self.per_class_ece else {})}

    @property
    def served(self):
        """The temperature the served probabilities' logits are divided by (None: not applied)."""
        return self.temperature if self.applied else None

    def serving(self, threshold: float | None) -> ServedCalibration | None:
        """serving.json's calibration (None when it is not applied): the temperature, and for a
        multi-label model the calibrated probability at which each class is predicted (its
        threshold on the model's own probability, which decides)."""
        if not self.applied:
            return None
        t = self.temperature
        edges = None
        if threshold is not None:
            edge = np.log(threshold / (1 - threshold)) if 0 < threshold < 1 else np.sign(threshold - 0.5) * np.inf
            edges = tuple(np.atleast_1d(1 / (1 + np.exp(-edge / np.asarray(t, np.float64)))).tolist())
        return ServedCalibration(tuple(np.asarray(t, np.float64).tolist()) if np.ndim(t) else float(t),
                                 self.examples, edges)


def calibrate(logits: np.ndarray, labels: np.ndarray, multi_label: bool, setting: str, seed: int,
              cut: bool = False) -> Calibration:
    """Fits the temperature, scores it cross-fitted, and decides (`setting`: config.CALIBRATION's)
    whether it is applied."""
    logits = before = np.asarray(logits, np.float64)
    temperature = fit_temperature(logits, labels, multi_label)
    after = cross_fitted(logits, labels, multi_label, seed) if len(labels) >= 2 else before
    scored_before, scored_after = scores(before, labels, multi_label), scores(after, labels, multi_label)
    helps = scored_after["nll"] < scored_before["nll"]
    if setting == "false":
        applied, reason = False, "calibration=false"
    elif setting == "true":
        applied, reason = True, "calibration=true"
    elif len(labels) < MIN_EXAMPLES:
        applied, reason = False, f"calibration=auto: {len(labels)} validation examples, fewer than {MIN_EXAMPLES}"
    elif at_bound(temperature):
        applied, reason = False, ("calibration=auto: the fit reached the temperature's lower bound "
                                  f"{TEMPERATURE_RANGE[0]} (a validation set with almost no errors)")
    elif not helps:
        applied, reason = False, "calibration=auto: the cross-fitted NLL is no lower with it"
    else:
        applied, reason = True, "calibration=auto: the cross-fitted NLL is lower with it"
    classes = None
    if multi_label:
        classes = {"before": per_class_ece(before, labels).tolist(), "after": per_class_ece(after, labels).tolist()}
    return Calibration(setting, temperature, applied, reason, len(labels), scored_before, scored_after, multi_label,
                       cut, classes)
