"""Pipe reader throughput and memory, as ratios measured side by side in one run.

    python -m bench.pipe_reader               # full run (a few minutes, ~6 GB of temp disk)
    python -m bench.pipe_reader --quick       # tiny sizes: a correctness check, not a benchmark

For 100 KB, 1 KB and 100 B records, the same TFRecord bytes are read by:
  dd            `dd if=FIFO of=/dev/null bs=1M`, the raw FIFO (what no reader can beat)
  python-raw    Python reading the FIFO in 4 MiB chunks, 1 MiB pipe buffer (a Python reader's ceiling)
  file          tf.data.TFRecordDataset on the file from disk (page cache), batch(1024)
  pipe-batched  PipeModeDataset(batch_size=1024), CRC checks on
  pipe-records  PipeModeDataset() (one record per element), batch(1024), CRC checks on
Every FIFO is fed by `cat FILE > FIFO`; every consumer sums the record lengths of each batch and
the sums are checked against each other. Then peak RSS growth while streaming >= 4 GB, and how
fast the reader skips garbage after a damaged header (max_corrupted_records_to_skip > 0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from pipemode import tfrecord

SIZES = {"100KB": 100 * 1024, "1KB": 1024, "100B": 100}
BATCH = 1024


def make_file(path: str, record_bytes: int, total_bytes: int, seed: int = 0) -> int:
    """A TFRecord file of ~total_bytes made of records of exactly record_bytes; returns the count."""
    rng = np.random.default_rng(seed)
    distinct = [rng.bytes(record_bytes) for _ in range(64)]
    block = tfrecord.encode(distinct)
    repeats = max(1, total_bytes // len(block))
    with open(path, "wb") as f:
        for _ in range(repeats):
            f.write(block)
    return repeats * len(distinct)


class Job:
    """A throwaway /opt/ml-like directory with one Pipe channel; one per reader run, since each
    new reader of a channel starts at pass 0."""

    _made = 0

    def __init__(self, workdir: str):
        Job._made += 1
        root = os.path.join(workdir, f"job{Job._made}")
        self.config = os.path.join(root, "config")
        self.data = os.path.join(root, "data")
        os.makedirs(self.config)
        os.makedirs(self.data)
        with open(os.path.join(self.config, "inputdataconfig.json"), "w") as f:
            json.dump({"bench": {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}}, f)
        self.passes = 0

    def feed(self, *files: str) -> tuple[str, subprocess.Popen]:
        """Creates the next FIFO and starts `cat FILES > FIFO` (it blocks until read)."""
        path = os.path.join(self.data, f"bench_{self.passes}")
        self.passes += 1
        os.mkfifo(path)
        cat = subprocess.Popen(["sh", "-c", 'f="$1"; shift; exec cat "$@" > "$f"', "sh", path, *files])
        return path, cat


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def sum_lengths(dataset) -> int:
    import tensorflow as tf

    total = 0
    for n in dataset.map(lambda b: tf.reduce_sum(tf.cast(tf.strings.length(b), tf.int64))):
        total += int(n)
    return total


def run_dd(workdir: str, path_file: str) -> float:
    fifo, cat = Job(workdir).feed(path_file)
    _, seconds = timed(lambda: subprocess.run(
        ["dd", f"if={fifo}", "of=/dev/null", "bs=1M", "status=none"], check=True))
    cat.wait()
    return seconds


def run_python_raw(workdir: str, path_file: str) -> float:
    from pipemode.fifo import open_fifo

    fifo, cat = Job(workdir).feed(path_file)

    def drain():
        with open_fifo(fifo, 60, "bench") as f:
            while f.read(4 << 20):
                pass

    _, seconds = timed(drain)
    cat.wait()
    return seconds


def run_file(path_file: str) -> tuple[int, float]:
    import tensorflow as tf

    return timed(lambda: sum_lengths(tf.data.TFRecordDataset(path_file).batch(BATCH)))


def run_pipe(workdir: str, path_file: str, batched: bool) -> tuple[int, float]:
    from pipemode import PipeModeDataset

    job = Job(workdir)
    _, cat = job.feed(path_file)
    ds = PipeModeDataset("bench", "TFRecord", pipe_dir=job.data, config_dir=job.config,
                         batch_size=BATCH if batched else None, wait_timeout=60)
    if not batched:
        ds = ds.batch(BATCH)
    result = timed(lambda: sum_lengths(ds))
    cat.wait()
    return result


def throughput(quick: bool, workdir: str, repeats: int) -> list[dict]:
    totals = {"100KB": 1 << 30, "1KB": 512 << 20, "100B": 224 << 20}
    if quick:
        totals = dict.fromkeys(totals, 2 << 20)
    rows = []
    for name, size in SIZES.items():
        path = os.path.join(workdir, f"{name}.tfrecord")
        count = make_file(path, size, totals[name])
        nbytes = os.path.getsize(path)
        subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)  # page cache, for all
        row = {"records": name, "count": count, "MB": nbytes / 1e6}
        # This machine is noisy (2 cores, neighbours): every reader runs `repeats` times,
        # interleaved so all see the same conditions, and its fastest run counts.
        for _ in range(repeats):
            times = {"dd": run_dd(workdir, path), "python-raw": run_python_raw(workdir, path)}
            expect, times["file"] = run_file(path)
            got_b, times["pipe-batched"] = run_pipe(workdir, path, batched=True)
            got_r, times["pipe-records"] = run_pipe(workdir, path, batched=False)
            if not expect == got_b == got_r == count * size:
                raise SystemExit(f"{name}: byte sums differ: file {expect}, batched {got_b}, "
                                 f"records {got_r}, expected {count * size}")
            for k, v in times.items():
                row[k] = min(row.get(k, v), v)
        rows.append(row)
        os.unlink(path)
    return rows


RSS_CHILD = r"""
import json, os, sys, resource
from bench.pipe_reader import Job, sum_lengths
from pipemode import PipeModeDataset
workdir, path, copies, batched = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
def rss_mb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
def stream(files):
    job = Job(workdir)
    _, cat = job.feed(*files)
    ds = PipeModeDataset("bench", "TFRecord", pipe_dir=job.data, config_dir=job.config,
                         batch_size=1024 if batched else None, wait_timeout=60)
    n = sum_lengths(ds if batched else ds.batch(1024))
    cat.wait()
    return n
stream([path])  # warm up: TF's graph building, allocator pools
before = rss_mb("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM, the peak RSS
total = stream([path] * copies)
print(json.dumps({"bytes": total, "rss_before_mb": before, "peak_mb": rss_mb("VmHWM:")}))
"""


def peak_rss(quick: bool, workdir: str) -> list[dict]:
    rows = []
    for name, size, batched in (("1KB", 1024, True), ("100KB", 100 * 1024, False)):
        path = os.path.join(workdir, f"rss-{name}.tfrecord")
        make_file(path, size, (4 << 20) if quick else (512 << 20))
        copies = 2 if quick else 8  # 8 x 512 MiB = 4 GiB through one FIFO pass
        out = subprocess.run(
            [sys.executable, "-c", RSS_CHILD, os.path.join(workdir, f"rss-{name}"), path,
             str(copies), "1" if batched else "0"],
            check=True, capture_output=True, text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        result.update(records=name, path="pipe-batched" if batched else "pipe-records",
                      GB=copies * os.path.getsize(path) / 1e9)
        rows.append(result)
        os.unlink(path)
    return rows


def resync_speed(quick: bool) -> dict[str, float]:
    """MB/s at which the decoder skips garbage after a damaged header, for random bytes and for a
    run of zeros (a preallocated, never-written file), read from memory."""
    from pipemode.corruption import CorruptionPolicy

    records = [bytes(1000)] * 100
    size = (1 << 20) if quick else (64 << 20)
    speeds = {}
    for name, garbage in (("random", np.random.default_rng(0).bytes(size)), ("zeros", bytes(size))):
        data = memoryview(tfrecord.encode(records) + garbage + tfrecord.encode(records))
        position = 0

        def read(n: int, data=data) -> bytes:
            nonlocal position
            position += n
            return bytes(data[position - n : position])

        decoder = tfrecord.TFRecordDecoder(CorruptionPolicy(1))
        got, seconds = timed(lambda decoder=decoder, read=read: sum(len(b) for b in decoder.decode(read, "bench")))
        assert got == 2 * len(records), got
        speeds[name] = size / 1e6 / seconds
    return speeds


def report(rows: list[dict], rss: list[dict], resync: dict[str, float]) -> None:
    print("\nThroughput (best of the repeats, all in this run; ratios are pipe-batched / baseline)")
    head = f"{'records':>8} {'count':>9} {'MB':>7} | " + " ".join(
        f"{k:>19}" for k in ("dd", "python-raw", "file", "pipe-batched", "pipe-records"))
    print(head)
    for r in rows:
        cells = []
        for k in ("dd", "python-raw", "file", "pipe-batched", "pipe-records"):
            cells.append(f"{r['MB'] / r[k]:6.0f}MB/s {r['count'] / r[k] / 1e3:6.0f}k/s")
        print(f"{r['records']:>8} {r['count']:>9} {r['MB']:>7.0f} | " + " ".join(cells))
    print()
    for r in rows:
        b = r["pipe-batched"]
        print(f"{r['records']:>6}: pipe-batched = {r['file'] / b:.2f}x file, {r['dd'] / b:.2f}x dd, "
              f"{r['python-raw'] / b:.2f}x python-raw;  pipe-records = {r['file'] / r['pipe-records']:.2f}x file")
    print("\nPeak RSS while streaming")
    for r in rss:
        print(f"{r['path']:>13} {r['records']:>6} records, {r['GB']:.1f} GB in one pass: "
              f"RSS before {r['rss_before_mb']:.0f} MB, peak {r['peak_mb']:.0f} MB, "
              f"growth {r['peak_mb'] - r['rss_before_mb']:.0f} MB")
    print("\nResynchronisation after a damaged header (skipping on): "
          + ", ".join(f"{name} garbage {mb_s:.0f} MB/s" for name, mb_s in resync.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks correctness only")
    parser.add_argument("--workdir", default=None, help="temp space (default: system temp)")
    parser.add_argument("--skip-rss", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="runs per reader; the best counts")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        rows = throughput(args.quick, workdir, 1 if args.quick else args.repeats)
        rss = [] if args.skip_rss else peak_rss(args.quick, workdir)
    report(rows, rss, resync_speed(args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
