"""Keras' optional imports of scikit-learn, pandas and matplotlib, skipped where they are not used.

`import keras` imports scikit-learn (for its scikit-learn wrappers), pandas (to slice DataFrames
given to fit()) and matplotlib's pyplot (for its plotting helpers) whenever they are installed, as
the launcher's virtualenv has them (SageMaker SDK v3 and mlflow bring the first two, the job's
report draws with the third): together about a quarter of every process's start (docs/speed.md,
Figures behind the code's choices: Skipped imports). Keras imports each inside `try: ... except
ImportError`, which a None in sys.modules answers, and then works without it.

- The job's and the server's processes use none of scikit-learn and pandas: they train on tf.data
  pipelines and answer from a SavedModel. There both stay skipped for the process's life
  (skip_unneeded_imports).
- matplotlib is skipped only while Keras imports (skip_while_keras_imports): the job's report
  imports pyplot itself when it draws (report/pages.py), and a job without validation, a server and
  the launcher's commands that load a model (predict, export, report) never draw. The launcher's
  commands skip all three that way, since some of them import the SageMaker SDK, which uses pandas.

The image has neither scikit-learn nor pandas installed, so there only matplotlib's skip counts.
"""

from __future__ import annotations

import contextlib
import sys

from keras_pipe_train.settings.first_import import around_first_import

UNNEEDED = ("sklearn", "pandas")
# what Keras' import alone skips (the report's pyplot comes later, when it draws)
WHILE_KERAS_IMPORTS = ("matplotlib",)


def skip_unneeded_imports() -> None:
    """UNNEEDED for this process's life, and matplotlib while Keras imports. Called before Keras is
    first imported; a module already imported stays as it is."""
    for name in UNNEEDED:
        sys.modules.setdefault(name, None)
    skip_while_keras_imports(WHILE_KERAS_IMPORTS)


@contextlib.contextmanager
def skipped(names: tuple[str, ...]):
    """Within: importing any of `names` not yet imported raises ImportError, in any thread (Keras'
    import runs before the job's, the server's or a command's threads use any of them); after, each
    imports as usual (the None put in its place is taken out again, unless something replaced it)."""
    added = [name for name in names if name not in sys.modules]
    for name in added:
        sys.modules[name] = None
    try:
        yield
    finally:
        for name in added:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def skip_while_keras_imports(names: tuple[str, ...] = UNNEEDED + WHILE_KERAS_IMPORTS) -> None:
    """From now on, Keras' first import (whether asked for itself or by TensorFlow's, which imports
    Keras' optimizers) runs with `names` skipped: the package's __init__ imports all of keras.src,
    its optional imports included (by default all three: the launcher's commands). Nothing changes once
    Keras is imported."""
    around_first_import("keras", lambda: skipped(names), key="keras-pipe: Keras' optional imports skipped")
