"""The three distributions as users install them: the reader (pipemode) alone, with the
dependencies it declares and nothing of the job; the job and the launcher with theirs and their
data; and the reader inside a user's own script run by AWS's sagemaker-training toolkit."""

from __future__ import annotations

import email.parser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from keras_pipe_launch import container_config
from pipemode import tfrecord
from tests.conftest import REPO, run_logged

TOOLKIT_PYTHON = REPO / ".venv-toolkit" / "bin" / "python"


WHEEL_NAMES = {"train/pipemode": "pipemode", "train": "keras_pipe_train", "launch": "keras_pipe"}


def build_wheel(project: str, out: Path, **env: str) -> Path:
    """The wheel of one of the project's distributions (its folder), built offline from a copy (a
    build writes build/ and *.egg-info next to the sources; the reader's compiled part is built
    afresh, not copied)."""
    source = out / "source"
    shutil.copytree(REPO / project, source, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__", "*.so"))
    run_logged([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                "--wheel-dir", str(out), str(source)], 300, env={**os.environ, **env}).check_returncode()
    (wheel,) = out.glob(f"{WHEEL_NAMES[project]}-*.whl")
    return wheel


def metadata(wheel: Path) -> tuple[email.message.Message, list[str]]:
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(z.read(name).decode()), z.namelist()


def test_the_reader_wheel_holds_the_reader_and_declares_what_it_imports(tmp_path):
    info, files = metadata(build_wheel("train/pipemode", tmp_path))
    requires = info.get_all("Requires-Dist")
    assert {r.split(">")[0].split(";")[0].strip() for r in requires if "extra ==" not in r} == {"numpy", "google-crc32c"}
    # TensorFlow stays the user's own (tensorflow, tensorflow-cpu, AWS's build): an extra only
    assert all("extra ==" in r for r in requires if r.startswith("tensorflow"))
    packages = {f.split("/")[0] for f in files if not f.split("/")[0].endswith(".dist-info")}
    assert packages == {"pipemode"}
    assert "pipemode/textline.py" in files and "pipemode/dataset.py" in files
    # its compiled fast path, built with the wheel where a compiler is at hand (as here, when the
    # editable install built it), and left out without failing where not (setup.py)
    compiled = [f for f in files if f.startswith("pipemode/_framing.") and f.endswith((".so", ".pyd"))]
    assert compiled if tfrecord._framing is not None else not compiled
    assert "PipeModeDataset" in info.get_payload()  # its README is the long description


def test_the_compiled_part_is_built_wherever_a_compiler_and_pythons_headers_are():
    """optional=True (setup.py) lets an install without a compiler go on without pipemode._framing;
    this keeps a broken build from going unnoticed where one should have worked."""
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not (shutil.which("cc") or shutil.which("gcc")) or not headers.exists():
        pytest.skip("no C compiler or no Python headers here")
    assert tfrecord._framing is not None, "pipemode._framing was not built: see pip install -e train/pipemode"


def test_a_pure_python_reader_wheel_for_any_machine(tmp_path):
    """PIPEMODE_PURE_PYTHON=1 at build time: a py3-none-any wheel without the compiled part, the one
    to ship in a SageMaker source_dir built on another kind of machine than the image's."""
    wheel = build_wheel("train/pipemode", tmp_path, PIPEMODE_PURE_PYTHON="1")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    _, files = metadata(wheel)
    assert not [f for f in files if "_framing" in f]


def test_the_job_and_launcher_wheels_declare_their_dependencies_and_data(tmp_path):
    job, job_files = metadata(build_wheel("train", tmp_path / "job"))
    assert "pipemode==0.1.0" in job.get_all("Requires-Dist")
    assert {f.split("/")[0] for f in job_files if ".dist-info" not in f} == {"keras_pipe_train"}
    launcher, files = metadata(build_wheel("launch", tmp_path / "launch"))
    requires = launcher.get_all("Requires-Dist")
    assert {"pipemode==0.1.0", "keras-pipe-train==0.1.0"} <= set(requires)
    assert any(r.startswith("boto3") for r in requires) and any(r.startswith("sagemaker") for r in requires)
    assert "keras_pipe_launch/sample_data/digits.npz" in files  # the demo's data ships with it
    with zipfile.ZipFile(next((tmp_path / "launch").glob("keras_pipe-*.whl"))) as z:
        entry_points = z.read(next(n for n in z.namelist() if n.endswith("entry_points.txt"))).decode()
    assert "keras-pipe = keras_pipe_launch.__main__:run" in entry_points


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
                "--no-index", "--no-deps", *map(str, wheels)], 300).check_returncode()
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
    for name in ("local", "submit", "tune", "prepare"):
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


def test_the_reader_imports_nothing_of_the_job_or_the_launcher():
    script = ("import sys, pipemode, pipemode.dataset\n"
              "from pipemode import PipeModeDataset, reader_error, PipeModeDatasetException\n"
              "print(sorted(m for m in sys.modules if m.startswith(('keras_pipe', 'train', 'launch'))))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


# --- a user's own train.py in script mode, as in AWS's TensorFlow images ------------------------

USER_SCRIPT = r'''
"""A user's script-mode entry point, named as SageMaker's examples name it."""
import argparse, json, os
import keras
import tensorflow as tf
from pipemode import PipeModeDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batch-size", type=int, default=32)
args, _ = parser.parse_known_args()

features = {"x": tf.io.FixedLenFeature([4], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}

def parse(batch):
    parsed = tf.io.parse_example(batch, features)
    return parsed["x"], parsed["y"]

train = PipeModeDataset("train", record_format="TFRecord", batch_size=args.batch_size).map(parse)

class CountBatches(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.batches = 0
    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
    def on_epoch_end(self, epoch, logs=None):
        seen.append(self.batches)

seen = []
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input([4]), keras.layers.Dense(2, activation="softmax")])
model.compile(optimizer=keras.optimizers.Adam(0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(train, epochs=args.epochs, callbacks=[CountBatches()], verbose=2)
with open(os.path.join(os.environ["SM_MODEL_DIR"], "result.json"), "w") as f:
    json.dump({"batches": seen, "accuracy": history.history["accuracy"],
               "pipemode": __import__("pipemode").__file__}, f)
'''


@pytest.mark.slow
def test_users_train_py_runs_under_the_sagemaker_training_toolkit(tmp_path, job):
    if not TOOLKIT_PYTHON.exists():
        pytest.skip(f"{TOOLKIT_PYTHON} is missing: `make test` creates it (requirements/toolkit.txt)")
    import numpy as np
    import tensorflow as tf

    from pipemode import tfrecord

    # the source_dir a user uploads: train.py and a requirements.txt naming the reader's wheel
    # (offline here: --no-index; on SageMaker, `pipemode` from an index or the wheel file itself)
    code = tmp_path / "code"
    code.mkdir()
    wheel = build_wheel("train/pipemode", tmp_path / "wheels")
    shutil.copy(wheel, code)
    (code / "train.py").write_text(USER_SCRIPT)
    (code / "requirements.txt").write_text(f"--no-index\n./{wheel.name}\n")
    # a fresh install each run: nothing of an earlier one, nothing of this project's venv
    run_logged([str(TOOLKIT_PYTHON), "-m", "pip", "uninstall", "--quiet", "--yes", "pipemode"], 120)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    examples = [tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))})).SerializeToString()
        for row, label in zip(x, y)]
    job.add_channel("train")
    (job.base / "model").mkdir()  # SageMaker makes it
    container_config.write(job.config_dir, hyperparameters={
        "epochs": "2", "batch-size": "32",
        # what the SDKs send in script mode (JSON-encoded strings)
        "sagemaker_program": json.dumps("train.py"), "sagemaker_submit_directory": json.dumps(str(code))},
        resources=container_config.resource_config("localhost", ["localhost"], network_interface="lo"))
    feeder = job.feed("train", [job.write("train.tfrecord", tfrecord.encode(examples))], passes=2)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(SAGEMAKER_BASE_DIR=str(job.base), PATH=f"{TOOLKIT_PYTHON.parent}:{env['PATH']}")
    out = run_logged([str(TOOLKIT_PYTHON.parent / "train")], 600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert feeder.wait(timeout=60) == 0
    assert (job.base / "model" / "result.json").exists(), out.stdout[-4000:] + out.stderr[-4000:]
    result = json.loads((job.base / "model" / "result.json").read_text())
    assert result["batches"] == [16, 16]  # two epochs, each one whole pass of 512 records
    assert result["accuracy"][-1] > 0.8
    # the reader came from the wheel installed by the toolkit, not from this checkout
    assert result["pipemode"].startswith(str(TOOLKIT_PYTHON.parent.parent / "lib")), result["pipemode"]
