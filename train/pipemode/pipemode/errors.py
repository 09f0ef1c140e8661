"""Errors of the Pipe-mode reader. Each names the channel, the FIFO and, for bad data, the record
number and byte offset, so a user can find the bad S3 object without a debugger.

Catch `PipeModeError` for any of them, `PipeConfigError` for a job set up wrongly (the channel is
not in Pipe mode, a bad argument), `PipeDataError` for data that is missing, late or corrupt.
Raised inside a tf.data pipeline they reach the caller as TensorFlow's own error (tf.data turns
every Python exception of a generator into one); `pipemode.reader_error` finds ours in it.
"""

from __future__ import annotations

import re


class PipeModeError(Exception):
    """Any error of the reader."""


class PipeConfigError(PipeModeError, ValueError):
    """The channel is missing from inputdataconfig.json, not in Pipe mode, or misconfigured; or
    the reader was given a bad argument."""


class PipeDataError(PipeModeError):
    """The channel's data is missing, late, unreadable or corrupt."""


class PipeTimeoutError(PipeDataError):
    """A FIFO did not appear, or no writer connected to it, within the allowed time."""


class UnreadableError(PipeDataError):
    """A file of the channel could not be opened or read."""


class CorruptRecordError(PipeDataError):
    """A record failed a CRC or framing check."""

    def __init__(self, where: str, record: int, offset: int, detail: str):
        self.where, self.record, self.offset, self.detail = where, record, offset, detail
        super().__init__(f"corrupt record #{record} at byte offset {offset} of {where}: {detail}")

    def __reduce__(self):  # picklable with its fields (multiprocessing, tf.data service)
        return type(self), (self.where, self.record, self.offset, self.detail)


class TruncatedRecordError(CorruptRecordError):
    """The stream ended in the middle of a record (a dying writer, a truncated S3 object)."""


class UnusableRecordError(CorruptRecordError):
    """A well-framed record that the reader's record_check rejected (say, its image is not one)."""

    def __init__(self, where: str, record: int, offset: int, detail: str):
        super().__init__(where, record, offset, detail)
        self.args = (f"unusable record #{record} at byte offset {offset} of {where}: {detail}",)


class Interrupted(Exception):
    """A wait for a FIFO or its data ended because the reader's `interrupt` event was set (a stop
    was requested). Not a failure: the reader ends the pass early, as if it were over."""


def _public_errors() -> dict[str, type[PipeModeError]]:
    found, todo = {}, [PipeModeError]
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo += cls.__subclasses__()
    return found


# tf.data reports a generator's exception as "<ClassName>: <message>" somewhere in its own
# error's text (after "Graph execution error:" and the like; TF may escape quotes).
_IN_TF_MESSAGE = re.compile(rf"\b({'|'.join(sorted(_public_errors()))}): ([^\n]*)")
_TF_SUFFIX = re.compile(r"\s*(\[\[.*|\[Op:[^\]]*\])\s*$")


def reader_error(error: BaseException) -> PipeModeError | None:
    """The reader's error behind `error`: itself when it is one, the one named in the message of a
    TensorFlow error that a pipeline raised for it, else None.

        try:
            model.fit(PipeModeDataset("train", "TFRecord").map(parse), epochs=3)
        except tf.errors.OpError as err:
            if isinstance(pipemode.reader_error(err), pipemode.PipeDataError):
                ...  # corrupt or missing data, named in the message

    From a TensorFlow error the type and the message are recovered, not the original object's
    other attributes.
    """
    if isinstance(error, PipeModeError):
        return error
    found = _IN_TF_MESSAGE.search(getattr(error, "message", None) or str(error))
    if not found:
        return None
    cls = _public_errors()[found.group(1)]
    message = _TF_SUFFIX.sub("", found.group(2)).replace("\\'", "'")
    recovered = cls.__new__(cls)
    Exception.__init__(recovered, message)
    return recovered


# AWS's PipeModeDataset raises PipeModeDatasetException for a channel that is missing or not in
# Pipe mode: code written for it catches the same case under the same name.
PipeModeDatasetException = PipeConfigError
