"""The project's wheels, built offline from a copy of its source (as users build them), and read."""

from __future__ import annotations

import email.parser
import os
import shutil
import sys
import zipfile
from pathlib import Path

from tests.conftest import REPO, run_logged

WHEEL_NAMES = {"train/pipemode": "pipemode", "train": "keras_pipe_train", "launch": "keras_pipe"}


def build_wheel(project: str, out: Path, **env: str) -> Path:
    """The wheel of one of the project's distributions (its folder), built offline from a copy (a
    build writes build/ and *.egg-info next to the sources; the reader's compiled part is built
    afresh, not copied)."""
    source = out / "source"
    shutil.copytree(REPO / project, source, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__", "*.so"))
    run_logged([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                "--wheel-dir", str(out), str(source)], 270, env={**os.environ, **env}).check_returncode()
    (wheel,) = out.glob(f"{WHEEL_NAMES[project]}-*.whl")
    return wheel


def metadata(wheel: Path) -> tuple[email.message.Message, list[str]]:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(z.read(name).decode()), z.namelist()
