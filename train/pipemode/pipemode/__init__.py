"""pipemode: SageMaker Pipe-mode input for current TensorFlow.

    from pipemode import PipeModeDataset
    ds = PipeModeDataset("train", record_format="TFRecord")

Pure-Python parts (framing, FIFOs, passes, errors) import without TensorFlow; PipeModeDataset
loads it on first use.
"""

from pipemode.errors import (
    CorruptRecordError,
    Interrupted,
    PipeConfigError,
    PipeDataError,
    PipeModeDatasetException,
    PipeModeError,
    PipeTimeoutError,
    TruncatedRecordError,
    UnreadableError,
    UnusableRecordError,
    reader_error,
)
from pipemode.reader import PipeReader

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy, so that tools that only frame or feed records (no TensorFlow) can use this package.
    if name in ("PipeModeDataset", "pipe_dataset", "generator_dataset"):
        from pipemode import dataset

        return getattr(dataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CorruptRecordError",
    "Interrupted",
    "PipeConfigError",
    "PipeDataError",
    "PipeModeDataset",
    "PipeModeDatasetException",
    "PipeModeError",
    "PipeReader",
    "PipeTimeoutError",
    "TruncatedRecordError",
    "UnreadableError",
    "UnusableRecordError",
    "generator_dataset",
    "pipe_dataset",
    "reader_error",
]
