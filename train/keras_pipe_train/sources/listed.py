"""One pass of a reader that makes each record from an item of a list it holds (class_folders.py:
the channel's files; lst.py: the .lst file's lines), one by one, with the pipe readers' accounting:
the pass's PassStats in the reader's history, records too damaged to use skipped within the
max_corrupted_records_to_skip budget (pipemode.corruption), the records in lists (pipemode.batches)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from pipemode.batches import in_batches
from pipemode.corruption import CorruptionPolicy
from pipemode.errors import UnusableRecordError
from pipemode.reader import PassStats

# each item's record, or the error that says why it has none
Made = tuple[bytes, None] | tuple[None, UnusableRecordError]


def read_pass(history: list[PassStats], channel: str, description: str, max_skips: int,
              made: Iterable[Made]) -> Iterator[list[bytes]]:
    """The records of `made` in lists; the pass's stats appended to `history` once it starts."""
    stats = PassStats(channel, len(history), description)
    history.append(stats)
    policy = CorruptionPolicy(max_skips)
    started = time.perf_counter()
    try:
        yield from in_batches(_usable(made, policy, stats))
    finally:
        stats.seconds = time.perf_counter() - started
        stats.skipped = policy.skipped


def _usable(made: Iterable[Made], policy: CorruptionPolicy, stats: PassStats) -> Iterator[bytes]:
    for record, error in made:
        if error is not None:
            policy.skip_or_raise(error)
            continue
        stats.bytes += len(record)
        stats.records += 1
        yield record
