"""The training job: data, model, the training phases, checkpoints and resume, metrics and export."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import threading
import time
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from keras_pipe_train.model import incremental, jumpstart
from keras_pipe_train.model.classifier import (
    build_backbone,
    build_classifier,
    freeze,
    logits_of,
    prepare_from_scratch,
    set_batchnorm_momentum,
    unfreeze_top,
)
from keras_pipe_train.model.export import export
from keras_pipe_train.model.export import served_probabilities as exported_answer
from keras_pipe_train.report import evaluation, job_page, mistakes, suspects, tensorboard_pictures, tracking
from keras_pipe_train.settings import contract, dialects
from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.contract import ChannelConfig, Paths, ResourceConfig
from keras_pipe_train.settings.errors import ClusterError, UserError
from keras_pipe_train.sources import datasets, manifest
from keras_pipe_train.sources.recent_images import RecentImages
from keras_pipe_train.training import calibration, distribute, gathered, label_errors, metrics
from keras_pipe_train.training.checkpoints import Checkpoints, Progress
from keras_pipe_train.training.early_stopping import BestWeights, Rule
from keras_pipe_train.training.loop import Stopped, Trainer
from keras_pipe_train.training.precise_batchnorm import PreciseBatchNorm, batchnorm_layers
from keras_pipe_train.training.recipe import Loss, epoch_factor, make_optimizer

log = logging.getLogger(__name__)

CHANNELS = {"train": "required", "validation": "optional", "pretrained": "optional: backbone weights",
            "model": "optional: a previous job's model, continued; or JumpStart's pretrained model, the backbone",
            "train_lst": "record_format=lst: the .lst listing the train channel's images",
            "validation_lst": "record_format=lst: the .lst listing the validation channel's images"}


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str  # "scratch" or "head" (phase 1), "fine_tune" (phase 2)
    start: int  # first epoch (0-based)
    end: int
    learning_rate: float


def phases(config: JobConfig, from_scratch: bool) -> list[Phase]:
    first = Phase("scratch" if from_scratch else "head", 0, config.epochs, config.learning_rate)
    second = Phase("fine_tune", config.epochs, config.epochs + config.fine_tune_epochs,
                   config.fine_tune_learning_rate)
    return [p for p in (first, second) if p.end > p.start]


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training starts: the epoch (0-based), the steps of it already trained, the metrics of
    the epochs done, and the phase the model is set up for (None: not set up yet)."""

    epoch: int = 0
    step: int = 0
    history: tuple = ()
    configured: Phase | None = None


@dataclasses.dataclass
class Training:
    """The parts of one job's training, from its first epoch to its export."""

    config: JobConfig
    layout: Paths
    channels: dict[str, ChannelConfig]
    cluster: distribute.Cluster
    backbone: keras.Model
    trainer: Trainer
    checkpoints: Checkpoints
    plan: list[Phase]
    from_scratch: bool
    audit: datasets.Audit | None
    # where the training and validation examples come from (datasets.sources: a channel, or a side
    # of validation_split_ratio's split of the train channel; validation None: none)
    train_source: datasets.Source
    validation: datasets.Source | None
    # early stopping's rule, or export_epoch=best's (which keeps the best epoch, never stops)
    early_stopping: Rule | None = None
    best: BestWeights | None = None  # its copy of the phase's best weights
    epochs: EpochLog | None = None
    # each validated epoch's sums (examples, counts, detail counts) by (phase, epoch), for
    # evaluation.json: only the epochs whose model may still be the one exported are kept (the
    # last, early stopping's best)
    evaluations: dict = dataclasses.field(default_factory=dict)
    host: str = "algo-1"
    # a backbone from scratch: its BatchNorm statistics recomputed after each epoch (precise_bn_examples)
    precise_bn: PreciseBatchNorm | None = None
    # the class names a manifest's lines give, read on this host (the model's, without class_names)
    seen: manifest.ClassNames = dataclasses.field(default_factory=manifest.ClassNames)
    # the temperature fitted on validation before the export (the chief's; None: not fitted), and
    # that pass's logits (with fingerprints and thumbnails when label_error_folds asks)
    calibrated: calibration.Calibration | None = None
    validation_seen: gathered.Gathered | None = None
    # label_error_folds: the backbone's weights as the job started (None: from scratch, or no check)
    start_weights: list | None = None

    @property
    def model(self) -> keras.Model:
        return self.trainer.model

    @property
    def extra_state(self) -> dict:
        """What checkpoints hold beside the model, optimizer and random states: early stopping's
        best weights, the task's own variables (use_weighted_loss's label counts)."""
        state = {"best": self.best} if self.best else {}
        if self.trainer.task.state is not None:
            state["task"] = self.trainer.task.state
        return state

    def save(self, phase: Phase, epoch: int, steps: int) -> None:
        """A checkpoint after `steps` steps of `epoch` (0-based), with the metrics of the epochs done."""
        progress = Progress(phase.name, epoch, steps, self.config.batch_size, tuple(self.epochs.rows))
        self.checkpoints.save(self.model, self.trainer.optimizer, progress, self.extra_state)

    def configure(self, phase: Phase) -> None:
        """Sets which layers `phase` trains, then gives the trainer a fresh optimizer for them."""
        count = phase.end - phase.start
        if self.from_scratch:
            prepare_from_scratch(self.backbone)
            log.info("%s: no pretrained weights (weights=none): training the whole network for %d epochs",
                     "phase 1" if phase.name == "scratch" else "phase 2", count)
        elif phase.name == "head":
            freeze(self.backbone)
            log.info("phase 1: training the new head for %d epochs, backbone frozen", count)
        else:
            layers = unfreeze_top(self.backbone, self.config.fine_tune_layers, self.config.train_batchnorm)
            if self.config.train_batchnorm:  # (MXNet's momentum for the moving statistics: the layers' own are 0.99)
                set_batchnorm_momentum(self.backbone, 0.9)
            log.info("phase 2: fine-tuning %d backbone layers (%s ... %s) for %d epochs%s", len(layers),
                     layers[0] if layers else "-", layers[-1] if layers else "-", count,
                     ", BatchNorm included (train_batchnorm)" if self.config.train_batchnorm else "")
        # after: the optimizer is built for the trainable weights
        self.trainer.start_phase(phase.learning_rate, self.config.warmup_steps)


def run(config: JobConfig, layout: Paths, channels: dict[str, ChannelConfig], resources: ResourceConfig,
        stop: threading.Event | None = None) -> dict:
    """Trains (resuming from the newest readable checkpoint, if any) and exports; returns the final
    metrics. Raises Stopped, after saving a checkpoint, when `stop` is set (SIGTERM). The chief
    tracks the run in MLflow when MLFLOW_TRACKING_URI is set (report/tracking.py), whatever the end."""
    tracker = tracking.start(resources.is_chief, contract.training_job_name(), resources.current_host)
    status, reason = "FAILED", None
    try:
        check_channels(channels)
        keras.utils.set_random_seed(config.seed)
        training = set_up(config, layout, channels, resources, stop)
        tracker.begin(training.config, resuming=bool(training.checkpoints.complete()))
        final = train_and_export(training, tracker)
        status = "FINISHED"
        return final
    except Stopped:
        status = "KILLED"
        raise
    except BaseException as err:
        reason = f"{type(err).__name__}: {err}"
        raise
    finally:
        # (stopped: SageMaker's SIGKILL comes 120 s after its SIGTERM, and the checkpoint is saved already)
        tracker.finish(status, layout.output_data, layout.model if status == "FINISHED" else None,
                       tracking.STOPPED_BUDGET_S if status == "KILLED" else tracking.FINISH_BUDGET_S,
                       config=config, reason=reason)


def train_and_export(training: Training, tracker: tracking.Tracker | tracking.NoTracker) -> dict:
    start = resume(training)
    training.epochs = EpochLog(training.layout, training.cluster.is_chief, start.history, training.plan[-1].end,
                               training.config.top_k, tracker)
    try:
        for phase in training.plan:
            first = max(start.epoch, phase.start)
            if first >= phase.end:
                continue
            if phase is not start.configured:
                training.configure(phase)
            for epoch in range(first, phase.end):
                if train_epoch(training, phase, epoch, start.step if epoch == start.epoch else 0) >= phase.end:
                    break  # stopped early
    except Stopped:  # (every host stops at the same step: the request is a collective)
        training.cluster.leave_together()
        raise
    if training.trainer.stop.is_set():
        log.warning("the stop request came after training ended: exporting the model first")
    final = final_metrics(training)
    export_together(training, final)
    training.cluster.leave_together()  # (the chief's evaluation.json written)
    return final


def set_up(config: JobConfig, layout: Paths, channels: dict[str, ChannelConfig], resources: ResourceConfig,
           stop: threading.Event | None) -> Training:
    """The cluster, the model, its trainer and the job's checkpoints (checked writable before any
    training is done)."""
    train_source, validation = datasets.sources(config, layout, channels)
    cluster = distribute.cluster_for(resources, contract.cluster_addresses(resources), config.collective_timeout)
    cluster.per_replica_batch(config.batch_size)  # checks the batch divides between replicas
    mixed_precision = use_mixed_precision(config.mixed_precision)
    config, previous, pretrained, weights = starting_point(config, layout, channels)
    from_scratch = weights is None and previous is None and pretrained is None
    batchnorm_trains = from_scratch or config.train_batchnorm  # (and so its statistics are recomputed: precise BN)
    if config.early_stopping and validation is None:
        raise UserError("hyperparameter early_stopping=true watches the validation metrics: add a 'validation' "
                        "channel (or set validation_split_ratio), or set early_stopping=false")
    if config.calibration == "true" and validation is None:
        raise UserError("hyperparameter calibration=true fits a temperature on the validation set: add a 'validation' "
                        "channel (or set validation_split_ratio), or set calibration=auto")
    if config.export_epoch == "best" and validation is None:
        log.info("export_epoch=best: without validation (no 'validation' channel, no validation_split_ratio) there "
                 "is no %s to choose the best epoch by: the last epoch's model is exported",
                 config.early_stopping_metric)
    rule = Rule.of(config, validated=validation is not None)
    with cluster.strategy.scope():
        backbone = (jumpstart.build_backbone(pretrained, config.image_size, batchnorm_trains) if pretrained
                    else build_backbone(config.backbone, config.image_size, weights))
        model = build_classifier(config.backbone, backbone, config.num_classes, config.dropout,
                                 batchnorm_frozen=not batchnorm_trains, l2=config.regularizers_l2,
                                 activation="sigmoid" if config.multi_label else "softmax",
                                 scaling=pretrained.scaling if pretrained else None)
        if previous:
            incremental.continue_from(previous, model, config.backbone, config.class_names, config.multi_label,
                                      config.reinitialize_top_layer)
        best = BestWeights(model) if rule else None
    trainer = Trainer(model, cluster, mixed_precision, stop, steps_per_execution(config.steps_per_execution),
                      Loss.of(config), lambda learning_rate: make_optimizer(config, learning_rate))
    checkpoints = Checkpoints(layout.checkpoints, cluster.is_chief, contract.training_job_name(),
                              checkpoint_settings(config, channels, resources, mixed_precision))
    checkpoints.check_writable(checkpoint_bytes(model, copies=4 if best else 3))
    audit_dir = contract.audit_dir()
    audit = datasets.Audit(audit_dir, resources.current_host) if audit_dir else None
    precise_bn = (PreciseBatchNorm(model, cluster, config.batch_size,
                                   RecentImages(config.precise_bn_examples, config.image_size))
                  if batchnorm_trains and config.precise_bn_examples and batchnorm_layers(model) else None)
    return Training(config, layout, channels, cluster, backbone, trainer, checkpoints,
                    phases(config, from_scratch), from_scratch, audit, train_source, validation, rule, best,
                    host=resources.current_host, precise_bn=precise_bn,
                    start_weights=backbone.get_weights() if checks_start(config, from_scratch, previous) else None)


def checks_start(config: JobConfig, from_scratch: bool, previous) -> bool:
    """Whether the label check reads the starting backbone's features (start_weights kept): not
    from scratch (random), not continuing a previous model (most likely trained on these same
    images: its features have learnt their labels), not multi-label (not checked)."""
    return bool(config.label_error_folds) and not (from_scratch or previous is not None or config.multi_label)


def train_epoch(training: Training, phase: Phase, epoch: int, step: int) -> int:
    """One epoch from its step `step`: its pass, validation, the metrics line, early stopping and a
    checkpoint. Returns the epoch training goes on with (the phase's end when it stopped early).
    Raises Stopped when a stop was requested before the last epoch ended."""
    started = time.perf_counter()
    training.trainer.set_epoch_factor(epoch_factor(training.config, phase.start, phase.end, epoch))
    results, steps = train_pass(training, phase, epoch, step)
    if training.precise_bn and phase.name != "head":  # (the head's phase leaves a pretrained backbone's as they are)
        recompute_batchnorm(training.precise_bn, epoch)
    if training.validation:
        results |= validate(training, phase, epoch, steps)
    training.epochs.add(epoch, phase.name, results, time.perf_counter() - started)
    keep_epoch_model(training, epoch)  # (before stop_early, which may put the phase's best weights back)
    following = stop_early(training, phase, epoch) if training.early_stopping else epoch + 1
    training.save(phase, following, 0)
    # After the last epoch a stop changes nothing: training is done, and the export (which a stop
    # must not cut short) is the job's result. (Every worker knows it is the last.)
    if following < training.plan[-1].end and training.trainer.stop_requested():
        raise Stopped(f"stopped by request after epoch {epoch + 1}; checkpoint saved in "
                      f"{training.layout.checkpoints}")
    return following


EPOCH_MODELS = "epoch-models"  # (in the job's checkpoint folder: a resumed spot job still has them)


def keep_epoch_model(training: Training, epoch: int) -> None:
    """keep_epoch_models (MXNet's checkpoint_frequency): every N-th epoch's model, as it is after
    the epoch (0-based), beside the job's checkpoints until the export copies them into epochs/.
    The chief's alone. A .keras file; its weights alone for a SavedModel backbone (export.py)."""
    every = training.config.keep_epoch_models
    if not every or (epoch + 1) % every or not training.cluster.is_chief:
        return
    folder = training.checkpoints.own / EPOCH_MODELS
    folder.mkdir(parents=True, exist_ok=True)
    for debris in folder.glob(".writing-*"):  # (a write a stop cut short)
        debris.unlink(missing_ok=True)
    whole = not jumpstart.is_savedmodel_backbone(training.backbone)
    name = f"epoch-{epoch + 1:04d}{'.keras' if whole else '.weights.h5'}"
    partial = folder / f".writing-{name}"  # (renamed once whole: a stopped write leaves no file that looks kept)
    (training.model.save if whole else training.model.save_weights)(partial)
    partial.replace(folder / name)
    log.info("keep_epoch_models=%d: epoch %d's model kept (%s), to be exported in epochs/", every, epoch + 1, name)


def copy_epoch_models(training: Training) -> None:
    """The models keep_epoch_model kept, into the export's epochs/ folder."""
    folder = training.checkpoints.own / EPOCH_MODELS
    kept = sorted(p for p in folder.glob("epoch-*") if p.is_file()) if folder.is_dir() else []
    if kept:
        (training.layout.model / "epochs").mkdir(parents=True, exist_ok=True)
        for path in kept:
            shutil.copyfile(path, training.layout.model / "epochs" / path.name)
        log.info("exported the models of epochs %s in %s", ", ".join(str(int(p.name[6:10])) for p in kept),
                 training.layout.model / "epochs")


def recompute_batchnorm(precise_bn: PreciseBatchNorm, epoch: int) -> None:
    """The backbone's BatchNorm statistics recomputed with the epoch's final weights, before it is
    validated, checkpointed or exported (training/precise_batchnorm.py says why)."""
    started = time.perf_counter()
    used = precise_bn.recompute()
    if used:
        log.info("batchnorm statistics of epoch %d recomputed with its final weights on its last %d training "
                 "images (precise_bn_examples; on each host) in %.1f s", epoch + 1, used,
                 time.perf_counter() - started)
    else:
        log.warning("batchnorm statistics of epoch %d not recomputed: a host kept fewer of its training images "
                    "than it has devices (a shard that ran out?): the moving averages are used as they are",
                    epoch + 1)


def stop_early(training: Training, phase: Phase, epoch: int) -> int:
    """Early stopping after `epoch` (0-based) of `phase`: keeps the weights of a new best epoch and,
    when the phase ends (stopped, or at its last epoch), puts its best weights back in the model.
    Returns the epoch training goes on with. export_epoch=best without early stopping: the same,
    with a rule that never stops a phase.

    Each phase keeps its own best, as early stopping always has: phase 1's best weights are what
    phase 2 fine-tunes, and the model exported is the best epoch of the last phase. (A best over the
    whole job could export phase 1's head alone, undoing the fine-tuning asked for; to export the
    head, train no phase 2. The built-in algorithms' dialects, which ask for export_epoch=best, train
    one phase.)"""
    rule, t = training.early_stopping, training
    verdict = rule.verdict(t.epochs.rows, phase.name)
    if verdict.improved:
        t.best.keep(t.model)
    stopping = rule.stops and verdict.stop and epoch + 1 < phase.end
    if stopping:
        log.info("early stopping: %s has not improved on its best (%s %.6g at epoch %d) for %d epochs: phase %s "
                 "ends after epoch %d of %d", rule.metric, rule.metric, verdict.best, verdict.best_epoch,
                 verdict.epochs_without_improvement, phase.name, epoch + 1, phase.end)
    if (stopping or epoch + 1 == phase.end) and not verdict.improved:
        t.best.restore(t.model)
        log.info("%s: phase %s keeps the weights of its best epoch, %d (%s %.6g)",
                 "early stopping" if rule.stops else "export_epoch=best", phase.name, verdict.best_epoch,
                 rule.metric, verdict.best)
    return phase.end if stopping else epoch + 1


def train_pass(training: Training, phase: Phase, epoch: int, step: int) -> tuple[dict, int]:
    """Trains on the epoch's pass from step `step`: (its metrics, the steps of the epoch done)."""
    t, config = training, training.config
    recent = t.precise_bn.recent if t.precise_bn else None
    if recent:
        recent.clear()  # (the statistics are of this epoch's images: a pass's at most)
    train_input = datasets.training_input(t.train_source.channel, t.layout, config, epoch, step, t.audit,
                                          t.trainer.stop, t.seen, side=t.train_source.side, recent=recent)
    train = t.cluster.strategy.distribute_datasets_from_function(train_input)
    on_step = (lambda steps: t.audit.write({"epoch": epoch, "trained_steps": steps})) if t.audit else None
    results, steps, stopped = t.trainer.train_epoch(train, epoch, step, config.batch_size, on_step)
    if stopped and epoch == 0 and steps == 0:
        raise Stopped("stopped by request before the first step: nothing to checkpoint")
    if stopped:
        t.save(phase, epoch, steps)
        raise Stopped(f"stopped by request after step {steps} of epoch {epoch + 1} "
                      f"({steps * config.batch_size} records of its pass); checkpoint saved in "
                      f"{t.layout.checkpoints}: a restarted job resumes there")
    if steps == 0:  # (the same on every worker: a step is taken by all of them)
        raise train_input.nothing_read(epoch)
    return results, steps


def validate(training: Training, phase: Phase, epoch: int, steps: int) -> dict:
    """The validation metrics after the epoch's `steps` steps."""
    t = training
    validation = datasets.evaluation_input(t.validation.channel, t.layout, t.config, t.trainer.stop, t.seen,
                                           side=t.validation.side, audit=t.audit, epoch=epoch)
    scores, examples, counts, detail = t.trainer.evaluate_in_detail(
        t.cluster.strategy.distribute_datasets_from_function(validation))
    if t.trainer.stop_requested():  # (maybe cut short): the epoch is checkpointed as trained, not done
        t.save(phase, epoch, steps)
        raise Stopped(f"stopped by request while validating epoch {epoch + 1}; checkpoint saved in "
                      f"{t.layout.checkpoints}: a restarted job validates it again")
    if not examples:
        raise validation.nothing_read(epoch)
    # (the per-class counts and confusion matrix ride along every validation pass: evaluation.json
    # then needs no pass of its own when the model exported is an epoch of this run)
    # (by phase and epoch: each phase numbers its epochs from 1)
    keep = {(phase.name, epoch + 1)}
    if t.early_stopping and t.epochs.rows:
        keep.add((phase.name, t.early_stopping.verdict(t.epochs.rows, phase.name).best_epoch))
    t.evaluations = {key: found for key, found in t.evaluations.items() if key in keep}
    t.evaluations[(phase.name, epoch + 1)] = (scores, examples, counts, detail)
    return scores


def final_metrics(training: Training) -> dict:
    """The metrics of the model exported: the last epoch's, or with early stopping or
    export_epoch=best, those of the last phase's best epoch, whose weights it put back. That epoch's
    metric lines are then printed again, last: SageMaker keeps each metric's last value as the job's
    final one, which a tuning job ranks jobs by, and it must be the exported model's."""
    rows = training.epochs.rows
    if not rows:
        return {}
    if not training.early_stopping:
        return rows[-1]
    phase = rows[-1]["phase"]
    best = training.early_stopping.verdict(rows, phase).best_epoch
    # (the last phase's row: each phase numbers its epochs from 1)
    final = next(row for row in rows if row["phase"] == phase and row["epoch"] == best)
    if final is not rows[-1]:
        log.info("the model exported is epoch %d's (%s): its metrics again, as the job's final ones", best,
                 "early stopping" if training.early_stopping.stops else "export_epoch=best")
        training.epochs.print_lines(final)
    return final


def evaluate_exported(training: Training, final: dict) -> None:
    """The model as exported, on the validation channel, with the details the epochs' lines leave
    out (each class's, the confusion matrix): the chief writes output/data/evaluation.json and its
    pictures (report/evaluation.py) from the sums of the exported epoch's own validation pass; a resumed
    job exporting an epoch that an earlier run validated makes one more pass, every worker with
    it. It comes after the export, which nothing here can then cost the job; a stop request skips
    that pass (or, in Pipe mode, cuts it short), and a report that cannot be written is a warning."""
    t = training
    if not t.validation:
        if t.cluster.is_chief:  # (its CSV: there is no report page without validation)
            check_labels(t, chief_pass_budget(t, LABEL_CHECK_SHARE))
        return
    exported = (final.get("phase"), final.get("epoch"))
    if exported in t.evaluations:  # (validated in this run: its sums are at hand)
        scores, examples, counts, detail = t.evaluations[exported]
    else:  # (a resumed job that exports an epoch of an earlier run: one more pass)
        if t.trainer.stop_requested():
            log.warning("no evaluation.json: the job was asked to stop; the model is exported")
            return
        validation = datasets.evaluation_input(t.validation.channel, t.layout, t.config, t.trainer.stop, t.seen,
                                               side=t.validation.side)
        scores, examples, counts, detail = t.trainer.evaluate_in_detail(
            t.cluster.strategy.distribute_datasets_from_function(validation))
        if t.trainer.stop_requested() or not examples:  # (the same on every worker)
            log.warning("no evaluation.json: %s", "a stop request cut the final evaluation short" if examples
                        else "the validation channel's last pass held no records")
            return
    if t.cluster.is_chief:
        try:
            found = evaluation.report(t.trainer.task, t.config.class_names, scores, examples, counts, detail,
                                      final.get("epoch"))
            found["calibration"] = t.calibrated.as_json() if t.calibrated else None
            evaluation.write(t.layout.output_data, found, t.epochs.rows)
        except Exception as err:  # (the model and metrics.json are written: the job's result stands)
            log.warning("could not write evaluation.json (%s: %s)", type(err).__name__, err, exc_info=True)
            return
        write_report(t, found)


LABEL_CHECK_SHARE = 0.8  # of collective_timeout, for the label check and the gallery's pass before it


def chief_pass_budget(training: Training, share: float = 0.5, spent: float = 0.0) -> float | None:
    """Seconds the chief's work after training may still take: on several hosts `share` of
    collective_timeout (which the others wait for it at most) less the `spent` seconds already
    counted against it: half for one pass (calibration's, the gallery's), LABEL_CHECK_SHARE for the
    label check and the gallery's pass together. None, no bound, alone or with collective_timeout 0
    (TensorFlow's "no timeout")."""
    t = training
    if not (t.cluster.multi_worker and t.config.collective_timeout):
        return None
    return max(0.0, share * t.config.collective_timeout - spent)


def write_report(training: Training, found: dict) -> None:
    """The chief's report page (report/job_page.py) and TensorBoard's pictures, with the gallery of the
    validation images the exported model gets most wrong: one more pass over the validation channel,
    the chief's alone (the other hosts wait for it in leave_together). A report that cannot be made
    is a warning: the model, metrics.json and evaluation.json stand."""
    t = training
    # (the other hosts wait at most collective_timeout for the chief: chief_pass_budget)
    started = time.monotonic()
    try:
        gallery = None
        # (the chief alone, so its own stop flag, never stop_requested(): that is a collective,
        # which the other hosts, waiting in leave_together, would never join. With several hosts
        # the pass reads the chief's own share of the channel)
        if not t.trainer.stop.is_set():
            make = datasets.evaluation_input(t.validation.channel, t.layout, t.config, t.trainer.stop, t.seen,
                                             side=t.validation.side)
            budget = chief_pass_budget(t)
            calibrated = t.calibrated.serving_json(t.config.multi_label_threshold if t.config.multi_label else None) \
                if t.calibrated else None
            worst = mistakes.find(served_probabilities(t), t.trainer.task, make(tf.distribute.InputContext()),
                                  t.trainer.stop, budget_s=budget,
                                  threshold=(calibrated or {}).get("calibrated_thresholds"))
            if not t.trainer.stop.is_set():
                gallery = job_page.Gallery(worst.worst_first(), worst.seen, worst.wrong_count, worst.cut)
        checked = check_labels(t, chief_pass_budget(t, LABEL_CHECK_SHARE, time.monotonic() - started))
        settings = {"dialect": t.config.dialect, **dataclasses.asdict(t.config)}
        path = job_page.write(t.layout.output_data, found, t.epochs.rows, settings, contract.training_job_name(),
                              gallery, checked)
        log.info("the job's report: %s%s", path, "" if gallery else " (no gallery: a stop request)")
        if t.epochs.writer:
            tensorboard_pictures.pictures(t.epochs.writer, t.layout.output_data, gallery, found, len(t.epochs.rows))
    except Exception as err:
        log.warning("could not write the job's report (%s: %s)", type(err).__name__, err, exc_info=True)


LABEL_THUMBNAIL = 64  # pixels: the longer side of a suspect's picture in the report
MAX_CHECKED_VALUES = 2 ** 26  # training features kept for the label check (128 MiB of float16)
MAX_CHECKED = 100_000  # training examples the label check looks at, at most: the first ones
# the label check's heads take at most this share of the training's time (the cost it is meant to
# keep under), or HEADS_MIN_S when the training was quicker (tracing and a few chunks of steps)
HEADS_SHARE = 0.25
HEADS_MIN_S = 60.0
FEATURES_SHARE = 0.6  # of the chief's budget on several hosts, for the training features' pass


def check_labels(training: Training, budget_s: float | None) -> suspects.Checked | None:
    """label_error_folds: the likely label errors (training/label_errors.py) of the validation
    images, from the exported model's (served) probabilities, and of the training images, from K
    heads on the features of the backbone the job started from; written to
    output/data/label_errors.csv and .json. The chief's; None when not asked, and for a multi-label job
    (the check finds one wrong class per image); a check that fails is a warning."""
    t, folds = training, training.config.label_error_folds
    if not folds or t.trainer.stop.is_set():
        return None
    if t.config.multi_label:
        log.warning("label_error_folds: the label check finds one wrong class per image; a multi-label job's "
                    "labels are not checked")
        return None
    started = time.perf_counter()
    ends = None if budget_s is None else time.monotonic() + budget_s
    try:
        sets = {}
        if t.validation_seen is not None and len(t.validation_seen):
            served = t.calibrated.served if t.calibrated else None
            probabilities = calibration.tempered(t.validation_seen.outputs, 1.0 if served is None else served, False)
            sets["validation"] = (t.validation_seen, label_errors.find(probabilities, t.validation_seen.labels))
        # (on several hosts the features' pass takes FEATURES_SHARE of the budget: the heads need the rest)
        features = training_features(t, None if budget_s is None else FEATURES_SHARE * budget_s)
        found, unchecked = None, ("a stop request came during their pass" if t.trainer.stop.is_set()
                                  else "" if len(features) else "their pass read none")
        if not unchecked:
            found, unchecked = training_suspects(t, features, ends)
        if found is not None:
            sets["train"] = (features, found)
        else:
            log.warning("label check: the training images are not checked: %s", unchecked)
        checked = suspects.Checked(sets, t.config.class_names, folds, trained_features=t.start_weights is None,
                                   seconds=time.perf_counter() - started, unchecked=unchecked)
        path = suspects.write(t.layout.output_data, checked, contract.training_job_name())
    except Exception as err:
        log.warning("could not check the labels (%s: %s)", type(err).__name__, err, exc_info=True)
        return None
    log.info("label check (%d folds) in %.1f s: %s; %s", folds, checked.seconds, checked.summary(), path)
    return checked


def training_suspects(training: Training, features: gathered.Gathered, ends: float | None
                      ) -> tuple[label_errors.Suspects | None, str]:
    """The training images' suspects, from label_error_folds heads on their `features`; or None
    and why not, when the heads were cut: by a stop request, or their time, at most HEADS_SHARE of
    the training's (HEADS_MIN_S at least), and never past `ends` (time.monotonic(): the budget of
    the chief's passes on several hosts)."""
    t, folds = training, training.config.label_error_folds
    allowed = max(HEADS_MIN_S, HEADS_SHARE * sum(row.get("seconds", 0.0) for row in t.epochs.rows))
    budget = f"{HEADS_SHARE:.0%} of the training's time, {HEADS_MIN_S:.0f} s at least"
    if ends is not None and ends - time.monotonic() < allowed:  # (several hosts: what is left of the chief's)
        allowed, budget = max(0.0, ends - time.monotonic()), "what was left of the chief's budget on several hosts"
    try:
        probabilities = label_errors.out_of_fold(features.outputs.astype(np.float32), features.labels,
                                                 t.model.output_shape[-1], folds, t.config.seed,
                                                 stop=t.trainer.stop, deadline=time.monotonic() + allowed)
    except label_errors.Cut as cut:
        return None, f"their {folds} heads on {len(features):,} images were ended by {cut}" + (
            f" ({allowed:.0f} s: {budget})" if str(cut) == label_errors.BY_TIME else "")
    found, rare = label_errors.of_classes_with(label_errors.find(probabilities, features.labels), features.labels,
                                               folds)
    if rare:
        log.info("label check: %d training suspects left out: their classes have fewer images than the %d folds, "
                 "too few for a head to learn them without the image itself", rare, folds)
    return found, ""


def training_features(training: Training, budget_s: float | None) -> gathered.Gathered:
    """The training channel's images through the backbone the job started from (its weights put
    back for the pass, the trained ones after; from scratch or continuing a previous model, the
    trained backbone's: checks_start), pooled as the classifier reads them, with each image's
    fingerprint and thumbnail."""
    t = training
    trained = t.backbone.get_weights()
    if t.start_weights is not None:
        t.backbone.set_weights(t.start_weights)
    try:
        head = t.model.get_layer("classifier")
        features = keras.Model(t.model.inputs, head.input)
        width = int(head.input.shape[-1])
        make = datasets.evaluation_input(t.train_source.channel, t.layout, t.config, t.trainer.stop, t.seen,
                                         side=t.train_source.side, examined=LABEL_THUMBNAIL)
        return gathered.gather(tf.function(lambda images: features(images, training=False), reduce_retracing=True),
                               make(tf.distribute.InputContext()), width,
                               min(MAX_CHECKED, MAX_CHECKED_VALUES // width), t.trainer.stop, budget_s, np.float16)
    finally:
        t.backbone.set_weights(trained)


def export_together(training: Training, final: dict) -> None:
    """The chief exports the model and writes metrics.json; every host then learns whether it
    did, and they evaluate the model exported together (evaluate_exported) before they exit. The
    class names are settled first, on every host (manifest.class_names: a manifest's lines may
    name them, and each host has read its share of the lines)."""
    t, exported = training, False
    try:
        names = manifest.class_names(t.config, t.seen, t.host, t.cluster.all_texts)
        t.config = dataclasses.replace(t.config, class_names=names)
        if t.cluster.is_chief:
            threshold = t.config.multi_label_threshold if t.config.multi_label else None
            t.calibrated = calibrate(t)
            serving_dir = export(t.model, t.config.class_names, t.config.image_size, t.layout.model,
                                 t.config.max_image_pixels, threshold, dialect=t.config.dialect,
                                 resize_to=serving_resize(t.config), interpolation=t.config.resize_interpolation,
                                 calibration=t.calibrated.serving_json(threshold) if t.calibrated else None)
            copy_epoch_models(t)
            t.epochs.write(t.layout.output_data / "metrics.json", final)
            keras_file = t.layout.model / "model.keras"
            log.info("exported the model to %s (serving)%s", serving_dir,
                     f" and {keras_file}" if keras_file.is_file() else "")
        exported = True
    finally:
        finish_together(t.cluster, failed=not exported)
    evaluate_exported(training, final)


def calibrate(training: Training) -> calibration.Calibration | None:
    """The temperature for the served probabilities (training/calibration.py), fitted on the
    validation channel's logits in one more pass, the chief's alone, before the export (the other
    hosts wait for it there: half of collective_timeout at most, as the gallery's pass). None
    without validation or at a stop request; a fit that fails is a warning, and the model is then
    exported as trained."""
    t = training
    if not t.validation or t.trainer.stop.is_set():
        return None
    try:
        make = datasets.evaluation_input(t.validation.channel, t.layout, t.config, t.trainer.stop, t.seen,
                                         side=t.validation.side,
                                         examined=LABEL_THUMBNAIL if t.config.label_error_folds else 0)
        budget = chief_pass_budget(t)
        classes = t.model.output_shape[-1]
        limit = max(1, calibration.MAX_VALUES // classes)
        if t.config.label_error_folds:  # (each example's thumbnail is kept too)
            limit = min(limit, MAX_CHECKED)
        seen = gathered.gather(tf.function(logits_of(t.model), reduce_retracing=True),
                               make(tf.distribute.InputContext()), classes, limit, t.trainer.stop, budget)
        if t.trainer.stop.is_set() or not len(seen):
            log.warning("no calibration: %s", "a stop request" if len(seen) else "the validation pass read nothing")
            return None
        t.validation_seen = seen
        found = calibration.calibrate(seen.outputs, seen.labels, t.config.multi_label, t.config.calibration,
                                      t.config.seed, seen.cut)
    except Exception as err:
        log.warning("could not calibrate the model's probabilities (%s: %s): it is exported as trained",
                    type(err).__name__, err, exc_info=True)
        return None
    before, after = found.before, found.after
    log.info("calibration on %d validation examples%s: temperature %s %s (%s); cross-fitted ECE %.4f -> %.4f, "
             "NLL %.4f -> %.4f", found.examples, " (the first: the pass was cut short)" if found.cut else "",
             _shown(found.temperature), "applied" if found.applied else "not applied", found.reason,
             before["ece"], after["ece"], before["nll"], after["nll"])
    return found


def _shown(temperature) -> str:
    values = np.atleast_1d(temperature)
    return f"{values[0]:.4g}" if values.size == 1 else f"{values.min():.4g} to {values.max():.4g} by class"


def served_probabilities(training: Training):
    """images -> the probabilities the exported model serves: the model's, or calibrated ones."""
    t = training
    answer = exported_answer(t.model, t.calibrated.served if t.calibrated else None, t.config.multi_label)
    return lambda images: answer(images)[0]


def serving_resize(config: JobConfig) -> int | str | None:
    """How the served model prepares each image: as validation did, except in the MXNet dialect,
    whose built-in resizes each image whole to image_shape at inference, whatever its training's
    resize: "At inference, input images are resized to the image_shape ... Aspect ratio is not
    preserved, and images are not cropped" (AWS's IC-Hyperparameter page, image_shape). The
    report's evaluation and gallery stay validation's (docs/migration.md says so)."""
    return None if config.dialect == dialects.MXNET else config.resize


def finish_together(cluster: distribute.Cluster, failed: bool) -> None:
    """Hosts exit together, after the chief's export. SageMaker ends a multi-host job when its
    hosts exit, and the SDK's local mode stops every container when the first one exits: a worker
    that left right after training got the chief stopped in the middle of its export. Workers wait
    here (up to collective_timeout) for the chief, and learn whether its export failed."""
    if not cluster.multi_worker:
        return
    if not cluster.is_chief:
        log.info("training done: waiting for the chief to export the model")
    if cluster.any_worker(failed) and not failed:
        raise ClusterError("the chief host failed to export the model after training (its own failure reason "
                           "says why); this host finished training")


# Hyperparameters a job may change and still resume its checkpoints (train longer or shorter, with
# another global batch, other time limits); any other change makes it another job (training/checkpoints.py).
RESUMABLE_CHANGES = ("epochs", "fine_tune_epochs", "batch_size", "pipe_wait_timeout", "collective_timeout",
                     "max_corrupted_records_to_skip", "max_image_pixels", "other_checkpoints",
                     "steps_per_execution", "dialect_notes", "keep_epoch_models", "calibration", "label_error_folds")


def checkpoint_settings(config: JobConfig, channels: dict[str, ChannelConfig], resources: ResourceConfig,
                        mixed_precision: bool) -> dict:
    """What makes checkpoints this job's: they are resumed only by a job with the same settings."""
    settings = {name: value for name, value in dataclasses.asdict(config).items() if name not in RESUMABLE_CHANGES}
    settings["channels"] = {name: [c.input_mode, c.distribution, c.record_wrapper]
                            for name, c in sorted(channels.items())}
    settings["hosts"] = len(resources.hosts)
    settings["mixed_precision"] = mixed_precision  # (auto resolves to on or off: the optimizer differs)
    return json.loads(json.dumps(settings))  # as progress.json gives them back: lists, not tuples


def checkpoint_bytes(model: keras.Model, copies: int = 3) -> int:
    """About what one checkpoint takes: the weights, and the optimizer's slots for each (Adam's
    two; all weights train in some phase), and early stopping's copy of the best."""
    return copies * sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights)


def resume(training: Training) -> Position:
    """Restores the newest readable checkpoint of this job (or, when it has none, of another job
    as other_checkpoints says), and says where training goes on. Each candidate is tried with the
    model set up for its own phase; a damaged one is skipped with a warning and the previous one
    used. Position() when none."""
    checkpoints, plan, config = training.checkpoints, training.plan, training.config
    candidates = list(checkpoints.candidates())
    if not checkpoints.complete():
        other = checkpoints.other_to_resume(config.other_checkpoints)
        if other:
            log.info("continuing checkpoint %s of job %r (other_checkpoints=resume)",
                     other.path.relative_to(checkpoints.folder), other.job)
            candidates = [(other.path, other.progress)]
    for path, progress in candidates:
        phase = next((p for p in plan if progress.epoch < p.end), plan[-1])
        training.configure(phase)
        # a checkpoint from the end of phase 1 restores the weights only: phase 2 has a new optimizer
        same_phase = progress.phase == phase.name
        if not checkpoints.restore(path, training.model, training.trainer.optimizer if same_phase else None,
                                   training.extra_state):
            continue
        step = progress.steps
        if progress.global_batch != config.batch_size and step:
            log.warning("checkpoint %s was taken with batch_size %d, now %d: epoch %d restarts from its first record",
                        path.name, progress.global_batch, config.batch_size, progress.epoch + 1)
            step = 0
        log.info("resuming from checkpoint %s: epoch %d of %d, after %d steps (%d records of its pass)",
                 path.name, progress.epoch + 1, plan[-1].end, step, step * config.batch_size)
        return Position(progress.epoch, step, progress.history, phase)
    return Position()


class EpochLog:
    """Each epoch's metric lines (for SageMaker's MetricDefinitions: this job's, and the forms the
    built-in algorithms' users parse), TensorBoard scalars, and the rows of metrics.json (the chief
    writes; every worker has the same numbers). `total`: the job's epochs; `top_k`: config's."""

    def __init__(self, layout: Paths, is_chief: bool, history: tuple = (), total: int = 0, top_k: int | None = None,
                 tracker: tracking.Tracker | tracking.NoTracker | None = None):
        self.rows: list[dict] = list(history)
        self.tracker = tracker or tracking.NoTracker()
        self.is_chief = is_chief
        self.total, self.top_k = total, top_k
        self.writer = tf.summary.create_file_writer(str(layout.output / "tensorboard")) if is_chief else None

    def add(self, epoch: int, phase: str, results: dict, seconds: float) -> None:
        values = metrics.row(epoch + 1, phase, results)
        values["seconds"] = round(seconds, 3)
        self.rows.append(values)
        self.print_lines(values)
        self.tracker.epoch(epoch + 1, values)
        if self.writer:
            with self.writer.as_default(step=epoch + 1):
                for name, value in results.items():
                    tf.summary.scalar(name, value)
            self.writer.flush()

    def print_lines(self, values: dict) -> None:
        print("\n".join(metrics.lines(values, self.total, self.top_k)), flush=True)

    def write(self, path: Path, final: dict) -> None:
        metrics.write_json(path, self.rows, final)


def check_channels(channels: dict[str, ChannelConfig]) -> None:
    unknown = sorted(set(channels) - set(CHANNELS))
    if "train" not in channels or unknown:
        got = ", ".join(sorted(channels)) or "none"
        raise UserError(
            f"the job reads channels {', '.join(f'{k} ({v})' for k, v in CHANNELS.items())} (train may be named "
            f"'{contract.TRAINING_CHANNEL}', as the built-in TensorFlow algorithm names it); it got: {got}"
        )
    for name in ("pretrained", "model"):
        if name in channels and channels[name].input_mode == "Pipe":
            raise UserError(f"channel '{name}' holds a {'weights file' if name == 'pretrained' else 'model'}: use File "
                            "or FastFile mode, not Pipe")


def starting_point(config: JobConfig, layout: Paths, channels: dict[str, ChannelConfig]):
    """What the model starts from: (the job's settings, a previous model to continue, a pretrained
    SavedModel as its backbone, the backbone's weights). With a pretrained SavedModel (JumpStart's,
    model/jumpstart.py), the settings' backbone is that, at the image size it takes."""
    previous = incremental.load(layout.input_data / incremental.CHANNEL) if incremental.CHANNEL in channels else None
    pretrained = previous if isinstance(previous, jumpstart.Pretrained) else None
    if pretrained:
        previous = None
        if config.reinitialize_top_layer == "false":  # (JumpStart refuses it too: there is no top layer to keep)
            raise UserError(f"hyperparameter reinitialize_top_layer=false keeps the classifier of the model in channel "
                            f"'model', and {pretrained.source} is a pretrained feature extractor without one: set "
                            "reinitialize_top_layer=auto (or true)")
        config = dataclasses.replace(config, backbone=jumpstart.NAME,
                                     image_size=pretrained.image_size_for(config.image_size))
        if isinstance(config.resize, int) and config.resize < config.image_size:
            raise UserError(f"hyperparameter resize ({config.resize}) must be at least the image size of the model in "
                            f"channel 'model' ({config.image_size}, its {jumpstart.MODEL_INFO}'s)")
    weights = resolve_weights(config, channels, layout)
    if previous or pretrained:
        log.info("the backbone's weights come from channel 'model' (hyperparameter weights=%s is not used)",
                 config.weights)
        weights = None
    return config, previous, pretrained, weights


def resolve_weights(config: JobConfig, channels: dict[str, ChannelConfig], layout: Paths) -> str | None:
    """The backbone weights to load: "imagenet", None (random) or a file path."""
    if "model" in channels and config.weights not in ("imagenet", "none"):
        raise UserError(f"hyperparameter weights={config.weights} and channel 'model' both give the backbone's "
                        "weights: leave weights unset to continue the model in the channel")
    if config.weights == "none":
        return None
    if config.weights != "pretrained":
        return config.weights
    if "pretrained" not in channels:
        raise UserError("hyperparameter weights=pretrained needs a 'pretrained' channel holding the weights file")
    folder = layout.input_data / "pretrained"
    found = sorted(str(p) for p in Path(folder).rglob("*.h5")) if folder.is_dir() else []
    if len(found) != 1:
        raise UserError(
            f"channel 'pretrained' must hold exactly one .h5 weights file; {folder} holds "
            f"{len(found)}{': ' + ', '.join(found) if found else ''}"
        )
    return found[0]


def steps_per_execution(setting: int | str) -> int:
    """auto: 8 steps per call with a GPU, where the host's work between calls would leave it idle
    (a small model's step takes milliseconds); 1 on CPUs, where a step takes long enough that the
    host's work is noise, and a stop is then answered after the step that is running."""
    if setting != "auto":
        return setting
    chosen = 8 if tf.config.list_physical_devices("GPU") else 1
    log.info("steps_per_execution=auto: %d", chosen)
    return chosen


def use_mixed_precision(setting: str) -> bool:
    gpus = tf.config.list_physical_devices("GPU")
    on = setting == "true" or (setting == "auto" and bool(gpus))
    keras.mixed_precision.set_dtype_policy("mixed_float16" if on else "float32")
    log.info("mixed precision %s (%d GPU%s)", "on" if on else "off", len(gpus), "" if len(gpus) == 1 else "s")
    return on
