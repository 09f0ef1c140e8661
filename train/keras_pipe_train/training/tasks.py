"""What is learnt from the labels: one class per image (softmax, cross-entropy, accuracy) or any
number of them (multi_label: a sigmoid per class, binary cross-entropy, precision, recall, F1 and
AUC). Each task says how a replica's batch turns into its loss, and into counts: sums over the
batch's examples that the loop adds up on the device over a whole pass (and across replicas and
hosts) before the host turns them into the epoch's metrics. Sums, never means: a pass's metrics
are then exact whatever its batches, replicas and steps per call.
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf

AUC_BINS = 200  # thresholds of the AUC's histogram of probabilities (Keras' AUC default: 200)
POSITIVE_WEIGHT_RANGE = (0.01, 100.0)  # use_weighted_loss: the bounds of a class's positive weight


BALANCED_WEIGHT_RANGE = (0.01, 100.0)  # class_weights=balanced: the bounds of a class's weight
MAX_CONFUSION_CLASSES = 256  # the final evaluation's confusion matrix: 65,536 counts summed at each step


@dataclasses.dataclass
class SingleLabel:
    """Softmax over the classes; labels are class ids (int64, [batch]). With class_weights=
    "balanced", each example weighs examples / (classes x examples of its class) (scikit-learn's
    "balanced"), as counted over every training example seen so far (in Pipe mode the counts are
    known only as the data streams by), bounded by BALANCED_WEIGHT_RANGE; the counts are variables
    that checkpoints hold (`state`)."""

    num_classes: int
    label_smoothing: float = 0.0
    class_weights: tuple[float, ...] | str | None = None  # per label: the weight of its examples' losses
    top_k: int | None = None  # also count the examples whose label is among the k most likely

    activation = "softmax"
    state = None  # (variables of its own: class_weights=balanced's counts)

    def build(self) -> None:
        """Makes the task's variables (in the strategy's scope: mirrored like the model's weights)."""
        if self.class_weights == "balanced":
            self.state = _counts(self.num_classes)

    def blank_labels(self, labels: tf.Tensor) -> tf.Tensor:
        return tf.zeros([1], labels.dtype)

    def observe(self, labels: tf.Tensor, examples: tf.Tensor, context) -> None:
        """What training learns of the labels before the step's loss: their counts, when balanced."""
        if self.state is not None:
            per_class = tf.math.bincount(tf.cast(labels, tf.int32), minlength=self.num_classes,
                                         maxlength=self.num_classes, dtype=tf.float64)
            batch = tf.concat([per_class, [tf.cast(examples, tf.float64)]], 0)
            self.state.seen.assign_add(context.all_reduce("sum", batch))

    def _weights(self) -> tf.Tensor:
        if self.state is None:
            return tf.constant(self.class_weights, tf.float32)
        seen = self.state.seen
        balanced = seen[-1] / (self.num_classes * tf.maximum(seen[:-1], 1.0))
        return tf.cast(tf.clip_by_value(balanced, *BALANCED_WEIGHT_RANGE), tf.float32)

    def per_example_loss(self, train: bool, labels: tf.Tensor, probabilities: tf.Tensor) -> tf.Tensor:
        """Cross-entropy; in training, against smoothed labels and weighted by class when asked.
        Validation's loss stays the plain cross-entropy, comparable between recipes (and what early
        stopping watches)."""
        smoothing = self.label_smoothing if train else 0.0
        if smoothing:
            targets = tf.one_hot(labels, tf.shape(probabilities)[-1], dtype=probabilities.dtype)
            per_example = keras.losses.categorical_crossentropy(targets, probabilities, label_smoothing=smoothing)
        else:
            per_example = keras.losses.sparse_categorical_crossentropy(labels, probabilities)
        if train and self.class_weights is not None:
            per_example = per_example * tf.cast(tf.gather(self._weights(), labels), per_example.dtype)
        return per_example

    def counts(self, labels: tf.Tensor, probabilities: tf.Tensor) -> tf.Tensor:
        """[correct, in top k] over the batch (float32)."""
        predicted = tf.argmax(probabilities, axis=-1, output_type=labels.dtype)
        correct = tf.reduce_sum(tf.cast(tf.equal(predicted, labels), tf.float32))
        in_top_k = tf.constant(0.0)
        if self.top_k:
            hits = tf.math.in_top_k(labels, tf.cast(probabilities, tf.float32), self.top_k)
            in_top_k = tf.reduce_sum(tf.cast(hits, tf.float32))
        return tf.stack([correct, in_top_k])

    @property
    def width(self) -> int:
        return 2

    def metrics(self, prefix: str, examples: float, counts: np.ndarray) -> dict:
        n = examples or float("nan")
        means = {f"{prefix}accuracy": counts[0] / n}
        if self.top_k:
            means[f"{prefix}top_k_accuracy"] = counts[1] / n
        return means

    @property
    def confused(self) -> bool:
        """Whether the detail counts hold the confusion matrix (not for very many classes: it is
        summed over the replicas at every step)."""
        return self.num_classes <= MAX_CONFUSION_CLASSES

    @property
    def detail_width(self) -> int:
        return 3 * self.num_classes + (self.num_classes ** 2 if self.confused else 0)

    def detail_counts(self, labels: tf.Tensor, probabilities: tf.Tensor) -> tf.Tensor:
        """[true positives, false positives, false negatives of each class, then the confusion
        matrix (rows: the true class, columns: the predicted one) flattened, up to
        MAX_CONFUSION_CLASSES classes]."""
        predicted = tf.argmax(probabilities, axis=-1, output_type=labels.dtype)
        said, truth = tf.one_hot(predicted, self.num_classes), tf.one_hot(labels, self.num_classes)
        counts = [tf.reduce_sum(said * truth, 0), tf.reduce_sum(said * (1 - truth), 0),
                  tf.reduce_sum((1 - said) * truth, 0)]
        if self.confused:
            counts.append(tf.reshape(tf.math.confusion_matrix(labels, predicted, self.num_classes, dtype=tf.float32),
                                     [-1]))
        return tf.concat(counts, 0)

    def per_class(self, detail: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(true positives, false positives, false negatives) per class, from detail_counts()'s sums."""
        c = self.num_classes
        return detail[:c], detail[c:2 * c], detail[2 * c:3 * c]


class MultiLabel:
    """A sigmoid per class; labels are multi-hot rows (float32, [batch, classes]), each class's
    probability judged against `threshold` for the counts. With `weighted` (MXNet's
    use_weighted_loss), each class's positive examples weigh (negatives / positives) of that class
    as counted over every training example seen so far, bounded by POSITIVE_WEIGHT_RANGE: a rare
    class's few positives then count as much as its many negatives. The counts are variables that
    checkpoints hold (`state`), so a resumed job weighs as an uninterrupted one."""

    activation = "sigmoid"

    def __init__(self, num_classes: int, threshold: float = 0.5, label_smoothing: float = 0.0,
                 class_weights: tuple[float, ...] | None = None, weighted: bool = False):
        self.num_classes, self.threshold, self.label_smoothing = num_classes, threshold, label_smoothing
        self.class_weights, self.weighted = class_weights, weighted
        self.state: tf.Module | None = None

    def build(self) -> None:
        """Makes the label counts (in the strategy's scope: mirrored like the model's weights)."""
        if self.weighted:
            self.state = _counts(self.num_classes)

    def blank_labels(self, labels: tf.Tensor) -> tf.Tensor:
        return tf.zeros([1, self.num_classes], labels.dtype)

    def observe(self, labels: tf.Tensor, examples: tf.Tensor, context) -> None:
        if self.state is not None:
            positives = tf.reduce_sum(tf.cast(labels >= 0.5, tf.float64), 0)
            batch = tf.concat([positives, [tf.cast(examples, tf.float64)]], 0)
            self.state.seen.assign_add(context.all_reduce("sum", batch))

    def positive_weights(self) -> tf.Tensor:
        seen = self.state.seen
        positives, examples = seen[:-1], seen[-1]
        weights = tf.clip_by_value((examples - positives) / tf.maximum(positives, 1.0), *POSITIVE_WEIGHT_RANGE)
        return tf.cast(weights, tf.float32)

    def per_example_loss(self, train: bool, labels: tf.Tensor, probabilities: tf.Tensor) -> tf.Tensor:
        """The mean over the classes of each class's binary cross-entropy; in training, with smoothed
        labels, positive weights (use_weighted_loss) and class weights when asked."""
        labels = tf.cast(labels, probabilities.dtype)
        targets = labels
        if train and self.label_smoothing:
            targets = labels * (1 - self.label_smoothing) + 0.5 * self.label_smoothing
        p = tf.clip_by_value(probabilities, keras.config.epsilon(), 1 - keras.config.epsilon())
        positive, negative = -targets * tf.math.log(p), -(1 - targets) * tf.math.log(1 - p)
        if train and self.state is not None:
            positive = positive * tf.cast(self.positive_weights(), positive.dtype)
        per_class = positive + negative
        if train and self.class_weights is not None:
            per_class = per_class * tf.constant(self.class_weights, per_class.dtype)
        return tf.reduce_mean(per_class, axis=-1)

    @property
    def width(self) -> int:
        return 1 + 3 * self.num_classes + 2 * AUC_BINS

    def counts(self, labels: tf.Tensor, probabilities: tf.Tensor) -> tf.Tensor:
        """[exact matches, true positives per class, false positives per class, false negatives per
        class, positives per probability bin, negatives per probability bin] over the batch."""
        probabilities = tf.cast(probabilities, tf.float32)
        truth = tf.cast(labels >= 0.5, tf.float32)
        predicted = tf.cast(probabilities >= self.threshold, tf.float32)
        exact = tf.reduce_sum(tf.cast(tf.reduce_all(tf.equal(predicted, truth), axis=-1), tf.float32))
        true_positives = tf.reduce_sum(predicted * truth, 0)
        false_positives = tf.reduce_sum(predicted * (1 - truth), 0)
        false_negatives = tf.reduce_sum((1 - predicted) * truth, 0)
        bins = tf.reshape(tf.clip_by_value(tf.cast(probabilities * AUC_BINS, tf.int32), 0, AUC_BINS - 1), [-1])
        flat_truth = tf.reshape(truth, [-1])
        positives = tf.math.unsorted_segment_sum(flat_truth, bins, AUC_BINS)
        negatives = tf.math.unsorted_segment_sum(1 - flat_truth, bins, AUC_BINS)
        return tf.concat([[exact], true_positives, false_positives, false_negatives, positives, negatives], 0)

    def metrics(self, prefix: str, examples: float, counts: np.ndarray) -> dict:
        c = self.num_classes
        exact = counts[0]
        tp, fp, fn = counts[1:1 + c], counts[1 + c:1 + 2 * c], counts[1 + 2 * c:1 + 3 * c]
        positives, negatives = counts[1 + 3 * c:1 + 3 * c + AUC_BINS], counts[1 + 3 * c + AUC_BINS:]
        # accuracy as the built-in MXNet algorithm logs it for multi_label ("average accuracy across all
        # classes"): each class's share of images it got right, present or absent, averaged over the
        # classes (as Keras' BinaryAccuracy); the share of images with every class right is exact_match
        wrong = float(fp.sum() + fn.sum())
        values = {"accuracy": 1 - wrong / (examples * c) if examples else float("nan"),
                  "exact_match": exact / (examples or float("nan")),
                  **averaged(tp, fp, fn), "auc": auc(positives, negatives)}
        return {f"{prefix}{name}": value for name, value in values.items()}

    def per_class(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(true positives, false positives, false negatives) per class, from counts()'s sums."""
        c = self.num_classes
        return counts[1:1 + c], counts[1 + c:1 + 2 * c], counts[1 + 2 * c:1 + 3 * c]

    detail_width = 0  # (per_class gives all an evaluation reports)

    def detail_counts(self, labels: tf.Tensor, probabilities: tf.Tensor) -> tf.Tensor:
        return tf.zeros([0])


def _counts(num_classes: int) -> tf.Module:
    """[examples of (or positives for) each class..., examples]: the same on every replica, since
    each step adds all-reduced sums. Float64: float32 stops counting single examples at 2^24."""
    state = tf.Module(name="label_counts")
    state.seen = tf.Variable(tf.zeros([num_classes + 1], tf.float64), trainable=False, name="seen",
                             aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    return state


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def averaged(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> dict:
    """Precision, recall and F1, micro (from the counts summed over the classes) and macro (the
    mean of each class's, over the classes that occur in the labels or the predictions: a class
    neither present nor predicted has no precision to average)."""
    occurring = (tp + fp + fn) > 0
    per_class = {
        "precision": [ratio(t, t + f) if t + f else 0.0 for t, f in zip(tp[occurring], fp[occurring])],
        "recall": [ratio(t, t + f) if t + f else 0.0 for t, f in zip(tp[occurring], fn[occurring])],
        "f1": [ratio(2 * t, 2 * t + p + n) for t, p, n in zip(tp[occurring], fp[occurring], fn[occurring])],
    }
    total_tp, total_fp, total_fn = tp.sum(), fp.sum(), fn.sum()
    micro = {"precision": ratio(total_tp, total_tp + total_fp), "recall": ratio(total_tp, total_tp + total_fn),
             "f1": ratio(2 * total_tp, 2 * total_tp + total_fp + total_fn)}
    out = {}
    for name in ("precision", "recall", "f1"):
        out[f"{name}_micro"] = float(micro[name])
        out[f"{name}_macro"] = float(np.mean(per_class[name])) if per_class[name] else float("nan")
    return out


def auc(positives: np.ndarray, negatives: np.ndarray) -> float:
    """The area under the ROC curve from histograms of the probabilities of positive and of
    negative (example, class) pairs over [0, 1], all classes pooled (micro, as Keras' AUC by
    default); each bin's pairs are ranked as ties (the trapezoid between its ends)."""
    total_positive, total_negative = positives.sum(), negatives.sum()
    if not (total_positive and total_negative):
        return float("nan")
    # thresholds from high to low: the rates of pairs at or above each bin's lower edge
    tpr = np.concatenate([[0.0], np.cumsum(positives[::-1]) / total_positive])
    fpr = np.concatenate([[0.0], np.cumsum(negatives[::-1]) / total_negative])
    area = float(np.sum((fpr[1:] - fpr[:-1]) * (tpr[1:] + tpr[:-1]) / 2))
    return area if math.isfinite(area) else float("nan")
