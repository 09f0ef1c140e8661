"""ONNX Runtime against TensorFlow for the server's model call on CPU, side by side in one run:
does serving the ONNX export (export_formats=onnx, `keras-pipe export`) answer faster?

    python -m bench.onnx_runtime            # ~7 minutes on 2 cores
    python -m bench.onnx_runtime --quick    # tiny: a correctness check, not a benchmark

For each backbone, the job's own code builds a classifier (weights=None, a head of random weights
large enough that images get answers of their own), exports it as a job does (model/export.py:
the SavedModel, serving.json, preparation.json) and exports that folder to ONNX as `keras-pipe
export` does. Then the same JPEGs (photos of 320x240, random pixels) go through:
  TensorFlow   keras_pipe_serve.predictor.Predictor.run: the SavedModel's serving signature on the
               encoded images (decoding, resizing and the model in one TensorFlow function), the
               server's call of the model for each batch it forms
  ONNX Runtime keras_pipe_serve.export_predictor.ExportPredictor.run on model.onnx: the images
               decoded and resized by the same TensorFlow code, then the model in ONNX Runtime
  (prepare)    that decoding and resizing alone, TensorFlow's: what both pay beside the model
at 1, 8 and 32 images a call: the batches the server's batcher forms for 1, 8 and 32 clients
(at most 32: its max batch). Each rate is images/s, the median of REPEATS, the two runtimes in
turn (A B A B ...: the machine's drift hits them alike), after a warm-up call each. Both use every
core (as the server's one worker on this machine). Numerics: the largest
difference of a probability between the two, on the 32 images.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

BATCHES = (1, 8, 32)
REPEATS = 5
CASES = {  # backbone: image size
    "mobilenet_v3_small": 224,
    "efficientnet_b0": 224,
    "resnet50": 224,
}
QUICK = {"mobilenet_v3_small": 32}


def photos(count: int) -> list[bytes]:
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    found = []
    for _ in range(count):
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)).save(out, "JPEG", quality=90)
        found.append(out.getvalue())
    return found


def exported(backbone: str, size: int, folder: Path) -> Path:
    """A job's model folder for `backbone`, with its ONNX export (exports/model.onnx)."""
    import keras

    from keras_pipe_train.after_training.folder_exports import export_folder
    from keras_pipe_train.model.classifier import build_backbone, build_classifier
    from keras_pipe_train.model.export import export

    keras.utils.set_random_seed(0)
    model = build_classifier(backbone, build_backbone(backbone, size, None), 10, 0.0)
    head = model.get_layer("classifier")
    head.set_weights([np.random.default_rng(1).normal(0, 0.5, w.shape) for w in head.get_weights()])
    export(model, tuple(str(i) for i in range(10)), size, folder)
    export_folder(folder, ("onnx",), [], folder / "exports")
    return folder


def rate(call, images: list[bytes], seconds: float) -> float:
    """Images a second of `call` on `images`, calls repeated for at least `seconds` (twice at least)."""
    calls, started = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - started < seconds:
        call(images)
        calls += 1
    return calls * len(images) / (time.perf_counter() - started)


def measure(backbone: str, size: int, repeats: int, seconds: float, work: Path) -> list[str]:
    from keras_pipe_serve.export_predictor import ExportPredictor, prepared_by
    from keras_pipe_serve.predictor import Predictor


    folder = exported(backbone, size, work / backbone)
    # (TensorFlow's default threads: every core, as the server's one worker on this machine; the
    # export above has initialised them, so the Predictor cannot set them itself)
    runtimes = {"TensorFlow": Predictor(folder), "ONNX Runtime": ExportPredictor(
        folder / "exports" / "model.onnx")}
    tf = runtimes["TensorFlow"]._tf
    images = photos(max(BATCHES))

    prepared = prepared_by(tf, size, None, "bilinear", runtimes["ONNX Runtime"].max_pixels)

    def prepare(batch):
        return prepared(tf.constant(batch)).numpy()

    calls = {**{name: runtime.run for name, runtime in runtimes.items()}, "(prepare)": prepare}
    answers = {name: np.array(runtime.run(images)[0]) for name, runtime in runtimes.items()}  # (warm-ups)
    prepare(images)
    difference = float(np.abs(answers["TensorFlow"] - answers["ONNX Runtime"]).max())
    same = float((answers["TensorFlow"].argmax(1) == answers["ONNX Runtime"].argmax(1)).mean())
    lines = []
    for batch in BATCHES:
        for call in calls.values():  # (each batch size's first call traces, or plans, it: not counted)
            call(images[:batch])
        rates = {name: [] for name in calls}
        for _ in range(repeats):
            for name, call in calls.items():
                rates[name].append(rate(call, images[:batch], seconds))
        medians = {name: statistics.median(found) for name, found in rates.items()}
        spread = {name: (max(found) - min(found)) / 2 / medians[name] for name, found in rates.items()}
        lines.append(f"{backbone} ({size} px) b{batch:<2} | " + " | ".join(
            f"{name} {medians[name]:8.1f} ± {spread[name]:3.0%}" for name in calls)
            + f" | ONNX Runtime / TensorFlow {medians['ONNX Runtime'] / medians['TensorFlow']:.2f}x")
    lines.append(f"{backbone}: max |difference| of a probability {difference:.2g} on {len(images)} images, "
                 f"{same:.0%} the same class")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny: a correctness check, not a benchmark")
    parser.add_argument("--only", default=None, help="comma-separated backbones of " + ", ".join(CASES))
    args = parser.parse_args(argv)
    cases = QUICK if args.quick else {name: CASES[name] for name in (args.only.split(",") if args.only else CASES)}
    repeats, seconds = (2, 0.05) if args.quick else (REPEATS, 2.0)
    print(f"images/s on {os.cpu_count()} cores, median of {repeats} ± half their range; one process, "
          "the runtimes in turn")
    with tempfile.TemporaryDirectory(prefix="bench-onnx-") as work:
        for backbone, size in cases.items():
            for line in measure(backbone, size, repeats, seconds, Path(work)):
                print(line, flush=True)


if __name__ == "__main__":
    main()
