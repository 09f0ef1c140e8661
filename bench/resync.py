"""How fast the TFRecord decoder gets past damaged data, with its compiled part and without it.

    python -m bench.resync            # a few seconds
    python -m bench.resync --quick    # tiny sizes: a correctness check, not a benchmark

Two things are timed, best of 3:
  find_header over bytes that hold no header at all (the search runs to the end): random bytes
    under the default max_record_bytes and under 2**60, an array of small int64s, a run of zeros;
  decoding a stream of damaged headers a few bytes apart, each followed by a valid empty record
    (b"\\x01" * 12 + an empty record, repeated), every damaged one skipped: the stream on which a
    search that rescans the rest of the chunk at each damaged header takes time in the square of
    its length (docs/speed.md, Getting past damaged data).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import time

import numpy as np

from pipemode import tfrecord
from pipemode.corruption import CorruptionPolicy


def best_of(runs: int, work) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def windows(size: int) -> dict[str, tuple[bytes, int]]:
    rng = np.random.default_rng(0)
    return {
        "random bytes": (os.urandom(size), tfrecord.MAX_RECORD_BYTES),
        "random bytes, max 2**60": (os.urandom(size), 2**60),
        "small int64s": (rng.integers(0, 1000, size // 8, dtype=np.int64).tobytes(), tfrecord.MAX_RECORD_BYTES),
        "zeros": (bytes(size), tfrecord.MAX_RECORD_BYTES),
    }


def damaged_stream(repeats: int) -> bytes:
    return (b"\x01" * 12 + tfrecord.encode_record(b"")) * repeats


def decode_all(data: bytes) -> int:
    decoder = tfrecord.TFRecordDecoder(CorruptionPolicy(10**9))
    return sum(len(batch) for batch in decoder.decode(io.BytesIO(data).read, "bench"))


def with_path(compiled: bool):
    os.environ[tfrecord.PURE_PYTHON_ENV] = "0" if compiled else "1"
    return "compiled" if compiled else "pure Python"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that it runs, times mean nothing")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # (a skip per damaged header: the log would be timed too)
    size, repeats, runs = (1 << 16, 500, 1) if args.quick else (32 << 20, 16_000, 3)
    paths = [True, False] if tfrecord._framing is not None else [False]
    print(f"find_header over {size >> 20 or size} {'MiB' if size >> 20 else 'bytes'} holding no header "
          "(MB/s, best of %d):" % runs)
    for name, (window, limit) in windows(size).items():
        speeds = []
        for compiled in paths:
            path = with_path(compiled)
            assert tfrecord.find_header(window, limit) == -1
            seconds = best_of(runs, lambda w=window, m=limit: tfrecord.find_header(w, m))
            speeds.append(f"{path} {len(window) / 1e6 / seconds:7.0f}")
        print(f"  {name:26} " + "   ".join(speeds))
    data = damaged_stream(repeats)
    print(f"decoding {repeats} damaged headers, each followed by an empty record ({len(data) / 1e3:.0f} KB):")
    for compiled in paths:
        path = with_path(compiled)
        assert decode_all(data) == repeats
        seconds = best_of(runs, lambda: decode_all(data))
        print(f"  {path:12} {seconds:.3f} s ({len(data) / 1e6 / seconds:.1f} MB/s, {seconds / repeats * 1e6:.1f} us "
              "a damaged header)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
