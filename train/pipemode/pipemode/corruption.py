"""What to do with a corrupt record: raise (the default), or skip it when the user opted in."""

import logging

from pipemode import options
from pipemode.errors import CorruptRecordError

log = logging.getLogger(__name__)


# Skips logged one by one in a pass; after that, a line at each power of ten (100, 1000, ...): a
# damaged object of a gigabyte can hold a corrupt "record" every few bytes, and a line for each
# would bury the log (and cost more time than the reading).
LOGGED_ONE_BY_ONE = 20


class CorruptionPolicy:
    """Raises corruption errors, or skips up to `max_skips` of them, counting and logging them.

    One policy serves one pass, shared by every framing layer of it (RecordIO and the TFRecords
    inside), so the limit is per pass: a corrupt S3 object is met again on every pass, and a
    job that tolerates it once should tolerate it every epoch.
    """

    def __init__(self, max_skips: int = 0):
        self.max_skips = options.max_corrupted_records_to_skip(max_skips)
        self.skipped = 0

    @property
    def logs_each(self) -> bool:
        """Whether skips are still logged one by one (the framing layers log their details then)."""
        return self.skipped <= LOGGED_ONE_BY_ONE

    def skip_or_raise(self, error: CorruptRecordError) -> None:
        if self.skipped >= self.max_skips:
            if self.max_skips:
                error.args = (
                    f"{error} (already skipped {self.skipped} corrupt records in this pass, "
                    f"the maximum set by max_corrupted_records_to_skip)",
                )
            raise error
        self.skipped += 1
        if self.skipped <= LOGGED_ONE_BY_ONE:
            log.warning("SKIPPED %s [%d of at most %d corrupt records per pass]", error, self.skipped, self.max_skips)
            if self.skipped == LOGGED_ONE_BY_ONE:
                log.warning("further skipped records of this pass are counted, and logged at every power of ten")
        elif _power_of_ten(self.skipped):
            log.warning("SKIPPED %d corrupt records in this pass so far (at most %d); the latest: %s",
                        self.skipped, self.max_skips, error)


def _power_of_ten(number: int) -> bool:
    while number % 10 == 0:
        number //= 10
    return number == 1
