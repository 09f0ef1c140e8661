"""The served model: requests per second and latency of `serve` (the image's server, started as the
installed `keras-pipe-serve`) against the model called in this process, its limit.

    python -m bench.serve            # ~4 minutes on 2 cores
    python -m bench.serve --quick    # tiny: a correctness check, not a benchmark

The model is the job's export of mobilenet_v3_small at 224x224 (random weights: the cost is the
same), 10 classes. Each request is one photo of 500x375 pixels, JPEG quality 90, sent as
application/x-image over a kept-alive connection, as SageMaker's front end sends them.
  in-process   Predictor.predict([jpeg]): the header check, decoding, resizing, the model and the
               answer's dict, in this process, by 1 and by 8 threads at once (its best rate)
  server       the same through HTTP to `serve` (gunicorn, one worker per core), 1 and 8 clients
               at once: requests/s, p50 and p99 latency, and server / in-process
Then the server's memory (the resident memory of its master and workers) after each of 10 rounds
of 1,000 requests: a leak shows as growth round after round.
"""

from __future__ import annotations

import argparse
import http.client
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


def exported(folder: Path, quick: bool) -> Path:
    import keras

    from keras_pipe_train import model as M
    from keras_pipe_train.export import export

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


def in_process(model: Path, jpeg: bytes, requests: int, clients: int) -> float:
    """Predictor.predict calls per second, `clients` threads at once."""
    from keras_pipe_serve.predictor import Predictor

    predictor = Predictor(model)
    predictor.predict([jpeg])  # (the first call traces)

    def calls(count):
        for _ in range(count):
            predictor.predict([jpeg])

    return requests / timed_in_threads(calls, requests, clients)


def timed_in_threads(work, requests: int, clients: int) -> float:
    threads = [threading.Thread(target=work, args=(requests // clients,)) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


class Served:
    """`keras-pipe-serve` on a free port of 127.0.0.1, as the tests start it."""

    def __init__(self, model: Path, log: Path):
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        serve = str(Path(sys.executable).parent / "keras-pipe-serve")
        self.process = subprocess.Popen([serve, "--model-dir", str(model), "--host", "127.0.0.1"],
                                        env={**os.environ, "SAGEMAKER_BIND_TO_PORT": str(self.port)},
                                        stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"serve exited {self.process.returncode}: {log.read_text()[-2000:]}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                connection.request("GET", "/ping")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"serve did not answer /ping in 300 s: {log.read_text()[-2000:]}")

    def requests(self, jpeg: bytes, requests: int, clients: int) -> tuple[float, list[float]]:
        """(requests per second, every request's latency in s), `clients` connections at once."""
        latencies: list[float] = []

        def client(count):
            connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            mine = []
            for _ in range(count):
                started = time.perf_counter()
                connection.request("POST", "/invocations", jpeg, {"Content-Type": "application/x-image"})
                response = connection.getresponse()
                body = response.read()
                mine.append(time.perf_counter() - started)
                if response.status != 200:
                    raise SystemExit(f"/invocations answered {response.status}: {body[:300]!r}")
            connection.close()
            latencies.extend(mine)

        elapsed = timed_in_threads(client, requests, clients)
        return len(latencies) / elapsed, latencies

    def resident_mb(self) -> float:
        """The resident memory of the master and its workers, MB."""
        children = subprocess.run(["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True).stdout.split()
        total = 0
        for pid in [str(self.process.pid), *children]:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
        return total / 1024

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(timeout=60)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    requests, rounds, per_round = (64, 3, 50) if args.quick else (800, 10, 1000)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as work:
        model = exported(Path(work) / "model", args.quick)
        jpeg = photo()
        print(f"model: {'one convolution, 32x32' if args.quick else 'mobilenet_v3_small, 224x224'}, "
              f"{len(CLASSES)} classes; requests: one {len(jpeg) // 1024} KB JPEG of 500x375; "
              f"{os.cpu_count()} cores")
        limits = {clients: in_process(model, jpeg, requests, clients) for clients in (1, 8)}
        served = Served(model, Path(work) / "serve.log")
        try:
            served.requests(jpeg, 16, 2)  # (each worker's first call traces)
            for clients in (1, 8):
                rate, latencies = served.requests(jpeg, requests, clients)
                p50, p99 = (percentile(latencies, q) * 1000 for q in (50, 99))
                print(f"{clients} client(s): server {rate:7.1f} requests/s, p50 {p50:6.1f} ms, p99 {p99:6.1f} ms; "
                      f"in-process {limits[clients]:7.1f} calls/s; "
                      f"server / in-process = {rate / limits[clients]:.2f}")
            memory = [served.resident_mb()]
            for _ in range(rounds):
                served.requests(jpeg, per_round, 8)
                memory.append(served.resident_mb())
            print(f"memory over {rounds * per_round} requests (8 clients), MB after each {per_round}: "
                  + " ".join(f"{m:.0f}" for m in memory)
                  + f"; last round +{memory[-1] - memory[-2]:.1f} MB, all rounds +{memory[-1] - memory[1]:.1f} MB")
        finally:
            code = served.stop()
        print(f"serve stopped with exit code {code} on SIGTERM")


if __name__ == "__main__":
    main()
