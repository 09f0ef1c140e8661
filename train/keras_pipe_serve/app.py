"""The ASGI application SageMaker's inference contract asks for: GET /ping, POST /invocations; on a
multi-model endpoint, its contract's /models paths too (keras_pipe_serve.models).

Everything is decided at the door, in the worker's event loop (keras_pipe_serve.connections), as
soon as a request's headers are in, before its body is read:
- /ping is answered there and then: nothing a request does occupies the loop (parsing, checking
  and answering run in PARSE_THREADS threads, the model in the batcher's), so a ping never waits
  behind requests, however many clients there are or however they behave.
- Admission: every request in flight is counted (its body being read, parsed, waiting for the
  model, in a model call), and so are the bytes of the bodies being read or held. A request that
  would go past either (`max_queue` requests; `body_budget` bytes) is answered 503 with
  Retry-After at once; its body is then read and dropped, never parsed, so that its client gets
  the answer (closing on unread bytes makes TCP reset the connection, and the answer can be lost)
  and a kept-alive connection goes on. The same refusal is logged once a second, with how many
  more there were.
- Admission by deadline: a request comes in only if the images ahead of it (queued, in the
  model's calls, and one for each request admitted whose images are not queued yet), at the pace
  the model has kept lately (Batcher.expected_s), leave it time to be answered within
  ADMIT_SHARE of its timeout, or if nothing is ahead of it; else it is answered 503, Retry-After
  saying when the queue will have room. Checked again once its images are counted, before the
  model sees them. A first-in, first-out queue that admits every request serves few in time
  under a burst beyond capacity: each waits behind more than its timeout's worth (40 clients of
  slow photos at a 3 s timeout: 18 answers 200, 113 504, tests/serve/test_load.py); refused at
  the door, the others are (300 such clients at 5 s: 91 % of the capacity answered 200, no 504:
  docs/speed.md, Bursts beyond capacity). A connection refused again soon after its last refusal
  has its next one held (Holds): clients that resend at once, Retry-After unheeded, would
  otherwise keep the loop refusing.
- Time: a request's `timeout` (SAGEMAKER_MODEL_SERVER_TIMEOUT) runs from its arrival, through its
  body, its parsing, its wait and its model calls: past it, it is answered 504 and its images not
  yet computed are never computed. A body that stops arriving for BODY_IDLE_S is answered 408.
- A stuck model call (Batcher.stuck: far longer than the model has ever needed) is not waited out:
  the watchdog answers every request waiting with 503 and ends the worker, which gunicorn
  replaces with a fresh one (the model loaded again, in seconds; /ping answers 200 again once it
  is). A call merely slower than the timeout costs its requests a 504, not the instance.

A worker builds the app once, loading the model first: gunicorn hands a worker connections only
after that, so /ping answers 200 only once the model is loaded (while it loads, a ping waits in the
socket's queue, which SageMaker counts as not healthy yet). GET /execution-parameters is left out
on purpose (404): batch transform then uses its own defaults or the job's settings, and the
SageMaker SDK's local mode rejects the "MULTI_RECORD" spelling AWS's documentation gives for it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import os
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from keras_pipe_serve import payloads
from keras_pipe_serve.batcher import Batcher, Closed
from keras_pipe_serve.connections import DRAIN_LIMIT, DRAIN_S
from keras_pipe_serve.models import LOAD_BODY_BYTES, Models, Served
from keras_pipe_serve.payloads import BadRequest, Refusal
from keras_pipe_serve.predictor import ImageError, Predictor
from keras_pipe_train.report.text import printable

log = logging.getLogger("keras_pipe_serve")
# the access log: a line per answer (Answer.line), to stdout (keras_pipe_serve.server sets its handler)
ACCESS_LOG = "keras_pipe_serve.access"
access = logging.getLogger(ACCESS_LOG)

# seconds a body may stop arriving before the request is answered 408: far beyond a pause of any
# working client (SageMaker's front end sends a body as fast as its network), short enough that
# clients that stall hold their bytes of the budget briefly
BODY_IDLE_S = 10.0
# and a body must come at least this fast (bytes/s), beyond BODY_IDLE_S: 6 MB in a minute; a
# SageMaker front end sends at its network's speed
MIN_BODY_RATE = 100_000
# a request's path is said in the log and the 404 with its control characters escaped (a %0a,
# decoded to a newline, would forge a log line of its own), and cut to this many characters
PATH_SHOWN = 100
# characters of a request line or user agent shown in the access log, at most
ACCESS_SHOWN = 2000
# threads parsing bodies, checking images and writing answers: the work of the request itself,
# in Python (the GIL's), beside the model's
PARSE_THREADS = 2
# the watchdog's look at the model's calls
WATCH_S = 1.0
# a worker ended for a stuck model exits with this; gunicorn starts another
STUCK_EXIT = 70
# path -> (what it asks, the methods it takes); a multi-model endpoint's by method
ROUTES = {"/ping": ("ping", ("GET", "HEAD")), "/invocations": ("invoke", ("POST",))}
MODELS_ROUTE = ({"GET": "list", "POST": "load"}, ("GET", "POST"))
MODEL_ROUTE = ({"GET": "describe", "DELETE": "unload"}, ("GET", "DELETE"))
RETRY_AFTER_S = 1  # a full queue drains in about a model call: the client's retry is soon welcome
# a request is admitted if, at the model's recent pace, the images ahead of it go through within this
# share of its time left (and its own within the rest): the margin for what the estimate leaves
# out (its body, parsing and answer; the call running when it is queued, and its own, each up to a
# batch of images; a pace that changes).
# Measured (bench.serve --overload, 0.3 s photos), when the share bounded the request's own images
# too: with 0.75, 300 clients at a 5 s timeout got 56 % of the capacity in time and 52 answers 504;
# with 0.5, 91 % and none (400 clients at 60 s: 94 % and 83 %, no 504 either way). As it is now,
# 0.5: 85 % and 83 %, no 504 (docs/speed.md)
ADMIT_SHARE = 0.5
# a 503 for want of room is held this long for a connection that comes back before the Retry-After
# of its last refusal has passed, twice as long each time, up to HOLD_MAX_S (its body read and
# dropped meanwhile): a client that waits as Retry-After says gets its refusals at once; one that
# resends at once is slowed to about a refusal a second. Without it, 300 clients resending at once
# made 3,242 refusals a second, each read and answered on the loop, and the model served 23 % of
# its capacity (bench.serve's overload, docs/speed.md)
HOLD_FIRST_S = 0.05
HOLD_MAX_S = 1.0
# the connections whose last refusal is remembered, at most (the oldest are forgotten first)
HOLDS_KEPT = 4096


class Refused(Refusal):
    """The server's own limits, not the client's mistake: 503 (at capacity, restarting), 504 (past
    the timeout). `room`: a 503 for want of room, held for a client that resends at once (Holds)."""

    def __init__(self, status: int, message: str, *headers: tuple[str, str], room: bool = False,
                 retry_after: float = RETRY_AFTER_S):
        super().__init__(status, message, *headers)
        self.room, self.retry_after = room, retry_after


class Answer:
    """An answer's status and size as the app sends them, and its access log's line."""

    def __init__(self, send):
        self.sent, self.started = send, time.monotonic()
        self.status: int | None = None
        self.size = 0

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.size += len(message.get("body", b""))
        await self.sent(message)

    def line(self, scope: dict) -> str:
        """gunicorn's access log line, as this server's was under it ('%(h)s - - %(t)s "%(r)s" %(s)s
        %(b)s %(M)sms "%(a)s"': the common log format, the time it took, the user agent)."""
        client = (scope.get("client") or ("-",))[0]
        target = scope.get("raw_path") or scope.get("path", "").encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        agent = next((value for name, value in scope.get("headers", []) if name.lower() == b"user-agent"), b"-")
        request = f"{scope.get('method', '')} {target.decode('latin-1')} HTTP/{scope.get('http_version', '1.1')}"
        took = int((time.monotonic() - self.started) * 1000)
        return (f'{client} - - {time.strftime("[%d/%b/%Y:%H:%M:%S %z]")} "{printable(request, limit=ACCESS_SHOWN)}" '
                f'{self.status} {self.size} {took}ms "{printable(agent.decode("latin-1"), limit=ACCESS_SHOWN)}"')


class Gone(Exception):
    """The client's connection was reset: nobody is left to answer."""


def busy(message: str, retry_after: int = RETRY_AFTER_S, room: bool = False) -> Refused:
    return Refused(503, message, ("Retry-After", str(retry_after)), room=room, retry_after=retry_after)


class Holds:
    """How long to hold each connection's 503 for want of room (HOLD_FIRST_S ...): by the
    client's address and port, which a kept-alive connection keeps. (Behind SageMaker, a
    connection is its front end's, shared by its callers in turn: a connection held is one its
    front end resent on before the Retry-After, whoever the callers.)"""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        # client -> (when its last refusal's Retry-After passes, how long that refusal was held), oldest first
        self._last: collections.OrderedDict = collections.OrderedDict()

    def hold_s(self, client, retry_after: float) -> float:
        """How long to hold this refusal of `client`'s, whose Retry-After is `retry_after` s."""
        now = self.clock()
        until, held = self._last.pop(client, (-math.inf, 0.0))
        hold = min(HOLD_MAX_S, max(HOLD_FIRST_S, 2 * held)) if now < until else 0.0
        self._last[client] = (now + hold + retry_after, hold)
        while len(self._last) > HOLDS_KEPT:
            self._last.popitem(last=False)
        return hold

    def forget_past(self) -> None:
        """Forgets the connections whose Retry-After has passed (the watchdog's tick)."""
        now = self.clock()
        while self._last and next(iter(self._last.values()))[0] <= now:
            self._last.popitem(last=False)


@dataclass
class Door:
    """What is in flight, counted where requests arrive: `requests` from their headers to their
    answer, of at most `max_requests`; `body_bytes` of bodies being read or held, of at most
    `body_budget` (a body of unknown length counts as the largest allowed)."""
    max_requests: int
    body_budget: int
    requests: int = 0
    body_bytes: int = 0
    arriving: int = 0  # requests admitted whose images are not in the batcher's queue yet

    def full(self, body: int) -> str | None:
        """Why a request with a body of `body` bytes cannot come in now (None: it can)."""
        if self.requests >= self.max_requests:
            return f"{self.requests} requests are in flight already, the most this worker takes (KERAS_PIPE_MAX_QUEUE)"
        if self.body_bytes and self.body_bytes + body > self.body_budget:
            return (f"bodies of {self.body_bytes} bytes are being read or held, and this one's {body} would pass the "
                    f"{self.body_budget} bytes this worker holds at once (KERAS_PIPE_MAX_BODIES_MB)")
        return None

    def enter(self, body: int) -> Entry:
        self.requests, self.body_bytes, self.arriving = self.requests + 1, self.body_bytes + body, self.arriving + 1
        return Entry(self, body)


@dataclass
class Entry:
    """One request counted at the door, until it leaves."""
    door: Door
    body: int
    queued: bool = False

    def in_queue(self) -> None:
        """Its images are in the batcher's queue (or never will be): no longer counted as arriving."""
        if not self.queued:
            self.queued = True
            self.door.arriving -= 1

    def leave(self) -> None:
        self.in_queue()
        self.door.requests -= 1
        self.door.body_bytes -= self.body


@dataclass
class _Read:
    """How much of a request's body is read, which decides what a refusal does with its connection."""
    unread: bool = True  # nothing yet: a refusal reads the body and drops it (_drained) where it can
    whole: bool = False  # all of it: a refusal keeps the connection for the next request


class Refusals:
    """The refusals' log lines: each status's first in a second logged whole, the rest of that
    second counted and said in one line after it (a crowd turned away at the door would otherwise
    write a line per request, thousands a second, on the loop that answers /ping). 4xx lines, a
    client's own mistakes, are each logged."""

    def __init__(self, every: float = 1.0):
        self.every = every
        self._last: dict[int, float] = {}
        self._held: dict[int, tuple[int, str]] = {}

    def log(self, status: int, line: str) -> None:
        now = time.monotonic()
        if status < 500 or now - self._last.get(status, -self.every) >= self.every:
            self._last[status] = now
            log.warning("%d %s", status, line)
        else:
            count, _ = self._held.get(status, (0, line))
            self._held[status] = (count + 1, line)

    def flush(self) -> None:
        """Says how many refusals of each status went unsaid since their last line."""
        held, self._held = self._held, {}
        for status, (count, line) in held.items():
            log.warning("%d (%d more in the last %g s, the last:) %s", status, count, self.every, line)


class App:
    def __init__(self, models: Models, max_body: int, batch: bool, timeout: float, max_queue: int, body_budget: int):
        """`models`: the endpoint's model, or a multi-model endpoint's (keras_pipe_serve.models).
        `batch`: serving a batch transform (SAGEMAKER_BATCH), whose default answer may differ
        (payloads.answer_type). `timeout`: the seconds a request may take, from its arrival.
        `max_queue`, `body_budget`: the door's limits (Door). (keras_pipe_serve.server gives each
        its default and its setting.)"""
        self.models = models
        self.max_body = max_body
        self.batch = batch
        self.timeout = timeout
        self.door = Door(max_queue, body_budget)
        self._threads = ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="request")
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="model-load")  # (one load at a time: its memory)
        self._watchdog: asyncio.Task | None = None
        self.restarting: str | None = None  # why this worker is ending (a stuck model): /ping says so, as 503
        self.refusals = Refusals()
        self.holds = Holds()

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            answer = Answer(send)
            try:
                await self._http(scope, receive, answer.send)
            finally:
                if answer.status is not None:
                    access.info(answer.line(scope))

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._watchdog = asyncio.get_running_loop().create_task(self._watch())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._watchdog:
                    self._watchdog.cancel()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _watch(self) -> None:
        """Ends the worker once a model call is stuck (Batcher.stuck), answering every request
        waiting for the model with 503 first: a thread inside TensorFlow cannot be stopped, and a
        worker whose model is stuck answers no request again."""
        while True:
            await asyncio.sleep(WATCH_S)
            self.refusals.flush()
            self.holds.forget_past()
            why = next(filter(None, (served.batcher.stuck() for served in self.models.all())), None)
            if why:
                log.error("the model is stuck: %s; this worker (pid %d) ends, and gunicorn starts another",
                          why, os.getpid())
                self.restarting = f"the model was stuck ({why}); it is being restarted"
                for served in self.models.all():
                    served.batcher.fail_all(busy(f"{self.restarting}: retry shortly"))
                await asyncio.sleep(0.5)  # (the answers go out)
                logging.shutdown()
                os._exit(STUCK_EXIT)

    # -- one request --
    async def _http(self, scope: dict, receive, send) -> None:
        arrived = time.monotonic()
        path, method = scope.get("path", ""), scope.get("method", "")
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}
        read = _Read()
        try:
            action, name = _route(path, method, self.models.multi)
            if action == "ping":
                await self._ping(send)
                return
            if self.restarting:
                raise busy(f"{self.restarting}: retry shortly")
            if action == "invoke":
                await self._invoke(name, headers, receive, send, arrived, read)
            else:
                await self._manage(action, name, scope, headers, receive, send, arrived, read)
        except Refusal as refused:
            # every refusal is logged with its reason (the access log has only its status), the
            # same one once a second
            self.refusals.log(refused.status, f"{method} {printable(path, limit=PATH_SHOWN)}: {refused}")
            drain = read.unread and _drainable(headers)
            await self._refuse(send, receive, refused.status, _error(str(refused)), drain, refused.headers,
                               self._hold_s(refused, scope, drain), read=read.whole)
        except Gone as gone:
            log.warning("%s %s: the client's connection ended before its answer: %s", method,
                        printable(path, limit=PATH_SHOWN), gone)
        except Exception:  # a bug here, not the client's fault: logged whole, the worker kept alive
            log.exception("500 %s %s: an unexpected error", method, printable(path, limit=PATH_SHOWN))
            await self._refuse(send, receive, 500, _error("the server failed on this request (see its log)"),
                               read.unread and _drainable(headers), read=read.whole)

    async def _invoke(self, name: str | None, headers: dict, receive, send, arrived: float, read: _Read) -> None:
        """POST /invocations (`name` None: the endpoint's model) or /models/NAME/invoke: admitted at
        the door (its room, and its model's pace), then its body read, parsed, computed, answered."""
        served = self.models.named(name) if name is not None else self.models.default()
        length = self._length(headers)
        cost = self.max_body if length is None else length
        full = self.door.full(cost)
        if full:
            raise busy(f"the server is at capacity ({full}); retry shortly", room=True)
        deadline = arrived + self.timeout
        self._in_time(served.batcher, deadline, self.door.arriving)  # (those arriving: mostly queued before it)
        entry = self.door.enter(cost)
        try:
            read.unread = False
            # (a client that sent Expect: 100-continue, as curl does past 1 MB, is sent its 100 Continue
            # by uvicorn at the first receive(), and only then sends the body)
            body = await _body(receive, length, self.max_body, deadline, arrived)
            read.whole = True
            kind, answer = await self._invocations(served, headers, body, deadline, receive, entry)
        finally:
            entry.leave()
        await _respond(send, 200, answer, kind)

    async def _manage(self, action: str, name: str | None, scope: dict, headers: dict, receive, send,
                      arrived: float, read: _Read) -> None:
        """A multi-model endpoint's own requests (keras_pipe_serve.models): list, describe, load, unload."""
        if action == "load":
            length = self._length(headers)
            if length is not None and length > LOAD_BODY_BYTES:
                raise BadRequest(413, f"the body of POST /models is {length} bytes; it takes at most {LOAD_BODY_BYTES}")
            read.unread = False
            body = await _body(receive, length, LOAD_BODY_BYTES, arrived + self.timeout, arrived)
            read.whole = True
            loop = asyncio.get_running_loop()
            target = headers.get("x-amzn-sagemaker-target-model")
            answer = (await loop.run_in_executor(self._loader, self.models.load, bytes(body), target)).described()
        elif action == "list":
            query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
            answer = self.models.page(query.get("next_page_token", [None])[0])
        elif action == "describe":
            answer = self.models.named(name).described()
        else:
            self.models.named(name)  # (404 at once for one not loaded)
            await asyncio.get_running_loop().run_in_executor(None, self.models.unload, name,
                                                             headers.get("x-amzn-sagemaker-target-model"))
            answer = {"modelName": name, "unloaded": True}
        await _respond(send, 200, json.dumps(answer).encode(), payloads.JSON)

    def _hold_s(self, refused: Refusal, scope: dict, drain: bool) -> float:
        """How long to hold this refusal (Holds): a 503 for want of room whose body can be read and
        dropped meanwhile; any other, 0 (one that closes the connection is answered at once)."""
        if not (isinstance(refused, Refused) and refused.room and drain):
            return 0.0
        return self.holds.hold_s(tuple(scope.get("client") or ()), refused.retry_after)  # (ASGI: a list or a tuple)

    async def _ping(self, send) -> None:
        problems = (served.batcher.problem() for served in self.models.all())
        problem = self.restarting or next(filter(None, problems), None)
        if problem:
            raise Refused(503, f"the model cannot answer: {problem}")
        await _respond(send, 200, b"", "text/plain")

    @staticmethod
    async def _refuse(send, receive, status: int, body: bytes, drain: bool,
                      extra: list[tuple[str, str]] = (), hold: float = 0.0, read: bool = False) -> None:
        """The answer first; where the body can be read and dropped (`drain`: _drainable), the
        connection stays open, and the server reads and drops the rest of it after the answer
        (uvicorn does, within keras_pipe_serve.connections' bounds: DRAIN_S, DRAIN_LIMIT); `read`:
        the body was read whole already (a refusal after it: a request that cannot be parsed, the
        second look at capacity), and the connection stays open too; otherwise (read in part, too
        large, or awaiting a 100 Continue that will not come) the connection closes after the
        answer. Held (`hold` seconds, Holds), the body is read and dropped meanwhile (_drained),
        not held in memory, and the answer comes after both."""
        if hold:
            drained, _ = await asyncio.gather(_drained(receive), asyncio.sleep(hold))
            await _respond(send, status, body, payloads.JSON, close=not drained, extra=extra)
            return
        await _respond(send, status, body, payloads.JSON, close=not (drain or read), extra=extra)

    def _length(self, headers: dict) -> int | None:
        """The body's declared length (None: chunked), refused at once past max_body."""
        raw = headers.get("content-length")
        if raw is None:
            return None
        if not raw.strip().isdigit():
            raise BadRequest(400, f"Content-Length {raw[:30]!r} is not a number")
        length = int(raw)
        if length > self.max_body:
            raise BadRequest(413, f"the body is {length} bytes; this server takes at most {self.max_body} "
                                  f"(SAGEMAKER_MAX_PAYLOAD_IN_MB, 6 MB unless set)")
        return length

    def _in_time(self, batcher: Batcher, deadline: float, arriving: int, own: int = 1) -> None:
        """A 503 for a request of `own` images (at the door: one, its body unread) behind which the
        model, at its recent pace, would not get through the images queued or in its calls and one
        for each of `arriving` (Door.arriving) within ADMIT_SHARE of its time left, or through its
        own too within all of it; Retry-After says when the present backlog will have gone
        through enough, at most the timeout. With nothing ahead it comes in whatever the
        estimate: it delays nobody, and a pace measured on other images (a burst of large
        photos) may not be its own. A batch transform's requests are not refused so: how many
        come at once is the transform's own setting (MaxConcurrentTransforms), and its retries are
        few (InvocationsMaxRetries, at most 3)."""
        ahead = batcher.backlog() + arriving
        if not ahead or self.batch:
            return
        pace, left = batcher.per_image_s(), deadline - time.monotonic()
        wait, expected = batcher.expected_s(ahead, 0, pace), batcher.expected_s(ahead, own, pace)
        if wait > ADMIT_SHARE * left or expected > left:
            excess = max(wait - ADMIT_SHARE * left, expected - left)
            raise busy(f"the server is at capacity: {ahead} image(s) ahead of this request's {own} would take about "
                       f"{wait:.1f} s at the model's recent {pace * 1000:.0f} ms an image, "
                       f"{expected:.1f} s with its own, past {ADMIT_SHARE:g} of its {self.timeout:g} s "
                       f"(SAGEMAKER_MODEL_SERVER_TIMEOUT) or all of it; retry later",
                       min(max(RETRY_AFTER_S, math.ceil(excess)), max(RETRY_AFTER_S, math.ceil(self.timeout))),
                       room=True)

    async def _invocations(self, served: Served, headers: dict, body: bytearray, deadline: float, receive,
                           entry: Entry) -> tuple[str, bytes]:
        request, answer, top_k = await self._in_thread(self._parsed, deadline, served.predictor, headers, body)
        entry.in_queue()  # (queued next, or refused: either way no longer arriving)
        self._in_time(served.batcher, deadline, 0, len(request.images))  # (those still arriving queue behind it)
        try:
            job = served.batcher.submit(request.images, deadline)
        except Closed:
            raise BadRequest(404, f"model {served.name[:200]!r} was unloaded while this request was read") from None
        outputs = await self._answered(served.batcher, job, deadline, receive)
        return answer.kind, await self._in_thread(self._rendered, deadline, served.predictor, outputs, top_k, answer,
                                                  request)

    def _parsed(self, predictor: Predictor, headers: dict, body: bytearray):
        """(in a request thread) The request's images, how to answer and top_k: Accept, top_k and
        each image's header are checked before the model runs, so that a request that cannot be
        answered costs nothing. The answer is in the model's dialect; top_k shapes only this
        project's."""
        request = payloads.parse(headers.get("content-type"), body)
        answer = payloads.answer_type(headers.get("accept"), request, predictor.dialect, self.batch)
        top_k = None
        if answer.form == payloads.RICH_FORM:
            top_k = payloads.top_k_of(headers.get("x-amzn-sagemaker-custom-attributes"), predictor.default_top_k)
        predictor.check(request.images)
        return request, answer, top_k

    @staticmethod
    def _rendered(predictor: Predictor, outputs, top_k, answer, request) -> bytes:
        return payloads.render(predictor.predictions(*outputs, top_k), answer, request)

    async def _in_thread(self, work, deadline: float, *args):
        """work(*args) in a request thread, given up (504) at the deadline."""
        future = asyncio.get_running_loop().run_in_executor(self._threads, work, *args)
        try:
            return await asyncio.wait_for(future, max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise self._late("the request was still being read or answered") from None

    async def _answered(self, batcher: Batcher, job, deadline: float, receive):
        """The job's outputs, once the model has them; 504 at the deadline, Gone once the client's
        connection is reset: either gives the job up (Batcher.cancel)."""
        count = len(job.images)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        job.when_done(lambda: loop.call_soon_threadsafe(_settle, done))
        reset = loop.create_task(receive())  # (after the body, receive() returns only when the connection is lost)
        try:
            finished, _ = await asyncio.wait({done, reset}, timeout=max(0.0, deadline - time.monotonic()),
                                             return_when=asyncio.FIRST_COMPLETED)
        finally:
            reset.cancel()
        if done not in finished:
            if reset in finished:
                raise Gone(batcher.cancel(job))
            raise self._late(batcher.cancel(job))
        if isinstance(job.error, ImageError):
            raise BadRequest(400, job.error.named(count))
        if job.error is not None:
            raise job.error
        return job.probabilities, job.predicted

    def _late(self, what: str) -> Refused:
        return Refused(504, f"no answer within {self.timeout:g} s (SAGEMAKER_MODEL_SERVER_TIMEOUT): {what}")


def _route(path: str, method: str, multi: bool) -> tuple[str, str | None]:
    """(what the request asks, the model it names or None), or a 404 or 405 for what this server
    does not answer. A multi-model endpoint's paths are answered only on one (multi)."""
    name = None
    if path in ROUTES:
        action, allowed = ROUTES[path]
    elif multi and path == "/models":
        action, allowed = MODELS_ROUTE
    elif multi and path.startswith("/models/") and path.endswith("/invoke") and len(path) > len("/models//invoke"):
        name, (action, allowed) = path[len("/models/"):-len("/invoke")], ROUTES["/invocations"]
    elif multi and path.startswith("/models/") and len(path) > len("/models/"):
        name, (action, allowed) = path[len("/models/"):], MODEL_ROUTE
    else:
        models = ", GET and POST /models, GET and DELETE /models/<name>, POST /models/<name>/invoke" if multi else ""
        raise BadRequest(404, f"no such path {printable(path, limit=PATH_SHOWN)!r}: this server answers GET /ping "
                              f"and POST /invocations{models}")
    if method not in allowed:
        raise BadRequest(405, f"{printable(path, limit=PATH_SHOWN)} takes {' or '.join(allowed)}",
                         ("Allow", ", ".join(allowed)))
    return (action[method] if isinstance(action, dict) else action), name


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


async def _body(receive, length: int | None, max_body: int, deadline: float, arrived: float) -> bytearray:
    """The whole body, into one buffer of its declared length (no copy of it made on the way, nor
    after: the parser slices it); 408 when it stops arriving for BODY_IDLE_S, or comes slower than
    MIN_BODY_RATE (a client sending a byte now and then would hold its place at the door until the
    timeout), 504 at the deadline, 413 past max_body when it is sent in chunks. One timer for the
    whole read, moved on at each
    chunk: a chunk already arrived is taken without a turn of the loop (asyncio.wait_for would
    start a task for each, and the chunks arriving meanwhile would pile up, a second copy of the
    body)."""
    body = bytearray(length) if length is not None else bytearray()
    at = 0
    loop = asyncio.get_running_loop()
    whole_by = min(deadline, arrived + BODY_IDLE_S + (max_body if length is None else length) / MIN_BODY_RATE)
    try:
        async with asyncio.timeout(None) as timer:
            while True:
                timer.reschedule(loop.time() + max(0.0, min(BODY_IDLE_S, whole_by - time.monotonic())))
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise Gone(f"{at} bytes of its body read")
                chunk = message.get("body", b"")
                if length is None:
                    if at + len(chunk) > max_body:
                        raise BadRequest(413, f"the body is more than {max_body} bytes, this server's limit "
                                              f"(SAGEMAKER_MAX_PAYLOAD_IN_MB, 6 MB unless set)")
                    body += chunk
                else:
                    body[at:at + len(chunk)] = chunk
                at += len(chunk)
                if not message.get("more_body", False):
                    return body if length is None or at == length else body[:at]
    except TimeoutError:
        declared = length if length is not None else "a chunked body"
        now = time.monotonic()
        if now >= deadline:
            raise Refused(504, f"the body was still arriving at the request's timeout ({at} bytes of {declared} "
                               f"read)") from None
        if now >= whole_by:
            raise BadRequest(408, f"the body came slower than {MIN_BODY_RATE // 1000} KB/s: {at} bytes of {declared} "
                                  f"in {now - arrived:.0f} s") from None
        raise BadRequest(408, f"the body stopped arriving for {BODY_IDLE_S:g} s after {at} bytes of "
                              f"{declared}") from None


def _drainable(headers: dict) -> bool:
    """Whether a refused request's unread body can be read and dropped: not past DRAIN_LIMIT, and
    not held back for a 100 Continue (the client sends none of it after a refusal)."""
    length = headers.get("content-length", "").strip()
    if length.isdigit() and int(length) > DRAIN_LIMIT:
        return False
    return headers.get("expect", "").strip().lower() != "100-continue"


async def _drained(receive) -> bool:
    """Reads the rest of a refused request's body and drops it, while its answer is held, so that
    the connection can carry the next request; False where it cannot (more than DRAIN_LIMIT, a
    client that stops sending for DRAIN_S, or one gone): the answer then closes the connection."""
    read = 0
    try:
        async with asyncio.timeout(DRAIN_S):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return False
                read += len(message.get("body", b""))
                if read > DRAIN_LIMIT:
                    return False
                if not message.get("more_body", False):
                    return True
    except TimeoutError:
        return False


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def _respond(send, status: int, body: bytes, kind: str, close: bool = False,
                   extra: list[tuple[str, str]] = ()) -> None:
    headers = [("Content-Type", kind), ("Content-Length", str(len(body))), *extra]
    if close:  # (the rest of the request is unread: the connection cannot carry another)
        headers.append(("Connection", "close"))
    # (names as HTTP/1.1 clients have always seen them: some read headers case-sensitively)
    await send({"type": "http.response.start", "status": status,
                "headers": [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]})
    await send({"type": "http.response.body", "body": body})
