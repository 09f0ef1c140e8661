""".ci/require, which .ci/run calls first: on a machine without a tool the suite needs, CI fails
before the tests, naming what is missing (and never lets the tests that need it skip)."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import REPO


def path_without(tmp_path, *tools: str) -> str:
    """A PATH holding every command of this one but `tools`."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = os.path.join(directory, name)
            if name not in tools and not (folder / name).exists() and os.access(target, os.X_OK):
                (folder / name).symlink_to(target)
    return str(folder)


def test_without_podman_or_a_c_compiler_ci_fails_and_names_them(tmp_path):
    env = {**os.environ, "PATH": path_without(tmp_path, "podman", "cc"), "CI_INSTALL": "0"}
    out = subprocess.run([str(REPO / ".ci/require")], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "ci: missing: cc (Debian package gcc)" in out.stderr
    assert "ci: missing: podman (Debian package podman)" in out.stderr
    assert "cannot run the whole suite" in out.stderr


def test_without_pythons_headers_ci_fails_and_names_them(tmp_path):
    """A Python whose include folder has no Python.h (a python3 without its -dev package)."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nexec python3 -c \"import sys; sys.exit(1)\" \"$@\"\n")
    python.chmod(0o755)
    env = {**os.environ, "PYTHON": str(python), "CI_INSTALL": "0"}
    out = subprocess.run([str(REPO / ".ci/require")], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "ci: missing: Python.h" in out.stderr
