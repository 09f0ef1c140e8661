"""The reader as users install it: its wheel, alone, with the dependencies it declares and nothing of
the job or the launcher; its compiled part built where it can be; and the reader inside a user's
own script, run by AWS's sagemaker-training toolkit as AWS's TensorFlow images run it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from pipemode import tfrecord
from tests.conftest import REPO, run_logged
from tests.timeouts import wait_s
from tests.wheels import build_wheel, metadata

TOOLKIT_PYTHON = REPO / ".venv-toolkit" / "bin" / "python"


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


@pytest.mark.slow
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
    job.write_config(hyperparameters={
        "epochs": "2", "batch-size": "32",
        # what the SDKs send in script mode (JSON-encoded strings)
        "sagemaker_program": json.dumps("train.py"), "sagemaker_submit_directory": json.dumps(str(code))},
        resourceconfig={"current_host": "localhost", "hosts": ["localhost"], "network_interface_name": "lo",
                        "current_instance_type": "local", "current_group_name": "homogeneousCluster",
                        "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": "local",
                                             "hosts": ["localhost"]}]})
    feeder = job.feed("train", [job.write("train.tfrecord", tfrecord.encode(examples))], passes=2)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(SAGEMAKER_BASE_DIR=str(job.base), PATH=f"{TOOLKIT_PYTHON.parent}:{env['PATH']}")
    out = run_logged([str(TOOLKIT_PYTHON.parent / "train")], 270, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert feeder.wait(timeout=wait_s(60)) == 0
    assert (job.base / "model" / "result.json").exists(), out.stdout[-4000:] + out.stderr[-4000:]
    result = json.loads((job.base / "model" / "result.json").read_text())
    assert result["batches"] == [16, 16]  # two epochs, each one whole pass of 512 records
    assert result["accuracy"][-1] > 0.8
    # the reader came from the wheel installed by the toolkit, not from this checkout
    assert result["pipemode"].startswith(str(TOOLKIT_PYTHON.parent.parent / "lib")), result["pipemode"]
