"""The door's counts (keras_pipe_serve.app.Door) after every way a request can end: each request
counted in comes out again, so that a worker that has served a burst admits as a fresh one does.
A count that leaked on one path would shrink the worker's room request by request until the
door refused everything (Door.full), or make the admission's estimate count images never to
come (Door.arriving). The app is driven in this process, through its ASGI interface, on the
real model and batcher."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from tests.conftest import image_bytes

pytestmark = pytest.mark.slow

JPEG = image_bytes("JPEG", 40, 30)
_ports = itertools.count(40000)


@pytest.fixture(scope="module")
def app(model_dir):
    from keras_pipe_serve.app import App
    from keras_pipe_serve.batcher import Batcher
    from keras_pipe_serve.models import Models
    from keras_pipe_serve.predictor import Predictor

    predictor = Predictor(model_dir)
    batcher = Batcher(predictor.run, max_batch=4)
    batcher.timed(1, predictor.warm_up(), recent=False)
    models = Models(load=None, multi=False)
    models.serve_default(predictor, batcher, str(model_dir))
    return App(models, max_body=1 << 20, batch=False, timeout=3.0, max_queue=24, body_budget=8 << 20)


async def call(app, body: bytes, kind: str = "image/jpeg", leaves: bool = False, length: int | None = None) -> int:
    """One POST /invocations; its status (None: no answer, the client having left). `leaves`: the
    client's connection is lost once its body is sent; `length`: the Content-Length it declares."""
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if chunks:
            return chunks.pop(0)
        if leaves:
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)  # (the connection stays: receive() returns only when it is lost)

    sent = []

    async def send(message):
        sent.append(message)

    headers = [(b"content-type", kind.encode()), (b"content-length", str(len(body) if length is None else length).encode())]
    scope = {"type": "http", "method": "POST", "path": "/invocations", "headers": headers,
             "client": ("127.0.0.1", next(_ports))}
    await app(scope, receive, send)
    return sent[0]["status"] if sent else None


def test_every_request_counted_in_is_counted_out_whatever_its_end(app):
    async def burst():
        return await asyncio.gather(  # (in this order at the door: the first come in before it is full)
            call(app, b"not an image"),  # 400, its body read
            call(app, JPEG * 40, length=(1 << 20) + 1),  # 413, before its body
            call(app, b"{}", "application/json"),  # 400: no instances
            # clients gone while they wait: behind 15 images (4 batches at least) and still within the door's
            # 24, so that they are gone before their turn however fast the model answers (first in line, a
            # loaded machine's model once answered all three before their leaving was seen)
            *[call(app, JPEG) for _ in range(15)],
            *[call(app, JPEG, leaves=True) for _ in range(3)],
            *[call(app, JPEG) for _ in range(25)],  # more than the door takes: 200s, 503s (full, or past time)
        )

    first = asyncio.run(burst())
    door, batcher = app.door, app.models.default().batcher
    assert (door.requests, door.body_bytes, door.arriving) == (0, 0, 0), (door, first)
    # a model call whose requests all timed out (503 past time) while it ran still runs after their
    # answers, and its images count in the backlog until it ends (the admission's estimate waits for
    # it too): on a loaded machine it once outlived the burst by a moment. Its end is awaited, far
    # longer than any call of this model takes; a count that leaked would stay.
    settled = time.monotonic() + 30
    while batcher.backlog() and time.monotonic() < settled:
        time.sleep(0.05)
    assert batcher.backlog() == 0, (batcher.backlog(), batcher.busy_images, batcher.busy_since, first)
    assert first[:3] == [400, 413, 400] and None in first[18:21], first
    answered = first[3:18] + first[21:]
    assert 200 in answered and 503 in answered and None not in answered, first
    # and the worker admits as a fresh one would: a request alone is answered
    assert asyncio.run(call(app, JPEG)) == 200
