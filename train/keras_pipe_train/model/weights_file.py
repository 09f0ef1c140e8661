"""A backbone's weights from a file: a previous job's backbone.weights.h5, or Keras' legacy .h5."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import keras

from keras_pipe_train.settings.errors import UserError

log = logging.getLogger(__name__)


def load_backbone_weights(backbone: keras.Model, path: Path, name: str) -> None:
    """Loads a .weights.h5 file, or a legacy .h5 one (such as Keras' downloaded ImageNet files)."""
    if not path.is_file():
        raise UserError(f"backbone weights file {path} does not exist")
    problem = None
    # Keras can load part of a mismatched file, only warning that the rest "will retain their
    # freshly-initialized weights": that would train on random features unnoticed, so any
    # warning while loading counts as a mismatch.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            backbone.load_weights(str(path))
        except Exception as err:  # Keras raises ValueError, KeyError or h5py errors on a mismatch
            problem = f"{type(err).__name__}: {err}"
    # (not a ResourceWarning: the garbage collector raises those from any object it happens to
    # finalise meanwhile, unrelated to the file)
    problem = problem or next((str(w.message) for w in caught if not issubclass(w.category, ResourceWarning)), None)
    if problem:
        raise UserError(
            f"weights file {path} does not fit backbone {name} ({problem[:300]}); it must hold "
            f"the weights of a {name} backbone without its classifier (include_top=False), "
            "such as a previous job's model/backbone.weights.h5"
        )
    log.info("loaded backbone weights from %s", path)
