"""Confident learning (keras_pipe_train.training.label_errors): the same suspects as cleanlab's
find_label_issues(filter_by="low_self_confidence") on the same probabilities, in its order, ties
included; planted flips found on features that separate the classes; a rare or unlearnt class that
does not inflate every other class's suspects; folds that are out of sample, and the heads'
held-out accuracy."""

import numpy as np
import pytest
from cleanlab.filter import find_label_issues

from keras_pipe_train.training import label_errors as L


def flipped(examples=1500, classes=6, rate=0.1, separation=0.8, seed=0):
    """(features, true labels, given labels, which were flipped): Gaussian classes, `rate` of the
    labels moved to another class at random."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, classes, examples)
    features = rng.normal(0, 1, (classes, 32))[truth] * separation + rng.normal(0, 1, (examples, 32))
    flips = rng.random(examples) < rate
    given = truth.copy()
    given[flips] = (truth[flips] + rng.integers(1, classes, flips.sum())) % classes
    return features, truth, given, flips


@pytest.mark.parametrize("seed", range(4))
def test_the_suspects_are_cleanlabs_on_the_same_probabilities(seed):
    features, _, given, _ = flipped(seed=seed, separation=0.5 + 0.2 * seed)
    probabilities = L.out_of_fold(features, given, 6, 5, seed).probabilities
    found = L.find(probabilities, given)
    ranked = find_label_issues(given, probabilities, filter_by="low_self_confidence",
                               return_indices_ranked_by="self_confidence")
    assert len(found) > 0 and list(found.indices) == list(ranked)


def test_planted_flips_are_found_with_their_true_class():
    features, truth, given, flips = flipped(rate=0.1, separation=1.5)
    found = L.find(L.out_of_fold(features, given, 6, 5, 0).probabilities, given)
    hits = flips[found.indices]
    assert hits.mean() >= 0.9 and hits.sum() / flips.sum() >= 0.8, (hits.mean(), hits.sum() / flips.sum())
    assert (found.likely[hits] == truth[found.indices][hits]).mean() >= 0.9
    assert (np.diff(found.given_probability) >= 0).all()  # the given label least likely first
    assert (found.likely != given[found.indices]).all()


def test_clean_labels_of_well_separated_classes_give_no_suspects_and_an_absent_class_none():
    features, _, given, _ = flipped(rate=0.0, separation=3.0, classes=4)
    probabilities = np.zeros((len(given), 5))
    probabilities[:, :4] = L.out_of_fold(features, given, 4, 5, 0).probabilities[:, :4]
    assert len(L.find(probabilities, given)) == 0


def test_the_folds_are_stratified_and_each_head_never_sees_what_it_predicts():
    labels = np.repeat(np.arange(3), [50, 20, 7])
    folds = L.folds_of(labels, 5, seed=1)
    for c, size in zip(range(3), (50, 20, 7)):
        counts = np.bincount(folds[labels == c], minlength=5)
        assert counts.max() - counts.min() <= 1 and counts.sum() == size
    # features of pure noise, more of them than examples: a head can learn any labels it is fitted
    # on by heart, so only a head that never saw an example guesses its label at chance
    rng = np.random.default_rng(0)
    features = rng.normal(size=(200, 300))
    given = rng.integers(0, 2, 200)
    probabilities = L.out_of_fold(features, given, 2, 5, 0).probabilities
    assert abs((probabilities.argmax(axis=1) == given).mean() - 0.5) < 0.12
    in_sample = L._head_probabilities(features, given, features, 2, 0)
    assert (in_sample.argmax(axis=1) == given).mean() > 0.95


def test_a_feature_constant_where_the_head_is_fitted_does_not_decide_the_held_out_fold():
    features, _, given, _ = flipped(examples=300, rate=0.0, separation=3.0)
    features = np.hstack([features, np.zeros((300, 1))])
    fold = L.folds_of(given, 5, 0)
    features[fold == 0, -1] = 5.0  # (zero in the folds a head is fitted on, not in the one it predicts)
    probabilities = L.out_of_fold(features, given, 6, 5, 0).probabilities
    assert (probabilities[fold == 0].argmax(axis=1) == given[fold == 0]).mean() > 0.9


def test_the_heads_end_at_their_deadline_or_a_stop_request_and_not_before(monkeypatch):
    import threading
    import time

    features, _, given, _ = flipped(examples=300)
    with pytest.raises(L.Cut, match="their time budget"):
        L.out_of_fold(features, given, 6, 5, 0, deadline=time.monotonic() - 1)
    stop = threading.Event()
    stop.set()
    with pytest.raises(L.Cut, match="a stop request"):
        L.out_of_fold(features, given, 6, 5, 0, stop=stop)
    # (looked at between chunks of steps: with room, the same probabilities as all steps in one go)
    bounded = L.out_of_fold(features, given, 6, 5, 0, stop=threading.Event(), deadline=time.monotonic() + 120)
    monkeypatch.setattr(L, "HEAD_CHUNK", L.HEAD_STEPS)
    np.testing.assert_allclose(bounded.probabilities, L.out_of_fold(features, given, 6, 5, 0).probabilities, atol=1e-6)


def test_the_suspects_are_cleanlabs_in_its_order_where_probabilities_tie():
    """Rounded probabilities tie often, at the cut and within it: the suspects chosen and their
    order are cleanlab's own (its np.argsort, not a stable sort), in float32 as in float64."""
    rng = np.random.default_rng(0)
    differ = 0
    for trial in range(30):
        labels = rng.integers(0, 4, 300)
        alpha = np.full((300, 4), 0.7)
        alpha[np.arange(300), labels] += 1.5  # (a model that has learnt something: every class above chance)
        probabilities = np.round(np.array([rng.dirichlet(a) for a in alpha]), 1 + trial % 2)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        if trial % 3 == 0:
            probabilities = probabilities.astype(np.float32)
        found = L.find(probabilities, labels)
        ranked = find_label_issues(labels, probabilities, filter_by="low_self_confidence",
                                   return_indices_ranked_by="self_confidence")
        assert found.unjudged == 0 and list(found.indices) == list(ranked), trial
        given = probabilities[np.arange(300), labels]
        differ += list(found.indices) != list(np.argsort(given, kind="stable")[: len(found)])
    assert differ > 0  # (ties that a stable sort orders otherwise: the test means something)


def precision_of(found: L.Suspects, wrong: np.ndarray) -> float:
    return float(wrong[found.indices].mean())


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("rare", [1, 3, 5, 10, 20])
def test_a_rare_or_unlearnt_class_does_not_inflate_every_classs_suspects(rare, seed):
    """900 images of 6 classes, 5 % of the labels flipped, and `rare` of them filed under a seventh
    class of their own (which no head can learn: its images are of the six others). Counted, its
    threshold would be so low that half the images became confidently it (one image: 41 suspects,
    precision 0.88, became 108, precision 0.42). Not judged (it never is, over 5 sizes and 4
    seeds), the suspects' precision falls by less than 0.1 (0.15 from 5 images), and its images are neither counted nor
    suspected. (Judging every class, as cleanlab does, is shown on seed 1 with 1 and 3 images: the
    seeds and sizes differ in how much it costs.)"""
    features, _, given, flips = flipped(examples=900, classes=6, rate=0.05, separation=0.6, seed=seed)
    before = L.find(L.out_of_fold(features, given, 7, 5, 0).probabilities, given)
    relabelled, wrong = given.copy(), flips.copy()
    relabelled[:rare], wrong[:rare] = 6, True
    probabilities = L.out_of_fold(features, relabelled, 7, 5, 0).probabilities
    found = L.find(probabilities, relabelled)
    # (issue 70's goal, for up to 3 images; a class of 10 moves the other classes' heads more: 0.11 at worst)
    assert precision_of(found, wrong) > precision_of(before, flips) - (0.1 if rare <= 3 else 0.15)
    assert len(found) <= 1.2 * len(before) and found.unjudged == rare and found.unjudged_classes == (6,)
    assert not set(found.indices.tolist()) & set(range(rare))
    if seed == 1 and rare <= 3:
        counted = L.suspects_of(probabilities, relabelled, np.ones(7, bool))  # (every class judged, as cleanlab)
        assert len(counted) > 1.5 * len(before) and precision_of(counted, wrong) < precision_of(before, flips) - 0.1


def test_a_validation_set_with_two_images_of_a_hard_class_keeps_its_suspects():
    """No folds: a model's held-out probabilities, the model having seen the seventh class twice
    in training. Its two validation images do not make half the others confidently it."""
    features, _, given, flips = flipped(examples=1000, classes=6, rate=0.05, separation=0.6, seed=2)
    train_x, train_y, test_x, test_y, wrong = features[:500], given[:500].copy(), features[500:], given[500:].copy(), \
        flips[500:].copy()
    train_y[:2], test_y[:2], wrong[:2] = 6, 6, True
    before = L.find(L._head_probabilities(features[:500], given[:500], test_x, 7, 0), given[500:])
    found = L.find(L._head_probabilities(train_x, train_y, test_x, 7, 0), test_y)
    assert abs(precision_of(found, wrong) - precision_of(before, flips[500:])) < 0.1
    assert len(found) <= 1.2 * len(before) and found.unjudged == 2


def test_a_class_with_fewer_images_than_folds_is_not_judged():
    features, _, given, _ = flipped(examples=600, rate=0, separation=1.5)
    given = given.copy()
    given[:3] = 6  # a seventh class of three images, fewer than the 5 folds: no head sees it enough
    found = L.find(L.out_of_fold(features, given, 7, 5, 0).probabilities, given)
    assert not {0, 1, 2} & set(found.indices.tolist()) and found.unjudged == 3
    assert (np.diff(found.given_probability) >= 0).all()


def test_the_heads_held_out_accuracy_is_that_of_the_probabilities_they_give():
    features, truth, given, flips = flipped(rate=0.1, separation=1.5)
    held = L.out_of_fold(features, given, 6, 5, 0)
    assert held.accuracy == pytest.approx((held.probabilities.argmax(axis=1) == given).mean())
    # (labels 10 % wrong: the heads, right on the true classes, are right on about 90 % of the given ones)
    assert 0.8 < held.accuracy < 0.92 and (held.probabilities.argmax(axis=1) == truth).mean() > held.accuracy
    noise = L.out_of_fold(np.random.default_rng(0).normal(size=(300, 32)), given[:300], 6, 5, 0)
    assert noise.accuracy < 0.3  # (features that say nothing: chance, 1/6)


def test_an_image_whose_probabilities_are_not_numbers_is_left_out_and_its_class_still_judged():
    """An infinite logit makes a row of NaN probabilities: its class's mean would be NaN, and the
    class never judged (the suspects of every class it could be confused with lost). Left out, the
    other images' suspects are those found without it, and it is counted as unreadable."""
    features, _, given, _ = flipped(rate=0.1, separation=1.0, seed=3)
    probabilities = L.out_of_fold(features, given, 6, 5, 0).probabilities
    without = L.find(probabilities[1:], given[1:])
    broken = probabilities.copy()
    broken[0] = np.nan
    found = L.find(broken, given)
    assert len(without) > 0 and list(found.indices) == list(without.indices + 1)
    assert found.unreadable == 1 and found.unjudged == 0


def test_a_rare_class_of_two_that_the_model_tells_apart_is_judged():
    """Two classes, 180 and 20 images, 5 of the rare one's labels given as the common one: the rare
    class's own probability averages under 1/2 (chance), but far above what the common class's
    images are given of it. Judged, its flips are found, as cleanlab finds them."""
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], [180, 20])
    rare = np.concatenate([np.full(180, 0.05), np.full(20, 0.45)]) + rng.uniform(-0.03, 0.03, 200)
    rare[[180, 181, 182, 183, 184]] = 0.6  # (rare images, given the common label below)
    given = labels.copy()
    given[180:185] = 0
    probabilities = np.stack([1 - rare, rare], axis=1)
    found = L.find(probabilities, given)
    assert sorted(found.indices.tolist()) == list(range(180, 185)) and found.unjudged == 0
    theirs = find_label_issues(given, probabilities, filter_by="low_self_confidence")
    assert set(np.flatnonzero(theirs)) == set(found.indices.tolist())


def test_with_one_class_told_apart_none_is_judged_and_all_are_said_unjudged():
    labels = np.repeat([0, 1, 2], 30)
    probabilities = np.full((90, 3), 1 / 3)
    probabilities[:30] = [0.8, 0.1, 0.1]  # (class 0 learnt; 1 and 2 not told apart)
    found = L.find(probabilities, labels)
    assert len(found) == 0 and found.unjudged == 90 and found.unjudged_classes == (0, 1, 2)


def test_the_auc_is_the_chance_an_own_example_scores_above_another_ties_counting_half():
    positive = np.array([True, True, False, False, False])
    assert L.auc(np.array([0.9, 0.8, 0.1, 0.2, 0.3]), positive) == 1.0
    assert L.auc(np.array([0.1, 0.2, 0.9, 0.8, 0.3]), positive) == 0.0
    assert L.auc(np.full(5, 0.5), positive) == 0.5
    assert L.auc(np.array([0.9, 0.3, 0.1, 0.3, 0.5]), positive) == pytest.approx((3 + 0.5 + 1) / 6)
