"""The worker's connections: uvicorn's HTTP/1.1 protocol on h11 (uvicorn.protocols.http.h11_impl),
in an asyncio event loop, run under gunicorn's master by the uvicorn-worker package
(uvicorn_worker.UvicornWorker), with what that protocol leaves out, which a server facing any
client needs, added over its public hooks only.

Why an event loop at all: a connection then costs a socket and a few objects, not a thread. With
gunicorn's gthread worker, every connection holds a thread of a fixed pool while it is read,
waits or lingers: a crowd of clients, stalled uploads, or clients lingering after Connection:
close take every thread, and /ping waits in gunicorn's queue behind them, past SageMaker's 2 s
(docs/speed.md, Serving the model). Here the loop reads every connection at once, answers /ping
itself, and hands only parsing and the model to threads (keras_pipe_serve.app).

Why uvicorn's h11 protocol, and gunicorn still the master: gunicorn is the server (master, worker
restarts, graceful SIGTERM, one worker per GPU); uvicorn-worker runs uvicorn's server in each of its
workers. gunicorn's own ASGI worker (gunicorn.workers.gasgi, beta) was the front before: what it
left out could be added only by overriding about fourteen of its private names, on paths its
authors are changing. uvicorn's h11 protocol already closes a kept-alive connection that stays
idle after a response (timeout_keep_alive: gunicorn's `keepalive`), bounds an incomplete request
head (h11_max_incomplete_event_size), reads no further while pipelined requests wait behind the one
being answered (h11 pauses) and takes none of them up while its client leaves answers unread (a
response waits for the transport to drain), answers `100 Continue` itself when the app first reads a body sent
with `Expect: 100-continue`, and reads and drops the rest of a body the app answered without
reading. h11's protocol is taken, never httptools' (uvicorn's "auto" choice where httptools is
installed), whose parser has none of the state the hooks below read. What is still missing (how
each was seen, and in which versions: docs/speed.md, Figures behind the code's choices: The
worker's gaps), each added below over asyncio.Protocol's hooks (connection_made, data_received,
eof_received, connection_lost), uvicorn's public attributes and methods, and h11's public API
(Connection.their_state, .trailing_data):

- **A connection that never sends a byte is never closed**, nor one that sends part of its headers
  and stops: uvicorn arms its keep-alive timer only after a response, and cancels it at a
  connection's first bytes. Here each waits at most `keepalive` seconds for its first request and
  HEADERS_S for the rest of the headers it began (or `keepalive`, if shorter).
- **A half-closed client gets no answer.** A client may end its side once its request is sent
  (shutdown(SHUT_WR), as `nc -N` does): asyncio then closes the whole connection unless told not
  to (uvicorn does not), and the answer is lost. Here the connection stays open for the answer,
  then closes. TCP cannot tell a client that half-closed from one that closed: a request whose
  client sent its end is computed and answered (the answer goes nowhere if it was gone; its time
  is still bounded by the request timeout), and one whose connection is reset is given up at once.
- **A request head without end is answered 400** at h11's limit (16 KiB by default: uvicorn answers
  every error of h11's 400), where 431 says what is wrong. Here a request line and headers past
  HEADER_BYTES are refused 431, h11's own limit set above it.
- **The rest of a refused body is read without end**: uvicorn drops it as it comes, with no limit
  on its time or size, the connection held meanwhile. Here at most DRAIN_S seconds and DRAIN_LIMIT
  bytes after the answer, then the connection is closed.
- **A connection closed with a body still arriving loses its answer**: uvicorn closes at once after
  an answer when the connection must close (the client said Connection: close, as urllib always
  does, or the app did), and the bytes the client sends after the close are answered with a
  reset: its send fails, and a client that sends its whole body before it reads (urllib,
  http.client) stops there and never reads the 413 refused at the head (some stacks, Windows',
  also throw away the answer received). Here such a close lingers, as nginx's lingering_close:
  the answer is sent, the server's side shut, and the body read and dropped until the client
  closes, DRAIN_LIMIT bytes or DRAIN_S seconds (a refused body's drain already running keeps its
  own), then the connection closed (_Lingering). Only a body still arriving lingers: pipelined
  requests unread, and a head refused 431 or 400, close at once.
- (Bodies: uvicorn never gives up on a body that stops arriving; the app reads bodies with its own
  timeouts: keras_pipe_serve.app.)

A check at boot (wrong_versions, called by keras_pipe_serve.server before gunicorn starts) refuses
versions of gunicorn, uvicorn, uvicorn-worker and h11 outside those this front was built and tested
on (BUILT_FOR): each hook below leans on what those versions do.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import re
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn_worker import UvicornWorker

log = logging.getLogger("keras_pipe_serve")

# seconds a client has to finish the headers it began (nginx's client_header_timeout is 60; the
# front end of SageMaker sends a request's headers at once)
HEADERS_S = 15.0
# bytes of a request line and headers (gunicorn's limits, before: a 4,094-byte line, 100 fields of 8,190)
HEADER_BYTES = 1 << 20
# a refused request's body up to this size is read and dropped, so that its client gets the answer
# and the connection goes on: SageMaker's batch transform sends at most 100 MB (MaxPayloadInMB); a
# larger one, or one that stops arriving (DRAIN_S), closes the connection instead (the app says
# which, by the declared length: keras_pipe_serve.app), after the same bounds of lingering
# (Protocol.door_linger)
DRAIN_LIMIT = 100 << 20
DRAIN_S = 5.0
# the versions this front was built and tested on, [from, below) (train/pyproject.toml says the
# same; requirements/base.txt pins one of each)
BUILT_FOR = {"gunicorn": ("26.2", "27"), "uvicorn": ("0.54", "0.55"), "uvicorn-worker": ("0.4", "0.5"),
             "h11": ("0.16", "0.17")}


def _release(version: str) -> tuple[int, ...]:
    """A version's leading numbers ("0.54.0rc1": (0, 54, 0))."""
    numbers = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if not digits:
            break
        numbers.append(int(digits[0]))
        if digits[0] != part:
            break
    return tuple(numbers)


def wrong_versions(installed: Callable[[str], str] = importlib.metadata.version) -> list[str]:
    """What is installed outside BUILT_FOR, each said with the version installed and those expected."""
    wrong = []
    for name, (low, high) in BUILT_FOR.items():
        try:
            version = installed(name)
        except importlib.metadata.PackageNotFoundError:
            wrong.append(f"{name} is not installed; this server was built for {name}>={low},<{high}")
            continue
        if not _release(low) <= _release(version) < _release(high):
            wrong.append(f"{name} {version} is installed; this server was built for {name}>={low},<{high}")
    return wrong


@dataclass
class _Watch:
    """What Protocol adds to each connection (one attribute of uvicorn's protocol, `door`)."""
    headers: asyncio.TimerHandle | None = None  # the rest of a request head begun must come by then
    drain: asyncio.TimerHandle | None = None  # the rest of a refused body must come by then
    drained: int = 0  # bytes of a refused body read since its answer (or since a linger began)
    peer_done: bool = False  # the client sent its end (EOF) while its request was being answered
    socket: asyncio.Transport | None = None  # the connection's own transport (uvicorn has _Lingering)
    lingering: bool = False  # closed by uvicorn with a body still arriving: read and dropped, then closed


class _Lingering:
    """The connection's transport as uvicorn sees it (every attribute the socket's own), but for
    close(): while the client is still sending a request's body, the close lingers
    (Protocol.door_linger)."""

    def __init__(self, transport: asyncio.Transport, protocol: Protocol):
        # (the protocol by a weak reference: it holds this, and a cycle would keep each closed
        # connection's buffers until the cyclic collector came by)
        self._transport, self._protocol, self._closing = transport, weakref.ref(protocol), False

    def close(self) -> None:
        self._closing = True
        protocol = self._protocol()
        if protocol is None:
            self._transport.close()
        else:
            protocol.door_linger()

    def is_closing(self) -> bool:
        return self._closing or self._transport.is_closing()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class Protocol(H11Protocol):
    """uvicorn's h11 connection, with idle and header timeouts, half-closed clients answered, request
    heads refused 431 past HEADER_BYTES, refused bodies drained within bounds, and a close with a
    body still arriving lingering (door_linger)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.door = _Watch(socket=transport)
        super().connection_made(_Lingering(transport, self))
        # uvicorn arms its keep-alive timer only once a response is complete: a connection that never
        # sends a byte would stay open until the worker ends. Armed here too, the same timer, which
        # uvicorn's data_received cancels at the first bytes
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        """uvicorn's (h11 fed, its events handled), bounded: the rest of a refused body, and a request
        head that does not end, or ends too slowly."""
        if self.door.lingering:
            self.door.drained += len(data)
            if self.door.drained > DRAIN_LIMIT:
                self.door_close()
            return
        if self.door.drain is not None:
            # the rest of a refused body, which uvicorn drops as it comes, without end: at most DRAIN_LIMIT bytes
            self.door.drained += len(data)
            if self.door.drained > DRAIN_LIMIT:
                self.door_close()
                return
        super().data_received(data)
        if self.transport.is_closing():
            return
        if self.door.drain is not None and self.conn.their_state is not h11.SEND_BODY:  # (that body's end came)
            self.door.drain.cancel()
            self.door.drain = None
        # a request head begun and not complete (h11 waits in IDLE for the whole of it): uvicorn, whose
        # data_received cancelled the keep-alive timer, would wait for the rest without end, and h11
        # would refuse it only past its limit, with uvicorn's 400
        begun = self.conn.their_state is h11.IDLE and len(self.conn.trailing_data[0])
        if not begun:
            if self.door.headers is not None:
                self.door.headers.cancel()
                self.door.headers = None
        elif begun > HEADER_BYTES:
            self.door_refuse_head()
        elif self.door.headers is None:
            self.door.headers = self.loop.call_later(min(HEADERS_S, self.timeout_keep_alive), self.door_headers_late)

    def door_headers_late(self) -> None:
        self.door.headers = None
        if self.conn.their_state is h11.IDLE:  # (still no whole request head)
            self.timeout_keep_alive_handler()

    def door_refuse_head(self) -> None:
        """431, and the connection closed: a request line and headers past HEADER_BYTES, not yet ended."""
        message = f"the request's line and headers passed {HEADER_BYTES} bytes"
        log.warning("431 %s:%s: %s", *(self.client or ("?", "?")), message)
        body = json.dumps({"error": message}).encode()
        # (h11 lets a server answer before a request is whole, for this)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        head = h11.Response(status_code=431, reason=b"Request Header Fields Too Large", headers=headers)
        events = (head, h11.Data(data=body), h11.EndOfMessage())
        self.transport.write(b"".join(self.conn.send(event) for event in events))
        self.door_close()

    def eof_received(self) -> bool | None:
        """The client's end. uvicorn's returns None, and asyncio then closes the connection, the answer
        to a request already whole lost with it: here it is kept open for that answer, and closed
        after it (on_response_complete). Any other end closes it: a request whose body cannot come
        whole is given up at once (the app's receive() says http.disconnect), and a lingering close
        ends."""
        if self.door.lingering:
            return None
        if self.cycle is not None and not self.cycle.response_complete and self.conn.their_state is h11.DONE:
            self.door.peer_done = True
            return True
        return None

    def on_response_complete(self) -> None:
        """uvicorn's (the keep-alive timer armed, a pipelined request taken up), then: closed if the client
        had sent its end; or, where the client is still sending the body of a request answered
        without reading it (a refusal), that body drained for at most DRAIN_S."""
        super().on_response_complete()
        if self.transport.is_closing():
            return
        if self.door.peer_done and (self.cycle is None or self.cycle.response_complete):
            self.door_close()
        elif self.conn.their_state is h11.SEND_BODY and self.door.drain is None:
            self.door.drained = 0
            self.door.drain = self.loop.call_later(DRAIN_S, self.door_drain_late)

    def door_drain_late(self) -> None:
        self.door.drain = None
        if self.conn.their_state is h11.SEND_BODY:
            self.door_close()

    def door_close(self) -> None:
        if not self.door.socket.is_closing():
            self.door.socket.close()

    def door_linger(self) -> None:
        """uvicorn's close. With the client still sending a request's body (h11's SEND_BODY: a body
        answered unread, the connection to close after), closed at once the client's next bytes
        would be reset and its answer unread: the answer is sent and the server's side shut
        (write_eof), the rest read and dropped until the client closes, DRAIN_LIMIT bytes or
        DRAIN_S seconds, then the connection closed. Otherwise closed at once."""
        socket = self.door.socket
        if socket.is_closing() or self.door.lingering:
            return
        if self.conn.their_state is not h11.SEND_BODY or not socket.can_write_eof():
            socket.close()
            return
        try:
            socket.write_eof()
        except OSError:  # (the client's reset already come, not yet read: ENOTCONN)
            socket.abort()
            return
        self.door.lingering = True
        socket.resume_reading()  # (uvicorn pauses reading while a body the app has not read piles up)
        # a refused body's drain already running keeps its bounds: its bytes counted, its end
        if self.door.drain is None:
            self.door.drained, ends = 0, self.loop.time() + DRAIN_S
        else:
            ends = self.door.drain.when()
            self.door.drain.cancel()
        self.door.drain = self.loop.call_at(ends, self.door_close)

    def shutdown(self) -> None:
        """uvicorn's (SIGTERM: an idle connection closed, a busy one after its answer), but for a
        connection already closing: a lingering one ends within DRAIN_S, and uvicorn's would tell
        h11 of its close again (LocalProtocolError where h11 is in ERROR, out of the server's loop
        over its connections: the others then never told)."""
        if self.transport.is_closing():
            return
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        """uvicorn's (the request told http.disconnect), and this class's timers let go."""
        super().connection_lost(exc)
        for timer in (self.door.headers, self.door.drain):
            if timer is not None:
                timer.cancel()
        self.door.headers = self.door.drain = None


class Worker(UvicornWorker):
    """uvicorn-worker's gunicorn worker, serving each connection with Protocol, and telling gunicorn's
    master it is alive while its model loads. (SIGTERM: uvicorn closes the connections waiting for a
    request at once, and those with one after its answer; one whose client is still sending a body
    lingers at most DRAIN_S.)"""

    CONFIG_KWARGS = {
        "loop": "asyncio",  # (asyncio's transports, as tested: a read of 256 KiB at most, which HEADER_BYTES counts on)
        "http": Protocol,  # (never httptools', uvicorn's "auto" choice where it is installed)
        "ws": "none",
        "interface": "asgi3",
        "lifespan": "on",  # (the lifespan starts the app's watchdog)
        "access_log": False,  # (the app writes its own line, with its size and time: keras_pipe_serve.app)
        "proxy_headers": False,  # (the client is the socket's peer: the app's holds go by its address and port)
        # h11's limit on an incomplete request head (its 400, through uvicorn) above HEADER_BYTES,
        # Protocol's 431: a read adds at most 256 KiB to what Protocol has let through
        "h11_max_incomplete_event_size": 2 * HEADER_BYTES,
    }

    def beat_while_loading(self, done: threading.Event) -> None:
        while not done.wait(self.timeout / 4 if self.timeout else 5.0):
            self.notify()

    def load_wsgi(self) -> None:
        # (loading may outlast gunicorn's timeout, the models a multi-model endpoint had loaded
        # loaded again, and uvicorn's loop, which tells gunicorn's master the worker is alive, starts
        # only after: the worker tells it meanwhile)
        loaded = threading.Event()
        alive = threading.Thread(target=self.beat_while_loading, args=(loaded,), name="loading-heartbeat", daemon=True)
        alive.start()
        try:
            super().load_wsgi()
        finally:
            loaded.set()
