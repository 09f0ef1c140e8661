"""Errors of the Pipe-mode reader. Each names the channel, the FIFO and, for bad data, the record
number and byte offset, so a user can find the bad S3 object without a debugger."""

from train.errors import DataError, UserError


class Interrupted(Exception):
    """A wait for a FIFO or its data ended because the reader's `interrupt` event was set (a stop
    was requested). Not a failure: the reader ends the pass early, as if it were over."""


class PipeConfigError(UserError):
    """The channel is missing from inputdataconfig.json, not in Pipe mode, or misconfigured."""


class PipeTimeoutError(DataError):
    """A FIFO did not appear, or no writer connected to it, within the allowed time."""


class UnreadableError(DataError):
    """A file of the channel could not be opened or read."""


class CorruptRecordError(DataError):
    """A record failed a CRC or framing check."""

    def __init__(self, where: str, record: int, offset: int, detail: str):
        self.where, self.record, self.offset, self.detail = where, record, offset, detail
        super().__init__(f"corrupt record #{record} at byte offset {offset} of {where}: {detail}")


class TruncatedRecordError(CorruptRecordError):
    """The stream ended in the middle of a record (a dying writer, a truncated S3 object)."""


class UnusableRecordError(CorruptRecordError):
    """A well-framed record that the reader's record_check rejected (say, its image is not one)."""

    def __init__(self, where: str, record: int, offset: int, detail: str):
        super().__init__(where, record, offset, detail)
        self.args = (f"unusable record #{record} at byte offset {offset} of {where}: {detail}",)
