"""The job's and the launcher's wheels as users install them: what they declare and hold, and their
commands (`keras-pipe`, `keras-pipe-train`, `keras-pipe-serve`) run from a fresh virtualenv as users
type them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import run_logged
from tests.wheels import WHEEL_NAMES, build_wheel, metadata


@pytest.mark.slow
def test_the_job_and_launcher_wheels_declare_their_dependencies_and_data(tmp_path):
    job, job_files = metadata(build_wheel("train", tmp_path / "job"))
    assert "pipemode==0.1.0" in job.get_all("Requires-Dist")
    assert {f.split("/")[0] for f in job_files if ".dist-info" not in f} == {"keras_pipe_train", "keras_pipe_serve"}
    assert any(r.startswith("gunicorn") for r in job.get_all("Requires-Dist"))
    launcher, files = metadata(build_wheel("launch", tmp_path / "launch"))
    requires = launcher.get_all("Requires-Dist")
    assert {"pipemode==0.1.0", "keras-pipe-train==0.1.0"} <= set(requires)
    assert any(r.startswith("boto3") for r in requires) and any(r.startswith("sagemaker") for r in requires)
    assert "keras_pipe_launch/sample_data/digits.npz" in files  # the demo's data ships with it
    with zipfile.ZipFile(next((tmp_path / "launch").glob("keras_pipe-*.whl"))) as z:
        entry_points = z.read(next(n for n in z.namelist() if n.endswith("entry_points.txt"))).decode()
    assert "keras-pipe = keras_pipe_launch.cli:run" in entry_points


def fresh_virtualenv_with_the_wheels(folder: Path) -> Path:
    """A new virtualenv holding the three wheels, built from this checkout, as a user installs them;
    returns its bin/ folder. Their dependencies (TensorFlow, boto3, the SageMaker SDK ...) cannot be
    downloaded here (no network): the new environment sees this one's site-packages through a .pth
    file, after its own, so the project's modules come from the wheels and nothing else (this
    environment's editable installs are .pth files there, which a path added this way does not run)."""
    wheels = [build_wheel(project, folder / "wheels" / name) for project, name in WHEEL_NAMES.items()]
    venv = folder / "venv"
    run_logged([sys.executable, "-m", "venv", str(venv)], 120).check_returncode()
    run_logged([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--no-index", "--no-deps", *map(str, wheels)], 270).check_returncode()
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "zz-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


@pytest.mark.slow
def test_the_installed_commands_run_as_users_type_them(tmp_path):
    """`keras-pipe` and `keras-pipe-train`, the console scripts the wheels install, run from a fresh
    virtualenv: not `python -m` from this checkout (that hid a console script naming a function
    that did not exist)."""
    bin_dir = fresh_virtualenv_with_the_wheels(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"

    def command(*args: str) -> subprocess.CompletedProcess:
        return run_logged(list(args), 120, env=env, cwd=tmp_path)

    main = command("keras-pipe", "--help")
    assert main.returncode == 0, main.stderr[-3000:]
    for name in ("local", "submit", "tune", "prepare", "predict", "export", "deploy", "transform", "report", "register"):
        assert name in main.stdout
        sub = command("keras-pipe", name, "--help")
        assert sub.returncode == 0 and sub.stdout.startswith(f"usage: keras-pipe {name}"), sub.stderr[-3000:]
    wrong = command("keras-pipe", "nonsense")
    assert wrong.returncode == 2 and "invalid choice: 'nonsense'" in wrong.stderr
    # a whole command through the script: the request a submit would send
    request = command("keras-pipe", "submit", "--image-uri", "1.dkr.ecr.us-east-1.amazonaws.com/keras-pipe-train:1",
                      "--role", "arn:aws:iam::123456789012:role/SageMakerRole", "--train", "s3://bucket/train/",
                      "--output-path", "s3://bucket/jobs/", "--hp", "num_classes=2", "--dry-run")
    assert request.returncode == 0, request.stderr[-3000:]
    assert json.loads(request.stdout)["InputDataConfig"][0]["InputMode"] == "Pipe"
    # the modules behind the scripts are the wheels' own
    where = command(str(bin_dir / "python"), "-c", "import keras_pipe_launch, keras_pipe_train, pipemode;"
                    "print(keras_pipe_launch.__file__, keras_pipe_train.__file__, pipemode.__file__)")
    assert where.returncode == 0, where.stderr[-3000:]
    assert all(path.startswith(str(bin_dir.parent / "lib")) for path in where.stdout.split()), where.stdout

    serve = command("keras-pipe-serve", "--help")
    assert serve.returncode == 0 and serve.stdout.startswith("usage: serve") and "--model-dir" in serve.stdout
    missing = command("keras-pipe-serve", "--model-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 1 and "holds no SavedModel" in missing.stderr, missing.stderr[-2000:]

    help_text = command("keras-pipe-train", "--help")
    assert help_text.returncode == 0, help_text.stderr[-3000:]
    assert help_text.stdout.startswith("usage: train") and "/opt/ml" in help_text.stdout
    assert not (tmp_path / "opt_ml").exists()
    # anything else is not for it: refused as a configuration error, reported as a job failure is
    base = tmp_path / "opt_ml"
    wrong = run_logged(["keras-pipe-train", "--epochs", "3"], 120, env={**env, "SAGEMAKER_BASE_DIR": str(base)})
    assert wrong.returncode == 2, wrong.stdout[-2000:] + wrong.stderr[-2000:]
    assert (base / "output" / "failure").read_text().startswith(
        "Configuration error: train takes no arguments, got '--epochs 3'")
