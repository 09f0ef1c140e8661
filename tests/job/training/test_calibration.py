"""Temperature scaling (keras_pipe_train.training.calibration): the fit finds a planted temperature,
the figures are the textbook ones, the auto rule applies it only where it is honest to, and the
pass that gathers the logits is bounded."""

import threading

import numpy as np
import pytest

from keras_pipe_train.training import calibration as C


def planted(temperature, examples=4000, classes=10, seed=0):
    """Logits, and labels drawn from softmax(logits / temperature): the model's own probabilities
    are then miscalibrated by exactly `temperature`."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, (examples, classes))
    truth = C.tempered(logits, temperature, False)
    labels = (truth.cumsum(axis=1) > rng.random((examples, 1))).argmax(axis=1)
    return logits, labels


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.5, 6.0])
def test_the_fit_finds_a_planted_temperature(temperature):
    logits, labels = planted(temperature)
    assert C.fit_temperature(logits, labels, False) == pytest.approx(temperature, rel=0.1)


def test_the_fit_is_the_least_nll_on_a_grid():
    logits, labels = planted(2.0, examples=500, seed=3)
    fitted = C.fit_temperature(logits, labels, False)

    def nll(t):
        return C.scores(logits / t, labels, False)["nll"]

    grid = np.linspace(0.5, 5, 451)
    assert nll(fitted) <= min(nll(t) for t in grid) + 1e-9


def test_a_temperature_never_changes_a_prediction():
    logits, _ = planted(1.0, examples=300)
    for t in (0.05, 0.3, 1.7, 20.0):
        assert (C.tempered(logits, t, False).argmax(axis=1) == logits.argmax(axis=1)).all()


def test_the_figures_by_hand():
    probabilities = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.6, 0.4]])
    labels = np.array([0, 1, 1, 0])
    found = C.scores(np.log(probabilities), labels, False)  # (softmax(log p) is p)
    # confidences 0.9, 0.8, 0.7, 0.6 (bins 13, 12, 10, 9 of 15), right: yes, no, yes, yes
    assert found["ece"] == pytest.approx((0.1 + 0.8 + 0.3 + 0.4) / 4)
    assert found["nll"] == pytest.approx(-np.mean(np.log([0.9, 0.2, 0.7, 0.6])))
    assert found["brier"] == pytest.approx(np.mean([0.02, 1.28, 0.18, 0.32]))
    assert [b["examples"] for b in found["reliability"]] == [1, 1, 1, 1]
    assert found["reliability"][0] == {"bin": [9 / 15, 10 / 15], "confidence": 0.6, "accuracy": 1.0, "examples": 1}


def test_an_overconfident_model_is_calibrated_and_its_ece_at_least_halved():
    logits, labels = planted(3.0)
    found = C.calibrate(logits, labels, False, "auto", seed=1)
    assert found.applied and "lower" in found.reason
    assert found.before["ece"] > 0.02 and found.after["ece"] <= found.before["ece"] / 2
    assert found.after["nll"] < found.before["nll"] and found.after["brier"] < found.before["brier"]
    served = found.serving(None)
    assert served.temperature == pytest.approx(3.0, rel=0.1) and served.validation_examples == 4000


def test_auto_declines_where_the_fit_would_not_be_honest():
    few = planted(3.0, examples=C.MIN_EXAMPLES - 1)
    assert not C.calibrate(*few, False, "auto", seed=1).applied
    assert "fewer than 200" in C.calibrate(*few, False, "auto", seed=1).reason
    # a set the model gets all right: the fit runs to the bound, sharpening every answer
    logits, labels = planted(1.0)
    perfect = np.eye(10)[labels] * 4 + logits * 0.01
    found = C.calibrate(perfect, labels, False, "auto", seed=1)
    assert not found.applied and "bound" in found.reason and found.serving(None) is None
    # calibrated already: the cross-fitted NLL is no lower
    logits, labels = planted(1.0, seed=7)
    assert C.fit_temperature(logits, labels, False) == pytest.approx(1.0, rel=0.1)
    found = C.calibrate(logits, labels, False, "auto", seed=1)
    assert found.applied == (found.after["nll"] < found.before["nll"])


def test_true_and_false_say_so_and_the_figures_are_measured_either_way():
    logits, labels = planted(2.0, examples=120)
    on, off = (C.calibrate(logits, labels, False, setting, seed=1) for setting in ("true", "false"))
    assert on.applied and on.reason == "calibration=true"
    assert not off.applied and off.reason == "calibration=false" and off.serving(None) is None
    assert on.before == off.before and on.after == off.after and on.examples == 120


def test_the_nll_is_exact_where_a_probability_rounds_to_zero():
    """A confident mistake: its label's probability is e^-200, 0 in float32 and clipped anywhere
    probabilities are; from the logits its NLL is 200, as the job's val_loss computes it."""
    found = C.scores(np.array([[200.0, 0.0], [0.0, 3.0]]), np.array([1, 1]), False)
    assert found["nll"] == pytest.approx((200 + np.log1p(np.exp(-3.0))) / 2)
    multi = C.scores(np.array([[-150.0]]), np.array([[1.0]]), True)
    assert multi["nll"] == pytest.approx(150)


def test_after_is_cross_fitted_not_fitted_on_itself():
    """Scored on the examples it was fitted on, a temperature looks better than it is: the
    cross-fitted NLL is never below the in-sample one."""
    logits, labels = planted(2.0, examples=300, seed=5)
    found = C.calibrate(logits, labels, False, "auto", seed=2)
    in_sample = C.scores(logits / found.temperature, labels, False)
    assert found.after["nll"] >= in_sample["nll"] - 1e-12


def test_multi_label_has_a_temperature_per_class_and_rare_classes_share_the_pooled_one():
    rng = np.random.default_rng(4)
    planted_t = np.array([0.5, 1.0, 2.0, 3.0, 4.0])
    logits = rng.normal(0, 3, (4000, 5))
    labels = (rng.random((4000, 5)) < C.tempered(logits, planted_t, True)).astype(np.float32)
    fitted = C.fit_temperature(logits, labels, True)
    assert fitted == pytest.approx(planted_t, rel=0.15)
    labels[:, 2] = 0
    labels[: C.MIN_CLASS_SIDE - 1, 2] = 1  # too few positives for a fit of its own
    fitted = C.fit_temperature(logits, labels, True)
    pooled = C.fit_temperature(logits.reshape(-1, 1), labels.reshape(-1, 1), True)[0]
    assert fitted[2] == pytest.approx(pooled) and fitted[4] == pytest.approx(4.0, rel=0.15)
    found = C.calibrate(logits, labels, True, "auto", seed=0)
    assert found.applied and len(found.per_class_ece["before"]) == 5
    assert found.per_class_ece["after"][4] < found.per_class_ece["before"][4] / 2


def test_multi_label_predictions_stay_the_thresholds_on_the_models_own_probabilities():
    rng = np.random.default_rng(6)
    logits = rng.normal(0, 3, (3000, 4))
    labels = (rng.random((3000, 4)) < C.tempered(logits, np.array([3.0, 0.7, 2.0, 1.5]), True)).astype(np.float32)
    found = C.calibrate(logits, labels, True, "true", seed=0)
    for threshold in (0.5, 0.3, 0.85):
        edges = np.array(found.serving(threshold).calibrated_thresholds)
        raw = C.tempered(logits, 1.0, True) >= threshold
        calibrated = C.tempered(logits, found.temperature, True)
        assert ((calibrated >= edges - 1e-12) == raw).mean() > 0.999  # (float rounding at the edge itself)
        if threshold == 0.5:
            assert edges == pytest.approx(0.5)


def test_the_pass_keeps_at_most_its_bound_and_says_it_was_cut():
    import tensorflow as tf

    from keras_pipe_train.training.gathered import gather

    rng = np.random.default_rng(0)
    images = rng.normal(size=(50, 4)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((images, rng.integers(0, 2, 50))).batch(8)
    seen = gather(lambda x: x[:, :2] * 2, dataset, 2, 1000)
    assert seen.outputs.shape == (50, 2) and seen.labels.shape == (50,) and not seen.cut
    assert np.allclose(seen.outputs, images[:, :2] * 2) and seen.fingerprints == ()
    seen = gather(lambda x: x[:, :2], dataset, 2, 20)
    assert seen.outputs.shape == (20, 2) and len(seen) == 20 and seen.cut
    stop = threading.Event()
    stop.set()
    seen = gather(lambda x: x[:, :2], dataset, 2, 1000, stop=stop)
    assert seen.outputs.shape == (0, 2) and seen.cut
    # an examined pass's fingerprints, thumbnails and sources ride along
    examined = tf.data.Dataset.from_tensor_slices((images, np.zeros(50, np.int64), np.tile(np.arange(8, dtype=np.uint8),
                                                   (50, 1)), [b"jpeg"] * 50,
                                                   ["s3://b/ü.jpg".encode()] * 49 + [b"\xff"])).batch(8)
    seen = gather(lambda x: x, examined, 4, 50)
    assert seen.fingerprints[:10] == ("0001020304050607",) * 10 and seen.thumbnails[:10] == (b"jpeg",) * 10
    assert seen.sources[:49] == ("s3://b/ü.jpg",) * 49 and seen.sources[49] == "\\xff"  # (not UTF-8: escaped)
    # features kept as float16 saturate at its largest value, never inf
    seen = gather(lambda x: x * 1e6, dataset, 4, 50, dtype=np.float16)
    assert np.isfinite(seen.outputs).all() and np.abs(seen.outputs).max() == np.finfo(np.float16).max


def test_a_multi_label_set_too_small_or_too_clean_for_any_fit_still_gets_a_temperature():
    """Sparse labels: no class, nor all of them pooled, has 10 positives; and a set the model gets
    all right. Each gets a temperature within the range (once, a recursion without end)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, (30, 3))
    sparse = np.zeros((30, 3), np.float32)
    sparse[:2, 0] = 1
    clean = (logits > 0).astype(np.float32)
    for labels in (sparse, clean):
        fitted = C.fit_temperature(logits, labels, True)
        assert fitted.shape == (3,) and ((fitted >= 0.05 - 1e-9) & (fitted <= 20 + 1e-9)).all()
        C.calibrate(logits, labels, True, "auto", seed=0)  # (its halves too)


def test_a_model_whose_logits_say_little_is_calibrated_at_the_upper_bound_by_auto():
    logits, labels = planted(50.0, examples=1000)
    found = C.calibrate(logits, labels, False, "auto", seed=0)
    assert found.temperature == pytest.approx(20.0, rel=1e-3) and found.applied, found.reason
