"""Keras' imports of scikit-learn and pandas, skipped in the job's and the server's processes.

`import keras` imports scikit-learn (for its scikit-learn wrappers) and pandas (to slice
DataFrames given to fit()) whenever they are installed: about a second of every process's start
(`import keras, tensorflow` here: 3.4 s with them, 2.45 s without) in a virtualenv that has them,
as the launcher's does (SageMaker SDK v3 brings both, through mlflow). The job and the
server use neither: they train on tf.data pipelines and answer from a SavedModel. The image has
neither installed, so there this changes nothing; on a laptop or in CI, where `keras-pipe local`
runs the job in the launcher's virtualenv, each job and server starts that much sooner. Keras
imports them inside `try: ... except ImportError`, which a None in sys.modules answers."""

from __future__ import annotations

import sys

UNNEEDED = ("sklearn", "pandas")


def skip_unneeded_imports() -> None:
    """Called before Keras is first imported; a module already imported stays as it is."""
    for name in UNNEEDED:
        sys.modules.setdefault(name, None)
