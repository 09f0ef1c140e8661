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
                          transform with SplitType=Line); blank lines skipped
  application/x-recordio  MXNet RecordIO records, one image each (batch transform with
                          SplitType=RecordIO: several records a body with BatchStrategy=MultiRecord);
                          a record of im2rec's .rec (an image record: IRHeader, then the image) is
                          its image; answered as JSON Lines is, a line per record
Base64 is read as TF Serving's JSON API reads it (abseil's Base64Unescape): line breaks and other
whitespace inside skipped (MIME's 76-column lines), '=' padding optional; and, beyond TF Serving,
the URL-safe alphabet too (whole, not mixed with the standard one).
JSON Lines and RecordIO bodies (batch transform's reach 100 MB) are not decoded at parse: their
images are a LazyImages, decoded one at a time when asked, so that a body costs itself and the
slice the model is running rather than several times itself; Predictor.check reads each once before the
model runs, so a line or record that cannot be decoded is still a 400 that names it.
Answers, by the dialect the model was trained in (serving.json's "dialect"), so that a built-in
algorithm's clients read them as they read that built-in's (Accept, weighed as RFC 9110 §12.5.1
says: the type of highest q wins, each type weighed by the most specific range naming it, equals
in the order written; a missing Accept, */* and application/* are the dialect's default, the first
in each list, and then the next the dialect writes):
  keras-pipe  application/json (with JSON Lines or RecordIO in: application/jsonlines): this
              project's prediction object (predicted_label or predicted_labels and threshold,
              top_k, labels, probabilities); application/jsonlines: one line per image, its object
  mxnet       application/json: the bare list of every class's probability, in label order (the
              built-in's notebooks do np.argmax(json.loads(body))); application/jsonlines:
              {"prediction": [p0, p1, ...]} per image, the default in batch transform
              (SAGEMAKER_BATCH=true) and with JSON Lines or RecordIO in
  tensorflow  application/json: {"probabilities": [...]}; application/json;verbose: {"probabilities":
              [...], "labels": [...], "predicted_label": "<name of the likeliest class>"};
              application/jsonlines (;verbose): those objects, one line per image
  and in every dialect, this project's object: application/vnd.keras-pipe+json, and one line per
  image: application/vnd.keras-pipe+jsonlines
One image sent as such is answered with one JSON value; several, in JSON, with {"predictions":
[one value per image]}. Any other Accept is a 406.
"""

from __future__ import annotations

import binascii
import json
import re
from abc import abstractmethod
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from keras_pipe_train.settings.dialects import KERAS_PIPE, MXNET, TENSORFLOW
from keras_pipe_train.sources import image_record_header
from pipemode.corruption import CorruptionPolicy
from pipemode.errors import CorruptRecordError
from pipemode.recordio import MAGIC_BYTES, RecordIODecoder

IMAGE_TYPES = ("application/x-image", "image/", "application/octet-stream")
JSON = "application/json"
JSON_LINES = ("application/jsonlines", "application/x-jsonlines", "application/json-lines")
RECORDIO = "application/x-recordio"
ACCEPTED = ("application/x-image, image/jpeg, image/png, application/json, application/jsonlines or "
            "application/x-recordio")
# this project's own answer, one Accept away in any dialect (the dialect: serving.json's, Predictor.dialect)
RICH = "application/vnd.keras-pipe+json"
RICH_LINES = "application/vnd.keras-pipe+jsonlines"
RICH_FORM, TENSORFLOW_VERBOSE = "keras-pipe", "tensorflow;verbose"  # (Answer.form: the others are the dialects')
ANSWERS = {KERAS_PIPE: "application/json or application/jsonlines",
           MXNET: "application/json or application/jsonlines",
           TENSORFLOW: "application/json, application/json;verbose or application/jsonlines"}


class Refusal(Exception):
    """A request answered with no predictions: `status`, the message the client gets, and the
    headers the answer needs (Allow, Retry-After)."""

    def __init__(self, status: int, message: str, *headers: tuple[str, str]):
        super().__init__(message)
        self.status = status
        self.headers = list(headers)


class BadRequest(Refusal):
    """The client's mistake (a 4xx): its request cannot be answered as it is."""


@dataclass(frozen=True)
class Request:
    images: Sequence[bytes]  # a list, or for JSON Lines and RecordIO a LazyImages (decoded when read)
    lines: bool  # JSON Lines or RecordIO in: the answer keeps a line per line (record) in unless told otherwise
    single: bool  # one image sent as such (not as a list of one): answered with one object


def media_type(header: str | None) -> str:
    """'Image/JPEG; charset=x' -> 'image/jpeg'."""
    return (header or "").split(";")[0].strip().lower()


def parse(content_type: str | None, body: bytes | bytearray | memoryview) -> Request:
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
        return Request(json_lines(body), lines=True, single=False)
    if kind == RECORDIO:
        # (a record per image, as batch transform splits: answered a line per record, as lines are)
        return Request(recordio(body), lines=True, single=False)
    raise BadRequest(415, f"unsupported Content-Type {kind!r}: send {ACCEPTED}")


def _text(body: bytes | bytearray | memoryview, where: str) -> str:
    try:
        return str(body, "utf-8")  # (a memoryview too: a line of a body is decoded without a copy of its bytes)
    except UnicodeDecodeError as err:
        raise BadRequest(400, f"{where} is not UTF-8 text (byte {err.start}): JSON must be") from None


def _json(body: bytes | bytearray | memoryview, where: str):
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
    data = unbase64(value, where)
    if not data:
        raise BadRequest(400, f"{where} is empty")
    return data


# abseil's ascii_isspace, which its Base64Unescape skips wherever it stands (MIME and PEM wrap lines)
_SPACE = re.compile(r"[ \t\n\v\f\r]+")
# anything neither alphabet, padding nor such whitespace holds: refused, never dropped (as
# b64decode(validate=False) would, silently losing the data around it)
_OUTSIDE = re.compile(r"[^A-Za-z0-9+/\-_= \t\n\v\f\r]")
_URL_SAFE = str.maketrans("-_", "+/")


def unbase64(text: str, where: str) -> bytes:
    """The bytes `text` encodes, read as TF Serving's JSON API reads base64 (abseil's Base64Unescape;
    the URL-safe alphabet, which it refuses, taken too): whitespace anywhere skipped, '=' padding
    optional but exact when given; a 400 naming `where` and what is wrong otherwise."""
    try:  # the usual: one padded line of the standard alphabet, decoded in C at once
        data = binascii.a2b_base64(text, strict_mode=True)
        # (as long as the text says: strict mode still takes '=' after a whole quantum, "QUJD=")
        if len(data) == len(text) // 4 * 3 - text[-2:].count("="):
            return data
    except (binascii.Error, ValueError):  # (ValueError: a character outside ASCII)
        pass
    if bad := _OUTSIDE.search(text):
        raise BadRequest(400, f"{where} is not valid base64: {bad.group()!r} (character {bad.start() + 1}) is in "
                              f"neither base64 alphabet")
    digits = _SPACE.sub("", text)
    data = digits.rstrip("=")
    padding, needed = len(digits) - len(data), -len(data) % 4
    if "=" in data:
        raise BadRequest(400, f"{where} is not valid base64: '=' (padding) before its end")
    if ("+" in data or "/" in data) and ("-" in data or "_" in data):
        raise BadRequest(400, f"{where} is not valid base64: it mixes the standard (+/) and URL-safe (-_) alphabets")
    if len(data) % 4 == 1:  # (6 bits cannot end a byte: no padding makes this base64)
        raise BadRequest(400, f"{where} is not valid base64: {len(data)} characters (whitespace aside), one more "
                              f"than a multiple of 4, cannot be base64, padded or not")
    if padding and padding != needed:
        raise BadRequest(400, f"{where} is not valid base64: {padding} '=' after {len(data)} characters, which "
                              f"take {needed} (or none)")
    return binascii.a2b_base64(data.translate(_URL_SAFE) + "=" * needed, strict_mode=True)


class LazyImages(Sequence):
    """The images of a JSON Lines or RecordIO body, decoded when asked for, one at a time:
    len(images); images[i] -> bytes; images[a:b] -> list[bytes]; iterating. It holds the body (a
    view of it, never a copy) and where each line or record lies in it, nothing decoded.

    Why: batch transform's bodies reach 100 MB, and decoding one whole (its text, every line's
    JSON, every image) takes several times that at once (docs/speed.md, Figures behind the code's
    choices: Lazy bodies); read as the model reads, a slice at a time, a body costs itself and a
    slice. The price: every read decodes again (Predictor.check's pass,
    then the model's slices: each image decoded twice), CPU spent to keep memory flat.
    A line or record that cannot be decoded raises the 400 naming it (BadRequest)."""

    def __init__(self, body: memoryview, starts: array, ends: array):
        self._body, self._starts, self._ends = body, starts, ends

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self._image(i) for i in range(len(self))[index]]
        return self._image(range(len(self))[index])  # (negative indices; IndexError past the end)

    def __iter__(self) -> Iterator[bytes]:
        return map(self._image, range(len(self)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {len(self)} images in a body of {len(self._body)} bytes>"

    @abstractmethod
    def _image(self, index: int) -> bytes:
        """The image at `index`, decoded from its line or record (each kind of body its own)."""


class JsonLinesImages(LazyImages):
    """A JSON Lines body's images: a line each (blank ones skipped), named by its line number."""

    def __init__(self, body: memoryview, starts: array, ends: array, numbers: array):
        super().__init__(body, starts, ends)
        self._numbers = numbers  # each image's line number, from 1 (blank lines count, as an editor counts)

    def _image(self, index: int) -> bytes:
        where = f"line {self._numbers[index]}"
        return _one_image(_json(self._body[self._starts[index]:self._ends[index]], where), where)


class RecordIOImages(LazyImages):
    """A RecordIO body's images: a record each, named by its number (from 1) and byte offset."""

    def _image(self, index: int) -> bytes:
        start, end = self._starts[index], self._ends[index]
        # the record's parts joined as dmlc joins them (the magic word put back between them), by
        # the training reader's own decoder
        stream = next(RecordIODecoder(CorruptionPolicy()).streams(_reader(self._body[start:end]), "the record"))
        return record_image(stream.read_all(), f"record {index + 1} (byte offset {start})")


# a line holding anything but whitespace; and any line, with its "\n" (JSON Lines' separator: a
# "\r" before it is JSON's whitespace)
_NOT_BLANK = re.compile(rb"\S")
_LINE = re.compile(rb"[^\n]*\n|[^\n]+")


def json_lines(body: bytes | bytearray | memoryview) -> JsonLinesImages:
    """The lines of a JSON Lines body, found in one pass over it and nothing decoded (LazyImages)."""
    view = _view(body)
    starts, ends, numbers = array("Q"), array("Q"), array("Q")
    for number, line in enumerate(_LINE.finditer(view), 1):
        start, end = line.span()
        if _NOT_BLANK.search(view, start, end):
            starts.append(start)
            ends.append(end)
            numbers.append(number)
    if not starts:
        raise BadRequest(400, "the JSON Lines body holds no line: send one image per line")
    return JsonLinesImages(view, starts, ends, numbers)


def recordio(body: bytes | bytearray | memoryview) -> RecordIOImages | list[bytes]:
    """The records of a RecordIO body, framed in one pass over it (by the training reader's RecordIO
    decoder, pipemode.recordio) and nothing decoded (LazyImages); a 400 naming the first record
    that is not RecordIO."""
    view = _view(body)
    if not view:
        raise BadRequest(400, "the request body is empty: send RecordIO records, an image each")
    if view[:4] != MAGIC_BYTES:
        # BatchStrategy=SingleRecord: SageMaker sends one record's payload, its framing and padding
        # removed (CreateTransformJob's SplitType: "padding is removed if ... SingleRecord")
        return [record_image(view, "the body (one RecordIO record's payload, as SingleRecord sends it)")]
    if len(view) % 4:  # (a record whose padding was removed: framed records are padded to 4 bytes)
        view = memoryview(bytes(view) + b"\0" * (-len(view) % 4))
    starts = array("Q")
    try:
        # (raising at the first bad record: the policy skips none)
        for stream in RecordIODecoder(CorruptionPolicy()).streams(_reader(view), "the request body"):
            starts.append(stream.offset)
    except CorruptRecordError as err:
        raise BadRequest(400, f"record {err.record + 1} of the body (at byte offset {err.offset}) is not valid "
                              f"RecordIO: {err.detail}") from None
    # (framed without a gap: each record ends where the next one starts)
    return RecordIOImages(view, starts, starts[1:] + array("Q", [len(view)]))


def _view(body: bytes | bytearray | memoryview) -> memoryview:
    """The body as bytes to slice without copying (the server's buffer is a bytearray)."""
    return memoryview(body).cast("B")


def _reader(view: memoryview):
    """read(n) over a body in memory, as pipemode's RecordIO decoder reads a stream: the bytes it
    expects (it joins what it reads back with bytes), each piece a copy of at most a record's part
    (or 1 MB), dropped once framed: never the body whole."""
    at = 0

    def read(n: int) -> bytes:
        nonlocal at
        piece = bytes(view[at:at + n])
        at += len(piece)
        return piece

    return read


# how images start (JPEG, PNG, GIF, BMP, WebP: the formats the model decodes): a record holding
# one as such is that image, not an im2rec record
_IMAGE_STARTS = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM", b"RIFF")


def record_image(payload: bytes | memoryview, where: str) -> bytes:
    """The image a RecordIO record holds: the payload itself where it starts as an image does, else
    what follows im2rec's header (keras_pipe_train.sources.image_record_header, which the job reads
    the same): every record of the .rec files the MXNet built-in trains on."""
    if bytes(payload[:8]).startswith(_IMAGE_STARTS):
        return bytes(payload)
    try:
        header = image_record_header.unpack(payload)
    except image_record_header.ImageRecordError as err:
        raise BadRequest(400, f"{where} is neither an image nor an im2rec image record: {err}") from None
    return bytes(payload[header.image_offset:])


class Answer(NamedTuple):
    """How to answer: `kind`, the Content-Type sent back; `form`, the shape of each image's answer
    (RICH_FORM, MXNET, TENSORFLOW or TENSORFLOW_VERBOSE)."""
    kind: str
    form: str

    @property
    def lines(self) -> bool:
        return self.kind in (JSON_LINES[0], RICH_LINES)


class Range(NamedTuple):
    """One media range of Accept: its type ('application/json', 'application/*', '*/*'), the names
    of its parameters (its weight left out) and its weight, q."""
    kind: str
    parameters: frozenset[str]
    q: float


# a list's items and an item's parameters, split where no quoted string holds the separator
_ITEMS = re.compile(r'(?:"(?:[^"\\]|\\.)*"|[^,"])+')
_PARAMETERS = re.compile(r'(?:"(?:[^"\\]|\\.)*"|[^;"])+')
# a weight: RFC 9110's qvalue ("0", "0.5", "1.000") read as any plain decimal, so that ".2" (Java's
# URLConnection sends "*; q=.2") and a fourth decimal are understood
_QVALUE = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def accepted(accept: str | None) -> list[Range]:
    """'application/json;verbose, */*;q=0.1' -> [Range('application/json', {'verbose'}, 1.0),
    Range('*/*', set(), 0.1)]: each media range, its parameters' names and its weight (RFC 9110
    §12.5.1; 1 unless given). A weight that is not a number from 0 to 1 is a 400: the RFC gives it
    no meaning, and no guess is safe (taken as 1, it could answer in a type the client meant to rule
    out with q=0); said, the client can mend it."""
    ranges = []
    for item in _ITEMS.findall(accept or ""):
        kind, *parameters = (p.strip() for p in _PARAMETERS.findall(item))
        if not kind:
            continue
        names, q = set(), 1.0
        for parameter in parameters:
            name, _, value = parameter.partition("=")
            name = name.strip().lower()
            if name == "q":
                q = _weight(value.strip(), item.strip())
            elif name:
                names.add(name)
        ranges.append(Range(kind.lower(), frozenset(names), q))
    return ranges


def _weight(value: str, item: str) -> float:
    q = float(value) if _QVALUE.fullmatch(value) else -1.0
    if not 0 <= q <= 1:
        raise BadRequest(400, f"Accept's {item!r} has the weight q={value[:20]!r}: a weight is a number from 0 to "
                              f"1 (RFC 9110 §12.5.1)")
    return q


class _Offer(NamedTuple):
    """An answer this server can write: the media types that ask for it, and whether it is the
    verbose form (True, False: the TensorFlow dialect's JSON; None: a type with no such form)."""
    names: tuple[str, ...]
    verbose: bool | None
    answer: Answer


def _offers(dialect: str, lines: bool) -> list[_Offer]:
    """What the server writes in `dialect`, in its order of preference: the default first (JSON
    Lines where `lines`), the other of JSON and JSON Lines next, this project's types last."""
    kinds = [(JSON, (JSON,)), (JSON_LINES[0], JSON_LINES)]
    rich = [(RICH, (RICH,)), (RICH_LINES, (RICH_LINES,))]
    if lines:
        kinds.reverse()
        rich.reverse()
    offers = []
    for kind, names in kinds:
        if dialect == TENSORFLOW:  # (verbose: a parameter of the type, naming the other form)
            offers += [_Offer(names, False, Answer(kind, TENSORFLOW)),
                       _Offer(names, True, Answer(kind, TENSORFLOW_VERBOSE))]
        else:
            offers.append(_Offer(names, None, Answer(kind, MXNET if dialect == MXNET else RICH_FORM)))
    return offers + [_Offer(names, None, Answer(kind, RICH_FORM)) for kind, names in rich]


def _specificity(range_: Range, offer: _Offer) -> int | None:
    """How closely the range names the offer, by RFC 9110's precedence (3: the type with its
    verbose parameter, 2: the type, 1: application/*, 0: */*), or None where it does not name it.
    Parameters other than verbose, and verbose where the type has no such form, are passed over
    (charset=utf-8 still names JSON)."""
    verbose = offer.verbose is not None and "verbose" in range_.parameters
    if verbose and not offer.verbose:  # (the range names the verbose form only)
        return None
    if range_.kind == "*/*":
        return 0
    if range_.kind == "application/*":  # (every answer is application/...)
        return 1
    if range_.kind in offer.names:
        return 3 if verbose else 2
    return None


def answer_type(accept: str | None, request: Request, dialect: str = KERAS_PIPE, batch: bool = False) -> Answer:
    """How to answer, from Accept and the model's dialect, as RFC 9110 §12.5.1 says: each answer
    this server writes is weighed by the most specific range naming it (q=0: not acceptable), and
    the heaviest wins; equals, in the order the client wrote their ranges, then the dialect's
    order (so */* is the dialect's default, and the next where the default weighs 0). `batch`: the
    server runs for batch transform (SAGEMAKER_BATCH), where the MXNet built-in's default answer is
    JSON Lines."""
    ranges = accepted(accept) or [Range("*/*", frozenset(), 1.0)]
    candidates = []  # (-q, the place of the range giving it, the dialect's preference, the answer): the least wins
    for preference, offer in enumerate(_offers(dialect, request.lines or (batch and dialect == MXNET))):
        weighed = _weighed(offer, ranges)
        if weighed and weighed[0] > 0:
            candidates.append((-weighed[0], weighed[1], preference, offer.answer))
    if not candidates:
        raise BadRequest(406, f"cannot answer in {accept!r}: Accept {ANSWERS[dialect]}, or {RICH} or {RICH_LINES} "
                              f"(this project's own answer)")
    return min(candidates)[-1]


def _weighed(offer: _Offer, ranges: list[Range]) -> tuple[float, int] | None:
    """The offer's weight and the place of the range that gives it: the most specific range naming
    it, of equally specific ones the first written; None where none names it."""
    naming = [(specificity, -place) for place, range_ in enumerate(ranges)
              if (specificity := _specificity(range_, offer)) is not None]
    if not naming:
        return None
    place = -max(naming)[1]
    return ranges[place].q, place


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
