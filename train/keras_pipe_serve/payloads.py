"""What a request to /invocations may hold, and what the answer looks like: bytes in, images out;
predictions in, bytes out. No TensorFlow here: every malformed request is refused before the
model sees it, with the HTTP status that says whose fault it is and a message that says what.

Requests, as SageMaker's built-in image classifiers and TF Serving take them:
  application/x-image, image/jpeg, image/png (image/* in general)   the body is one image
  application/octet-stream  the same (SDK v2's Predictor sends raw bytes so unless told otherwise);
                          the image's own header says what it is
  application/json        TF Serving's {"instances": [{"b64": ...}, ...]} (also {"image_bytes":
                          {"b64": ...}} items and {"inputs": [...]}), a plain list of base64
                          strings or {"b64": ...} objects, or one such object: a list of images
  application/jsonlines   one image per line, in any of the JSON forms of one image above (batch
                          transform with SplitType=Line)
Answers, by the dialect the model was trained in (serving.json's "dialect"), so that a built-in
algorithm's clients read them as they read that built-in's (Accept; a missing Accept and */* are
the dialect's default, the first in each list; q-values are ignored, the first type written wins):
  keras-pipe  application/json (also with JSON Lines in: application/jsonlines): this project's
              prediction object (predicted_label or predicted_labels and threshold, top_k, labels,
              probabilities); application/jsonlines: one line per image, its object
  mxnet       application/json: the bare list of every class's probability, in label order (the
              built-in's notebooks do np.argmax(json.loads(body))); application/jsonlines:
              {"prediction": [p0, p1, ...]} per image, the default in batch transform
              (SAGEMAKER_BATCH=true) and with JSON Lines in
  tensorflow  application/json: {"probabilities": [...]}; application/json;verbose: {"probabilities":
              [...], "labels": [...], "predicted_label": "<name of the likeliest class>"};
              application/jsonlines (;verbose): those objects, one line per image
  and in every dialect, this project's object: application/vnd.keras-pipe+json, and one line per
  image: application/vnd.keras-pipe+jsonlines
One image sent as such is answered with one JSON value; several, in JSON, with {"predictions":
[one value per image]}. Any other Accept is a 406.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import NamedTuple

from keras_pipe_train.settings.dialects import KERAS_PIPE, MXNET, TENSORFLOW

IMAGE_TYPES = ("application/x-image", "image/", "application/octet-stream")
JSON = "application/json"
JSON_LINES = ("application/jsonlines", "application/x-jsonlines", "application/json-lines")
ACCEPTED = "application/x-image, image/jpeg, image/png, application/json or application/jsonlines"
# this project's own answer, one Accept away in any dialect (the dialect: serving.json's, Predictor.dialect)
RICH = "application/vnd.keras-pipe+json"
RICH_LINES = "application/vnd.keras-pipe+jsonlines"
RICH_FORM, TENSORFLOW_VERBOSE = "keras-pipe", "tensorflow;verbose"  # (Answer.form: the others are the dialects')
ANSWERS = {KERAS_PIPE: "application/json or application/jsonlines",
           MXNET: "application/json or application/jsonlines",
           TENSORFLOW: "application/json, application/json;verbose or application/jsonlines"}


class BadRequest(Exception):
    """A request the server refuses: `status` (4xx) and the message the client gets."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Request:
    images: list[bytes]
    lines: bool  # JSON Lines in: the answer keeps one line per input line unless told otherwise
    single: bool  # one image sent as such (not as a list of one): answered with one object


def media_type(header: str | None) -> str:
    """'Image/JPEG; charset=x' -> 'image/jpeg'."""
    return (header or "").split(";")[0].strip().lower()


def parse(content_type: str | None, body: bytes) -> Request:
    kind = media_type(content_type)
    if not kind:
        raise BadRequest(415, f"the request has no Content-Type; send {ACCEPTED}")
    if kind.startswith(IMAGE_TYPES):
        if not body:
            raise BadRequest(400, "the request body is empty: send the image's bytes")
        return Request([body], lines=False, single=True)
    if kind == JSON:
        value = _json(body, "the request body")
        images, single = _images_of(value)
        return Request(images, lines=False, single=single)
    if kind in JSON_LINES:
        text = _text(body, "the request body")
        images = [_one_image(_json_text(line, f"line {number}"), f"line {number}")
                  for number, line in enumerate(text.splitlines(), 1) if line.strip()]
        if not images:
            raise BadRequest(400, "the JSON Lines body holds no line: send one image per line")
        return Request(images, lines=True, single=False)
    raise BadRequest(415, f"unsupported Content-Type {kind!r}: send {ACCEPTED}")


def _text(body: bytes, where: str) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequest(400, f"{where} is not UTF-8 text (byte {err.start}): JSON must be") from None


def _json(body: bytes, where: str):
    return _json_text(_text(body, where), where)


def _json_text(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BadRequest(400, f"{where} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
                         ) from None
    except RecursionError:
        raise BadRequest(400, f"{where} is JSON nested too deep") from None


def _images_of(value) -> tuple[list[bytes], bool]:
    if isinstance(value, dict) and ("instances" in value or "inputs" in value):
        if "instances" in value and "inputs" in value:
            raise BadRequest(400, "the request has both 'instances' and 'inputs': send one of them (TF Serving's rule)")
        items = value.get("instances", value.get("inputs"))
        if isinstance(items, dict) and "image_bytes" in items:  # TF Serving's columnar form
            items = items["image_bytes"]
        if not isinstance(items, list):
            raise BadRequest(400, "'instances' must be a list of images ({\"b64\": ...} objects)")
    elif isinstance(value, list):
        items = value
    else:
        return [_one_image(value, "the request")], True
    if not items:
        raise BadRequest(400, "the request lists no image")
    return [_one_image(item, f"image {number}") for number, item in enumerate(items, 1)], False


def _one_image(value, where: str) -> bytes:
    """{"b64": s}, {"image_bytes": {"b64": s}} (or {"image_bytes": s}), or a base64 string s."""
    if isinstance(value, dict) and "image_bytes" in value:
        value = value["image_bytes"]
    if isinstance(value, dict) and "b64" in value:
        value = value["b64"]
    if not isinstance(value, str):
        raise BadRequest(400, f"{where} is not an image: expected {{\"b64\": \"<base64 of the image>\"}} or a base64 "
                              f"string, got {type(value).__name__}")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        try:  # the URL-safe alphabet (TF Serving accepts both)
            data = base64.urlsafe_b64decode(value)
            if base64.urlsafe_b64encode(data).rstrip(b"=") != value.encode().rstrip(b"="):
                raise ValueError
        except (binascii.Error, ValueError):
            raise BadRequest(400, f"{where} is not valid base64") from None
    if not data:
        raise BadRequest(400, f"{where} is empty")
    return data


class Answer(NamedTuple):
    """How to answer: `kind`, the Content-Type sent back; `form`, the shape of each image's answer
    (RICH_FORM, MXNET, TENSORFLOW or TENSORFLOW_VERBOSE)."""
    kind: str
    form: str

    @property
    def lines(self) -> bool:
        return self.kind in (JSON_LINES[0], RICH_LINES)


def accepted(accept: str | None) -> list[tuple[str, set[str]]]:
    """'application/json;verbose, */*;q=0.1' -> [('application/json', {'verbose'}), ('*/*', set())]:
    each media type with its parameters' names (q, the weight, left out)."""
    wanted = []
    for part in (accept or "").split(","):
        if part.strip():
            kind, *parameters = part.split(";")
            names = {p.split("=")[0].strip().lower() for p in parameters} - {"q", ""}
            wanted.append((kind.strip().lower(), names))
    return wanted


def answer_type(accept: str | None, request: Request, dialect: str = KERAS_PIPE, batch: bool = False) -> Answer:
    """How to answer, from Accept (a list, with q-values ignored: the first one this server
    writes wins) and the model's dialect; `batch`: the server runs for batch transform
    (SAGEMAKER_BATCH), where the MXNet built-in's default answer is JSON Lines."""
    for kind, parameters in accepted(accept) or [("*/*", set())]:
        if kind in ("*/*", "application/*"):  # the dialect's default
            lines = request.lines or (batch and dialect == MXNET)
            kind = JSON_LINES[0] if lines else JSON
        if kind == RICH:
            return Answer(RICH, RICH_FORM)
        if kind == RICH_LINES:
            return Answer(RICH_LINES, RICH_FORM)
        if kind == JSON or kind in JSON_LINES:
            answer_kind = JSON if kind == JSON else JSON_LINES[0]
            if dialect == TENSORFLOW:
                return Answer(answer_kind, TENSORFLOW_VERBOSE if "verbose" in parameters else TENSORFLOW)
            return Answer(answer_kind, MXNET if dialect == MXNET else RICH_FORM)
    raise BadRequest(406, f"cannot answer in {accept!r}: Accept {ANSWERS[dialect]}, or {RICH} or {RICH_LINES} "
                          f"(this project's own answer)")


def render(predictions: list[dict], answer: Answer, request: Request) -> bytes:
    """Each image's prediction (the Predictor's object) in the answer's form: one line each in
    JSON Lines, else one value for one image sent as such, {"predictions": [...]} for several."""
    values = [shaped(p, answer) for p in predictions]
    if answer.lines:
        return b"".join(json.dumps(v).encode() + b"\n" for v in values)
    if request.single:
        return json.dumps(values[0]).encode()
    return json.dumps({"predictions": values}).encode()


def shaped(prediction: dict, answer: Answer):
    """One image's answer in a dialect's form, from this project's prediction object."""
    if answer.form == RICH_FORM:
        return prediction
    probabilities = prediction["probabilities"]
    if answer.form == MXNET:  # the MXNet built-in: JSON, the bare list; JSON Lines, {"prediction": ...}
        return {"prediction": probabilities} if answer.lines else probabilities
    if answer.form == TENSORFLOW:
        return {"probabilities": probabilities}
    if answer.form == TENSORFLOW_VERBOSE:  # the likeliest class's name (the first of equals, as np.argmax)
        likeliest = max(range(len(probabilities)), key=probabilities.__getitem__)
        return {"probabilities": probabilities, "labels": prediction["labels"],
                "predicted_label": prediction["labels"][likeliest]}
    raise ValueError(f"no answer has the form {answer.form!r}")


def top_k_of(custom_attributes: str | None, default: int) -> int:
    """top_k from SageMaker's X-Amzn-SageMaker-Custom-Attributes header ("top_k=3", among other
    key=value pairs separated by ',' or ';'), else the default."""
    for pair in (custom_attributes or "").replace(";", ",").split(","):
        key, _, value = pair.partition("=")
        if key.strip().lower() == "top_k":
            try:
                k = int(value.strip())
            except ValueError:
                raise BadRequest(400, f"top_k in X-Amzn-SageMaker-Custom-Attributes must be a whole number, got "
                                      f"{value.strip()[:40]!r}") from None
            if k < 1:
                raise BadRequest(400, f"top_k in X-Amzn-SageMaker-Custom-Attributes must be at least 1, got {k}")
            return k
    return default
