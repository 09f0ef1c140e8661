"""The training loop: steps_per_execution steps per call, on any tf.distribute strategy.

Why not Keras' fit(): under a distribution strategy, Keras 3.15's fit() pulls a first batch from
a throwaway iterator to build the model (in Pipe mode, that opens and drops a whole pass each call)
and reduces that input batch across replicas, which MultiWorkerMirroredStrategy cannot do. This
loop also gives what the job needs and fit() hides: the exact number of steps trained in the
current pass (for mid-epoch resume) and one stop decision agreed by all workers at the same step
(a SIGTERM reaches the hosts at slightly different times; a worker stopping alone would leave the
others waiting in a collective).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import keras
import numpy as np
import tensorflow as tf

from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.settings.tracing import traced
from keras_pipe_train.training.distribute import Cluster
from keras_pipe_train.training.recipe import LearningRate, Loss, l2_decayed
from keras_pipe_train.training.traced import any_batch_signature
from keras_pipe_train.training.weight_average import WeightAverage

log = logging.getLogger(__name__)
PROGRESS_EVERY_STEPS = 10


class Stopped(Exception):
    """Training stopped on request (SIGTERM) after saving a checkpoint."""


class Diverged(UserError):
    """The loss became NaN or infinite: the weights are lost, training further only costs money."""


class Totals:
    """A pass's sums: the loss, the examples, and the task's counts (tasks.py)."""

    def __init__(self):
        self.loss, self.examples, self.counts = 0.0, 0.0, None

    def add(self, call: Call) -> None:
        self.loss += call.loss_sum
        self.examples += call.examples
        self.counts = call.counts if self.counts is None else self.counts + call.counts

    def metrics(self, prefix: str, task) -> dict:
        """Means over the examples seen; NaN (null in metrics.json) when there were none in this run
        (an epoch resumed after its last step), never a loss of 0."""
        n = self.examples or float("nan")
        counts = self.counts if self.counts is not None else np.zeros(task.width)
        return {f"{prefix}loss": self.loss / n, **task.metrics(prefix, self.examples, counts)}


@dataclasses.dataclass
class Call:
    """What one call of the traced steps did, read back to the host in one transfer."""

    steps: int
    loss_sum: float
    examples: float
    counts: np.ndarray  # the task's, summed over the call's steps
    diverged_at: int  # 1-based step of this call whose loss was not finite; 0: none

    @classmethod
    def read(cls, outputs: tf.Tensor) -> Call:
        values = outputs.numpy().astype(np.float64)
        loss_sum, examples, steps, diverged_at = values[0], values[1], values[-2], values[-1]
        return cls(int(steps), float(loss_sum), float(examples), values[2:-2], int(diverged_at))


class Trainer:
    def __init__(self, model: keras.Model, cluster: Cluster, mixed_precision: bool,
                 stop: threading.Event | None = None, steps_per_execution: int = 1, loss: Loss | None = None,
                 make_optimizer=keras.optimizers.Adam, ema_decay: float = 0.0):
        self.model, self.cluster, self.mixed_precision = model, cluster, mixed_precision
        self.steps_per_execution = steps_per_execution
        self.stop = stop or threading.Event()
        self.loss = loss or Loss()
        with cluster.strategy.scope():  # (its variables, if any, mirrored as the model's)
            self.task = self.loss.task(model.output_shape[-1])
            self.task.build()
            # the weights' moving average (ema_decay), updated by every training step
            self.average = WeightAverage(model, ema_decay) if ema_decay else None
        self.make_optimizer = make_optimizer  # learning rate (a schedule) -> a Keras optimizer
        self.optimizer = None
        self.learning_rate = None
        self.schedule: LearningRate | None = None
        self.first_epoch = 0  # (the phase's: start_phase)
        self._functions: list = []

    def start_phase(self, learning_rate: float, warmup_steps: int = 0, first_epoch: int = 0) -> None:
        """A fresh optimizer for the model's current trainable weights, and step functions traced
        for them (unfreezing layers changes what a step updates). `first_epoch`: the phase's, which
        seeds its draws apart from another phase's (MixUp's: its optimizer counts steps from 0 again)."""
        self.first_epoch = first_epoch
        with self.cluster.strategy.scope():
            self.schedule = LearningRate(learning_rate, warmup_steps)
            optimizer = self.make_optimizer(self.schedule)
            if self.mixed_precision:
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            optimizer.build(self.model.trainable_variables)
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self._functions = []

    def set_epoch_factor(self, factor: float) -> None:
        """The share of the phase's learning rate the coming epoch trains at (the schedule's)."""
        self.schedule.factor.assign(factor)

    def _steps(self, train: bool, dataset, detailed: bool = False, forward=None):
        """The traced function that runs up to steps_per_execution steps on `dataset`'s iterator,
        one per element spec: batches of any size, including a pass's last, smaller one, and
        every epoch's new iterator then reuse the same graph. `detailed`: the task's detail counts
        too (a confusion matrix: for the final evaluation)."""
        return self._traced((train, detailed, forward), dataset.element_spec,
                            # (AutoGraph: the steps' loop is Python's `for` and `if` over tensors)
                            lambda: tf.function(self._make_steps(self._make_step(train, detailed, forward), detailed),
                                                autograph=True))

    def _traced(self, mode: tuple, spec, trace):
        """The function traced for `mode` and `spec` this phase, made by trace() the first time."""
        for known_mode, known_spec, function in self._functions:  # (specs need not be hashable)
            if known_mode == mode and known_spec == spec:
                return function
        function = trace()
        self._functions.append((mode, spec, function))
        return function

    def _single_steps(self, train: bool, dataset, detailed: bool, forward):
        """calls() one step at a time on one device (the default strategy): each batch is taken from
        the dataset here and the traced function is the step alone. The steps' loop of _make_steps,
        a while_loop around a cond, costs more to trace than the step it holds: MobileNetV3-Small's
        first training call took 14 s of CPU with it, 8-9.6 s without, its first evaluation 2 s
        against 1 (docs/speed.md; again for each phase), where every call still syncs on its
        outputs. Several replicas or workers keep that loop: there, get_next_as_optional has them
        agree on the end of a pass."""
        function = None
        for batch in dataset:
            if function is None:  # (the batch's size left open: a pass's last, smaller batch reuses it)
                function = self._step_function(train, any_batch_signature(batch), detailed, forward)
            outputs = function(batch).numpy().astype(np.float64)
            finite = bool(np.isfinite(outputs[0]))
            yield Call(1, float(outputs[0]), float(outputs[1]), outputs[2:], 0 if finite else 1)
            if not finite:  # (the weights are lost: no further step runs on them)
                return

    def _step_function(self, train: bool, signature, detailed: bool, forward):
        """The traced single step for batches of `signature`, traced once per mode and signature."""
        return self._traced(("one", train, detailed, forward), signature,
                            lambda: traced(self._make_step(train, detailed, forward), input_signature=signature))

    def _make_steps(self, step, detailed: bool = False):
        """Up to `count` steps in one call, their sums kept on the device: the host reads one small
        tensor per call instead of syncing on every step's metrics (Keras' steps_per_execution).
        Ends early at the end of the pass, and at a step whose loss is not finite (the weights are
        lost: no further step should run on them)."""
        # [loss sum, examples, the task's counts..., its detail counts...]
        width = 2 + self.task.width + (self.task.detail_width if detailed else 0)

        def steps(iterator, count):
            totals, done, diverged_at = tf.zeros([width]), tf.constant(0), tf.constant(0)
            for _ in tf.range(count):
                # under several workers, the same answer on every worker (tf.distribute agrees
                # on it): a worker whose share ran out gets an empty batch until all are done
                batch = iterator.get_next_as_optional()
                if not batch.has_value():
                    break
                outputs = step(batch.get_value())
                done += 1
                totals += outputs
                if not tf.math.is_finite(outputs[0]):
                    diverged_at = done
                    break
            return tf.concat([totals, tf.cast(tf.stack([done, diverged_at]), tf.float32)], 0)

        return steps

    def _make_step(self, train: bool, detailed: bool = False, forward=None):
        """`forward`: in evaluation, images -> the probabilities judged, in place of the model's
        (the served model's: test_time_flip)."""
        model, optimizer, strategy, task = self.model, self.optimizer, self.cluster.strategy, self.task
        scale, clip, l2 = self.mixed_precision, self.loss.clip_norm, self.loss.l2_decay
        mixing, first_epoch = self.loss.mixing if train and self.loss.mixes else None, self.first_epoch

        def replica_step(images, labels):
            count = tf.shape(labels)[0]
            examples = tf.cast(count, tf.float32)
            context = tf.distribute.get_replica_context()
            # the global mean: replicas (and, at a pass's end, workers) may hold fewer examples
            global_examples = context.all_reduce("sum", examples)
            images, labels, weight = self._never_empty(images, labels, count)
            if train:
                task.observe(labels[:count], examples, context)
            if mixing:  # (seeded by the phase and the step count, which checkpoints hold: a resumed job mixes alike)
                images, share = mixing.mix(images, mixing.step_seed(context.replica_id_in_sync_group, first_epoch,
                                                                    optimizer.iterations))
            with tf.GradientTape() as tape:
                probabilities = forward(images) if forward else model(images, training=train)
                per_example = (mixing.per_example_loss(task, labels, share, probabilities) if mixing
                               else task.per_example_loss(train, labels, probabilities))
                loss_sum = tf.reduce_sum(per_example) * weight
                loss = loss_sum / tf.maximum(global_examples, 1.0)
                if train and model.losses:  # the kernel's L2 penalty: the same on every replica,
                    # whose gradients are summed, so each adds its share
                    loss += tf.add_n(model.losses) / context.num_replicas_in_sync
                if scale:
                    loss = optimizer.scale_loss(loss)
            if train:
                self._update(tape.gradient(loss, model.trainable_variables), context, clip, l2)
            # (the reported loss is the examples' own: without the L2 penalty, comparable with val_loss)
            counts = task.counts(labels, probabilities) * weight
            if detailed:
                counts = tf.concat([counts, task.detail_counts(labels, probabilities) * weight], 0)
            return tf.concat([tf.stack([tf.cast(loss_sum, tf.float32), examples]), counts], 0)

        average = self.average if train else None

        def step(batch):
            outputs = strategy.run(replica_step, args=batch)
            if average is not None:  # (after the optimizer's update, on every replica's copy)
                average.update(model)
            return strategy.reduce("sum", outputs, axis=None)

        return step

    def _update(self, gradients, context, clip: float, l2: float) -> None:
        """The optimizer's step on the replica's gradients (summed over replicas), clipped and with
        the L2 decay when asked."""
        if clip:
            gradients = self._clipped(gradients, context)
        if l2:
            gradients = self._with_l2_decay(gradients, context)
        self.optimizer.apply(gradients, self.model.trainable_variables)

    def _never_empty(self, images, labels, count):
        """(images, labels, the weight of their loss): with several workers, one whose share of the
        pass has run out gets empty batches while the others finish theirs (tf.distribute's
        get_next_as_optional). Every replica must still run the same ops (the gradient
        all-reduce), and Keras layers fail on empty batches, so an empty batch becomes one blank
        image that weighs nothing in the loss. (Only a backbone trained from scratch, BatchNorm in
        training mode, sees it at all: in its moving statistics, for the few steps at the end of an
        uneven pass.)"""
        weight = tf.cast(count > 0, tf.float32)
        images = tf.cond(count > 0, lambda: images, lambda: tf.zeros([1, *images.shape[1:]], images.dtype))
        labels = tf.cond(count > 0, lambda: labels, lambda: self.task.blank_labels(labels))
        return images, labels, weight

    def _clipped(self, gradients, context):
        """The replica's gradients scaled so that their sum over replicas (what the optimizer
        applies) has a global norm of at most clip_norm. Under mixed precision the gradients are
        of the scaled loss: the norm compared is that of the unscaled ones."""
        summed = context.all_reduce("sum", gradients) if context.num_replicas_in_sync > 1 else gradients
        norm = tf.linalg.global_norm(summed)
        if self.mixed_precision:
            norm = norm / self.optimizer.scale_loss(tf.constant(1.0))
        factor = tf.minimum(1.0, self.loss.clip_norm / tf.maximum(norm, 1e-12))
        # A norm that is not finite (a float16 overflow on any replica) makes every replica's
        # gradients NaN, not only the overflowing one's: the loss-scale optimizer reads the first
        # replica's, and all must then skip the step together and lower the scale.
        factor = tf.where(tf.math.is_finite(norm), factor, float("nan"))
        return [g * tf.cast(factor, g.dtype) for g in gradients]

    def _with_l2_decay(self, gradients, context):
        """weight_decay_style=l2: l2_decay x w added to the gradient of each weight that recipe.py's
        l2_decayed says (the gradient of l2_decay/2 x |w|^2), before the optimizer, so that the
        momentum carries it as MXNet's sgd and nag do; after clipping, which bounds the examples'
        gradient only (MXNet clips that alone too). The optimizer sums the replicas' gradients, so
        each replica adds its share. Under mixed precision the gradients are of the scaled loss, so
        the term is scaled with them: the loss-scale optimizer divides it back to l2_decay x w
        (and a step it skips, for a gradient that overflowed, skips the decay too)."""
        factor = self.loss.l2_decay / context.num_replicas_in_sync
        if self.mixed_precision:
            factor = factor * self.optimizer.scale_loss(tf.constant(1.0))
        return [gradient if gradient is None or not l2_decayed(weight)
                else gradient + tf.cast(factor, gradient.dtype) * tf.cast(weight.value, gradient.dtype)
                for gradient, weight in zip(gradients, self.model.trainable_variables)]

    def stop_requested(self) -> bool:
        """The same answer on every worker, at the same step."""
        return self.cluster.any_worker(self.stop.is_set())

    def calls(self, train: bool, dataset, detailed: bool = False, forward=None):
        """The Call results of running every step of `dataset`, steps_per_execution at a time."""
        if self.steps_per_execution == 1 and not self.cluster.multi_worker and self.cluster.replicas == 1:
            yield from self._single_steps(train, dataset, detailed, forward)
            return
        function, iterator = self._steps(train, dataset, detailed, forward), iter(dataset)
        count = tf.constant(self.steps_per_execution)
        while True:
            call = Call.read(function(iterator, count))
            if call.steps:
                yield call
            if call.steps < self.steps_per_execution or call.diverged_at:
                return

    def train_epoch(self, dataset, epoch: int, first_step: int, global_batch: int,
                    on_step=None) -> tuple[dict, int, bool]:
        """Trains on `dataset` (already positioned after `first_step` steps). Returns
        (metrics of this run's steps, steps done in the epoch, whether a stop was requested)."""
        totals, steps, started = Totals(), first_step, time.perf_counter()
        for call in self.calls(True, dataset):
            if call.diverged_at:
                raise Diverged(
                    f"training diverged: the loss became {call.loss_sum / max(call.examples, 1)} at step "
                    f"{steps + call.diverged_at} of epoch {epoch + 1}, so the weights are no longer numbers; no "
                    f"checkpoint was taken of them. Lower the learning rate (this phase's is "
                    f"{self.learning_rate:g}: hyperparameter learning_rate for phase 1, fine_tune_learning_rate "
                    "for phase 2)")
            totals.add(call)
            logged, steps = steps // PROGRESS_EVERY_STEPS, steps + call.steps
            if on_step:
                on_step(steps)
            if steps // PROGRESS_EVERY_STEPS > logged:
                rate = totals.examples / (time.perf_counter() - started)
                log.info("progress: epoch=%d step=%d loss=%.4f examples/s=%.1f", epoch + 1, steps,
                         totals.loss / max(totals.examples, 1), rate)
            if self.stop_requested():  # (a collective under several workers: once per call)
                return totals.metrics("train_", self.task), steps, True
        # a stop that came while the input waited for data ended the pass early (Pipe mode)
        return totals.metrics("train_", self.task), steps, self.stop_requested()

    def evaluate(self, dataset) -> tuple[dict, int]:
        """(validation metrics, examples evaluated by all workers together)."""
        totals = Totals()
        for call in self.calls(False, dataset):
            totals.add(call)
        return totals.metrics("val_", self.task), int(totals.examples)

    def evaluate_in_detail(self, dataset, forward=None) -> tuple[dict, int, np.ndarray, np.ndarray]:
        """evaluate(), with the task's counts and detail counts (a confusion matrix) summed over the
        pass: (metrics, examples, counts, detail counts). `forward`: images -> the probabilities
        judged, in place of the model's own (_make_step)."""
        totals, width = Totals(), self.task.width
        for call in self.calls(False, dataset, detailed=True, forward=forward):
            totals.add(call)
        counts = totals.counts if totals.counts is not None else np.zeros(width + self.task.detail_width)
        totals.counts = counts[:width]
        return totals.metrics("val_", self.task), int(totals.examples), counts[:width], counts[width:]
