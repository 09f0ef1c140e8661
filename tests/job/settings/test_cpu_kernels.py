"""TensorFlow's CPU kernels are the job's choice (settings/cpu_kernels.py), whatever the shell said:
checked in fresh processes, where TensorFlow reads the choice when it is imported."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from keras_pipe_train.settings import cpu_kernels

IS_X86 = platform.machine() in cpu_kernels.MACHINES


def onednn_in_a_process(given: str | None, job: str = "") -> tuple[str, bool]:
    """(what choose() says, whether TensorFlow then runs oneDNN) in a process started with
    TF_ENABLE_ONEDNN_OPTS=`given` (None: unset), choose's arguments `job`."""
    env = {k: v for k, v in os.environ.items() if k != cpu_kernels.VARIABLE}
    if given is not None:
        env[cpu_kernels.VARIABLE] = given
    code = (f"from keras_pipe_train.settings.cpu_kernels import choose; print(choose({job}))\n"
            "from tensorflow.python.util import _pywrap_util_port; print(_pywrap_util_port.IsMklEnabled())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout.splitlines()
    return out[0], out[1] == "True"


@pytest.mark.slow
@pytest.mark.parametrize("given", [None, "0", "1", "false"])
def test_the_job_runs_onednn_on_x86_whatever_the_environment_said(given):
    said, on = onednn_in_a_process(given)
    if not IS_X86:  # (on Arm TensorFlow's own choice stands: the environment's, or its default)
        assert "TensorFlow's choice" in said
        return
    assert on, said
    assert said.startswith("CPU kernels: oneDNN on every x86-64 CPU (TF_ENABLE_ONEDNN_OPTS=1")
    assert ("from the environment overridden" in said) == (given not in (None, "1")), said


@pytest.mark.slow
def test_asked_after_tensorflow_was_imported_it_says_so():
    code = ("import tensorflow\nfrom keras_pipe_train.settings.cpu_kernels import choose; print(choose())")
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          check=True).stdout
    assert ("too late" in said) == IS_X86, said


@pytest.mark.slow
def test_the_small_mobilenet_of_tiny_images_runs_without_onednn_whatever_the_environment_said():
    said, on = onednn_in_a_process("1", 'backbone="mobilenet_v3_small", image_size=32')
    if IS_X86:
        assert not on and said == ("CPU kernels: oneDNN off for mobilenet_v3_small at 32 px, whose tiny tensors train "
                                   "faster without it (TF_ENABLE_ONEDNN_OPTS=0: docs/speed.md); "
                                   "TF_ENABLE_ONEDNN_OPTS=1 from the environment overridden"), said


@pytest.mark.parametrize(("backbone", "image_size", "chosen"), [
    ("mobilenet_v3_small", 32, "0"), ("mobilenet_v3_small", 64, "0"), ("mobilenet_v3_small", 96, "1"),
    ("mobilenet_v3_small", 224, "1"), ("resnet18", 32, "1"), ("mobilenet_v2", 32, "1"), (None, None, "1"),
])
def test_onednn_is_on_but_for_the_small_mobilenet_at_64_px_or_less(backbone, image_size, chosen):
    """The rule, measured (docs/speed.md: oneDNN and XLA on CPUs): on for every backbone and size
    but mobilenet_v3_small at 64 px or less; the server (no backbone given) on."""
    environ: dict[str, str] = {}
    said = cpu_kernels.choose(environ, backbone, image_size)
    if IS_X86:
        assert environ == {cpu_kernels.VARIABLE: chosen}, said
    else:
        assert environ == {} and "TensorFlow's choice" in said
