"""MixUp and CutMix (training/mixing.py, in the loop's training step): what a mixed batch is, that
its loss is the loss of the mixed labels, that it is drawn the same again from the same step, and
its effect: a model trained on mixed images is less sure of its answers."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.training.mixing import Mixing
from keras_pipe_train.training.recipe import Loss
from tests.job.training.test_recipe import batches, config, tiny_model, trainer_for


def mixing_of(**values) -> Mixing:
    """Mixing as a job with these hyperparameters (the others at their definitions' defaults) mixes."""
    return Loss.of(config(**values)).mixing


def images(count=6, size=8, seed=0):
    return tf.constant(np.random.default_rng(seed).uniform(0, 255, (count, size, size, 3)).astype(np.float32))


def test_mixup_blends_each_image_with_the_batch_reversed_in_the_share_of_its_own_labels():
    batch = images()
    mixed, share = mixing_of(mixup_alpha=0.8).mix(batch, tf.constant([3, 7]))
    lam = float(share[0])
    assert 0 < lam < 1 and np.all(share.numpy() == lam)
    np.testing.assert_allclose(mixed, lam * batch + (1 - lam) * batch[::-1], rtol=1e-5)


def test_cutmix_pastes_a_box_of_the_partner_and_the_share_is_the_area_kept():
    batch = images(size=32)
    for step in range(20):
        mixed, share = mixing_of(cutmix_alpha=1.0).mix(batch, tf.constant([1, step]))
        from_partner = np.all(mixed.numpy() == batch.numpy()[::-1], axis=-1)[0]
        own = np.all(mixed.numpy() == batch.numpy(), axis=-1)[0]
        assert np.all(from_partner | own)
        rows, columns = np.nonzero(from_partner)
        if rows.size:  # (a box: every pixel between its corners)
            assert from_partner[rows.min():rows.max() + 1, columns.min():columns.max() + 1].all()
        assert float(share[0]) == pytest.approx(1 - from_partner.mean(), abs=1e-6)


def test_the_draws_are_the_steps_own_and_the_shares_follow_beta_and_the_switch():
    mixing = mixing_of(mixup_alpha=0.8, cutmix_alpha=1.0, mixup_prob=0.8)
    batch = images(count=2, size=16)
    first, again = mixing.mix(batch, tf.constant([0, 5])), mixing.mix(batch, tf.constant([0, 5]))
    np.testing.assert_array_equal(first[0], again[0])
    blends, cuts, unmixed = [], [], 0
    for step in range(600):
        mixed, share = mixing.mix(batch, tf.constant([0, step]))
        if float(share[0]) == 1.0 and np.array_equal(mixed, batch):
            unmixed += 1
        elif np.any(np.all(mixed.numpy() == batch.numpy(), axis=-1)):
            cuts.append(float(share[0]))
        else:
            blends.append(float(share[0]))
    assert 0.15 < unmixed / 600 < 0.25  # (probability 0.8)
    assert 0.42 < len(cuts) / (len(cuts) + len(blends)) < 0.58  # (switch 0.5)
    assert 0.45 < np.mean(blends) < 0.55  # (Beta(a, a) has mean 1/2)
    # (a box clipped at the image's edge covers less than drawn: what an image keeps is more than λ)
    assert 0.5 < np.mean(cuts) < 0.7


def test_a_probability_of_zero_is_refused_and_no_alpha_means_no_mixing():
    with pytest.raises(UserError, match="mixup_prob must be > 0"):
        config(mixup_alpha=0.8, mixup_prob=0)
    assert not Loss.of(config()).mixing.on
    mixing = mixing_of(cutmix_alpha=1.0, seed=4)
    assert mixing.on and (mixing.mixup_alpha, mixing.cutmix_alpha, mixing.seed) == (0.0, 1.0, 4)


def test_a_mixed_steps_loss_is_the_loss_of_the_mixed_labels():
    """The loop's mixed loss, λ CE(own labels) + (1 - λ) CE(partner's), read from its reported sum,
    equals the cross-entropy against the mixed one-hot labels, label smoothing included."""
    x = images(count=4, size=4).numpy() / 255
    labels = np.array([0, 1, 2, 1])
    mixing = mixing_of(mixup_alpha=0.5, seed=2)
    trainer = trainer_for(tiny_model(), learning_rate=1e-9, loss=Loss(label_smoothing=0.1, mixing=mixing))
    model = trainer.model
    before = [w.numpy() for w in model.weights]
    mixed, share = mixing.mix(tf.constant(x), mixing.step_seed(0, 0, 0))
    probabilities = model(mixed).numpy()
    one_hot = np.eye(3)[labels]
    targets = share.numpy()[:, None] * one_hot + (1 - share.numpy()[:, None]) * one_hot[::-1]
    targets = targets * 0.9 + 0.1 / 3
    expected = -(targets * np.log(probabilities)).sum(axis=1).mean()
    metrics, _, _ = trainer.train_epoch(batches(x, labels, size=4), 0, 0, 4)
    assert metrics["train_loss"] == pytest.approx(expected, rel=1e-4)
    assert all(np.allclose(a, b.numpy(), atol=1e-6) for a, b in zip(before, model.weights))


def test_a_multi_label_mixed_steps_loss_is_the_binary_cross_entropy_of_the_mixed_labels():
    import keras

    x = images(count=4, size=4).numpy() / 255
    labels = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]], np.float32)
    mixing = mixing_of(cutmix_alpha=1.0, seed=5)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(3, activation="sigmoid", name="classifier")])
    trainer = trainer_for(model, learning_rate=1e-9, loss=Loss(multi_label=True, mixing=mixing))
    mixed, share = mixing.mix(tf.constant(x), mixing.step_seed(0, 0, 0))
    p = np.clip(model(mixed).numpy(), 1e-7, 1 - 1e-7)
    lam = share.numpy()[:, None]
    targets = lam * labels + (1 - lam) * labels[::-1]
    expected = -(targets * np.log(p) + (1 - targets) * np.log(1 - p)).mean(axis=1).mean()
    metrics, _, _ = trainer.train_epoch(batches(x, labels, size=4), 0, 0, 4)
    assert 0 < float(share[0]) < 1
    assert metrics["train_loss"] == pytest.approx(expected, rel=1e-4)


@pytest.mark.slow
def test_a_model_trained_on_mixed_images_is_less_sure_of_its_answers():
    """MixUp's known effect (Zhang et al.; Thulasidasan et al., NeurIPS 2019): lower confidence. The
    same model, data and steps, with and without it: the mean top probability on the training
    images falls."""
    rng = np.random.default_rng(0)
    labels = np.arange(96) % 3
    x = rng.normal(0, 0.6, (96, 4, 4, 3)).astype(np.float32)
    x[np.arange(96), :, :, labels] += 1.0  # (each class brighter in a channel of its own)
    confidence = {}
    for alpha in (0.0, 1.0):
        trainer = trainer_for(tiny_model(), learning_rate=0.2, loss=Loss(mixing=mixing_of(mixup_alpha=alpha)))
        for epoch in range(15):
            trainer.train_epoch(batches(x, labels, size=16).shuffle(96, seed=epoch), epoch, 0, 16)
        probabilities = trainer.model(x).numpy()
        assert (probabilities.argmax(axis=1) == labels).mean() > 0.95, alpha  # (both learn it)
        confidence[alpha] = probabilities.max(axis=1).mean()
    assert confidence[1.0] < confidence[0.0] - 0.02, confidence  # (seen here: 0.954 against 0.989)


def test_each_phase_draws_its_own_mixes():
    """Each phase's optimizer counts its steps from 0 again: the phase's first epoch seeds it apart."""
    mixing = mixing_of(mixup_alpha=1.0, seed=3)
    batch = images()
    first = [mixing.mix(batch, mixing.step_seed(0, 0, step))[1][0].numpy() for step in range(5)]
    second = [mixing.mix(batch, mixing.step_seed(0, 2, step))[1][0].numpy() for step in range(5)]
    again = [mixing.mix(batch, mixing.step_seed(0, 2, step))[1][0].numpy() for step in range(5)]
    assert first != second and second == again
