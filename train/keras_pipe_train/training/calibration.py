"""Probabilities that mean what they say: a rule fitted on the validation set's logits, z -> z / T + b.

Modern networks are overconfident (Guo et al. 2017, "On Calibration of Modern Neural Networks"),
and dividing the logits by one temperature T, fitted on held-out data by minimising the negative
log-likelihood, fixes most of it without changing any prediction: softmax(z / T) keeps the argmax
of softmax(z). A multi-label model's classes are each their own binary problem, so each class gets
its own temperature, sigmoid(z_c / T_c); a class with fewer than MIN_CLASS_SIDE positives or
negatives among the validation examples has too little to fit its own on (and one whose fit ends
at TEMPERATURE_RANGE's lower end has almost no errors), and keeps the model's own probabilities
(T = 1). A temperature fitted on every class pooled and given to it could make it worse, with
nothing to tell: a class never present, its logits all low, overconfident classes beside it, was
served 5.7 % on average instead of 0.3 % (its ECE 0.003 -> 0.057) while the pooled ECE fell.

A temperature cannot move a class's probabilities as a whole: sigmoid(z / T) keeps 0.5 where it
is, so a multi-label class whose logits are all offset (a prior unlike the validation set's)
stays as wrong (one class offset by +2: cross-fitted ECE 0.216, 0.189 with its own temperature). A
bias per class does move them: Platt scaling (Platt 1999), sigmoid(z_c / T_c + b_c), for each
multi-label class that has a temperature of its own (0.02 there). `fit` tries both, and keeps
Platt's only where its cross-fitted NLL and Brier score are both lower than the temperature's by
more than twice their standard error (paired, over the examples): on a set without an offset it
would only fit noise. A single-label model keeps a temperature alone: a bias per class there
(vector scaling's, Guo et al.) would change predictions, the class served being the calibrated
probabilities' likeliest, and so undo what the model was trained to decide (class_weights=balanced
shifts its logits on purpose) and what its validation accuracy was measured on.
A multi-label model's predictions stay those of multi_label_threshold on the uncalibrated
probabilities, as validated: the served decision per class is unchanged, and serving.json gives the
calibrated probability each class's threshold becomes (the rule rises with z: a_c = 1 / T_c > 0).

The fit is scored honestly by cross-fitting: the validation examples are split in two halves at
random (seeded); a rule fitted on each half calibrates the other, and the "after" figures are those
out-of-fold probabilities', against the "before" figures of the same examples. The rule's shape
(which classes have their own temperature or bias, which keep their own probabilities) is decided once, on
all of them, and each half's fit keeps it: the rule scored is the rule served. The rule exported is
then fitted on all of them.

calibration=auto applies it when the validation set holds at least MIN_EXAMPLES examples, the
fit is above TEMPERATURE_RANGE's lower end (a fit there means a set with almost no errors: a
temperature there would sharpen every answer to 0 or 1), the cross-fitted NLL and Brier score are
both lower with it, and its cross-fitted ECE is no higher. The NLL alone is not enough: on a set
whose few errors are labels filed wrong, the NLL is theirs, and a temperature that softens every
right answer to pay for them lowers it while the Brier score and ECE rise (12 wrong labels of 200,
the model right on every other image: NLL 1.07 -> 0.60, Brier 0.120 -> 0.128, ECE 0.059 -> 0.103).
The ECE need not fall (on a few hundred examples its own sampling spread is as large as the gain
it would judge, so a rule that helps would often be turned down), but a rule applied never shows a
higher one than the model's own.
calibration=true applies the fit whatever the figures say, except at TEMPERATURE_RANGE's lower end
(not applied, and said). MIN_EXAMPLES: one parameter needs few examples to fit, but the
cross-fitted check that decides needs two halves of 100 for its own NLL difference to mean more
than the split's luck.

Logits that are not finite (a NaN, an infinity: a model that diverged on some input) are left out
of the fit and the figures, and counted in the reason: one of them would walk the search to a bound.

The temperature is fitted on every validation image, by the plain NLL. Two other fits were
measured, and are not taken (python -m bench.calibration_fit_set, and real jobs: docs/speed.md,
"Which images the temperature is fitted on"). The plain NLL on the images the label check does
not suspect helps a model right on nearly every correctly filed image, but hurts a weaker one,
whose suspects are mostly its own confident mistakes (right on ~60 %, overconfident by 2: test
ECE 0.195, against the plain fit's 0.013). A likelihood that allows for a share of wrong labels
keeps the right temperature on simulated models whatever the share; but real networks' mistakes
are often confident, and it takes them for wrong labels and sharpens (bench.label_errors'
transfer task, whose validation labels are right, three runs: cross-fitted ECE 0.074, 0.049 and
0.065, the plain fit's 0.051, 0.041 and 0.036).
Wrong labels soften the plain fit, and the given labels cannot tell a confident mistake from a
wrong label. A model right on nearly every image (UNSUSPECTED_RIGHT) but those the label check
suspects, and they many (SUSPECTED_SHARE), may have errors that are its labels':
calibration=auto does not serve it a temperature that softens (simulated, with 20 % of the labels
wrong, models right on 98 and 99.8 %: without this condition a temperature of 4.6 to 14 was served
5 to 8 times in 10, the true ECE 0.14 to 0.21 on average where 0.001 to 0.010 as it is). Its
cost: a model whose suspects are its own confident mistakes, its labels right, is not calibrated
either (simulated, 7-10 % of such mistakes: ECE 0.079-0.109, where the temperature would give
0.044-0.063); the reason says so, and calibration=true applies it. Either way nothing served is
worse than the model's own. A model both overconfident and often wrong, with many wrong labels,
is not told apart, and may be softened (docs/speed.md says how much).

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

from keras_pipe_train.settings import serving_schema
from keras_pipe_train.settings.serving_schema import ServedCalibration

log = logging.getLogger(__name__)

MIN_EXAMPLES = 200
MIN_CLASS_SIDE = 10  # positives and negatives a class needs for a temperature or a bias of its own
TEMPERATURE_RANGE = (0.05, 20.0)
BIAS_RANGE = 20.0  # a bias beyond +-20 moves a probability by less than 2e-9
ECE_BINS = 15  # Guo et al.'s
MAX_VALUES = 2 ** 23  # logits kept for the fit (32 MiB of float32): examples = MAX_VALUES // classes
SEARCH_STEPS = 45  # golden-section steps: the interval shrinks by 0.618 each, to 4e-10 of its start
FIT_ROUNDS = 50  # Newton steps of a fit with a bias (each halved until the NLL falls)
SIGNIFICANT = 2.0  # standard errors by which a rule with a bias must beat the temperature alone
# auto does not serve a temperature that softens a single-label model whose errors are mostly its
# labels': at least this share of the validation images suspected wrong by the label check, and the
# model right on at least UNSUSPECTED_RIGHT of the others (the module's docstring; docs/speed.md)
SUSPECTED_SHARE = 0.05
UNSUSPECTED_RIGHT = 0.97
TEMPERATURE, PLATT = serving_schema.CALIBRATION_METHOD, serving_schema.PLATT_METHOD  # (serving.json's names)


@dataclasses.dataclass(frozen=True)
class Rule:
    """z -> z / temperature + bias: a temperature (a number, or one per class) and a bias per class
    (None: none)."""

    method: str
    temperature: float | np.ndarray
    bias: np.ndarray | None = None

    def logits(self, logits: np.ndarray) -> np.ndarray:
        z = np.asarray(logits, np.float64) / np.asarray(self.temperature, np.float64)
        return z if self.bias is None else z + self.bias

    def served(self, examples: int, thresholds: tuple[float, ...] | None = None) -> ServedCalibration:
        t, b = self.temperature, self.bias
        return ServedCalibration(tuple(np.asarray(t, np.float64).tolist()) if np.ndim(t) else float(t), examples,
                                 thresholds, self.method, None if b is None else tuple(np.asarray(b).tolist()))


def tempered(logits: np.ndarray, temperature, multi_label: bool, bias=None) -> np.ndarray:
    """The probabilities of `logits` divided by `temperature` (a number, or one per class), plus
    `bias` (one per class) when given."""
    z = np.asarray(logits, np.float64) / np.asarray(temperature, np.float64)
    if bias is not None:
        z = z + np.asarray(bias, np.float64)
    if multi_label:
        return 1 / (1 + np.exp(-z))
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def served_probabilities(logits: np.ndarray, served: ServedCalibration | None, multi_label: bool) -> np.ndarray:
    """The probabilities served for `logits`: calibrated by `served` (Calibration.served), or the
    model's own (None)."""
    if served is None:
        return tempered(logits, 1.0, multi_label)
    return tempered(logits, np.asarray(served.temperature), multi_label,
                    None if served.bias is None else np.asarray(served.bias))


def _nll_by_inverse(logits: np.ndarray, labels: np.ndarray, beta: np.ndarray, multi_label: bool,
                    bias=0.0) -> np.ndarray:
    """The NLL at each inverse temperature of `beta` (single-label: a scalar's worth, shape [k];
    multi-label: one per class, shape [classes], each class's own mean binary NLL), `bias` added."""
    if multi_label:
        signs = np.where(labels >= 0.5, 1.0, -1.0)
        return np.logaddexp(0, -signs * (logits * beta + bias)).mean(axis=0)
    scaled = logits[None, :, :] * beta[:, None, None] + bias
    top = scaled.max(axis=-1)
    lse = top + np.log(np.exp(scaled - top[..., None]).sum(axis=-1))
    return (lse - np.take_along_axis(scaled, labels[None, :, None], -1)[..., 0]).mean(axis=1)


def golden_section(loss, low: np.ndarray, high: np.ndarray, steps: int = SEARCH_STEPS) -> np.ndarray:
    """The point of least `loss` within [low, high], for each of an array of independent problems
    (`loss`: points -> their losses, elementwise), by golden-section search: exact where the loss
    is unimodal on the interval."""
    ratio = (np.sqrt(5) - 1) / 2
    c, d = high - ratio * (high - low), low + ratio * (high - low)
    fc, fd = loss(c), loss(d)
    for _ in range(steps):
        left = fc < fd  # (the minimum lies in [low, d]; else in [c, high])
        high, low = np.where(left, d, high), np.where(left, low, c)
        point = np.where(left, high - ratio * (high - low), low + ratio * (high - low))
        value = loss(point)  # (one new point per step: the other is the previous step's)
        c, d, fc, fd = (np.where(left, point, d), np.where(left, c, point),
                        np.where(left, value, fd), np.where(left, fc, value))
    return (low + high) / 2


def _search(logits: np.ndarray, labels: np.ndarray, multi_label: bool, bias=0.0) -> np.ndarray:
    """The temperature of least NLL within TEMPERATURE_RANGE, by a golden-section search on the
    inverse temperature (the NLL is convex in it: a log-sum-exp of it, less a linear term): one, or
    for multi-label one per class."""
    width = logits.shape[1] if multi_label else 1
    low, high = np.full(width, 1 / TEMPERATURE_RANGE[1]), np.full(width, 1 / TEMPERATURE_RANGE[0])
    return 1 / golden_section(lambda beta: _nll_by_inverse(logits, labels, beta, multi_label, bias), low, high)


def own_classes(logits: np.ndarray, labels: np.ndarray, multi_label: bool, temperature=None) -> np.ndarray:
    """Which classes of a multi-label model have a temperature (and may have a bias) of their own:
    those with MIN_CLASS_SIDE positives and negatives at least, and a `temperature` of their own,
    fitted unless given, above TEMPERATURE_RANGE's lower end, that is with some errors. None of a
    single-label model's: it has one temperature."""
    if not multi_label:
        return np.zeros(logits.shape[1], bool)
    positives = (labels >= 0.5).sum(axis=0)
    sides = (positives >= MIN_CLASS_SIDE) & (len(labels) - positives >= MIN_CLASS_SIDE)
    if temperature is None:
        temperature = _search(np.asarray(logits, np.float64), labels, True)
    return sides & ~_at_edge(temperature)


def fit_temperature(logits: np.ndarray, labels: np.ndarray, multi_label: bool, own: np.ndarray | None = None):
    """The temperature of least NLL on (logits, labels), within TEMPERATURE_RANGE: a float, or for
    multi-label one per class (np.ndarray), a class not among `own` (own_classes', unless given)
    keeping T = 1 (the module's docstring)."""
    logits = np.asarray(logits, np.float64)
    if not multi_label:
        return float(_search(logits, labels, False)[0])
    temperature = _search(logits, labels, True)
    own = own_classes(logits, labels, True, temperature) if own is None else own
    return np.where(own, temperature, 1.0)


def fit_platt(logits: np.ndarray, labels: np.ndarray, own: np.ndarray) -> Rule:
    """Multi-label: sigmoid(z_c / T_c + b_c) of least NLL for each class of `own` (Newton's method
    on (1 / T_c, b_c), each step halved until the NLL falls; 1 / T_c within TEMPERATURE_RANGE's, so
    that the rule rises with z, and b_c within BIAS_RANGE); the other classes, fit_temperature's."""
    z = np.asarray(logits, np.float64)
    y = (labels >= 0.5).astype(np.float64)
    temperature = np.asarray(fit_temperature(z, labels, True, own), np.float64)
    a, b = 1 / temperature, np.zeros(z.shape[1])
    low, high = 1 / TEMPERATURE_RANGE[1], 1 / TEMPERATURE_RANGE[0]

    def nll(a, b):
        return np.logaddexp(0, -np.where(y > 0, 1.0, -1.0) * (z * a + b)).mean(axis=0)

    current, active = nll(a, b), own.copy()
    for _ in range(FIT_ROUNDS):
        if not active.any():
            break
        p = 1 / (1 + np.exp(-(z * a + b)))
        r, w = p - y, p * (1 - p)
        ga, gb = (r * z).mean(axis=0), r.mean(axis=0)
        haa, hab, hbb = (w * z * z).mean(axis=0) + 1e-12, (w * z).mean(axis=0), w.mean(axis=0) + 1e-12
        det = haa * hbb - hab ** 2
        newton = det > 1e-9 * haa * hbb  # (else the diagonal alone: logits all alike in a class)
        safe = np.where(newton, det, 1.0)
        da = np.where(newton, -(hbb * ga - hab * gb) / safe, -ga / haa)
        db = np.where(newton, -(haa * gb - hab * ga) / safe, -gb / hbb)
        step, settled, before = np.ones_like(a), ~active, current.copy()
        for _ in range(30):
            trial_a, trial_b = np.clip(a + step * da, low, high), np.clip(b + step * db, -BIAS_RANGE, BIAS_RANGE)
            value = nll(trial_a, trial_b)
            better = ~settled & (value < current)
            a, b, current = np.where(better, trial_a, a), np.where(better, trial_b, b), np.where(better, value, current)
            settled |= better
            if settled.all():
                break
            step = np.where(settled, step, step / 2)
        active &= before - current > 1e-12
    # (a class whose fit sharpens as far as it may has almost no errors: it keeps its temperature)
    platt = own & ~_at_edge(1 / a)
    return Rule(PLATT, np.where(platt, 1 / a, temperature), np.where(platt, b, 0.0))


def _at_edge(temperature) -> np.ndarray:
    """At the range's lower end: a fit that sharpens as far as it may, on a set with almost no
    errors. (The upper end is a model whose logits say little: a temperature there helps most.)"""
    return np.isclose(np.asarray(temperature), TEMPERATURE_RANGE[0], rtol=1e-3)


def at_bound(temperature) -> bool:
    """Whether a fit ended at TEMPERATURE_RANGE's lower end (for a multi-label model, any class's:
    a class's own fit never does, own_classes)."""
    return bool(np.any(_at_edge(temperature)))


def _losses(logits: np.ndarray, labels: np.ndarray, multi_label: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each example's NLL (from the logits, exactly) and Brier score: scores' means are theirs."""
    z = np.asarray(logits, np.float64)
    p = tempered(z, 1.0, multi_label)
    if multi_label:
        truth = (labels >= 0.5).astype(np.float64)
        nll = np.logaddexp(0, -np.where(truth > 0, 1.0, -1.0) * z).mean(axis=1)
        return nll, ((p - truth) ** 2).mean(axis=1)
    top = z.max(axis=-1)
    log_sum = top + np.log(np.exp(z - top[:, None]).sum(axis=-1))
    nll = log_sum - z[np.arange(len(labels)), labels]
    return nll, ((p - np.eye(p.shape[1])[labels]) ** 2).sum(axis=-1)


def scores(logits: np.ndarray, labels: np.ndarray, multi_label: bool) -> dict:
    """ECE, NLL, Brier score and the reliability diagram's bins ({confidence, accuracy, examples}
    of each non-empty bin) of the probabilities of `logits` (already calibrated, if they are)
    against `labels` (class ids, or multi-hot rows). The NLL is computed from the logits, exactly
    (as the job's val_loss is): a confident mistake's probability may round to 0 in float32."""
    z = np.asarray(logits, np.float64)
    p = tempered(z, 1.0, multi_label)
    if multi_label:
        confidence, hit = p.reshape(-1), (labels >= 0.5).astype(np.float64).reshape(-1)
    else:
        confidence, hit = p.max(axis=-1), (p.argmax(axis=-1) == labels).astype(np.float64)
    nll, brier = _losses(z, labels, multi_label)
    bins = np.minimum((confidence * ECE_BINS).astype(int), ECE_BINS - 1)
    reliability, ece = [], 0.0
    for b in range(ECE_BINS):
        inside = bins == b
        if inside.any():
            mean_confidence, accuracy = float(confidence[inside].mean()), float(hit[inside].mean())
            ece += inside.sum() / len(confidence) * abs(accuracy - mean_confidence)
            reliability.append({"bin": [b / ECE_BINS, (b + 1) / ECE_BINS], "confidence": mean_confidence,
                                "accuracy": accuracy, "examples": int(inside.sum())})
    return {"ece": float(ece), "nll": float(nll.mean()), "brier": float(brier.mean()), "reliability": reliability}


def per_class_ece(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Multi-label: each class's own ECE (its probability against its presence)."""
    return np.array([scores(logits[:, [c]], labels[:, [c]], True)["ece"] for c in range(labels.shape[1])])


def _halves(examples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(examples)
    return order[: examples // 2], order[examples // 2:]


def cross_fitted(logits: np.ndarray, labels: np.ndarray, seed: int, fit) -> np.ndarray:
    """Out-of-fold calibrated logits: each half's, calibrated by the rule `fit` (logits, labels ->
    Rule) gives on the other half."""
    logits = np.asarray(logits, np.float64)
    out = np.empty(logits.shape, np.float64)
    halves = _halves(len(labels), seed)
    for fitted, scored in (halves, halves[::-1]):
        out[scored] = fit(logits[fitted], labels[fitted]).logits(logits[scored])
    return out


def _fitter(method: str, own: np.ndarray, multi_label: bool):
    """(logits, labels) -> the Rule of `method`, its shape `own` (own_classes') whatever the examples."""
    if method == PLATT:
        return lambda z, y: fit_platt(z, y, own)
    return lambda z, y: Rule(TEMPERATURE, fit_temperature(z, y, multi_label, own if multi_label else None))


def _beats(better: np.ndarray, than: np.ndarray) -> bool:
    """Whether per-example losses `better` are lower than `than` (the same examples) by more than
    SIGNIFICANT standard errors of their mean difference."""
    difference = np.asarray(better) - np.asarray(than)
    spread = difference.std(ddof=1) / np.sqrt(len(difference)) if len(difference) > 1 else np.inf
    return bool(difference.mean() < -SIGNIFICANT * spread)


def fit(logits: np.ndarray, labels: np.ndarray, multi_label: bool, seed: int, own: np.ndarray | None = None
        ) -> tuple[Rule, np.ndarray]:
    """The rule (the module's docstring: a temperature, or with a bias per class where that is
    shown to do better), and every example's cross-fitted logits by the same rule, its shape
    (`own`: own_classes', unless given) decided once."""
    logits = np.asarray(logits, np.float64)
    own = own_classes(logits, labels, multi_label) if own is None else own
    methods = [TEMPERATURE] + ([PLATT] if multi_label and own.any() else [])
    crossed = {method: cross_fitted(logits, labels, seed, _fitter(method, own, multi_label))
               for method in methods}
    method = TEMPERATURE
    if len(methods) > 1:
        (plain_nll, plain_brier), (shifted_nll, shifted_brier) = (_losses(crossed[m], labels, multi_label)
                                                                  for m in methods)
        if _beats(shifted_nll, plain_nll) and _beats(shifted_brier, plain_brier):
            method = methods[1]
    rule = _fitter(method, own, multi_label)(logits, labels)
    if method != TEMPERATURE and at_bound(rule.temperature):  # (refused there: the temperature alone instead)
        method, rule = TEMPERATURE, _fitter(TEMPERATURE, own, multi_label)(logits, labels)
    return rule, crossed[method]


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What was fitted, whether it is applied and why, and the figures before and after."""

    setting: str
    temperature: float | np.ndarray
    applied: bool
    reason: str
    examples: int
    before: dict
    after: dict  # cross-fitted: the rule fitted on the other half on each half's examples
    multi_label: bool
    cut: bool = False  # the pass ended at its time budget or memory bound: a sample of those read
    per_class_ece: dict | None = None  # multi-label: {"before": [...], "after": [...]}
    bias: np.ndarray | None = None  # one per class: z / temperature + bias (None: none)
    method: str = TEMPERATURE
    left_out: int = 0  # examples whose logits were not finite: in neither the fit nor the figures
    # single-label: each class's share of the examples, and its mean probability before and after
    # (cross-fitted): a temperature cannot move a class as a whole, and this shows where one is offset
    class_means: dict | None = None

    @property
    def rule(self) -> Rule:
        return Rule(self.method, self.temperature, self.bias)

    def as_json(self) -> dict:
        t, b = self.temperature, self.bias
        return {"setting": self.setting, "applied": self.applied, "reason": self.reason,
                "temperature": t.tolist() if isinstance(t, np.ndarray) else t,
                **({"bias": np.asarray(b).tolist()} if b is not None else {}), "examples": self.examples,
                "method": f"{self.method}, fitted by NLL on the validation set; after: cross-fitted halves",
                "cut": self.cut, "left_out": self.left_out, "before": self.before, "after": self.after,
                **({"per_class_ece": self.per_class_ece} if self.per_class_ece else {}),
                **({"class_means": self.class_means} if self.class_means else {})}

    @property
    def served(self) -> ServedCalibration | None:
        """The rule the served probabilities' logits go through (None: not applied)."""
        return self.serving(None)

    def serving(self, threshold: float | None) -> ServedCalibration | None:
        """serving.json's calibration (None when it is not applied): the rule, and for a
        multi-label model the calibrated probability at which each class is predicted (its
        threshold on the model's own probability, which decides)."""
        if not self.applied:
            return None
        edges = None
        if threshold is not None:
            edge = np.log(threshold / (1 - threshold)) if 0 < threshold < 1 else np.sign(threshold - 0.5) * np.inf
            edges = tuple(np.atleast_1d(1 / (1 + np.exp(-self.rule.logits(np.atleast_1d(edge))))).tolist())
        return self.rule.served(self.examples, edges)


def calibrate(logits: np.ndarray, labels: np.ndarray, multi_label: bool, setting: str, seed: int,
              cut: bool = False, suspected: np.ndarray | None = None) -> Calibration:
    """Fits the rule, scores it cross-fitted, and decides (`setting`: config.CALIBRATION's)
    whether it is applied. `suspected`: a single-label model's examples the label check suspects
    of a wrong label (a mask; None: not checked), which auto weighs. A ValueError when no example's
    logits are finite."""
    logits, labels = np.asarray(logits, np.float64), np.asarray(labels)
    finite = np.isfinite(logits).all(axis=-1)
    left_out = int((~finite).sum())
    if not finite.any():
        raise ValueError(f"none of the {len(labels)} validation examples' logits are finite (NaN or infinite)")
    logits, labels = logits[finite], labels[finite]
    own = own_classes(logits, labels, multi_label)  # (a search of its own: made once, for the fit and the check)
    if len(labels) < 2:
        rule, after = Rule(TEMPERATURE, fit_temperature(logits, labels, multi_label, own)), logits
    else:
        rule, after = fit(logits, labels, multi_label, seed, own)
    scored_before, scored_after = scores(logits, labels, multi_label), scores(after, labels, multi_label)
    if multi_label and setting != "false" and not own.any():
        applied, reason = False, (f"calibration={setting}: no class has {MIN_CLASS_SIDE} positives and "
                                  f"{MIN_CLASS_SIDE} negatives among the {len(labels)} validation examples, with "
                                  "errors to fit on: each keeps the model's own probabilities")
    else:
        applied, reason = _decided(setting, rule, len(labels), scored_before, scored_after)
    if applied and setting == "auto" and suspected is not None and not multi_label:
        applied, reason = _unsuspected(rule, logits, labels, np.asarray(suspected, bool)[finite], reason)
    if left_out:
        reason += (f" ({left_out:,} example{'s' if left_out > 1 else ''} whose logits are not finite left out of "
                   "the fit and the figures)")
    classes, means = None, None
    if multi_label:
        classes = {"before": per_class_ece(logits, labels).tolist(), "after": per_class_ece(after, labels).tolist()}
    else:
        width = logits.shape[-1]
        means = {"share": (np.bincount(labels.astype(np.int64), minlength=width)[:width] / len(labels)).tolist(),
                 "before": tempered(logits, 1.0, False).mean(axis=0).tolist(),
                 "after": tempered(after, 1.0, False).mean(axis=0).tolist()}
    return Calibration(setting, rule.temperature, applied, reason, len(labels), scored_before, scored_after,
                       multi_label, cut, classes, rule.bias, rule.method, left_out, means)


def _unsuspected(rule: Rule, logits: np.ndarray, labels: np.ndarray, suspected: np.ndarray,
                 reason: str) -> tuple[bool, str]:
    """auto's last condition (the module's docstring): not a temperature that softens a model right
    on UNSUSPECTED_RIGHT of the images the label check does not suspect, SUSPECTED_SHARE of them
    suspected or more."""
    share = suspected.mean() if len(suspected) else 0.0
    others = ~suspected
    right = float((logits[others].argmax(axis=-1) == labels[others]).mean()) if others.any() else 0.0
    if float(np.max(rule.temperature)) <= 1 or share < SUSPECTED_SHARE or right < UNSUSPECTED_RIGHT:
        return True, reason
    return False, (f"calibration=auto: the label check suspects {int(suspected.sum())} of the {len(suspected)} "
                   f"validation labels the fit was made on, and the model is right on {right:.1%} of the others: if "
                   f"those labels are wrong, the temperature {float(np.max(rule.temperature)):.3g} would soften every "
                   "answer to pay for them, so it is not applied (label_errors.csv names them; if they are right, "
                   "the model's confident mistakes, calibration=true applies it)")


def _decided(setting: str, rule: Rule, examples: int, before: dict, after: dict) -> tuple[bool, str]:
    """Whether the rule is applied, and why (the module's docstring)."""
    if setting == "false":
        return False, "calibration=false"
    if at_bound(rule.temperature):
        return False, (f"calibration={setting}: the fit reached the temperature's lower bound {TEMPERATURE_RANGE[0]} "
                       "(a validation set with almost no errors): not applied, it would sharpen every answer to 0 or 1")
    if setting == "true":
        return True, "calibration=true"
    if examples < MIN_EXAMPLES:
        return False, f"calibration=auto: {examples} validation examples, fewer than {MIN_EXAMPLES}"
    nll, brier = after["nll"] < before["nll"], after["brier"] < before["brier"]
    if nll and brier and after["ece"] <= before["ece"]:
        return True, "calibration=auto: the cross-fitted NLL and Brier score are both lower with it, the ECE no higher"
    if nll and brier:
        return False, "calibration=auto: the cross-fitted ECE is higher with it"
    worse = " and ".join(name for name, lower in (("NLL", nll), ("Brier score", brier)) if not lower)
    return False, f"calibration=auto: the cross-fitted {worse} {'are' if ' and ' in worse else 'is'} no lower with it"
