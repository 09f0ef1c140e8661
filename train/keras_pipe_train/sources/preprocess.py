"""Image preprocessing: small pure TF functions, composed into the training and evaluation paths.

Images leave here as float32 RGB in [0, 255], `size` x `size`. Each backbone's own scaling
(to [-1, 1], or caffe's BGR mean subtraction) is part of the model, so the exported model applies
it too and serving cannot drift from training. The serving signature calls `for_eval` itself (in
the MXNet dialect with resize_to None whatever the training's: the built-in serves each image
resized whole, model/export.py's serving_resize).

How an image becomes `size` x `size`: by default the whole image is resized to it (its
aspect not kept); with `resize` N (MXNet's), its shorter side is resized to N, aspect kept, and
`size` x `size` taken from that: from the centre in evaluation and serving, at random in training
with augment crop; with `resize` ORIGINAL (MXNet's without resize), taken so from the image at its
own scale. Every resize uses one interpolation (`resize_interpolation`, tf.image.resize's
methods; bilinear by default). The geometric augmentations' resampling (`transformed`) is not a
resize of the image and stays bilinear: ImageProjectiveTransformV3 offers bilinear and nearest
only.

Augmentation is random, but stateless: each image's crop, flip and colour changes come from a seed
of its own (derived from the epoch, the worker, the batch and its place in it: datasets.py), never
from a random generator's state. An epoch resumed after a stop skips the batches it trained on
before decoding them, and still augments every later image exactly as the uninterrupted epoch did.
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from keras_pipe_train.settings.parsers import RESIZE_ORIGINAL
from keras_pipe_train.sources import auto_augment

# Random-resized-crop bounds. Inception's ImageNet recipe keeps 8-100 % of the area; fine-tuning
# on small datasets of centred objects loses the object too often at 8 %, so crops keep >= 25 %.
CROP_AREA = (0.25, 1.0)
CROP_ASPECT = (3 / 4, 4 / 3)
BRIGHTNESS_DELTA = 32.0  # on the 0..255 scale (Inception's 32/255)
CONTRAST_RANGE = (0.8, 1.2)


def decode(encoded: tf.Tensor) -> tf.Tensor:
    """JPEG, PNG, GIF, BMP or WebP bytes to uint8 RGB (grayscale and alpha are converted)."""

    def webp():
        # TF's WebP decoder cannot drop alpha itself: channels=3 fails on a WebP that has some
        image = tf.io.decode_image(encoded, channels=0, expand_animations=False)
        return image[:, :, :3]

    image = tf.cond(_is_webp(encoded), webp,
                    lambda: tf.io.decode_image(encoded, channels=3, expand_animations=False))
    image.set_shape([None, None, 3])
    return image


def _is_webp(encoded: tf.Tensor) -> tf.Tensor:
    head = _head(encoded)
    return (tf.strings.substr(head, 0, 4) == b"RIFF") & (tf.strings.substr(head, 8, 4) == b"WEBP")


def _crop_window(shape: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """A random [y, x, height, width] window over an image of `shape` (Inception's sampler)."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        min_object_covered=0.1,
        aspect_ratio_range=CROP_ASPECT,
        area_range=CROP_AREA,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.stack([begin[0], begin[1], size[0], size[1]])


# libjpeg decodes a JPEG at 1/2, 1/4 or 1/8 of its size for less work than decoding it whole:
# the inverse DCT and colour conversion run on fewer pixels (entropy decoding, most of a photo's
# cost, stays: docs/speed.md, Figures behind the code's choices: Scaled decoding). Its scale-down
# is a box filter over each 8x8 block, so it also antialiases what plain bilinear resizing would
# alias.
JPEG_RATIOS = (1, 2, 4, 8)


def _jpeg_ratio_index(height: tf.Tensor, width: tf.Tensor, size: int) -> tf.Tensor:
    """Which of JPEG_RATIOS to decode a height x width window at: the largest that leaves both of
    its sides at least `size`, so that resizing to size x size never enlarges what was shrunk."""
    shorter = tf.minimum(height, width)
    return tf.reduce_sum(tf.cast(shorter // tf.constant(JPEG_RATIOS[1:]) >= size, tf.int32))


def decode_jpeg_window(encoded: tf.Tensor, window: tf.Tensor, size: int, dct_method: str = "") -> tf.Tensor:
    """The [y, x, height, width] window of a JPEG, decoded at the smallest of its scales that
    still holds `size` pixels on both sides (only the window is decoded: decode_and_crop_jpeg)."""

    def at(ratio: int):
        # the window in the scaled image's coordinates: libjpeg scales the image, then crops it
        return lambda: tf.io.decode_and_crop_jpeg(encoded, window // ratio, channels=3, ratio=ratio,
                                                  dct_method=dct_method)

    image = tf.switch_case(_jpeg_ratio_index(window[2], window[3], size), [at(r) for r in JPEG_RATIOS])
    image.set_shape([None, None, 3])
    return image


def decode_random_crop(encoded: tf.Tensor, size: int, seed: tf.Tensor, window_of=None) -> tf.Tensor:
    """A random crop, decoded, at least `size` pixels on each side when the image has them. For
    JPEGs only the crop is decoded, scaled down by libjpeg where it is much larger than `size`:
    the main savings of the training path. Other formats are decoded whole. `window_of(shape,
    seed)` draws the crop's [y, x, height, width] (default: Inception's sampler, _crop_window)."""
    window_of = window_of or _crop_window

    def jpeg():
        window = window_of(tf.io.extract_jpeg_shape(encoded), seed)
        # the faster integer IDCT: less decoding time (docs/speed.md, Figures behind the code's
        # choices: Integer IDCT), and its small loss of precision is noise next to the augmentation;
        # evaluation and serving keep the accurate default
        return decode_jpeg_window(encoded, window, size, dct_method="INTEGER_FAST")

    def other():
        image = decode(encoded)
        window = window_of(tf.shape(image), seed)
        return tf.slice(image, [window[0], window[1], 0], [window[2], window[3], 3])

    image = tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
    image.set_shape([None, None, 3])
    return image


def decode_for_size(encoded: tf.Tensor, size: int) -> tf.Tensor:
    """The whole image, decoded; a JPEG scaled down by libjpeg as far as `size` allows."""

    def jpeg():
        shape = tf.io.extract_jpeg_shape(encoded)
        return decode_jpeg_window(encoded, tf.stack([0, 0, shape[0], shape[1]]), size)

    image = tf.cond(tf.io.is_jpeg(encoded), jpeg, lambda: decode(encoded))
    image.set_shape([None, None, 3])
    return image


# the tf.image.resize methods whose kernels have negative lobes: they ring past [0, 255] at edges
OVERSHOOTING = ("bicubic", "lanczos3", "lanczos5", "mitchellcubic")


def resize(image: tf.Tensor, size, interpolation: str = "bilinear") -> tf.Tensor:
    """The image resized to `size` ([height, width], or one side of a square) by tf.image.resize's
    `interpolation`, as float32 in [0, 255]."""
    # Bilinear by default, like Keras' Resizing layer and the reference ImageNet pipelines; never
    # antialiased: antialiasing costs the whole training pipeline far more than it gives
    # (docs/speed.md, Figures behind the code's choices: Resizing), a difference that only matters
    # when shrinking far more than crops of photos usually are (and libjpeg's scaled decoding has
    # shrunk large JPEGs already).
    shape = [size, size] if isinstance(size, int) else size
    # (nearest gives back the input's dtype: uint8 from a decoded image)
    image = tf.cast(tf.image.resize(image, shape, method=interpolation), tf.float32)
    if interpolation in OVERSHOOTING:  # (a decoded image's pixels stay pixels)
        image = tf.clip_by_value(image, 0.0, 255.0)
    return image


# resize_to ORIGINAL: no resize; image_size cropped from each image at its own scale (an image
# smaller than that enlarged to it first). The built-in MXNet algorithm without its `resize`: its ImageRecordIter
# takes image_shape from the image as it is (at its centre, or at random with rand_crop).
ORIGINAL = RESIZE_ORIGINAL  # (resize=original)


def _check_resize(size: int, resize_to: int | str | None) -> None:
    if resize_to not in (None, ORIGINAL) and resize_to < size:
        raise ValueError(f"resize ({resize_to}) must be at least the image size ({size}): the crop is taken from "
                         "the image resized to it")


def shorter_side_shape(height: tf.Tensor, width: tf.Tensor, shorter: int) -> tf.Tensor:
    """[height, width] of an image whose shorter side is resized to `shorter`, its aspect kept:
    the longer side rounded down, as MXNet's ImageRecordIter does (resize * rows / cols in ints)."""
    height, width, shorter = tf.cast(height, tf.int64), tf.cast(width, tf.int64), tf.constant(shorter, tf.int64)
    tall = height > width
    return tf.cast(tf.stack([tf.where(tall, shorter * height // width, shorter),
                             tf.where(tall, shorter, shorter * width // height)]), tf.int32)


def _shape_of(encoded: tf.Tensor, decoded: tf.Tensor) -> tf.Tensor:
    """[height, width] of the image as encoded: a JPEG's header says it (`decoded` may be a scaled
    decode), other formats are decoded at their size."""
    return tf.cond(tf.io.is_jpeg(encoded), lambda: tf.io.extract_jpeg_shape(encoded)[:2],
                   lambda: tf.shape(decoded)[:2])


def decode_shorter_side(encoded: tf.Tensor, shorter: int, interpolation: str = "bilinear") -> tf.Tensor:
    """The whole image, its shorter side resized to `shorter` and its aspect kept (float32). A
    JPEG is decoded at the smallest scale that still holds `shorter` pixels on its shorter side:
    the resize then never enlarges what libjpeg shrank. The resized shape is the full-size
    image's, whatever the scale it was decoded at."""
    image = decode_for_size(encoded, shorter)
    return resize(image, shorter_side_shape(*tf.unstack(_shape_of(encoded, image)), shorter), interpolation)


def decode_at_least(encoded: tf.Tensor, size: int, interpolation: str = "bilinear") -> tf.Tensor:
    """The whole image at its own scale (float32); one whose shorter side is below `size` enlarged
    to it, its aspect kept (a photo a little small is not a reason to stop a job)."""
    image = decode(encoded)
    height, width = tf.unstack(tf.shape(image)[:2])
    return tf.cond(tf.minimum(height, width) < size,
                   lambda: resize(image, shorter_side_shape(height, width, size), interpolation),
                   lambda: tf.cast(image, tf.float32))


def centre_crop(image: tf.Tensor, size: int) -> tf.Tensor:
    """The size x size square at the centre (offsets rounded down, as MXNet's centre crop)."""
    shape = tf.shape(image)
    image = tf.slice(image, [(shape[0] - size) // 2, (shape[1] - size) // 2, 0], [size, size, 3])
    image.set_shape([size, size, 3])
    return image


def _resized_crop_window(size: int, shorter: int | None):
    """The random crop of MXNet's rand_crop over an image resized to `shorter` on its shorter side,
    as a window of the image before the resize: a square of size x (its shorter side / `shorter`)
    pixels, anywhere in the image with the same chance (a window_of for decode_random_crop).
    `shorter` None: the image is not resized (ORIGINAL), the square is size x size (or its shorter
    side, when that is less)."""

    def window_of(shape: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        height, width = shape[0], shape[1]
        side = tf.minimum(height, width)
        span = (tf.constant(size, tf.int32) if shorter is None
                else tf.cast(tf.round(size * tf.cast(side, tf.float64) / shorter), tf.int32))
        span = tf.clip_by_value(span, 1, side)
        spare = tf.cast(tf.stack([height - span + 1, width - span + 1]), tf.float32)
        corner = tf.cast(tf.random.stateless_uniform([2], seed) * spare, tf.int32)
        corner = tf.minimum(corner, tf.cast(spare, tf.int32) - 1)  # (uniform's 1.0 - epsilon, rounded)
        return tf.stack([corner[0], corner[1], span, span])

    return window_of


def random_flip(image: tf.Tensor, seed: tf.Tensor, mode: str = "horizontal") -> tf.Tensor:
    """Left-right, up-down or either (each with its own draw), as Keras' RandomFlip modes."""
    sideways, upside = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    if mode in ("horizontal", "horizontal_and_vertical"):
        image = tf.image.stateless_random_flip_left_right(image, sideways if mode != "horizontal" else seed)
    if mode in ("vertical", "horizontal_and_vertical"):
        image = tf.image.stateless_random_flip_up_down(image, upside)
    return image


@dataclasses.dataclass(frozen=True)
class Geometry:
    """How far the geometric augmentations go (each applies when `augment` names it): rotation as
    a fraction of a full turn either way (Keras' RandomRotation factor: 0.03 is about 11 degrees),
    zoom as the largest change of scale (0.1: 90 to 110 %, out or in), aspect as the largest
    stretch of one side against the other (0.25: MXNet's), shear as the largest slant (0.1)."""

    rotation: float = 0.03
    zoom: float = 0.1
    aspect: float = 0.25
    shear: float = 0.1
    flip: str = "horizontal"  # horizontal, vertical or horizontal_and_vertical

    def draw(self, augment: tuple[str, ...], seed: tf.Tensor) -> tf.Tensor:
        """[angle (radians), zoom, aspect, shear] for one image: each uniform within its bounds
        (zoom and aspect on a log scale, so that in and out are as likely), neutral when `augment`
        leaves it out."""
        uniform = tf.random.stateless_uniform([4], seed, -1.0, 1.0)
        on = tf.constant([float(name in augment) for name in ("rotate", "zoom", "aspect", "shear")])
        angle = uniform[0] * self.rotation * 2 * math.pi
        zoom = tf.exp(uniform[1] * math.log1p(self.zoom))
        aspect = tf.exp(uniform[2] * math.log1p(self.aspect))
        shear = uniform[3] * self.shear
        drawn, neutral = tf.stack([angle, zoom, aspect, shear]), tf.constant([0.0, 1.0, 1.0, 0.0])
        return on * drawn + (1 - on) * neutral


GEOMETRIC = ("rotate", "zoom", "aspect", "shear")


def transformed(image: tf.Tensor, angle, zoom, aspect, shear) -> tf.Tensor:
    """The image turned by `angle`, seen `zoom` times wider (above 1: zoomed out, the edges
    mirrored in), stretched by `aspect` (above 1: narrower) and slanted by `shear`, about its
    centre, in one bilinear resampling (the size stays). The transform maps each output pixel to
    where it samples the input, as ImageProjectiveTransformV3 takes it."""
    shape = tf.shape(image)
    height, width = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    cx, cy = (width - 1) / 2, (height - 1) / 2
    cos, sin = tf.cos(angle), tf.sin(angle)
    sx, sy = zoom * tf.sqrt(aspect), zoom / tf.sqrt(aspect)
    # input = R(angle) . Shear . Scale . (output - centre) + centre
    a0, a1 = cos * sx, (cos * shear - sin) * sy
    b0, b1 = sin * sx, (sin * shear + cos) * sy
    a2 = cx - a0 * cx - a1 * cy
    b2 = cy - b0 * cx - b1 * cy
    transform = tf.reshape(tf.stack([a0, a1, a2, b0, b1, b2, 0.0, 0.0]), [1, 8])
    out = tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None], transforms=transform, output_shape=shape[:2], fill_value=0.0,
        interpolation="BILINEAR", fill_mode="REFLECT")
    return tf.reshape(out[0], shape)


def random_color(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    brightness, contrast = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = tf.image.stateless_random_brightness(image, BRIGHTNESS_DELTA, brightness)
    image = tf.image.stateless_random_contrast(image, *CONTRAST_RANGE, contrast)
    return tf.clip_by_value(image, 0.0, 255.0)


def for_train(encoded: tf.Tensor, size: int, augment: tuple[str, ...], seed: tf.Tensor,
              geometry: Geometry = Geometry(), resize_to: int | str | None = None,
              interpolation: str = "bilinear", policy: auto_augment.Policy | None = None) -> tf.Tensor:
    """The training path; `seed` (int64 [2]) decides every random choice for this image. The crop
    is decoded (fused with the JPEG decoder: only the window, at a reduced scale); the geometric
    changes then apply to the small, resized image, in one resampling. `resize_to`: None, the
    shorter side's length before the crop, or ORIGINAL (for_eval); `interpolation`: every resize's
    method; `policy`: RandAugment's settings, with augment randaugment."""
    _check_resize(size, resize_to)
    crop, flip, color = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    if resize_to is None:
        image = decode_random_crop(encoded, size, crop) if "crop" in augment else decode_for_size(encoded, size)
        image = resize(image, size, interpolation)
    elif "crop" in augment:
        # MXNet's rand_crop after its resize: a size x size square anywhere in the image resized to
        # resize_to on its shorter side, at that one scale and aspect (not Inception's random-resized
        # crop: with resize, what the crop holds is at the scale evaluation's centre crop shows, as
        # in the built-in MXNet algorithm, whose scale and aspect jitter are augmentations of their
        # own: zoom, aspect). It is cut from the image before the resize (the window that becomes
        # that square), so the decoding stays fused; the same square as resizing first, but for
        # where the pixel centres fall.
        window = _resized_crop_window(size, None if resize_to == ORIGINAL else resize_to)
        image = resize(decode_random_crop(encoded, size, crop, window), size, interpolation)
    else:  # as evaluation sees it
        image = for_eval(encoded, size, resize_to, interpolation)
    if any(name in augment for name in GEOMETRIC):
        # (a seed of its own: the other choices stay what they were without these)
        image = transformed(image, *tf.unstack(geometry.draw(augment, tf.random.experimental.stateless_fold_in(
            seed, len(GEOMETRIC)))))
    if "flip" in augment:
        image = random_flip(image, flip, geometry.flip)
    if "color" in augment:
        image = random_color(image, color)
    # (the policies last, on the image as the others left it, each with a seed of its own)
    if "trivial" in augment:
        image = auto_augment.trivial(image, tf.random.experimental.stateless_fold_in(seed, 101))
    if "randaugment" in augment:
        image = auto_augment.randaugment(image, tf.random.experimental.stateless_fold_in(seed, 102), policy)
    return image


def for_eval(encoded: tf.Tensor, size: int, resize_to: int | str | None = None,
             interpolation: str = "bilinear") -> tf.Tensor:
    """The whole image resized to size x size; with `resize_to`, its shorter side resized to it and
    the size x size centre taken (MXNet's resize); ORIGINAL, the size x size centre of the image at
    its own scale. `interpolation`: tf.image.resize's method, for every resize. Used for
    validation and by the exported serving signature."""
    _check_resize(size, resize_to)
    if resize_to is None:
        return resize(decode_for_size(encoded, size), size, interpolation)
    if resize_to == ORIGINAL:
        return decode_centre(encoded, size, interpolation)
    return centre_crop(decode_shorter_side(encoded, resize_to, interpolation), size)


def decode_centre(encoded: tf.Tensor, size: int, interpolation: str = "bilinear") -> tf.Tensor:
    """The size x size centre of the image at its own scale (ORIGINAL), float32. A JPEG that holds
    it decodes that window alone (a full-size photo's centre costs its window, not the photo)."""

    def whole():
        return centre_crop(decode_at_least(encoded, size, interpolation), size)

    def jpeg():
        height, width = tf.unstack(tf.io.extract_jpeg_shape(encoded)[:2])
        window = tf.stack([(height - size) // 2, (width - size) // 2, size, size])
        return tf.cond(tf.minimum(height, width) >= size,
                       lambda: tf.cast(decode_jpeg_window(encoded, window, size), tf.float32), whole)

    image = tf.cond(tf.io.is_jpeg(encoded), jpeg, whole)
    image.set_shape([size, size, 3])
    return image


_HEAD_BYTES = 32
_ZEROS = b"\0" * _HEAD_BYTES


def _head(encoded: tf.Tensor) -> tf.Tensor:
    """The first 32 bytes, zero-padded: substr fails on positions past the end of a short string."""
    return tf.strings.substr(tf.strings.join([tf.strings.substr(encoded, 0, _HEAD_BYTES), _ZEROS]), 0, _HEAD_BYTES)


def header_pixels(encoded: tf.Tensor) -> tf.Tensor:
    """Width x height of an encoded image read from its header, without decoding it (int64); -1
    when it is not a JPEG, PNG, GIF, BMP or WebP image. In TensorFlow ops, so that the exported
    serving signature can refuse a decompression bomb before decoding it; keras_pipe_train.sources.images checks
    training data the same way in Python (tests hold both to the same answers)."""
    head = _head(encoded)
    data = tf.cast(tf.io.decode_raw(head, tf.uint8), tf.int64)

    def little(start: int, count: int) -> tf.Tensor:
        return sum(data[start + k] * 256**k for k in range(count))

    def big(start: int, count: int) -> tf.Tensor:
        return sum(data[start + k] * 256 ** (count - 1 - k) for k in range(count))

    def bits(value: tf.Tensor, shift: int, count: int) -> tf.Tensor:
        return tf.bitwise.bitwise_and(tf.bitwise.right_shift(value, shift), 2**count - 1)

    def signed32(value: tf.Tensor) -> tf.Tensor:
        return tf.where(value >= 2**31, value - 2**32, value)

    magic = lambda start, count: tf.strings.substr(head, start, count)  # noqa: E731
    vp8l = little(21, 4)
    webp = tf.where(magic(12, 4) == "VP8 ", bits(little(26, 2), 0, 14) * bits(little(28, 2), 0, 14),
           tf.where(magic(12, 4) == "VP8L", (bits(vp8l, 0, 14) + 1) * (bits(vp8l, 14, 14) + 1),
           tf.where(magic(12, 4) == "VP8X", (little(24, 3) + 1) * (little(27, 3) + 1), tf.constant(-1, tf.int64))))
    other = tf.where(magic(0, 8) == b"\x89PNG\r\n\x1a\n", big(16, 4) * big(20, 4),
            tf.where(magic(0, 4) == b"GIF8", little(6, 2) * little(8, 2),
            tf.where(magic(0, 2) == b"BM", tf.abs(signed32(little(18, 4))) * tf.abs(signed32(little(22, 4))),
            tf.where((magic(0, 4) == b"RIFF") & (magic(8, 4) == b"WEBP"), webp, tf.constant(-1, tf.int64)))))
    return tf.cond(tf.io.is_jpeg(encoded),
                   lambda: tf.reduce_prod(tf.cast(tf.io.extract_jpeg_shape(encoded)[:2], tf.int64)),
                   lambda: other)


def checked(encoded: tf.Tensor, max_pixels: int) -> tf.Tensor:
    """`encoded`, once its header shows a supported image of at most max_pixels pixels; else an
    InvalidArgumentError saying which (a request the serving signature refuses)."""
    pixels = header_pixels(encoded)
    with tf.control_dependencies([
        tf.debugging.assert_non_negative(pixels, message="the image is not a JPEG, PNG, GIF, BMP or WebP image"),
        tf.debugging.assert_less_equal(pixels, tf.constant(max_pixels, tf.int64),
                                       message=f"the image has more than max_image_pixels ({max_pixels}) pixels"),
    ]):
        return tf.identity(encoded)


def batch_of(fn, encoded_batch: tf.Tensor, size: int) -> tf.Tensor:
    """Applies a per-image function to a batch of encoded images."""
    return tf.map_fn(fn, encoded_batch, fn_output_signature=tf.TensorSpec([size, size, 3], tf.float32))


def served_batch(encoded_batch: tf.Tensor, size: int, resize_to: int | str | None, interpolation: str,
                 max_pixels: int | None = None) -> tf.Tensor:
    """A batch of encoded images prepared as the served model prepares them (for_eval; each one's
    header checked first with `max_pixels`): the SavedModel's serving signature, and the images its
    exports are given (keras-pipe predict, serve on ONNX Runtime, keras-pipe export's check)."""
    def one(encoded):
        return for_eval(encoded if max_pixels is None else checked(encoded, max_pixels), size, resize_to,
                        interpolation)

    return batch_of(one, encoded_batch, size)


def seeded_batch_of(fn, encoded_batch: tf.Tensor, size: int, batch_seed: tf.Tensor) -> tf.Tensor:
    """Applies fn(encoded, seed) to each image of a batch, the i-th image's seed folded from the
    batch's (int64 [2]) and i: each image gets its own random choices, the same ones every time."""
    count = tf.shape(encoded_batch, out_type=tf.int64)[0]
    seeds = tf.map_fn(lambda i: tf.random.experimental.stateless_fold_in(batch_seed, i), tf.range(count),
                      fn_output_signature=tf.TensorSpec([2], tf.int64))
    return tf.map_fn(lambda pair: fn(pair[0], pair[1]), (encoded_batch, seeds),
                     fn_output_signature=tf.TensorSpec([size, size, 3], tf.float32))


def thumbnail(image: tf.Tensor, side: int, quality: int = 85) -> tf.Tensor:
    """A model input image (0-255 floats, height x width x 3) as a JPEG (a scalar string) of at
    most `side` pixels a side: shrunk with antialiasing, or a tiny one enlarged to at least half
    of `side`, its pixels kept sharp, so that a person sees it."""
    image = tf.convert_to_tensor(image, tf.float32)
    shape = tf.shape(image)
    longer = tf.cast(tf.maximum(shape[0], shape[1]), tf.float32)
    scale = tf.where(longer > side, side / longer,
                     tf.where(longer < side // 2, tf.floor((side // 2) / longer), 1.0))
    target = tf.maximum(1, tf.cast(tf.round(tf.cast(shape[:2], tf.float32) * scale), tf.int32))
    pixels = tf.cond(scale < 1, lambda: tf.image.resize(image, target, antialias=True),
                     lambda: tf.image.resize(image, target, method="nearest"))
    return tf.io.encode_jpeg(tf.cast(tf.clip_by_value(tf.round(pixels), 0, 255), tf.uint8), quality=quality)


def thumbnails(images: tf.Tensor, side: int) -> tf.Tensor:
    """thumbnail() of each image of a batch: a string per image."""
    return tf.map_fn(lambda image: thumbnail(image, side), images, fn_output_signature=tf.TensorSpec([], tf.string))
