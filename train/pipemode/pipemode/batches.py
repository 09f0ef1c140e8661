"""How a decoder hands its records on: in lists, each closed at 4096 records or 1 MiB, so that a
stream of tiny records costs one Python hand-over per list, and a list of large ones holds little."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

MAX_RECORDS = 4096
MAX_BYTES = 1 << 20


def in_batches(records: Iterable[bytes]) -> Iterator[list[bytes]]:
    batch, size = [], 0
    for record in records:
        batch.append(record)
        size += len(record)
        if len(batch) >= MAX_RECORDS or size >= MAX_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
