"""Confident learning (keras_pipe_train.training.label_errors): the same suspects as cleanlab's
find_label_issues(filter_by="low_self_confidence") on the same probabilities, planted flips found
on features that separate the classes, and folds that are out of sample."""

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
    probabilities = L.out_of_fold(features, given, 6, 5, seed)
    found = L.find(probabilities, given)
    ranked = find_label_issues(given, probabilities, filter_by="low_self_confidence",
                               return_indices_ranked_by="self_confidence")
    assert len(found) > 0 and list(found.indices) == list(ranked)


def test_planted_flips_are_found_with_their_true_class():
    features, truth, given, flips = flipped(rate=0.1, separation=1.5)
    found = L.find(L.out_of_fold(features, given, 6, 5, 0), given)
    hits = flips[found.indices]
    assert hits.mean() >= 0.9 and hits.sum() / flips.sum() >= 0.8, (hits.mean(), hits.sum() / flips.sum())
    assert (found.likely[hits] == truth[found.indices][hits]).mean() >= 0.9
    assert (np.diff(found.given_probability) >= 0).all()  # the given label least likely first
    assert (found.likely != given[found.indices]).all()


def test_clean_labels_of_well_separated_classes_give_no_suspects_and_an_absent_class_none():
    features, _, given, _ = flipped(rate=0.0, separation=3.0, classes=4)
    probabilities = np.zeros((len(given), 5))
    probabilities[:, :4] = L.out_of_fold(features, given, 4, 5, 0)[:, :4]
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
    probabilities = L.out_of_fold(features, given, 2, 5, 0)
    assert abs((probabilities.argmax(axis=1) == given).mean() - 0.5) < 0.12
    in_sample = L._head_probabilities(features, given, features, 2, 0)
    assert (in_sample.argmax(axis=1) == given).mean() > 0.95


def test_a_feature_constant_where_the_head_is_fitted_does_not_decide_the_held_out_fold():
    features, _, given, _ = flipped(examples=300, rate=0.0, separation=3.0)
    features = np.hstack([features, np.zeros((300, 1))])
    fold = L.folds_of(given, 5, 0)
    features[fold == 0, -1] = 5.0  # (zero in the folds a head is fitted on, not in the one it predicts)
    probabilities = L.out_of_fold(features, given, 6, 5, 0)
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
    np.testing.assert_allclose(bounded, L.out_of_fold(features, given, 6, 5, 0), atol=1e-6)


def test_a_class_with_fewer_images_than_folds_is_not_suspected_for_want_of_examples():
    features, _, given, _ = flipped(examples=600, rate=0, separation=1.5)
    given = given.copy()
    given[:3] = 6  # a seventh class of three images, fewer than the 5 folds: no head sees it enough
    found = L.find(L.out_of_fold(features, given, 7, 5, 0), given)
    rare = set(found.indices.tolist()) & {0, 1, 2}
    assert len(rare) >= 2  # (held out, they are suspected for want of examples, right or wrong)
    kept, left_out = L.of_classes_with(found, given, 5)
    assert left_out == len(rare) and not rare & set(kept.indices.tolist())
    assert len(kept) == len(found) - len(rare) and (np.diff(kept.given_probability) >= 0).all()
