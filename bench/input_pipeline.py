"""The training input pipeline at 224x224: images/s, and the share of step time spent waiting for input.

    python -m bench.input_pipeline            # ~3 minutes
    python -m bench.input_pipeline --quick    # tiny: a correctness check, not a benchmark

Measured side by side in one run (best of the repeats), on the same JPEG TFRecords:
  pipe        the job's training pipeline (train/keras_pipe_train/sources/datasets.py: shuffle, batch,
              parse_example, fused JPEG decode-and-crop, resize, flip, brightness/contrast) fed from Pipe-mode FIFOs
  files       the same pipeline fed from the TFRecord files (File mode)
  naive       TFRecordDataset -> parse_single_example -> decode_jpeg -> resize -> batch, one map
              each, no augmentation, TF's default options: TF 2.21's tf.data parallelises these
              stateless maps by itself (map_parallelization)
  sequential  the same naive pipeline with that optimisation off: its maps run as written
Then a short training run of MobileNetV3-Small from Pipe with a custom loop that times how long
each step waits for its batch.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from keras_pipe_launch.common import container_config

SIZE = 224
BATCH = 64


def synthetic_photo(rng: np.random.Generator, height=240, width=320) -> np.ndarray:
    """Shapes on a gradient with noise: decodes at the cost of a real photo of that size."""
    yy, xx = np.mgrid[:height, :width]
    image = np.stack([(xx * rng.uniform(0.3, 1)) % 256, (yy * rng.uniform(0.3, 1)) % 256,
                      np.full((height, width), rng.uniform(0, 255))], -1)
    for _ in range(6):
        cy, cx, r = rng.integers(0, height), rng.integers(0, width), rng.integers(10, 60)
        image[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    return np.clip(image + rng.normal(0, 12, image.shape), 0, 255).astype(np.uint8)


def make_records(count: int, folder: Path, shards: int = 4) -> list[str]:
    import tensorflow as tf

    from keras_pipe_train.sources.example import encode_example
    from pipemode import tfrecord

    rng = np.random.default_rng(0)
    records = [encode_example(tf.io.encode_jpeg(synthetic_photo(rng), quality=90).numpy(), i % 10)
               for i in range(count)]
    folder.mkdir(parents=True)
    paths = []
    for i in range(shards):
        path = folder / f"part-{i}.tfrecord"
        path.write_bytes(tfrecord.encode(records[i::shards]))
        paths.append(str(path))
    return paths


class Job:
    """A throwaway /opt/ml with one channel, Pipe (fed by keras_pipe_launch.local.feeder) or File."""

    made = 0

    def __init__(self, workdir: Path, files: list[str], mode: str):
        Job.made += 1
        self.base = workdir / f"job{Job.made}"
        (self.base / "input" / "data" / "train").mkdir(parents=True)
        container_config.write(self.base / "input" / "config", channels={"train": container_config.channel_entry(mode)})
        os.environ["SAGEMAKER_BASE_DIR"] = str(self.base)
        self.feeder = None
        if mode == "Pipe":
            self.feeder = subprocess.Popen([sys.executable, "-m", "keras_pipe_launch.local.feeder", "--dir",
                                            str(self.base / "input" / "data"), "--channel", "train", *files],
                                           stderr=subprocess.DEVNULL)
        else:
            for f in files:
                os.link(f, self.base / "input" / "data" / "train" / Path(f).name)

    def close(self):
        if self.feeder:
            self.feeder.kill()
            self.feeder.wait()


def ours(job: Job, batch: int = BATCH):
    import tensorflow as tf

    from keras_pipe_train.settings import contract
    from keras_pipe_train.settings.config import JobConfig
    from keras_pipe_train.sources import datasets

    config = JobConfig.from_hyperparameters({"num_classes": 10, "image_size": SIZE, "batch_size": batch,
                                             "shuffle_buffer": 256})
    channel = contract.read_input_data_config()["train"]
    # one epoch's pipeline as the job builds it, on one device (a default InputContext)
    return datasets.training_input(channel, contract.paths(), config, epoch=0)(tf.distribute.InputContext())


def naive(files: list[str], parallelised_by_tf: bool = True):
    import tensorflow as tf

    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
    ds = tf.data.TFRecordDataset(files)
    ds = ds.map(lambda r: tf.io.parse_single_example(r, features))
    ds = ds.map(lambda e: (tf.io.decode_jpeg(e["image/encoded"], channels=3), e["image/class/label"]))
    ds = ds.map(lambda im, y: (tf.image.resize(im, [SIZE, SIZE]), y))
    options = tf.data.Options()
    options.experimental_optimization.map_parallelization = parallelised_by_tf
    return ds.batch(BATCH).with_options(options)


def images_per_second(dataset) -> tuple[float, float, int]:
    """(images/s, CPU ms per image, images): CPU time counts every thread of this process."""
    import resource

    count, started, before = 0, time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    for images, labels in dataset:
        assert images.shape[1:] == (SIZE, SIZE, 3)
        count += int(labels.shape[0])
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return count / (time.perf_counter() - started), cpu / count * 1e3, count


PIPELINES = ("pipe", "files", "naive", "sequential")


def throughput(files: list[str], workdir: Path, repeats: int) -> dict:
    best: dict[str, tuple[float, float]] = {}
    counts = {}
    for _ in range(repeats):
        for name in PIPELINES:
            job = Job(workdir, files, "Pipe" if name == "pipe" else "File")
            try:
                dataset = naive(files, name == "naive") if name in ("naive", "sequential") else ours(job)
                rate, cpu_ms, counts[name] = images_per_second(dataset)
            finally:
                job.close()
            if rate > best.get(name, (0.0, 0.0))[0]:
                best[name] = (rate, cpu_ms)
    assert len(set(counts.values())) == 1, f"pipelines delivered different counts: {counts}"
    return best


def input_wait(files: list[str], workdir: Path, steps: int, batch: int = BATCH) -> dict:
    """Trains MobileNetV3-Small from Pipe for `steps` steps of `batch` images, timing the wait for each batch."""
    import keras
    import tensorflow as tf

    from keras_pipe_train.model.classifier import build_backbone, build_classifier

    job = Job(workdir, files, "Pipe")
    try:
        model = build_classifier("mobilenet_v3_small", build_backbone("mobilenet_v3_small", SIZE, None), 10, 0.2)
        optimizer = keras.optimizers.Adam(1e-3)
        loss_fn = keras.losses.SparseCategoricalCrossentropy()

        @tf.function
        def train_step(images, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        iterator = iter(ours(job, batch).repeat())
        images, labels = next(iterator)
        train_step(images, labels)  # trace
        waited = total = 0.0
        for _ in range(steps):
            t0 = time.perf_counter()
            images, labels = next(iterator)
            t1 = time.perf_counter()
            float(train_step(images, labels))  # wait for the step itself
            waited += t1 - t0
            total += time.perf_counter() - t0
        return {"steps": steps, "batch": batch, "waiting_share": waited / total, "step_s": total / steps}
    finally:
        job.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # (--quick: training's steps of 16 images, not 64: a step of 64 at 224x224 takes some 4 s on 2 cores, and
    # the first, traced, is run too)
    count, repeats, steps, train_batch = (96, 1, 2, 16) if args.quick else (args.images, args.repeats, 20, BATCH)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        files = make_records(count, workdir / "records")
        mb = sum(map(os.path.getsize, files)) / 1e6
        rates = throughput(files, workdir, repeats)
        wait = input_wait(files, workdir, steps, train_batch)
    print(f"\nInput pipeline at {SIZE}x{SIZE}, batch {BATCH}, {count} JPEGs of 320x240 ({mb:.1f} MB), "
          f"best of {repeats}, one run")
    for name, (rate, cpu_ms) in rates.items():
        print(f"  {name:>10}: {rate:7.0f} images/s  {cpu_ms:5.2f} ms CPU per image")
    r = {name: rate for name, (rate, _) in rates.items()}
    print(f"  pipe / files = {r['pipe'] / r['files']:.2f}   pipe / naive = {r['pipe'] / r['naive']:.2f}   "
          f"pipe / sequential = {r['pipe'] / r['sequential']:.2f}")
    print(f"\nTraining MobileNetV3-Small from Pipe, {wait['steps']} steps of {wait['batch']}: "
          f"{wait['step_s']:.2f} s/step, {wait['waiting_share']:.1%} of step time waiting for input")
    return 0


if __name__ == "__main__":
    sys.exit(main())
