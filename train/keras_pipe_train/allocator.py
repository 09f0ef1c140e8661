"""glibc malloc settings for a process that moves megabyte-sized records through tf.data.

TensorFlow's GeneratorDataset (tf.data.Dataset.from_generator, which the Pipe reader feeds) calls
mallopt(M_TRIM_THRESHOLD, 128 KB) the first time it runs, to curb RSS growth. Setting any
threshold also freezes glibc's adaptive mmap threshold at its 128 KB start: from then on every
allocation above 128 KB, that is every copy of a photo-sized record (from Python into a tensor,
into the shuffle buffer, into a batch, out of the Example), is a fresh mmap that the kernel zeroes
and page-faults in, then unmaps. Measured here on 1 MB records: 2.8 ms of CPU per record through
the reader's dataset, 1.8 ms through TFRecordDataset; with the settings below 1.3 and 0.9 ms, for
~170 MB more peak RSS over a 256 MB pass. The job runs on machines with GBs per core, where CPU
time is what decodes images; a library cannot make that choice for its users, so only the job's
own process calls this (and bench/, to measure the job's pipeline as it runs).
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_TOP_PAD, M_MMAP_THRESHOLD = -2, -3  # glibc's malloc.h
KEEP_BYTES = 16 << 20  # records up to 16 MB come from the heap, and each heap keeps 16 MB spare


def keep_record_memory() -> bool:
    """Allocations up to KEEP_BYTES from the heap, KEEP_BYTES kept at each heap's top when memory is
    returned (TensorFlow's later 128 KB trim threshold does not undo either). Whether applied: not
    on a C library without mallopt (macOS, musl)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    applied = mallopt(M_MMAP_THRESHOLD, KEEP_BYTES) == 1 and mallopt(M_TOP_PAD, KEEP_BYTES) == 1
    log.debug("malloc: %s", "records up to 16 MB from the heap" if applied else "mallopt refused")
    return applied
