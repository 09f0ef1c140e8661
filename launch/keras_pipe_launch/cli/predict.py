"""`keras-pipe predict`: the exported model run here, over image files or folders.

    keras-pipe predict model.tar.gz photos/ > predictions.csv
    keras-pipe predict local-jobs/first/algo-1/model photo.jpg --format jsonl --top-k 3
    keras-pipe predict local-jobs/first/algo-1/model/exports/model_int8.tflite photos/
    keras-pipe predict local-jobs/first/algo-1/model photos/ --explain heatmaps/
    keras-pipe predict --endpoint digits-endpoint photos/ > predictions.csv
    keras-pipe predict --endpoint customers --target-model customer-a/model.tar.gz photos/

MODEL: a job's model.tar.gz (SageMaker's output/model.tar.gz), the model folder a job exported
(`keras-pipe local`'s algo-1/model), its SavedModel folder, or one of its exports (model/exports/:
*.tflite run by TensorFlow's TFLite interpreter, model.onnx by ONNX Runtime; export_formats), its
images decoded and prepared as exports.json beside it says. IMAGES: files, or folders searched
for images (.jpg .jpeg .png .gif .bmp .webp) at any depth. The model answers as `serve` does (the
same code), one row or line per image: CSV (path, the predicted class or classes, its probability,
then every class's probability) or JSON Lines (path and `serve`'s own prediction object, whatever
dialect the model answers its clients in: what `serve` answers to Accept
application/vnd.keras-pipe+jsonlines). An image that cannot be read is listed on stderr and left
out; the exit code is then 1 (2: nothing could run).

--explain DIR also writes, for each image, where the model found the evidence for each class it
predicted: the picture as the model saw it under a heatmap (red most, blue none), by Grad-CAM on
the backbone's feature map, or Integrated Gradients where there is none (a transformer's tokens),
as DIR/<image's name>.<class>.jpg (characters other than letters, digits, ".", "-" and "_" as
"_"; "-2", "-3"... where two images share a name). It needs the model's model.keras: a job's model
folder or its model.tar.gz.

--endpoint NAME asks a SageMaker endpoint serving this project's image instead of a model here
(every argument is then an image or a folder of them): an InvokeEndpoint call an image, several at
once, the same rows and lines out (sagemaker/endpoint_predictor.py). --target-model KEY: the model
to ask on a multi-model endpoint (`keras-pipe deploy --multi-model`), its key under the endpoint's
S3 prefix. An image the endpoint refuses is listed on stderr, with what it answered, and left out;
a call it cannot take yet (a model loading, throttling, its server at capacity) is tried again; a
container failing (a 5xx, or a timeout) on eight images before it answers any ends the run.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import sys
import tempfile
from pathlib import Path

from keras_pipe_launch.cli.export import NEEDED
from keras_pipe_launch.common.archives import unpack
from keras_pipe_launch.common.given_files import files_of
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.common.usage import UsageError
from keras_pipe_launch.prepare.sources import IMAGE_SUFFIXES
from keras_pipe_train.settings import serving_schema

EXPORTS = (".tflite", ".onnx")  # a model file that is an export, not a model.tar.gz
BATCH = 32  # images per call of the model: the same batch the server takes at most, well below


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("predict", help="run an exported model here over images",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="model.tar.gz, a job's model folder, its SavedModel folder, or an export "
                                      "(.tflite, .onnx)")
    parser.add_argument("images", nargs="*", help="image files or folders of them")
    parser.add_argument("--endpoint", metavar="NAME", default=None,
                        help="ask this SageMaker endpoint instead of a model here (the arguments are then all IMAGES)")
    parser.add_argument("--target-model", metavar="KEY", default=None,
                        help="with --endpoint, on a multi-model endpoint: the model to ask (InvokeEndpoint's "
                             "TargetModel, its key under the endpoint's S3 prefix: customer-a/model.tar.gz)")
    parser.add_argument("--format", choices=("csv", "jsonl"), default="csv", help="default: csv")
    parser.add_argument("--top-k", type=int, default=None, help="classes in each JSON line's top_k (default 5)")
    parser.add_argument("--output", "-o", default="-", help="a file to write (default: standard output)")
    parser.add_argument("--explain", metavar="DIR", default=None,
                        help="also write, in the folder DIR, each image's heatmap for each class predicted (MODEL: "
                             "a job's model folder or model.tar.gz)")
    parser.set_defaults(run=run, more_paths="images")


def run(args: argparse.Namespace) -> int:
    try:
        if args.top_k is not None and args.top_k < 1:
            raise UsageError(f"--top-k must be at least 1, got {args.top_k}")
        if args.endpoint is not None:
            return _at_the_endpoint(args)
        if args.target_model is not None:
            raise UsageError("--target-model names a model of a multi-model endpoint: give --endpoint too")
        if not args.images:
            raise UsageError("give the model, then the images (files or folders)")
        paths = images_of([Path(p) for p in args.images])
        with tempfile.TemporaryDirectory(prefix="keras-pipe-predict-") as work:
            model, explaining = Path(args.model), args.explain is not None
            if explaining and model.is_file() and model.suffix not in EXPORTS:
                # (once, with what the heatmaps need too: the export's model.keras and preparation.json)
                model = _unpacked(model, Path(work), NEEDED)
            predictor = _predictor(model, Path(work), explaining)
            explanations = None if not explaining else _explanations(model, args.model, Path(args.explain))
            with _opened(args.output) as out:
                code = predict(predictor, paths, args.format, args.top_k, out,
                               None if explanations is None else _writing(explanations, args.explain))
            if explanations is not None:
                _said(explanations, args.explain)
            return code
    except BrokenPipeError:  # `keras-pipe predict ... | head`: the reader has all it wants
        return 0
    except UsageError as err:
        print(f"keras-pipe predict: error: {shown(str(err))}", file=sys.stderr)
        return 2


def _at_the_endpoint(args: argparse.Namespace) -> int:
    """The images (all the arguments: there is no MODEL) asked of the endpoint."""
    from keras_pipe_launch.sagemaker.endpoint_predictor import EndpointPredictor

    if args.explain is not None:
        raise UsageError("--explain needs the model's model.keras here, not an endpoint: give the job's model folder "
                         "or model.tar.gz")
    given = [args.model, *args.images]
    models = [p for p in given if p.endswith((".tar.gz", *EXPORTS)) or (Path(p) / "classes.json").is_file()]
    if models:
        raise UsageError(f"{shown(models[0])} looks like a model: with --endpoint, the endpoint's model answers and "
                         "every argument is an image or a folder of them")
    paths = images_of([Path(p) for p in given])
    predictor = EndpointPredictor(args.endpoint, args.target_model)
    with _opened(args.output) as out:
        return predict(predictor, paths, args.format, args.top_k, out)


def images_of(given: list[Path]) -> list[Path]:
    return files_of(given, wanted=lambda path: path.suffix.lower() in IMAGE_SUFFIXES,
                    kind=f"image ({', '.join(sorted(IMAGE_SUFFIXES))})")


def _explanations(model_dir: Path, named: str, out: Path):
    """folder_explanations.Explanations of the model folder `model_dir` (`named` MODEL, as given),
    made before any prediction (what the model folder lacks, a folder that cannot be written: said
    at once)."""
    from keras_pipe_train.after_training.folder_explanations import Explanations
    from keras_pipe_train.settings.errors import UserError

    try:
        return Explanations(model_dir, named, out)
    except UserError as err:  # (what the model folder lacks: model.keras, preparation.json)
        raise UsageError(f"--explain: {err}") from None
    except OSError as err:
        raise UsageError(f"--explain {shown(str(out))}: {err.strerror or err}") from None


def _writing(explanations, out: str):
    def add(batch):
        try:
            explanations.add(batch)
        except OSError as err:  # (the disk full, say: the predictions already written stand)
            raise UsageError(f"--explain {shown(out)}: {err.strerror or err}") from None

    return add


def _said(explanations, out: str) -> None:
    none = (f"; {explanations.none_predicted} image(s) with no class predicted have none"
            if explanations.none_predicted else "")
    print(f"keras-pipe predict: {len(explanations.written)} heatmap(s) in {shown(out)}, by {explanations.how}{none}",
          file=sys.stderr)


def _predictor(model: Path, work: Path, explaining: bool = False):
    try:
        from keras_pipe_serve.predictor import ModelError, Predictor
    except ImportError as err:  # the launcher alone, without TensorFlow
        raise UsageError(f"keras-pipe predict runs the model here and needs TensorFlow ({err.name} is missing): "
                         "pip install tensorflow-cpu") from None
    if model.is_file() and model.suffix in EXPORTS:
        if explaining:
            raise UsageError(f"--explain needs the model's model.keras (a job's model folder or model.tar.gz), "
                             f"not {shown(str(model))}: an export has no gradients to follow")
        from keras_pipe_serve.export_predictor import ExportPredictor

        try:
            return ExportPredictor(model)
        except ModelError as err:
            raise UsageError(str(err)) from None
    if model.is_file():
        model = _unpacked(model, work)
    elif not model.is_dir():
        raise UsageError(f"model {shown(str(model))} does not exist")
    try:
        return Predictor(model)
    except ModelError as err:
        raise UsageError(str(err)) from None


def _unpacked(archive: Path, work: Path, also: tuple[str, ...] = ()) -> Path:
    """A model.tar.gz's SavedModel and its two JSON files, and the files `also` names, unpacked
    (common.archives)."""
    def wanted(member) -> bool:
        name = member.name.removeprefix("./")
        return name.split("/")[0].isdigit() or name in ("classes.json", serving_schema.FILE_NAME, *also)

    unpack(archive, work, wanted, "a model.tar.gz")
    return work


@contextlib.contextmanager
def _opened(output: str):
    if output == "-":
        yield sys.stdout
        return
    try:
        file = open(output, "w", newline="")
    except OSError as err:
        raise UsageError(f"--output {shown(output)}: {err.strerror}") from None
    with file:
        yield file


def predict(predictor, paths: list[Path], form: str, top_k: int | None, out, explain=None) -> int:
    """Each image's row or line in `out`; `explain` (where given) called with each batch's (path,
    image, the classes predicted)."""
    writer = csv.writer(out) if form == "csv" else None
    header = writer is not None  # (at once, or before the first row: an endpoint names its classes in its answers)
    if header and predictor.labels is not None:
        writer.writerow(["path", "predicted", "probability", *predictor.labels])
        header = False
    failed = 0
    for start in range(0, len(paths), BATCH):
        batch, data = [], []
        for path in paths[start : start + BATCH]:
            try:
                image = path.read_bytes()
            except OSError as err:
                failed += _failed(path, err.strerror or str(err))
                continue
            # checked from its header first: an image that is not one costs the others' batch nothing
            problem = predictor.problem(image)
            if problem:
                failed += _failed(path, problem)
            else:
                batch.append(path)
                data.append(image)
        predicted = []
        for path, prediction in _each(predictor, batch, data, top_k):
            if isinstance(prediction, str):
                failed += _failed(path, prediction)
                continue
            chosen = prediction.get("predicted_labels", [prediction.get("predicted_label")])
            if explain is not None:
                predicted.append((path, data[batch.index(path)], [str(c) for c in chosen if c is not None]))
            if header:
                writer.writerow(["path", "predicted", "probability", *predictor.labels])
                header = False
            if writer:
                best = max((prediction["probabilities"][predictor.labels.index(c)] for c in chosen), default=None)
                writer.writerow([str(path), " ".join(chosen), "" if best is None else f"{best:.6f}",
                                 *(f"{p:.6f}" for p in prediction["probabilities"])])
            else:
                out.write(json.dumps({"path": str(path), **prediction}) + "\n")
        if predicted:
            explain(predicted)
    if failed:
        print(f"keras-pipe predict: {failed} of {len(paths)} images could not be read or predicted (above); the "
              "others are predicted", file=sys.stderr)
    return 1 if failed else 0


def _each(predictor, paths, data, top_k):
    """(path, prediction or the reason it has none). An image whose header passed but whose data
    the model cannot decode (a corrupt scan) fails its whole batch: that batch is then retried one
    image at a time, so that it costs the others nothing."""
    from keras_pipe_serve.payloads import BadRequest

    if not paths:
        return
    try:
        yield from zip(paths, predictor.predict(data, top_k))
        return
    except BadRequest:
        pass
    for path, image in zip(paths, data):
        try:
            yield path, predictor.predict([image], top_k)[0]
        except BadRequest as err:
            yield path, str(err)


def _failed(path: Path, reason: str) -> int:
    print(f"keras-pipe predict: {shown(str(path))}: {shown(reason)}", file=sys.stderr)
    return 1
