"""The chief's TFLite exports (hyperparameter export_formats; model/lite.py says what each holds):
each converted from the model as served, then checked against it on the validation images in one
pass (the chief's alone, within PASS_SHARE of its budget), kept or dropped by its bar, and said in
the log and in evaluation.json's "exports". Without validation they are kept unchecked, and said.
A conversion that fails is a warning: the SavedModel is the job's result."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_pipe_train.after_training.calibrate import Calibrated
from keras_pipe_train.after_training.trained import PASS_SHARE, Trained
from keras_pipe_train.model import lite
from keras_pipe_train.model.export import served_probabilities, serving_resize
from keras_pipe_train.report import evaluation
from keras_pipe_train.sources import preprocess
from keras_pipe_train.training.gathered import Within
from keras_pipe_train.training.metrics import to_json

log = logging.getLogger(__name__)


def export(trained: Trained, calibrated: Calibrated, evaluated: dict | None) -> dict | None:
    """The exports, and evaluation.json's "exports": each format's file (or why it was dropped) and
    its figures against the SavedModel, added to `evaluated` (the evaluation written; None: none was)
    and written again. None when none was asked for."""
    t, config = trained, trained.config
    if not config.export_formats:
        return None
    threshold = config.multi_label_threshold if config.multi_label else None
    answer = served_probabilities(t.model, calibrated.served, config.multi_label, config.test_time_flip)
    with tempfile.TemporaryDirectory(prefix="lite-") as work:
        folder = Path(work) / "classifier"
        lite.write_classifier(t.model, answer, config.image_size, threshold, folder)
        flatbuffers, found = _converted(folder, config.export_formats)
        compared = _compare(t, tf.saved_model.load(str(folder)), flatbuffers) if t.validation else None
    _judge(flatbuffers, found, compared, "no validation channel to compare it on" if not t.validation
           else "the pass over validation was stopped")
    paths = write(t.layout.model, flatbuffers, described(config, threshold, calibrated, found))
    if evaluated is not None:
        evaluated["exports"] = found
        evaluation.write_json(t.layout.output_data, evaluated)
    for export_format, path in paths.items():
        _say(export_format, path, found[export_format])
    return found


def _converted(folder: Path, formats: tuple[str, ...]) -> tuple[dict[str, bytes], dict[str, dict]]:
    """(each format's flatbuffer, what is found of each so far: its size, or why it failed)."""
    flatbuffers, found = {}, {}
    for export_format in formats:
        started = time.monotonic()
        try:
            flatbuffers[export_format] = lite.convert(folder, export_format)
        except Exception as err:  # (a converter's failure: the SavedModel stands)
            log.warning("export %s: the conversion failed (%s: %s); not exported", export_format,
                        type(err).__name__, err, exc_info=True)
            found[export_format] = {"dropped": f"the conversion failed: {type(err).__name__}: {err}"}
            continue
        found[export_format] = {"bytes": len(flatbuffers[export_format]),
                                "convert_seconds": round(time.monotonic() - started, 2)}
    return flatbuffers, found


def _judge(flatbuffers: dict[str, bytes], found: dict[str, dict], compared: dict | None, unchecked: str) -> None:
    """Each export's figures into `found`; one past its bar out of `flatbuffers`, said. Without
    `compared`, each is kept unchecked, and why."""
    for export_format in list(flatbuffers):
        if compared is None:
            found[export_format]["unchecked"] = unchecked
            continue
        comparison, cut = compared[export_format]
        found[export_format].update(comparison.figures(), **({"cut": True} if cut else {}))
        failed = comparison.failed(lite.BARS[export_format])
        if failed:
            del flatbuffers[export_format]
            found[export_format]["dropped"] = failed
            log.warning("export %s dropped: %s (on %d validation images)", export_format, failed, comparison.images)


def _say(export_format: str, path: Path, figures: dict) -> None:
    log.info("export %s: %s, %s bytes%s", export_format, path, f"{figures['bytes']:,}",
             f"; on {figures['images']} validation images it decides {figures['agreement']:.2%} of them as the "
             f"SavedModel does, its probabilities within {figures['max_probability_difference']:.2g}, accuracy "
             f"{figures['accuracy']:.2%} (the SavedModel's {figures['savedmodel_accuracy']:.2%})"
             if "agreement" in figures else f" ({figures.get('unchecked')})")


def _compare(trained: Trained, reference, flatbuffers: dict[str, bytes]) -> dict | None:
    """(Comparison, cut) by format, from one pass over the validation images; None at a stop."""
    t = trained
    runners = {export_format: lite.Runner(flatbuffer) for export_format, flatbuffer in flatbuffers.items()}
    comparisons = {export_format: lite.Comparison() for export_format in runners}
    classify = reference.signatures[lite.SIGNATURE]
    batches = Within(t.examples(t.validation)(tf.distribute.InputContext()), t.stop, t.budget(PASS_SHARE))
    for images, labels in batches:
        expected = {name: value.numpy() for name, value in classify(images=images).items()}
        labels = _label_ids(labels.numpy(), t.config.multi_label)
        for export_format, runner in runners.items():
            comparisons[export_format].add(expected, runner(images.numpy()), labels)
    if t.stop.is_set():
        return None
    return {export_format: (comparison, batches.cut) for export_format, comparison in comparisons.items()}


def _label_ids(labels: np.ndarray, multi_label: bool) -> np.ndarray:
    """Single-label: each image's class id (one-hot labels' too); multi-label: as given (0/1 a class)."""
    if not multi_label and labels.ndim == 2:
        return labels.argmax(axis=-1)
    return labels


def write(model_dir: Path, flatbuffers: dict[str, bytes], said: dict) -> dict[str, Path]:
    """The kept exports and lite.json (strict JSON: an infinite difference, null) in model_dir/lite."""
    paths = lite.write(model_dir, flatbuffers)
    (model_dir / lite.FOLDER / "lite.json").write_text(to_json(said, indent=2) + "\n")
    return paths


def described(config, threshold: float | None, calibrated: Calibrated, found: dict) -> dict:
    """lite.json: what a client of the exports needs, and how each compared."""
    served = calibrated.serving(threshold)
    return {
        "signature": lite.SIGNATURE,
        "input": {"name": "images", "shape": [None, config.image_size, config.image_size, 3], "dtype": "float32",
                  "values": "RGB, 0 to 255", "prepare": _prepare(config),
                  # (the same, as preprocess.for_eval takes it: keras-pipe predict prepares images so)
                  "resize": serving_resize(config), "interpolation": config.resize_interpolation},
        "multi_label": config.multi_label,
        "threshold": threshold,
        "outputs": {"probabilities": "one per class, as the SavedModel serves them"
                                     + (" (calibrated)" if served else ""),
                    "predictions": ("0/1 per class: its probability, the model's own (uncalibrated), at least "
                                    f"{threshold}" if threshold is not None else "the likeliest class's id")},
        "class_names": list(config.class_names),
        "test_time_flip": config.test_time_flip,
        "exports": {name: {"file": lite.FILES[name], **figures} for name, figures in found.items()},
    }


def _prepare(config) -> str:
    """How the job's validation prepared each image (preprocess.for_eval), said for a client."""
    size, resize = config.image_size, serving_resize(config)
    interpolation = config.resize_interpolation
    if resize is None:
        return f"the whole image resized to {size}x{size} ({interpolation}), its aspect ratio not kept"
    if resize == preprocess.ORIGINAL:
        return f"the {size}x{size} centre of the image at its own scale"
    return f"its shorter side resized to {resize} ({interpolation}), then the {size}x{size} centre cropped"
