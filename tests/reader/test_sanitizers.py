"""The reader's compiled part built with AddressSanitizer and UndefinedBehaviorSanitizer, then put
through the same properties as the plain build (test_tfrecord_properties.py) and a mass of random
bytes: any read outside a buffer, overflow or undefined behaviour aborts the run. Skipped, with the
reason, where the compiler lacks the sanitizers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO, run_logged
from tests.timeouts import wait_s

pytestmark = pytest.mark.slow
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g", "-O1"]


def compiler() -> str:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc") or ""


def runtime(name: str) -> str | None:
    """The sanitizer's shared runtime, which must be preloaded into a Python not built with it."""
    out = subprocess.run([compiler(), f"-print-file-name={name}"], capture_output=True, text=True)
    path = out.stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def sanitized_copy(folder: Path, change=None) -> Path:
    """A copy of the reader whose pipemode._framing is built with the sanitizers (its source first
    changed by `change`, if given)."""
    if not compiler():
        pytest.skip("no C compiler")
    if runtime("libasan.so") is None:
        pytest.skip(f"{compiler()} has no AddressSanitizer runtime (libasan)")
    shutil.copytree(REPO / "train/pipemode/pipemode", folder / "pipemode",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    source = folder / "pipemode" / "_framing.c"
    if change:
        source.write_text(change(source.read_text()))
    target = folder / "pipemode" / f"_framing{sysconfig.get_config_var('EXT_SUFFIX')}"
    build = subprocess.run([compiler(), "-shared", "-fPIC", *SANITIZE, f"-I{sysconfig.get_paths()['include']}",
                            str(source), "-o", str(target)], capture_output=True, text=True, timeout=wait_s(120))
    if build.returncode:
        pytest.skip(f"{compiler()} cannot build with the sanitizers: {build.stderr[-500:]}")
    return folder


@pytest.fixture(scope="module")
def sanitized_reader(tmp_path_factory) -> Path:
    return sanitized_copy(tmp_path_factory.mktemp("sanitized"))


def run_sanitized(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{folder}:{REPO}", "LD_PRELOAD": runtime("libasan.so"),
           # every object from malloc, which ASan watches: pymalloc's arenas would hide a read past
           # the end of a small bytes object (seen: a deliberately broken copy went unreported)
           "PYTHONMALLOC": "malloc",
           # Python itself leaks on purpose at exit; halt on the first error of either sanitizer
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1", "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
           "PIPEMODE_PURE_PYTHON": "0"}
    # (the properties take ~30 s under the sanitizers on 2 cores: time to spare, and the output if it hangs)
    return run_logged([sys.executable, *args], 270, env=env, cwd=REPO)


def test_the_sanitized_build_is_the_one_that_runs(sanitized_reader):
    out = run_sanitized(sanitized_reader, "-c", "from pipemode import tfrecord; print(tfrecord.compiled_framing().__file__)")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().startswith(str(sanitized_reader)), out.stdout


def test_the_properties_hold_under_the_sanitizers(sanitized_reader):
    out = run_sanitized(sanitized_reader, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                        "tests/reader/test_tfrecord_properties.py", "tests/reader/test_framing.py")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "passed" in out.stdout and "skipped" not in out.stdout.splitlines()[-1], out.stdout[-500:]


RANDOM_BYTES = r"""
import os, random
from pipemode import _framing
from pipemode.crc import crc32c
rng = random.Random(0)
for size in [0, 1, 11, 12, 13, 15, 16, 17] + [rng.randrange(1 << 16) for _ in range(300)]:
    data = os.urandom(size)
    for pos in (0, min(1, size), size // 2, size):
        _framing.scan(data, pos, rng.choice([0, 1, 100, 2**31 - 1, 2**64 - 1]), crc32c)
        _framing.find_header(data, pos, rng.choice([0, 1, 100, 2**31 - 1, 2**64 - 1]))
print("ok")
"""


def test_random_bytes_at_every_edge_under_the_sanitizers(sanitized_reader):
    out = run_sanitized(sanitized_reader, "-c", RANDOM_BYTES)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_the_sanitizers_catch_a_read_past_the_end_of_a_buffer(tmp_path):
    """The run above can fail: a copy whose find_header reads header fields up to the last byte."""
    def overrun(source: str) -> str:
        loop = "for (Py_ssize_t pos = start; size - pos >= HEADER_BYTES; pos++) {"
        assert loop in source
        return source.replace(loop, "for (Py_ssize_t pos = start; size - pos >= 1; pos++) {")

    out = run_sanitized(sanitized_copy(tmp_path, overrun), "-c", RANDOM_BYTES)
    assert out.returncode != 0 and "ERROR: AddressSanitizer" in out.stderr, out.stderr[-2000:]
