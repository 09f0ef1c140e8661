"""MixUp and CutMix: each training batch's images blended with, or patched from, another's, and the
loss taken against both images' labels in the same shares, as timm's Mixup does (its defaults for
ImageNet: mixup_alpha 0.8, cutmix_alpha 1.0, one of the two per batch at a switch probability of
0.5). MixUp: Zhang et al., ICLR 2018; CutMix: Yun et al., ICCV 2019.

The partner of each image is the batch reversed (timm's), and the share λ is drawn once a batch
from Beta(alpha, alpha). For CutMix the box is drawn to cover 1 - λ of the image, and λ is then
the share the image keeps after the box is clipped to it. The cross-entropy and the binary
cross-entropy are linear in their targets, so λ x loss(own labels) + (1 - λ) x loss(partner's)
is the loss against the mixed labels, label smoothing, class weights and multi-label included
(loop.py takes it so).

Every draw is stateless, from the job's seed, the replica and the optimizer's step count, which
checkpoints hold: a resumed job mixes each batch as the uninterrupted one did.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Mixing:
    """The hyperparameters' values (their defaults are theirs: settings/hyperparameters.py)."""

    mixup_alpha: float  # 0: no MixUp
    cutmix_alpha: float  # 0: no CutMix
    probability: float  # the share of batches mixed at all
    switch_probability: float  # with both: the share of mixed batches that CutMix
    seed: int

    @property
    def on(self) -> bool:
        return self.probability > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)

    def mix(self, images: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(the batch's images mixed with the batch reversed, the share λ of each image's own
        labels: 1 where the batch is not mixed). `seed`: a stateless seed, shape [2]."""
        seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 5)
        mixed = tf.random.stateless_uniform([], seeds[0]) < self.probability
        cut = self._cuts(seeds[1])
        alpha = tf.where(cut, self.cutmix_alpha, self.mixup_alpha)
        share = _beta(alpha, seeds[2])
        partner = tf.reverse(images, [0])
        height, width = tf.shape(images)[1], tf.shape(images)[2]
        mask, kept = _box(height, width, share, seeds[3])
        own = tf.cast(share, images.dtype)
        images_out = tf.where(cut, tf.where(mask[None, :, :, None], partner, images),
                              own * images + (1 - own) * partner)
        share = tf.where(cut, kept, share)
        images_out = tf.where(mixed, images_out, images)
        share = tf.where(mixed, share, 1.0)
        return images_out, tf.fill([tf.shape(images)[0]], share)

    def _cuts(self, seed: tf.Tensor) -> tf.Tensor:
        if self.mixup_alpha <= 0:
            return tf.constant(True)
        if self.cutmix_alpha <= 0:
            return tf.constant(False)
        return tf.random.stateless_uniform([], seed) < self.switch_probability

    def partner_of(self, labels: tf.Tensor) -> tf.Tensor:
        """The labels of each image's partner (the batch reversed)."""
        return tf.reverse(labels, [0])

    def step_seed(self, replica, first_epoch: int, step) -> tf.Tensor:
        """The stateless seed of one replica's batch: the job's seed, the phase (its first epoch:
        each phase's optimizer counts its steps from 0), the replica, the step."""
        seed = tf.constant([self.seed % (1 << 62), first_epoch], tf.int64)
        seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(replica, tf.int64))
        return tf.random.experimental.stateless_fold_in(seed, tf.cast(step, tf.int64))

    def per_example_loss(self, task, labels: tf.Tensor, share: tf.Tensor, probabilities: tf.Tensor) -> tf.Tensor:
        """λ x the loss against each image's labels + (1 - λ) x against its partner's: both losses
        are linear in their targets, so this is the loss against the mixed labels."""
        own = task.per_example_loss(True, labels, probabilities)
        return share * own + (1 - share) * task.per_example_loss(True, self.partner_of(labels), probabilities)


def _beta(alpha: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """One draw of Beta(alpha, alpha), as X / (X + Y) of two Gamma(alpha) draws (1 where alpha is 0:
    that mix is off)."""
    alpha = tf.maximum(tf.cast(alpha, tf.float32), 1e-6)
    x, y = tf.unstack(tf.random.stateless_gamma([2], seed, alpha))
    return tf.where(alpha > 1e-6, x / tf.maximum(x + y, 1e-12), 1.0)


def _box(height: tf.Tensor, width: tf.Tensor, share: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(a [height, width] mask of a box covering 1 - share of the image, centred at random and
    clipped to it, as CutMix draws it; the share of the image outside the box)."""
    h, w = tf.cast(height, tf.float32), tf.cast(width, tf.float32)
    side = tf.sqrt(1.0 - share)
    centre = tf.random.stateless_uniform([2], seed) * tf.stack([h, w])
    top = tf.cast(tf.clip_by_value(tf.round(centre[0] - side * h / 2), 0, h), tf.int32)
    bottom = tf.cast(tf.clip_by_value(tf.round(centre[0] + side * h / 2), 0, h), tf.int32)
    left = tf.cast(tf.clip_by_value(tf.round(centre[1] - side * w / 2), 0, w), tf.int32)
    right = tf.cast(tf.clip_by_value(tf.round(centre[1] + side * w / 2), 0, w), tf.int32)
    rows, columns = tf.range(height), tf.range(width)
    inside_rows = (rows >= top) & (rows < bottom)
    inside_columns = (columns >= left) & (columns < right)
    mask = inside_rows[:, None] & inside_columns[None, :]
    kept = 1.0 - tf.cast((bottom - top) * (right - left), tf.float32) / (h * w)
    return mask, kept
