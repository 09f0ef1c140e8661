"""`keras-pipe-serve` facing crowds and bad clients, as the door decides (keras_pipe_serve.app and
.connections): /ping answered through a crowd, stalled uploads and lingering closes; a 503 with
Retry-After before the body is read; each request's time counted from its arrival; idle and
half-sent connections closed; a request pipelined behind a refused body answered; the body
budget; a hung model call recovered by a fresh worker; and a path that would forge a log line.
Real server, real sockets. (How fast, with how many clients: bench.serve.)"""

import base64
import json
import re
import socket
import subprocess
import threading
import time
import weakref
from pathlib import Path

import pytest
from keras_pipe_serve.connections import DRAIN_S

from tests.conftest import image_bytes
from tests.serve.conftest import CLASSES, Server
from tests.serve.test_load import PING_LIMIT_S, instances, logged, ping, post, served, slow_png
from tests.timeouts import wait_s

pytestmark = pytest.mark.slow

JPEG = image_bytes("JPEG", 40, 30)


def request_head(length: int, kind: str = "image/jpeg", path: str = "/invocations") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {kind}\r\nContent-Length: {length}\r\n\r\n").encode()


# bytes read off a socket past the answer asked for: the start of the next, when pipelined answers
# arrive in one read (they did: the 404 and the /ping behind it, in one packet)
_UNREAD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def answer_of(sock: socket.socket) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 answer read off `sock` (status, headers, body), by its Content-Length; what was
    read past it is kept for the next call on the same socket."""
    data = _UNREAD.pop(sock, b"")
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before an answer: {data[:200]!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed inside an answer's body: {len(rest)} of {length} bytes")
        rest += chunk
    if rest[length:]:
        _UNREAD[sock] = rest[length:]
    return int(lines[0].split()[1]), headers, rest[:length]


def closed_by_server(sock: socket.socket, within: float) -> float | None:
    """Seconds until the server closed `sock` (None: still open after `within`)."""
    sock.settimeout(within)
    started = time.monotonic()
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - started


class Pinger:
    """/ping every 0.1 s on a new connection, as SageMaker's health check comes, in a thread."""

    def __init__(self, port: int):
        self.port, self.pings, self._stop = port, [], threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            self.pings.append(ping(self.port))
            time.sleep(0.1)

    def stop(self) -> list[tuple[int | None, float]]:
        self._stop.set()
        self._thread.join()
        return self.pings


def test_pings_are_answered_through_a_crowd_stalled_uploads_and_lingering_closes(model_dir, tmp_path):
    """120 kept-alive clients sending one image after another, 40 uploads that stall halfway, and
    clients that send Connection: close and never close their end, past the 100 requests in flight
    this server takes (KERAS_PIPE_MAX_QUEUE): every ping is answered 200
    within SageMaker's 2 s; the crowd is answered 200 or 503 with Retry-After, never later than its
    timeout and a second; the stalled uploads get 408 once their body stops for 10 s (app.BODY_IDLE_S),
    or 503 at their headers where the model's backlog would not have answered them in time
    (admission by deadline: on these shared cores, the model's pace may be half a second an image)."""
    server = served(model_dir, tmp_path, SAGEMAKER_MODEL_SERVER_TIMEOUT="15", KERAS_PIPE_MAX_QUEUE="100")
    stop, answers, lingering, stalled = threading.Event(), [], [], []

    def crowd_client():
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            while not stop.is_set():
                sent = time.monotonic()
                sock.sendall(request_head(len(JPEG)) + JPEG)
                status, headers, _ = answer_of(sock)
                answers.append((status, time.monotonic() - sent, headers.get("retry-after")))
                if status == 503:
                    time.sleep(0.2)

    try:
        for _ in range(40):  # headers and half a body, then nothing
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=wait_s(30))
            sock.sendall(request_head(len(JPEG)) + JPEG[: len(JPEG) // 2])
            stalled.append(sock)
        crowd = [threading.Thread(target=crowd_client) for _ in range(120)]
        for thread in crowd:
            thread.start()
        pinger = Pinger(server.port)
        for _ in range(10):  # a ping, asking to close, and the client never closing its end
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=wait_s(30))
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            lingering.append(sock)
            time.sleep(0.3)
        time.sleep(3)
        pings = pinger.stop()
        stop.set()
        for thread in crowd:
            thread.join()
        # the stalled uploads: 408, 10 s after their last byte (before their 15 s timeout). For a
        # body this small, the idle limit and the whole body's (10 s plus its size at 100 KB/s) fall
        # within 15 ms of each other: which one answers depends on when its first bytes came (a
        # CI run under load saw the second)
        for sock in stalled:
            status, headers, body = answer_of(sock)
            if status == 503:
                assert b"the server is at capacity: " in body and int(headers["retry-after"]) >= 1, body
                continue
            assert status == 408 and headers.get("connection") == "close", (status, body)
            half = f"{len(JPEG) // 2} bytes of {len(JPEG)}".encode()
            assert (b"the body stopped arriving for 10 s after " + half in body
                    or b"the body came slower than 100 KB/s: " + half in body), body
        for sock in lingering:
            assert answer_of(sock)[0] == 200
    finally:
        stop.set()
        for sock in stalled + lingering:
            sock.close()
        assert server.stop() == 0
    assert len(pings) >= 20 and all(status == 200 and took < PING_LIMIT_S for status, took in pings), pings
    statuses = {status for status, _, _ in answers}
    assert statuses <= {200, 503} and 200 in statuses, statuses
    assert all(int(retry) >= 1 for status, _, retry in answers if status == 503)
    assert max(took for _, took, _ in answers) < 15 + 1, sorted(took for _, took, _ in answers)[-5:]


def test_past_capacity_a_request_is_answered_503_before_its_body_is_sent(model_dir, tmp_path):
    """With one request in flight (KERAS_PIPE_MAX_QUEUE=1), the next is refused on its headers alone:
    its client has sent no byte of its body when the 503 comes. Then the body it sends is read and
    dropped, and the connection carries its next request."""
    server = served(model_dir, tmp_path, KERAS_PIPE_MAX_QUEUE="1", KERAS_PIPE_MAX_BATCH="1")
    long_one: list = []
    try:
        def hold():  # (refused itself while a probe below holds the one place: it retries)
            while (answer := post(server.port, instances([slow_png()] * 30)))[0] == 503:
                time.sleep(0.05)
            long_one.append(answer)

        holder = threading.Thread(target=hold)
        holder.start()
        while True:  # (until the holder's request is in: a request sent before is let in and waits for its body)
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=1)
            sock.sendall(request_head(len(JPEG)))
            try:
                status, headers, body = answer_of(sock)
                break
            except TimeoutError:  # (let in: the holder's request is not, yet; give it the place, and time to take it)
                sock.close()
                time.sleep(1)
        with sock:
            sock.settimeout(10)
            assert status == 503 and headers["retry-after"] == "1", body
            assert "the server is at capacity" in json.loads(body)["error"]
            sock.sendall(JPEG)  # (the body, after all: read and dropped)
            sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            assert answer_of(sock)[0] == 200
        holder.join()
        assert long_one[0][0] == 200
    finally:
        assert server.stop() == 0


def test_a_request_pipelined_right_behind_a_refused_body_is_answered(server):
    """A refusal is answered before its body is read; a client then sends its next request on the
    heels of the body (http.client does), in the same packets as the body's end."""
    body = b"x" * (1 << 20)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request_head(len(body), path="/nowhere") + body + b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            assert answer_of(sock)[0] == 404
            assert answer_of(sock)[0] == 200
        except (OSError, ConnectionError) as err:
            raise AssertionError(f"{err!r}: {server.log.read_text()[-3000:]}") from None


def test_the_body_budget_refuses_a_body_that_would_pass_it_before_reading_it(model_dir, tmp_path):
    """KERAS_PIPE_MAX_BODIES_MB=1: a body of 0.6 MB being read holds its share; another of 0.6 MB is
    refused on its headers; once the first is answered, the second is taken."""
    server = served(model_dir, tmp_path, KERAS_PIPE_MAX_BODIES_MB="1")
    size = 600_000
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as first, \
                socket.create_connection(("127.0.0.1", server.port), timeout=10) as second:
            first.sendall(request_head(size, "application/octet-stream") + b"\0" * 1000)  # (and the rest later)
            time.sleep(0.5)
            second.sendall(request_head(size, "application/octet-stream"))
            status, headers, body = answer_of(second)
            assert status == 503 and headers["retry-after"] == "1", body
            assert "bodies of 600000 bytes are being read or held, and this one's 600000 would pass the 1048576 " \
                   "bytes this worker holds at once (KERAS_PIPE_MAX_BODIES_MB)" in json.loads(body)["error"]
            first.sendall(b"\0" * (size - 1000))
            assert answer_of(first)[0] == 400  # (zeros are no image: answered all the same)
        assert post(server.port, JPEG, "image/jpeg")[0] == 200
    finally:
        assert server.stop() == 0


def test_idle_connections_and_half_sent_headers_are_closed_after_the_keepalive(model_dir, tmp_path):
    """KERAS_PIPE_KEEPALIVE_S=2: a connection that never sends a byte, one that sent half its headers,
    and one kept alive after its answer are each closed by the server within seconds."""
    server = served(model_dir, tmp_path, KERAS_PIPE_KEEPALIVE_S="2")
    try:
        silent = socket.create_connection(("127.0.0.1", server.port))
        half = socket.create_connection(("127.0.0.1", server.port))
        half.sendall(b"POST /invocations HTTP/1.1\r\nHost: x\r\n")
        kept = socket.create_connection(("127.0.0.1", server.port))
        kept.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer_of(kept)[0] == 200
        for sock in (silent, half, kept):
            took = closed_by_server(sock, 10)
            assert took is not None and took < 4, took
            sock.close()
    finally:
        assert server.stop() == 0


def test_a_path_cannot_forge_a_line_of_the_log(server):
    """%0a in a path decodes to a newline: the refusal's log line shows it escaped."""
    status, _, _ = server.request("GET", "/nowhere%0d%0aforged-line")
    assert status == 404
    logged(server, r"WARNING keras_pipe_serve: 404 GET /nowhere\\r\\nforged-line: no such path '/nowhere\\\\r\\\\nforged")
    assert not any(line.startswith("forged-line") for line in server.log.read_text().splitlines())


def hanging_model(folder: Path) -> Path:
    """A SavedModel with the job's signature (image_bytes in, probabilities out) whose call never
    ends on an image 13 pixels wide (a loop in the graph: a thread inside TensorFlow that nothing
    can stop, as a deadlocked op or a wedged GPU leaves one), and answers at once otherwise."""
    import tensorflow as tf

    class Hanging(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, image_bytes):
            widths = tf.map_fn(lambda b: tf.shape(tf.io.decode_image(b, channels=3, expand_animations=False))[1],
                               image_bytes, fn_output_signature=tf.int32)
            hang = tf.reduce_any(tf.equal(widths, 13))
            spun = tf.while_loop(lambda i: tf.logical_or(hang, i < 0), lambda i: i + 1, [tf.constant(0)])
            first = tf.one_hot(tf.zeros_like(widths) + tf.minimum(spun, 0), len(CLASSES))
            return {"probabilities": first}

    module = Hanging()
    tf.saved_model.save(module, str(folder / "1"), signatures={"serving_default": module.serve})
    (folder / "classes.json").write_text(json.dumps(list(CLASSES)))
    return folder


def test_a_hung_model_call_is_answered_503_and_its_worker_replaced_the_instance_healthy_again(tmp_path):
    """A call that never ends (KERAS_PIPE_STUCK_AFTER_S=3: stuck after 3 s, or 20 times the
    warm-up's seconds where those were more): its request is answered 503 with Retry-After, the worker ends and gunicorn
    starts another in the same server (no restart of the container), and /ping says 200 again once
    it answers: all within a minute. Slow calls are not stuck (test_load's timeout test)."""
    model = hanging_model(tmp_path / "model")
    server = served(model, tmp_path, KERAS_PIPE_STUCK_AFTER_S="3", SAGEMAKER_MODEL_SERVER_WORKERS="1")
    try:
        started = time.monotonic()
        status, body, headers = post(server.port, image_bytes("PNG", 13, 20), "image/png", timeout=60)
        assert status == 503 and headers["Retry-After"] == "1", body
        assert "the model was stuck (one call of the model on 1 image(s) has run" in json.loads(body)["error"]
        server.wait_until_healthy(timeout=60 - (time.monotonic() - started))
        status, body, _ = post(server.port, image_bytes("PNG", 20, 20), "image/png", timeout=10)
        assert status == 200 and json.loads(body)["predicted_label"] == CLASSES[0], body
        assert time.monotonic() - started < 60
        assert server.process.poll() is None  # (the same server: its master started a new worker)
    finally:
        assert server.stop() == 0
    # the limit: 3 s, or 20 times the warm-up's pace where that was slower (0.284 s an image on CI's
    # loaded cores: 5.7 s)
    found = logged(server, r"ERROR keras_pipe_serve: the model is stuck: one call of the model on 1 image\(s\) has "
                           r"run (\d+\.\d) s, past (\d+\.\d) s \(20 times the slowest it has been, (\d\.\d+) s an "
                           r"image, and at least 3 s\); this worker \(pid \d+\) ends, and gunicorn starts another")
    ran, limit, slowest = map(float, found.groups())
    assert limit == pytest.approx(max(3.0, 20 * slowest), abs=0.1) and ran > limit, found[0]
    assert len([line for line in server.log.read_text().splitlines() if "Booting worker" in line]) == 2


def worker_pid(server: Server) -> int:
    return int(subprocess.run(["pgrep", "-P", str(server.process.pid)], capture_output=True, text=True).stdout.split()[0])


def peak_growth(pid: int, send, *args, **options):
    """(bytes the process's peak RSS rose above its RSS while send(*args, **options) ran, what it
    returned). Linux: clear_refs 5 resets the peak, VmHWM, to the RSS of the moment."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = _status_kb(pid, "VmRSS")
    sent = send(*args, **options)
    return (_status_kb(pid, "VmHWM") - before) * 1024, sent


def _status_kb(pid: int, field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)[1])


def test_a_batch_transforms_multirecord_bodies_are_answered_within_one_and_a_half_times_their_size(model_dir,
                                                                                                     tmp_path):
    """SAGEMAKER_BATCH=true, as a batch transform runs the server: the timeout is the transform's
    600 s; a 30 MB MultiRecord mini-batch, in RecordIO (SplitType=RecordIO: records framed and
    padded as im2rec writes them) and in JSON Lines, is answered a line per image, in order; and
    the worker's peak memory grows by at most 1.5 times the body while it does (the body itself,
    and a slice of images at a time beside it)."""
    from pipemode.recordio import encode_record

    kinds = [image_bytes("JPEG", 160 + i, 120, quality=95) for i in range(3)]
    count = 30_000_000 // len(kinds[0])
    images = [kinds[i % 3] for i in range(count)]

    def bodies(images: list[bytes]) -> dict[str, bytes]:
        return {"application/x-recordio": b"".join(encode_record(image) for image in images),
                "application/jsonlines": b"\n".join(json.dumps({"b64": base64.b64encode(image).decode()}).encode()
                                                    for image in images)}

    small = bodies(images[:300])
    server = served(model_dir, tmp_path, SAGEMAKER_BATCH="true", SAGEMAKER_MAX_PAYLOAD_IN_MB="50")
    try:
        pid = worker_pid(server)
        for kind, body in bodies(images).items():
            # (a small one first: the model's first calls on images of this size set up what they keep)
            assert post(server.port, small[kind], kind)[0] == 200
            grew, (status, answer, headers) = peak_growth(pid, post, server.port, body, kind, timeout=300)
            assert status == 200 and headers["Content-Type"] == "application/jsonlines", answer[:300]
            rows = [json.loads(line) for line in answer.decode().splitlines()]
            assert len(rows) == count
            assert [row["predicted_label"] for row in rows[:3]] * (count // 3) == [r["predicted_label"] for r in rows]
            print(f"{kind}: {len(body) / 1e6:.1f} MB, {count} images; the worker's peak grew {grew / len(body):.2f}x")
            assert grew <= 1.5 * len(body), (kind, grew / len(body))
    finally:
        assert server.stop() == 0
    logged(server, r"requests end after 600 s; bodies up to 52428800 bytes \(batch transform\)")


def test_an_image_the_model_cannot_decode_is_named_among_the_request(server):
    """An image whose header is sound, which the model's decoder still refuses, passes the header
    check and fails in the model's call: the 400 names the item."""
    import io

    from PIL import Image

    good = image_bytes("JPEG", 40, 30)
    out = io.BytesIO()
    Image.new("1", (40, 30)).save(out, "BMP")  # (a 1-bit BMP: sound to Pillow, refused by TensorFlow's decoder)
    broken = out.getvalue()
    status, answer, _ = server.request("POST", "/invocations", instances([good, good, broken, good]),
                                       Content_Type="application/json")
    assert status == 400, answer[:300]
    assert json.loads(answer)["error"].startswith("item 3 cannot be decoded: "), answer[:300]


def test_a_refusal_after_the_body_is_read_whole_keeps_the_connection_for_the_next_request(server):
    """A request refused once its body is in (an image that is not one: 400 from the parser) leaves
    nothing unread: the connection carries the client's next request, as it would after a 200."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        body = b"not an image at all"
        sock.sendall(request_head(len(body)) + body)
        status, headers, answer = answer_of(sock)
        assert status == 400 and "connection" not in headers, (status, headers, answer[:300])
        sock.sendall(request_head(len(JPEG)) + JPEG)
        status, headers, answer = answer_of(sock)
        assert status == 200 and json.loads(answer)["predicted_label"] in CLASSES, answer[:300]


def test_httptools_installed_beside_it_is_not_taken_uvicorns_h11_protocol_is(model_dir, tmp_path):
    """uvicorn takes httptools' protocol ("auto") wherever it can import httptools (`pip install
    uvicorn[standard]`); the server's connections are uvicorn's h11 protocol, extended over what
    h11 says of the connection (keras_pipe_serve.connections), and ask for it. Here a stand-in
    httptools, importable by the server, says so if it is ever imported or used. (It replaces the
    test that gunicorn's C parser, gunicorn-h1c, was not taken, under gunicorn's own ASGI worker.)"""
    from keras_pipe_serve.connections import Protocol, Worker
    from uvicorn import Config
    from uvicorn.protocols.http.h11_impl import H11Protocol

    async def app(scope, receive, send):
        pass

    config = Config(app=app, log_config=None, **Worker.CONFIG_KWARGS)
    config.load()
    assert config.http_protocol_class is Protocol and issubclass(Protocol, H11Protocol)
    fake = tmp_path / "site"
    (fake / "httptools").mkdir(parents=True)
    marker = tmp_path / "httptools-imported"
    (fake / "httptools" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'a').write('imported')\n"
        "class HttpParserError(Exception): pass\n"
        "class HttpParserUpgrade(Exception): pass\n"
        "class HttpRequestParser:\n"
        "    def __init__(self, *args, **kwargs): raise RuntimeError('httptools was taken')\n"
        "def parse_url(*args, **kwargs): raise RuntimeError('httptools was taken')\n")
    server = served(model_dir, tmp_path, PYTHONPATH=str(fake))
    try:
        status, answer, _ = post(server.port, JPEG, "image/jpeg", timeout=30)
        assert status == 200, answer[:300]
    finally:
        assert server.stop() == 0
    assert not marker.exists(), server.log.read_text()[-3000:]


def test_each_requests_time_runs_from_its_arrival_not_from_when_the_model_takes_it(model_dir, tmp_path):
    """SAGEMAKER_MODEL_SERVER_TIMEOUT=2 and 12 clients at once, each sending 30 images that take
    the model a third of a second each (seconds of work behind one another): every client has its
    answer, 504 or 503, within the 2 s and a margin for these shared cores, after it sent its
    request; none waits for the requests ahead of it to be computed. (The first are admitted, the
    model's pace being the warm-up's milliseconds, and time out; once its calls show a third of a
    second an image, 30 images cannot be answered in time and the rest are refused at once.)"""
    server = served(model_dir, tmp_path, SAGEMAKER_MODEL_SERVER_TIMEOUT="2", KERAS_PIPE_MAX_BATCH="1")
    body, answers = instances([slow_png()] * 30), []

    def client():
        sent = time.monotonic()
        status, _, _ = post(server.port, body, timeout=60)
        answers.append((status, time.monotonic() - sent))

    try:
        clients = [threading.Thread(target=client) for _ in range(12)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
    finally:
        assert server.stop() == 0
    assert {status for status, _ in answers} <= {503, 504} and 504 in {status for status, _ in answers}, answers
    assert max(took for _, took in answers) < 2 + 2, answers


PING = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"


def sockets_of(pid: int) -> int:
    return sum(1 for fd in Path(f"/proc/{pid}/fd").iterdir() if _link(fd).startswith("socket:"))


def _link(fd: Path) -> str:
    try:
        return str(fd.readlink())
    except OSError:  # (closed meanwhile)
        return ""


def test_clients_that_leave_mid_request_leave_no_socket_behind_and_sigterm_is_prompt(model_dir, tmp_path):
    """Ten clients send a request that takes the model a second, and close their end at once; the
    answers go out to closed peers, which reset. None of their sockets stays open in the worker, and
    SIGTERM then ends the server in seconds, not its 25 s graceful timeout."""
    server = served(model_dir, tmp_path, KERAS_PIPE_MAX_BATCH="1")
    pid = worker_pid(server)
    before = sockets_of(pid)
    body = instances([slow_png()] * 3)
    for _ in range(10):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(request_head(len(body), "application/json") + body)
    # every answer written first (the access log's line comes after it): the model takes them one at
    # a time, 10 s here and past 30 s on CI's two cores under the other worker's load, when the
    # last one, still being answered, held the socket this test counted as left behind
    answered = wait_s(180) + time.monotonic()
    while server.log.read_text().count('"POST /invocations') < 10 and time.monotonic() < answered:
        time.sleep(0.5)
    deadline = time.monotonic() + 30
    while sockets_of(pid) > before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sockets_of(pid) <= before, (before, sockets_of(pid))
    started = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - started < 10


def test_expect_100_continue_is_answered_before_the_body_and_a_refusal_closes_instead(server):
    """curl sends Expect: 100-continue with bodies past 1 MB and waits for the 100 before sending it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request_head(len(JPEG))[:-2] + b"Expect: 100-continue\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n")
        sock.sendall(JPEG)
        assert answer_of(sock)[0] == 200
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request_head(len(JPEG), path="/nowhere")[:-2] + b"Expect: 100-continue\r\n\r\n")
        status, headers, _ = answer_of(sock)
        assert status == 404 and headers["connection"] == "close"
        assert closed_by_server(sock, 5) is not None


def test_a_client_that_closes_halfway_through_its_body_is_given_up_at_once(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request_head(10_000) + b"\0" * 1000)
    logged(server, r"POST /invocations: the client's connection ended before its answer: 1000 bytes of its body read",
           timeout=5)


def test_a_client_sending_on_behind_its_request_is_read_no_further_until_it_is_answered(server):
    """30 MB of pings pipelined behind a request, sent for 3 s: the worker stops reading the
    connection once a request waits behind the one being answered (uvicorn's h11 protocol pauses
    reading), and while the client leaves its answers unread, so that no more than the sockets'
    buffers take gets through (6.9 MB here; gunicorn's own ASGI worker read 400 MB in a second into
    the worker's memory); the first answer is the request's."""
    body = instances([slow_png()] * 3)
    flood = request_head(len(body), "application/json") + body + PING * (30_000_000 // len(PING))
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.setblocking(False)
        data, until = memoryview(flood), time.monotonic() + 3
        while data and time.monotonic() < until:
            try:
                data = data[sock.send(data):]
            except BlockingIOError:
                time.sleep(0.05)
        sent = len(flood) - len(data)
        sock.setblocking(True)
        assert answer_of(sock)[0] == 200
    assert sent < 20_000_000, sent


def answer_to_a_head_without_end(port: int, head: bytes) -> tuple[int, dict, bytes]:
    """The answer to `head` sent at once, its end never: the server may close before it is all sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(head)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return answer_of(sock)


def test_a_request_line_that_never_ends_is_refused_past_a_megabyte(server):
    assert answer_to_a_head_without_end(server.port, b"GET /" + b"x" * 5_000_000)[0] == 431


def test_max_payload_0_takes_bodies_of_any_size_sent_in_chunks(model_dir, tmp_path):
    """CreateTransformJob's MaxPayloadInMB=0: "arbitrarily large" bodies, sent in chunks; the
    worker's body budget bounds each."""
    import http.client

    server = served(model_dir, tmp_path, SAGEMAKER_BATCH="true", SAGEMAKER_MAX_PAYLOAD_IN_MB="0")
    try:
        lines = [json.dumps({"b64": base64.b64encode(JPEG).decode()}).encode() + b"\n"] * 500
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        connection.request("POST", "/invocations", iter(lines), {"Content-Type": "application/jsonlines"},
                           encode_chunked=True)
        answer = connection.getresponse()
        assert answer.status == 200 and len(answer.read().splitlines()) == 500
    finally:
        assert server.stop() == 0
    logged(server, r"bodies up to the worker's body budget's \(SAGEMAKER_MAX_PAYLOAD_IN_MB=0\) bytes \(batch transform\)")


def test_a_body_refused_at_its_head_on_a_connection_the_client_closes_is_read_so_it_gets_the_answer(server):
    """A client that says Connection: close (urllib does, always) sends its whole body before it reads
    the answer. Refused at the head (413 past SAGEMAKER_MAX_PAYLOAD_IN_MB), the connection must
    close after the answer; closed with the body still arriving, the kernel resets it, the answer
    waiting in the client's buffer is thrown away, and the client sees a broken pipe, not the 413
    (this failed one CI run in ten). The server shuts its side and reads the body on, then closes."""
    body = b"\0" * (2 * 1024 * 1024 + 1)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request_head(len(body))[:-2] + b"Connection: close\r\n\r\n")
        time.sleep(0.5)  # (the answer is sent, and the server would close, before the body comes)
        try:
            sock.sendall(body)
            status, headers, answer = answer_of(sock)
        except OSError as err:
            raise AssertionError(f"{err!r}: {server.log.read_text()[-3000:]}") from None
        assert status == 413 and headers["connection"] == "close", answer
        assert b"this server takes at most 2097152" in answer
        assert closed_by_server(sock, 5) is not None  # (its side shut: the answer ends there)
        # and the linger ends: at DRAIN_S the server closes, and what the client sends then is refused
        time.sleep(DRAIN_S + 1)
        with pytest.raises(OSError):
            for _ in range(20):
                sock.sendall(b"x" * 1000)
                time.sleep(0.05)
