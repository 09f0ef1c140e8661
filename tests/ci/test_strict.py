"""Strict mode (tests/strict.py), as CI runs the suite: every skip fails with its reason, but for a
test that is not for this kind of machine; outside CI, skips stay skips."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

TESTS = {
    "test_some.py": '''
import pytest
from tests.strict import not_for_this_machine

def test_runs():
    pass

def test_needs_podman():
    pytest.skip("podman is not installed")

@pytest.fixture
def engine():
    pytest.skip("no Docker Engine: dockerd is not installed")

def test_in_the_engine(engine):
    pass

@pytest.mark.skipif(True, reason="pipemode._framing is not built in this install")
def test_compiled():
    pass

def test_on_a_gpu():
    not_for_this_machine("needs a GPU")
''',
    "test_whole_module.py": '''
import pytest
pytest.skip("the toolkit's virtualenv is missing", allow_module_level=True)

def test_never_collected():
    pass
''',
}


def run_pytest(folder, *args, strict: bool):
    env = {k: v for k, v in os.environ.items() if k not in ("STRICT_SKIPS", "PYTEST_ADDOPTS")}
    env.update(PYTHONPATH=str(REPO), **({"STRICT_SKIPS": "1"} if strict else {}))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.strict", "-ra", "-p", "no:cacheprovider",
                           "--rootdir", str(folder), *args, str(folder)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def write_tests(folder):
    for name, text in TESTS.items():
        (folder / name).write_text(text)


@pytest.mark.slow
def test_in_strict_mode_a_skip_for_something_missing_fails_with_its_reason(tmp_path):
    (tmp_path / "test_some.py").write_text(TESTS["test_some.py"])
    out = run_pytest(tmp_path, strict=True)
    assert out.returncode == 1, out.stdout
    summary = out.stdout[out.stdout.index("short test summary"):]
    for reason in ("podman is not installed", "no Docker Engine: dockerd is not installed",
                   "pipemode._framing is not built in this install"):
        assert f"skipped in strict mode (STRICT_SKIPS=1, as CI runs): {reason}" in out.stdout, reason
    # the allowed skip is listed, at the test itself (its def line)
    assert "SKIPPED [1] test_some.py:22: not for this machine: needs a GPU" in summary, summary
    assert "1 failed, 1 passed, 1 skipped, 2 errors" in out.stdout.splitlines()[-1], out.stdout[-1500:]


@pytest.mark.slow
def test_in_strict_mode_a_module_skipped_whole_is_an_error(tmp_path):
    write_tests(tmp_path)
    out = run_pytest(tmp_path, strict=True)
    assert out.returncode != 0, out.stdout
    assert "ERROR test_whole_module.py - skipped in strict mode" in out.stdout, out.stdout[-1500:]


@pytest.mark.slow
def test_under_the_workers_too(tmp_path):
    """`make test` runs in pytest-xdist workers: the reports they send back are the strict ones."""
    (tmp_path / "test_some.py").write_text(TESTS["test_some.py"])
    out = run_pytest(tmp_path, "-n", "2", strict=True)
    assert out.returncode == 1, out.stdout
    assert "1 failed, 1 passed, 1 skipped, 2 errors" in out.stdout.splitlines()[-1], out.stdout[-1500:]


@pytest.mark.slow
def test_outside_strict_mode_skips_stay_skips(tmp_path):
    write_tests(tmp_path)
    out = run_pytest(tmp_path, strict=False)
    assert out.returncode == 0, out.stdout
    assert "1 passed, 5 skipped" in out.stdout.splitlines()[-1], out.stdout[-1500:]
