"""What keras_pipe_serve.connections adds to uvicorn's h11 protocol beyond the door's acceptance
tests (tests/serve/test_door.py): the rest of a refused body read for a few seconds at most, and the
431 for a request head without end said as the app's refusals are. Real server, real sockets."""

import json
import socket
import time

import pytest

from tests.serve.test_door import answer_of, answer_to_a_head_without_end

pytestmark = pytest.mark.slow


def test_the_rest_of_a_refused_body_is_read_and_dropped_for_a_few_seconds_at_most(server):
    """A 404 before its body is read leaves the connection open, the body read and dropped after the
    answer (tests/serve/test_load.py: the next request on it is answered); a client that sends that
    body slowly, 1,000 bytes each half second, is closed after DRAIN_S (5 s; uvicorn alone read it
    as long as it came)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n")
        status, headers, _ = answer_of(sock)
        assert status == 404 and "connection" not in headers, headers
        started = time.monotonic()
        try:
            while time.monotonic() - started < 20:
                sock.sendall(b"x" * 1000)
                time.sleep(0.5)
        except OSError:  # (closed by the server: a send after its close is reset)
            pass
        took = time.monotonic() - started
    assert 4.5 < took < 10, took


def test_a_request_head_without_end_is_refused_431_with_the_reason_in_json(server):
    status, headers, body = answer_to_a_head_without_end(
        server.port, b"POST /invocations HTTP/1.1\r\nHost: x\r\nX-Long: " + b"y" * 3_000_000)
    assert status == 431 and headers["connection"] == "close" and headers["content-type"] == "application/json"
    assert json.loads(body) == {"error": "the request's line and headers passed 1048576 bytes"}
