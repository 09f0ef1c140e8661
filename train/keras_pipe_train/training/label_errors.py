"""The labels to fix first: confident learning (Northcutt, Jiang and Chuang, "Confident Learning:
Estimating Uncertainty in Dataset Labels", JAIR 2021) on out-of-sample predicted probabilities.

Out of sample is the point: a model's probabilities for the examples it trained on have learnt
their labels, wrong ones included. The validation images' are out of sample already (the model
exported never trained on them). The training images' come from cross-validation made cheap: the
features of the backbone the job started from are computed once, in one pass over the training
channel, and K logistic-regression heads are fitted on them, each on K-1 folds, each predicting
the fold it did not see (`out_of_fold`). K heads on fixed features cost a fraction of one training
where K fine-tunings would cost K trainings (seconds on the digits; their full-batch steps grow
with images x feature width x classes: hence a deadline and the stop request, looked at every
HEAD_CHUNK steps, which end them with `Cut`).

The method (`find`), as cleanlab's find_label_issues(filter_by="low_self_confidence"):
  1. each class's threshold: the mean probability of that class over the examples labelled it;
  2. the confident joint: each example counts for (its given label, the class at or above its
     threshold, the likeliest of them when several are), when there is one; the examples off its
     diagonal (less those whose given label is as likely as any) estimate how many labels are
     wrong (cleanlab's num_label_issues);
  3. that many examples, of the lowest probability of their given label, are the suspects, the
     least likely first; each one's likely label is its likeliest other class.
On the digits this has a higher precision than the paper's "prune by noise rate" (cleanlab's
default, which removes, of the examples labelled i, the estimated count of those truly j with the
largest margin p_j - p_i) on the same out-of-fold probabilities, at about the same recall
(bench/label_errors.py; docs/speed.md, Label errors and calibration, and Figures behind the
code's choices: Label errors).

cleanlab is the reference implementation, and bench/label_errors.py measures this one beside it
on the same probabilities (the same suspects but for rounding at the threshold's edge). Its
license would fit the image: cleanlab 2.9.0, the version the benchmark pins, is Apache-2.0 (its
wheel's LICENSE; GPL-3.0 at 1.0, AGPL-3.0 from 1.0.1 through 2.7.1, Apache-2.0 since 2.8.0). It is still not in the
image: what it would bring with it (pandas, scikit-learn and SciPy, about 280 MB installed) is
far more than the 30 lines of numpy used here.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import tensorflow as tf

log = logging.getLogger(__name__)

MIN_THRESHOLD = 2e-6  # cleanlab's lower bound of a class's threshold
HEAD_STEPS = 300  # full-batch steps of each fold's logistic regression (L-BFGS-free: Adam, on standardised features)
HEAD_L2 = 1e-3  # the heads' weight penalty: features outnumber a small dataset's examples
HEAD_CHUNK = 50  # steps between looks at the deadline and the stop request


class Cut(Exception):
    """The heads were ended before they were done: by their deadline (BY_TIME), or a stop request
    (BY_STOP)."""


BY_TIME, BY_STOP = "their time budget", "a stop request"


@dataclasses.dataclass(frozen=True)
class Suspects:
    """The examples whose labels are likely wrong: their indices (into the probabilities given),
    the class each is likely to be, and the probabilities of both; the given label least likely first."""

    indices: np.ndarray
    likely: np.ndarray
    given_probability: np.ndarray
    likely_probability: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)


TOLERANCE = 1e-6  # cleanlab's, where probabilities are compared with thresholds and with each other


def find(probabilities: np.ndarray, labels: np.ndarray) -> Suspects:
    """The likely label errors among examples with out-of-sample `probabilities` ([n, classes])
    and given `labels` (class ids)."""
    p = np.asarray(probabilities, np.float64)
    labels = np.asarray(labels, np.int64)
    n, classes = p.shape
    rows = np.arange(n)
    given = p[rows, labels]
    # 1. each class's threshold (a class no example is labelled: never confidently it)
    present = np.bincount(labels, minlength=classes) > 0
    thresholds = np.array([max(p[labels == c, c].mean(), MIN_THRESHOLD) if present[c] else 2.0
                           for c in range(classes)])
    # 2. the confident joint's off-diagonal: examples confidently another class (with several
    # classes over their thresholds, the likeliest), less those whose given label is as likely as any
    confident = p >= thresholds - TOLERANCE
    number = confident.sum(axis=1)
    guess = np.where(number > 1, p.argmax(axis=1), confident.argmax(axis=1))
    off = (number > 0) & (guess != labels) & (given + TOLERANCE < p.max(axis=1))
    # 3. as many examples as that, of the lowest given-label probability
    order = np.argsort(given, kind="stable")[: int(off.sum())]
    others = p[order].copy()
    others[np.arange(len(order)), labels[order]] = -np.inf
    likely = others.argmax(axis=1)
    return Suspects(order, likely, given[order], p[order, likely])


def of_classes_with(found: Suspects, labels: np.ndarray, least: int) -> tuple[Suspects, int]:
    """The suspects labelled a class with at least `least` examples, and how many were not: with
    fewer examples than folds, a class's examples are held out while the head has seen few or none
    of that class, and are suspected for it, right or wrong."""
    counts = np.bincount(np.asarray(labels, np.int64))
    keep = counts[np.asarray(labels, np.int64)[found.indices]] >= least
    kept = Suspects(found.indices[keep], found.likely[keep], found.given_probability[keep],
                    found.likely_probability[keep])
    return kept, int((~keep).sum())


def folds_of(labels: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Each example's fold, stratified: each class's examples dealt round the folds in a seeded
    order, each class going on from the fold where the one before stopped (the folds' sizes then
    differ by one at most)."""
    rng = np.random.default_rng(seed)
    fold = np.empty(len(labels), np.int64)
    dealt = 0
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        fold[rng.permutation(members)] = (dealt + np.arange(len(members))) % folds
        dealt += len(members)
    return fold


def out_of_fold(features: np.ndarray, labels: np.ndarray, classes: int, folds: int, seed: int, *,
                stop=None, deadline: float | None = None) -> np.ndarray:
    """Each example's probabilities from a logistic-regression head fitted on the other folds.
    Raises Cut once `stop` (a threading.Event) is set or time.monotonic() passes `deadline`."""
    fold = folds_of(labels, folds, seed)
    out = np.zeros((len(labels), classes), np.float32)
    for k in range(folds):
        held = fold == k
        if not held.any() or held.all():
            continue
        out[held] = _head_probabilities(features[~held], labels[~held], features[held], classes, seed + k,
                                        stop, deadline)
    return out


def _head_probabilities(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, classes: int,
                        seed: int, stop=None, deadline: float | None = None) -> np.ndarray:
    """A softmax regression fitted on (train_x, train_y) by full-batch Adam on standardised
    features, with an L2 penalty; its probabilities for test_x. Cut: out_of_fold's."""
    mean, spread = train_x.mean(axis=0), train_x.std(axis=0)
    # (a feature constant in the folds fitted on, zero after a ReLU say, is left unscaled: divided by
    # its spread of ~0 it would reach the held-out fold a million times larger, one-hot and wrong)
    scale = np.where(spread > 1e-6, spread, 1.0)
    x = tf.constant((train_x - mean) / scale, tf.float32)
    kernel = tf.random.stateless_normal([x.shape[1], classes], [seed, 0], stddev=0.01)
    bias = tf.zeros([classes])
    # (Adam's step count, kernel, bias, and its moments)
    state = (tf.constant(1.0), kernel, bias, tf.zeros_like(kernel), tf.zeros_like(bias), tf.zeros_like(kernel),
             tf.zeros_like(bias))
    y = tf.constant(train_y, tf.int64)
    for done in range(0, HEAD_STEPS, HEAD_CHUNK):
        if stop is not None and stop.is_set():
            raise Cut(BY_STOP)
        if deadline is not None and time.monotonic() > deadline:
            raise Cut(BY_TIME)
        state = _fit_head(x, y, state, tf.constant(float(min(done + HEAD_CHUNK, HEAD_STEPS))))
    test = tf.constant((test_x - mean) / scale, tf.float32)
    return tf.nn.softmax(tf.matmul(test, state[1]) + state[2]).numpy()


@tf.function(reduce_retracing=True)
def _fit_head(x, y, state, last):
    """Adam (rate 0.01) on the mean cross-entropy plus HEAD_L2 x |kernel|^2, from `state` (step
    count, kernel, bias, moments) up to step `last`: the state then. Written out with tensors
    alone, so that one traced function serves every fold and chunk."""

    def step(t, kernel, bias, m_k, m_b, v_k, v_b):
        with tf.GradientTape() as tape:
            tape.watch([kernel, bias])
            logits = tf.matmul(x, kernel) + bias
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
            loss += HEAD_L2 * tf.reduce_sum(tf.square(kernel))
        g_k, g_b = tape.gradient(loss, [kernel, bias])
        m_k, m_b = 0.9 * m_k + 0.1 * g_k, 0.9 * m_b + 0.1 * g_b
        v_k, v_b = 0.999 * v_k + 0.001 * g_k ** 2, 0.999 * v_b + 0.001 * g_b ** 2
        rate = 0.01 * tf.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        kernel -= rate * m_k / (tf.sqrt(v_k) + 1e-7)
        bias -= rate * m_b / (tf.sqrt(v_b) + 1e-7)
        return t + 1, kernel, bias, m_k, m_b, v_k, v_b

    return tuple(tf.while_loop(lambda t, *_: t <= last, step, list(state)))
