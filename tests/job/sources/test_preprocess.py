"""Image preprocessing, each op run eagerly AND inside Dataset.map (big_vision: "you'd be
surprised how much these differ")."""

import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_train.sources import preprocess

RNG = np.random.default_rng(0)
PICTURE = RNG.integers(0, 256, (37, 53, 3), dtype=np.uint8)
ENCODED = {
    "jpeg": tf.io.encode_jpeg(PICTURE, quality=100).numpy(),
    "png": tf.io.encode_png(PICTURE).numpy(),
    "gray-jpeg": tf.io.encode_jpeg(PICTURE[..., :1]).numpy(),
    "rgba-png": tf.io.encode_png(np.concatenate([PICTURE, PICTURE[..., :1]], -1)).numpy(),
}


def in_dataset(fn, value):
    return next(iter(tf.data.Dataset.from_tensors(value).map(fn))).numpy()


@pytest.mark.parametrize("kind", ENCODED)
def test_eval_path_is_the_same_eagerly_and_in_a_dataset(kind):
    fn = lambda x: preprocess.for_eval(x, 32)  # noqa: E731
    eager = fn(tf.constant(ENCODED[kind])).numpy()
    assert eager.shape == (32, 32, 3) and eager.dtype == np.float32
    np.testing.assert_array_equal(eager, in_dataset(fn, ENCODED[kind]))
    assert 0 <= eager.min() and eager.max() <= 255


def test_png_decodes_to_the_exact_pixels_and_eval_resizes_them():
    decoded = preprocess.decode(tf.constant(ENCODED["png"])).numpy()
    np.testing.assert_array_equal(decoded, PICTURE)
    expected = tf.image.resize(PICTURE, [32, 32]).numpy()
    np.testing.assert_allclose(preprocess.for_eval(tf.constant(ENCODED["png"]), 32).numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("kind", ENCODED)
@pytest.mark.parametrize("augment", [(), ("crop",), ("crop", "flip", "color")])
def test_train_path_shapes_and_range_eagerly_and_in_a_dataset(kind, augment):
    fn = lambda x: preprocess.for_train(x, 24, augment, SEED)  # noqa: E731
    for image in (fn(tf.constant(ENCODED[kind])).numpy(), in_dataset(fn, ENCODED[kind])):
        assert image.shape == (24, 24, 3) and image.dtype == np.float32
        assert 0 <= image.min() and image.max() <= 255


SEED = tf.constant([5, 11], tf.int64)


def test_fused_jpeg_crop_equals_decoding_then_cropping():
    jpeg = tf.constant(ENCODED["jpeg"])
    window = tf.constant([5, 7, 20, 30])
    fused = tf.io.decode_and_crop_jpeg(jpeg, window, channels=3).numpy()
    whole = tf.io.decode_jpeg(jpeg, channels=3).numpy()
    np.testing.assert_array_equal(fused, whole[5:25, 7:37])


def smooth_photo(height, width):
    """Gradients and a disc: what a scaled-down decode must keep (noise would not survive it)."""
    yy, xx = np.mgrid[:height, :width]
    image = np.stack([xx * 255 // width, yy * 255 // height, np.full((height, width), 128)], -1)
    image[(yy - height // 2) ** 2 + (xx - width // 3) ** 2 < (height // 4) ** 2] = (250, 30, 30)
    return image.astype(np.uint8)


@pytest.mark.parametrize(("height", "width", "size", "ratio"), [
    (100, 150, 32, 2),     # 50 x 75 still holds 32; 25 x 37 would not
    (300, 400, 32, 8),     # 37 x 50 at 1/8
    (300, 400, 38, 4),     # 1/8 would leave 37 < 38 rows
    (40, 400, 32, 1),      # the shorter side decides
    (64, 64, 32, 2),       # exactly size at 1/2
])
def test_jpeg_scale_is_the_largest_that_keeps_size_pixels(height, width, size, ratio):
    index = preprocess._jpeg_ratio_index(tf.constant(height), tf.constant(width), size)
    assert preprocess.JPEG_RATIOS[int(index)] == ratio
    # and the decode really is at that scale
    encoded = tf.io.encode_jpeg(smooth_photo(height, width))
    decoded = preprocess.decode_jpeg_window(encoded, tf.constant([0, 0, height, width]), size)
    assert decoded.shape[:2] == (height // ratio, width // ratio)  # the window, scaled down
    assert in_dataset(lambda x: preprocess.decode_jpeg_window(x, tf.constant([0, 0, height, width]), size),
                      encoded.numpy()).shape == decoded.shape


def test_scaled_jpeg_decode_gives_the_picture_of_a_whole_decode():
    """A 1600x1200 photo validated at 64 px is decoded at 1/8, cropped the same way: the result
    is the antialiased whole-decode's within JPEG noise (bilinear from full size would alias)."""
    picture = smooth_photo(1200, 1600)
    encoded = tf.io.encode_jpeg(picture, quality=95)
    scaled = preprocess.for_eval(encoded, 64).numpy()
    reference = tf.image.resize(tf.io.decode_jpeg(encoded), [64, 64], antialias=True).numpy()
    assert np.abs(scaled - reference).mean() < 3.0
    window = tf.constant([400, 200, 640, 800])  # y, x, height, width
    cropped = preprocess.decode_jpeg_window(encoded, window, 64)
    assert cropped.shape == (80, 100, 3)  # 1/8 of the window
    reference = tf.image.resize(picture[400:1040, 200:1000], [80, 100], antialias=True).numpy()
    assert np.abs(cropped.numpy().astype(np.float32) - reference).mean() < 4.0


def test_random_crops_stay_inside_the_image_and_keep_a_quarter_of_it():
    shape = tf.constant([37, 53, 3])
    for i in range(50):
        y, x, h, w = preprocess._crop_window(shape, tf.constant([7, i], tf.int64)).numpy()
        assert 0 <= y and 0 <= x and y + h <= 37 and x + w <= 53
        assert h * w >= 0.2 * 37 * 53  # 25 % of the area, with the sampler's rounding


def test_flip_only_mirrors_or_keeps_the_image():
    base = preprocess.for_train(tf.constant(ENCODED["png"]), 32, (), SEED)
    seen = set()
    for i in range(20):
        out = preprocess.for_train(tf.constant(ENCODED["png"]), 32, ("flip",), tf.constant([3, i], tf.int64)).numpy()
        if np.array_equal(out, base):
            seen.add("same")
        else:
            np.testing.assert_array_equal(out, base.numpy()[:, ::-1])
            seen.add("mirrored")
    assert seen == {"same", "mirrored"}


@pytest.mark.parametrize("kind", ["jpeg", "png"])
def test_augmentation_is_decided_by_the_seed_alone(kind):
    """What exact resume needs: an image's crop, flip and colour come from its seed, not from a
    generator's state (the same seed, the same image, whatever ran before), and differ by seed."""
    augment = ("crop", "flip", "color")
    image = tf.constant(ENCODED[kind])
    first = preprocess.for_train(image, 24, augment, SEED).numpy()
    for _ in range(3):
        preprocess.for_train(image, 24, augment, tf.constant([9, 9], tf.int64))  # other draws in between
    np.testing.assert_array_equal(preprocess.for_train(image, 24, augment, SEED).numpy(), first)
    np.testing.assert_array_equal(in_dataset(lambda x: preprocess.for_train(x, 24, augment, SEED), ENCODED[kind]),
                                  first)
    others = [preprocess.for_train(image, 24, augment, tf.constant([1, i], tf.int64)).numpy() for i in range(4)]
    assert not any(np.array_equal(other, first) for other in others)


def test_a_seeded_batch_gives_each_image_its_own_seed():
    batch = tf.constant([ENCODED["jpeg"]] * 4)
    fn = lambda x, seed: preprocess.for_train(x, 16, ("crop", "flip", "color"), seed)  # noqa: E731
    out = preprocess.seeded_batch_of(fn, batch, 16, SEED).numpy()
    assert len({image.tobytes() for image in out}) == 4  # the same image, four different draws
    np.testing.assert_array_equal(preprocess.seeded_batch_of(fn, batch, 16, SEED).numpy(), out)


def test_batch_of_applies_per_image():
    batch = tf.constant([ENCODED["jpeg"], ENCODED["png"], ENCODED["gray-jpeg"]])
    out = preprocess.batch_of(lambda x: preprocess.for_eval(x, 16), batch, 16)
    assert out.shape == (3, 16, 16, 3)
    np.testing.assert_array_equal(out[1], preprocess.for_eval(batch[1], 16))


# --- rotation, zoom, aspect, shear ----------------------------------------------------------------

GRID = np.arange(5 * 7 * 3, dtype=np.float32).reshape(5, 7, 3)


@pytest.mark.parametrize("run", [lambda fn: fn().numpy(), lambda fn: next(iter(tf.data.Dataset.range(1).map(
    lambda _: fn()))).numpy()], ids=["eager", "dataset"])
def test_the_transform_turns_zooms_stretches_and_slants_about_the_centre(run):
    image = tf.constant(GRID)
    same = lambda **c: run(lambda: preprocess.transformed(image, **{"angle": 0.0, "zoom": 1.0, "aspect": 1.0, "shear": 0.0, **c}))  # noqa: E731
    np.testing.assert_allclose(same(), GRID, atol=1e-4)  # neutral: the image itself
    np.testing.assert_allclose(same(angle=np.pi), GRID[::-1, ::-1], atol=1e-3)  # half a turn
    # zoomed out 2x about the centre pixel (row 2, column 3): the centre stays, a pixel one step
    # right samples two steps right, and the edges mirror the image in
    out = same(zoom=2.0)
    np.testing.assert_allclose(out[2, 3], GRID[2, 3], atol=1e-4)
    np.testing.assert_allclose(out[2, 4], GRID[2, 5], atol=1e-4)
    # column 3 + 2 x 3 = 9 is beyond the last (6): mirrored about the edge (... 5 6 | 6 5 4 ...), column 4
    np.testing.assert_allclose(out[2, 6], GRID[2, 4], atol=1e-4)
    # stretched: aspect 4 makes x steps twice as long and y steps half as long
    out = same(aspect=4.0)
    np.testing.assert_allclose(out[2, 4], GRID[2, 5], atol=1e-4)
    np.testing.assert_allclose(out[4, 3], GRID[3, 3], atol=1e-4)  # row 2 + 2 / 2
    # slanted: each row below the centre samples `shear` columns further right per row
    out = same(shear=1.0)
    np.testing.assert_allclose(out[3, 3], GRID[3, 4], atol=1e-4)
    np.testing.assert_allclose(out[2, 3], GRID[2, 3], atol=1e-4)


def test_each_geometric_change_is_drawn_within_its_bounds_and_only_when_asked():
    geometry = preprocess.Geometry(rotation=0.1, zoom=0.2, aspect=0.5, shear=0.3)
    draws = np.array([geometry.draw(("rotate", "zoom", "aspect", "shear"), tf.constant([3, i], tf.int64)).numpy()
                      for i in range(300)])
    angle, zoom, aspect, shear = draws.T
    assert np.abs(angle).max() <= 0.1 * 2 * np.pi and np.abs(angle).max() > 0.09 * 2 * np.pi
    assert 1 / 1.2 - 1e-6 <= zoom.min() and zoom.max() <= 1.2 + 1e-6 and (zoom < 1).any() and (zoom > 1).any()
    assert 1 / 1.5 - 1e-6 <= aspect.min() and aspect.max() <= 1.5 + 1e-6
    assert np.abs(shear).max() <= 0.3
    only_rotate = geometry.draw(("rotate",), tf.constant([3, 0], tf.int64)).numpy()
    assert only_rotate[0] != 0 and only_rotate[1:].tolist() == [1.0, 1.0, 0.0]


def test_geometric_augmentation_is_seeded_and_leaves_the_other_draws_as_they_were():
    """The rotation draws from a seed of its own: the crop is the one drawn without it, turned."""
    image = tf.constant(ENCODED["jpeg"])
    plain = preprocess.for_train(image, 24, ("crop",), SEED)
    turned = preprocess.for_train(image, 24, ("crop", "rotate"), SEED).numpy()
    np.testing.assert_array_equal(turned, preprocess.for_train(image, 24, ("crop", "rotate"), SEED).numpy())
    angle = preprocess.Geometry().draw(("rotate",), tf.random.experimental.stateless_fold_in(SEED, 4))[0]
    assert angle != 0
    np.testing.assert_allclose(turned, preprocess.transformed(plain, angle, 1.0, 1.0, 0.0).numpy(), atol=1e-3)
    fn = lambda x: preprocess.for_train(x, 24, ("zoom", "aspect", "shear", "flip"), SEED,  # noqa: E731
                                        preprocess.Geometry(flip="horizontal_and_vertical"))
    np.testing.assert_array_equal(fn(image).numpy(), in_dataset(fn, ENCODED["jpeg"]))
