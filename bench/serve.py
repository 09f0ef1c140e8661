"""The served model under load: requests per second, latency and /ping's latency of `serve` (the
image's server, started as the installed `keras-pipe-serve`), against the model called in this
process on the same number of TensorFlow threads, its ceiling.

    python -m bench.serve            # ~16 minutes on 2 cores: all of it
    python -m bench.serve --overload # ~4 minutes: the bursts beyond capacity alone
    python -m bench.serve --multi-model  # ~2 minutes: a multi-model endpoint alone
    python -m bench.serve --runtimes # ~5 minutes: the server on TensorFlow and on ONNX Runtime alone
    python -m bench.serve --crowds   # ~6 minutes: the crowds, bad clients and bursts beyond capacity alone
    python -m bench.serve --quick    # tiny: a correctness check, not a benchmark (with --crowds too)

The model is the job's export of mobilenet_v3_small at 224x224 (random weights: the cost is the
same), 10 classes. Each image is one photo of 500x375 pixels, JPEG quality 90; a request holds one
(application/x-image) or 32 (application/json, TF Serving's {"instances": [{"b64": ...}]}), sent
back to back by each client over a kept-alive connection, as SageMaker's front end sends them.
  in-process   Predictor.predict on 1 image at a time, and on batches of 8 and 32: images/s, on
               as many TensorFlow threads as the server's worker has
  server       its defaults, by 1, 2, 8 and 32 clients at once, for each request size: requests/s,
               images/s, p50 and p99 latency; meanwhile /ping on a new connection every 0.1 s, as
               SageMaker's health check comes, from a process of its own: p50, p99, max and how many took over
               2 s
  compared     at 1 and 8 single-image clients, 1 client and 32 clients of 32 images: batching
               off (KERAS_PIPE_MAX_BATCH=1), and a worker per core (SAGEMAKER_MODEL_SERVER_WORKERS
               set to the cores) instead of one worker calling its model from a thread per core
And the workers' PSS (each one's own memory plus its share of what it shares) after each load: a
leak would show as growth from load to load.
  multi-model  SAGEMAKER_MULTI_MODEL=true: the model loaded under 1, 4 and 10 names, each with
               classes of its own (POST /models and its first answer, timed: it must name its
               own classes), 10 single-image clients, client i asking model i mod N: as
               `server` rows, with the worker's PSS; then DELETE of each, timed, and the PSS
               after
  runtimes     the server with its defaults (the SavedModel in TensorFlow), and with
               KERAS_PIPE_RUNTIME=onnx (its ONNX export, made as `keras-pipe export` makes it, in
               ONNX Runtime), by 1, 8 and 32 single-image clients, then 1 client of 32 images: the
               batches the server forms for them; each load run on one server, then the other, in
               turn, REPEATS times (the machine's drift hits both alike): images/s (median, and
               half the range), p50 and p99 latency of the median run, and ONNX Runtime's images/s
               against TensorFlow's
  crowds       crowds and bad clients (bench.crowds: one event loop in a process of its own)
               against one server with its defaults, each scenario for CROWD_S, /ping polled as
               above: 100, then 300 kept-alive single-image clients; 80 stalled uploads (headers
               and half the body, then silence until answered, then again) beside 8 clients; 300
               lingering closes (Connection: close, a /ping or an image in turn, evenly over the
               time, each connection never closed by the client) beside 8 clients. A client sends
               its next request as soon as it has its answer, after a 503 too, without waiting
               out its Retry-After: SageMaker's front end does not retry by itself, and a caller
               that does not back off is the harsher load. A row each: /ping p50, p99, max and how
               many over 2 s or unanswered; the answers by status (error: the connection failed,
               or no answer in the timeout + GRACE_S), whenever they came; images/s of the 200s
               within the time; the slowest answer from its sending (its connection's opening
               included, where it opened one), of the kept-alive clients and of the bad ones; the
               CPU of the worker and of the clients' process (of a core). The goal: /ping p99
               under 100 ms and max under 2 s, no answer later than SAGEMAKER_MODEL_SERVER_TIMEOUT
               + 1 s (its default, 60 s: printed).
  overload     bursts beyond capacity, each on a server of its own, of kept-alive clients of single
               photos the model takes about 0.3 s each (a 48-megapixel PNG: a slow model's pace):
               300 clients at SAGEMAKER_MODEL_SERVER_TIMEOUT=5, for CROWD_S; and 400 at the
               default 60 s timeout, for SLOW_OVERLOAD_S, long enough for a first-in, first-out
               queue to pass its timeout. Before each, 8 clients for CROWD_S on the same server:
               its capacity. A row each: the answers by status, goodput (images/s answered 200
               within the time, against the capacity), the 503s' p50/p99/max seconds, the
               slowest answer, /ping p99. The goal: goodput at least 80 % of the capacity,
               refusals within 50 ms, no answer later than the timeout + 1 s, /ping p99 under
               100 ms.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.crowds import QUICK_SCENARIOS, SCENARIOS, Scenario
from bench.crowds import settings as crowd_settings
from bench.input_pipeline import synthetic_photo

CLASSES = [f"class{i}" for i in range(10)]
PING_EVERY_S = 0.1
PING_LIMIT_S = 2.0  # SageMaker's: a ping unanswered in 2 s counts against the instance
PING_P99_GOAL_S = 0.1
CROWD_S = 25.0  # each crowd's seconds (--quick: QUICK_CROWD_S)
QUICK_CROWD_S = 2.0  # (still some 20 pings, one every PING_EVERY_S, in each scenario)
GRACE_S = 5.0  # a crowd's request unanswered this long past the server's timeout is given up
SLOW_OVERLOAD_S = 90.0  # the slow photos' burst: past the 60 s a first-in, first-out queue would build
GOODPUT_GOAL = 0.8
REFUSAL_GOAL_S = 0.05


# the runtimes' loads, each run on one server then the other this many times (--runtimes)
RUNTIME_REPEATS = 3

def exported(folder: Path, quick: bool) -> Path:
    import keras

    from keras_pipe_train.model import classifier as M
    from keras_pipe_train.model.export import export

    keras.utils.set_random_seed(1)
    size = 32 if quick else 224
    if quick:  # (a one-convolution backbone: the machinery, not the model, is checked)
        backbone = keras.Sequential([keras.Input((size, size, 3)), keras.layers.Conv2D(8, 3, strides=2)], name="tiny")
    else:
        backbone = M.build_backbone("mobilenet_v3_small", size, None)
    classifier = M.build_classifier("mobilenet_v3_small", backbone, len(CLASSES), 0.0, batchnorm_frozen=False)
    export(classifier, CLASSES, size, folder)
    return folder


def photo() -> bytes:
    import tensorflow as tf

    return tf.io.encode_jpeg(synthetic_photo(np.random.default_rng(0), 375, 500), quality=90).numpy()


def cores() -> int:
    return len(os.sched_getaffinity(0))


def in_process(model: Path, jpeg: bytes, seconds: float) -> dict[int, float]:
    """Images per second of Predictor.predict on batches of 1, 8 and 32, on the threads a lone
    server worker gets: all the cores, TensorFlow's default in this process (which has run the
    export already, so its thread counts are set)."""
    from keras_pipe_serve.predictor import Predictor

    predictor = Predictor(model)
    rates = {}
    for size in (1, 8, 32):
        predictor.predict([jpeg] * size)  # (the first call of a shape traces)
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            predictor.predict([jpeg] * size)
            calls += 1
        rates[size] = calls * size / (time.perf_counter() - started)
    return rates


def ping(port: int, timeout: float) -> float | None:
    """Seconds /ping took on a new connection, or None (no 200 within `timeout`)."""
    started = time.perf_counter()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        connection.request("GET", "/ping")
        answer = connection.getresponse()
        answer.read()
        connection.close()
    except OSError:
        return None
    return time.perf_counter() - started if answer.status == 200 else None


def pings(port: int, seconds: float) -> None:
    """`--ping PORT SECONDS`: /ping every PING_EVERY_S for that long; prints each one's seconds (null:
    no 200) as a JSON list."""
    took, until = [], time.monotonic() + seconds
    while time.monotonic() < until:
        took.append(ping(port, PING_LIMIT_S * 5))
        time.sleep(PING_EVERY_S)
    print(json.dumps(took))


class Served:
    """`keras-pipe-serve` on a free port of 127.0.0.1, as the tests start it."""

    def __init__(self, model: Path, log: Path, **env: str):
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        serve = str(Path(sys.executable).parent / "keras-pipe-serve")
        self.log = log
        self.process = subprocess.Popen([serve, "--model-dir", str(model), "--host", "127.0.0.1"],
                                        env={**os.environ, "SAGEMAKER_BIND_TO_PORT": str(self.port), **env},
                                        stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"serve exited {self.process.returncode}: {log.read_text()[-2000:]}")
            if self.ping(5) is not None:
                return
            time.sleep(0.5)
        raise SystemExit(f"serve did not answer /ping in 300 s: {log.read_text()[-2000:]}")

    def ping(self, timeout: float) -> float | None:
        return ping(self.port, timeout)

    def pinger(self, seconds: float) -> subprocess.Popen:
        """/ping polled for `seconds` (`--ping`; its figures: pinged) from a process of its own, as
        SageMaker's health check comes from outside: clients in this process would otherwise add
        their own waits for its GIL."""
        return subprocess.Popen([sys.executable, "-m", "bench.serve", "--ping", str(self.port), str(seconds)],
                                stdout=subprocess.PIPE, text=True)

    def load(self, body: bytes, kind: str, clients: int, seconds: float, paths: tuple[str, ...] = ("/invocations",)
             ) -> dict:
        """`clients` connections sending `body` back to back for `seconds` (client i to paths[i], in
        turn), /ping polled meanwhile: requests/s and the latencies of requests and pings."""
        latencies: list[float] = []
        failures: list[str] = []
        stop = threading.Event()

        def client(path: str):
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            while not stop.is_set():
                started = time.perf_counter()
                connection.request("POST", path, body, {"Content-Type": kind})
                answer = connection.getresponse()
                text = answer.read()
                if answer.status != 200:
                    failures.append(f"{answer.status}: {text[:200]!r}")
                    break
                latencies.append(time.perf_counter() - started)
            connection.close()

        threads = [threading.Thread(target=client, args=(paths[i % len(paths)],)) for i in range(clients)]
        pinger = self.pinger(seconds)
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        stop.set()
        count = len(latencies)  # (requests finished within the time)
        elapsed = time.perf_counter() - started
        for thread in threads:
            thread.join()
        pings = pinged(pinger)
        if failures:
            raise SystemExit(f"/invocations failed: {failures[0]}; log: {self.log.read_text()[-2000:]}")
        return {"rate": count / elapsed, "latencies": latencies, "pings": pings}

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, float]:
        """(status, seconds) of one request on a new connection."""
        status, took, _ = self.asked(path, body, "application/json" if body else None, method)
        return status, took

    def asked(self, path: str, body: bytes | None, kind: str | None, method: str = "POST") -> tuple[int, float, bytes]:
        """(status, seconds, answer) of one request of `body` (of Content-Type `kind`) on a new connection."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        started = time.perf_counter()
        connection.request(method, path, body, {"Content-Type": kind} if kind else {})
        answer = connection.getresponse()
        text = answer.read()
        connection.close()
        return answer.status, time.perf_counter() - started, text

    def workers(self) -> list[str]:
        return subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True).stdout.split()

    def worker_pss_mb(self) -> list[float]:
        sizes = []
        for pid in self.workers():
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            sizes.append(next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")) / 1024)
        return sizes

    def worker_cpu_s(self) -> float:
        """The CPU seconds the workers have used, all their threads."""
        used = 0
        for pid in self.workers():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            used += int(fields[11]) + int(fields[12])  # (utime and stime, the stat's 14th and 15th)
        return used / os.sysconf("SC_CLK_TCK")

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(timeout=60)


def pinged(pinger: subprocess.Popen) -> list[float]:
    """The seconds of each ping of a Served.pinger, once it ends (inf: no 200)."""
    return [float("inf") if took is None else took for took in json.loads(pinger.communicate()[0])]


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def ms(seconds: float) -> str:
    return "never" if seconds == float("inf") else f"{seconds * 1000:.0f} ms" if seconds >= 0.1 else \
        f"{seconds * 1000:.1f} ms"


def row(label: str, result: dict, images: int, ceiling: float | None = None) -> str:
    latencies, pings = result["latencies"], result["pings"]
    line = (f"{label}: {result['rate']:6.1f} requests/s, {result['rate'] * images:6.1f} images/s, "
            f"p50 {ms(percentile(latencies, 50))}, p99 {ms(percentile(latencies, 99))}")
    if ceiling:
        line += f", {result['rate'] * images / ceiling:.2f} of in-process batches of 32"
    p50, p99, most, slow = ping_figures(pings)
    return line + f"; /ping p50 {ms(p50)}, p99 {ms(p99)}, max {ms(most)}, {slow} of {len(pings)} over 2 s"


def ping_figures(pings: list[float]) -> tuple[float, float, float, int]:
    """p50, p99, max, and how many over PING_LIMIT_S (unanswered included)."""
    return percentile(pings, 50), percentile(pings, 99), max(pings), sum(took > PING_LIMIT_S for took in pings)


def past_the_timeout(model: Path, log: Path, jpeg: bytes, count: int) -> None:
    """How soon after SAGEMAKER_MODEL_SERVER_TIMEOUT=1 a request that needs longer is answered
    (504), and the server's next answers."""
    served = Served(model, log, SAGEMAKER_MODEL_SERVER_TIMEOUT="1", KERAS_PIPE_MAX_BATCH="1",
                    SAGEMAKER_MAX_PAYLOAD_IN_MB="100")
    try:
        body = json.dumps({"instances": [{"b64": base64.b64encode(jpeg).decode()}] * count}).encode()
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=120)
        started = time.perf_counter()
        connection.request("POST", "/invocations", body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        answer.read()
        took = time.perf_counter() - started
        pinged = served.ping(5)
        connection.request("POST", "/invocations", jpeg, {"Content-Type": "application/x-image"})
        after = connection.getresponse()
        after.read()
    finally:
        served.stop()
    print(f"a request of {count} images, one a model call, past SAGEMAKER_MODEL_SERVER_TIMEOUT=1: answered "
          f"{answer.status} after {took:.2f} s; then /ping {'200' if pinged is not None else 'failed'}, a one-image "
          f"request {after.status}")


def throughput(model: Path, work: Path, jpeg: bytes, quick: bool) -> None:
    """The in-process ceiling, the server by clients and request sizes beside it, batching off, a
    worker per core, and a request past the timeout."""
    seconds = 0.75 if quick else 8.0  # (--quick: each load long enough for a few pings, every 0.1 s)
    warm_s = 0.5 if quick else 2.0
    client_counts = (1, 8) if quick else (1, 2, 8, 32)
    bodies = {1: (jpeg, "application/x-image"),
              32: (json.dumps({"instances": [{"b64": base64.b64encode(jpeg).decode()}] * 32}).encode(),
                   "application/json")}
    ceiling = in_process(model, jpeg, seconds)
    print("in-process, images/s: " + ", ".join(f"batches of {size} {rate:.1f}" for size, rate in ceiling.items())
          + f"; batches of 32 / one at a time = {ceiling[32] / ceiling[1]:.2f}")

    def measured(label: str, rows: list[tuple[int, int]], **env: str) -> None:
        served = Served(model, work / f"serve-{label}.log", **env)
        try:
            for images in sorted({images for images, _ in rows}):  # (warm: threads started, memory taken)
                served.load(*bodies[images], max(clients for _, clients in rows), warm_s)
            after = []  # (the workers' memory after each load: a leak shows as growth load after load)
            for images, clients in rows:
                result = served.load(*bodies[images], clients, seconds)
                after.append(sum(served.worker_pss_mb()))
                print(row(f"{label}, {clients:2d} client(s) x {images:2d} image(s)", result, images, ceiling[32]))
                if images == 1 and clients >= 8:
                    print(f"  {clients} single-image clients: {result['rate'] / ceiling[1]:.2f} x one image at a "
                          f"time in-process")
            pss = served.worker_pss_mb()
        finally:
            code = served.stop()
        print(f"{label}: each worker's PSS after the load: {', '.join(f'{m:.0f} MB' for m in pss)} "
              f"(all workers after each load: {', '.join(f'{m:.0f}' for m in after)} MB); "
              f"SIGTERM: exit code {code}")

    measured("server", [(images, clients) for images in (1, 32) for clients in client_counts])
    compared = [(1, 1), (1, 8), (32, 1), (32, client_counts[-1])]
    if quick:  # (a server booted is most of a configuration's cost: the workers', by one load, checked alone)
        print("batching off: not measured by --quick (the request past the timeout below is served with "
              "KERAS_PIPE_MAX_BATCH=1)")
        measured("a worker per core", [(1, 8)], SAGEMAKER_MODEL_SERVER_WORKERS=str(cores()))
    else:
        measured("batching off", compared, KERAS_PIPE_MAX_BATCH="1")
        measured("a worker per core", compared, SAGEMAKER_MODEL_SERVER_WORKERS=str(cores()))
    past_the_timeout(model, work / "serve-timeout.log", jpeg, 100 if quick else 400)


def runtimes(model: Path, work: Path, jpeg: bytes, quick: bool) -> None:
    """The server on the SavedModel and on its ONNX export (KERAS_PIPE_RUNTIME=onnx), load by load
    in turn, REPEATS times."""
    from keras_pipe_train.after_training.folder_exports import export_folder

    export_folder(model, ("onnx",), [], model / "exports")
    seconds, warm_s, repeats = (0.75, 0.5, 1) if quick else (8.0, 2.0, RUNTIME_REPEATS)
    loads = [(1, 1), (1, 8), (32, 1)] if quick else [(1, 1), (1, 8), (1, 32), (32, 1)]
    bodies = {1: (jpeg, "application/x-image"),
              32: (json.dumps({"instances": [{"b64": base64.b64encode(jpeg).decode()}] * 32}).encode(),
                   "application/json")}
    servers = {"TensorFlow": Served(model, work / "serve-tensorflow.log")}
    try:
        servers["ONNX Runtime"] = Served(model, work / "serve-onnx.log", KERAS_PIPE_RUNTIME="onnx")
        for served in servers.values():  # (warm: threads started, memory taken, each batch size traced)
            for images, clients in loads:
                served.load(*bodies[images], clients, warm_s)
        for images, clients in loads:
            found = {name: [] for name in servers}
            for _ in range(repeats):
                for name, served in servers.items():
                    found[name].append(served.load(*bodies[images], clients, seconds))
            rates = {}
            for name, results in found.items():
                ranked = sorted(results, key=lambda result: result["rate"])
                median = ranked[len(ranked) // 2]
                rates[name] = median["rate"] * images
                spread = (ranked[-1]["rate"] - ranked[0]["rate"]) / 2 / median["rate"]
                print(f"{name:>12}, {clients:2d} client(s) x {images:2d} image(s): {rates[name]:6.1f} images/s "
                      f"± {spread:.0%}, p50 {ms(percentile(median['latencies'], 50))}, "
                      f"p99 {ms(percentile(median['latencies'], 99))}")
            print(f"  {clients} client(s) x {images} image(s): ONNX Runtime / TensorFlow = "
                  f"{rates['ONNX Runtime'] / rates['TensorFlow']:.2f}x")
    finally:
        codes = {name: served.stop() for name, served in servers.items()}
    print(f"SIGTERM: exit codes {codes}")


def under_crowds(model: Path, work: Path, jpeg: bytes, quick: bool) -> None:
    """bench.crowds' scenarios one after the other against one server with its defaults, each for
    CROWD_S, its clients in a process of their own and /ping polled from another: a row each, and
    the goal."""
    from keras_pipe_serve.server import settings

    config = settings(["--model-dir", str(model)])  # (what the server takes from this environment)
    timeout, seconds = config["timeout"], QUICK_CROWD_S if quick else CROWD_S
    (work / "photo.jpg").write_bytes(jpeg)
    print(f"\ncrowds: each for {seconds:g} s against one server with its defaults (one worker, "
          f"KERAS_PIPE_MAX_QUEUE {config['max_queue']}), SAGEMAKER_MODEL_SERVER_TIMEOUT {timeout:g} s; "
          f"single images, a client's next request sent at once after any answer, 503 included")
    served = Served(model, work / "serve-crowds.log")
    rows, notes, pss = [], [], []
    try:
        for scenario in QUICK_SCENARIOS if quick else SCENARIOS:
            cpu, started, workers = served.worker_cpu_s(), time.monotonic(), served.workers()
            logged = served.log.stat().st_size
            crowd = subprocess.Popen([sys.executable, "-m", "bench.crowds", crowd_settings(
                scenario, served.port, work / "photo.jpg", seconds, timeout + GRACE_S)], stdout=subprocess.PIPE,
                text=True)
            pings = pinged(served.pinger(seconds))
            server_cpu = (served.worker_cpu_s() - cpu) / (time.monotonic() - started)  # (the pings' time, no drain)
            result = json.loads(crowd.communicate()[0] or "null")
            if crowd.returncode or result is None:
                raise SystemExit(f"bench.crowds failed on {scenario.name!r} (exit code {crowd.returncode})")
            result["server_cpu"] = server_cpu
            rows.append(crowd_row(scenario, pings, result, timeout))
            with open(served.log, "rb") as log:
                log.seek(logged)
                notes.append(crowd_notes(scenario, result, served.workers() != workers,
                                         log.read().decode(errors="replace")))
            pss.append(sum(served.worker_pss_mb()))
            if served.ping(5) is None:
                raise SystemExit(f"serve stopped answering /ping after {scenario.name!r}: "
                                 f"{served.log.read_text()[-2000:]}")
    finally:
        code = served.stop()
    print("\n".join(crowd_table(rows, timeout)))
    print("\n".join(note for note in notes if note))
    print(f"the worker's PSS after each scenario: {', '.join(f'{m:.0f}' for m in pss)} MB; SIGTERM: exit code {code}")


CROWD_COLUMNS = ("{:34} | {:>8} {:>8} {:>8} {:>7} | {:>6} {:>6} {:>5} {:>5} {:>5} {:>5} | {:>8} | {:>22} | "
                 "{:>9} | {}")


def crowd_row(scenario: Scenario, pings: list[float], result: dict, timeout: float) -> tuple:
    p50, p99, most, slow = ping_figures(pings)
    statuses = result["statuses"]
    counted = ("200", "503", "408", "504")
    failed = statuses.get("error", 0) + statuses.get("unanswered", 0)
    other = sum(statuses.values()) - failed - sum(statuses.get(status, 0) for status in counted)
    slowest = result["slowest"]
    bad = scenario.stalled or scenario.lingering
    latest = max(slowest.values())
    missed = [what for what, yes in (("/ping p99", p99 >= PING_P99_GOAL_S), ("/ping max", most >= PING_LIMIT_S),
                                     ("slowest", latest > timeout + 1 or statuses.get("unanswered", 0))) if yes]
    return (scenario.name, ms(p50), ms(p99), ms(most), f"{slow}/{len(pings)}",
            *(statuses.get(status, 0) for status in counted), other, failed, f"{result['images_per_s']:.1f}",
            f"{slowest['clients']:.2f} s, " + (f"{slowest['bad']:.2f} s" if bad else "-").rjust(7),
            f"{result['server_cpu']:.0%}, {result['cpu']:.0%}", "missed: " + ", ".join(missed) if missed else "met")


def crowd_table(rows: list[tuple], timeout: float) -> list[str]:
    return [CROWD_COLUMNS.format("scenario", "/ping p50", "p99", "max", "> 2 s", "200", "503", "408", "504", "other",
                                 "error", "images/s", "slowest: clients, bad", "CPU srv,cl", "goal"),
            *(CROWD_COLUMNS.format(*row) for row in rows),
            CROWD_COLUMNS.format("goal", "", "< 100 ms", "< 2 s", "0", "", "", "", "", "", "", "",
                                 f"<= {timeout + 1:g} s (timeout {timeout:g})", "", "")]


def crowd_notes(scenario: Scenario, result: dict, replaced: bool, log: str) -> str:
    """What the row leaves out: the stalled uploads' waits, the lingering connections closed, and
    what went wrong, with the server's log lines of any answer but 200, 503, 408 and 504 (its
    reason: the app logs each refusal)."""
    notes = []
    unusual = {status: count for status, count in result["statuses"].items()
               if status not in ("200", "503", "408", "504", "error", "unanswered")}
    if unusual:
        reasons = [line for line in log.splitlines() if "ERROR" in line or "Traceback" in line
                   or any(f"keras_pipe_serve: {status} " in line for status in unusual)]
        notes.append("other: " + ", ".join(f"{count} x {status}" for status, count in unusual.items())
                     + "".join(f"\n    {line[:300]}" for line in reasons[:5]))
    if scenario.stalled:
        stalls = result["stalls"]
        notes.append(f"{len(stalls)} stalled uploads answered, " + (
            f"after {stalls[0]:.2f} to {stalls[-1]:.2f} s from their headers" if stalls else "none"))
    if scenario.lingering:
        notes.append(f"{result['lingered']} lingering connections, of which the server closed its end of "
                     f"{result['closed_by_server']}")
    if result["statuses"].get("unanswered"):
        notes.append(f"{result['statuses']['unanswered']} requests unanswered in the timeout + {GRACE_S:g} s")
    if replaced:
        notes.append("the worker was replaced meanwhile (see the server's log)")
    return f"{scenario.name}: {'; '.join(notes)}" if notes else ""


def slow_png() -> bytes:
    """A 48-megapixel PNG of one colour: 150 KB to send, about 0.4 s to decode here, the pace of a
    large model on a CPU instance (tests/serve/test_load.py's slow photo too): a PNG, unlike a
    JPEG, cannot be decoded straight to a smaller size."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8000, 6000), (200, 30, 60)).save(out, "PNG", optimize=True)
    return out.getvalue()


def overloaded(model: Path, work: Path, jpeg: bytes, quick: bool) -> None:
    """The bursts beyond capacity (module docstring: overload), a server of its own for each."""
    slow = slow_png()
    bursts = [("300 clients, timeout 5 s", 300, {"SAGEMAKER_MODEL_SERVER_TIMEOUT": "5"}, slow, CROWD_S),
              ("400 clients, timeout 60 s", 400, {}, slow, SLOW_OVERLOAD_S)]
    if quick:
        bursts = [("40 clients, timeout 1 s", 40, {"SAGEMAKER_MODEL_SERVER_TIMEOUT": "1"}, jpeg, QUICK_CROWD_S)]
    print("\noverload: capacity (8 clients), then a burst, on a server of its own; a client's next request sent at "
          "once after any answer")
    columns = "{:40} | {:>10} | {:>6} {:>6} {:>6} {:>5} | {:>8} | {:>24} | {:>8} | {:>9} | {}"
    print(columns.format("burst", "capacity", "200", "503", "504", "other", "goodput", "503 p50, p99, max",
                         "slowest", "/ping p99", "goal"))
    for name, clients, env, photo, seconds in bursts:
        (work / "burst.photo").write_bytes(photo)
        served = Served(model, work / f"serve-burst-{clients}.log", **env)
        timeout = float(env.get("SAGEMAKER_MODEL_SERVER_TIMEOUT", 60))
        results = []
        try:
            for scenario in (Scenario("capacity", 8), Scenario(name, clients)):
                crowd = subprocess.Popen([sys.executable, "-m", "bench.crowds", crowd_settings(
                    scenario, served.port, work / "burst.photo", seconds, timeout + GRACE_S)], stdout=subprocess.PIPE,
                    text=True)
                pings = pinged(served.pinger(seconds))
                result = json.loads(crowd.communicate()[0] or "null")
                if crowd.returncode or result is None:
                    raise SystemExit(f"bench.crowds failed on {name!r} (exit code {crowd.returncode})")
                results.append((result, pings))
        finally:
            served.stop()
        (capacity, _), (burst, pings) = results
        refused = burst["took"].get("503", [0.0])
        statuses, refusals = burst["statuses"], (percentile(refused, 50), percentile(refused, 99), max(refused))
        goodput = burst["images_per_s"] / capacity["images_per_s"] if capacity["images_per_s"] else 0.0
        latest = max(burst["slowest"].values())
        p99 = ping_figures(pings)[1]
        missed = [what for what, yes in (("goodput", goodput < GOODPUT_GOAL), ("503s", refusals[1] > REFUSAL_GOAL_S),
                                         ("slowest", latest > timeout + 1), ("/ping p99", p99 >= PING_P99_GOAL_S))
                  if yes]
        other = sum(statuses.values()) - sum(statuses.get(status, 0) for status in ("200", "503", "504"))
        print(columns.format(name, f"{capacity['images_per_s']:.1f}/s", statuses.get("200", 0),
                             statuses.get("503", 0), statuses.get("504", 0), other,
                             f"{goodput:.0%}", ", ".join(ms(t) for t in refusals), f"{latest:.2f} s", ms(p99),
                             "missed: " + ", ".join(missed) if missed else "met"))
    print(columns.format("goal", "", "", "", "", "", f">= {GOODPUT_GOAL:.0%}", f"p99 <= {ms(REFUSAL_GOAL_S)}",
                         "<= t + 1", "< 100 ms", ""))


def multi_model(model: Path, work: Path, jpeg: bytes, quick: bool) -> None:
    """A multi-model endpoint (SAGEMAKER_MULTI_MODEL=true): the model loaded under 1, then 4, then 10
    names, each with classes of its own (its classes.json: "m<i>-<class>"), each load timed
    (POST /models) and its first answer (the first invoke after its load: its graph's first run),
    which must name its own classes; then 10 single-image clients, client i asking model i mod N:
    images/s, latency and /ping beside the worker's memory; then each unloaded (DELETE), and the
    worker's memory after."""
    seconds, counts, clients = (0.75, (1, 2), 4) if quick else (8.0, (1, 4, 10), 10)
    (work / "mme-none").mkdir()
    served = Served(work / "mme-none", work / "serve-mme.log", SAGEMAKER_MULTI_MODEL="true")
    loads, firsts, names, memory = [], [], [], {}
    try:
        for count in counts:
            while len(names) < count:
                name = f"model-{len(names)}"
                folder = work / "models" / name / "model"
                shutil.copytree(model, folder)
                own = [f"m{len(names)}-{c}" for c in CLASSES]
                (folder / "classes.json").write_text(json.dumps(own))
                asked = json.dumps({"model_name": name, "url": str(folder)}).encode()
                status, took = served.call("POST", "/models", asked)
                if status != 200:
                    raise SystemExit(f"POST /models answered {status}: {served.log.read_text()[-2000:]}")
                loads.append(took)
                status, took, answer = served.asked(f"/models/{name}/invoke", jpeg, "application/x-image")
                if status != 200 or json.loads(answer).get("predicted_label") not in own:
                    raise SystemExit(f"model {name} answered {status} {answer[:300]!r}, not one of its own classes")
                firsts.append(took)
                names.append(name)
            paths = tuple(f"/models/{name}/invoke" for name in names)
            served.load(jpeg, "application/x-image", clients, seconds / 4, paths)  # (warm)
            result = served.load(jpeg, "application/x-image", clients, seconds, paths)
            memory[count] = sum(served.worker_pss_mb())
            print(row(f"multi-model, {count} model(s), {clients} single-image clients", result, 1)
                  + f"; the worker's PSS {memory[count]:.0f} MB")
        unloads = [served.call("DELETE", f"/models/{name}")[1] for name in names]
        time.sleep(1)  # (the runners let go of their models once their queues are done)
        after = sum(served.worker_pss_mb())
    finally:
        code = served.stop()
    most = max(counts)
    print(f"multi-model: the first POST /models took {ms(loads[0])} (the worker imports TensorFlow then), the "
          f"others {ms(statistics.median(loads[1:]))} (median of {len(loads) - 1}; max {ms(max(loads[1:]))}), each "
          f"model's first answer {ms(statistics.median(firsts))} (max {ms(max(firsts))}), DELETE "
          f"{ms(statistics.median(unloads))}; SIGTERM: exit code {code}")
    print(f"multi-model: the worker's PSS with 1 model {memory[1]:.0f} MB, with {most} {memory[most]:.0f} MB "
          f"({(memory[most] - memory[1]) / (most - 1):.0f} MB a model more), after unloading all {after:.0f} MB "
          f"({memory[most] - after:.0f} MB given back)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny: a correctness check, not a benchmark")
    parser.add_argument("--crowds", action="store_true",
                        help="only the crowds, bad clients and bursts beyond capacity (~6 minutes)")
    parser.add_argument("--overload", action="store_true", help="only the bursts beyond capacity (~4 minutes)")
    parser.add_argument("--multi-model", action="store_true", help="only the multi-model endpoint (~2 minutes)")
    parser.add_argument("--runtimes", action="store_true",
                        help="only the server on TensorFlow and on ONNX Runtime (~5 minutes)")
    parser.add_argument("--ping", nargs=2, metavar=("PORT", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ping:
        return pings(int(args.ping[0]), float(args.ping[1]))
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as work:
        model = exported(Path(work) / "model", args.quick)
        jpeg = photo()
        print(f"model: {'one convolution, 32x32' if args.quick else 'mobilenet_v3_small, 224x224'}, "
              f"{len(CLASSES)} classes; images: one {len(jpeg) // 1024} KB JPEG of 500x375; {cores()} cores")
        if args.multi_model:
            return multi_model(model, Path(work), jpeg, args.quick)
        if args.runtimes:
            return runtimes(model, Path(work), jpeg, args.quick)
        if not args.crowds and not args.overload:
            throughput(model, Path(work), jpeg, args.quick)
            multi_model(model, Path(work), jpeg, args.quick)
            runtimes(model, Path(work), jpeg, args.quick)
        if not args.overload:
            under_crowds(model, Path(work), jpeg, args.quick)
        overloaded(model, Path(work), jpeg, args.quick)


if __name__ == "__main__":
    main()
