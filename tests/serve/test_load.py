"""`keras-pipe-serve` under load, as SageMaker's front end and health checks meet it: pings answered
while the model is saturated, a request past SAGEMAKER_MODEL_SERVER_TIMEOUT ended on time, a full
queue answered 503 with Retry-After, a client that hangs up costing nothing more, a batch
transform's MultiRecord mini-batch of 500 images, the access log, Allow, and refused bodies
drained so that the kept-alive connection goes on. Real server, real HTTP, the real model."""

import base64
import collections
import http.client
import io
import json
import re
import socket
import struct
import subprocess
import threading
import time
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from keras_pipe_serve.app import HOLD_MAX_S

from bench import serve as bench_serve
from tests.conftest import image_bytes
from tests.serve.conftest import CLASSES, Server
from tests.serve.test_server import signature_answers
from tests.timeouts import wait_s

pytestmark = pytest.mark.slow

PING_LIMIT_S = 2.0  # SageMaker's: an instance whose /ping takes longer is taken out of service


SLOW = 30  # slow images in a request that keeps a worker's model busy for seconds, one image a call


@cache
def slow_jpeg() -> bytes:
    """A 12-megapixel JPEG of a smooth gradient: small to send (about 200 KB), some tens of ms to
    decode and shrink, as a phone's photo is."""
    from PIL import Image

    yy, xx = np.mgrid[:3000, :4000]
    pixels = np.stack([xx * 255 // 4000, yy * 255 // 3000, (xx + yy) * 255 // 7000], -1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=60)
    return out.getvalue()


# a 48-megapixel PNG of one colour: 150 KB to send, a third of a second to decode (a PNG, unlike a
# JPEG, cannot be decoded straight to a smaller size): bench.serve's slow photo, made once here
slow_png = cache(bench_serve.slow_png)


def instances(images: list[bytes]) -> bytes:
    return json.dumps({"instances": [{"b64": base64.b64encode(i).decode()} for i in images]}).encode()


def post(port: int, body: bytes, kind: str = "application/json", timeout: float = 120) -> tuple[int, bytes, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", "/invocations", body, {"Content-Type": kind})
        answer = connection.getresponse()
        return answer.status, answer.read(), dict(answer.headers)
    finally:
        connection.close()


def ping(port: int) -> tuple[int | None, float]:
    """(/ping's status or None, seconds) on a new connection, as SageMaker's health check comes."""
    started = time.monotonic()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=PING_LIMIT_S * 3)
        connection.request("GET", "/ping")
        status = connection.getresponse().status
        connection.close()
    except OSError:
        status = None
    return status, time.monotonic() - started


def threads_niceness(server: Server) -> dict[str, set[int]]:
    """The worker's threads' nice values, by thread name (Linux: /proc/PID/task/TID/stat)."""
    worker = subprocess.run(["pgrep", "-P", str(server.process.pid)], capture_output=True, text=True).stdout.split()[0]
    niceness: dict[str, set[int]] = {}
    for task in Path(f"/proc/{worker}/task").iterdir():
        stat = (task / "stat").read_text()
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        niceness.setdefault(name, set()).add(int(rest[16]))  # (field 19 of stat, counted from 1)
    return niceness


def served(model_dir, tmp_path, **env) -> Server:
    server = Server(model_dir, tmp_path / "serve.log", **env)
    server.wait_until_healthy()
    return server


def logged(server: Server, pattern: str, timeout: float = 30) -> re.Match:
    deadline = time.monotonic() + timeout
    while True:
        found = re.search(pattern, server.log.read_text())
        if found or time.monotonic() > deadline:
            assert found, f"{pattern!r} not in the log: {server.log.read_text()[-3000:]}"
            return found
        time.sleep(0.2)


def test_pings_are_answered_at_once_while_every_request_thread_waits_for_the_model(model_dir, tmp_path):
    server = served(model_dir, tmp_path, SAGEMAKER_MAX_PAYLOAD_IN_MB="20")  # (else the defaults: one worker, a thread per core)
    stop, in_flight, failures, pings = threading.Event(), [0], [], []

    def client():
        while not stop.is_set():
            in_flight[0] += 1
            status, answer, _ = post(server.port, instances([slow_jpeg()] * 32))
            in_flight[0] -= 1
            if status != 200:
                failures.append((status, answer[:300]))

    clients = [threading.Thread(target=client) for _ in range(4)]
    try:
        for thread in clients:
            thread.start()
        time.sleep(1)
        niceness = threads_niceness(server)
        # the model's threads (TensorFlow's pools, the batcher's) below the request threads
        assert niceness.get("tf_Compute") == {5} and 0 in niceness["keras-pipe-serv"], niceness
        until = time.monotonic() + 6
        while time.monotonic() < until:
            busy = in_flight[0]
            pings.append((*ping(server.port), busy))
            time.sleep(0.1)
    finally:
        stop.set()
        for thread in clients:
            thread.join()
        assert server.stop() == 0
    assert not failures, failures
    saturated = [(status, took) for status, took, busy in pings if busy >= 3]
    assert len(saturated) >= 20, pings  # (most pings came while 3 or 4 requests were at the model)
    assert all(status == 200 and took < PING_LIMIT_S for status, took, _ in pings), pings
    logged(server, r"1 worker\(s\) \(\d+ CPUs \([^)]+\); no GPU: one worker, calling its model from a thread per core, "
                   r"(\d+); no memory limit\), each calling its model from \1 thread\(s\), TensorFlow on 1 thread\(s\) "
                   r"within an op")


def test_a_request_past_the_timeout_is_answered_504_and_dropped_and_the_server_goes_on(model_dir, tmp_path):
    """The request ends at its timeout, not when the model would have finished it (seconds later):
    how soon after the timeout is bench.serve's to measure (a test sharing 2 cores with others
    cannot time it); here, soon enough that most of its images were never computed."""
    server = served(model_dir, tmp_path, SAGEMAKER_MODEL_SERVER_TIMEOUT="1", KERAS_PIPE_MAX_BATCH="1")
    try:
        started = time.monotonic()
        status, answer, _ = post(server.port, instances([slow_png()] * SLOW), timeout=60)
        took = time.monotonic() - started
        assert status == 504, answer[:300]
        assert took >= 1, took
        error = json.loads(answer)["error"]
        dropped = re.fullmatch(r"no answer within 1 s \(SAGEMAKER_MODEL_SERVER_TIMEOUT\): (\d+) of 30 images were not "
                               r"computed, and will not be", error)
        assert dropped and int(dropped[1]) >= 10, error
        # a call slower than the timeout is slow, not stuck: the instance stays in service (/ping
        # 200) while the slices the model was on finish; a next request, held to the same 1 s, may
        # time out behind them, or be refused at the door (503) while they run. The rest of the
        # request is never computed.
        assert ping(server.port)[0] == 200
        until = time.monotonic() + 20
        while (after := post(server.port, image_bytes("JPEG", 40, 30), "image/jpeg", timeout=5))[0] in (503, 504) \
                and time.monotonic() < until:
            time.sleep(0.5)
        assert after[0] == 200, after[1][:300]
    finally:
        assert server.stop() == 0
    logged(server, r"WARNING keras_pipe_serve: 504 POST /invocations: no answer within 1 s")


def test_a_full_queue_is_answered_503_with_retry_after_and_its_request_is_taken_later(model_dir, tmp_path):
    server = served(model_dir, tmp_path, KERAS_PIPE_MAX_QUEUE="1", KERAS_PIPE_MAX_BATCH="1")
    small = image_bytes("JPEG", 40, 30)
    long_one: list = []
    try:
        body = instances([slow_png()] * SLOW)
        def hold():  # (refused itself if a probe below came in first: it retries, as a client told Retry-After)
            while (answer := post(server.port, body))[0] == 503:
                time.sleep(0.1)
            long_one.append(answer)

        holder = threading.Thread(target=hold)
        holder.start()
        # once its job is in (its images, one a call, take seconds), the next request is refused
        while (refused := post(server.port, small, "image/jpeg"))[0] == 200 and holder.is_alive():
            time.sleep(0.1)
        status, answer, headers = refused
        assert status == 503 and headers["Retry-After"] == "1", (status, answer[:300])
        assert "the server is at capacity (1 requests are in flight already, the most this worker takes " \
            "(KERAS_PIPE_MAX_QUEUE)); retry shortly" in json.loads(answer)["error"]
        assert ping(server.port)[0] == 200  # busy is not unhealthy
        holder.join()
        assert long_one[0][0] == 200 and len(json.loads(long_one[0][1])["predictions"]) == SLOW
        assert post(server.port, small, "image/jpeg")[0] == 200
    finally:
        assert server.stop() == 0
    logged(server, r"WARNING keras_pipe_serve: 503 POST /invocations: the server is at capacity")


def test_a_burst_beyond_capacity_is_served_in_time_and_the_rest_refused_at_once(model_dir, tmp_path):
    """SAGEMAKER_MODEL_SERVER_TIMEOUT=3 and 40 clients at once, each sending single photos that
    take the model a third of a second each, back to back for 8 s, and again at once after a 503:
    more than twice the work the model can answer in the timeout. Admitted by deadline, few of them
    time out (admitting every request, first in, first out, nearly all of them timed out: each
    waited behind more than 3 s of images); each
    client's first refusal comes at once, the next ones (resent at once on its kept-alive
    connection, before their Retry-After) are held up to a second (app.Holds), each with a
    Retry-After, and no answer comes later than the timeout and a margin
    for these shared cores. (The server's history first: a few such photos, one at a time,
    as an endpoint in service has its pace; how much of the capacity is served is bench.serve's to
    measure, not a test's on shared cores.)"""
    server = served(model_dir, tmp_path, SAGEMAKER_MODEL_SERVER_TIMEOUT="3", KERAS_PIPE_MAX_BATCH="1")
    photo, answers = slow_png(), []
    try:
        for _ in range(3):
            assert post(server.port, photo, "image/png", timeout=wait_s(60))[0] == 200
        until = time.monotonic() + 8

        def client():  # (one kept-alive connection, as SageMaker's front end keeps its own)
            refused, connection = 0, None  # (this client's refusals so far)
            while time.monotonic() < until:
                connection = connection or http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                sent = time.monotonic()
                try:
                    connection.request("POST", "/invocations", photo, {"Content-Type": "image/png"})
                    answer = connection.getresponse()
                    answer.read()
                except OSError:
                    connection.close()
                    connection = None
                    continue
                answers.append((answer.status, time.monotonic() - sent, answer.headers.get("Retry-After"), refused))
                refused += answer.status == 503
                if answer.headers.get("Connection", "").lower() == "close":
                    connection.close()
                    connection = None
            if connection:
                connection.close()

        clients = [threading.Thread(target=client) for _ in range(40)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
        assert ping(server.port)[0] == 200
    finally:
        assert server.stop() == 0
    count = collections.Counter(status for status, _, _, _ in answers)
    assert set(count) <= {200, 503, 504} and count[503] and count[200], count
    # (first in, first out, the 40 clients' first requests alone hold 13 s of images: all but the 9
    # or so a 3 s timeout leaves time for would time out, and their resends after them. Admitted by
    # deadline, fewer than half of that first wave do, even on cores so busy (CI's, 3 test workers on
    # 2) that the model slows in the middle of the burst: seen there, 6 answered 200 and 8 timed out)
    assert count[504] < len(clients) // 2, count
    refusals = [(took, after, before) for status, took, after, before in answers if status == 503]
    assert all(after and int(after) >= 1 for _, after, _ in refusals), refusals[:5]
    assert max(took for took, _, before in refusals if not before) < 1.5, sorted(refusals)[-5:]
    assert max(took for took, _, _ in refusals) < HOLD_MAX_S + 1.5, sorted(refusals)[-5:]
    assert sorted(took for took, _, before in refusals if before)[-1] >= HOLD_MAX_S / 2, refusals[-5:]  # (held)
    assert max(took for _, took, _, _ in answers) < 3 + 2, count
    logged(server, r"WARNING keras_pipe_serve: 503 POST /invocations: the server is at capacity: \d+ image\(s\) ahead "
                   r"of this request's 1 would take about \d+\.\d s at the model's recent \d+ ms an image, \d+\.\d s with "
                   r"its own, past 0.5 of its 3 s \(SAGEMAKER_MODEL_SERVER_TIMEOUT\) or all of it; retry later")


def test_a_client_whose_connection_is_reset_has_its_images_not_yet_computed_dropped(model_dir, tmp_path):
    server = served(model_dir, tmp_path, KERAS_PIPE_MAX_BATCH="1")
    try:
        body = instances([slow_png()] * SLOW)
        with socket.create_connection(("127.0.0.1", server.port)) as client:
            client.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(body) + body)
            time.sleep(1.5)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # (close: a reset)
        found = logged(server, r"POST /invocations: the client's connection ended before its answer: (\d+) of "
                               r"30 images were not computed, and will not be")
        assert int(found[1]) >= 10
        assert post(server.port, image_bytes("JPEG", 40, 30), "image/jpeg", timeout=10)[0] == 200
    finally:
        assert server.stop() == 0


def test_a_client_that_half_closes_after_its_request_gets_its_answer(server):
    """shutdown(SHUT_WR) once the request is sent (`nc -N`, some HTTP/1.0 clients): the connection
    stays open for the answer, then closes."""
    image = image_bytes("JPEG", 40, 30)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as client:
        client.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: image/jpeg\r\n"
                       b"Content-Length: %d\r\n\r\n" % len(image) + image)
        client.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := client.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert json.loads(body)["predicted_label"] in CLASSES


def test_a_batch_transforms_multirecord_mini_batch_of_500_images_is_answered_line_for_line(server, model_dir):
    """SplitType=Line with BatchStrategy=MultiRecord: hundreds of small images in one body, through
    the model 32 at a time, each line's answer in its place."""
    kinds = [image_bytes("JPEG", 40 + i, 30) for i in range(3)]
    lines = "\n".join(json.dumps({"b64": base64.b64encode(kinds[i % 3]).decode()}) for i in range(500)).encode()
    status, answer, headers = server.request("POST", "/invocations", lines, Content_Type="application/jsonlines")
    assert status == 200, answer[:300]
    rows = [json.loads(line) for line in answer.decode().splitlines()]
    assert len(rows) == 500
    expected = signature_answers(model_dir, kinds)["probabilities"]
    np.testing.assert_allclose([r["probabilities"] for r in rows], expected[[i % 3 for i in range(500)]], atol=1e-6)


def test_each_request_has_an_access_log_line_and_each_refusal_its_reason(server):
    server.request("POST", "/invocations", image_bytes("JPEG", 40, 30), Content_Type="image/jpeg",
                   User_Agent="the-access-log-test")
    server.request("GET", "/nowhere", User_Agent="the-access-log-test")
    server.request("POST", "/invocations", b"hello", Content_Type="image/jpeg", User_Agent="the-access-log-test")
    logged(server, r'127\.0\.0\.1 - - \[[^]]+\] "POST /invocations HTTP/1\.1" 200 \d+ \d+ms "the-access-log-test"')
    logged(server, r'"GET /nowhere HTTP/1\.1" 404 \d+ \d+ms "the-access-log-test"')
    logged(server, r"WARNING keras_pipe_serve: 404 GET /nowhere: no such path '/nowhere'")
    logged(server, r'"POST /invocations HTTP/1\.1" 400 \d+ \d+ms "the-access-log-test"')
    logged(server, r"WARNING keras_pipe_serve: 400 POST /invocations: the body is not an image")


def test_a_refused_requests_body_is_read_so_that_its_kept_alive_connection_goes_on(server):
    """405 says Allow; a 404's, 405's or 413's body is read and dropped: the next request on the
    same connection (a ping) is answered at once."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    body = b"x" * (1 << 20)
    for method, path, allow, status in [("POST", "/ping", "GET, HEAD", 405), ("PUT", "/invocations", "POST", 405),
                                        ("POST", "/nowhere", None, 404), ("GET", "/invocations", "POST", 405)]:
        connection.request(method, path, body if method != "GET" else None, {"Content-Type": "image/jpeg"})
        answer = connection.getresponse()
        assert (answer.status, answer.getheader("Allow")) == (status, allow)
        assert answer.getheader("Connection") != "close"
        answer.read()
        started = time.monotonic()
        connection.request("GET", "/ping")
        pinged = connection.getresponse()
        assert pinged.status == 200 and pinged.read() == b""
        assert time.monotonic() - started < 1
    connection.request("POST", "/invocations", b"\0" * (2 * 1024 * 1024 + 1), {"Content-Type": "image/jpeg"})
    answer = connection.getresponse()
    assert answer.status == 413 and answer.getheader("Connection") != "close"
    answer.read()
    connection.request("GET", "/ping")
    assert connection.getresponse().status == 200
    connection.close()
