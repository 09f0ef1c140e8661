"""resize (MXNet's: the shorter side resized to it, then image_size taken from the centre, or at
random in training with augment crop) and resize_interpolation (tf.image.resize's methods): the
preprocessing against references computed with tf.image directly, and the exported serving
signature, which must prepare an image as validation did."""

import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_train.settings.config import INTERPOLATIONS, JobConfig
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.sources import preprocess

RNG = np.random.default_rng(4)
WIDE = RNG.integers(0, 256, (37, 53, 3), dtype=np.uint8)
TALL = RNG.integers(0, 256, (61, 44, 3), dtype=np.uint8)
SEED = tf.constant([5, 11], tf.int64)


def png(picture) -> tf.Tensor:
    return tf.io.encode_png(picture)


def reference(picture, size: int, shorter: int, method: str = "bilinear") -> np.ndarray:
    """The size x size centre of the picture resized to `shorter` on its shorter side, computed
    here with tf.image alone (the longer side rounded down, the offsets too, as MXNet's)."""
    height, width = picture.shape[:2]
    shape = (shorter, width * shorter // height) if height <= width else (height * shorter // width, shorter)
    resized = tf.cast(tf.image.resize(picture, shape, method=method), tf.float32)
    cropped = tf.image.crop_to_bounding_box(resized, (shape[0] - size) // 2, (shape[1] - size) // 2, size, size)
    return np.clip(cropped.numpy(), 0, 255)


def in_dataset(fn, value):
    return next(iter(tf.data.Dataset.from_tensors(value).map(fn))).numpy()


@pytest.mark.parametrize("picture", [WIDE, TALL], ids=["wide", "tall"])
@pytest.mark.parametrize(("size", "shorter"), [(32, 40), (32, 32), (24, 37)])
def test_resize_takes_the_centre_of_the_image_resized_on_its_shorter_side(picture, size, shorter):
    fn = lambda x: preprocess.for_eval(x, size, shorter)  # noqa: E731
    out = fn(png(picture)).numpy()
    assert out.shape == (size, size, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out, reference(picture, size, shorter))
    np.testing.assert_array_equal(in_dataset(fn, png(picture).numpy()), out)
    # training without augment crop sees the same centre (augmentations aside)
    np.testing.assert_array_equal(preprocess.for_train(png(picture), size, (), SEED, resize_to=shorter).numpy(), out)


def test_a_jpeg_with_resize_is_the_reference_and_large_ones_decode_scaled_down_to_resize_not_size():
    small = tf.io.encode_jpeg(WIDE, quality=100)  # (decoded at its full size: the same pixels)
    whole = tf.io.decode_jpeg(small, channels=3).numpy()
    np.testing.assert_array_equal(preprocess.for_eval(small, 32, 40).numpy(), reference(whole, 32, 40))
    # 1200x1600 at resize 300: libjpeg's 1/4 (300x400), the largest scale that keeps 300 rows, not
    # the 1/8 that image_size 128 alone would allow (its stripes, 6 pixels apart at 1/4, would be 3
    # apart at 1/8, blurred away: 14.7 from the reference, where 1/4 is 4.3)
    yy, xx = np.mgrid[:1200, :1600]
    stripes = 128 + 100 * np.sin(2 * np.pi * xx / 24.0)
    large = tf.io.encode_jpeg(np.stack([stripes, yy * 255 // 1200, 255 - stripes], -1).astype(np.uint8), quality=95)
    out = preprocess.for_eval(large, 128, 300).numpy()
    resized = tf.image.resize(tf.io.decode_jpeg(large), [300, 400], antialias=True).numpy()
    assert np.abs(out - resized[86:214, 136:264]).mean() < 7.0


@pytest.mark.parametrize("method", INTERPOLATIONS)
def test_each_interpolation_resizes_as_tf_image_resize_does(method):
    """Every resize of the image: the whole image's (evaluation, training, serving), the shorter
    side's with resize, and the training crop's. Methods that ring past 0..255 are clipped."""
    whole = np.clip(tf.cast(tf.image.resize(WIDE, [32, 32], method=method), tf.float32).numpy(), 0, 255)
    out = preprocess.for_eval(png(WIDE), 32, interpolation=method).numpy()
    np.testing.assert_array_equal(out, whole)
    np.testing.assert_array_equal(preprocess.for_train(png(WIDE), 32, (), SEED, interpolation=method).numpy(), whole)
    np.testing.assert_array_equal(preprocess.for_eval(png(TALL), 24, 40, method).numpy(),
                                  reference(TALL, 24, 40, method))
    if method != "bilinear":
        assert not np.array_equal(out, preprocess.for_eval(png(WIDE), 32).numpy())
        for augment in (("crop",), ("crop", "flip", "color", "rotate")):  # (one seed: the same crop)
            for resize_to in (None, 40):
                assert not np.array_equal(
                    preprocess.for_train(png(WIDE), 32, augment, SEED, resize_to=resize_to, interpolation=method),
                    preprocess.for_train(png(WIDE), 32, augment, SEED, resize_to=resize_to))


def test_the_training_crop_with_resize_is_a_square_of_the_resized_image_at_its_scale():
    """MXNet's rand_crop after its resize: each seed's crop is (within resampling noise) one of the
    size x size squares of the image resized to `resize` on its shorter side, anywhere in it; not
    Inception's random-resized crop, whose scale varies."""
    yy, xx = np.mgrid[:90, :120]
    # (smooth: a crop's corner falls between the resized image's pixels, which a sharp picture would
    # show as a difference)
    smooth = np.stack([xx, yy, 128 + 60 * np.sin(xx / 15.0) * np.cos(yy / 12.0)], -1).astype(np.uint8)
    resized = tf.image.resize(smooth, [48, 64]).numpy()
    offsets, differences = set(), []
    for i in range(12):
        crop = preprocess.for_train(png(smooth), 32, ("crop",), tf.constant([3, i], tf.int64), resize_to=48).numpy()
        errors = {(y, x): np.abs(crop - resized[y:y + 32, x:x + 32]).mean() for y in range(17) for x in range(33)}
        best = min(errors, key=errors.get)
        offsets.add(best)
        differences.append(errors[best])
    # (0.1 to 1.4 here, 0.7 on average; Inception's crops of the same picture: 1.4 to 10.5, 5.5)
    assert max(differences) < 2.0 and np.mean(differences) < 1.2, differences
    assert len(offsets) >= 8  # anywhere, not always the centre


def test_resize_below_image_size_is_refused_at_configuration_naming_both():
    with pytest.raises(UserError, match=r"hyperparameter resize \(48\) must be at least image_size \(64\)"):
        JobConfig.from_hyperparameters({"num_classes": "3", "image_size": "64", "resize": "48"})
    assert JobConfig.from_hyperparameters({"num_classes": "3", "image_size": "64", "resize": "64"}).resize == 64
    with pytest.raises(ValueError, match=r"resize \(30\) must be at least the image size \(32\)"):
        preprocess.for_eval(png(WIDE), 32, 30)


def test_the_served_model_prepares_images_as_validation_does(tmp_path):
    """A tiny model exported with resize and an interpolation: the SavedModel's answer to a JPEG is
    the Keras model's on for_eval's image of it (the centre of the resized image), not on the
    whole image resized."""
    import keras

    from keras_pipe_train.model import classifier as M
    from keras_pipe_train.model.export import export

    keras.utils.set_random_seed(3)
    backbone = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255),
                                 keras.layers.Conv2D(8, 3, strides=2, activation="relu")], name="tiny")
    classifier = M.build_classifier("mobilenet_v3_small", backbone, 3, 0.0, batchnorm_frozen=False)
    head = classifier.get_layer("classifier")
    head.set_weights([keras.random.normal(w.shape, stddev=3.0, seed=5).numpy() for w in head.get_weights()])
    serving = tf.saved_model.load(str(export(classifier, ("a", "b", "c"), 32, tmp_path / "model", resize_to=40,
                                             interpolation="bicubic")))
    # a wide picture whose sides differ from its centre: red edges, a blue middle with some texture
    picture = np.zeros((48, 96, 3), np.uint8)
    picture[:, :24], picture[:, 72:] = (230, 20, 20), (230, 20, 20)
    picture[:, 24:72] = np.stack([np.full((48, 48), 30), RNG.integers(0, 120, (48, 48)), np.full((48, 48), 220)], -1)
    jpeg = tf.io.encode_jpeg(picture, quality=95)
    answer = serving.signatures["serving_default"](image_bytes=tf.stack([jpeg]))["probabilities"].numpy()
    validated = classifier(preprocess.for_eval(jpeg, 32, 40, "bicubic")[None]).numpy()
    np.testing.assert_allclose(answer, validated, atol=1e-5)
    whole = classifier(preprocess.for_eval(jpeg, 32)[None]).numpy()
    assert np.abs(answer - whole).max() > 1e-3  # (what it would answer without resize)


@pytest.mark.parametrize("picture", [WIDE, TALL], ids=["wide", "tall"])
def test_resize_original_takes_the_centre_of_the_image_at_its_own_scale(picture):
    """resize=original (the MXNet dialect without resize, as MXNet's ImageRecordIter crops
    image_shape out of each image as it is): the size x size centre of the decoded pixels, in
    validation and in training without augment crop."""
    size = 24
    height, width = picture.shape[:2]
    expected = picture[(height - size) // 2:(height - size) // 2 + size, (width - size) // 2:(width - size) // 2 + size]
    out = preprocess.for_eval(png(picture), size, preprocess.ORIGINAL).numpy()
    np.testing.assert_array_equal(out, expected.astype(np.float32))
    np.testing.assert_array_equal(in_dataset(lambda x: preprocess.for_eval(x, size, "original"), png(picture).numpy()),
                                  out)
    np.testing.assert_array_equal(preprocess.for_train(png(picture), size, (), SEED, resize_to="original").numpy(),
                                  out)


def test_resize_original_decodes_a_large_jpegs_centre_alone_and_gets_the_whole_decodes_centre():
    """A JPEG photo of 1200 x 1600 at image_size 64: the window decoded alone (decode_and_crop_jpeg)
    is the centre of the photo decoded whole, to libjpeg's rounding (its chroma upsampling differs
    at the window's edges: 6 at most here, 0.045 on average; a window a row off is 0.38 away on
    average, a column off 2.8)."""
    yy, xx = np.mgrid[:1200, :1600]
    photo = np.stack([xx * 255 // 1600, yy * 255 // 1200, 128 + 100 * np.sin(xx / 9.0)], -1).astype(np.uint8)
    jpeg = tf.io.encode_jpeg(photo, quality=95)
    whole = tf.io.decode_jpeg(jpeg).numpy().astype(np.float32)[568:632, 768:832]
    out = preprocess.for_eval(jpeg, 64, "original").numpy()
    assert out.shape == (64, 64, 3) and np.abs(out - whole).mean() < 0.1, np.abs(out - whole).mean()


def test_resize_original_enlarges_a_smaller_image_to_image_size_first():
    """An image whose shorter side is below image_size: resized up to it on that side (the built-in
    fails there), then its centre taken."""
    out = preprocess.for_eval(png(WIDE), 48, "original").numpy()  # (37 x 53 -> 48 x 68)
    np.testing.assert_array_equal(out, reference(WIDE, 48, 48))


def test_the_training_crop_with_resize_original_is_a_square_of_the_image_itself():
    """augment crop with resize=original: a size x size square of the image's own pixels, anywhere
    in it (MXNet's rand_crop without resize), whatever the format (PNG, and JPEG's fused decoding)."""
    yy, xx = np.mgrid[:37, :53]
    smooth = np.stack([xx * 4, yy * 6, 128 + 60 * np.sin(xx / 5.0) * np.cos(yy / 4.0)], -1).astype(np.uint8)
    for encode, tolerance in ((png, 0.0), (lambda picture: tf.io.encode_jpeg(picture, quality=100), 1.5)):
        encoded = encode(smooth)
        pixels = tf.io.decode_image(encoded, channels=3).numpy().astype(np.float32)
        offsets = set()
        for i in range(12):
            crop = preprocess.for_train(encoded, 24, ("crop",), tf.constant([9, i], tf.int64),
                                        resize_to="original").numpy()
            assert crop.shape == (24, 24, 3)
            # (JPEG: the crop is decoded alone, by the faster integer IDCT: within rounding of the whole's)
            errors = {(y, x): np.abs(crop - pixels[y:y + 24, x:x + 24]).mean() for y in range(14) for x in range(30)}
            best = min(errors, key=errors.get)
            assert errors[best] <= tolerance, (i, errors[best])
            offsets.add(best)
        assert len(offsets) >= 8


def test_resize_original_is_taken_as_a_hyperparameter_and_the_mxnet_dialect_sets_it_without_resize():
    assert JobConfig.from_hyperparameters({"num_classes": "3", "image_size": "64", "resize": "Original"}).resize == \
        "original"
    mxnet = {"num_classes": "3", "num_training_samples": "30", "image_shape": "3,64,64", "use_pretrained_model": "0"}
    assert JobConfig.from_hyperparameters(mxnet).resize == "original"
    assert JobConfig.from_hyperparameters({**mxnet, "resize": "80"}).resize == 80


def test_the_mxnet_dialects_served_model_resizes_each_image_whole_whatever_its_training_resize():
    """AWS: "The input image is resized automatically" at inference: the MXNet dialect's export
    resizes each image to image_shape whole; the others prepare it as validation did."""
    from keras_pipe_train.job import serving_resize

    mxnet = {"num_classes": "3", "num_training_samples": "30", "image_shape": "3,64,64", "use_pretrained_model": "0"}
    assert serving_resize(JobConfig.from_hyperparameters({**mxnet, "resize": "80"})) is None
    assert serving_resize(JobConfig.from_hyperparameters(mxnet)) is None
    assert serving_resize(JobConfig.from_hyperparameters({"num_classes": "3", "image_size": "64", "resize": "80"})) == 80
