"""Writes tests/data/old-models.tar.gz: two tiny models exported by the job's export() as it was
before serving.json had a version (schema version 1), which tests/serve/test_old_models.py serves
with today's code. Run it with the code of such a commit first on the path, from the repository:

    git archive 5bbe12e train | tar -x -C /tmp/old-export     # (5bbe12e: the one that wrote the file)
    PYTHONPATH=/tmp/old-export/train:/tmp/old-export/train/pipemode \\
        .venv/bin/python tests/data/make_old_model.py tests/data/old-models.tar.gz

Each model is the one tests/serve/conftest.py exports (a one-convolution backbone with seeded
random weights under MobileNetV3-Small's head, images of 32 pixels, classes cat, dog and bird): a
single-label one, and a multi-label one at threshold 0.4 calibrated by a temperature per class.
Only what serving reads is kept (1/, classes.json, serving.json; not model.keras nor the backbone's
weights), with probe.png and each model's own answer to it, from its SavedModel, in expected.json.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

CLASSES = ("cat", "dog", "bird")
THRESHOLD = 0.4
TEMPERATURE = [2.5, 0.5, 1.0]
KEPT = ("1", "classes.json", "serving.json")


def tiny_classifier(multi_label: bool):
    import keras

    from keras_pipe_train.model import classifier as M

    keras.utils.set_random_seed(3)
    backbone = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255),
                                 keras.layers.Conv2D(8, 3, strides=2, activation="relu")], name="tiny")
    classifier = M.build_classifier("mobilenet_v3_small", backbone, len(CLASSES), 0.0, batchnorm_frozen=False,
                                    activation="sigmoid" if multi_label else "softmax")
    head = classifier.get_layer("classifier")  # (an untrained head starts at zero: every class as likely)
    head.set_weights([keras.random.normal(w.shape, stddev=3.0, seed=5).numpy() for w in head.get_weights()])
    return classifier


def probe() -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(7).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def main(archive: str) -> None:
    import tensorflow as tf

    from keras_pipe_train.model.export import export
    from keras_pipe_train.training.calibration import Calibration

    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    exporting = Path(sys.modules["keras_pipe_train"].__file__).parent
    print(f"exporting with {exporting} (the repository's HEAD is {commit})")
    image, expected = probe(), {}
    with tempfile.TemporaryDirectory() as work:
        folders = {"single-label": Path(work) / "single-label", "multi-label": Path(work) / "multi-label"}
        export(tiny_classifier(False), CLASSES, 32, folders["single-label"])
        calibration = Calibration("true", np.asarray(TEMPERATURE), True, "calibration=true", 100, {}, {}, True)
        export(tiny_classifier(True), CLASSES, 32, folders["multi-label"], threshold=THRESHOLD,
               calibration=calibration.serving_json(THRESHOLD))
        for name, folder in folders.items():
            serve = tf.saved_model.load(str(folder / "1")).signatures["serving_default"]
            answer = serve(image_bytes=tf.constant([image]))
            expected[name] = {key: value.numpy()[0].tolist() for key, value in answer.items() if key != "classes"}
        with tarfile.open(archive, "w:gz") as tar:
            for name, folder in folders.items():
                for kept in KEPT:
                    tar.add(folder / kept, arcname=f"{name}/{kept}")
            for name, data in (("probe.png", image), ("expected.json", json.dumps(expected, indent=1).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    print(f"wrote {archive}: {Path(archive).stat().st_size} bytes")


if __name__ == "__main__":
    main(*sys.argv[1:])
