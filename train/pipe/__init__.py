"""A SageMaker Pipe-mode reader for current TensorFlow.

    from train.pipe import PipeModeDataset
    ds = PipeModeDataset("train", record_format="TFRecord")

Pure-Python parts (framing, FIFOs, passes) import without TensorFlow; PipeModeDataset loads it.
"""

from train.pipe.errors import (
    CorruptRecordError,
    Interrupted,
    PipeConfigError,
    PipeTimeoutError,
    TruncatedRecordError,
    UnusableRecordError,
)
from train.pipe.reader import PipeReader


def __getattr__(name):
    # Lazy, so that the launcher and the feeder can use the framing code without TensorFlow.
    if name in ("PipeModeDataset", "pipe_dataset", "generator_dataset"):
        from train.pipe import dataset

        return getattr(dataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CorruptRecordError",
    "Interrupted",
    "PipeConfigError",
    "PipeModeDataset",
    "PipeReader",
    "PipeTimeoutError",
    "TruncatedRecordError",
    "UnusableRecordError",
    "generator_dataset",
    "pipe_dataset",
]
