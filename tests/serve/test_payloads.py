"""What /invocations takes and how it answers, request by request, in each dialect (no model, no
server: the settings that choose the answer are read here too)."""

import base64
import json
import re

import pytest
from keras_pipe_serve import payloads
from keras_pipe_serve.payloads import RICH, RICH_LINES, BadRequest, answer_type, parse, render, top_k_of
from keras_pipe_serve.predictor import ModelError, serving_settings

from keras_pipe_train.settings.dialects import DIALECTS

JPEG = b"\xff\xd8\xff\xe0 a jpeg"
PNG = b"\x89PNG\r\n\x1a\n a png"
B64 = base64.b64encode(JPEG).decode()


@pytest.mark.parametrize("content_type", ["application/x-image", "image/jpeg", "image/png", "Image/JPEG; q=1",
                                          "application/octet-stream"])
def test_an_image_body_is_one_image(content_type):
    assert parse(content_type, JPEG) == payloads.Request([JPEG], lines=False, single=True)


@pytest.mark.parametrize("body, single", [
    ({"instances": [{"b64": B64}, {"b64": base64.b64encode(PNG).decode()}]}, False),  # TF Serving's row form
    ({"instances": [{"image_bytes": {"b64": B64}}, {"image_bytes": {"b64": base64.b64encode(PNG).decode()}}]}, False),
    ({"inputs": {"image_bytes": [{"b64": B64}, {"b64": base64.b64encode(PNG).decode()}]}}, False),  # columnar
    ([B64, base64.b64encode(PNG).decode()], False),  # a plain list of base64 strings
    ([{"b64": B64}, base64.urlsafe_b64encode(PNG).decode()], False),  # mixed, URL-safe alphabet
])
def test_the_json_forms_of_several_images(body, single):
    request = parse("application/json", json.dumps(body).encode())
    assert request.images == [JPEG, PNG] and request.single is single and not request.lines


def test_one_b64_object_is_one_image_answered_as_one():
    assert parse("application/json", json.dumps({"b64": B64}).encode()).single


def test_json_lines_one_image_per_line_blank_lines_skipped():
    body = f'{{"b64": "{B64}"}}\n\n"{B64}"\r\n{{"image_bytes": {{"b64": "{B64}"}}}}\n'.encode()
    request = parse("application/jsonlines", body)
    assert list(request.images) == [JPEG] * 3 and request.lines


@pytest.mark.parametrize("content_type, body, status, message", [
    (None, JPEG, 415, "the request has no Content-Type"),
    ("text/csv", b"1,2", 415, "unsupported Content-Type 'text/csv': send application/x-image"),
    ("image/jpeg", b"", 400, "the request body is empty"),
    ("application/json", b'{"instances": [', 400, "the request body is not valid JSON (Expecting value at line 1"),
    ("application/json", b"\xff\xfe{}", 400, "the request body is not UTF-8 text (byte 0)"),
    ("application/json", b"[" * 100_000 + b"]" * 100_000, 400, "nested too deep"),
    ("application/json", b'{"instances": []}', 400, "the request lists no image"),
    ("application/json", b'{"instances": [{"b64": "not base64!"}]}', 400, "image 1 is not valid base64"),
    ("application/json", b'{"instances": [{"b64": ""}]}', 400, "image 1 is empty"),
    ("application/json", b'{"instances": [1]}', 400, 'image 1 is not an image: expected {"b64"'),
    ("application/json", b'{"instances": "x"}', 400, "'instances' must be a list"),
    ("application/json", b'{"instances": [], "inputs": []}', 400, "both 'instances' and 'inputs'"),
    ("application/jsonlines", b'{"b64": "' + B64.encode() + b'"}\n{oops\n', 400, "line 2 is not valid JSON"),
    ("application/jsonlines", b"\n\n", 400, "holds no line"),
])
def test_malformed_requests_are_refused_saying_what_is_wrong(content_type, body, status, message):
    """(Every image read, as Predictor.check reads them before the model runs: a JSON Lines line is
    decoded only then.)"""
    with pytest.raises(BadRequest, match=re.escape(message)) as refused:
        list(parse(content_type, body).images)
    assert refused.value.status == status


# every 6-bit value (so both alphabets' own characters), at lengths that pad with 0, 1 and 2 '='
IMAGES = [bytes(range(256)) * 3 + b"xy"[:extra] for extra in (0, 1, 2)]


def pem(data: bytes) -> str:
    """PEM's wrapping (64 columns, CRLF), of the URL-safe alphabet."""
    text = base64.urlsafe_b64encode(data).decode()
    return "\r\n".join(text[i:i + 64] for i in range(0, len(text), 64))


@pytest.mark.parametrize("image", IMAGES, ids=["padless", "one pad", "two pads"])
@pytest.mark.parametrize("encode", [
    lambda data: base64.encodebytes(data).decode(),  # MIME: 76 columns, "\n" after each line (Python's, many clients')
    lambda data: base64.encodebytes(data).decode().replace("\n", "\r\n"),
    lambda data: " " + "\t".join(base64.b64encode(data).decode()[i:i + 10] for i in range(0, 1100, 10)) + "\n",
    lambda data: base64.b64encode(data).decode().rstrip("="),  # unpadded
    lambda data: base64.urlsafe_b64encode(data).decode(),  # URL-safe
    lambda data: base64.urlsafe_b64encode(data).decode().rstrip("="),
    pem,
], ids=["mime", "mime crlf", "spaces and tabs", "unpadded", "url-safe", "url-safe unpadded", "pem"])
def test_base64_is_read_as_tf_serving_reads_it(image, encode):
    """abseil's Base64Unescape (TF Serving's JSON API): whitespace anywhere skipped, padding optional."""
    text = encode(image)
    assert parse("application/json", json.dumps({"instances": [{"b64": text}]}).encode()).images == [image]
    assert list(parse("application/jsonlines", json.dumps({"b64": text}).encode()).images) == [image]


@pytest.mark.parametrize("text, problem", [
    # a character of neither alphabet is refused, not dropped (b64decode(validate=False) would read ABCDEFG)
    ("QUJD!RUZH", "'!' (character 5) is in neither base64 alphabet"),
    ("QUJD\x00RUZH", "'\\x00' (character 5) is in neither base64 alphabet"),
    ("QUJDé", "'é' (character 5) is in neither base64 alphabet"),
    ("QUJDR", "5 characters (whitespace aside), one more than a multiple of 4, cannot be base64, padded or not"),
    ("QUJD\nRUZH\nR", "9 characters (whitespace aside), one more than a multiple of 4"),
    ("QUJDRQ=", "1 '=' after 6 characters, which take 2 (or none)"),
    ("QUJD=", "1 '=' after 4 characters, which take 0 (or none)"),
    ("QQ==QUJD", "'=' (padding) before its end"),
    ("ab+c-d", "it mixes the standard (+/) and URL-safe (-_) alphabets"),
])
def test_what_is_not_base64_is_refused_naming_the_image(text, problem):
    body = json.dumps({"instances": [{"b64": B64}, B64, {"b64": text}]}).encode()
    with pytest.raises(BadRequest, match=re.escape(f"image 3 is not valid base64: {problem}")) as refused:
        parse("application/json", body)
    assert refused.value.status == 400
    lines = f'"{B64}"\n\n{json.dumps(text)}\n'.encode()
    with pytest.raises(BadRequest, match=re.escape(f"line 3 is not valid base64: {problem}")):
        list(parse("application/jsonlines", lines).images)


@pytest.mark.parametrize("accept, lines, expected", [
    (None, False, "application/json"),
    ("*/*", False, "application/json"),
    ("application/json", True, "application/json"),
    (None, True, "application/jsonlines"),  # batch transform's Line split: a line out for each line in
    ("*/*", True, "application/jsonlines"),
    ("application/jsonlines", False, "application/jsonlines"),
    ("text/html, application/json;verbose", False, "application/json"),
    (RICH, False, RICH),
    (RICH_LINES, False, RICH_LINES),
])
def test_the_answer_type_follows_accept(accept, lines, expected):
    """(A model of this project's dialect: its own answer, whatever the type.)"""
    answer = answer_type(accept, payloads.Request([JPEG], lines=lines, single=not lines))
    assert answer == (expected, payloads.RICH_FORM)


def test_an_answer_type_it_cannot_write_is_406():
    with pytest.raises(BadRequest, match="cannot answer in 'text/csv'") as refused:
        answer_type("text/csv", payloads.Request([JPEG], lines=False, single=True))
    assert refused.value.status == 406


ONE, LINES = payloads.Request([JPEG], lines=False, single=True), payloads.Request([JPEG], lines=True, single=False)


@pytest.mark.parametrize("dialect, accept, request_, batch, expected", [
    # the MXNet built-in: a bare list in real time (no Accept, or SDK v2's */*), {"prediction": ...} lines in
    # batch transform (SAGEMAKER_BATCH) and when asked
    ("mxnet", None, ONE, False, ("application/json", "mxnet")),
    ("mxnet", "*/*", ONE, False, ("application/json", "mxnet")),
    ("mxnet", "application/json", ONE, False, ("application/json", "mxnet")),
    ("mxnet", "application/json;verbose", ONE, False, ("application/json", "mxnet")),
    ("mxnet", None, ONE, True, ("application/jsonlines", "mxnet")),
    ("mxnet", "*/*", ONE, True, ("application/jsonlines", "mxnet")),
    ("mxnet", "application/json", ONE, True, ("application/json", "mxnet")),  # said: said
    ("mxnet", "application/jsonlines", ONE, False, ("application/jsonlines", "mxnet")),
    ("mxnet", None, LINES, False, ("application/jsonlines", "mxnet")),
    ("mxnet", RICH, ONE, True, (RICH, "keras-pipe")),
    ("mxnet", RICH_LINES, ONE, False, (RICH_LINES, "keras-pipe")),
    # the TensorFlow built-in: application/json (its default) or application/json;verbose
    ("tensorflow", None, ONE, False, ("application/json", "tensorflow")),
    ("tensorflow", "*/*", ONE, True, ("application/json", "tensorflow")),
    ("tensorflow", "application/json", ONE, False, ("application/json", "tensorflow")),
    ("tensorflow", "application/json;verbose", ONE, False, ("application/json", "tensorflow;verbose")),
    ("tensorflow", "Application/JSON ; Verbose", ONE, False, ("application/json", "tensorflow;verbose")),
    ("tensorflow", "text/csv, application/json;verbose;q=0.5", ONE, False, ("application/json", "tensorflow;verbose")),
    ("tensorflow", "application/jsonlines;verbose", ONE, False, ("application/jsonlines", "tensorflow;verbose")),
    ("tensorflow", None, LINES, False, ("application/jsonlines", "tensorflow")),
    ("tensorflow", RICH, ONE, False, (RICH, "keras-pipe")),
    # this project's: as before dialects, whether in batch transform or not
    ("keras-pipe", None, ONE, True, ("application/json", "keras-pipe")),
    ("keras-pipe", "application/json;verbose", ONE, False, ("application/json", "keras-pipe")),
])
def test_the_answer_follows_the_models_dialect(dialect, accept, request_, batch, expected):
    assert answer_type(accept, request_, dialect, batch) == expected


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_dialect_refuses_what_it_cannot_write_naming_this_projects_type(dialect):
    with pytest.raises(BadRequest, match=f"cannot answer in 'text/csv'.*{re.escape(RICH)}") as refused:
        answer_type("text/csv", ONE, dialect, batch=True)
    assert refused.value.status == 406


JSON, JSONL, VERBOSE = "application/json", "application/jsonlines", "tensorflow;verbose"


@pytest.mark.parametrize("dialect, accept, batch, expected", [
    # q-values are weights (RFC 9110 §12.5.1): the heaviest type wins, wherever it is written
    ("keras-pipe", "application/jsonlines;q=0.5, application/json", False, (JSON, "keras-pipe")),
    ("mxnet", "application/jsonlines;q=0.5, application/json", True, (JSON, "mxnet")),
    ("keras-pipe", "application/json;q=0.9, application/vnd.keras-pipe+json", False, (RICH, "keras-pipe")),
    ("tensorflow", "application/json;q=0.9, application/vnd.keras-pipe+json", False, (RICH, "keras-pipe")),
    ("keras-pipe", "*/*;q=0.1, application/jsonlines;q=0.5", False, (JSONL, "keras-pipe")),
    ("keras-pipe", "application/json;q=1.000, application/jsonlines;q=0.999", False, (JSON, "keras-pipe")),
    # q=0: not acceptable; */* then means the next the dialect writes
    ("keras-pipe", "application/json;q=0, */*", False, (JSONL, "keras-pipe")),
    ("mxnet", "application/json;q=0, */*", False, (JSONL, "mxnet")),
    ("tensorflow", "application/json;q=0, */*", False, (JSONL, "tensorflow")),
    ("mxnet", "application/jsonlines;q=0, */*", True, (JSON, "mxnet")),  # (batch transform's default is lines)
    ("keras-pipe", "application/json;q=0, application/*", False, (JSONL, "keras-pipe")),
    # a type is weighed by the most specific range naming it, not the heaviest
    ("keras-pipe", "application/json;q=0.2, */*;q=0.5", False, (JSONL, "keras-pipe")),
    ("keras-pipe", "application/*;q=0.5, application/jsonlines;q=0.4", False, (JSON, "keras-pipe")),
    ("tensorflow", "application/json;verbose;q=0.3, application/json;q=0.6", False, (JSON, "tensorflow")),
    ("tensorflow", "application/json;q=0.3, application/json;verbose", False, (JSON, VERBOSE)),
    ("tensorflow", "application/json;verbose;q=0, application/json", False, (JSON, "tensorflow")),
    ("tensorflow", "application/json;verbose;q=0, */*", False, (JSON, "tensorflow")),
    # equal weights: the order the client wrote them
    ("keras-pipe", "application/jsonlines, application/json", False, (JSONL, "keras-pipe")),
    ("tensorflow", "application/json, application/json;verbose", False, (JSON, "tensorflow")),
    ("tensorflow", "application/json;verbose, application/json", False, (JSON, VERBOSE)),
    ("tensorflow", "application/jsonlines;verbose;q=0.5, application/json;q=0.5", False, (JSONL, VERBOSE)),
    # parameters this server gives no meaning name the type all the same; quoted strings hold commas
    ("mxnet", "application/json; charset=utf-8", False, (JSON, "mxnet")),
    ("tensorflow", 'text/plain;note="a, b; q=1", application/json;verbose', False, (JSON, VERBOSE)),
    ("keras-pipe", "application/x-jsonlines", False, (JSONL, "keras-pipe")),
    # Java's URLConnection (its default Accept: q=.2, and a bare *)
    ("keras-pipe", "text/html, image/gif, image/jpeg, *; q=.2, */*; q=.2", False, (JSON, "keras-pipe")),
])
def test_accept_is_weighed_as_rfc_9110_says(dialect, accept, batch, expected):
    assert answer_type(accept, ONE, dialect, batch) == expected


@pytest.mark.parametrize("accept", ["*/*;q=0", "application/json;q=0", "text/csv, */*;q=0",
                                    "application/json;q=0, application/jsonlines;q=0, application/vnd.keras-pipe+json;q=0, "
                                    "application/vnd.keras-pipe+jsonlines;q=0"])
def test_what_the_client_refuses_with_q_0_is_never_the_answer(accept):
    with pytest.raises(BadRequest, match=re.escape(f"cannot answer in {accept!r}")) as refused:
        answer_type(accept, ONE, "keras-pipe")
    assert refused.value.status == 406


@pytest.mark.parametrize("weight", ["high", "2", "1.5", "-1", "", "1e-1", "nan", "0x1"])
def test_a_weight_that_is_no_number_from_0_to_1_is_400(weight):
    """(A guess could answer in a type the client meant to refuse: it is told instead.)"""
    with pytest.raises(BadRequest, match=re.escape(f"Accept's 'application/json;q={weight}' has the weight "
                                                   f"q={weight!r}: a weight is a number from 0 to 1")) as refused:
        answer_type(f"text/csv, application/json;q={weight}", ONE)
    assert refused.value.status == 400


def test_accepted_reads_each_range_its_parameters_and_weight():
    assert payloads.accepted("Application/JSON;Verbose;q=0.5, */*;q=.1,, text/csv") == [
        payloads.Range("application/json", frozenset({"verbose"}), 0.5), payloads.Range("*/*", frozenset(), 0.1),
        payloads.Range("text/csv", frozenset(), 1.0)]


def test_rendering_one_several_and_lines():
    one, two = {"predicted_label": "cat"}, {"predicted_label": "dog"}
    single = payloads.Request([JPEG], lines=False, single=True)
    several = payloads.Request([JPEG, PNG], lines=False, single=False)
    rich = payloads.Answer("application/json", payloads.RICH_FORM)
    assert json.loads(render([one], rich, single)) == one
    assert json.loads(render([one, two], rich, several)) == {"predictions": [one, two]}
    assert render([one, two], rich._replace(kind="application/jsonlines"), several).decode().splitlines() == [
        json.dumps(one), json.dumps(two)]
    assert render([one], rich._replace(kind=RICH), single) == render([one], rich, single)
    assert render([one], rich._replace(kind=RICH_LINES), single) == json.dumps(one).encode() + b"\n"


CAT = {"predicted_label": "dog", "top_k": [{"label": "dog", "probability": 0.5}], "labels": ["cat", "dog", "bird"],
       "probabilities": [0.25, 0.5, 0.25]}
TIE = {**CAT, "probabilities": [0.4, 0.4, 0.2]}


@pytest.mark.parametrize("form, kind, predictions, request_, expected", [
    ("mxnet", "application/json", [CAT], ONE, [0.25, 0.5, 0.25]),
    ("mxnet", "application/json", [CAT, TIE], LINES, {"predictions": [[0.25, 0.5, 0.25], [0.4, 0.4, 0.2]]}),
    ("mxnet", "application/jsonlines", [CAT], ONE, '{"prediction": [0.25, 0.5, 0.25]}\n'),
    ("mxnet", "application/jsonlines", [CAT, TIE], LINES,
     '{"prediction": [0.25, 0.5, 0.25]}\n{"prediction": [0.4, 0.4, 0.2]}\n'),
    ("tensorflow", "application/json", [CAT], ONE, {"probabilities": [0.25, 0.5, 0.25]}),
    ("tensorflow;verbose", "application/json", [CAT], ONE,
     {"probabilities": [0.25, 0.5, 0.25], "labels": ["cat", "dog", "bird"], "predicted_label": "dog"}),
    # equals: the first, as np.argmax (a multi-label model's object has no predicted_label: the same rule)
    ("tensorflow;verbose", "application/json", [{k: v for k, v in TIE.items() if k != "predicted_label"}], ONE,
     {"probabilities": [0.4, 0.4, 0.2], "labels": ["cat", "dog", "bird"], "predicted_label": "cat"}),
    ("tensorflow", "application/jsonlines", [CAT], ONE, '{"probabilities": [0.25, 0.5, 0.25]}\n'),
])
def test_each_dialects_answer(form, kind, predictions, request_, expected):
    body = render(predictions, payloads.Answer(kind, form), request_).decode()
    assert (body if isinstance(expected, str) else json.loads(body)) == expected
    if form == "tensorflow;verbose":  # in the TF algorithm's documented order
        assert list(json.loads(body)) == ["probabilities", "labels", "predicted_label"]


@pytest.mark.parametrize("header, expected", [(None, 5), ("", 5), ("top_k=2", 2), ("a=b; top_k = 3", 3),
                                              ("tfs-model-name=x,TOP_K=1", 1)])
def test_top_k_from_sagemakers_custom_attributes(header, expected):
    assert top_k_of(header, 5) == expected


@pytest.mark.parametrize("header, message", [("top_k=all", "must be a whole number, got 'all'"),
                                             ("top_k=0", "must be at least 1, got 0")])
def test_a_bad_top_k_is_400(header, message):
    with pytest.raises(BadRequest, match=message) as refused:
        top_k_of(header, 5)
    assert refused.value.status == 400


@pytest.mark.parametrize("settings, expected", [
    ({"max_image_pixels": 10, "threshold": None}, "keras-pipe"),  # an export from before dialects
    ({"dialect": "keras-pipe"}, "keras-pipe"), ({"dialect": "mxnet"}, "mxnet"), ({"dialect": "tensorflow"}, "tensorflow"),
])
def test_the_dialect_is_serving_jsons(settings, expected, tmp_path):
    (tmp_path / "serving.json").write_text(json.dumps(settings))
    assert serving_settings([tmp_path]).dialect == expected


@pytest.mark.parametrize("dialect", ["MXNet", "pytorch", None, 1])
def test_a_dialect_serve_does_not_speak_is_said_at_startup(dialect, tmp_path):
    (tmp_path / "serving.json").write_text(json.dumps({"dialect": dialect}))
    with pytest.raises(ModelError, match="serving.json's dialect is .*: this server answers in keras-pipe, mxnet, "
                                         "tensorflow"):
        serving_settings([tmp_path])


@pytest.mark.parametrize("value, batch", [(None, False), ("", False), ("true", True), ("True", True), ("false", False)])
def test_a_batch_transform_is_known_by_sagemaker_batch(value, batch, monkeypatch):
    """SageMaker sets SAGEMAKER_BATCH=true in a batch transform's container ("True" in the SDK's
    local mode): the MXNet dialect's default answer is then JSON Lines."""
    from keras_pipe_serve import server

    if value is None:
        monkeypatch.delenv("SAGEMAKER_BATCH", raising=False)
    else:
        monkeypatch.setenv("SAGEMAKER_BATCH", value)
    assert server.settings(["--model-dir", "model"])["batch"] is batch
