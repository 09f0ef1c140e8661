"""pipemode.allocator: the malloc settings are accepted by glibc, leave records intact, and the
reader's can be turned off."""

import os
import platform
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.strict import NOT_FOR_THIS_MACHINE

PROBE = """
import ctypes, os, sys
import numpy as np, tensorflow as tf
from pipemode import allocator
from pipemode.dataset import generator_dataset
if sys.argv[1] == "job":
    assert allocator.keep_record_memory()
records = [np.random.default_rng(n).bytes(n) for n in (0, 1, 128 << 10, 3 << 20, 17 << 20)]
got = [r.numpy() for r in generator_dataset(lambda: iter([records[:3], records[3:]]))]
assert got == records, [len(r) for r in got]
print(allocator.keep_freed_memory())
"""

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason=NOT_FOR_THIS_MACHINE + "mallopt is glibc's")


def probe(kind: str, **env) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, kind], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


@pytest.mark.slow
@glibc_only
def test_the_settings_apply_and_records_of_every_size_pass_through_intact():
    assert probe("job") == "True"
    assert probe("reader") == "True"


@pytest.mark.slow
@glibc_only
@pytest.mark.parametrize("value", ["0", "lots"])
def test_the_readers_setting_is_left_out_when_turned_off_or_not_understood(value):
    assert probe("reader", PIPEMODE_TRIM_THRESHOLD_MB=value) == "False"
