"""The chief's exports, TFLite and ONNX (hyperparameter export_formats; model/conversions.py says
what each holds): each converted from the model as served, then checked against it on the validation images in one
pass (the chief's alone, at most MAX_COMPARED images, and on several hosts within EXPORT_SHARE of
collective_timeout, its conversions included: after_training/trained.py), kept or dropped by its
bar, and said in the log and in evaluation.json's "exports". Without validation they are kept
unchecked, and said; a stop request before the step skips it, one during its pass has them judged
on the images seen. Whatever fails here is a warning: the SavedModel is the job's result."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from keras_pipe_train.after_training.calibrate import Calibrated
from keras_pipe_train.after_training.trained import EXPORT_SHARE, Trained
from keras_pipe_train.model import conversions
from keras_pipe_train.model.export import served_probabilities, serving_resize
from keras_pipe_train.report import evaluation
from keras_pipe_train.sources import preprocess
from keras_pipe_train.training.gathered import Reservoir, Within
from keras_pipe_train.training.metrics import to_json

log = logging.getLogger(__name__)

# validation images each export is compared on, at most: the exports run on the CPU, a large backbone at
# a few dozen images a second, and 2,000 tell an agreement to a twentieth of a point
MAX_COMPARED = 2_000
# representative images a full-integer export's activation ranges are measured on: TFLite's guide
# suggests a hundred to a few hundred; each is one call of the float model in the converter. Drawn
# at random from the first REPRESENTATIVE_DRAWN_FROM a pass reads: a channel in class order (class
# folders, .lst files) would give its first class alone
REPRESENTATIVE = 200
REPRESENTATIVE_DRAWN_FROM = 2_000


def export(trained: Trained, calibrated: Calibrated, evaluated: dict | None) -> dict | None:
    """The exports, and evaluation.json's "exports": each format's file (or why it was dropped) and
    its figures against the SavedModel, added to `evaluated` (the evaluation written; None: none was)
    and written again. None when none was asked for."""
    t, config = trained, trained.config
    if not config.export_formats:
        return None
    started = time.monotonic()
    skipped = {export_format: why for export_format in config.export_formats
               if (why := _skipped(t, export_format))}
    for export_format, why in skipped.items():
        log.warning("no %s export: %s", export_format, why)
    found = {export_format: {"dropped": why} for export_format, why in skipped.items()}
    tried = tuple(export_format for export_format in config.export_formats if export_format not in skipped)
    converted = {}
    if tried:
        try:
            converted, made_ = _exported(t, calibrated, tried, started)
            found.update(made_)
        except Exception as err:  # (the SavedModel is written: the job's result stands)
            log.warning("the exports failed (%s: %s); the SavedModel is the job's model", type(err).__name__,
                        err, exc_info=True)
            found.update({export_format: {"dropped": f"the export step failed: {type(err).__name__}: {err}"}
                          for export_format in tried})
    found = {export_format: found[export_format] for export_format in config.export_formats}  # (as asked)
    threshold = config.multi_label_threshold if config.multi_label else None
    try:
        write(t.layout.model / conversions.FOLDER, converted, described(
            config.image_size, serving_resize(config), config.resize_interpolation, threshold, config.class_names,
            config.test_time_flip, calibrated.serving(threshold), config.max_image_pixels, config.dialect, found))
    except OSError as err:  # (the disk full, say: the SavedModel is written, the job's result stands)
        log.warning("the exports could not be written (%s); the SavedModel is the job's model", err)
        found = {export_format: {"dropped": f"it could not be written: {err}"} for export_format in found}
    if evaluated is not None:
        evaluated["exports"] = found
        evaluation.write_json(t.layout.output_data, evaluated)
    return found


def _skipped(trained: Trained, export_format: str) -> str | None:
    """Why an export is not tried at all (None: it is tried)."""
    if trained.stop.is_set():
        return "a stop request came before it"
    return None


def _exported(trained: Trained, calibrated: Calibrated, formats: tuple[str, ...], started: float
              ) -> tuple[dict[str, bytes], dict[str, dict]]:
    t, config = trained, trained.config
    threshold = config.multi_label_threshold if config.multi_label else None
    # (mixed precision, on with a GPU: converted from its float32 twin, conversions.in_float32)
    model = conversions.in_float32(t.model)
    answer = served_probabilities(model, calibrated.served, config.multi_label, config.test_time_flip)

    def batches():  # (made after the conversions: their time counts against the budget)
        return Within(t.examples(t.validation)(tf.distribute.InputContext()), t.stop,
                      t.budget(EXPORT_SHARE, time.monotonic() - started))

    def representative():  # (the training channel's images, prepared as validation's: one more pass)
        return representative_images(Within(t.examples(t.train_source)(tf.distribute.InputContext()), t.stop,
                                   t.budget(EXPORT_SHARE, time.monotonic() - started)))

    return made(model, answer, config.image_size, threshold, formats, batches if t.validation else None,
                "no validation channel to compare it on", representative)


def made(model, answer, image_size: int, threshold: float | None, formats: tuple[str, ...],
         batches: Callable[[], Within] | None, unchecked: str,
         representative: Callable[[], np.ndarray] | None = None) -> tuple[dict[str, bytes], dict[str, dict]]:
    """(the kept exports' files, what is found of each: its size and figures, or why it was dropped),
    each format converted from `model` as `answer` serves it (export.served_probabilities) and
    compared with it on the validation batches `batches` makes ((images, labels), at most
    MAX_COMPARED images; None: kept unchecked, for the reason `unchecked`). `representative`: the
    images a format of conversions.REPRESENTED is calibrated on, asked for only when one is."""
    images = representative() if representative and set(formats) & set(conversions.REPRESENTED) else None
    with tempfile.TemporaryDirectory(prefix="exports-") as work:
        folder = Path(work) / "classifier"
        conversions.write_classifier(model, answer, image_size, threshold, folder)
        converted, found = _converted(folder, formats, images)
        compared = None
        if batches is not None and converted:
            compared = _compare(tf.saved_model.load(str(folder)), converted, batches())
    _judge(converted, found, compared, unchecked)
    return converted, found


def representative_images(batches: Within, count: int = REPRESENTATIVE,
                          drawn_from: int = REPRESENTATIVE_DRAWN_FROM) -> np.ndarray | None:
    """`count` images drawn uniformly (seeded) from the first `drawn_from` of `batches` ((images,
    labels)), one array (fewer where there were fewer; None: there were none)."""
    reservoir, rows = Reservoir(count, seed=0), None
    for images, _ in batches:
        images = images.numpy()
        positions, slots = reservoir.places(len(images))
        if rows is None:
            rows = np.empty((count, *images.shape[1:]), np.float32)
        rows[slots] = images[positions]
        if reservoir.offered >= drawn_from:
            batches.end()
            break
    return None if rows is None else rows[:min(count, reservoir.offered)]


def _converted(folder: Path, formats: tuple[str, ...], representative: np.ndarray | None
               ) -> tuple[dict[str, bytes], dict[str, dict]]:
    """(each format's file, what is found of each so far: its size, or why it failed)."""
    converted, found = {}, {}
    for export_format in formats:
        started = time.monotonic()
        try:
            converted[export_format] = conversions.convert(folder, export_format, representative)
        except Exception as err:  # (a converter's failure: the SavedModel stands)
            log.warning("export %s: the conversion failed (%s: %s); not exported", export_format,
                        type(err).__name__, err, exc_info=True)
            found[export_format] = {"dropped": f"the conversion failed: {type(err).__name__}: {err}"}
            continue
        found[export_format] = {"bytes": len(converted[export_format]),
                                "convert_seconds": round(time.monotonic() - started, 2)}
        if export_format in conversions.REPRESENTED:
            found[export_format]["representative_images"] = len(representative)
    return converted, found


def _judge(converted: dict[str, bytes], found: dict[str, dict], compared: dict | None, unchecked: str) -> None:
    """Each export's figures into `found`; one past its bar out of `converted`, said. Without
    `compared`, each is kept unchecked, and why."""
    for export_format in list(converted):
        if compared is None:
            found[export_format]["unchecked"] = unchecked
            continue
        if isinstance(compared[export_format], str):  # (its runtime failed: _compare)
            del converted[export_format]
            found[export_format]["dropped"] = compared[export_format]
            log.warning("export %s dropped: %s", export_format, compared[export_format])
            continue
        comparison, cut = compared[export_format]
        found[export_format].update(comparison.figures(), **({"cut": True} if cut else {}))
        failed = comparison.failed(conversions.BARS[export_format])
        if failed:
            del converted[export_format]
            found[export_format]["dropped"] = failed
            log.warning("export %s dropped: %s (on %d validation images)", export_format, failed, comparison.images)


def _say(export_format: str, path: Path, figures: dict) -> None:
    log.info("export %s: %s, %s bytes%s", export_format, path, f"{figures['bytes']:,}",
             f"; on {figures['images']} validation images it decides {figures['agreement']:.2%} of them as the "
             f"SavedModel does, its probabilities within {figures['max_probability_difference']:.2g}, accuracy "
             f"{figures['accuracy']:.2%} (the SavedModel's {figures['savedmodel_accuracy']:.2%})"
             if "agreement" in figures else f" ({figures.get('unchecked')})")


def _compare(reference, converted: dict[str, bytes], batches: Within) -> dict:
    """(Comparison, cut) by format, from one pass over `batches`: at most MAX_COMPARED images; a
    stop request or the budget ends it, the images seen judged (cut)."""
    runners, failed = {}, {}
    for export_format, content in converted.items():  # (one runtime's failure drops its format alone)
        try:
            runners[export_format] = conversions.runner(content, export_format)
        except Exception as err:  # (TFLite's ValueError or RuntimeError, ONNX Runtime's own)
            failed[export_format] = f"its runtime cannot load it: {type(err).__name__}: {str(err)[:300]}"
    comparisons = {export_format: conversions.Comparison() for export_format in runners}
    classify = reference.signatures[conversions.SIGNATURE]
    seen = 0
    for images, labels in batches:
        expected = {name: value.numpy() for name, value in classify(images=images).items()}
        labels = labels.numpy()  # (class ids; multi-label: 0/1 a class, as the gallery reads them)
        for export_format, runner in list(runners.items()):
            try:
                answered = runner(images.numpy())
            except Exception as err:
                failed[export_format] = f"its runtime failed on the validation images: {type(err).__name__}: " \
                                        f"{str(err)[:300]}"
                del runners[export_format]
                continue
            comparisons[export_format].add(expected, answered, labels)
        seen += len(labels)
        if seen >= MAX_COMPARED:
            batches.end()
            break
    return {**{export_format: (comparisons[export_format], batches.cut) for export_format in runners}, **failed}


def write(out: Path, converted: dict[str, bytes], said: dict, keep: tuple[str, ...] = ()) -> dict[str, Path]:
    """The kept exports and exports.json (strict JSON: an infinite difference, null) in the folder
    `out` (a model folder's exports/), each said in the log; the files of other formats removed,
    but those of `keep` (conversions.write)."""
    paths = conversions.write(out, converted, keep)
    (out / conversions.DESCRIBED).write_text(to_json(said, indent=2) + "\n")
    for export_format, path in paths.items():
        _say(export_format, path, said["exports"][export_format])
    return paths


def described(image_size: int, resize: int | str | None, interpolation: str, threshold: float | None,
              class_names, flip: bool, calibration, max_pixels: int, dialect: str, found: dict) -> dict:
    """exports.json: what a client of the exports needs, and how each compared. `resize`,
    `interpolation`: how the SavedModel prepares images (export.serving_archive); `threshold`: a
    multi-label model's (None: single-label); `calibration`: its served probabilities' (a
    ServedCalibration; None: none); `max_pixels`, `dialect`: serving.json's, for keras-pipe
    predict and serve to answer with an export wherever it lies as with the model folder."""
    return {
        "signature": conversions.SIGNATURE,  # (TFLite's; ONNX's graph is the same function)
        "input": {"name": "images", "shape": [None, image_size, image_size, 3], "dtype": "float32",
                  "values": "RGB, 0 to 255", "prepare": _prepare(image_size, resize, interpolation),
                  # (the same, as preprocess.for_eval takes it: keras-pipe predict prepares images so)
                  "resize": resize, "interpolation": interpolation},
        "multi_label": threshold is not None,
        "threshold": threshold,
        "outputs": {"probabilities": "one per class, as the SavedModel serves them" + (" (calibrated)" if calibration
                                                                                       else ""),
                    "predictions": ("0/1 per class: its probability, the model's own (uncalibrated), at least "
                                    f"{threshold}" if threshold is not None else "the likeliest class's id")},
        "class_names": [str(name) for name in class_names],
        "test_time_flip": flip,
        # (a multi-label model's predictions at its calibrated probabilities: serving.json's)
        "calibrated_thresholds": None if calibration is None or calibration.calibrated_thresholds is None
        else list(calibration.calibrated_thresholds),
        "max_image_pixels": max_pixels,
        "dialect": dialect,
        "exports": {name: {**({} if "dropped" in figures else {"file": conversions.FILES[name]}), **figures}
                    for name, figures in found.items()},
    }


def _prepare(size: int, resize: int | str | None, interpolation: str) -> str:
    """How the serving signature prepares each image (preprocess.for_eval), said for a client."""
    if resize is None:
        return f"the whole image resized to {size}x{size} ({interpolation}), its aspect ratio not kept"
    if resize == preprocess.ORIGINAL:
        return f"the {size}x{size} centre of the image at its own scale"
    return f"its shorter side resized to {resize} ({interpolation}), then the {size}x{size} centre cropped"
