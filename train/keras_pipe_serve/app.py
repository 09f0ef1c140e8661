"""The WSGI application SageMaker's inference contract asks for: GET /ping, POST /invocations.

A worker builds it once, loading the model first: gunicorn hands a worker requests only after
that, so /ping answers 200 only once the model is loaded (while it loads, a ping waits in the
socket's queue, which SageMaker counts as not healthy yet). GET /execution-parameters is left
out on purpose (404): batch transform then uses its own defaults or the job's settings, and the
SageMaker SDK's local mode rejects the "MULTI_RECORD" spelling AWS's documentation gives for it.

Each request runs in a thread of its own (gunicorn's gthread worker) that never calls the model
itself: it parses and checks the request, queues its images for the model's thread
(keras_pipe_serve.batcher) and waits. So /ping, answered in its own thread, never waits behind
inference, and a waiting request ends when its time (SAGEMAKER_MODEL_SERVER_TIMEOUT) is up or its
client has gone, whatever the model is doing.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable

from keras_pipe_serve import payloads
from keras_pipe_serve.batcher import Batcher, Full, Gone, TimedOut
from keras_pipe_serve.payloads import BadRequest
from keras_pipe_serve.predictor import Predictor

log = logging.getLogger("keras_pipe_serve")

# an unread body up to this size is read (and dropped) before a refusal, so that its client gets the
# answer and the connection stays usable: SageMaker's batch transform sends at most 100 MB
# (MaxPayloadInMB); a larger one closes the connection instead
DRAIN_LIMIT = 100 << 20
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 406: "Not Acceptable",
           411: "Length Required", 413: "Content Too Large", 415: "Unsupported Media Type",
           500: "Internal Server Error", 503: "Service Unavailable", 504: "Gateway Timeout"}
ROUTES = {"/ping": ("GET", "HEAD"), "/invocations": ("POST",)}
RETRY_AFTER_S = 1  # a full queue drains in about a model call: the client's retry is soon welcome


class Refused(BadRequest):
    """An answer other than 200, with the headers it needs (Allow, Retry-After)."""

    def __init__(self, status: int, message: str, *headers: tuple[str, str]):
        super().__init__(status, message)
        self.headers = list(headers)


class App:
    def __init__(self, predictor: Predictor, batcher: Batcher, max_body: int, batch: bool = False,
                 timeout: float = 60.0):
        """`batch`: serving a batch transform (SAGEMAKER_BATCH), whose default answer may differ
        (payloads.answer_type). `timeout`: the seconds a request may take, from its arrival."""
        self.predictor = predictor
        self.batcher = batcher
        self.max_body = max_body
        self.batch = batch
        self.timeout = timeout

    def __call__(self, environ: dict, start_response: Callable):
        arrived = time.monotonic()
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        try:
            if path not in ROUTES:
                raise BadRequest(404, f"no such path {path[:100]!r}: this server answers GET /ping and "
                                      "POST /invocations")
            if method not in ROUTES[path]:
                raise Refused(405, f"{path} takes {' or '.join(ROUTES[path])}", ("Allow", ", ".join(ROUTES[path])))
            if path == "/ping":
                problem = self.batcher.problem()
                if problem:
                    raise Refused(503, f"the model cannot answer: {problem}")
                return _respond(start_response, 200, b"", "text/plain")
            kind, body = self.invocations(environ, arrived + self.timeout)
            return _respond(start_response, 200, body, kind)
        except BadRequest as refused:
            # every refusal is logged with its reason (the access log has only its status)
            log.warning("%d %s %s: %s", refused.status, method, path[:100], refused)
            close = not _drained(environ)
            return _respond(start_response, refused.status, _error(str(refused)), payloads.JSON, close,
                            getattr(refused, "headers", []))
        except Gone as gone:
            log.warning("%s %s: the client closed its connection before its answer: %s", method, path[:100], gone)
            return _respond(start_response, 503, b"", "text/plain", close=True)
        except Exception:  # a bug here, not the client's fault: logged whole, the worker kept alive
            log.exception("500 %s %s: an unexpected error", method, path[:100])
            return _respond(start_response, 500, _error("the server failed on this request (see its log)"),
                            payloads.JSON, close=not _drained(environ))

    def invocations(self, environ: dict, deadline: float) -> tuple[str, bytes]:
        request = payloads.parse(environ.get("CONTENT_TYPE"), self._body(environ))
        # Accept, top_k and each image's header are checked before the model runs: a request that
        # cannot be answered costs nothing. The answer is in the model's dialect; top_k shapes only
        # this project's.
        answer = payloads.answer_type(environ.get("HTTP_ACCEPT"), request, self.predictor.dialect, self.batch)
        top_k = None
        if answer.form == payloads.RICH_FORM:
            top_k = payloads.top_k_of(environ.get("HTTP_X_AMZN_SAGEMAKER_CUSTOM_ATTRIBUTES"),
                                      self.predictor.default_top_k)
        self.predictor.check(request.images)
        try:
            job = self.batcher.submit(request.images)
        except Full as full:
            raise Refused(503, f"the server is at capacity ({full}); retry shortly",
                          ("Retry-After", str(RETRY_AFTER_S))) from None
        try:
            outputs = self.batcher.wait(job, deadline, _gone(environ.get("gunicorn.socket")))
        except TimedOut as late:
            raise Refused(504, f"no answer within {self.timeout:g} s (SAGEMAKER_MODEL_SERVER_TIMEOUT): "
                               f"{late}") from None
        predictions = self.predictor.predictions(*outputs, top_k)
        return answer.kind, payloads.render(predictions, answer, request)

    def _body(self, environ: dict) -> bytes:
        length = environ.get("CONTENT_LENGTH") or ""
        stream = environ["wsgi.input"]
        if length:
            try:
                size = int(length)
            except ValueError:
                raise BadRequest(400, f"Content-Length {length[:30]!r} is not a number") from None
            if size > self.max_body:
                raise BadRequest(413, f"the body is {size} bytes; this server takes at most {self.max_body} "
                                      f"(SAGEMAKER_MAX_PAYLOAD_IN_MB, 6 MB unless set)")
            return stream.read(size)
        body = stream.read(self.max_body + 1)  # chunked: read one byte past the limit to know
        if len(body) > self.max_body:
            raise BadRequest(413, f"the body is more than {self.max_body} bytes, this server's limit "
                                  f"(SAGEMAKER_MAX_PAYLOAD_IN_MB, 6 MB unless set)")
        return body


def _gone(sock: socket.socket | None) -> Callable[[], bool]:
    """Whether the client has closed its end: a peek that finds the connection's end (b""), or an
    error. Data waiting (a pipelined request) or none yet both mean it is still there."""
    def gone() -> bool:
        if sock is None:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True
    return gone


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def _drained(environ: dict) -> bool:
    """Reads the rest of the request's body and drops it, so that the connection can carry the next
    request; False where it cannot (more than DRAIN_LIMIT, or the client stopped sending): the
    connection is then closed with the answer."""
    length = environ.get("CONTENT_LENGTH") or ""
    if length.isdigit() and int(length) > DRAIN_LIMIT:
        return False
    stream, read = environ["wsgi.input"], 0
    try:
        while chunk := stream.read(1 << 20):
            read += len(chunk)
            if read > DRAIN_LIMIT:
                return False
    except Exception:  # (a broken or malformed body: the connection cannot go on)
        return False
    return True


def _respond(start_response: Callable, status: int, body: bytes, kind: str, close: bool = False,
             extra: list[tuple[str, str]] = ()) -> list[bytes]:
    headers = [("Content-Type", kind), ("Content-Length", str(len(body))), *extra]
    if close:  # (the rest of the request is unread: the connection cannot carry another)
        headers.append(("Connection", "close"))
    start_response(f"{status} {REASONS.get(status, '')}".rstrip(), headers)
    return [body]
