"""`keras-pipe`'s commands print their own lines: TensorFlow's start-up notices, which it writes from
C++ while it imports, stay out of the terminal unless TF_CPP_MIN_LOG_LEVEL=0 asks for them
(keras_pipe_launch/common/quiet_start.py); its warnings and errors still show."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_logged

KERAS_PIPE = Path(sys.executable).parent / "keras-pipe"  # the console script, as users type it


def users_env(**env: str) -> dict:
    """This environment as a user's, who set no TF_CPP_MIN_LOG_LEVEL, with `env` added."""
    return {**{k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}, **env}


def fake_tensorflow(folder: Path, code: str) -> Path:
    """A folder holding a stand-in package `tensorflow` whose import runs `code`."""
    (folder / "tensorflow").mkdir(parents=True)
    (folder / "tensorflow" / "__init__.py").write_text(code)
    return folder


def prepare(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    photos = tmp_path / "photos"
    if not photos.exists():
        made = run_logged([sys.executable, "-m", "keras_pipe_launch.sample_data", str(photos), "--count", "40"], 120)
        assert made.returncode == 0, made.stderr
    here = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"  # (each run's own folder: the same lines)
    here.mkdir()
    done = run_logged([str(KERAS_PIPE), "prepare", "../photos", "prepared", "--max-side", "64"], 240, cwd=here,
                      env=users_env(**env))
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_keras_pipe_prepare_prints_its_own_lines_only_unless_tensorflows_are_asked_for(tmp_path):
    quiet = prepare(tmp_path)
    lines = (quiet.stdout + quiet.stderr).splitlines()
    assert lines and all(line.startswith("prepare: ") for line in lines), lines
    asked = prepare(tmp_path, TF_CPP_MIN_LOG_LEVEL="0")
    assert "oneDNN custom operations" in asked.stderr or "cpu_feature_guard" in asked.stderr, asked.stderr
    assert [line for line in (asked.stdout + asked.stderr).splitlines() if line.startswith("prepare: ")] == lines


# A stand-in for tensorflow (imported from a folder of its own, first on sys.path) which writes to
# file descriptor 2 as TensorFlow's C++ does: two notices, a warning, an error, a line without its
# newline; then the process that imported it says it got through, on stdout
FAKE_TENSORFLOW = r'''
import os
for line in (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
             b"I0000 00:00:1795793292.406502    3049 port.cc:153] oneDNN custom operations are on.\n",
             b"W0000 00:00:1795793292.5    3049 gpu_device.cc:2344] Cannot dlopen some GPU libraries.\n",
             b"To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow\n",
             b"E0000 00:00:1795793292.6    3049 cuda_dnn.cc:8310] Unable to register cuDNN factory\n",
             b"no newline at the end"):
    os.write(2, line)
'''
IMPORTER = r'''
import sys
sys.path.insert(0, sys.argv[1])
from keras_pipe_launch.common.quiet_start import quiet_tensorflow_start
quiet_tensorflow_start()
import tensorflow
print("imported", tensorflow.__file__.startswith(sys.argv[1]))
'''


def test_only_the_info_notices_are_dropped_and_the_rest_passes_in_order(tmp_path):
    folder = fake_tensorflow(tmp_path, FAKE_TENSORFLOW)
    out = run_logged([sys.executable, "-c", IMPORTER, str(folder)], 60, env=users_env())
    assert out.returncode == 0 and out.stdout == "imported True\n", out
    assert out.stderr.splitlines() == [
        "W0000 00:00:1795793292.5    3049 gpu_device.cc:2344] Cannot dlopen some GPU libraries.",
        "E0000 00:00:1795793292.6    3049 cuda_dnn.cc:8310] Unable to register cuDNN factory",
        "no newline at the end"], out.stderr
    shown = run_logged([sys.executable, "-c", IMPORTER, str(folder)], 60, env=users_env(TF_CPP_MIN_LOG_LEVEL="0"))
    assert len(shown.stderr.splitlines()) == 6 and "oneDNN" in shown.stderr, shown.stderr


def test_what_an_import_that_aborts_said_still_shows(tmp_path):
    """TensorFlow's fatal lines ("Check failed", or its refusal of a CPU without AVX) come just
    before abort(): the relay, a process of its own, outlives this one and passes them on."""
    folder = fake_tensorflow(tmp_path, 'import os\n'
                             'os.write(2, b"I0000 00:00:1.0   1 port.cc:153] oneDNN custom operations are on.\\n")\n'
                             'os.write(2, b"F0000 00:00:1.0   1 cpu_feature_guard.cc:1] The TensorFlow library was '
                             'compiled to use AVX instructions, but these are not available on this machine.\\n")\n'
                             'os.abort()\n')
    out = run_logged([sys.executable, "-c", IMPORTER, str(folder)], 60, env=users_env())
    assert out.returncode == -6, out  # (SIGABRT)
    assert "compiled to use AVX instructions" in out.stderr and "oneDNN" not in out.stderr, out.stderr


def test_a_long_write_with_the_gil_held_gets_through(tmp_path):
    """C++ code writes to stderr holding the GIL; 2 MB is far more than a pipe holds, and the relay
    (not a thread of this process, which would wait for that GIL) drains it."""
    folder = fake_tensorflow(tmp_path, 'import ctypes\n'
                             'line = b"W0000 00:00:1.0   1 x.cc:1] " + b"x" * 200 + b"\\n"\n'
                             'data = line * 10000\n'
                             'ctypes.PyDLL(None).write(2, data, len(data))\n')
    out = run_logged([sys.executable, "-c", IMPORTER, str(folder)], 60, env=users_env())
    assert out.returncode == 0 and out.stdout == "imported True\n", out.stdout
    assert out.stderr.count("x.cc:1]") == 10000
