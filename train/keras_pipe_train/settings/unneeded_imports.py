"""Keras' imports of scikit-learn and pandas, skipped in the job's and the server's processes.

`import keras` imports scikit-learn (for its scikit-learn wrappers) and pandas (to slice
DataFrames given to fit()) whenever they are installed: a noticeable part of every process's start
(docs/speed.md, Figures behind the code's choices: Skipped imports) in a virtualenv that has them,
as the launcher's does (SageMaker SDK v3 brings both, through mlflow). The job and the
server use neither: they train on tf.data pipelines and answer from a SavedModel. The image has
neither installed, so there this changes nothing; on a laptop or in CI, where `keras-pipe local`
runs the job in the launcher's virtualenv, each job and server starts sooner. Keras
imports them inside `try: ... except ImportError`, which a None in sys.modules answers."""

from __future__ import annotations

import sys

UNNEEDED = ("sklearn", "pandas")


def skip_unneeded_imports() -> None:
    """Called before Keras is first imported; a module already imported stays as it is."""
    for name in UNNEEDED:
        sys.modules.setdefault(name, None)
