"""What to do with a corrupt record: raise (the default), or skip it when the user opted in."""

import logging

from pipemode.errors import CorruptRecordError

log = logging.getLogger(__name__)


class CorruptionPolicy:
    """Raises corruption errors, or skips up to `max_skips` of them, counting and logging each.

    One policy serves one pass, shared by every framing layer of it (RecordIO and the TFRecords
    inside), so the limit is per pass: a corrupt S3 object is met again on every pass, and a
    job that tolerates it once should tolerate it every epoch.
    """

    def __init__(self, max_skips: int = 0):
        if max_skips < 0:
            raise ValueError(f"max_corrupted_records_to_skip must be >= 0, got {max_skips}")
        self.max_skips = max_skips
        self.skipped = 0

    def skip_or_raise(self, error: CorruptRecordError) -> None:
        if self.skipped >= self.max_skips:
            if self.max_skips:
                error.args = (
                    f"{error} (already skipped {self.skipped} corrupt records in this pass, "
                    f"the maximum set by max_corrupted_records_to_skip)",
                )
            raise error
        self.skipped += 1
        log.warning(
            "SKIPPED %s [%d of at most %d corrupt records per pass]",
            error,
            self.skipped,
            self.max_skips,
        )
