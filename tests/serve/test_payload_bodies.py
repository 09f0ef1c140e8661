"""The bodies batch transform sends, which reach 100 MB: JSON Lines (SplitType=Line) and RecordIO
(SplitType=RecordIO), read lazily (payloads.LazyImages): framed in one pass, each image decoded when
asked, every one of them once before the model runs (Predictor.check), so that a bad line or record
is still a 400 naming it; and memory, measured, stays near the body's own."""

import base64
import gc
import json
import random
import re
import struct
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
from keras_pipe_serve import payloads
from keras_pipe_serve.payloads import BadRequest, LazyImages, answer_type, parse
from keras_pipe_serve.predictor import Predictor

from pipemode.recordio import encode, encode_record

DATA = Path(__file__).parents[1] / "data"
JPEG = b"\xff\xd8\xff\xe0 a jpeg"
PNG = b"\x89PNG\r\n\x1a\n a png"
MAGIC = 0xCED7230A
RECORDIO = "application/x-recordio"


def part(flag: int, payload: bytes) -> bytes:
    """One part of a RecordIO record, framed by hand as dmlc-core frames it: magic, lrecord (flag in
    its top 3 bits, length in the rest), the payload, zeros to a multiple of 4 bytes."""
    return struct.pack("<II", MAGIC, flag << 29 | len(payload)) + payload + bytes(-len(payload) % 4)


def record(payload: bytes) -> bytes:
    return part(0, payload)


def im2rec(image: bytes, label: float = 2.0, labels: tuple[float, ...] = ()) -> bytes:
    """An image record as mxnet.recordio.pack writes it: IRHeader(flag, label, id, id2), the flag's
    labels, the image."""
    return struct.pack("<IfQQ", len(labels), label, 7, 0) + struct.pack(f"<{len(labels)}f", *labels) + image


def checked(images) -> list[bytes]:
    """What Predictor.check sees, image by image (its header check stood in for: a JPEG or PNG)."""
    seen = []

    def problem(data):
        seen.append(data)
        return None if data.startswith((b"\xff\xd8", b"\x89PNG")) else "is not an image"

    Predictor.check(SimpleNamespace(problem=problem), images)
    return seen


# --- RecordIO ---

def test_a_single_record_is_one_image_answered_as_a_line():
    request = parse(RECORDIO, record(JPEG))
    assert list(request.images) == [JPEG] and request.lines and not request.single
    assert answer_type(None, request, "mxnet") == ("application/jsonlines", "mxnet")
    assert answer_type("application/json", request, "mxnet") == ("application/json", "mxnet")


def test_multirecord_bodies_raw_images_and_im2rec_records_headers_stripped():
    body = record(JPEG) + record(im2rec(PNG)) + record(im2rec(JPEG, 0.0, (0.0, 1.0, 1.0))) + record(PNG)
    assert list(parse(RECORDIO, body).images) == [JPEG, PNG, JPEG, PNG]


def test_a_record_split_at_the_magic_word_is_joined_with_it_put_back():
    """dmlc's writer cuts a payload at each 4-aligned magic word (cflag 1 first, 2 middle, 3 last)
    and leaves the word out; its reader, and this one, put it back between the parts."""
    magic = struct.pack("<I", MAGIC)
    image = b"\xff\xd8\xff\xe0" + magic + b"tail" + magic + b"end, unaligned"
    split = part(1, image[:4]) + part(2, image[8:12]) + part(3, image[16:])
    assert split == encode_record(image)  # (framed as pipemode's writer, dmlc's, frames it)
    header = im2rec(b"")
    assert len(header) % 4 == 0  # (so the image's aligned magic words stay aligned in the record)
    body = record(PNG) + split + encode_record(header + image) + record(JPEG)
    assert list(parse(RECORDIO, body).images) == [PNG, image, image, JPEG]


@pytest.mark.parametrize("name, count", [("digits-mxnet.rec", 240), ("pairs-mxnet.rec", 120)])
def test_an_im2rec_file_sent_whole_is_its_images(name, count):
    """MXNet's own .rec files (one label a record, and ten: flag 10), as a MultiRecord body holds
    them: every record's image whole (Pillow reads its header, the JPEG ends where it should)."""
    from keras_pipe_train.sources import images as image_checks

    images = parse(RECORDIO, (DATA / name).read_bytes()).images
    assert len(images) == count == len((DATA / name.replace("-mxnet.rec", ".lst")).read_text().splitlines())
    assert [image_checks.problem(image) for image in images] == [None] * count


def test_singlerecords_payload_its_framing_and_padding_removed_is_one_image():
    """BatchStrategy=SingleRecord: SageMaker sends the record's payload alone (CreateTransformJob:
    "padding is removed if the value of BatchStrategy is set to SingleRecord"), an image, or an
    im2rec image record; and a framed record whose last padding is gone is read too."""
    assert list(parse(RECORDIO, JPEG).images) == [JPEG]
    assert list(parse(RECORDIO, im2rec(PNG)).images) == [PNG]
    framed = record(JPEG) + record(PNG)
    unpadded = framed.rstrip(b"\0") if len(PNG) % 4 else framed
    assert list(parse(RECORDIO, unpadded).images) == [JPEG, PNG]
    with pytest.raises(BadRequest, match=r"the body \(one RecordIO record's payload, as SingleRecord sends it\) is "
                                         r"neither an image nor an im2rec image record"):
        parse(RECORDIO, b"hello, not an image record at all")


@pytest.mark.parametrize("body, message", [
    (b"", "the request body is empty: send RecordIO records"),
    (record(JPEG) + b"\0" * 8 + JPEG, "record 2 of the body (at byte offset 20) is not valid RecordIO: bad magic "
                                      "0x00000000"),
    (record(JPEG) + struct.pack("<II", MAGIC, 100) + JPEG, "record 2 of the body (at byte offset 20) is not valid "
                                                           "RecordIO: the stream ended inside a RecordIO part"),
    (record(JPEG) + b"\x0a\x23\xd7\xce", "record 2 of the body (at byte offset 20) is not valid RecordIO: the stream "
                                         "ended 4 bytes into a header"),
    (record(JPEG) + part(2, JPEG), "record 2 of the body (at byte offset 20) is not valid RecordIO: flag 2 cannot "
                                   "start a record"),
    (part(1, b"\xff\xd8\xff\xe0") + record(JPEG), "record 1 of the body (at byte offset 0) is not valid RecordIO: "
                                                  "expected the next part of a multi-part record at byte offset 12"),
])
def test_a_body_that_is_not_recordio_is_400_naming_the_record_and_its_offset(body, message):
    with pytest.raises(BadRequest, match=re.escape(message)) as refused:
        parse(RECORDIO, body)
    assert refused.value.status == 400


@pytest.mark.parametrize("payload, problem", [
    (b"tiny", "is neither an image nor an im2rec image record: 4 bytes, fewer than the image record header's 24"),
    (struct.pack("<IfQQ", 1000, 0, 0, 0) + JPEG, "is neither an image nor an im2rec image record: its header says "
                                                 "1000 labels follow, more than its 35 bytes hold"),
])
def test_a_record_holding_no_image_is_400_in_the_check_pass(payload, problem):
    images = parse(RECORDIO, record(JPEG) + record(payload)).images  # (framed: read only when checked)
    with pytest.raises(BadRequest, match=re.escape(f"record 2 (byte offset 20) {problem}")):
        checked(images)


# --- the lazy sequence ---

@pytest.mark.parametrize("kind, body", [
    ("application/jsonlines", f'{{"b64": "{base64.b64encode(JPEG).decode()}"}}\n\n"{base64.b64encode(PNG).decode()}"'
                              f'\r\n  \n{{"image_bytes": {{"b64": "{base64.b64encode(JPEG).decode()}"}}}}\n'.encode()),
    (RECORDIO, record(JPEG) + record(im2rec(PNG)) + encode_record(JPEG)),
])
@pytest.mark.parametrize("holder", [bytes, bytearray, memoryview])
def test_lazy_images_are_a_sequence_of_bytes(kind, body, holder):
    images = parse(kind, holder(body)).images
    assert isinstance(images, LazyImages) and isinstance(images, Sequence) and len(images) == 3
    assert images[0] == JPEG and images[1] == PNG and images[-1] == JPEG and type(images[1]) is bytes
    assert images[1:] == [PNG, JPEG] and images[0:3:2] == [JPEG, JPEG] and images[5:] == []
    assert list(images) == [JPEG, PNG, JPEG] and images.index(PNG) == 1 and PNG in images
    with pytest.raises(IndexError):
        images[3]
    assert repr(images).endswith(f"3 images in a body of {len(body)} bytes>")


def test_the_body_is_viewed_not_copied():
    """The server's bytearray is held as it is (resizing it would fail while the request lives)."""
    body = bytearray(encode([JPEG, PNG]))
    images = parse(RECORDIO, body).images
    with pytest.raises(BufferError):
        body.extend(b"more")
    del images
    gc.collect()
    body.extend(b"more")


def test_a_bad_line_is_400_naming_it_in_the_check_pass_before_the_model_runs():
    good = json.dumps({"b64": base64.b64encode(JPEG).decode()})
    body = "\n".join([good, "", good, '{"b64": "QUJD!"}', "{oops", good]).encode()
    request = parse("application/jsonlines", body)  # (framed: nothing decoded yet, nothing refused)
    assert len(request.images) == 5
    with pytest.raises(BadRequest, match=re.escape("line 4 is not valid base64: '!' (character 5)")) as refused:
        checked(request.images)
    assert refused.value.status == 400
    with pytest.raises(BadRequest, match=re.escape("line 5 is not valid JSON")):
        checked(request.images[3:])
    with pytest.raises(BadRequest, match=re.escape("line 2 is not UTF-8 text (byte 9): JSON must be")):
        checked(parse("application/jsonlines", good.encode() + b'\n{"b64": "\xff"}').images)


def test_the_check_pass_reads_every_image_once_in_order_and_names_a_bad_one_by_item():
    body = encode([JPEG, im2rec(PNG), JPEG]) + record(b"\x00" * 30)
    images = parse(RECORDIO, body).images
    with pytest.raises(BadRequest, match="item 4 is not an image"):
        checked(images)
    assert checked(images[:3]) == [JPEG, PNG, JPEG]


# --- memory ---

def body_of(kind: str, megabytes: int) -> bytearray:
    """About `megabytes` of small images (1 KB: a thumbnail), as JSON Lines or RecordIO records."""
    rng = random.Random(5)
    frame = encode_record if kind == RECORDIO else (lambda image: b'{"b64": "%s"}\n' % base64.b64encode(image))
    count = megabytes * 10**6 // len(frame(bytes(1004)))
    return bytearray(b"".join(frame(b"\xff\xd8\xff\xe0" + rng.randbytes(1000)) for _ in range(count)))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["application/jsonlines", RECORDIO])
def test_a_large_body_costs_little_more_than_itself(kind):
    """A 40 MB body (allocated before tracing), parsed, checked image by image, then read in the
    model's slices of 32 (the batcher's): the peak of what Python allocates meanwhile stays under
    half the body (decoding it whole took 2.9 times the body, on top of it)."""
    body = body_of(kind, 40)
    gc.collect()
    tracemalloc.start()
    try:
        request = payloads.parse(kind, body)
        for _ in request.images:  # (Predictor.check's pass)
            pass
        for start in range(0, len(request.images), 32):
            batch = request.images[start:start + 32]
            assert len(batch) == min(32, len(request.images) - start)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"{kind}: a body of {len(body) / 1e6:.1f} MB, {len(request.images)} images: peak {peak / 1e6:.2f} MB "
          f"({peak / len(body):.3f} x the body)")
    assert peak <= 0.5 * len(body)
