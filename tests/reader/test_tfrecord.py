"""TFRecord framing: byte-exact writing, decoding at every chunk boundary, every corruption."""

import logging
import os
import struct

import pytest

from pipemode import tfrecord
from pipemode.corruption import CorruptionPolicy
from pipemode.crc import masked_crc32c
from pipemode.errors import CorruptRecordError, TruncatedRecordError
from tests.conftest import random_records, stream_reader
from tests.timeouts import wait_s

WHERE = "test stream"


@pytest.fixture(autouse=True, params=["compiled", "pure Python"])
def decoder_path(request, monkeypatch):
    """Every test here runs on both decoders: with the compiled fast path (pipemode._framing) where
    it is built, and the pure-Python one (PIPEMODE_PURE_PYTHON=1)."""
    if request.param == "compiled":
        if tfrecord._framing is None:
            pytest.skip("pipemode._framing is not built in this install")
        monkeypatch.delenv(tfrecord.PURE_PYTHON_ENV, raising=False)
    else:
        monkeypatch.setenv(tfrecord.PURE_PYTHON_ENV, "1")
    return request.param


def decode(data: bytes, *, skips: int = 0, chunk_bytes: int = tfrecord.CHUNK_BYTES, **kwargs):
    decoder = tfrecord.TFRecordDecoder(CorruptionPolicy(skips), chunk_bytes=chunk_bytes, **kwargs)
    records = [r for batch in decoder.decode(stream_reader(data), WHERE) for r in batch]
    return records, decoder


def test_encoding_matches_tensorflows_writer(tmp_path):
    import tensorflow as tf

    records = random_records(1, 50)
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    assert open(path, "rb").read() == tfrecord.encode(records)


@pytest.mark.parametrize("chunk_bytes", [1, 2, 11, 12, 13, 15, 16, 17, 100, 4096, 4 << 20])
def test_round_trip_with_records_straddling_every_kind_of_chunk_boundary(chunk_bytes):
    records = random_records(2, 300, max_bytes=200) + [b"", b"x", b""]
    got, decoder = decode(tfrecord.encode(records), chunk_bytes=chunk_bytes)
    assert got == records
    assert decoder.seen == len(records)


def test_empty_stream_has_no_records():
    assert decode(b"")[0] == []


def test_records_of_several_megabytes_and_of_zero_bytes():
    import os

    records = [b"", os.urandom(9 << 20), b"", os.urandom(5 << 20 | 3), b""]
    assert decode(tfrecord.encode(records), chunk_bytes=1 << 20)[0] == records


def test_header_crc_cache_stays_bounded(monkeypatch):
    monkeypatch.setattr(tfrecord, "_HEADER_CACHE_LIMIT", 100)
    records = [bytes(n) for n in range(1000)] * 2  # every length distinct, then again
    got, decoder = decode(tfrecord.encode(records), chunk_bytes=4096)
    assert got == records
    assert 0 < len(decoder._header_crcs) <= 100


# --- corruption: each case names the record number and byte offset ---------------------------

RECORDS = [b"alpha" * 10, b"bravo" * 20, b"charlie" * 30, b"delta" * 5]
OFFSETS = [sum(16 + len(r) for r in RECORDS[:i]) for i in range(len(RECORDS))]


def corrupt(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x40]) + data[offset + 1 :]


@pytest.mark.parametrize("chunk_bytes", [7, 4 << 20])
@pytest.mark.parametrize(
    "where, detail",
    [
        (lambda o, r: o + 20, "data CRC mismatch"),  # a byte of the data
        (lambda o, r: o + 12 + len(r) + 1, "data CRC mismatch"),  # the data's CRC
        (lambda o, r: o + 9, "length CRC mismatch"),  # the length's CRC
        (lambda o, r: o + 1, "length CRC mismatch"),  # the length
    ],
    ids=["data", "data-crc", "length-crc", "length"],
)
def test_corruption_is_an_error_naming_record_and_offset(where, detail, chunk_bytes):
    data = tfrecord.encode(RECORDS)
    with pytest.raises(CorruptRecordError) as info:
        decode(corrupt(data, where(OFFSETS[2], RECORDS[2])), chunk_bytes=chunk_bytes)
    err = info.value
    assert (err.record, err.offset) == (2, OFFSETS[2])
    assert detail in str(err)
    assert f"corrupt record #2 at byte offset {OFFSETS[2]} of {WHERE}" in str(err)


def test_impossible_length_with_a_valid_crc_is_an_error():
    length = struct.pack("<Q", 1 << 40)
    bogus = length + struct.pack("<I", masked_crc32c(length)) + b"\0" * 100
    with pytest.raises(CorruptRecordError, match=r"impossible record length 1099511627776"):
        decode(tfrecord.encode(RECORDS[:1]) + bogus)


@pytest.mark.parametrize("cut", [1, 8, 11, 12, 13, 40, -5, -1], ids=lambda c: f"cut{c}")
def test_truncated_final_record_is_an_error(cut):
    data = tfrecord.encode(RECORDS)
    cut_at = OFFSETS[3] + cut if cut > 0 else len(data) + cut
    for chunk_bytes in (5, 4 << 20):
        with pytest.raises(TruncatedRecordError) as info:
            decode(data[:cut_at], chunk_bytes=chunk_bytes)
        assert (info.value.record, info.value.offset) == (3, OFFSETS[3])
        assert "the stream ended" in str(info.value)


def test_check_crc_off_skips_crc_checks_but_not_length_checks():
    data = corrupt(tfrecord.encode(RECORDS), OFFSETS[1] + 20)
    got, _ = decode(data, check_crc=False)
    assert len(got) == 4 and got[1] != RECORDS[1]
    with pytest.raises(CorruptRecordError, match="impossible record length"):
        decode(tfrecord.encode([b"x" * 100]), check_crc=False, max_record_bytes=99)


# --- opt-in skipping: counted, logged, and the rest of the stream still read -------------------


def test_skipping_a_record_with_bad_data(caplog):
    data = corrupt(tfrecord.encode(RECORDS), OFFSETS[1] + 20)
    with caplog.at_level(logging.WARNING):
        got, decoder = decode(data, skips=1)
    assert got == [RECORDS[0], RECORDS[2], RECORDS[3]]
    assert decoder.policy.skipped == 1
    assert f"SKIPPED corrupt record #1 at byte offset {OFFSETS[1]}" in caplog.text


@pytest.mark.parametrize("chunk_bytes", [3, 64, 4 << 20])
def test_skipping_a_damaged_length_resynchronises_on_the_next_record(chunk_bytes, caplog):
    records = random_records(3, 40, max_bytes=100)
    offsets = [sum(16 + len(r) for r in records[:i]) for i in range(len(records))]
    data = corrupt(tfrecord.encode(records), offsets[7] + 3)
    with caplog.at_level(logging.WARNING):
        got, decoder = decode(data, skips=1, chunk_bytes=chunk_bytes)
    assert got == records[:7] + records[8:]
    assert decoder.policy.skipped == 1
    assert "records resume at byte offset" in caplog.text


def test_skip_limit_is_enforced_and_explained():
    data = tfrecord.encode(RECORDS)
    for offset in OFFSETS[:3]:
        data = corrupt(data, offset + 20)
    with pytest.raises(CorruptRecordError, match=r"already skipped 2 corrupt records") as info:
        decode(data, skips=2)
    assert info.value.record == 2


def test_skipping_a_truncated_final_record():
    data = tfrecord.encode(RECORDS)
    got, decoder = decode(data[:-3], skips=1)
    assert got == RECORDS[:3] and decoder.policy.skipped == 1


def test_garbage_after_the_last_record_is_skipped_to_the_end_when_allowed():
    data = tfrecord.encode(RECORDS) + b"\xff" * 1000
    with pytest.raises(CorruptRecordError):
        decode(data)
    got, decoder = decode(data, skips=1)
    assert got == RECORDS and decoder.policy.skipped == 1


def brute_force_find_header(window: bytes, max_record_bytes: int) -> int:
    """The definition find_header implements, one offset at a time."""
    for offset in range(len(window) - tfrecord.HEADER_BYTES + 1):
        length, crc = struct.unpack_from("<QI", window, offset)
        if length <= max_record_bytes and masked_crc32c(window[offset:offset + 8]) == crc:
            return offset
    return -1


def planted(data: bytes, offset: int, length: int) -> bytes:
    header = struct.pack("<Q", length)
    header += struct.pack("<I", masked_crc32c(header))
    return data[:offset] + header + data[offset + 12:]


@pytest.mark.parametrize("max_record_bytes", [tfrecord.MAX_RECORD_BYTES, 1000, 2**40, 2**64 - 1])
def test_find_header_agrees_with_the_brute_force_search(max_record_bytes):
    import random

    rng = random.Random(max_record_bytes)
    small_ints = b"".join(struct.pack("<Q", rng.randrange(300)) for _ in range(500))  # many candidates
    windows = [bytes(4000), rng.randbytes(4000), small_ints, b"\x00" * 100 + rng.randbytes(50)]
    windows += [planted(w, at, length) for w in windows[:3] for at, length in ((0, 0), (1777, 5), (3988, 999))]
    windows += [planted(bytes(4000), 13, 2**35), b"", b"\x00" * 11]
    for window in windows:
        assert tfrecord.find_header(window, max_record_bytes) == brute_force_find_header(window, max_record_bytes)


@pytest.mark.parametrize("garbage", ["zeros", "random", "small integers"])
def test_megabytes_of_garbage_between_records_are_skipped(garbage, caplog):
    import random

    rng = random.Random(5)
    junk = {"zeros": bytes(3 << 20), "random": rng.randbytes(3 << 20),
            "small integers": b"".join(struct.pack("<Q", rng.randrange(64)) for _ in range(3 << 17))}[garbage]
    data = tfrecord.encode(RECORDS) + junk + tfrecord.encode(RECORDS)
    with caplog.at_level(logging.WARNING):
        got, decoder = decode(data, skips=1)
    assert got == RECORDS + RECORDS and decoder.policy.skipped == 1
    assert f"skipped {len(junk)} bytes after a damaged header" in caplog.text


def no_charlie(record: bytes):
    return "it is charlie" if record.startswith(b"charlie") else None


@pytest.mark.parametrize("check_crc", [True, False])
@pytest.mark.parametrize("chunk_bytes", [3, 64, 4 << 20])
def test_a_record_check_rejects_records_by_number_and_offset(check_crc, chunk_bytes):
    with pytest.raises(tfrecord.UnusableRecordError) as info:
        decode(tfrecord.encode(RECORDS), record_check=no_charlie, check_crc=check_crc, chunk_bytes=chunk_bytes)
    assert str(info.value) == f"unusable record #2 at byte offset {OFFSETS[2]} of {WHERE}: it is charlie"
    got, decoder = decode(tfrecord.encode(RECORDS), skips=1, record_check=no_charlie, check_crc=check_crc,
                          chunk_bytes=chunk_bytes)
    assert got == [RECORDS[0], RECORDS[1], RECORDS[3]] and decoder.policy.skipped == 1


def test_rejected_and_corrupt_records_count_against_one_limit_in_stream_order():
    data = corrupt(tfrecord.encode(RECORDS), OFFSETS[1] + 20)  # bravo's data CRC
    with pytest.raises(CorruptRecordError, match="#1 at byte offset") as info:
        decode(data, record_check=no_charlie)
    assert not isinstance(info.value, tfrecord.UnusableRecordError)
    with pytest.raises(tfrecord.UnusableRecordError, match="already skipped 1 corrupt records"):
        decode(data, skips=1, record_check=no_charlie)
    got, decoder = decode(data, skips=2, record_check=no_charlie)
    assert got == [RECORDS[0], RECORDS[3]] and decoder.policy.skipped == 2


# A record that ends more than a piece past the chunk it starts in (tfrecord._long_record): read in
# pieces, its data CRC computed over them. With 4 KiB chunks, the long record #1 (after RECORDS[0])
# is sized so that its last piece holds `in_last` bytes of its end: 1-3 put the footer across two
# pieces, 4 exactly in the last one, 100 some data too.
LONG_CHUNK = 4096


def with_a_long_record(in_last: int) -> tuple[bytes, bytes]:
    long = os.urandom(2 * tfrecord._PIECE_BYTES + LONG_CHUNK - OFFSETS[1] - tfrecord.OVERHEAD_BYTES + in_last)
    return long, tfrecord.encode([RECORDS[0], long, RECORDS[2]])


@pytest.mark.parametrize("in_last", [1, 2, 3, 4, 100])
def test_a_record_longer_than_a_piece_is_checked_over_its_pieces(in_last, caplog):
    long, data = with_a_long_record(in_last)
    got, decoder = decode(data, chunk_bytes=LONG_CHUNK)
    assert got == [RECORDS[0], long, RECORDS[2]] and decoder.seen == 3
    crc_at = OFFSETS[1] + tfrecord.HEADER_BYTES + len(long)
    for damaged in (OFFSETS[1] + 20, OFFSETS[1] + len(long) // 2, crc_at, crc_at + 3):  # its data, its CRC
        with pytest.raises(CorruptRecordError) as info:
            decode(corrupt(data, damaged), chunk_bytes=LONG_CHUNK)
        assert str(info.value) == (f"corrupt record #1 at byte offset {OFFSETS[1]} of {WHERE}: data CRC mismatch in "
                                   f"a record of {len(long)} bytes")
        with caplog.at_level(logging.WARNING):
            got, decoder = decode(corrupt(data, damaged), skips=1, chunk_bytes=LONG_CHUNK)
        assert got == [RECORDS[0], RECORDS[2]] and (decoder.policy.skipped, decoder.seen) == (1, 3)
        assert f"SKIPPED corrupt record #1 at byte offset {OFFSETS[1]}" in caplog.text
    got, _ = decode(corrupt(data, crc_at), check_crc=False, chunk_bytes=LONG_CHUNK)
    assert got == [RECORDS[0], long, RECORDS[2]]


@pytest.mark.parametrize("check_crc", [True, False])
def test_a_record_check_rejects_a_record_longer_than_a_piece_by_number_and_offset(check_crc):
    long, data = with_a_long_record(100)

    def not_long(record: bytes):
        return "it is long" if len(record) == len(long) else None

    with pytest.raises(tfrecord.UnusableRecordError) as info:
        decode(data, record_check=not_long, check_crc=check_crc, chunk_bytes=LONG_CHUNK)
    assert str(info.value) == f"unusable record #1 at byte offset {OFFSETS[1]} of {WHERE}: it is long"
    got, decoder = decode(data, skips=1, record_check=not_long, check_crc=check_crc, chunk_bytes=LONG_CHUNK)
    assert got == [RECORDS[0], RECORDS[2]] and decoder.policy.skipped == 1


@pytest.mark.parametrize("cut", [1, tfrecord._PIECE_BYTES, -1], ids=["into-it", "a-piece-in", "before-its-last-byte"])
def test_a_record_longer_than_a_piece_cut_short_is_truncated(cut):
    long, data = with_a_long_record(100)
    end = OFFSETS[1] + tfrecord.OVERHEAD_BYTES + len(long)
    cut_at = LONG_CHUNK + cut if cut > 0 else end + cut
    with pytest.raises(TruncatedRecordError) as info:
        decode(data[:cut_at], chunk_bytes=LONG_CHUNK)
    assert (info.value.record, info.value.offset) == (1, OFFSETS[1])
    assert f"the stream ended {cut_at - OFFSETS[1]} bytes into a {end - OFFSETS[1]}-byte record" in str(info.value)
    got, decoder = decode(data[:cut_at], skips=1, chunk_bytes=LONG_CHUNK)
    assert got == [RECORDS[0]] and (decoder.policy.skipped, decoder.seen) == (1, 2)


def test_a_crafted_length_with_a_valid_crc_does_not_reserve_its_size_in_memory(tmp_path):
    import tracemalloc

    header = struct.pack("<Q", tfrecord.MAX_RECORD_BYTES)
    path = tmp_path / "crafted.tfrecord"
    path.write_bytes(tfrecord.encode(RECORDS) + header + struct.pack("<I", masked_crc32c(header)) + b"x" * 1000)
    decoder = tfrecord.TFRecordDecoder(CorruptionPolicy(0))
    tracemalloc.start()
    try:
        # a file's read(n) allocates n bytes before reading (a FIFO's too)
        with open(path, "rb") as f, pytest.raises(TruncatedRecordError, match="#4 at byte offset"):
            list(decoder.decode(f.read, WHERE))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 << 20, f"{peak / 1e6:.0f} MB for a 1 KB stream"


def test_header_length_reads_a_records_header_and_refuses_a_damaged_one():
    record = tfrecord.encode_record(b"x" * 300)
    assert tfrecord.header_length(record[: tfrecord.HEADER_BYTES]) == 300
    damaged = bytes([record[0] ^ 1]) + record[1 : tfrecord.HEADER_BYTES]
    assert tfrecord.header_length(damaged) is None


def test_any_max_record_bytes_is_accepted_even_beyond_what_a_length_field_holds():
    records = [b"a" * 10, b"b" * 5000]
    got, _ = decode(tfrecord.encode(records), max_record_bytes=2**70)
    assert got == records


# A reader process: one pass of channel train through PipeReader, SKIPS corrupt records allowed, then
# its peak RSS as the kernel counts it (VmHWM) and what it read, as JSON. With HEAD and FILLER, the
# FIFO's writer is a thread of this process, as a training job's other threads are (TensorFlow's,
# allocating beside the reader): it writes HEAD's bytes, then FILLER bytes, each MiB a buffer of its
# own allocated, filled and freed in turn, so that the heap the reader grows in churns while the
# process holds no copy of the stream, and its peak is the reader's.
_READ_ONE_PASS = """
import json, os, sys, threading
from pipemode import PipeReader
from tests.pipe_writer import write_all
pipe_dir, config_dir, state_dir, skips, *writer = sys.argv[1:]

def write(head, filler):
    with open(os.path.join(pipe_dir, "train_0"), "wb", buffering=0) as fifo:
        write_all(fifo, head)
        for sent in range(0, filler, 1 << 20):
            write_all(fifo, b"x" * min(1 << 20, filler - sent))  # (a fresh buffer each time, freed after)

if writer:
    os.mkfifo(os.path.join(pipe_dir, "train_0"))
    with open(writer[0], "rb") as f:
        head = f.read()
    thread = threading.Thread(target=write, args=(head, int(writer[1])), daemon=True)  # (a failing reader shows why)
    thread.start()
reader = PipeReader("train", "TFRecord", pipe_dir=pipe_dir, config_dir=config_dir, state_dir=state_dir,
                    max_corrupted_records_to_skip=int(skips))
records = sum(len(batch) for batch in reader.read_pass())
if writer:
    thread.join()
with open("/proc/self/status") as status:
    peak = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
print(json.dumps({"records": records, "skipped": reader.history[-1].skipped, "peak": peak}))
"""

# realloc() as an allocator that cannot grow a large block where it lies has it: a new block, the
# bytes copied, the old one freed (glibc's grows a large block in place, with mremap).
_MOVING_REALLOC = """
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

void *realloc(void *old, size_t size) {
    if (old == NULL) return malloc(size);
    if (size == 0) { free(old); return NULL; }
    void *moved = malloc(size);
    if (moved != NULL) {
        size_t kept = malloc_usable_size(old);
        memcpy(moved, old, kept < size ? kept : size);
        free(old);
    }
    return moved;
}
"""


def moving_realloc(folder) -> dict:
    """The environment that preloads _MOVING_REALLOC, built here with the C compiler (or a skip)."""
    import shutil
    import subprocess

    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not compiler:
        pytest.skip("no C compiler to build a realloc that moves blocks")
    folder.mkdir(parents=True)
    (folder / "moving_realloc.c").write_text(_MOVING_REALLOC)
    build = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(folder / "moving_realloc.so"),
                            str(folder / "moving_realloc.c")], capture_output=True, text=True)
    if build.returncode:
        pytest.skip(f"{compiler} cannot build a shared library: {build.stderr[-500:]}")
    return {"LD_PRELOAD": str(folder / "moving_realloc.so")}


def peak_rss_of_a_pass(folder, head: bytes, filler: int, env: dict, writer: str, skips: int = 1) -> dict:
    """A PipeReader process (with `env`, allowed `skips` corrupt records) reading `head`, then
    `filler` bytes, from a FIFO that its writer feeds: another process (tests/pipe_writer.py) or a
    thread of the reader's own."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    for sub in ("config", "data", "state"):
        (folder / sub).mkdir(parents=True)
    (folder / "config" / "inputdataconfig.json").write_text(json.dumps({"train": {"TrainingInputMode": "Pipe"}}))
    program = [sys.executable, "-c", _READ_ONE_PASS, str(folder / "data"), str(folder / "config"), str(folder / "state"),
               str(skips)]
    if writer == "a thread":
        (folder / "head.tfrecord").write_bytes(head)
        process = None
        program += [str(folder / "head.tfrecord"), str(filler)]
    else:
        (folder / "stream.tfrecord").write_bytes(head + b"x" * filler)
        process = subprocess.Popen([sys.executable, str(REPO / "tests" / "pipe_writer.py"), "--dir",
                                    str(folder / "data"), "--channel", "train", "--passes", "1",
                                    str(folder / "stream.tfrecord")])
    try:
        out = subprocess.run(program, capture_output=True, text=True, timeout=wait_s(120), cwd=REPO,
                             env={**os.environ, **env})
    finally:
        assert process is None or process.wait(timeout=wait_s(60)) == 0
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["another process", "a thread"])
@pytest.mark.parametrize("allocator", ["glibc's", "a realloc that moves blocks"])
def test_a_forged_length_costs_about_what_arrived_in_the_readers_rss(allocator, writer, tmp_path):
    """A CRC-valid header claiming 2 GB, then 150 MB and the stream's end: the reader's peak RSS
    (the kernel's count, not Python's) grows by about those 150 MB over the same program reading a
    small stream; not by 1.9x that, as it did where realloc moves a block to grow it (a buffer
    grown by appends: the old block and the new one at once). The same with the FIFO's writer a
    thread of the reading process that allocates and frees a buffer per MiB beside the reader, as
    in a training job, whose heap TensorFlow's threads share.
    (The decoder's pieces are kept as they come and joined once whole: tfrecord._long_record.)"""
    env = moving_realloc(tmp_path / "allocator") if allocator != "glibc's" else {}
    header = struct.pack("<Q", tfrecord.MAX_RECORD_BYTES)
    forged = tfrecord.encode(RECORDS) + header + struct.pack("<I", masked_crc32c(header))
    arrived = 150 << 20
    small = peak_rss_of_a_pass(tmp_path / "small", forged, 1 << 20, env, writer)
    large = peak_rss_of_a_pass(tmp_path / "large", forged, arrived, env, writer)
    for run in (small, large):  # (the records before it, then the forged one skipped: the stream ended in it)
        assert (run["records"], run["skipped"]) == (len(RECORDS), 1), run
    grown = large["peak"] - small["peak"]
    assert grown < 1.1 * arrived, f"peak RSS +{grown / 1e6:.0f} MB for {arrived / 1e6:.0f} MB that arrived"


def test_a_forged_length_the_stream_fills_costs_about_what_arrived_when_skipped(tmp_path):
    """A CRC-valid header claiming a length that the stream does fill (149 MiB of the 150 MiB that
    follow), its data CRC then wrong, in skip mode (the forged record skipped, then the rest, which
    holds no header), the FIFO's writer a thread of the reading process: the peak RSS grows by
    about what arrived over the same program reading a stream that ends 1 MiB in, at most 1.3x it;
    not by 2x, as when the record's pieces were joined before its data CRC was checked, and the
    whole record then copied out of the joined buffer again (tfrecord._long_record)."""
    arrived = 150 << 20
    header = struct.pack("<Q", arrived - (1 << 20))
    forged = tfrecord.encode(RECORDS) + header + struct.pack("<I", masked_crc32c(header))
    small = peak_rss_of_a_pass(tmp_path / "small", forged, 1 << 20, {}, "a thread", skips=10)
    large = peak_rss_of_a_pass(tmp_path / "large", forged, arrived, {}, "a thread", skips=10)
    assert (small["records"], small["skipped"]) == (len(RECORDS), 1), small  # (the stream ended in it)
    assert (large["records"], large["skipped"]) == (len(RECORDS), 2), large  # (it, then the bytes after it)
    grown = large["peak"] - small["peak"]
    assert grown <= 1.3 * arrived, f"peak RSS +{grown / 1e6:.0f} MB for {arrived / 1e6:.0f} MB that arrived"
