"""The benchmarks' smallest sizes, run as correctness checks (their timings mean nothing here)."""

import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_pipe_reader_benchmark_runs_and_agrees_with_tfrecorddataset():
    out = subprocess.run([sys.executable, "-m", "bench.pipe_reader", "--quick"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for name in ("100KB", "1KB", "100B"):
        assert f"{name:>6}: pipe-batched =" in out.stdout
    assert "Peak RSS while streaming" in out.stdout
    assert "Resynchronisation after a damaged header (skipping on): random garbage" in out.stdout


@pytest.mark.slow
def test_input_pipeline_benchmark_runs_and_all_pipelines_agree():
    out = subprocess.run([sys.executable, "-m", "bench.input_pipeline", "--quick"], cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "pipe / files =" in out.stdout and "of step time waiting for input" in out.stdout


@pytest.mark.slow
def test_photo_pipeline_benchmark_runs_every_pipeline_and_the_loop_comparison():
    out = subprocess.run([sys.executable, "-m", "bench.photo_pipeline", "--quick"], cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    for photos in ("500x375", "2000x1500", "4032x3024"):
        assert f"{photos:>10}: job / per-example =" in out.stdout
    assert "steps_per_execution=8: ours" in out.stdout and "ours / keras =" in out.stdout
