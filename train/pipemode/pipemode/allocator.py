"""glibc malloc settings for a process that streams records through tf.data.

TensorFlow's GeneratorDataset (tf.data.Dataset.from_generator, which the reader feeds) calls
mallopt(M_TRIM_THRESHOLD, 128 KB) the first time it runs, to curb RSS growth. For a stream that
allocates and frees ~1 GB/s of record buffers (bytes read from the FIFO, their tensors, batches),
that means glibc hands freed memory back to the kernel as soon as 128 KB of it sits at the top of
a heap, and the next batch page-faults it back in, zeroed: a fault per 4 KB of data, per copy.
A 64 MB threshold spares that CPU for a little more peak RSS (docs/speed.md, Figures behind the
code's choices: Trim threshold). Setting any threshold also freezes glibc's adaptive mmap
threshold at its 128 KB start, so every allocation above that is a fresh mmap: photo-sized
records pay that too (keep_record_memory, the job's choice).

The reader restores a trim threshold of PIPEMODE_TRIM_THRESHOLD_MB (default 64) each time a pass
starts, right after TensorFlow's setting; PIPEMODE_TRIM_THRESHOLD_MB=0 leaves malloc as it is.
Nothing happens on C libraries without mallopt (macOS, musl).
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's malloc.h
TRIM_THRESHOLD_ENV = "PIPEMODE_TRIM_THRESHOLD_MB"
DEFAULT_TRIM_THRESHOLD_MB = 64
RECORD_BYTES = 16 << 20  # keep_record_memory: records up to 16 MB from the heap


def _mallopt(*settings: tuple[int, int]) -> bool:
    """Applies (parameter, value) pairs; whether glibc accepted all of them."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1 for param, value in settings)


def keep_freed_memory() -> bool:
    """Lets up to PIPEMODE_TRIM_THRESHOLD_MB of freed memory stay in the heap for the next batch,
    undoing TensorFlow's 128 KB. Whether applied."""
    raw = os.environ.get(TRIM_THRESHOLD_ENV, str(DEFAULT_TRIM_THRESHOLD_MB))
    try:
        megabytes = int(raw)
    except ValueError:
        log.warning("%s=%r is not a whole number of MB; malloc left as it is", TRIM_THRESHOLD_ENV, raw)
        return False
    return megabytes > 0 and _mallopt((M_TRIM_THRESHOLD, min(megabytes, 2047) << 20))


def keep_record_memory() -> bool:
    """Allocations up to 16 MB from the heap, and 16 MB kept at each heap's top when memory is
    returned (TensorFlow's later trim threshold undoes neither). For a process that moves
    photo-sized records, each otherwise a fresh mmap: less CPU per record, for more peak RSS
    (docs/speed.md, Figures behind the code's choices: Record memory). The job calls this (its
    machines have GBs per core; CPU time is what decodes images); a script may too. Whether
    applied."""
    applied = _mallopt((M_MMAP_THRESHOLD, RECORD_BYTES), (M_TOP_PAD, RECORD_BYTES))
    log.debug("malloc: %s", "records up to 16 MB from the heap" if applied else "mallopt refused")
    return applied
