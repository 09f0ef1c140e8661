"""The exported SavedModel serves exactly the calibration rule fitted (training/calibration.py):
z / T + b, Platt scaling for a multi-label model (its decision still its own threshold on its own
sigmoid, at the calibrated threshold serving.json gives), a temperature for a single-label one;
serving.json holds the rule and reads back as written."""

import numpy as np
import pytest

from keras_pipe_train.settings import serving_schema
from keras_pipe_train.training import calibration as C
from tests.conftest import image_bytes

IMAGES = [image_bytes("JPEG", 20 + 3 * i, 30 + i) for i in range(6)]


def answers(model_dir) -> dict:
    import tensorflow as tf

    serve = tf.saved_model.load(str(model_dir / "1")).signatures["serving_default"]
    return {k: v.numpy() for k, v in serve(image_bytes=tf.constant(IMAGES)).items()}


@pytest.mark.slow
@pytest.mark.parametrize("threshold, temperature, bias", [
    (None, 2.0, None),
    (0.45, [0.5, 2.0, 4.0], [2.0, -1.0, 0.5]),
])
def test_the_savedmodel_serves_the_rule_fitted_on_the_same_logits(tmp_path, threshold, temperature, bias):
    from tests.serve.conftest import exported

    plain = answers(exported(tmp_path / "plain", threshold))["probabilities"].astype(np.float64)
    folder = exported(tmp_path / "calibrated", threshold, temperature=temperature, bias=bias)
    served = serving_schema.read(folder).calibration
    assert served.bias == (None if bias is None else tuple(bias))
    assert served.method == (C.TEMPERATURE if threshold is None else C.PLATT)
    got = answers(folder)
    # the model's own logits, from its own probabilities (a softmax's up to a constant, which it ignores)
    logits = np.log(plain) if threshold is None else np.log(plain / (1 - plain))
    expected = C.served_probabilities(logits, served, threshold is not None)
    np.testing.assert_allclose(got["probabilities"], expected, atol=2e-5)
    assert not np.allclose(got["probabilities"], plain, atol=1e-2)  # (the rule did something)
    if threshold is None:
        assert (got["class_ids"] == expected.argmax(axis=1)).all()
    else:  # decided on its own sigmoid; at or above each class's calibrated threshold exactly then
        own = plain >= threshold
        assert (got["predicted"].astype(bool) == own).all()
        edges = np.array(served.calibrated_thresholds)
        close = np.isclose(got["probabilities"], edges, atol=1e-6)
        assert ((got["probabilities"] >= edges) == own)[~close].all()
        assert edges == pytest.approx(C.served_probabilities(np.log(threshold / (1 - threshold)) * np.ones((1, 3)),
                                                             served, True)[0])
