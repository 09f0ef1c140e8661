"""What /invocations takes and how it answers, request by request (no model, no server)."""

import base64
import json
import re

import pytest
from keras_pipe_serve import payloads
from keras_pipe_serve.payloads import BadRequest, answer_type, parse, render, top_k_of

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
    assert request.images == [JPEG] * 3 and request.lines


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
    ("application/json", json.dumps([B64] * 65).encode(), 413, "65 images; at most 64 per request"),
    ("application/jsonlines", b'{"b64": "' + B64.encode() + b'"}\n{oops\n', 400, "line 2 is not valid JSON"),
    ("application/jsonlines", b"\n\n", 400, "holds no line"),
])
def test_malformed_requests_are_refused_saying_what_is_wrong(content_type, body, status, message):
    with pytest.raises(BadRequest, match=re.escape(message)) as refused:
        parse(content_type, body)
    assert refused.value.status == status


@pytest.mark.parametrize("accept, lines, expected", [
    (None, False, "application/json"),
    ("*/*", False, "application/json"),
    ("application/json", True, "application/json"),
    (None, True, "application/jsonlines"),  # batch transform's Line split: a line out for each line in
    ("*/*", True, "application/jsonlines"),
    ("application/jsonlines", False, "application/jsonlines"),
    ("text/html, application/json;verbose", False, "application/json"),
])
def test_the_answer_type_follows_accept(accept, lines, expected):
    assert answer_type(accept, payloads.Request([JPEG], lines=lines, single=not lines)) == expected


def test_an_answer_type_it_cannot_write_is_406():
    with pytest.raises(BadRequest, match="cannot answer in 'text/csv'") as refused:
        answer_type("text/csv", payloads.Request([JPEG], lines=False, single=True))
    assert refused.value.status == 406


def test_rendering_one_several_and_lines():
    one, two = {"predicted_label": "cat"}, {"predicted_label": "dog"}
    single = payloads.Request([JPEG], lines=False, single=True)
    several = payloads.Request([JPEG, PNG], lines=False, single=False)
    assert json.loads(render([one], "application/json", single)) == one
    assert json.loads(render([one, two], "application/json", several)) == {"predictions": [one, two]}
    assert render([one, two], "application/jsonlines", several).decode().splitlines() == [json.dumps(one),
                                                                                          json.dumps(two)]


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
