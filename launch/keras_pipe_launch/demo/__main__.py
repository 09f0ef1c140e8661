"""`make demo`: transfer learning on SageMaker's Pipe mode, run locally and offline on built-in images.

  1. the UCI handwritten digits (shipped with this project) become JPEG TFRecord shards;
  2. pretraining: a MobileNetV3-Small backbone learns digits 0-4 from scratch (File mode);
  3. transfer: a new job learns digits 5-9, classes that backbone never saw, starting from its
     weights (the `pretrained` channel), its data streamed through Pipe-mode FIFOs: 3 epochs
     training a new head on the frozen backbone, then 12 fine-tuning all of it but BatchNorm, each
     phase's rate falling to 0 along a cosine;
  4. the exported SavedModel classifies every held-out JPEG: the first of each digit is drawn with
     its prediction (a fixed sample, not a chosen one), and the confusion counts of all follow;
     the transfer job's report page (report.html) shows what it learned and its worst mistakes.

Both jobs run through `keras-pipe local`, exactly as they would run on SageMaker; their full
logs are kept in demo-output/*.log. Takes about two minutes on two CPU cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from keras_pipe_launch.common.quiet_start import quiet_tensorflow_start
from keras_pipe_train.settings.paused_collector import pause_collector_while_tensorflow_imports

OUT = Path("demo-output")
# what the demo shows of a run: the runner's lines, metric lines, and the job's own INFO lines
# without their timestamps (the full logs go to files)
JOB_INFO = re.compile(r"^(\S+ \| )\S+ \S+ INFO train[\w.]*: (.*)$")


def write_shards(folder: Path, records: list[bytes], shards: int) -> None:
    from pipemode import tfrecord

    folder.mkdir(parents=True)
    for i in range(shards):
        (folder / f"part-{i:05d}.tfrecord").write_bytes(tfrecord.encode(records[i::shards]))


def halves() -> dict[str, list[tuple[np.ndarray, bytes, int]]]:
    """The built-in digits as (8x8 image, 32x32 JPEG, label), by step: digits-0-4 (labels 0..4) and
    digits-5-9 (labels 0..4 for digits 5..9)."""
    from keras_pipe_launch.sample_data import digit_jpeg, load_digits

    images, labels = load_digits()
    jpegs = [digit_jpeg(image, 32) for image in images]
    return {"digits-0-4": [(i, j, int(y)) for i, j, y in zip(images, jpegs, labels) if y < 5],
            "digits-5-9": [(i, j, int(y) - 5) for i, j, y in zip(images, jpegs, labels) if y >= 5]}


def split(items: list) -> tuple[list, list]:
    """A step's (training, validation) items: the first 80 %, the rest."""
    cut = int(len(items) * 0.8)
    return items[:cut], items[cut:]


def make_data(out: Path = OUT) -> list[tuple[np.ndarray, bytes, int]]:
    """Writes the TFRecords of both steps under out/data; returns the held-out (8x8 image, JPEG,
    digit) of step 2: its validation images, which no job trains on."""
    from keras_pipe_train.sources.example import encode_example

    steps = halves()
    for name, items in steps.items():
        train, validation = split(items)
        write_shards(out / "data" / name / "train", [encode_example(j, y) for _, j, y in train], 4)
        write_shards(out / "data" / name / "validation", [encode_example(j, y) for _, j, y in validation], 1)
    print(f"built-in data: {sum(map(len, steps.values()))} handwritten digits as 32x32 JPEG TFRecords in "
          f"{out / 'data'}")
    return split(steps["digits-5-9"])[1]


def launch_local(step: str, *args: str, out: Path = OUT, show: bool = True) -> dict:
    """Runs `keras-pipe local` (its job under out/step, its log in out/step.log), shows the
    interesting lines (with `show`), returns the job's final metrics."""
    log = out / f"{step}.log"
    command = [sys.executable, "-m", "keras_pipe_launch", "local", "--job-dir", str(out / step),
               "--name", f"demo-{step}", "--hp", "image_size=32", "--hp", "batch_size=32", *args]
    if show:
        print(f"\n$ keras-pipe local {' '.join(command[4:])}", flush=True)
    with open(log, "w") as written:
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in job.stdout:
            written.write(line)
            info = JOB_INFO.match(line.rstrip())
            if not show:
                continue
            if info and "pipe.reader" not in line:
                print(f"  {info.group(1)}{info.group(2)}"[:150], flush=True)
            elif line.startswith("launch |") or "metrics:" in line:
                print("  " + line.rstrip()[:150], flush=True)
    if job.wait():
        raise SystemExit(f"the {step} job failed (exit {job.returncode}); see {log}")
    return json.loads((out / step / "algo-1" / "output" / "data" / "metrics.json").read_text())["final"]


def serve(model_dir: Path, held_out: list[tuple[np.ndarray, bytes, int]]) -> float:
    """Sends every held-out JPEG to the exported model's serving signature; shows a fixed sample
    (the first held-out image of each digit, drawn as the model's input was made) and the
    confusion counts of all of them; returns the accuracy."""
    import tensorflow as tf

    serving = tf.saved_model.load(str(model_dir)).signatures["serving_default"]
    out = serving(image_bytes=tf.constant([jpeg for _, jpeg, _ in held_out]))
    predicted = [int(n.decode()) for n in out["classes"].numpy()]
    confidence = out["probabilities"].numpy().max(axis=1)
    truth = [label + 5 for _, _, label in held_out]
    sample = [truth.index(digit) for digit in range(5, 10)]
    print("  the first held-out image of each digit (8x8 source pixels; darker = more ink):")
    for row in range(8):
        print("    " + "   ".join(_ink(held_out[i][0][row]) for i in sample))
    print("    " + "   ".join(f"{truth[i]} -> {predicted[i]} {confidence[i]:.2f}".ljust(16) for i in sample))
    print(f"\n  all {len(truth)} held-out images: rows are the true digit, columns what the model said")
    print("         " + "".join(f"{d:>5}" for d in range(5, 10)))
    for digit in range(5, 10):
        counts = [sum(t == digit and p == said for t, p in zip(truth, predicted)) for said in range(5, 10)]
        print(f"    {digit}:   " + "".join(f"{c:>5}" for c in counts))
    return sum(t == p for t, p in zip(truth, predicted)) / len(truth)


def _ink(row: np.ndarray) -> str:
    """One row of an 8x8 digit (0..16 of ink) as 16 characters."""
    return "".join(" .:-=+*#@"[min(8, int(v) // 2)] * 2 for v in row)


# The transfer step's recipe: a new head on the frozen backbone, then fine-tuning all but BatchNorm.
# Each phase's rate falls to 0 along a cosine, so that the last epoch, the one exported, has settled.
# At a constant rate, fine-tuning a backbone whose BatchNorm statistics are its own (recomputed after
# each epoch of the pretraining: training/precise_batchnorm.py) ends wherever its last epoch
# wobbles (docs/speed.md, Figures behind the code's choices: The demo's schedule).
TRANSFER_RECIPE = ("--hp", "class_names=5,6,7,8,9", "--hp", "epochs=3", "--hp", "fine_tune_epochs=12",
                   "--hp", "fine_tune_layers=100", "--hp", "fine_tune_learning_rate=5e-4", "--hp", "augment=false",
                   "--hp", "lr_schedule=cosine")
# The demo's: the transfer recipe (the benchmarks' reference, bench/recipes.py) and an average of the
# weights (ema_decay), which halved the spread of what the demo scores over pretraining seeds
# (docs/speed.md, Figures behind the code's choices: The demo's schedule).
DEMO_RECIPE = (*TRANSFER_RECIPE, "--hp", "ema_decay=0.99")


def pretraining(out: Path, epochs: int = 8) -> tuple[str, ...]:
    """The pretraining job's arguments: digits 0-4 from scratch, File mode."""
    return ("--train", str(out / "data/digits-0-4/train"), "--validation", str(out / "data/digits-0-4/validation"),
            "--input-mode", "File", "--hp", "weights=none", "--hp", "class_names=0,1,2,3,4",
            "--hp", f"epochs={epochs}", "--hp", "augment=crop")


def transfer_channels(out: Path, data: str = "digits-5-9") -> tuple[str, ...]:
    """The transfer job's channels: out/data/DATA streamed through Pipe-mode FIFOs, and the
    pretrained backbone's weights."""
    backbone = out / "pretrain" / "algo-1" / "model" / "backbone.weights.h5"
    return ("--train", str(out / "data" / data / "train"), "--validation", str(out / "data" / data / "validation"),
            "--pretrained", str(backbone), "--input-mode", "Pipe", "--shuffle-seed", "1", "--hp", "weights=pretrained")


def main() -> int:
    started = time.time()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    quiet_tensorflow_start()
    pause_collector_while_tensorflow_imports()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    held_out = make_data()

    pretrain = launch_local("pretrain", *pretraining(OUT))
    transfer = launch_local("transfer", *transfer_channels(OUT), *DEMO_RECIPE)
    model = OUT / "transfer" / "algo-1" / "model"

    print(f"\nthe exported model ({model / '1'}) serving held-out JPEGs:")
    served = serve(model / "1", held_out)
    print(f"""
summary ({time.time() - started:.0f} s)
  pretraining on digits 0-4, from scratch, File mode: validation accuracy {pretrain['val_accuracy']:.0%}
  transfer to digits 5-9 (never seen by the backbone), Pipe mode: validation accuracy {transfer['val_accuracy']:.0%}
  (5 classes: chance is 20 %); the served SavedModel scores {served:.0%} on the same held-out images
  (the transfer job's validation set: images no job trained on; its validation accuracy is measured
  inside the job on the decoded records, the served score through the exported model from JPEG bytes,
  so the two agree only if export and serving preprocess exactly as training did)
  model: {model}  (1/ TF Serving SavedModel, model.keras, backbone.weights.h5, classes.json)
  report: {OUT / 'transfer' / 'algo-1' / 'output' / 'data' / 'report.html'}  (its curves, confusion, worst
          mistakes: open it in a browser, or `keras-pipe report {OUT / 'transfer'}`)
  logs:  {OUT}/pretrain.log, {OUT}/transfer.log""")
    return 0


if __name__ == "__main__":
    sys.exit(main())
