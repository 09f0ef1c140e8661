"""How long `keras-pipe prepare` takes per 1000 photos, on one machine and per Processing instance.

    python -m bench.prepare_at_scale                # 400 photos of 2000x1500 (a few minutes)
    python -m bench.prepare_at_scale --quick        # 20 small photos, no 1-instance run: a correctness check

The photos (JPEG, 2000x1500, ~3 MP: a phone photo downscaled) are put in moto's S3 server on
127.0.0.1. Then, with --max-side 512 (what the README recommends for such photos), the same source is
prepared by the one-machine prepare and by the local emulation of the Processing job with 1 and 2
instances, each looking for duplicates (the default) and, for comparison, not ("no dups":
--no-duplicate-check) (processes on this machine: with fewer cores than instances, they share them, so the
per-instance figure is what one instance of this machine's size does). Each run's examples are
counted and must agree. A SageMaker instance's own time also holds its share's download (File mode),
which this machine's loopback does not show.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def photo_jpeg(rng: np.random.Generator, height: int, width: int) -> bytes:
    from PIL import Image

    from bench.input_pipeline import synthetic_photo

    out = io.BytesIO()
    Image.fromarray(synthetic_photo(rng, height, width)).save(out, "JPEG", quality=90)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=int, default=400)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    count, (height, width) = (20, (300, 400)) if args.quick else (args.photos, (1500, 2000))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # (moto's server logs every request)
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    import boto3

    from keras_pipe_launch.prepare.dataset import prepare
    from keras_pipe_launch.prepare.duplicates import DISTANCE
    from keras_pipe_launch.prepare.processing import instance_arguments, prepare_locally

    client = boto3.client("s3")
    client.create_bucket(Bucket="bench-photos")
    rng = np.random.default_rng(0)
    size = 0
    for i in range(count):
        data = photo_jpeg(rng, height, width)
        size += len(data)
        client.put_object(Bucket="bench-photos", Key=f"photos/class{i % 4}/{i:05d}.jpg", Body=data)
    print(f"{count} photos of {width}x{height}, {size / count / 1e6:.2f} MB each on average; --max-side 512")
    arguments = instance_arguments(100, 512, 90, 100_000_000)
    results = []
    with tempfile.TemporaryDirectory() as work:
        for name, distance in (("one machine", DISTANCE), ("one machine, no dups", None)):
            started = time.perf_counter()
            one = prepare("s3://bench-photos/photos/", Path(work) / name, validation_fraction=0.1, max_side=512,
                          duplicate_distance=distance)
            results.append((name, 1, time.perf_counter() - started, one))
        # (--quick: no 1-instance run, the 2-instance one going through the same code and splitting the photos
        # besides: a run's instances are processes of their own, some 5 s a run here)
        distributed = ((1, DISTANCE), (2, DISTANCE), (2, None))
        for instances, distance in distributed[1:] if args.quick else distributed:
            started = time.perf_counter()
            name = f"{instances} instance{'s' if instances > 1 else ''}" + (", no dups" if distance is None else "")
            many = prepare_locally("s3://bench-photos/photos/", f"s3://bench-photos/out{len(results)}/",
                                   instance_count=instances, job_dir=Path(work) / f"jobs{len(results)}",
                                   validation_fraction=0.1, arguments=arguments,
                                   out_stream=open(os.devnull, "w"), duplicate_distance=distance)
            results.append((name, instances, time.perf_counter() - started, many))
    server.stop()
    print(f"\n{'run':<22}{'examples':>9}{'seconds':>9}{'s per 1000 photos':>19}{'per instance':>14}")
    for name, instances, seconds, summary in results:
        examples = summary["train"] + summary["validation"]
        assert examples == one["train"] + one["validation"], (name, summary)
        per_1000 = seconds / count * 1000
        print(f"{name:<22}{examples:>9}{seconds:>9.1f}{per_1000:>19.1f}{per_1000 * instances:>14.1f}")
    print(f"\n(this machine: {os.cpu_count()} cores; the instances of a run share them)")


if __name__ == "__main__":
    main()
