"""The training job, from its settings to its report: set up, train phase by phase (resuming where a
checkpoint says), export, then the steps after training (after_training/), in that order."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import keras

from keras_pipe_train.after_training import calibrate, conversions, evaluate, label_check, report_page
from keras_pipe_train.after_training.trained import LABEL_CHECK_SHARE, Trained
from keras_pipe_train.model import incremental, jumpstart
from keras_pipe_train.model.classifier import (
    build_classifier,
    freeze,
    prepare_from_scratch,
    set_batchnorm_momentum,
    unfreeze_top,
)
from keras_pipe_train.model.export import export, serving_resize
from keras_pipe_train.model.starting_point import build_backbone, starting_point
from keras_pipe_train.report import tracking
from keras_pipe_train.report.epoch_log import EpochLog
from keras_pipe_train.settings import channels as job_channels
from keras_pipe_train.settings import contract
from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.contract import ChannelConfig, Paths, ResourceConfig
from keras_pipe_train.settings.errors import ClusterError, UserError
from keras_pipe_train.sources import datasets, manifest
from keras_pipe_train.sources.recent_images import RecentImages
from keras_pipe_train.training import distribute, early_stopping, epoch_models, preset
from keras_pipe_train.training.checkpoints import Checkpoints, Progress
from keras_pipe_train.training.devices import steps_per_execution, use_mixed_precision
from keras_pipe_train.training.early_stopping import BestWeights, Rule
from keras_pipe_train.training.loop import Stopped, Trainer
from keras_pipe_train.training.phases import Phase, phases
from keras_pipe_train.training.precise_batchnorm import PreciseBatchNorm, batchnorm_layers
from keras_pipe_train.training.recipe import (
    Loss,
    check_test_time_flip,
    epoch_factor,
    layer_scales,
    make_optimizer,
)
from keras_pipe_train.training.resume import checkpoint_bytes, checkpoint_settings, resume

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Training:
    """The parts of one job's training, from its first epoch to its last."""

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
    epochs: EpochLog
    # early stopping's rule, or export_epoch=best's (which keeps the best epoch, never stops)
    early_stopping: Rule | None = None
    best: BestWeights | None = None  # its copy of the phase's best weights
    # each validated epoch's sums (scores, examples, counts, detail counts) by (phase, epoch), for
    # evaluation.json: only the epochs whose model may still be the one exported are kept (the
    # last, early stopping's best)
    evaluations: dict = dataclasses.field(default_factory=dict)
    host: str = "algo-1"
    # a backbone from scratch: its BatchNorm statistics recomputed after each epoch (precise_bn_examples)
    precise_bn: PreciseBatchNorm | None = None
    # the class names a manifest's lines give, read on this host (the model's, without class_names)
    seen: manifest.ClassNames = dataclasses.field(default_factory=manifest.ClassNames)
    # label_error_folds: the backbone's weights as the job started (None: from scratch, or no training check)
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
        if self.trainer.average is not None:
            state["average"] = self.trainer.average
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
        self.trainer.start_phase(phase.learning_rate, self.config.warmup_steps, phase.start)


def run(config: JobConfig, layout: Paths, channels: dict[str, ChannelConfig], resources: ResourceConfig,
        stop: threading.Event | None = None) -> dict:
    """Trains (resuming from the newest readable checkpoint, if any) and exports; returns the final
    metrics. Raises Stopped, after saving a checkpoint, when `stop` is set (SIGTERM). The chief
    tracks the run in MLflow when MLFLOW_TRACKING_URI is set (report/tracking.py), whatever the end."""
    tracker = tracking.start(resources.is_chief, contract.training_job_name(), resources.current_host)
    status, reason = "FAILED", None
    try:
        job_channels.check(channels)
        keras.utils.set_random_seed(config.seed)
        # (before any TensorFlow op: a multi-worker strategy must be made first)
        cluster = distribute.cluster_for(resources, contract.cluster_addresses(resources), config.collective_timeout)
        config = preset.chosen(config, layout, channels, cluster, resources, stop)
        training = set_up(config, layout, channels, resources, cluster, stop, tracker)
        tracker.begin(training.config, resuming=bool(training.checkpoints.complete()))
        final = train_and_export(training)
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


def train_and_export(training: Training) -> dict:
    start = resume(training.checkpoints, training.plan, training.config, training.configure, training.model,
                   lambda: training.trainer.optimizer, training.extra_state)
    training.epochs.resumed(start.history)
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
    after_training(training, final)
    training.cluster.leave_together()  # (the chief's evaluation.json and report written)
    return final


def set_up(config: JobConfig, layout: Paths, channels: dict[str, ChannelConfig], resources: ResourceConfig,
           cluster: distribute.Cluster, stop: threading.Event | None,
           tracker: tracking.Tracker | tracking.NoTracker) -> Training:
    """The model, its trainer on `cluster` and the job's checkpoints (checked writable before any
    training is done)."""
    train_source, validation = datasets.sources(config, layout, channels)
    cluster.per_replica_batch(config.batch_size)  # checks the batch divides between replicas
    mixed_precision = use_mixed_precision(config.mixed_precision)
    config, previous, pretrained, weights = starting_point(config, layout, channels)
    from_scratch = weights is None and previous is None and pretrained is None
    batchnorm_trains = from_scratch or config.train_batchnorm  # (and so its statistics are recomputed: precise BN)
    check_validation(config, validation)
    rule = Rule.of(config, validated=validation is not None)
    with cluster.strategy.scope():
        backbone, scaling = build_backbone(config, previous, pretrained, weights, batchnorm_trains, layout,
                                           channels)
        model = build_classifier(config.backbone, backbone, config.num_classes, config.dropout,
                                 batchnorm_frozen=not batchnorm_trains, l2=config.regularizers_l2,
                                 activation="sigmoid" if config.multi_label else "softmax",
                                 scaling=scaling, image_size=config.image_size)
        if previous:
            incremental.continue_from(previous, model, config.backbone, config.class_names, config.multi_label,
                                      config.reinitialize_top_layer)
        best = BestWeights(model) if rule else None
    check_test_time_flip(config)
    scales = layer_scales(config, backbone, from_scratch)
    trainer = Trainer(model, cluster, mixed_precision, stop, steps_per_execution(config.steps_per_execution),
                      Loss.of(config), lambda learning_rate: make_optimizer(config, learning_rate, scales),
                      config.ema_decay)
    checkpoints = Checkpoints(layout.checkpoints, cluster.is_chief, contract.training_job_name(),
                              checkpoint_settings(config, channels, resources, mixed_precision))
    # (the model, its optimizer's two moments, early stopping's best and the weights' average)
    checkpoints.check_writable(checkpoint_bytes(model, copies=3 + bool(best) + bool(config.ema_decay)))
    audit_dir = contract.audit_dir()
    audit = datasets.Audit(audit_dir, resources.current_host) if audit_dir else None
    precise_bn = (PreciseBatchNorm(model, cluster, config.batch_size,
                                   RecentImages(config.precise_bn_examples, config.image_size))
                  if batchnorm_trains and config.precise_bn_examples and batchnorm_layers(model) else None)
    plan = phases(config, from_scratch)
    epochs = EpochLog(layout, cluster.is_chief, total=plan[-1].end, top_k=config.top_k, tracker=tracker)
    return Training(config, layout, channels, cluster, backbone, trainer, checkpoints, plan, from_scratch, audit,
                    train_source, validation, epochs, rule, best, host=resources.current_host, precise_bn=precise_bn,
                    start_weights=backbone.get_weights() if checks_start(config, from_scratch, previous) else None)


def check_validation(config: JobConfig, validation: datasets.Source | None) -> None:
    """What needs validation has it: early stopping and calibration=true refuse to start without;
    export_epoch=best exports the last epoch's model (said in the log)."""
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


def checks_start(config: JobConfig, from_scratch: bool, previous) -> bool:
    """Whether the label check reads the starting backbone's features (start_weights kept): not
    from scratch (random), not continuing a previous model (most likely trained on these same
    images: its features have learnt their labels), not multi-label (not checked)."""
    return bool(config.label_error_folds) and not (from_scratch or previous is not None or config.multi_label)


def train_epoch(training: Training, phase: Phase, epoch: int, step: int) -> int:
    """One epoch from its step `step`: its pass, validation, the metrics line, early stopping and a
    checkpoint. Returns the epoch training goes on with (the phase's end when it stopped early).
    Raises Stopped when a stop was requested before the last epoch ended."""
    t = training
    started = time.perf_counter()
    t.trainer.set_epoch_factor(epoch_factor(t.config, phase.start, phase.end, epoch))
    results, steps = train_pass(t, phase, epoch, step)
    average = t.trainer.average
    if average:  # (the epoch's model, from here to its checkpoint: the weights' average)
        average.swap(t.model)
    if t.precise_bn and phase.name != "head":  # (the head's phase leaves a pretrained backbone's as they are)
        t.precise_bn.recompute_after(epoch)
    if t.validation:
        results |= validate(t, phase, epoch, steps)
    t.epochs.add(epoch, phase.name, results, time.perf_counter() - started)
    if t.cluster.is_chief:  # (before early stopping, which may put the phase's best weights back)
        epoch_models.keep(t.model, t.checkpoints.own, epoch, t.config.keep_epoch_models,
                          whole=not jumpstart.is_savedmodel_backbone(t.backbone))
    following = (early_stopping.after_epoch(t.early_stopping, t.best, t.model, t.epochs.rows, phase, epoch)
                 if t.early_stopping else epoch + 1)
    if average and following >= phase.end:  # (the phase's result is the model the next one starts from)
        average.settle(t.model)
    t.save(phase, following, 0)
    # After the last epoch a stop changes nothing: training is done, and the export (which a stop
    # must not cut short) is the job's result. (Every worker knows it is the last.)
    if following < t.plan[-1].end and t.trainer.stop_requested():
        raise Stopped(f"stopped by request after epoch {epoch + 1}; checkpoint saved in {t.layout.checkpoints}")
    return following


def train_pass(training: Training, phase: Phase, epoch: int, step: int) -> tuple[dict, int]:
    """Trains on the epoch's pass from step `step`: (its metrics, the steps of the epoch done)."""
    t, config = training, training.config
    if t.trainer.average:  # (the trained weights back, after the last epoch's end swapped the average in)
        t.trainer.average.train_again(t.model)
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
    """The metrics of the model exported (early_stopping.exported_row). When they are not the last
    epoch's, that epoch's metric lines are printed again, last: SageMaker keeps each metric's last
    value as the job's final one, which a tuning job ranks jobs by, and it must be the exported
    model's."""
    rows = training.epochs.rows
    final = early_stopping.exported_row(training.early_stopping, rows)
    if rows and final is not rows[-1]:
        log.info("the model exported is epoch %d's (%s): its metrics again, as the job's final ones", final["epoch"],
                 "early stopping" if training.early_stopping.stops else "export_epoch=best")
        training.epochs.print_lines(final)
    return final


def after_training(training: Training, final: dict) -> None:
    """The steps after training, in order, each handed what the steps before it returned:

      1. the class names settled, on every host (a manifest's lines may name them, and each host
         has read its share of the lines);
      2. the chief calibrates (one pass over validation), exports the model with it and writes
         metrics.json; every host then learns whether it did (finish_together);
      3. the exported model's evaluation.json (every host, when a resumed job needs a pass);
      4. the chief's exports, TFLite and ONNX (export_formats), each checked on a pass over validation, their
         figures added to evaluation.json;
      5. the chief's report: the gallery of the worst mistakes, the label check (LABEL_CHECK_SHARE
         of its budget, less what the gallery spent and its heatmaps' time), report.html with the
         mistakes' and the suspects' heatmaps (within what is left of LABEL_CHECK_SHARE).

    On several hosts the others wait for the chief's steps: each takes its share of
    collective_timeout (after_training/trained.py). MLflow's run is ended by `run`, whatever the end."""
    t = training
    calibrated, exported = calibrate.Calibrated(), False
    try:  # (a failure on the chief, the class names' included, is told to the hosts waiting for it)
        names = manifest.class_names(t.config, t.seen, t.host, t.cluster.all_texts)
        trained = Trained(dataclasses.replace(t.config, class_names=names), t.layout, t.model, t.backbone,
                          t.trainer, t.cluster, t.train_source, t.validation, t.seen, t.epochs.rows, t.start_weights)
        if t.cluster.is_chief:
            calibrated = calibrate.calibrate(trained)
            export_model(trained, calibrated)
            epoch_models.copy(t.checkpoints.own, t.layout.model)
            t.epochs.write(t.layout.output_data / "metrics.json", final)
        exported = True
    finally:
        finish_together(t.cluster, failed=not exported)
    found = evaluate.evaluate(trained, final, t.evaluations.get((final.get("phase"), final.get("epoch"))),
                              calibrated)
    if not t.cluster.is_chief:
        return
    started = time.monotonic()  # (the steps after this share one clock: after_training/trained.py)
    conversions.export(trained, calibrated, found)
    if t.validation and found is None:
        return
    shown = report_page.gallery(trained, calibrated, time.monotonic() - started) if t.validation else None
    # (the mistakes' heatmaps, drawn with the suspects' after the check, keep their time from its budget)
    reserved = shown.heatmaps_budget_s if shown is not None else 0.0
    checked = label_check.check_labels(trained, calibrated,
                                       trained.budget(LABEL_CHECK_SHARE, time.monotonic() - started + reserved))
    if t.validation:  # (without validation no report page: the label check's files alone)
        report_page.write(trained, found, shown, checked, t.epochs.writer,
                          trained.budget(LABEL_CHECK_SHARE, time.monotonic() - started))


def export_model(trained: Trained, calibrated: calibrate.Calibrated) -> None:
    """The SavedModel `serve` answers with (model/export.py), calibrated where the step says so."""
    t, config = trained, trained.config
    threshold = config.multi_label_threshold if config.multi_label else None
    serving_dir = export(t.model, config.class_names, config.image_size, t.layout.model, config.max_image_pixels,
                         threshold, dialect=config.dialect, resize_to=serving_resize(config),
                         interpolation=config.resize_interpolation, calibration=calibrated.serving(threshold),
                         flip=config.test_time_flip)
    keras_file = t.layout.model / "model.keras"
    log.info("exported the model to %s (serving)%s", serving_dir, f" and {keras_file}" if keras_file.is_file() else "")


def finish_together(cluster: distribute.Cluster, failed: bool) -> None:
    """Hosts exit together, after the chief's export. SageMaker ends a multi-host job when its
    hosts exit, and the SDK's local mode stops every container when the first one exits: a worker
    that leaves right after training gets the chief stopped in the middle of its export. Workers wait
    here (up to collective_timeout) for the chief, and learn whether its export failed."""
    if not cluster.multi_worker:
        return
    if not cluster.is_chief:
        log.info("training done: waiting for the chief to export the model")
    if cluster.any_worker(failed) and not failed:
        raise ClusterError("the chief host failed to export the model after training (its own failure reason "
                           "says why); this host finished training")
