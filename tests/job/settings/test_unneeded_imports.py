"""The job and the server start without Keras' optional imports of scikit-learn and pandas
(keras_pipe_train/settings/unneeded_imports.py), which make test's .venv has installed (SageMaker SDK v3
brings them): Keras still builds, trains and saves a model there."""

import importlib.util
import subprocess
import sys

import pytest

TRAINS_WITHOUT_THEM = """
from keras_pipe_train.settings.unneeded_imports import UNNEEDED, skip_unneeded_imports
skip_unneeded_imports()
import keras, numpy as np, sys, tensorflow as tf
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
model.compile("sgd", "sparse_categorical_crossentropy")
data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"), np.zeros(8, "int32"))).batch(4)
model.fit(data, epochs=1, verbose=0)
model.save(sys.argv[1])
print([name for name in UNNEEDED if sys.modules.get(name) is not None])
"""


@pytest.mark.slow
def test_keras_trains_and_saves_without_scikit_learn_and_pandas_though_both_are_installed(tmp_path):
    assert importlib.util.find_spec("sklearn") and importlib.util.find_spec("pandas")  # (else this proves nothing)
    out = subprocess.run([sys.executable, "-c", TRAINS_WITHOUT_THEM, str(tmp_path / "m.keras")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "[]"
    assert (tmp_path / "m.keras").is_file()


def test_a_module_already_imported_is_left_as_it_is(monkeypatch):
    import json

    from keras_pipe_train.settings.unneeded_imports import skip_unneeded_imports

    monkeypatch.setitem(sys.modules, "sklearn", json)  # (stands for an imported scikit-learn)
    monkeypatch.setitem(sys.modules, "pandas", None)  # (so that the undo puts back what was there,
    monkeypatch.delitem(sys.modules, "pandas")  # a pandas imported, or none)
    skip_unneeded_imports()
    assert sys.modules["sklearn"] is json and sys.modules["pandas"] is None
