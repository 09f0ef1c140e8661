"""The heatmaps (keras_pipe_train.model.explain) on a model that learned where a shape is: Grad-CAM's
and Integrated Gradients' evidence lies on the shape, and a model whose top layers are re-initialised
(Adebayo et al.'s sanity check) gives heatmaps of another order (Spearman's rank correlation < 0.5).
A small convolutional classifier in build_classifier's shape, trained here in seconds."""

import keras
import numpy as np
import pytest

from keras_pipe_train.model import explain

SIZE, SIDE = 32, 8  # the pictures' pixels, the shape's


def pictures(count: int, seed: int):
    """Dark noisy pictures, each with one bright shape somewhere: a square (class 0) or a cross
    (class 1); its box (top, left)."""
    rng = np.random.default_rng(seed)
    images = rng.uniform(0, 60, (count, SIZE, SIZE, 3)).astype(np.float32)
    labels, boxes = rng.integers(0, 2, count), rng.integers(0, SIZE - SIDE, (count, 2))
    for image, label, (top, left) in zip(images, labels, boxes):
        if label == 0:
            image[top:top + SIDE, left:left + SIDE] = 230
        else:
            image[top + SIDE // 2 - 1:top + SIDE // 2 + 1, left:left + SIDE] = 230
            image[top:top + SIDE, left + SIDE // 2 - 1:left + SIDE // 2 + 1] = 230
    return images, labels, boxes


@pytest.fixture(scope="module")
def trained():
    return shapes_model()


def sanity(model: keras.Model, images: np.ndarray, classes, count: int) -> dict[str, float]:
    """Adebayo et al.'s check, with its controls: the mean Spearman rank correlation of the trained
    model's heatmaps with those of the model whose head and top `count` layers are re-initialised
    ("randomised"), and with its own heatmaps of the same pictures under a little noise (N(0, 3):
    "noise", which must stay high, or the statistic tells nothing); the share of its heatmaps that
    are not constant ("alive": a heatmap of nothing would pass the check)."""
    trained = explain.explainer(model).heatmaps(images, classes)
    random = explain.explainer(explain.randomised(model, count)).heatmaps(images, classes)
    noisy = images + np.random.default_rng(0).normal(0, 3, images.shape).astype(np.float32)
    again = explain.explainer(model).heatmaps(noisy, classes)
    return {"randomised": float(np.mean([explain.spearman(a, b) for a, b in zip(trained, random)])),
            "noise": float(np.mean([explain.spearman(a, b) for a, b in zip(trained, again)])),
            "alive": float(np.mean([np.ptp(h) > 0 for h in trained]))}


def shapes_model(policy: str | None = None, weights=None) -> keras.Model:
    """A classifier in build_classifier's shape (a backbone, "pool", "dropout", "classifier") that
    learned the squares from the crosses; with `weights`, those of another, untrained, computing in
    `policy` (mixed_float16, say)."""
    keras.utils.set_random_seed(3)
    if policy:
        before = keras.config.dtype_policy()
        keras.config.set_dtype_policy(policy)
        try:
            model = shapes_model()
        finally:
            keras.config.set_dtype_policy(before)
        model.set_weights(weights)
        return model
    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Rescaling(1 / 255)(inputs)
    for filters in (16, 32, 32):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    backbone = keras.Model(inputs, x, name="small")
    images = keras.Input((SIZE, SIZE, 3), name="images")
    x = keras.layers.GlobalAveragePooling2D(name="pool")(backbone(images))
    x = keras.layers.Dropout(0.1, name="dropout")(x)
    model = keras.Model(images, keras.layers.Dense(2, activation="softmax", name="classifier", dtype="float32")(x))
    if weights is not None or keras.config.dtype_policy().name != "float32":
        return model
    model.compile(keras.optimizers.Adam(3e-3), "sparse_categorical_crossentropy", metrics=["accuracy"])
    images, labels, _ = pictures(1200, 0)
    model.fit(images, labels, batch_size=32, epochs=6, verbose=0)
    return model


@pytest.fixture(scope="module")
def held_out(trained):
    images, labels, boxes = pictures(40, 1)
    predicted = np.argmax(trained.predict(images, verbose=0), axis=1)
    assert (predicted == labels).mean() >= 0.95, "the model did not learn the shapes"
    return images, labels, boxes


def on_the_shape(heat: np.ndarray, boxes) -> float:
    """The share of heatmaps whose hottest cell, in the picture's pixels, falls on the shape's box
    (a cell's size of slack)."""
    hits = 0
    for row, (top, left) in zip(heat, boxes):
        cell = SIZE / row.shape[0]
        y, x = np.unravel_index(np.argmax(row), row.shape)
        centre = ((y + 0.5) * cell, (x + 0.5) * cell)
        hits += top - cell <= centre[0] <= top + SIDE + cell and left - cell <= centre[1] <= left + SIDE + cell
    return hits / len(heat)


def test_grad_cam_finds_the_shape_and_a_randomised_top_gives_other_heatmaps(trained, held_out):
    images, labels, boxes = held_out
    explainer = explain.explainer(trained)
    assert explainer.method == "Grad-CAM" and explainer.where.startswith("small/")
    heat = explainer.heatmaps(images, labels)
    assert heat.shape[1:] == (16, 16) and heat.min() >= 0 and np.allclose(heat.max(axis=(1, 2)), 1)
    assert on_the_shape(heat, boxes) >= 0.9
    # Adebayo et al.: the head and the last convolution re-initialised, the heatmaps must change;
    # a little noise must not change them (the statistic can say "alike"), nor be a heatmap of nothing
    figures = sanity(trained, images, labels, 1)
    assert figures["randomised"] < 0.5 and figures["noise"] > 0.8 and figures["alive"] >= 0.9, figures
    assert explain.spearman(heat[0], heat[0]) == pytest.approx(1.0)


def test_a_model_computing_in_float16_has_the_heatmaps_of_its_float32_twin(trained, held_out):
    """Mixed precision (every GPU job's default): the map Grad-CAM reads is float16."""
    images, labels, _ = held_out
    mixed = shapes_model("mixed_float16", trained.get_weights())
    assert mixed.get_layer("small").layers[-1].compute_dtype == "float16"
    ours, theirs = (explain.explainer(m).heatmaps(images, labels) for m in (trained, mixed))
    assert np.mean([explain.spearman(a, b) for a, b in zip(ours, theirs)]) > 0.95


def test_integrated_gradients_finds_the_shape_where_grad_cam_has_no_map(trained, held_out):
    images, labels, boxes = held_out
    explainer = explain._integrated_gradients(trained, trained.get_layer("classifier"))
    heat = explainer.heatmaps(images[:12], labels[:12])
    assert heat.shape[1:] == (SIZE, SIZE)
    assert on_the_shape(heat, boxes[:12]) >= 0.8
    # a map too coarse to say where (a 32-pixel picture's backbone ending at 1 x 1, MIN_SIDE): IG
    inputs = keras.Input((SIZE, SIZE, 3))
    coarse = keras.Model(inputs, keras.layers.Conv2D(4, SIZE, strides=SIZE)(inputs), name="coarse")
    images_in = keras.Input((SIZE, SIZE, 3), name="images")
    x = keras.layers.GlobalAveragePooling2D(name="pool")(coarse(images_in))
    model = keras.Model(images_in, keras.layers.Dense(2, activation="softmax", name="classifier")(x))
    assert explain.explainer(model).method == "Integrated Gradients"


def test_an_overlay_is_the_picture_under_the_heat_as_a_jpeg():
    import tensorflow as tf

    picture = np.zeros((20, 40, 3), np.float32)
    heat = np.zeros((2, 2))
    heat[0, 1] = 1.0  # (the top right: red; elsewhere blue)
    jpeg = explain.overlay(picture, heat, 80)
    decoded = tf.io.decode_jpeg(jpeg).numpy().astype(int)
    assert decoded.shape == (40, 80, 3)
    assert decoded[2, 78, 0] > 100 and decoded[2, 78, 2] < 60  # (red, half over black)
    assert decoded[38, 2, 2] > 100 and decoded[38, 2, 0] < 60  # (blue)


def test_spearman_ranks_ties_by_their_mean():
    assert explain.spearman(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == pytest.approx(1)
    assert explain.spearman(np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1])) == pytest.approx(-1)
    assert explain.spearman(np.array([1, 1, 2]), np.array([5, 5, 9])) == pytest.approx(1)
    assert explain.spearman(np.zeros(4), np.arange(4)) == 0.0


def test_a_heatmaps_file_name_is_safe_and_short_whatever_the_class_or_image_is_called():
    from keras_pipe_train.after_training.folder_explanations import LONGEST, _safe

    assert _safe("../../etc/passwd") == "_.._etc_passwd" and _safe("a/b c") == "a_b_c" and _safe("..") == "_"
    long_one, other = "é" * 300 + "1", "é" * 300 + "2"  # (600 bytes in UTF-8: past any file system's 255)
    assert len(_safe(long_one).encode()) <= 2 * LONGEST and _safe(long_one) != _safe(other)
