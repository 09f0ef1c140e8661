"""RandAugment and TrivialAugment (sources/auto_augment.py): each operation does what PIL's does
(checked against PIL itself where PIL has it), the policies draw every operation, at the strengths
they say, the same again from the same seed, and augment=trivial or randaugment reaches the
training images."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageEnhance, ImageOps

from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.sources import auto_augment, preprocess

# RandAugment as a job with the definitions' defaults (randaugment_ops, randaugment_magnitude) runs it
_DEFAULTS = JobConfig.from_hyperparameters({"num_classes": 3})
POLICY = auto_augment.Policy(_DEFAULTS.randaugment_ops, _DEFAULTS.randaugment_magnitude)


def photo(size=24, seed=0) -> np.ndarray:
    """An image with structure (gradients and a square) and noise, as uint8 RGB."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[:size, :size]
    image = np.stack([x * 200 / size, y * 180 / size, (x + y) * 60 / size], -1) + rng.normal(0, 20, (size, size, 3))
    image[size // 4: size // 2, size // 4: size // 2] = (230, 40, 90)
    return np.clip(image + 20, 0, 255).astype(np.uint8)


def ours(op, *args, **kwargs):
    return getattr(auto_augment, op)(tf.constant(photo(), tf.float32), *args, **kwargs).numpy()


@pytest.mark.parametrize("op, factor, enhance", [("brightness", 1.6, ImageEnhance.Brightness),
                                                 ("color", 0.3, ImageEnhance.Color),
                                                 ("contrast", 1.8, ImageEnhance.Contrast),
                                                 ("sharpness", 1.9, ImageEnhance.Sharpness)])
def test_the_enhancements_are_pils(op, factor, enhance):
    expected = np.asarray(enhance(Image.fromarray(photo())).enhance(factor), np.float32)
    assert np.abs(ours(op, factor) - expected).max() <= 3  # (PIL rounds each step to integers)


@pytest.mark.parametrize("op, args, pil", [
    ("solarize", (128.0,), lambda im: ImageOps.solarize(im, 128)),
    ("posterize", (3,), lambda im: ImageOps.posterize(im, 3)),
    ("auto_contrast", (), ImageOps.autocontrast),
    ("equalize", (), ImageOps.equalize)])
def test_the_pixel_operations_are_pils(op, args, pil):
    expected = np.asarray(pil(Image.fromarray(photo())), np.float32)
    assert np.abs(ours(op, *args) - expected).max() <= 1


@pytest.mark.parametrize("op, args, matrix", [
    ("shear", dict(x=0.3), (1, 0.3, 0, 0, 1, 0)), ("shear", dict(y=-0.4), (1, 0, 0, -0.4, 1, 0)),
    ("translate", dict(x=5.0), (1, 0, 5, 0, 1, 0)), ("translate", dict(y=-7.0), (1, 0, 0, 0, 1, -7))])
def test_the_shears_and_translations_are_pils_affine_transforms(op, args, matrix):
    """As timm and torchvision call PIL: Image.transform(AFFINE, matrix), nearest, grey fill."""
    expected = np.asarray(Image.fromarray(photo()).transform((24, 24), Image.AFFINE, matrix, resample=Image.NEAREST,
                                                              fillcolor=(128, 128, 128)), np.float32)
    got = ours(op, **args)
    assert (np.abs(got - expected).max(axis=-1) == 0).mean() >= 0.98  # (a tie's rounding may differ)


def test_rotation_is_pils_about_the_centre():
    for degrees in (90, 30, -135):
        expected = np.asarray(Image.fromarray(photo()).rotate(degrees, resample=Image.NEAREST,
                                                              fillcolor=(128, 128, 128)), np.float32)
        got = ours("rotate", float(degrees))
        assert (np.abs(got - expected).max(axis=-1) == 0).mean() >= 0.97, degrees


def test_trivial_augment_draws_each_operation_and_strength_the_same_again_from_a_seed():
    image = tf.constant(photo(), tf.float32)
    first = auto_augment.trivial(image, tf.constant([4, 2], tf.int64))
    np.testing.assert_array_equal(first, auto_augment.trivial(image, tf.constant([4, 2], tf.int64)))
    ops = collections.Counter()
    for i in range(700):
        which = tf.random.experimental.stateless_split(tf.constant([0, i], tf.int64), 3)[0]
        ops[int(tf.random.stateless_uniform([], which, 0, len(auto_augment.OPS), tf.int32))] += 1
        out = auto_augment.trivial(image, tf.constant([0, i], tf.int64)).numpy()
        assert out.shape == photo().shape and out.min() >= 0 and out.max() <= 255
    assert set(ops) == set(range(len(auto_augment.OPS))) and min(ops.values()) > 25, ops  # (50 each expected)


def test_randaugment_applies_its_operations_at_the_magnitude_given():
    image = tf.constant(photo(), tf.float32)
    changed = [not np.array_equal(auto_augment.randaugment(image, tf.constant([1, i], tf.int64), POLICY).numpy(), photo())
               for i in range(200)]
    # (2 operations, each applied with probability 0.5, one in 14 the identity: about 71 % change it)
    assert 0.6 < np.mean(changed) < 0.82, np.mean(changed)
    gentle = auto_augment.Policy(ops=1, magnitude=0.0)
    for i in range(40):  # (magnitude 0: the enhancements and geometry at factor 1, offset 0)
        out = auto_augment.randaugment(image, tf.constant([2, i], tf.int64), gentle).numpy()
        ordinary = {auto_augment.apply(image, op, 0.0, 1.0, auto_augment.STANDARD).numpy().tobytes()
                    for op in range(len(auto_augment.OPS))}
        assert out.tobytes() in ordinary | {photo().astype(np.float32).tobytes()}


@pytest.mark.parametrize("policy", ["trivial", "randaugment"])
def test_augment_names_a_policy_and_the_training_images_get_it(policy):
    config = JobConfig.from_hyperparameters({"num_classes": 3, "augment": f"flip,{policy}"})
    assert config.augment == ("flip", policy)
    assert "trivial" not in JobConfig.from_hyperparameters({"num_classes": 3, "augment": "all"}).augment
    encoded = tf.io.encode_png(photo(32)).numpy()
    plain = [preprocess.for_train(encoded, 32, ("flip",), tf.constant([0, i], tf.int64)).numpy() for i in range(20)]
    mixed = [preprocess.for_train(encoded, 32, ("flip", policy), tf.constant([0, i], tf.int64), policy=POLICY).numpy()
             for i in range(20)]
    assert sum(not np.array_equal(a, b) for a, b in zip(plain, mixed)) >= 10
