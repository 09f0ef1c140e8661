"""The job, the server and the launcher's commands start without Keras' optional imports of
scikit-learn, pandas and matplotlib (keras_pipe_train/settings/unneeded_imports.py), which make test's
.venv has installed (SageMaker SDK v3 and mlflow bring them): Keras still builds, trains and saves a
model there."""

import importlib.util
import subprocess
import sys

import pytest

TRAINS_WITHOUT_THEM = """
import sys
from keras_pipe_train.settings.unneeded_imports import UNNEEDED, WHILE_KERAS_IMPORTS, skip_unneeded_imports, \\
    skip_while_keras_imports
if sys.argv[2] == "launcher":  # (as the launcher's commands do: all three while Keras imports)
    skip_while_keras_imports()
else:  # (as the job and the server do: scikit-learn and pandas for good, matplotlib while Keras imports)
    skip_unneeded_imports()
import tensorflow as tf  # (TensorFlow first: its import looks Keras up, then imports it)
import keras, numpy as np
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
model.compile("sgd", "sparse_categorical_crossentropy")
data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"), np.zeros(8, "int32"))).batch(4)
model.fit(data, epochs=1, verbose=0)
model.save(sys.argv[1])
print([name for name in UNNEEDED + WHILE_KERAS_IMPORTS if sys.modules.get(name) is not None])
import matplotlib.pyplot  # (after Keras' import, as usual: the report's pictures)
try:
    import pandas  # (the launcher's commands: the SageMaker SDK's, as usual)
    print(matplotlib.pyplot.__name__, pandas.__name__)
except ImportError:
    print(matplotlib.pyplot.__name__, "no pandas")
"""


@pytest.mark.slow
@pytest.mark.parametrize("entry, after", [("launcher", "matplotlib.pyplot pandas"), ("job", "matplotlib.pyplot no pandas")])
def test_keras_imports_trains_and_saves_without_them_though_installed_and_they_import_after(tmp_path, entry, after):
    """The launcher's commands skip them while Keras imports, the job and the server scikit-learn and
    pandas for good and matplotlib while Keras imports; Keras then builds, trains and saves a model,
    and what is skipped only while Keras imports imports as usual once Keras is in."""
    from keras_pipe_train.settings.unneeded_imports import UNNEEDED, WHILE_KERAS_IMPORTS

    assert all(importlib.util.find_spec(name) for name in UNNEEDED + WHILE_KERAS_IMPORTS)  # (else this proves nothing)
    out = subprocess.run([sys.executable, "-c", TRAINS_WITHOUT_THEM, str(tmp_path / "m.keras"), entry],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-2:] == ["[]", after], out.stdout
    assert (tmp_path / "m.keras").is_file()


def test_a_module_already_imported_is_left_as_it_is(monkeypatch):
    import json

    from keras_pipe_train.settings.unneeded_imports import skip_unneeded_imports

    monkeypatch.setitem(sys.modules, "sklearn", json)  # (stands for an imported scikit-learn)
    monkeypatch.setitem(sys.modules, "pandas", None)  # (so that the undo puts back what was there,
    monkeypatch.delitem(sys.modules, "pandas")  # a pandas imported, or none)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # (the finder it may add for Keras' import)
    skip_unneeded_imports()
    assert sys.modules["sklearn"] is json and sys.modules["pandas"] is None
