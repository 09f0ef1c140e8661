"""The WSGI application SageMaker's inference contract asks for: GET /ping, POST /invocations.

A worker builds it once, loading the model first: gunicorn hands a worker requests only after
that, so /ping answers 200 only once the model is loaded (while it loads, a ping waits in the
socket's queue, which SageMaker counts as not healthy yet). GET /execution-parameters is left
out on purpose (404): batch transform then uses its own defaults or the job's settings, and the
SageMaker SDK's local mode rejects the "MULTI_RECORD" spelling AWS's documentation gives for it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from keras_pipe_serve import payloads
from keras_pipe_serve.payloads import BadRequest
from keras_pipe_serve.predictor import Predictor

log = logging.getLogger("keras_pipe_serve")

# an oversized body up to this size is read (and dropped) before the 413, so that its client gets the
# answer: SageMaker's batch transform sends at most 100 MB (MaxPayloadInMB)
DRAIN_LIMIT = 100 << 20
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 406: "Not Acceptable",
           411: "Length Required", 413: "Content Too Large", 415: "Unsupported Media Type",
           500: "Internal Server Error"}


class App:
    def __init__(self, predictor: Predictor, max_body: int, batch: bool = False):
        """`batch`: serving a batch transform (SAGEMAKER_BATCH), whose default answer may differ
        (payloads.answer_type)."""
        self.predictor = predictor
        self.max_body = max_body
        self.batch = batch

    def __call__(self, environ: dict, start_response: Callable):
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        try:
            if path == "/ping":
                if method not in ("GET", "HEAD"):
                    raise BadRequest(405, "/ping takes GET")
                return _respond(start_response, 200, b"", "text/plain")
            if path == "/invocations":
                if method != "POST":
                    raise BadRequest(405, "/invocations takes POST")
                kind, body = self.invocations(environ)
                return _respond(start_response, 200, body, kind)
            raise BadRequest(404, f"no such path {path[:100]!r}: this server answers GET /ping and POST /invocations")
        except BadRequest as refused:
            return _respond(start_response, refused.status, _error(str(refused)), payloads.JSON,
                            close=refused.status == 413 and not getattr(refused, "drained", False))
        except Exception:  # a bug here, not the client's fault: logged whole, the worker kept alive
            log.exception("an unexpected error while answering %s %s", method, path[:100])
            return _respond(start_response, 500, _error("the server failed on this request (see its log)"),
                            payloads.JSON)

    def invocations(self, environ: dict) -> tuple[str, bytes]:
        request = payloads.parse(environ.get("CONTENT_TYPE"), self._body(environ))
        # Accept and top_k are checked before the model runs: a request that cannot be answered
        # costs nothing. The answer is in the model's dialect; top_k shapes only this project's.
        answer = payloads.answer_type(environ.get("HTTP_ACCEPT"), request, self.predictor.dialect, self.batch)
        top_k = None
        if answer.form == payloads.RICH_FORM:
            top_k = payloads.top_k_of(environ.get("HTTP_X_AMZN_SAGEMAKER_CUSTOM_ATTRIBUTES"),
                                      self.predictor.default_top_k)
        predictions = self.predictor.predict(request.images, top_k)
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
                refused = BadRequest(413, f"the body is {size} bytes; this server takes at most {self.max_body} "
                                          f"(SAGEMAKER_MAX_PAYLOAD_IN_MB, 6 MB unless set)")
                # read and dropped, so that the client, still sending it, gets the answer rather than
                # a reset connection; a body too large to be worth reading closes the connection
                refused.drained = size <= DRAIN_LIMIT and _drain(stream, size)
                raise refused
            return stream.read(size)
        body = stream.read(self.max_body + 1)  # chunked: read one byte past the limit to know
        if len(body) > self.max_body:
            raise BadRequest(413, f"the body is more than {self.max_body} bytes, this server's limit "
                                  f"(SAGEMAKER_MAX_PAYLOAD_IN_MB, 6 MB unless set)")
        return body


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


def _drain(stream, size: int) -> bool:
    """Reads `size` bytes of `stream` and drops them; whether they all came."""
    left = size
    while left:
        chunk = stream.read(min(left, 1 << 20))
        if not chunk:
            return False
        left -= len(chunk)
    return True


def _respond(start_response: Callable, status: int, body: bytes, kind: str, close: bool = False) -> list[bytes]:
    headers = [("Content-Type", kind), ("Content-Length", str(len(body)))]
    if close:  # (the rest of the request is unread: the connection cannot carry another)
        headers.append(("Connection", "close"))
    start_response(f"{status} {REASONS.get(status, '')}".rstrip(), headers)
    return [body]
