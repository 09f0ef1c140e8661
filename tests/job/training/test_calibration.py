"""Temperature scaling (keras_pipe_train.training.calibration): the fit finds a planted temperature,
the figures are the textbook ones, the auto rule applies it only where it is honest to, and the
pass that gathers the logits is bounded."""

import re
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


def test_multi_label_has_a_temperature_per_class_and_rare_classes_keep_their_own_probabilities():
    rng = np.random.default_rng(4)
    planted_t = np.array([0.5, 1.0, 2.0, 3.0, 4.0])
    logits = rng.normal(0, 3, (4000, 5))
    labels = (rng.random((4000, 5)) < C.tempered(logits, planted_t, True)).astype(np.float32)
    fitted = C.fit_temperature(logits, labels, True)
    assert fitted == pytest.approx(planted_t, rel=0.15)
    labels[:, 2] = 0
    labels[: C.MIN_CLASS_SIDE - 1, 2] = 1  # too few positives for a fit of its own
    fitted = C.fit_temperature(logits, labels, True)
    assert fitted[2] == 1.0 and fitted[4] == pytest.approx(4.0, rel=0.15)
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
    seen = gather(lambda x: x[:, :2], dataset, 2, 20)  # (a sample of 20 of the 50 read: not cut)
    assert seen.outputs.shape == (20, 2) and len(seen) == 20 and not seen.cut and seen.read == 50 and seen.sampled
    assert {tuple(row) for row in seen.outputs} <= {tuple(row) for row in images[:, :2]}
    stop = threading.Event()
    stop.set()
    seen = gather(lambda x: x[:, :2], dataset, 2, 1000, stop=stop)
    assert seen.outputs.shape == (0, 2) and seen.cut and seen.read == 0
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


def test_the_pass_keeps_a_seeded_sample_of_every_class_read_class_by_class():
    """Image folders are read class by class: 1,000 examples of 10 classes, 100 kept. The first 100
    would all be class 0; a uniform sample holds about 10 of each. The function runs on the examples
    kept alone, and the outputs stay those of their own examples."""
    import tensorflow as tf

    from keras_pipe_train.training.gathered import gather

    labels = np.repeat(np.arange(10), 100)
    images = np.stack([np.arange(1000), labels], axis=1).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(32)
    rows = []

    def function(x):
        rows.append(len(x))
        return x

    seen = gather(function, dataset, 2, 100, seed=3)
    counts = np.bincount(seen.labels, minlength=10)
    assert len(seen) == 100 and seen.read == 1000 and not seen.cut
    assert counts.min() >= 3 and counts.max() <= 20, counts
    assert (seen.outputs[:, 1] == seen.labels).all() and len(set(seen.outputs[:, 0].tolist())) == 100
    assert sum(rows) < 500  # (about 100 x (1 + ln 10): the rest are never run through it)
    again, other = gather(lambda x: x, dataset, 2, 100, seed=3), gather(lambda x: x, dataset, 2, 100, seed=4)
    assert np.array_equal(again.outputs, seen.outputs) and not np.array_equal(other.outputs, seen.outputs)


def test_the_reservoir_keeps_each_item_as_often_as_any_other():
    from keras_pipe_train.training.gathered import Reservoir

    kept = np.zeros(60)
    for seed in range(3000):
        reservoir, slots = Reservoir(12, seed), np.full(12, -1)
        for batch in (7, 20, 1, 32):  # (batches of any size: one sample of the whole pass)
            first = reservoir.offered
            positions, where = reservoir.places(batch)
            assert len(set(where.tolist())) == len(where) and (where < 12).all()
            slots[where] = first + positions
        assert (slots >= 0).all() and len(set(slots.tolist())) == 12
        kept[slots] += 1
    share = kept / 3000  # (each item 12 / 60 = 0.2 of the time; the spread of a share of 3,000 is 0.0073)
    assert np.abs(share - 0.2).max() < 0.035, share


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


def misfiled(examples=200, wrong=12, classes=10, seed=1):
    """A model right on every correctly filed image (its class's logit 8 to 12 above the others),
    and `wrong` images filed under another class, whose logit the model puts 7 below the others:
    the only errors are the labels'."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, classes, examples)
    logits = rng.normal(0, 0.3, (examples, classes))
    logits[np.arange(examples), truth] += rng.uniform(8, 12, examples)
    given = truth.copy()
    flip = rng.choice(examples, wrong, replace=False)
    given[flip] = (truth[flip] + rng.integers(1, classes, wrong)) % classes
    logits[flip, given[flip]] -= 7
    return logits, given


def test_auto_never_applies_a_temperature_that_raises_the_brier_score():
    """12 labels of 200 filed wrong, the model right on every other image: the temperature of least
    NLL softens every right answer to pay for the 12 (NLL 1.07 -> 0.60), and the Brier score and
    ECE rise (0.120 -> 0.128, 0.059 -> 0.103): auto does not apply it, and says why."""
    logits, labels = misfiled()
    found = C.calibrate(logits, labels, False, "auto", seed=0)
    assert found.temperature > 2 and found.method == C.TEMPERATURE
    assert found.after["nll"] < found.before["nll"] - 0.3  # (the NLL alone would have applied it)
    assert found.after["brier"] > found.before["brier"] and found.after["ece"] > found.before["ece"]
    assert not found.applied and found.reason == "calibration=auto: the cross-fitted Brier score is no lower with it"
    assert found.serving(None) is None


@pytest.mark.parametrize("examples", [1, 10])
def test_true_never_serves_the_lower_bound_on_a_set_without_errors(examples):
    """10 clean images, or one: the fit sharpens as far as it may (T = 0.05); calibration=true does
    not serve it, and says why."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, examples)
    logits = np.eye(5)[labels] * 4 + rng.normal(0, 0.3, (examples, 5))
    found = C.calibrate(logits, labels, False, "true", seed=0)
    assert C.at_bound(found.temperature)
    assert not found.applied and found.served is None and found.serving(None) is None
    assert found.reason.startswith("calibration=true: the fit reached the temperature's lower bound 0.05")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_logits_that_are_not_finite_are_left_out_of_the_fit_and_counted(bad):
    logits, labels = planted(3.0, examples=1000)
    broken = logits.copy()
    broken[7, 3] = bad
    for setting in ("auto", "true"):
        found = C.calibrate(broken, labels, False, setting, seed=1)
        clean = C.calibrate(np.delete(logits, 7, axis=0), np.delete(labels, 7), False, setting, seed=1)
        assert found.temperature == pytest.approx(clean.temperature) == pytest.approx(3.0, rel=0.15)
        assert found.applied and found.examples == 999 and found.left_out == 1
        assert found.reason == clean.reason + " (1 example whose logits are not finite left out of the fit and the figures)"
        assert np.isfinite([found.before["nll"], found.after["nll"], found.after["brier"]]).all()
    with pytest.raises(ValueError, match="none of the 2 validation examples' logits are finite"):
        C.calibrate(np.full((2, 3), np.nan), np.array([0, 1]), False, "true", seed=1)


def offset_multi_label(examples=2000, seed=0):
    """A multi-label model calibrated but for class 0, whose logits are all 2 too high."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(0, 3, (examples, 5))
    labels = (rng.random((examples, 5)) < C.tempered(truth, 1.0, True)).astype(np.float32)
    logits = truth.copy()
    logits[:, 0] += 2.0
    return logits, labels


def test_a_multi_label_class_offset_is_corrected_by_platt_scaling():
    """sigmoid(z / T) keeps 0.5 where it is: a temperature cannot undo an offset (class 0's held-out
    ECE 0.216 before, 0.189 with temperatures). Platt scaling, sigmoid(z / T + b), does (0.02), and
    the served rule's calibrated thresholds still give exactly the model's own predictions."""
    logits, labels = offset_multi_label()
    found = C.calibrate(logits, labels, True, "auto", seed=0)
    assert found.method == C.PLATT and found.applied
    assert found.per_class_ece["before"][0] > 0.2 and found.per_class_ece["after"][0] < 0.04
    assert found.bias[0] == pytest.approx(-2.0, abs=0.3) and np.abs(found.bias[1:]).max() < 0.3
    assert found.after["ece"] < found.before["ece"] and found.after["brier"] < found.before["brier"]
    served = found.serving(0.3)
    assert served.bias == tuple(found.bias.tolist()) and served.method == C.PLATT
    raw = C.tempered(logits, 1.0, True) >= 0.3
    calibrated = C.served_probabilities(logits, served, True)
    assert ((calibrated >= np.array(served.calibrated_thresholds) - 1e-12) == raw).mean() > 0.999


def test_a_single_label_model_keeps_a_temperature_alone_and_so_its_predictions():
    """class_weights=balanced-like offsets: a bias per class would beat the temperature on NLL, but
    would move the model's decisions (softmax(z / T + b)'s argmax is not z's): the rule stays a
    temperature, which keeps every prediction."""
    rng = np.random.default_rng(1)
    truth = rng.normal(0, 2, (3000, 6))
    labels = (C.tempered(truth, 1.0, False).cumsum(axis=1) > rng.random((3000, 1))).argmax(axis=1)
    offsets = np.array([0, 0.5, 1.0, 1.5, -1.0, -1.5])
    for logits in (truth + offsets, truth * 2):
        found = C.calibrate(logits, labels, False, "true", seed=0)
        assert found.method == C.TEMPERATURE and found.bias is None
        served = C.served_probabilities(logits, found.serving(None), False)
        assert (served.argmax(axis=1) == logits.argmax(axis=1)).all()
    assert C.calibrate(truth * 2, labels, False, "auto", seed=0).temperature == pytest.approx(2.0, rel=0.1)


def test_the_cross_fitted_figures_are_those_of_the_rule_served():
    """A class of 19 positives among 400 has a temperature of its own when served; each half of the
    cross-fit holds about 10 of them, and still fits its own (not the pooled one, which would score a
    rule that is not served)."""
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 3, (400, 4))
    logits[:, 1] = rng.normal(-16, 6, 400)
    labels = (rng.random((400, 4)) < C.tempered(logits, np.array([1.0, 4.0, 1.0, 1.0]), True)).astype(np.float32)
    assert labels[:, 1].sum() == 19 and C.own_classes(logits, labels, True)[1]
    rule, after = C.fit(logits, labels, True, seed=0)
    ratio = np.round(after[:, 1] / logits[:, 1], 12)  # (each half divided by the other half's temperature)
    values = np.unique(ratio)
    assert len(values) == 2
    for value in values:
        other = ratio != value
        assert labels[other, 1].sum() < C.MIN_CLASS_SIDE or labels[~other, 1].sum() < C.MIN_CLASS_SIDE
        own = C.fit_temperature(logits[other][:, [1]], labels[other][:, [1]], True, own=np.array([True]))[0]
        assert 1 / value == pytest.approx(own)


def test_auto_never_applies_a_rule_whose_cross_fitted_ece_is_higher():
    """(issue 70's goal: where calibration is applied, ECE and Brier are never above before)"""
    rule = C.Rule(C.TEMPERATURE, 1.5)
    before = {"nll": 1.0, "brier": 0.20, "ece": 0.050}
    assert C._decided("auto", rule, 500, before, {"nll": 0.9, "brier": 0.19, "ece": 0.050}) == (
        True, "calibration=auto: the cross-fitted NLL and Brier score are both lower with it, the ECE no higher")
    assert C._decided("auto", rule, 500, before, {"nll": 0.9, "brier": 0.19, "ece": 0.051}) == (
        False, "calibration=auto: the cross-fitted ECE is higher with it")
    assert C._decided("true", rule, 500, before, {"nll": 1.1, "brier": 0.21, "ece": 0.09}) == (True, "calibration=true")


def test_a_pooled_fit_at_the_lower_bound_is_never_served_even_to_some_classes():
    """Two classes with enough positives and errors fit their own temperatures; a third, with two
    positives, takes the pooled fit. Pooled at the lower bound, the rule is not served at all."""
    pooled_at_edge = np.array([1.3, 0.8, C.TEMPERATURE_RANGE[0]])
    assert C.at_bound(pooled_at_edge) and not C.at_bound(np.array([1.3, 0.8, 0.9]))
    assert C.at_bound(C.TEMPERATURE_RANGE[0]) and not C.at_bound(1.0)


def suspects(logits, labels):
    from keras_pipe_train.training import label_errors

    mask = np.zeros(len(labels), bool)
    mask[label_errors.find(C.tempered(logits, 1.0, False), labels).indices] = True
    return mask


def test_auto_does_not_soften_a_model_whose_errors_are_its_labels():
    """A model right on nearly every image, 20 % of whose validation labels are wrong: the plain
    fit softens it (T about 7), and the given labels' NLL, Brier and ECE all say apply it. With
    the label check's suspects, auto sees that its errors are the labels' (bench/calibration_fit_set.py:
    served, the true ECE goes from 0.001 to 0.2), does not apply it, and says why."""
    from bench.calibration_fit_set import flipped, model_logits

    rng = np.random.default_rng(0)
    logits, truth = model_logits(5.0, 1.0, 600, rng)
    given = flipped(truth, 0.2, rng)
    unguarded = C.calibrate(logits, given, False, "auto", seed=0)
    assert unguarded.applied and unguarded.temperature > 5
    found = C.calibrate(logits, given, False, "auto", seed=0, suspected=suspects(logits, given))
    assert not found.applied and found.serving(None) is None
    assert re.fullmatch(r"calibration=auto: the label check suspects 1\d\d of the 600 validation labels the fit was "
                        r"made on, and the model is right on (99\.\d|100\.0)% of the others: if those labels are wrong, "
                        r"the temperature 6\.\d+ would soften every answer to pay for them, so it is not applied "
                        r"\(label_errors.csv names them; if they are right, the model's confident mistakes, "
                        r"calibration=true applies it\)", found.reason), found.reason
    # (calibration=true is the user's word: applied)
    assert C.calibrate(logits, given, False, "true", seed=0, suspected=suspects(logits, given)).applied


def test_auto_still_softens_an_overconfident_model_whose_labels_are_right():
    """Twice overconfident, right on 90 %, no label wrong: its confident mistakes are suspected
    (about 6 % of the images), but it is wrong on more than 3 % of the others, so the suspects may
    be its own mistakes: the temperature (about 2, the right one) is applied."""
    from bench.calibration_fit_set import model_logits

    logits, truth = model_logits(3.0, 2.0, 600, np.random.default_rng(0))
    mask = suspects(logits, truth)
    assert mask.mean() >= C.SUSPECTED_SHARE
    found = C.calibrate(logits, truth, False, "auto", seed=0, suspected=mask)
    assert found.applied and found.temperature == pytest.approx(2.0, rel=0.15), found.reason


def test_a_class_never_present_is_not_made_worse_by_its_overconfident_neighbours():
    """The outside review's case: four classes overconfident by 2.5, and a fifth never present,
    the model sure of it (logits about -6). Given the temperature pooled over every class (about
    2.4), it was served 5.7 % on average instead of 0.3 % (its ECE 0.003 -> 0.057) while the
    pooled ECE fell; it now keeps its own probabilities, and no class's ECE rises."""
    rng = np.random.default_rng(0)
    truth = rng.normal(0, 3, (2000, 4))
    labels = (rng.random((2000, 4)) < C.tempered(truth, 1.0, True)).astype(np.float32)
    logits = np.hstack([truth * 2.5, rng.normal(-6, 0.5, (2000, 1))])
    labels = np.hstack([labels, np.zeros((2000, 1), np.float32)])
    found = C.calibrate(logits, labels, True, "auto", seed=0)
    assert found.applied and found.served.temperature[4] == 1.0
    assert found.served.temperature[:4] == pytest.approx((2.5,) * 4, rel=0.15)
    served = C.served_probabilities(logits, found.served, True)[:, 4].mean()
    assert served == pytest.approx(C.tempered(logits[:, 4], 1.0, True).mean())
    assert (np.array(found.per_class_ece["after"]) <= np.array(found.per_class_ece["before"]) + 1e-9).all()


def test_a_multi_label_set_with_no_class_to_fit_applies_nothing_and_says_why():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, (300, 3))
    labels = np.zeros((300, 3), np.float32)
    labels[:4, 0] = 1  # (4 positives: no class has 10 of each)
    for setting in ("true", "auto"):
        found = C.calibrate(logits, labels, True, setting, seed=0)
        assert not found.applied and found.served is None
        assert found.reason == (f"calibration={setting}: no class has 10 positives and 10 negatives among the 300 "
                                "validation examples, with errors to fit on: each keeps the model's own probabilities")


@pytest.mark.parametrize("classes, fitted, kept", [(5, 1_677_721, 100_000), (1000, 8_388, 33_554), (5000, 1_677, 6_710)])
def test_the_label_check_reads_more_validation_images_than_the_fit_needs(classes, fitted, kept):
    """The outside review: the validation pass kept only what the fit needs (2^23 logits), so a job
    of 1,000 classes had 8 images of each checked, and one of 5,000 fewer than a class needs to be
    judged. The pass now keeps up to 2^25 logits (MAX_CHECKED images at most) for the check, and
    the fit is made on a sample of them."""
    from keras_pipe_train.after_training import calibrate

    assert calibrate.kept(classes, checks=True) == (fitted, kept)
    assert calibrate.kept(classes, checks=False) == (fitted, fitted)
    sample = calibrate.fit_sample(kept, fitted, seed=3)
    assert len(sample) == min(kept, fitted) and len(set(sample.tolist())) == len(sample)
    assert (np.diff(sample) > 0).all() and (calibrate.fit_sample(10, 20, 3) == np.arange(10)).all()
