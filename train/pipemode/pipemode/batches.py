"""How a decoder hands its records on: in lists, each closed at 4096 records or 1 MiB, so that a
stream of tiny records costs one Python hand-over per list, and a list of large ones holds little.

When the records' source raises (a corrupt record the policy does not skip), the records before
it are handed on first, then the error: the same records as without the lists, as the TFRecord
decoder gives them (the reader's README: "the records before it are delivered first")."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

MAX_RECORDS = 4096
MAX_BYTES = 1 << 20


def in_batches(records: Iterable[bytes]) -> Iterator[list[bytes]]:
    batch, size = [], 0
    try:
        for record in records:
            batch.append(record)
            size += len(record)
            if len(batch) >= MAX_RECORDS or size >= MAX_BYTES:
                yield batch
                batch, size = [], 0
    except Exception:
        if batch:  # (an exception thrown in at the yield above leaves batch empty: not handed on twice)
            yield batch
        raise
    if batch:
        yield batch
