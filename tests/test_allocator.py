"""keras_pipe_train.allocator: the job's malloc settings are accepted by glibc and leave records intact."""

import platform
import subprocess
import sys

import pytest

from tests.conftest import REPO

PROBE = """
import numpy as np, tensorflow as tf
from keras_pipe_train import allocator
from pipemode.dataset import generator_dataset
assert allocator.keep_record_memory()
records = [np.random.default_rng(n).bytes(n) for n in (0, 1, 128 << 10, 3 << 20, 17 << 20)]
got = [r.numpy() for r in generator_dataset(lambda: iter([records[:3], records[3:]]))]
assert got == records, [len(r) for r in got]
print("ok")
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_settings_apply_and_records_of_every_size_pass_through_intact():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
