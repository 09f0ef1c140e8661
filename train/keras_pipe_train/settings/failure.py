"""Turning any failure into SageMaker's failure report: /opt/ml/output/failure and an exit code.

SageMaker shows the first 1024 characters of the failure file as the job's FailureReason, so the
file starts with one line saying what went wrong and how to fix it; the traceback follows.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
from pathlib import Path

from keras_pipe_train.settings.errors import JobError
from pipemode.errors import PipeConfigError, PipeDataError, PipeModeError, reader_error

log = logging.getLogger(__name__)

EXIT_CODES = {"internal error": 1, "configuration error": 2, "data error": 3, "cluster error": 4, "stopped": 143}

# The reader's errors, by kind (inside tf.data they reach us as TensorFlow errors naming them).
_READER_KINDS = ((PipeConfigError, "configuration error"), (PipeDataError, "data error"))


def classify(err: BaseException) -> tuple[str, str]:
    """(kind, reason) for an exception."""
    if isinstance(err, JobError):
        return err.kind, str(err)
    if isinstance(err, PipeModeError):
        return _reader_kind(err), str(err)
    if isinstance(err, KeyboardInterrupt):
        return "stopped", "the job was interrupted (SIGINT)"
    tf_errors = sys.modules.get("tensorflow.python.framework.errors_impl")
    if tf_errors and isinstance(err, tf_errors.OpError):
        return _classify_tf(err, tf_errors)
    return "internal error", f"{type(err).__name__}: {err} (a bug in the training job, please report it)"


_MISSING_FEATURE = re.compile(r"Feature: (\S+) \(data type: \w+\) is required but could not be found")


def _classify_tf(err, tf_errors) -> tuple[str, str]:
    # The useful line can be anywhere in TF's message ("Graph execution error:" comes first),
    # and tf.debugging assertions put their message in square brackets.
    message = err.message or str(err)
    ours = reader_error(err)
    if ours is not None:
        return _reader_kind(ours), f"{type(ours).__name__}: {ours}"
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    first = lines[0] if lines else str(err)
    missing = _MISSING_FEATURE.search(message)
    if missing:
        return "data error", (
            f"a record lacks a feature the job reads: {missing.group(1)!r} is required but could not "
            "be found; set hyperparameters image_feature and label_feature to the feature names "
            "your TFRecords use"
        )
    if _collective_failure(err, tf_errors, message):
        return "cluster error", (
            f"the hosts lost each other ({type(err).__name__}: {first[:300]}): another host died or "
            "stopped answering; its log says why (multi-host jobs fail as a whole)"
        )
    if isinstance(err, tf_errors.DataLossError):
        return "data error", f"corrupt data: {first}"
    # (tf.io.parse_example's own message: "Could not parse example input, value: ...")
    if isinstance(err, tf_errors.InvalidArgumentError) and "example" in first.lower():
        return "data error", f"a record is not a valid tf.train.Example: {first}"
    return "internal error", f"{type(err).__name__}: {first} (a bug in the training job, please report it)"


def _reader_kind(err: PipeModeError) -> str:
    return next((kind for cls, kind in _READER_KINDS if isinstance(err, cls)), "internal error")


def _collective_failure(err, tf_errors, message: str) -> bool:
    """Collectives between hosts failed: a peer is gone (timeout, unreachable, aborted)."""
    kinds = (tf_errors.DeadlineExceededError, tf_errors.UnavailableError, tf_errors.CancelledError,
             tf_errors.AbortedError)
    markers = ("collective", "Collective", "coordination service", "heartbeat", "/job:worker")
    return isinstance(err, kinds) and any(marker in message for marker in markers)


def report(err: BaseException, failure_file: Path) -> int:
    """Writes the failure file, logs the reason, and returns the exit code."""
    kind, reason = classify(err)
    details = "".join(traceback.format_exception(err))
    text = f"{kind[0].upper()}{kind[1:]}: {reason}\n\n{details}"
    try:
        failure_file.parent.mkdir(parents=True, exist_ok=True)
        failure_file.write_text(text)
    except OSError as write_err:  # still exit non-zero with the reason in the log
        log.error("could not write %s: %s", failure_file, write_err)
    print(text, file=sys.stderr, flush=True)
    return EXIT_CODES[kind]
