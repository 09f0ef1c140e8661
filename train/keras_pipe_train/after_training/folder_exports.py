"""`keras-pipe export`: a finished job's model folder exported as the job exports it
(export_formats: after_training/conversions.py), for a job that did not ask, or for formats it did
not ask for. The model is model.keras, served as the job served it: its calibration and threshold
(serving.json), its classes (classes.json), how it prepares images and whether it flips them
(preparation.json, which jobs write from this version on). Each export is checked against the
model as served on the validation images given (TFRecord files of the job's examples), or kept
unchecked, and said; exports.json beside them."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import keras
import tensorflow as tf

from keras_pipe_train.after_training import conversions as step
from keras_pipe_train.model import conversions, hub
from keras_pipe_train.model.export import PREPARATION, served_probabilities
from keras_pipe_train.settings import serving_schema
from keras_pipe_train.settings.config import JobConfig
from keras_pipe_train.settings.errors import UserError
from keras_pipe_train.sources import datasets, example, preprocess
from keras_pipe_train.training.gathered import Within
from pipemode.corruption import CorruptionPolicy
from pipemode.tfrecord import TFRecordDecoder

BATCH = 64


def export_folder(model_dir: Path, formats: tuple[str, ...], validation: list[Path], out: Path,
                  representative: list[Path] | None = None, named: str | None = None) -> dict[str, dict]:
    """Each of `formats` converted from `model_dir`'s model, checked on the `validation` TFRecord
    files (none: unchecked), and written with exports.json in `out`; what was found of each (its
    figures, or why it was dropped). `representative`: the TFRecord files whose images a
    full-integer export is calibrated on (None: the validation files). A UserError naming what is
    missing or unreadable, and the model as `named` (by default its folder: an archive's is a
    temporary one)."""
    model_dir = Path(model_dir)
    named = named or str(model_dir)
    folder = read_model_folder(model_dir, named)
    model, settings, classes, flip = folder.model, folder.settings, folder.classes, folder.flip
    size, resize, interpolation = settings.image_size, folder.resize, folder.interpolation
    threshold = settings.threshold if settings.multi_label else None
    answer = served_probabilities(model, settings.calibration, settings.multi_label, flip)

    def batches(files=validation):
        return Within(_examples(files, classes, settings.multi_label, settings.max_image_pixels, size, resize,
                                interpolation),
                      threading.Event())

    drawn = validation if representative is None else representative
    converted, found = step.made(model, answer, size, threshold, formats, batches if validation else None,
                                 "no validation images given to compare it on (--validation)",
                                 (lambda: step.representative_images(batches(drawn))) if drawn else None)
    # (the exports of other formats already in the model's own exports/ stay; in a folder elsewhere,
    # which may hold another model's, they are removed)
    others = _others(out, formats, named) if Path(out).resolve() == (model_dir / conversions.FOLDER).resolve() else {}
    step.write(out, converted, step.described(size, resize, interpolation, threshold, classes, flip,
                                              settings.calibration, settings.max_image_pixels, settings.dialect,
                                              {**others, **found}), keep=tuple(others))
    return found


@dataclasses.dataclass(frozen=True)
class ModelFolder:
    """A job's model folder as `keras-pipe export` and `keras-pipe predict --explain` read it."""

    model: keras.Model  # model.keras, computing in float32
    settings: serving_schema.ServingSettings  # serving.json
    classes: list  # classes.json
    flip: bool  # preparation.json's: test_time_flip, resize, interpolation
    resize: object
    interpolation: str


def read_model_folder(model_dir: Path, named: str) -> ModelFolder:
    """`model_dir`'s model and how it serves; a UserError naming what is missing or unreadable, and
    the model as `named`."""
    try:
        settings = serving_schema.read(model_dir)
    except serving_schema.ServingFileError as err:
        raise UserError(str(err).replace(str(model_dir), named)) from None
    classes, preparation = _json(model_dir / "classes.json", named), _json(model_dir / PREPARATION, named)
    if settings is None or classes is None or preparation is None:
        missing = [name for name, found in (("serving.json", settings), ("classes.json", classes),
                                            (PREPARATION, preparation)) if found is None]
        raise UserError(f"{named} lacks {', '.join(missing)}: not a model folder a job of this version exported "
                        f"(preparation.json, how it prepares images, is written from the version with `keras-pipe "
                        f"export` on; an older job's model exports with export_formats when trained again)")
    try:
        flip, resize, interpolation = (bool(preparation["test_time_flip"]), preparation["resize"],
                                       str(preparation["interpolation"]))
    except (KeyError, TypeError):
        raise UserError(f"{named}'s {PREPARATION} is not what a job writes: {str(preparation)[:200]}") from None
    return ModelFolder(_model(model_dir, named), settings, classes, flip, resize, interpolation)


def _others(out: Path, formats: tuple[str, ...], named: str) -> dict[str, dict]:
    """The exports already in `out` (the job's, or an earlier export's) of formats not asked now:
    kept beside the new ones, with what exports.json said of them (a file missing: forgotten)."""
    said = _json(out / conversions.DESCRIBED, named) or {}
    return {name: figures for name, figures in (said.get("exports") or {}).items()
            if name in conversions.FILES and name not in formats and "dropped" not in figures
            and (out / conversions.FILES[name]).is_file()}


def _json(path: Path, named: str):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise UserError(f"{named}: {path.name} cannot be read: {err}") from None


def _model(model_dir: Path, named: str) -> keras.Model:
    path = model_dir / "model.keras"
    if not path.is_file():  # (a JumpStart SavedModel backbone's job writes none: model/export.py)
        raise UserError(f"{named} has no model.keras (a model whose backbone is a SavedModel, "
                        "JumpStart's, has none): export_formats exports it in the job, and its report has the heatmaps")
    try:
        model = hub.load_keras_file(path)
    except Exception as err:  # (Keras raises ValueError, TypeError, zipfile and h5py errors)
        raise UserError(f"{named}: model.keras cannot be loaded by Keras ({type(err).__name__}: "
                        f"{str(err)[:300]})") from None
    return conversions.in_float32(model)  # (trained with mixed precision: its layers compute in float16)


def _examples(files: list[Path], classes: list, multi_label: bool, max_pixels: int, size: int, resize,
              interpolation):
    """(images prepared as the SavedModel prepares them, labels) batches of the TFRecord `files`,
    the job's examples (image/encoded, image/class/label), read as the job reads them: each
    record's CRCs and features checked (a pipemode CorruptRecordError names the file and the record)."""
    config = JobConfig.from_hyperparameters({"class_names": [str(c) for c in classes], "multi_label": multi_label,
                                             "image_size": size})
    parse = datasets.parser(config)
    check = example.record_check(config.image_feature, config.label_feature, config.num_classes,
                                 max_pixels, multi_label=multi_label,
                                 label_format=config.label_format)
    batch, where = [], set()
    for path in files:
        decoder = TFRecordDecoder(CorruptionPolicy(), record_check=check)
        with open(path, "rb") as stream:
            for records in decoder.decode(stream.read, str(path), path.stat().st_size):
                for record in records:
                    batch.append(record)
                    where.add(str(path))
                    if len(batch) == BATCH:
                        yield _prepared(parse, batch, size, resize, interpolation, where)
                        batch, where = [], set()
    if batch:
        yield _prepared(parse, batch, size, resize, interpolation, where)


def _prepared(parse, records: list[bytes], size: int, resize, interpolation, where: set[str]):
    try:
        encoded, labels = parse(tf.constant(records))
        return preprocess.served_batch(encoded, size, resize, interpolation), labels
    except tf.errors.OpError as err:  # (past the record check: an image that does not decode, say)
        raise UserError(f"a record of {', '.join(sorted(where))} cannot be read as the job reads it: "
                        f"{err.message.splitlines()[0][:300]}") from None
