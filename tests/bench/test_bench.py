"""The benchmarks' smallest sizes, run as correctness checks (their timings mean nothing here)."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, run_logged


def quick_run(benchmark: str) -> str:
    """The benchmark's --quick run's output, once it exited 0."""
    out = run_logged([sys.executable, "-m", f"bench.{benchmark}", "--quick"], 270, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.slow
def test_pipe_reader_benchmark_runs_and_agrees_with_tfrecorddataset():
    out = quick_run("pipe_reader")
    for name in ("100KB", "1KB", "100B"):
        assert f"{name:>6}: pipe-batched =" in out
    assert "Peak RSS while streaming" in out
    assert "Resynchronisation after a damaged header (skipping on): random garbage" in out


@pytest.mark.slow
def test_input_pipeline_benchmark_runs_and_all_pipelines_agree():
    out = quick_run("input_pipeline")
    assert "pipe / files =" in out and "of step time waiting for input" in out


@pytest.mark.slow
def test_photo_pipeline_benchmark_runs_every_pipeline_and_the_loop_comparison():
    out = quick_run("photo_pipeline")
    for photos in ("500x375", "2000x1500", "4032x3024"):
        assert f"{photos:>10}: job / per-example =" in out
    assert "steps_per_execution=8: ours" in out and "ours / keras =" in out


@pytest.mark.slow
def test_prepare_at_scale_benchmark_runs_and_every_run_makes_the_same_examples():
    out = quick_run("prepare_at_scale")  # (it asserts the example counts agree)
    for run in ("one machine", "one machine, no dups", "2 instances", "2 instances, no dups"):  # (--quick: no 1 instance)
        assert re.search(rf"^{run} +20 ", out, re.M), out
    assert "s per 1000 photos" in out


def test_the_resync_benchmark_runs_both_ways():
    out = quick_run("resync")
    assert "random bytes" in out and "decoding 500 damaged headers" in out and "pure Python" in out


def test_the_aws_comparison_says_how_to_set_up_what_it_lacks(tmp_path):
    """bench.vs_aws needs AWS's reader in its own venv (bench/aws/setup.sh), never CI's."""
    out = subprocess.run([sys.executable, "-m", "bench.vs_aws", "--runs", "1"], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "ANCHOR_DIR": str(tmp_path)})
    assert out.returncode == 2
    assert f"missing {tmp_path}/pmd/bin/python" in out.stderr and "run `bash bench/aws/setup.sh` once" in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["batched", "drop-in"])
@pytest.mark.parametrize("autotune", [False, True], ids=["autotune-off", "autotune-on"])
def test_the_aws_comparison_times_pipemode_over_a_fifo_fed_by_cat(tmp_path, mode, autotune):
    """bench/aws/read_fifo.py, pipemode's side of the comparison (AWS's side needs its TF 2.14 venv),
    on records made by bench/aws/make_records.py: every record read, whole."""
    data = tmp_path / "records.tfrecord"
    subprocess.run([sys.executable, str(REPO / "bench/aws/make_records.py"), str(data), "3000", "100"], check=True,
                   capture_output=True, timeout=60)
    assert data.stat().st_size == 3000 * (100 + 16)
    out = subprocess.run([sys.executable, str(REPO / "bench/aws/read_fifo.py"), "pipemode", str(data), mode,
                          str(REPO / "train/pipemode"), *(["--autotune"] if autotune else [])],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["records"], result["bytes"]) == (3000, 3000 * 100) and result["seconds"] > 0


@pytest.mark.slow
def test_serve_benchmark_loads_the_server_pings_it_and_compares_it_with_its_ceiling():
    out = quick_run("serve")
    assert re.search(r"in-process, images/s: batches of 1 [\d.]+, batches of 8 [\d.]+, batches of 32 [\d.]+", out), out
    # (--quick: the server's defaults at every load; a worker per core at one, batching off not at all)
    for label, loads in (("server", ((1, 1), (8, 1), (1, 32), (8, 32))), ("a worker per core", ((8, 1),))):
        for clients, images in loads:
            line = re.search(rf"{label}, +{clients} client\(s\) x +{images} image\(s\): +[\d.]+ requests/s, .* "
                             rf"of in-process batches of 32; /ping p50 .*, (\d+) of (\d+) over 2 s", out)
            assert line and int(line[2]) > 0, (label, clients, images, out)
        assert re.search(rf"{label}: each worker's PSS after the load: \d+ MB.*; SIGTERM: exit code 0", out), out
    # (a worker per core: a PSS for each worker, as many as cores, and CI's machines have 2 or more)
    assert re.search(r"a worker per core: each worker's PSS after the load: \d+ MB(, \d+ MB)+ \(", out), out
    assert out.count("8 single-image clients:") == 2 and "x one image at a time in-process" in out
    assert "batching off: not measured by --quick" in out and "batching off, " not in out
    assert re.search(r"a request of 100 images, one a model call, past SAGEMAKER_MODEL_SERVER_TIMEOUT=1: answered "
                     r"(200|504) after [\d.]+ s; then /ping 200, a one-image request 200", out), out
    for count in (1, 2):  # (the multi-model endpoint: --quick loads 2)
        assert re.search(rf"multi-model, {count} model\(s\), 4 single-image clients: +[\d.]+ requests/s", out), out
    assert re.search(r"multi-model: the first POST /models took [\d.]+ m?s .* the others [\d.]+ m?s .*, each model's "
                     r"first answer [\d.]+ m?s .*; SIGTERM: exit code 0", out), out
    assert re.search(r"multi-model: the worker's PSS with 1 model \d+ MB, with 2 \d+ MB .* after unloading all", out), out
    # the runtimes: each load on both servers, their ratio, and both stopped cleanly
    for clients, images in ((1, 1), (8, 1), (1, 32)):
        for runtime in ("TensorFlow", "ONNX Runtime"):
            assert re.search(rf"^ *{runtime}, +{clients} client\(s\) x +{images} image\(s\): +[\d.]+ images/s ± \d+%, "
                             rf"p50 .*, p99 ", out, re.M), (runtime, clients, images, out)
        assert re.search(rf"^  {clients} client\(s\) x {images} image\(s\): ONNX Runtime / TensorFlow = [\d.]+x$", out,
                         re.M), out
    assert "SIGTERM: exit codes {'TensorFlow': 0, 'ONNX Runtime': 0}" in out, out
    # the crowds: each scenario's row (pings, 200s, the stalled uploads' 408s, no connection failed),
    # the bad clients' waits and closes in the notes
    for scenario, stalled in (("80 clients", 0), ("8 stalled, 30 lingering, 2 clients", 8)):
        crowd = re.search(rf"^{re.escape(scenario)} +\| .* \d+/(\d+) \| +(\d+) +\d+ +(\d+) +\d+ +\d+ +(\d+) \|",
                          out, re.M)
        assert crowd and int(crowd[1]) > 0 and int(crowd[2]) > 0, (scenario, out)
        assert int(crowd[3]) >= stalled and int(crowd[4]) == 0, (scenario, out)  # (408s; errors)
    assert re.search(r"stalled uploads answered, after [\d.]+ to [\d.]+ s from their headers", out), out
    assert re.search(r"30 lingering connections, of which the server closed its end of \d+", out), out
    assert re.search(r"the worker's PSS after each scenario: \d+, \d+ MB; SIGTERM: exit code 0", out), out
    burst = re.search(r"40 clients, timeout 1 s +\| +[\d.]+/s \| +(\d+) +(\d+) +(\d+) +(\d+) \| +\d+% \|", out)
    assert burst and int(burst[1]) > 0 and int(burst[4]) == 0, out  # (200s; no status but 200, 503, 504)


@pytest.mark.slow
def test_sources_benchmark_reads_every_source_to_the_same_count():
    out = quick_run("sources")  # (it asserts each source's epoch holds every photo)
    for kind in ("tfrecord-pipe", "tfrecord-file", "class-folders", "manifest-pipe", "mxnet-rec-pipe"):
        assert f"{kind}:" in out and "x tfrecord-pipe" in out


@pytest.mark.slow
def test_label_errors_benchmark_runs_a_flipped_job_and_agrees_with_cleanlab():
    out = quick_run("label_errors")
    # each digit's look-alike is another digit of 5-9
    pairs = re.search(r"look-alikes of systematic flips .*: (\d->\d), (\d->\d), (\d->\d), (\d->\d), (\d->\d)$", out, re.M)
    assert pairs and [p[0] for p in pairs.groups()] == list("56789"), out
    assert all(p[0] != p[-1] and p[-1] in "56789" for p in pairs.groups()), out
    assert "transfer, systematic flips, 10%, seed 0: " in out and "the job's suspects:" in out
    # (the same probabilities, the same method; its suspects are the head of the ranking compared at equal counts)
    assert re.search(r"the same as cleanlab's on 100.0% of images; the self-confidence ranking's first \d+: yes", out)
    equal = re.search(r"at equal counts, .*: k = (\d+) \(planted\) ([0-9.]+) / ([0-9.]+), k = (\d+) \(ours\) .*"
                      r"k = (\d+) \(prune_by_noise_rate's\)", out)
    assert equal and int(equal[1]) > 0, out
    assert re.search(r"average precision [0-9.]+ / [0-9.]+; the most recall at P >= 0.6: [0-9.]+ / [0-9.]+", out)
    assert re.search(r"cost: label check [0-9.]+ s / training [0-9.]+ s = \d+%", out)
    assert re.search(r"calibration \(T = [0-9.]+, 180 validation images\): ECE [0-9.]+ -> [0-9.]+ \([+-][0-9.]+; "
                     r"ECE's sampling sd here [0-9.]+ -> [0-9.]+\)", out), out
    assert re.search(r"perfectly calibrated model would measure .*: [0-9.]+ -> [0-9.]+", out)
    # the seeds' summary: the same figures, in its tables
    assert re.search(rf"^\| transfer, systematic, 10% \| {equal[1]} \| .* \| P [0-9.]+, R [0-9.]+, {equal[4]} \|", out, re.M)
    assert re.search(r"^\| transfer, systematic, 10% \| 180 \| [0-9.]+ \| [0-9.]+ -> [0-9.]+ \| [+-][0-9.]+ \|", out, re.M)


def test_the_label_errors_benchmark_flips_the_same_images_uniformly_or_to_their_look_alikes():
    import numpy as np

    from bench.label_errors import flip, look_alikes

    labels = np.arange(1000) % 4
    uniform, flipped = flip(labels, 4, 0.1, seed=3)
    systematic, same = flip(labels, 4, 0.1, seed=3, look_alike=np.array([1, 0, 3, 2]))
    assert (flipped == same).all() and 60 < flipped.sum() < 140
    assert (uniform[flipped] != labels[flipped]).all() and len(set(uniform[flipped] - labels[flipped])) > 1
    assert (systematic[flipped] == np.array([1, 0, 3, 2])[labels[flipped]]).all()
    assert (uniform[~flipped] == labels[~flipped]).all() and (systematic[~flipped] == labels[~flipped]).all()
    # class 0's images are given 0.3 of class 2, class 2's 0.2 of class 0: 2 is 0's look-alike, and 0 is 2's
    probabilities = np.array([[0.6, 0.1, 0.3], [0.1, 0.8, 0.1], [0.2, 0.15, 0.65]])
    assert look_alikes(probabilities, np.array([0, 1, 2])).tolist() == [2, 2, 0]


def test_the_label_errors_benchmark_scores_a_ranking_at_every_cut():
    import numpy as np

    from bench.label_errors import average_precision, precision_at, recall_at_precision

    order, flips = np.array([3, 0, 1, 2]), np.array([False, False, True, True])  # flip, not, not, flip
    assert precision_at(order, flips, 1) == 1.0 and precision_at(order, flips, 2) == 0.5
    assert average_precision(order, flips) == pytest.approx((1 + 2 / 4) / 2)
    assert recall_at_precision(order, flips, 0.5) == 1.0  # (all four: P 0.5)
    assert recall_at_precision(order, flips, 0.6) == 0.5  # (the first alone)
    assert recall_at_precision(np.arange(4), flips, 0.6) == 0.0  # (not, not, flip, flip: no cut reaches it)


def test_the_ece_floor_is_the_expected_ece_of_a_calibrated_model_on_so_many_images():
    from bench.label_errors import ece_floor

    # two images at 0.5: none, one or both right (1/4, 1/2, 1/4), measured 0.5 off, exactly, or 0.5 off
    assert ece_floor([{"examples": 2, "confidence": 0.5}], draws=200_000) == pytest.approx(0.25, abs=0.003)
    # and a bin always right at 1.0 is measured exactly; the floor is the bins' weighted mean
    assert ece_floor([{"examples": 2, "confidence": 0.5}, {"examples": 6, "confidence": 1.0}],
                     draws=200_000) == pytest.approx(0.25 * 2 / 8, abs=0.003)


def test_ece_s_sampling_spread_is_its_standard_deviation_over_sets_as_right_as_the_one_measured():
    from bench.label_errors import ece_spread

    # two images at 0.5, right half the time: measured 0.5 off (1/4), exactly (1/2), 0.5 off (1/4): sd 0.25
    assert ece_spread([{"examples": 2, "confidence": 0.5, "accuracy": 0.5}], draws=200_000) == pytest.approx(
        0.25, abs=0.003)
    # a bin always right is measured the same on every such set
    assert ece_spread([{"examples": 50, "confidence": 0.9, "accuracy": 1.0}]) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
def test_cpu_kernels_benchmark_measures_each_setting_in_its_own_process_and_compares_their_answers():
    out = quick_run("cpu_kernels")
    assert re.search(r"^CPU: .+, \d+ cores; avx2 (yes|no), .*avx512f (yes|no)", out, re.M), out
    # each setting's process logged TensorFlow's own word on oneDNN: off where the variable is 0
    assert re.search(r"^  oneDNN=1 +oneDNN custom operations are on$", out, re.M), out
    assert re.search(r"^  oneDNN=0 +\(none: oneDNN off\)$", out, re.M), out
    rows = re.findall(r"^tiny \(32 px, 8\) +(default|oneDNN=1|oneDNN=0|XLA|XLA, oneDNN=1) +\|"
                      r"((?: +[\d.]+ ± *\d+% +[\d.]+(?: \|)?){3})$", out, re.M)
    settings = [setting for setting, _ in rows]
    assert settings[:4] == ["default", "oneDNN=1", "oneDNN=0", "XLA"], out
    # the fifth only where TensorFlow leaves oneDNN off by default, and said when left out
    assert ("XLA, oneDNN=1" in settings) != ("not measured, as oneDNN is on by default here" in out), out
    default = [float(x) for x in rows[0][1].replace("|", " ").replace("±", " ").replace("%", " ").split()]
    assert all(rate > 0 for rate in default[0::3]) and default[2::3] == [1.0, 1.0, 1.0], rows[0]
    numerics = re.search(r"^tiny: max \|difference\| of a probability, 32 images, same weights .*oneDNN=1 vs "
                         r"oneDNN=0 ([\d.e+-]+), logits ([\d.e+-]+) \((\d+)% same class\)", out, re.M)
    assert numerics and float(numerics[1]) < 1e-3 and float(numerics[2]) < 1e-3, out


@pytest.mark.slow
def test_onnx_runtime_benchmark_runs_both_runtimes_on_each_batch_and_they_answer_alike():
    out = quick_run("onnx_runtime")
    rows = re.findall(r"^mobilenet_v3_small \(32 px\) b(\d+) +\| TensorFlow +([\d.]+) ± +\d+% \| ONNX Runtime +([\d.]+) "
                      r"± +\d+% \| \(prepare\) +([\d.]+) ± +\d+% \| ONNX Runtime / TensorFlow ([\d.]+)x$", out, re.M)
    assert [int(batch) for batch, *_ in rows] == [1, 8, 32], out
    for _, tf_rate, onnx_rate, prepare_rate, ratio in rows:
        assert float(tf_rate) > 0 and float(onnx_rate) > 0 and float(prepare_rate) > 0
        assert float(ratio) == pytest.approx(float(onnx_rate) / float(tf_rate), abs=0.01)
    numerics = re.search(r"^mobilenet_v3_small: max \|difference\| of a probability ([\d.e+-]+) on 32 images, "
                         r"100% the same class$", out, re.M)
    assert numerics and float(numerics[1]) < 1e-4, out


def test_the_calibration_fit_set_benchmark_compares_the_fits_on_wrong_labels():
    """bench.calibration_fit_set's quick run, and what docs/speed.md reports of its simulations: with
    10 % of the labels wrong the plain fit softens, where the noisy fit keeps the right temperature
    and finds the share; with none wrong they are the same fit; on a weak, overconfident model the
    plain fit on the unsuspected images sharpens it further."""
    from bench.calibration_fit_set import noisy_fit, one

    out = quick_run("calibration_fit_set")
    assert out.count("| right on ~") == 5 and "7% of images confidently wrong" in out, out
    noisy, clean, weak = one(3.0, 2.0, 0.1, seed=0), one(3.0, 2.0, 0.0, seed=0), one(2.0, 2.0, 0.0, seed=0)
    assert noisy["noisy"]["ece"] < 0.02 < 0.1 < noisy["plain"]["ece"] and abs(noisy["label_noise"] - 0.1) < 0.02
    assert noisy["noisy"]["T"] == pytest.approx(2.0, rel=0.15) and noisy["plain"]["T"] > 3
    assert clean["noisy"]["T"] == pytest.approx(clean["plain"]["T"], rel=1e-3) and clean["label_noise"] == 0
    assert weak["unsuspected"]["ece"] > 0.15 > 0.03 > weak["plain"]["ece"]
    # (the noisy fit's failure on real networks: a model whose few mistakes are all confident, and no
    # label wrong, is taken for a perfect one with its mistakes for wrong labels, sharpened to the bound)
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 5, 90)
    logits = np.eye(5)[truth] * 6 + rng.normal(0, 1, (90, 5))
    logits[:6] = np.roll(np.eye(5)[truth[:6]], 1, axis=1) * 6  # (6 confident mistakes)
    temperature, share = noisy_fit(logits, truth)
    assert temperature < 0.1 and share == pytest.approx(6 / 90, abs=0.01)
