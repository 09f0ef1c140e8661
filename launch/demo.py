"""`make demo`: a Pipe-mode channel streamed through the reader, offline, on built-in data.

Makes a few hundred labelled JPEG examples, writes them as TFRecord shards, feeds them to
FIFOs exactly as SageMaker does in Pipe mode (one FIFO per pass), and reads three passes with
PipeModeDataset: parse_example on batches, JPEG decoding, counts and throughput per pass.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CLASSES = ("circle", "square")


def make_examples(count: int, size: int = 64, seed: int = 0) -> list[bytes]:
    """JPEGs of a bright circle or square on noise, as tf.train.Example records."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    examples = []
    for i in range(count):
        label = i % len(CLASSES)
        image = rng.integers(0, 80, (size, size, 3), dtype=np.uint8)
        cy, cx, r = rng.integers(size // 4, 3 * size // 4, 2).tolist() + [size // 6]
        mask = ((yy - cy) ** 2 + (xx - cx) ** 2 <= r * r) if label == 0 else (
            (abs(yy - cy) <= r) & (abs(xx - cx) <= r))
        image[mask] = rng.integers(150, 256, 3, dtype=np.uint8)
        jpeg = tf.io.encode_jpeg(image, quality=90).numpy()
        examples.append(tf.train.Example(features=tf.train.Features(feature={
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        })).SerializeToString())
    return examples


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from train.pipe import PipeModeDataset, tfrecord

    work = Path(tempfile.mkdtemp(prefix="pipe-demo-"))
    job = work / "opt_ml"
    (job / "input" / "config").mkdir(parents=True)
    (job / "input" / "data").mkdir(parents=True)
    (job / "input" / "config" / "inputdataconfig.json").write_text(json.dumps(
        {"train": {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}}))
    os.environ["SAGEMAKER_BASE_DIR"] = str(job)

    examples = make_examples(600)
    shards = []
    for i in range(4):
        shard = work / "s3" / f"train-{i:05d}.tfrecord"
        shard.parent.mkdir(exist_ok=True)
        shard.write_bytes(tfrecord.encode(examples[i::4]))
        shards.append(str(shard))
    print(f"built-in data: {len(examples)} JPEG examples ({', '.join(CLASSES)}) in "
          f"{len(shards)} TFRecord shards, {sum(map(os.path.getsize, shards)) / 1e6:.1f} MB")

    feeder = subprocess.Popen([sys.executable, "-m", "launch.pipe_feeder", "--dir",
                               str(job / "input" / "data"), "--channel", "train", *shards],
                              stderr=subprocess.DEVNULL)
    try:
        features = {"image": tf.io.FixedLenFeature([], tf.string),
                    "label": tf.io.FixedLenFeature([], tf.int64)}
        dataset = PipeModeDataset("train", "TFRecord", batch_size=64, wait_timeout=60).map(
            lambda batch: tf.io.parse_example(batch, features)).map(
            lambda ex: (tf.map_fn(lambda j: tf.io.decode_jpeg(j, channels=3), ex["image"],
                                  fn_output_signature=tf.TensorSpec([None, None, 3], tf.uint8)),
                        ex["label"]))
        for epoch in range(3):
            started, labels, shape = time.perf_counter(), collections.Counter(), None
            for images, batch_labels in dataset:
                labels.update(batch_labels.numpy().tolist())
                shape = tuple(images.shape[1:])
            seconds = time.perf_counter() - started
            total = sum(labels.values())
            print(f"pass {epoch} (FIFO train_{epoch}): {total} records, decoded images {shape}, "
                  + ", ".join(f"{CLASSES[k]}: {v}" for k, v in sorted(labels.items()))
                  + f"; {total / seconds:.0f} images/s")
            if total != len(examples):
                print(f"ERROR: expected {len(examples)} records", file=sys.stderr)
                return 1
    finally:
        feeder.kill()
    print(f"every pass delivered every record exactly once; job directory: {job}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
