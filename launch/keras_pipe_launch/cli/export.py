"""`keras-pipe export`: a finished job's model exported to TFLite and ONNX, as the job exports
them when asked (export_formats), each checked against the model as served.

    keras-pipe export local-jobs/first/algo-1/model --formats tflite,onnx --validation prepared/validation
    keras-pipe export s3://my-bucket/jobs/first/output/model.tar.gz --formats tflite_int8 -o exports/

MODEL: a job's model folder (`keras-pipe local`'s algo-1/model), its model.tar.gz, here or in S3.
It needs what a job of this version writes there: model.keras, serving.json, classes.json and
preparation.json (how it prepares images). --formats: any of tflite, tflite_float16, tflite_int8,
tflite_full_int8, onnx (default: tflite,onnx). --validation: TFRecord files of the job's examples,
or folders of them (`keras-pipe prepare`'s validation/): each export answers them beside the model
as served, and is dropped below its bar (docs/job.md, Exports); without them the exports are kept
unchecked. tflite_full_int8 is calibrated on 200 images drawn from --representative (default:
the --validation records). The files and exports.json go in --output (default: MODEL/exports for a
folder, ./exports for an archive). Exit code 0 when every format asked was kept, 1 when one was
dropped (said), 2 when nothing could run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

from keras_pipe_launch.common.archives import unpack
from keras_pipe_launch.common.given_files import files_of
from keras_pipe_launch.common.objects import SourceError, parse_s3_uri
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError

# what the export reads of a model.tar.gz (neither the SavedModel nor the report's files)
NEEDED = ("model.keras", "serving.json", "classes.json", "preparation.json")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("export", help="export a job's model to TFLite and ONNX, checked against it",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="a job's model folder, or its model.tar.gz (a path or an s3:// URI)")
    parser.add_argument("--formats", default="tflite,onnx",
                        help="comma-separated: tflite, tflite_float16, tflite_int8, tflite_full_int8, onnx "
                             "(default: tflite,onnx)")
    parser.add_argument("--validation", nargs="+", default=[], metavar="TFRECORDS",
                        help="TFRecord files of the job's examples, or folders of them, to check each export on")
    parser.add_argument("--representative", nargs="+", default=None, metavar="TFRECORDS",
                        help="TFRecord files or folders, 200 of whose images calibrate tflite_full_int8's "
                             "activations (default: the --validation records; the job takes the training channel's)")
    parser.add_argument("--output", "-o", default=None,
                        help="the folder for the exports (default: MODEL/exports, or ./exports for an archive)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # (the converters' C++ notes, "Ignored output_format" and the like, are not the user's: errors show)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # (what the job's step logs, this command prints in its own lines: _said)
    logging.getLogger("keras_pipe_train").setLevel(logging.ERROR)
    try:
        try:
            from keras_pipe_train.after_training import folder_exports
            from keras_pipe_train.settings import parsers
            from keras_pipe_train.settings.errors import UserError
            from pipemode.errors import PipeDataError
        except ImportError as err:  # the launcher alone, without TensorFlow
            raise UsageError(f"keras-pipe export converts the model here and needs TensorFlow ({err.name} is "
                             "missing): pip install tensorflow-cpu") from None
        try:
            formats = parsers.export_formats("--formats", args.formats)
        except UserError as err:
            raise UsageError(str(err).replace("hyperparameter --formats", "--formats")) from None
        if not formats:
            raise UsageError("--formats: name at least one of tflite, tflite_float16, tflite_int8, tflite_full_int8, "
                             "onnx")
        validation = files_of(args.validation, "--validation ")
        representative = None if args.representative is None else files_of(args.representative, "--representative ")
        if "tflite_full_int8" in formats and not (validation or representative):
            raise UsageError("--formats tflite_full_int8 is calibrated on images: give --representative (or "
                             "--validation) records")
        with tempfile.TemporaryDirectory(prefix="keras-pipe-export-") as work:
            model_dir, unpacked = model_folder(args.model, Path(work))
            out = Path(args.output) if args.output else Path("exports") if unpacked else model_dir / "exports"
            try:
                found = folder_exports.export_folder(model_dir, formats, validation, out, representative, args.model)
            except UserError as err:  # (what the model folder lacks, a record that cannot be read)
                raise UsageError(str(err)) from None
            except PipeDataError as err:  # (a corrupt, truncated or unusable record: named, with its file)
                raise UsageError(str(err)) from None
            except OSError as err:  # (the output folder: not writable, the disk full)
                raise UsageError(f"{shown(str(out))}: {err.strerror or err}") from None
    except UsageError as err:
        print(f"keras-pipe export: error: {shown(str(err))}", file=sys.stderr)
        return 2
    return _said(found, out)


def _said(found: dict[str, dict], out: Path) -> int:
    from keras_pipe_train.model import conversions

    for export_format, figures in found.items():
        if "dropped" in figures:
            print(f"{export_format}: dropped: {figures['dropped']}")
            continue
        checked = (f"decides {figures['agreement']:.2%} of {figures['images']} validation images as the model does, "
                   f"its probabilities within {figures['max_probability_difference']:.2g}, accuracy "
                   f"{figures['accuracy']:.2%} (the model's {figures['savedmodel_accuracy']:.2%})"
                   if "agreement" in figures else f"unchecked: {figures['unchecked']}")
        size = figures["bytes"]
        print(f"{out / conversions.FILES[export_format]}: "
              f"{f'{size / 1e6:.2f} MB' if size >= 100_000 else f'{size / 1e3:.1f} kB'}, {checked}")
    print(f"{out / conversions.DESCRIBED}: what they take and answer")
    return 1 if any("dropped" in figures for figures in found.values()) else 0


def model_folder(model: str, work: Path) -> tuple[Path, bool]:
    """(the model folder, whether it was unpacked): MODEL itself, or the files NEEDED of its
    model.tar.gz (downloaded first from S3), unpacked in `work`."""
    if model.startswith("s3://"):
        archive = work / "model.tar.gz"
        _download(model, archive)
    elif Path(model).is_dir():
        return Path(model), False
    elif Path(model).is_file():
        archive = Path(model)
    else:
        raise UsageError(f"model {shown(model)} does not exist")
    unpack(archive, work / "model", lambda member: member.name.removeprefix("./") in NEEDED, "a model.tar.gz")
    return work / "model", True


def _download(uri: str, to: Path) -> None:
    import boto3
    import botocore.exceptions

    try:
        bucket, key = parse_s3_uri(uri)
    except SourceError as err:
        raise UsageError(str(err)) from None
    try:
        boto3.client("s3").download_file(bucket, key, str(to))
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as err:
        raise UsageError(f"{shown(uri)} cannot be downloaded: {err}") from None
