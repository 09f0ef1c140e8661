"""The served model under load: requests per second, latency and /ping's latency of `serve` (the
image's server, started as the installed `keras-pipe-serve`), against the model called in this
process on the same number of TensorFlow threads, its ceiling.

    python -m bench.serve            # ~5 minutes on 2 cores
    python -m bench.serve --quick    # tiny: a correctness check, not a benchmark

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
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.input_pipeline import synthetic_photo

CLASSES = [f"class{i}" for i in range(10)]
PING_EVERY_S = 0.1
PING_LIMIT_S = 2.0  # SageMaker's: a ping unanswered in 2 s counts against the instance


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
    classifier = M.build_classifier("mobilenet_v3_small", backbone, len(CLASSES), 0.0, pretrained=False)
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

    def load(self, body: bytes, kind: str, clients: int, seconds: float) -> dict:
        """`clients` connections sending `body` back to back for `seconds`, /ping polled meanwhile:
        requests/s and the latencies of requests and pings."""
        latencies: list[float] = []
        failures: list[str] = []
        stop = threading.Event()

        def client():
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            while not stop.is_set():
                started = time.perf_counter()
                connection.request("POST", "/invocations", body, {"Content-Type": kind})
                answer = connection.getresponse()
                text = answer.read()
                if answer.status != 200:
                    failures.append(f"{answer.status}: {text[:200]!r}")
                    break
                latencies.append(time.perf_counter() - started)
            connection.close()

        threads = [threading.Thread(target=client) for _ in range(clients)]
        # pinged from a process of its own, as SageMaker's health check comes from outside: the
        # client threads here would otherwise add their own waits for this process's GIL
        pinger = subprocess.Popen([sys.executable, "-m", "bench.serve", "--ping", str(self.port), str(seconds)],
                                  stdout=subprocess.PIPE, text=True)
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        stop.set()
        count = len(latencies)  # (requests finished within the time)
        elapsed = time.perf_counter() - started
        for thread in threads:
            thread.join()
        pings = [float("inf") if took is None else took for took in json.loads(pinger.communicate()[0])]
        if failures:
            raise SystemExit(f"/invocations failed: {failures[0]}; log: {self.log.read_text()[-2000:]}")
        return {"rate": count / elapsed, "latencies": latencies, "pings": pings}

    def worker_pss_mb(self) -> list[float]:
        children = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True).stdout.split()
        sizes = []
        for pid in children:
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            sizes.append(next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")) / 1024)
        return sizes

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(timeout=60)


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
    slow = sum(took > PING_LIMIT_S for took in pings)
    return line + (f"; /ping p50 {ms(percentile(pings, 50))}, p99 {ms(percentile(pings, 99))}, max {ms(max(pings))}, "
                   f"{slow} of {len(pings)} over 2 s")


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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ping", nargs=2, metavar=("PORT", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ping:
        return pings(int(args.ping[0]), float(args.ping[1]))
    seconds = 0.75 if args.quick else 8.0  # (--quick: each load long enough for a few pings, every 0.1 s)
    warm_s = 0.5 if args.quick else 2.0
    client_counts = (1, 8) if args.quick else (1, 2, 8, 32)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as work:
        model = exported(Path(work) / "model", args.quick)
        jpeg = photo()
        bodies = {1: (jpeg, "application/x-image"),
                  32: (json.dumps({"instances": [{"b64": base64.b64encode(jpeg).decode()}] * 32}).encode(),
                       "application/json")}
        print(f"model: {'one convolution, 32x32' if args.quick else 'mobilenet_v3_small, 224x224'}, "
              f"{len(CLASSES)} classes; images: one {len(jpeg) // 1024} KB JPEG of 500x375; {cores()} cores")
        ceiling = in_process(model, jpeg, seconds)
        print("in-process, images/s: " + ", ".join(f"batches of {size} {rate:.1f}" for size, rate in ceiling.items())
              + f"; batches of 32 / one at a time = {ceiling[32] / ceiling[1]:.2f}")

        def measured(label: str, rows: list[tuple[int, int]], **env: str) -> None:
            served = Served(model, Path(work) / f"serve-{label}.log", **env)
            try:
                for images in sorted({images for images, _ in rows}):  # (warm: threads started, memory taken)
                    served.load(*bodies[images], max(clients for _, clients in rows), warm_s)
                after = []  # (the workers' memory after each load: a leak shows as growth load after load)
                for images, clients in rows:
                    result = served.load(*bodies[images], clients, seconds)
                    after.append(sum(served.worker_pss_mb()))
                    print(row(f"{label}, {clients:2d} client(s) x {images:2d} image(s)", result, images,
                              ceiling[32]))
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
        measured("batching off", compared, KERAS_PIPE_MAX_BATCH="1")
        measured("a worker per core", compared, SAGEMAKER_MODEL_SERVER_WORKERS=str(cores()))
        past_the_timeout(model, Path(work) / "serve-timeout.log", jpeg, 100 if args.quick else 400)


if __name__ == "__main__":
    main()
