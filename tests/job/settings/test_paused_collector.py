"""TensorFlow's and Keras' first imports run with Python's cyclic collector paused, and what they
made frozen after (keras_pipe_train/settings/paused_collector.py), as every program of the project
starts them: no collection runs during them, the collector runs again after, and a model still
trains and saves."""

import gc
import subprocess
import sys

import pytest

from keras_pipe_train.settings.paused_collector import collector_paused
from tests.timeouts import wait_s

IMPORTS = """
import gc, sys
def importing(name):  # (importlib marks a module's spec while its code runs)
    return getattr(getattr(sys.modules.get(name), "__spec__", None), "_initializing", False)
during, after = [], []  # the collections that started while TensorFlow or Keras imported, and after
gc.callbacks.append(lambda phase, info: phase == "start" and "tensorflow" in sys.modules
                    and (during if importing("tensorflow") or importing("keras") else after).append(info))
from keras_pipe_train.settings.paused_collector import pause_collector_while_tensorflow_imports
from keras_pipe_train.settings.unneeded_imports import skip_unneeded_imports, skip_while_keras_imports
if sys.argv[1] == "launcher":  # (keras-pipe's order: TensorFlow's notices dropped, Keras' imports skipped, paused)
    from keras_pipe_launch.common.quiet_start import quiet_tensorflow_start
    quiet_tensorflow_start()
    skip_while_keras_imports()
    pause_collector_while_tensorflow_imports()
elif sys.argv[1] == "job":  # (the job's and the server's)
    skip_unneeded_imports()
    pause_collector_while_tensorflow_imports()
else:  # (not paused: what the import does without it)
    skip_unneeded_imports()
import tensorflow as tf
import keras, numpy as np
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
model.compile("sgd", "sparse_categorical_crossentropy")
model.fit(np.ones((8, 4), "float32"), np.zeros(8, "int32"), epochs=1, verbose=0)
model.save(sys.argv[2])
print(len(during), gc.isenabled(), len(after) > 0)
"""


def imported(entry: str, tmp_path) -> list[str]:
    out = subprocess.run([sys.executable, "-c", IMPORTS, entry, str(tmp_path / f"{entry}.keras")],
                         capture_output=True, text=True, timeout=wait_s(120))
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / f"{entry}.keras").is_file()
    return out.stdout.split()


@pytest.mark.slow
def test_no_collection_runs_while_tensorflow_imports_and_the_collector_runs_after(tmp_path):
    """In the job's order and in the launcher's (whose other wrappers of the same imports nest with
    this one), no collection runs during the imports, and collections run again after; without
    the pause, hundreds run during them (what the test would otherwise not see)."""
    for entry in ("job", "launcher"):
        assert imported(entry, tmp_path) == ["0", "True", "True"], entry
    during, enabled, after = imported("unpaused", tmp_path)
    assert int(during) > 100 and enabled == "True", during


def test_the_pause_nests_freezes_what_was_made_and_leaves_a_collector_paused_before_it_paused():
    assert gc.isenabled()
    try:
        with collector_paused():
            assert not gc.isenabled()
            with collector_paused():
                assert not gc.isenabled()
            assert not gc.isenabled() and gc.get_freeze_count() == 0  # (the outer pause still holds)
            made = [[] for _ in range(100)]
        assert gc.isenabled() and gc.get_freeze_count() > len(made)
        gc.unfreeze()
        gc.disable()
        try:
            with collector_paused():
                pass
            assert not gc.isenabled() and gc.get_freeze_count() == 0  # (as it was)
        finally:
            gc.enable()
        with pytest.raises(ValueError), collector_paused():
            raise ValueError("an import that fails")
        assert gc.isenabled()
    finally:
        gc.unfreeze()  # (this process's objects collected as usual again)
