"""Early stopping: when a phase stops improving, it ends, and its best epoch's weights are kept.
export_epoch=best without early stopping keeps them the same way, under a rule that never stops.

The decision is made from the metric rows of the epochs done (metrics.json's rows, which every
checkpoint keeps), never from state held elsewhere: a job resumed from a checkpoint, or one host of
several, reaches the same decision at the same epoch. (Every host computes the same validation
metrics: their sums are all-reduced across hosts before any host reads them.) The best epoch's
weights are copied into variables that checkpoints hold beside the model's.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import keras
import tensorflow as tf

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.training.phases import Phase

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Verdict:
    best_epoch: int  # 1-based, as the rows number them
    best: float
    improved: bool  # the last epoch is the new best
    stop: bool  # the phase ends after the last epoch
    epochs_without_improvement: int


@dataclasses.dataclass(frozen=True)
class Rule:
    metric: str  # a row's key: val_loss (lower is better) or val_accuracy
    patience: int | float  # (inf: never stops)
    min_delta: float
    tolerance: float  # relative to the best so far (MXNet's early_stopping_tolerance)
    min_epochs: int

    @classmethod
    def of(cls, config: JobConfig, validated: bool = True) -> Rule | None:
        """Early stopping's rule; or, for export_epoch=best without it, one that only keeps each
        phase's best epoch by early_stopping_metric (the first of equal ones: any change counts,
        early_stopping_min_delta and _tolerance are early stopping's) and never ends a phase; None
        when neither is asked, or export_epoch=best has no validation metrics to choose by
        (`validated`: the job validates, on a validation channel or validation_split_ratio's share;
        early stopping without validation is refused before this)."""
        if config.early_stopping:
            return cls(config.early_stopping_metric, config.early_stopping_patience, config.early_stopping_min_delta,
                       config.early_stopping_tolerance, config.early_stopping_min_epochs)
        if config.export_epoch == "best" and validated:
            return cls(config.early_stopping_metric, math.inf, 0.0, 0.0, 1)
        return None

    @property
    def stops(self) -> bool:
        """Whether this rule may end a phase (early stopping's), or only keeps its best epoch."""
        return math.isfinite(self.patience)

    def better(self, value: float, best: float) -> bool:
        """Whether `value` improves on `best` by more than min_delta and tolerance x |best|. Not a
        number (a diverged or empty evaluation) never improves."""
        if not math.isfinite(value):
            return False
        if not math.isfinite(best):
            return True
        gain = best - value if self.metric.endswith("loss") else value - best
        return gain > max(self.min_delta, self.tolerance * abs(best))

    def verdict(self, rows: list[dict], phase: str) -> Verdict:
        """The state after the last row of `phase` (rows of other phases are not counted: each
        phase stops on its own)."""
        mine = [row for row in rows if row["phase"] == phase]
        best_epoch, best = 0, float("nan")
        for row in mine:
            value = row.get(self.metric)
            value = float("nan") if value is None else float(value)
            if not best_epoch or self.better(value, best):
                best_epoch, best = row["epoch"], value
        waited = sum(1 for row in mine if row["epoch"] > best_epoch)
        stop = waited >= self.patience and len(mine) >= self.min_epochs
        return Verdict(best_epoch, best, bool(mine) and mine[-1]["epoch"] == best_epoch, stop, waited)


class BestWeights(tf.Module):
    """A copy of every weight of the model (trained or not, BatchNorm's statistics included) as it
    was at the phase's best epoch. Tracked by checkpoints (the `best` entry), so a resumed job keeps
    it. Made in the strategy's scope: mirrored on every replica like the model's."""

    def __init__(self, model: keras.Model):
        super().__init__(name="best_weights")
        # (the model itself is not an attribute: the module would track it, and checkpoints would
        # then hold the model twice)
        self.copies = [tf.Variable(tf.zeros(w.shape, w.dtype), trainable=False, name=f"best_{i}")
                       for i, w in enumerate(model.weights)]

    def keep(self, model: keras.Model) -> None:
        for copy, weight in zip(self.copies, model.weights):
            copy.assign(weight.value)

    def restore(self, model: keras.Model) -> None:
        for copy, weight in zip(self.copies, model.weights):
            weight.assign(copy)


def after_epoch(rule: Rule, best: BestWeights, model: keras.Model, rows: list[dict], phase: Phase, epoch: int) -> int:
    """Early stopping after `epoch` (0-based) of `phase`, whose metrics `rows` end with: keeps the
    weights of a new best epoch and, when the phase ends (stopped, or at its last epoch), puts its
    best weights back in the model. Returns the epoch training goes on with. export_epoch=best
    without early stopping: the same, with a rule that never stops a phase.

    Each phase keeps its own best, as early stopping always has: phase 1's best weights are what
    phase 2 fine-tunes, and the model exported is the best epoch of the last phase. (A best over the
    whole job could export phase 1's head alone, undoing the fine-tuning asked for; to export the
    head, train no phase 2. The built-in algorithms' dialects, which ask for export_epoch=best, train
    one phase.)"""
    verdict = rule.verdict(rows, phase.name)
    if verdict.improved:
        best.keep(model)
    stopping = rule.stops and verdict.stop and epoch + 1 < phase.end
    if stopping:
        log.info("early stopping: %s has not improved on its best (%s %.6g at epoch %d) for %d epochs: phase %s "
                 "ends after epoch %d of %d", rule.metric, rule.metric, verdict.best, verdict.best_epoch,
                 verdict.epochs_without_improvement, phase.name, epoch + 1, phase.end)
    if (stopping or epoch + 1 == phase.end) and not verdict.improved:
        best.restore(model)
        log.info("%s: phase %s keeps the weights of its best epoch, %d (%s %.6g)",
                 "early stopping" if rule.stops else "export_epoch=best", phase.name, verdict.best_epoch,
                 rule.metric, verdict.best)
    return phase.end if stopping else epoch + 1


def exported_row(rule: Rule | None, rows: list[dict]) -> dict:
    """The metrics of the model exported: the last epoch's, or under `rule` (early stopping,
    export_epoch=best) those of the last phase's best epoch, whose weights it put back. {} when no
    epoch was trained."""
    if not rows:
        return {}
    if not rule:
        return rows[-1]
    phase = rows[-1]["phase"]
    best = rule.verdict(rows, phase).best_epoch
    # (the last phase's row: each phase numbers its epochs from 1)
    return next(row for row in rows if row["phase"] == phase and row["epoch"] == best)
