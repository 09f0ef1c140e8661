"""Photos of real sizes through the image pipeline, and the training loop's own cost per step.

    python -m bench.photo_pipeline            # ~15 minutes on 2 cores
    python -m bench.photo_pipeline --quick    # tiny: a correctness check, not a benchmark

Photos of 500x375, 2000x1500 and 4032x3024 (12 MP) pixels, JPEG quality 90, are prepared by
`keras-pipe prepare` twice: as they are, and with --max-side 512. Each set is read at 224x224, batch
64, by pipelines compared at equal augmentation:
  per-example      the usual tf.data recipe: TFRecordDataset -> parse_single_example -> decode_jpeg
                   -> resize -> flip -> brightness/contrast -> batch, one map each
  job              the job's pipeline (sources/datasets.py) with the same augmentation (augment=flip,color):
                   batched parsing, each JPEG decoded at the smallest scale that keeps 224 pixels
  per-example+crop the recipe with the job's default random crop (25-100 % of the area) first
  job+crop         the job's default pipeline (augment=crop,flip,color): fused crop-and-decode
  job+max-side     the job's default pipeline on the --max-side 512 records
Both run in one process set up as the job's (pipemode.allocator.keep_record_memory). Reported as images per CPU-second
(all threads of the process counted: the cost per core), and wall images/s on this machine (what
its cores deliver: the per-example recipe's random maps are not parallelised by tf.data, the job's
pipeline runs batches in parallel). Then the training loop: steps/s of a tiny model on in-memory
batches, our loop (train/keras_pipe_train/training/loop.py) against Keras' fit, both with the same steps_per_execution.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.input_pipeline import SIZE, Job, images_per_second, synthetic_photo

BATCH = 64
KINDS = ("per-example", "job", "per-example+crop", "job+crop", "job+max-side")
PHOTOS = {"500x375": (375, 500), "2000x1500": (1500, 2000), "4032x3024": (3024, 4032)}


def make_photos(folder: Path, height: int, width: int, count: int) -> None:
    import tensorflow as tf

    rng = np.random.default_rng(height)
    for i in range(count):
        label = folder / f"class{i % 2}"
        label.mkdir(parents=True, exist_ok=True)
        (label / f"{i}.jpg").write_bytes(tf.io.encode_jpeg(synthetic_photo(rng, height, width), quality=90).numpy())


def prepared(photos: Path, out: Path, max_side: int | None) -> list[str]:
    from keras_pipe_launch.prepare.dataset import prepare

    summary = prepare(photos, out, validation_fraction=0, shard_mb=64, max_side=max_side)
    return summary["shards"]["train"]


def per_example(files: list[str], crop: bool):
    """The per-example recipe, with the job's flip and colour changes (and its crop sampler)."""
    import tensorflow as tf

    from keras_pipe_train.sources import preprocess

    features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
                "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

    def random_crop(image, seed):
        window = preprocess._crop_window(tf.shape(image), seed)
        return tf.slice(image, [window[0], window[1], 0], [window[2], window[3], 3])

    ds = tf.data.TFRecordDataset(files).shuffle(256, seed=0)
    ds = ds.map(lambda r: tf.io.parse_single_example(r, features))
    ds = ds.enumerate().map(lambda i, e: (tf.io.decode_jpeg(e["image/encoded"], channels=3), e["image/class/label"],
                                          tf.stack([tf.constant(0, tf.int64), i])))  # a seed per image
    ds = ds.map(lambda im, y, s: (tf.image.resize(random_crop(im, s) if crop else im, [SIZE, SIZE]), y, s))
    ds = ds.map(lambda im, y, s: (tf.image.stateless_random_flip_left_right(im, s), y, s))
    ds = ds.map(lambda im, y, s: (preprocess.random_color(im, s), y))
    return ds.batch(BATCH).prefetch(2)


def job_pipeline(files: list[str], workdir: Path, augment: str):
    import tensorflow as tf

    from keras_pipe_train.settings import contract
    from keras_pipe_train.settings.config import JobConfig
    from keras_pipe_train.sources import datasets

    job = Job(workdir, files, "File")
    config = JobConfig.from_hyperparameters({"num_classes": 2, "image_size": SIZE, "batch_size": BATCH,
                                             "shuffle_buffer": 256, "augment": augment})
    channel = contract.read_input_data_config()["train"]
    return datasets.training_input(channel, contract.paths(), config, epoch=0)(tf.distribute.InputContext()), job


def rate(dataset) -> tuple[float, float]:
    """(images per CPU-second, images per wall second) over one pass."""
    per_second, cpu_ms, _ = images_per_second(dataset)
    return 1e3 / cpu_ms, per_second


def pipelines(counts: dict[str, int], workdir: Path, repeats: int) -> dict:
    results = {}
    for name, (height, width) in PHOTOS.items():
        photos = workdir / name
        make_photos(photos, height, width, counts[name])
        original = prepared(photos, workdir / f"{name}-original", None)
        small = prepared(photos, workdir / f"{name}-512", 512)
        megabytes = {kind: sum(map(os.path.getsize, files)) / 1e6
                     for kind, files in (("original", original), ("512", small))}
        best: dict[str, tuple[float, float]] = {}
        for _ in range(repeats):
            for kind in KINDS:
                job = None
                if kind.startswith("per-example"):
                    dataset = per_example(original, crop=kind.endswith("crop"))
                else:
                    augment = "flip,color" if kind == "job" else "crop,flip,color"
                    dataset, job = job_pipeline(small if kind == "job+max-side" else original, workdir, augment)
                try:
                    measured = rate(dataset)
                finally:
                    if job:
                        job.close()
                best[kind] = max(best.get(kind, (0.0, 0.0)), measured)
        results[name] = {"rates": best, "megabytes": megabytes, "count": counts[name]}
    return results


def loop_overhead(steps: int, steps_per_execution: int) -> dict:
    """Steps/s of a tiny model on batches already in memory: what is left is the loop's own cost."""
    import keras
    import tensorflow as tf

    from keras_pipe_train.training.distribute import Cluster
    from keras_pipe_train.training.loop import Trainer

    images = np.random.default_rng(0).random((steps * 8, 8, 8, 3)).astype(np.float32)
    labels = (np.arange(steps * 8) % 3).astype(np.int64)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8).cache()

    def tiny():
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
                                 keras.layers.Dense(3, activation="softmax")])

    trainer = Trainer(tiny(), Cluster(tf.distribute.get_strategy(), 1, 0, True), mixed_precision=False,
                      steps_per_execution=steps_per_execution)
    trainer.start_phase(1e-3)
    model = tiny()
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"],
                  steps_per_execution=steps_per_execution)
    epochs = {"ours": lambda: trainer.train_epoch(dataset, 0, 0, 8),
              "keras": lambda: model.fit(dataset, epochs=1, verbose=0)}
    for epoch in epochs.values():
        epoch()  # traces
    timings = {name: float("inf") for name in epochs}
    for _ in range(5):  # interleaved, best of 5: the machine's noise is of the order of what is measured
        for name, epoch in epochs.items():
            started = time.perf_counter()
            epoch()
            timings[name] = min(timings[name], (time.perf_counter() - started) / steps * 1e3)
    return timings


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from pipemode import allocator

    allocator.keep_record_memory()  # as the job's process runs (both pipelines gain from it)
    if args.quick:
        counts, repeats, steps = {"500x375": 8, "2000x1500": 4, "4032x3024": 2}, 1, 20
    else:
        counts, repeats, steps = {"500x375": 512, "2000x1500": 384, "4032x3024": 96}, args.repeats, 400
    with tempfile.TemporaryDirectory() as tmp:
        results = pipelines(counts, Path(tmp), repeats)
    print(f"\nImage pipeline at {SIZE}x{SIZE}, batch {BATCH}; best of {repeats}; one run. Images per CPU-second "
          "(all threads: per core), wall images/s in brackets")
    print(f"  {'photos':>10} {'images':>6} {'MB':>6} {'MB@512':>6}  " + "  ".join(f"{k:>18}" for k in KINDS))
    for name, result in results.items():
        rates, mb = result["rates"], result["megabytes"]
        cells = "  ".join(f"{rates[k][0]:8.1f} ({rates[k][1]:6.1f})" for k in KINDS)
        print(f"  {name:>10} {result['count']:6d} {mb['original']:6.1f} {mb['512']:6.1f}  {cells}")
    for name, result in results.items():
        cpu = {kind: rate for kind, (rate, _) in result["rates"].items()}
        wall = {kind: rate for kind, (_, rate) in result["rates"].items()}
        print(f"  {name:>10}: job / per-example = {cpu['job'] / cpu['per-example']:.2f}   "
              f"job+crop / per-example+crop = {cpu['job+crop'] / cpu['per-example+crop']:.2f} "
              f"(wall {wall['job+crop'] / wall['per-example+crop']:.2f})   "
              f"job+max-side / per-example+crop = {cpu['job+max-side'] / cpu['per-example+crop']:.2f}   "
              f"job+max-side / job+crop = {cpu['job+max-side'] / cpu['job+crop']:.2f}")
    print(f"\nTraining loop, tiny model on in-memory batches of 8, {steps} steps per epoch (ms per step):")
    for k in (1, 8):
        timings = loop_overhead(steps, k)
        print(f"  steps_per_execution={k}: ours {timings['ours']:.3f}  keras fit {timings['keras']:.3f}  "
              f"ours / keras = {timings['ours'] / timings['keras']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
