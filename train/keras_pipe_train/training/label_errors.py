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
  0. the classes judged: those with MIN_CLASS_EXAMPLES examples at least, whose probability ranks
     their own examples above the others' with an AUC of TOLD_APART or more (the model tells them
     apart), and two of them at least; the others are left out before anything is counted
     (below), as are examples whose probabilities are not finite numbers (Suspects.unreadable);
  1. each judged class's threshold: the mean probability of that class over the examples labelled it;
  2. the confident joint: each example of a judged class counts for (its given label, the judged
     class at or above its threshold, the likeliest of them when several are), when there is one;
     the examples off its diagonal (less those whose given label is as likely as any) estimate
     how many labels are wrong (cleanlab's num_label_issues);
  3. that many examples of judged classes, of the lowest probability of their given label, are
     the suspects, the least likely first (cleanlab's order, ties included: its np.argsort's);
     each one's likely label is its likeliest other class.
Why step 0: a class of a few examples, or one the model has not learnt (a handful of images filed
under a class of their own, a class made of mistakes), has a threshold so low that about half of
every other class's examples count as confidently it. On 900 images of 6 classes with 5 % of the
labels flipped, one image filed under a seventh class took the suspects' precision down by 0.17 on
average (0.45 at worst), and a seventh class of 10 to 40 mislabelled images by 0.10 to 0.12, on
both the training set's out-of-fold probabilities and a model's held-out ones; judging only classes
of 5 examples or more, above chance, kept every such change within 0.07 (0.04 on average), and
left the precision and recall of the set without such a class as they were (measured with chance
as the bar, which TOLD_APART replaced: tests/job/training/test_label_errors.py holds it to 0.1,
for such classes of 1 to 20 examples over several seeds). The examples not
judged are counted (Suspects.unjudged) and said in the report. With every class judged, the
suspects are cleanlab's exactly.
bench/label_errors.py measures these suspects beside cleanlab's default ("prune by noise rate",
which removes, of the examples labelled i, the estimated count of those truly j with the largest
margin p_j - p_i) on the same out-of-fold probabilities.

cleanlab is the reference implementation, and the tests hold this one to it on the same
probabilities (tests/job/training/test_label_errors.py). Its
license would fit the image: cleanlab 2.9.0, the version the benchmark pins, is Apache-2.0 (its
wheel's LICENSE; GPL-3.0 at 1.0, AGPL-3.0 from 1.0.1 through 2.7.1, Apache-2.0 since 2.8.0). It is still not in the
image: what it would bring with it (pandas, scikit-learn and SciPy, about 280 MB installed) is
far more than the 30 lines of numpy used here.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time

import numpy as np
import tensorflow as tf

from keras_pipe_train.settings.tracing import traced

log = logging.getLogger(__name__)

MIN_THRESHOLD = 2e-6  # cleanlab's lower bound of a class's threshold
MIN_CLASS_EXAMPLES = 5  # examples a class needs to be judged (find; the module's docstring says why)
# (a class the model has not learnt ranks its own examples by its probability no higher than the
# others' (an AUC near 0.5); a learnt one, far higher, however rare or common. Chance, 1 / classes,
# was the bar before: in two classes of 180 and 20 images, the rare one's own 0.44 was under it, so
# neither class was judged, and none of either's errors found. Then the odds of the means, twice
# the others': one or two outliers carried an unlearnable class of 5-10 examples over it in 3 of
# 16 trials, and its suspects' precision fell by up to 0.18; by rank, none was)
TOLD_APART = 0.8  # the least AUC of a class's probability, its own examples against the others
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
    the class each is likely to be, and the probabilities of both; the given label least likely first.
    `unjudged`: how many examples were not judged, and `unjudged_classes` their classes (find);
    `unreadable`: how many were left out as their probabilities are not all finite (a NaN or an
    infinite logit), counted among neither."""

    indices: np.ndarray
    likely: np.ndarray
    given_probability: np.ndarray
    likely_probability: np.ndarray
    unjudged: int = 0
    unjudged_classes: tuple[int, ...] = ()
    unreadable: int = 0

    def __len__(self) -> int:
        return len(self.indices)


TOLERANCE = 1e-6  # cleanlab's, where probabilities are compared with thresholds and with each other


def find(probabilities: np.ndarray, labels: np.ndarray, least: int = MIN_CLASS_EXAMPLES) -> Suspects:
    """The likely label errors among examples with out-of-sample `probabilities` ([n, classes])
    and given `labels` (class ids); the classes judged: those with `least` examples or more that the
    probabilities tell apart (the module's step 0). The comparisons are made as cleanlab's are, in the probabilities'
    own floating type (float32 sums round otherwise than float64 at a threshold's edge)."""
    p = np.asarray(probabilities)
    if not np.issubdtype(p.dtype, np.floating):
        p = p.astype(np.float64)
    labels = np.asarray(labels, np.int64)
    finite = np.isfinite(p).all(axis=1)
    if finite.all():
        return suspects_of(p, labels, judged_classes(p, labels, least))
    # (one NaN row would make its class's mean NaN, and so the class never judged: left out, and said)
    kept = np.flatnonzero(finite)
    found = suspects_of(p[kept], labels[kept], judged_classes(p[kept], labels[kept], least))
    return dataclasses.replace(found, indices=kept[found.indices], unreadable=int(len(p) - len(kept)))


def judged_classes(p: np.ndarray, labels: np.ndarray, least: int) -> np.ndarray:
    """Which classes `find` judges (a mask): `least` examples or more, whose probability ranks
    their own examples above the others' with an AUC of TOLD_APART at least (by rank: a common class
    given 0.94 against 0.55 is told apart as a rare one at 0.45 against 0.06 is, and a few outliers
    move it little); none when fewer than two are (one class alone has no other to be confused
    with)."""
    classes = p.shape[1]
    counts = np.bincount(labels, minlength=classes)
    judged = np.zeros(classes, bool)
    for c in np.flatnonzero(counts >= max(least, 1)):
        mine = labels == c
        if not mine.all():
            judged[c] = auc(p[:, c], mine) >= TOLD_APART
    return judged if judged.sum() >= 2 else np.zeros(classes, bool)


def auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """The area under the ROC curve of `scores` for the `positive` examples (a mask) against the
    others: the chance that one of them scores above one of the others, ties counting half (the
    Mann-Whitney statistic, from the scores' average ranks)."""
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]
    n1 = int(positive.sum())
    n0 = len(scores) - n1
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def suspects_of(p: np.ndarray, labels: np.ndarray, judged: np.ndarray) -> Suspects:
    """find's suspects, the classes `judged` (a mask) alone judged: cleanlab's, to the order of
    ties, where every class is."""
    n, classes = p.shape
    rows = np.arange(n)
    given = p[rows, labels]
    counted = judged[labels]
    # 1. each judged class's threshold (a class not judged, or no example is labelled: never confidently it)
    thresholds = np.clip([p[labels == c, c].mean() if judged[c] else 2.0 for c in range(classes)],
                         MIN_THRESHOLD, None)
    # 2. the confident joint's off-diagonal: examples confidently another class (with several
    # classes over their thresholds, the likeliest), less those whose given label is as likely as any
    # (cleanlab's _reduce_issues: the argmax once the given label's probability is raised by TOLERANCE)
    confident = p >= thresholds - TOLERANCE
    number = confident.sum(axis=1)
    guess = np.where(number > 1, p.argmax(axis=1), confident.argmax(axis=1))
    raised = p.copy()
    raised[rows, labels] += TOLERANCE
    off = counted & (number > 0) & (guess != labels) & (raised.argmax(axis=1) != labels)
    # 3. as many examples as that, of the lowest given-label probability: chosen and then ranked as
    # cleanlab's find_label_issues(..., return_indices_ranked_by="self_confidence") does
    candidates = np.flatnonzero(counted)
    chosen = np.sort(candidates[np.argsort(given[candidates])[: int(off.sum())]])
    order = chosen[np.argsort(given[chosen])]
    others = p[order].astype(np.float64)
    others[np.arange(len(order)), labels[order]] = -np.inf
    likely = others.argmax(axis=1)
    present = np.bincount(labels, minlength=classes) > 0
    return Suspects(order, likely, given[order].astype(np.float64), p[order, likely].astype(np.float64),
                    int((~counted).sum()), tuple(np.flatnonzero(present & ~judged).tolist()))


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


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """The heads' predictions (out_of_fold): each example's probabilities from the head that did
    not see it, and the heads' accuracy on the examples they held out, against the labels given (a
    share: with few labels wrong, the best guide to how many suspects are real; near chance, the
    features do not tell the classes apart and the suspects mean little)."""

    probabilities: np.ndarray
    accuracy: float


def out_of_fold(features: np.ndarray, labels: np.ndarray, classes: int, folds: int, seed: int, *,
                stop=None, deadline: float | None = None) -> HeldOut:
    """Each example's probabilities from a logistic-regression head fitted on the other folds, and
    the heads' held-out accuracy. Raises Cut once `stop` (a threading.Event) is set or
    time.monotonic() passes `deadline`."""
    fold = folds_of(labels, folds, seed)
    out = np.zeros((len(labels), classes), np.float32)
    predicted = np.zeros(len(labels), bool)
    for k in range(folds):
        held = fold == k
        if not held.any() or held.all():
            continue
        out[held] = _head_probabilities(features[~held], labels[~held], features[held], classes, seed + k,
                                        stop, deadline)
        predicted |= held
    right = out[predicted].argmax(axis=1) == np.asarray(labels)[predicted]
    return HeldOut(out, float(right.mean()) if predicted.any() else float("nan"))


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


@functools.partial(traced, reduce_retracing=True)
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
