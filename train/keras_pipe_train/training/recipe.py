"""The training recipe: which optimizer, the learning rate at each step, and what the loss adds up.

Every choice here is a hyperparameter (settings/hyperparameters.py), named as SageMaker's built-in image classifiers
name it where they have one, so that a job moved from them keeps its settings (docs/job.md maps
each name). No TensorFlow graph code here beyond the schedule's one formula: the loop (loop.py)
applies the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import keras
import tensorflow as tf

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.training import layer_decay
from keras_pipe_train.training.mixing import Mixing
from keras_pipe_train.training.tasks import MultiLabel, SingleLabel

log = logging.getLogger(__name__)

ADAMW_DEFAULT_DECAY = 0.004  # Keras' own default for AdamW, used when weight_decay is not set


def make_optimizer(config: JobConfig, learning_rate,
                   layer_scales: dict[int, float] | None = None) -> keras.optimizers.Optimizer:
    """The optimizer `config.optimizer` names, with the settings the built-ins give it;
    `layer_scales` ({id(weight): scale}, layer_decay.scales): each weight's step at the learning
    rate x its scale.

    Gradient clipping is not passed to Keras: Keras 3 clips each replica's share of the gradient
    before summing them (base_optimizer.apply, then _all_reduce_sum_gradients), so with several
    GPUs or hosts the norm it bounds is not the gradient's. The loop clips the summed gradient.

    With weight_decay_style=l2 the optimizer decays nothing itself: the loop adds the decay to the
    gradient instead (Loss.l2_decay)."""
    name = config.optimizer
    decay = weight_decay(config) if config.weight_decay_style == "decoupled" else 0.0
    common = {"learning_rate": learning_rate, "weight_decay": decay or None}
    if name == "adamw":  # (AdamW takes a float, 0.0 included; None is refused)
        kind, settings = keras.optimizers.AdamW, dict(common, weight_decay=decay, beta_1=config.beta_1,
                                                      beta_2=config.beta_2, epsilon=config.epsilon)
    elif name == "adam":
        kind, settings = keras.optimizers.Adam, dict(common, beta_1=config.beta_1, beta_2=config.beta_2,
                                                     epsilon=config.epsilon)
    elif name in ("sgd", "nesterov"):
        kind, settings = keras.optimizers.SGD, dict(common, momentum=config.momentum, nesterov=name == "nesterov")
    elif name == "rmsprop":
        kind, settings = keras.optimizers.RMSprop, dict(common, rho=config.rho, momentum=config.momentum,
                                                        epsilon=config.epsilon)
    elif name == "adagrad":
        kind, settings = keras.optimizers.Adagrad, dict(
            common, initial_accumulator_value=config.initial_accumulator_value, epsilon=config.epsilon)
    elif name == "adadelta":
        kind, settings = keras.optimizers.Adadelta, dict(common, rho=config.rho, epsilon=config.epsilon)
    else:
        raise ValueError(f"unknown optimizer {name!r}")  # (config.OPTIMIZERS lets none other through)
    if not layer_scales:
        return kind(**settings)
    optimizer = layer_decay.decayed(kind)(**settings)
    optimizer.layer_scales = layer_scales
    return optimizer


def layer_scales(config: JobConfig, backbone: keras.Model, from_scratch: bool) -> dict[int, float] | None:
    """layer_decay's scale of each backbone weight's learning rate (layer_decay.scales), said in
    the log; None when off, or from scratch (said: it is fine-tuning's)."""
    if config.layer_decay == 1:
        return None
    if from_scratch:
        log.warning("layer_decay=%g is not applied: it fine-tunes a pretrained backbone, and with weights=none the "
                    "whole network trains from scratch, every layer at the phase's rate", config.layer_decay)
        return None
    scales, how = layer_decay.scales(backbone, config.layer_decay)
    log.info("%s", how)
    return scales


def check_test_time_flip(config: JobConfig) -> None:
    """test_time_flip serves each image's mirror image too: said when training mirrors none."""
    if config.test_time_flip and ("flip" not in config.augment or "horizontal" not in config.augmentation_random_flip):
        log.warning("test_time_flip: the model is served on each image and its mirror image, but training mirrors no "
                    "image left to right (augment=%s, augmentation_random_flip=%s): a mirror image may be one it "
                    "never learnt (text, digits, left and right)", ",".join(config.augment) or "false",
                    config.augmentation_random_flip)


def weight_decay(config: JobConfig) -> float:
    """The decay coefficient, whichever way it is applied (weight_decay_style): weight_decay, or
    unset, Keras' default for adamw and 0 for the others."""
    if config.weight_decay is not None:
        return config.weight_decay
    return ADAMW_DEFAULT_DECAY if config.optimizer == "adamw" else 0.0


# The weights an L2 decay (weight_decay_style=l2) leaves alone: biases and normalization offsets,
# as MXNet does by default. Its Module gives the optimizer the parameters' names (init_optimizer,
# param_idx2name), and Optimizer.set_wd_mult then sets the decay multiplier to 0 for every parameter
# whose name ends neither in _weight nor in _gamma (apache/mxnet, python/mxnet/optimizer). The
# ResNet symbols of its image-classification example (example/image-classification/symbols/
# resnet.py, trained by common/fit.py through Module.fit) set no __wd_mult__ of their own: the
# convolutions' and the classifier's weights and the BatchNorm gammas are decayed, the classifier's
# bias and the BatchNorm betas are not (the convolutions have no bias). The built-in algorithm's
# source is not public; its log lines are Module.fit's, so it is taken to train the same way. Keras
# names those variables kernel (depthwise_kernel, pointwise_kernel), gamma, bias and beta; anything
# else trained (a ConvNeXt layer scale, an embedding) is decayed, as a *_weight would be.
L2_EXEMPT = ("bias", "beta")


def l2_decayed(variable) -> bool:
    return variable.name not in L2_EXEMPT


def epoch_factor(config: JobConfig, phase_start: int, phase_end: int, epoch: int) -> float:
    """How much of the phase's learning rate epoch `epoch` (0-based, counted over the whole job as
    the metric lines count it) trains at, by `lr_schedule`:

    - constant: 1;
    - cosine: from 1 at the phase's first epoch down along half a cosine, reaching 0 where the
      phase would have a next epoch (so its last epoch still learns);
    - step: times `lr_scheduler_factor` after each epoch listed in `lr_scheduler_step` (1-based,
      MXNet's meaning: "10" lowers the rate from epoch 11 on) that lies within this phase.

    The rate changes between epochs, not within one: in Pipe mode the steps of an epoch are known
    only once its pass has ended, and an epoch's rate must not depend on how long the last one was.
    """
    if config.lr_schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * (epoch - phase_start) / (phase_end - phase_start)))
    if config.lr_schedule == "step":
        passed = sum(1 for boundary in config.lr_scheduler_step if phase_start < boundary <= epoch)
        return config.lr_scheduler_factor ** passed
    return 1.0


class LearningRate(keras.optimizers.schedules.LearningRateSchedule):
    """base x (this epoch's factor, set by the host before each epoch) x warmup.

    Warmup: the phase's first `warmup_steps` optimizer steps ramp linearly up to the full rate
    (step 1 trains at 1/warmup_steps of it). The optimizer's step count is in its checkpoint, so a
    resumed job continues the ramp where it was."""

    def __init__(self, base: float, warmup_steps: int):
        self.base, self.warmup_steps = float(base), int(warmup_steps)
        # a variable, not a Python number: the traced steps read it at each step, and the host
        # changes it between epochs without retracing
        self.factor = tf.Variable(1.0, trainable=False, dtype=tf.float32, name="epoch_factor",
                                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    def __call__(self, step):
        rate = self.base * self.factor
        if self.warmup_steps:
            done = tf.cast(step, tf.float32) + 1.0
            rate = rate * tf.minimum(1.0, done / float(self.warmup_steps))
        return rate

    def get_config(self):
        return {"base": self.base, "warmup_steps": self.warmup_steps}


@dataclasses.dataclass(frozen=True)
class Loss:
    """What the training loss is made of, and what is counted beside it (tasks.py applies it)."""

    label_smoothing: float = 0.0
    class_weights: tuple[float, ...] | None = None  # per label: the weight of its examples' (or terms') losses
    clip_norm: float = 0.0  # 0: none; else the largest global norm of the summed gradient
    top_k: int | None = None  # also count the examples whose label is among the k most likely
    multi_label: bool = False  # a sigmoid per class, binary cross-entropy
    threshold: float = 0.5  # multi_label: the probability from which a class is predicted
    weighted: bool = False  # multi_label: positives weighted by each class's negatives / positives
    # weight_decay_style=l2: l2_decay x the weight is added to each decayed (l2_decayed) trained
    # weight's gradient, the gradient of l2_decay/2 x |w|^2: it goes through the momentum (MXNet's
    # weight decay for sgd and nag), where Keras' decoupled decay does not
    l2_decay: float = 0.0
    mixing: Mixing | None = None  # MixUp and CutMix: training images mixed, the loss shared (mixing.py)

    @property
    def mixes(self) -> bool:
        """Whether training images are mixed (MixUp or CutMix)."""
        return self.mixing is not None and self.mixing.on

    @classmethod
    def of(cls, config: JobConfig) -> Loss:
        l2 = weight_decay(config) if config.weight_decay_style == "l2" else 0.0
        mixing = Mixing(config.mixup_alpha, config.cutmix_alpha, config.mixup_prob, config.mixup_switch_prob,
                        config.seed)
        return cls(config.label_smoothing, config.class_weights, config.gradient_clip_norm, config.top_k,
                   config.multi_label, config.multi_label_threshold, config.use_weighted_loss, l2, mixing)

    def task(self, num_classes: int) -> SingleLabel | MultiLabel:
        if self.multi_label:
            return MultiLabel(num_classes, self.threshold, self.label_smoothing, self.class_weights, self.weighted)
        return SingleLabel(num_classes, self.label_smoothing, self.class_weights, self.top_k)
