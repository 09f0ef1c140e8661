"""RandAugment and TrivialAugment: image operations drawn at random, each at a drawn or given
strength, as timm and torchvision apply them to ImageNet training images.

  trivial      TrivialAugment Wide, as torchvision's TrivialAugmentWide: one operation an image, at a
               strength drawn uniformly over its wide ranges. Müller and Hutter, ICCV 2021; the
               augmentation AutoGluon's maintainers found best.
  randaugment  RandAugment (Cubuk et al., NeurIPS 2020) with torchvision's operations and ranges,
               `randaugment_ops` of them an image, each applied with probability 0.5 as timm
               applies them, at `randaugment_magnitude` out of 10 as timm counts it (the m of
               timm's rand-m9-n2). Not exactly either library's: timm's own list
               has Invert and SolarizeAdd and no Identity, and at m9 its default variant enhances
               by a fixed 1.72, solarizes above 230 and keeps 3 bits (its -inc1 variant's
               enhancements and solarize grow with the magnitude as here); torchvision's own counts
               the magnitude out of 30 and applies every operation drawn.

The 14 operations are PIL's, as torchvision defines both policies: identity, auto-contrast,
equalize, rotate, solarize, color, posterize, contrast, brightness, sharpness, shear x and y,
translate x and y. They work here on float images in [0, 255] with TensorFlow ops, checked against
PIL's own (tests/job/sources/test_auto_augment.py), each image drawn from its own stateless seed
(preprocess.for_train's), so a resumed job augments every image as the uninterrupted one did.
Rotation is about the image's centre, shears about its top-left corner, as PIL's calls in both
libraries; nearest-neighbour; uncovered pixels grey (128: timm's fill without a dataset mean;
torchvision's is black). Full strength (TrivialAugment Wide / RandAugment at magnitude 10): shear
0.99 / 0.3, translate 32 px at 224 (a seventh of the side; torchvision's is 32 px at any size) /
45 % of the side, rotate 135 / 30 degrees, the four enhancements 1 +- 0.99 / 0.9, posterize to 2 /
4 bits, solarize down to a threshold of 0 / 0.
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

OPS = ("identity", "auto_contrast", "equalize", "rotate", "solarize", "color", "posterize", "contrast", "brightness",
       "sharpness", "shear_x", "shear_y", "translate_x", "translate_y")
FILL = 128.0


@dataclasses.dataclass(frozen=True)
class Ranges:
    """Each operation's strength at full magnitude."""

    shear: float
    translate: float  # a fraction of the image's side
    rotate: float  # degrees
    enhance: float  # brightness, color, contrast, sharpness: factor 1 +- this
    posterize_bits: float  # the fewest bits kept
    solarize: float  # the lowest threshold (of 255)


WIDE = Ranges(shear=0.99, translate=32 / 224, rotate=135.0, enhance=0.99, posterize_bits=2.0, solarize=0.0)
STANDARD = Ranges(shear=0.3, translate=0.45, rotate=30.0, enhance=0.9, posterize_bits=4.0, solarize=0.0)


@dataclasses.dataclass(frozen=True)
class Policy:
    """RandAugment's hyperparameters' values (their defaults are theirs: settings/hyperparameters.py)."""

    ops: int  # randaugment_ops: operations an image
    magnitude: float  # randaugment_magnitude: out of 10


def trivial(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """TrivialAugment Wide: one operation, drawn uniformly, at a strength drawn uniformly."""
    which, strength, sign = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    op = tf.random.stateless_uniform([], which, 0, len(OPS), tf.int32)
    level = tf.random.stateless_uniform([], strength)
    return apply(image, op, level, _sign(sign), WIDE)


def randaugment(image: tf.Tensor, seed: tf.Tensor, policy: Policy) -> tf.Tensor:
    """RandAugment: `policy.ops` operations, each drawn uniformly and applied with probability 0.5,
    at the magnitude given."""
    level = policy.magnitude / 10.0
    for seeds in tf.unstack(tf.random.experimental.stateless_split(seed, policy.ops)):
        which, chance, sign = tf.unstack(tf.random.experimental.stateless_split(seeds, 3))
        op = tf.random.stateless_uniform([], which, 0, len(OPS), tf.int32)
        applied = apply(image, op, tf.constant(level, tf.float32), _sign(sign), STANDARD)
        image = tf.where(tf.random.stateless_uniform([], chance) < 0.5, applied, image)
    return image


def _sign(seed: tf.Tensor) -> tf.Tensor:
    return tf.where(tf.random.stateless_uniform([], seed) < 0.5, -1.0, 1.0)


def apply(image: tf.Tensor, op, level, sign, ranges: Ranges) -> tf.Tensor:
    """Operation number `op` of OPS at `level` (0 to 1 of its range), signed where it has a
    direction."""
    image = tf.cast(image, tf.float32)
    size = tf.cast(tf.shape(image)[0], tf.float32)
    branches = [
        lambda: image,
        lambda: auto_contrast(image),
        lambda: equalize(image),
        lambda: rotate(image, sign * level * ranges.rotate),
        lambda: solarize(image, 255.0 - level * (255.0 - ranges.solarize)),
        lambda: color(image, 1.0 + sign * level * ranges.enhance),
        lambda: posterize(image, tf.cast(tf.round(8.0 - level * (8.0 - ranges.posterize_bits)), tf.int32)),
        lambda: contrast(image, 1.0 + sign * level * ranges.enhance),
        lambda: brightness(image, 1.0 + sign * level * ranges.enhance),
        lambda: sharpness(image, 1.0 + sign * level * ranges.enhance),
        lambda: shear(image, x=sign * level * ranges.shear),
        lambda: shear(image, y=sign * level * ranges.shear),
        lambda: translate(image, x=sign * level * ranges.translate * size),
        lambda: translate(image, y=sign * level * ranges.translate * size),
    ]
    out = tf.switch_case(tf.cast(op, tf.int32), branches)
    return tf.reshape(tf.clip_by_value(out, 0.0, 255.0), tf.shape(image))


def _blend(degenerate: tf.Tensor, image: tf.Tensor, factor) -> tf.Tensor:
    """PIL's ImageEnhance: degenerate + factor x (image - degenerate)."""
    return tf.clip_by_value(degenerate + factor * (image - degenerate), 0.0, 255.0)


def _grey(image: tf.Tensor) -> tf.Tensor:
    """PIL's "L" conversion (ITU-R 601-2 luma), as three channels."""
    luma = tf.reduce_sum(image * tf.constant([0.299, 0.587, 0.114]), axis=-1, keepdims=True)
    return tf.broadcast_to(luma, tf.shape(image))


def brightness(image, factor):
    return _blend(tf.zeros_like(image), image, factor)


def color(image, factor):
    return _blend(_grey(image), image, factor)


def contrast(image, factor):
    return _blend(tf.fill(tf.shape(image), tf.reduce_mean(_grey(image)[..., 0])), image, factor)


def sharpness(image, factor):
    """Blended with PIL's SMOOTH filter of the image (its border pixels kept)."""
    kernel = tf.constant([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13.0
    kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
    smooth = tf.nn.depthwise_conv2d(image[None], kernel, [1, 1, 1, 1], "VALID")[0]
    smooth = tf.pad(smooth, [[1, 1], [1, 1], [0, 0]])
    inside = tf.pad(tf.ones(tf.shape(smooth)[:2] - 2), [[1, 1], [1, 1]])[..., None] > 0
    return _blend(tf.where(inside, smooth, image), image, factor)


def solarize(image, threshold):
    return tf.where(image >= threshold, 255.0 - image, image)


def posterize(image, bits):
    step = tf.cast(tf.bitwise.left_shift(1, 8 - bits), tf.float32)
    return tf.floor(tf.round(image) / step) * step


def auto_contrast(image):
    """Each channel stretched so that its darkest pixel is 0 and its lightest 255 (a flat channel
    is left as it is)."""
    low = tf.reduce_min(image, axis=[0, 1], keepdims=True)
    high = tf.reduce_max(image, axis=[0, 1], keepdims=True)
    spread = high - low
    return tf.where(spread > 0, (image - low) * 255.0 / tf.maximum(spread, 1e-6), image)


def equalize(image):
    """Each channel's histogram equalized as PIL's ImageOps.equalize does: the cumulative histogram,
    without its last bin's count, spread over 0-255."""
    pixels = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.int32)

    def channel(values):
        histogram = tf.math.bincount(tf.reshape(values, [-1]), minlength=256, maxlength=256)
        nonzero = tf.boolean_mask(histogram, histogram > 0)
        step = (tf.reduce_sum(nonzero) - nonzero[-1]) // 255
        lut = (tf.cumsum(histogram) - histogram + step // 2) // tf.maximum(step, 1)
        lut = tf.clip_by_value(lut, 0, 255)
        equalized = tf.gather(lut, values)
        return tf.where(step > 0, equalized, values)

    channels = [channel(pixels[..., c]) for c in range(3)]
    return tf.cast(tf.stack(channels, axis=-1), tf.float32)


def rotate(image, degrees):
    """PIL's Image.rotate: counter-clockwise about the image's centre."""
    shape = tf.shape(image)
    cx, cy = tf.cast(shape[1], tf.float32) / 2, tf.cast(shape[0], tf.float32) / 2
    angle = tf.cast(degrees, tf.float32) * math.pi / 180
    a, b, d, e = tf.cos(angle), -tf.sin(angle), tf.sin(angle), tf.cos(angle)
    return _transform(image, a, b, cx - a * cx - b * cy, d, e, cy - d * cx - e * cy)


def shear(image, x=0.0, y=0.0):
    """timm's and torchvision's shear: about the top-left corner (PIL's (1, x, 0, y, 1, 0))."""
    return _transform(image, 1.0, x, 0.0, y, 1.0, 0.0)


def translate(image, x=0.0, y=0.0):
    """The image moved left by x pixels and up by y (each output pixel samples x, y further on)."""
    return _transform(image, 1.0, 0.0, x, 0.0, 1.0, y)


def _transform(image, a, b, c, d, e, f):
    """PIL's AFFINE transform (output pixel centre (x, y) samples the input at (a x + b y + c,
    d x + e y + f)), nearest-neighbour as the policies' PIL calls, uncovered pixels FILL. Pixel
    centres lie at +0.5 in PIL's coordinates and at the integers in TensorFlow's, hence the shift."""
    a, b, c, d, e, f = (tf.cast(v, tf.float32) for v in (a, b, c, d, e, f))
    c, f = c + 0.5 * (a + b) - 0.5, f + 0.5 * (d + e) - 0.5
    transform = tf.reshape(tf.stack([a, b, c, d, e, f, 0.0, 0.0]), [1, 8])
    out = tf.raw_ops.ImageProjectiveTransformV3(images=image[None], transforms=transform,
                                                output_shape=tf.shape(image)[:2], fill_value=FILL,
                                                interpolation="NEAREST", fill_mode="CONSTANT")
    return out[0]
