"""The worker's connections: gunicorn's own ASGI worker (an asyncio event loop; gunicorn.workers.gasgi),
with what its HTTP/1.1 protocol leaves out or gets wrong, which a server facing any client needs.

Why an event loop at all: a connection then costs a socket and a few objects, not a thread. With
gunicorn's gthread worker, every connection holds a thread of a fixed pool while it is read,
waits or lingers: a crowd of clients, stalled uploads, or clients lingering after Connection:
close take every thread, and /ping waits in gunicorn's queue behind them, past SageMaker's 2 s
(docs/speed.md, Serving the model). Here the loop reads every connection at once, answers /ping
itself, and hands only parsing and the model to threads (keras_pipe_serve.app). Why gunicorn's
worker and not uvicorn's: gunicorn is already the server (master, worker restarts, graceful
SIGTERM, one worker per GPU), this worker ships with it, and uvicorn has the first two gaps (how
each was seen, and in which versions: docs/speed.md, Figures behind the code's choices: The
worker's gaps):

- **Idle connections are never closed.** gunicorn arms its keep-alive timer after a response and
  cancels it as its loop turns to wait for the next request, so the timer never fires. Neither
  closes a connection that never sends a byte, nor one that sends part of its headers and stops. Here
  each waits at most `keepalive` seconds for its next request and HEADERS_S for the rest of the
  headers it started (or `keepalive`, if shorter).
- **A half-closed client gets no answer.** A client may end its side once its request is sent
  (shutdown(SHUT_WR), as `nc -N` does): asyncio then closes the whole connection unless told not
  to, and the answer is lost (both servers lose it). Here the connection stays open for the
  answer, then closes. TCP cannot tell a client that half-closed from one that closed: a
  request whose client sent its end is computed and answered (the answer goes nowhere if it was
  gone; its time is still bounded by the request timeout), and one whose connection is reset is
  given up at once.
- **A request sent right behind a body can be lost.** gunicorn's parser keeps the bytes that
  follow a request in the same read (the next request, pipelined) and drops them when it is reset
  for that next request; the client then waits for an answer that never comes. A client sends its
  next request so whenever it gets its answer before the server has read the body's end: this
  server answers a refusal (a 503 at the door) before reading the body, and `http.client` sent its
  next request on the heels of the body it had finished sending. Here those bytes are fed again
  once the parser is reset (_KeepingParser).
- **Reading without end.** gunicorn's parser buffers a request line or headers until their CRLF
  comes, and the bytes a client sends behind a request being answered, without a limit; and it
  answers pipelined requests into the transport's buffer whether or not the client reads them. A
  client sending without end so fills the worker's memory at the network's speed. Here headers past
  HEADER_BYTES are refused (431), and a connection is read no further while more than
  PIPELINED_BYTES wait behind a request being answered, or while its client leaves answers unread.
- (Bodies: gunicorn gives up on a body that stops arriving only after its worker timeout, and
  uvicorn never does; the app reads bodies with its own timeouts: keras_pipe_serve.app.)
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

from gunicorn.asgi.protocol import ASGIProtocol
from gunicorn.workers import gasgi

# seconds a client has to finish the headers it began (nginx's client_header_timeout is 60; the
# front end of SageMaker sends a request's headers at once)
HEADERS_S = 15.0
# bytes a client may send on behind a request being answered before the connection stops reading
PIPELINED_BYTES = 1 << 20
# bytes of a request line and headers (gunicorn's own limits: a 4,094-byte line, 100 fields of 8,190)
HEADER_BYTES = 1 << 20


class Protocol(ASGIProtocol):
    """gunicorn's HTTP/1.1 connection, with idle and header timeouts and half-closed clients answered."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._idle: asyncio.TimerHandle | None = None
        self._peer_done = False  # the client sent its end (EOF) while a request was under way
        self._headers_begun = False
        self._held: bytearray | None = None  # bytes that followed the last request, not yet given back to the parser
        super().connection_made(transport)
        self.worker.connections.add(self)
        self._wait_idle(self.cfg.keepalive)

    def close_if_idle(self) -> None:
        """Closes the connection unless a request is under way (at shutdown)."""
        if self._current_request is None:
            self._close_transport()

    def _wait_idle(self, seconds: float) -> None:
        """Closes the connection if no request's headers complete within `seconds`."""
        if self._idle:
            self._idle.cancel()
        self._idle = self.worker.loop.call_later(seconds, self._idle_timeout) if seconds > 0 else None

    def _idle_timeout(self) -> None:
        self._idle = None
        if self._current_request is None:  # (no request under way: nothing to answer)
            self._close_transport()

    def data_received(self, data: bytes) -> None:
        if self._held is not None:  # (before anything newer: the bytes that followed the last request come first)
            self._callback_parser.give_back(self._held)
            self._held = None
        if self._current_request is None and not self._headers_begun:
            self._headers_begun = True  # the first bytes of a request: its headers have HEADERS_S to finish
            self._wait_idle(min(HEADERS_S, self.cfg.keepalive))
        super().data_received(data)
        if self._callback_parser is None or self._closed:
            return
        buffered, receiver = len(self._callback_parser._buffer), self._body_receiver
        if self._current_request is None and buffered > HEADER_BYTES:
            # gunicorn's parser buffers a request line or headers without end until their CRLF comes
            # (its size limits are checked after): a client sending bytes without one fills the
            # worker's memory at the network's speed
            self._send_error_response(431, f"the request's line and headers passed {HEADER_BYTES} bytes")
            self._close_transport()
        elif self._current_request is not None and receiver is not None and receiver._complete \
                and buffered > PIPELINED_BYTES:
            # a client sending on behind its request, which is being answered: read no more of it
            # until it is (gunicorn reads on without end, into the worker's memory)
            self._pause_reading()

    def _setup_callback_parser(self) -> None:
        super()._setup_callback_parser()
        self._callback_parser = _KeepingParser(self._callback_parser, self._hold)

    def _hold(self, data: bytearray) -> None:
        """The bytes that followed the last request: given back to the parser first thing once the
        connection waits for the next, before any that arrive later (data_received)."""
        self._held = data
        self.worker.loop.call_soon(self._feed_held)

    def _feed_held(self) -> None:
        if self._held is not None and not self._closed:
            self.data_received(b"")

    def _on_headers_complete(self):
        if self._idle:
            self._idle.cancel()
            self._idle = None
        self._headers_begun = False
        return super()._on_headers_complete()

    def _arm_keepalive_timer(self) -> None:
        """After each response (gunicorn's own timer here never fires: see the module's docstring)."""
        if self._peer_done:  # (the client can send nothing more)
            self._close_transport()
            return
        self._wait_idle(self.cfg.keepalive)

    def pause_writing(self) -> None:
        """The client is not reading its answers as fast as they are written: no more of its
        requests are read until it does (gunicorn went on answering pipelined requests into the
        transport's buffer without end)."""
        super().pause_writing()
        self._pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._resume_reading()  # (data_received pauses it again if a request's pipelined tail is too long)

    def eof_received(self) -> bool | None:
        """The client's end: kept open for the answer to a request whose body is all in, else closed
        (a request whose body cannot come whole is given up at once: Gone)."""
        receiver = self._body_receiver
        if self._current_request is not None and receiver is not None and receiver._complete and not self._closed:
            self._peer_done = True
            return True
        return None

    def _close_transport(self) -> None:
        """gunicorn's, with the transport closed whatever happens: its own skipped close() when
        write_eof() raised (a client that sent its end, then reset the connection as its answer
        came), and the socket stayed open, counted, until the worker ended."""
        if self.transport and not self._closed:
            try:
                if self.transport.can_write_eof():
                    self.transport.write_eof()
            except (OSError, RuntimeError):
                pass
            self.transport.close()
            self._closed = True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._idle:
            self._idle.cancel()
            self._idle = None
        super().connection_lost(exc)


class _KeepingParser:
    """gunicorn's parser, whose reset for the next request keeps the bytes that followed the request
    just parsed and hands them to `hold` (Protocol._hold feeds them once the connection's loop has
    cleared the last request: fed at once, the next request's headers would be cleared with it)."""

    def __init__(self, parser, hold):
        self._parser = parser
        self._hold = hold

    def give_back(self, held: bytearray) -> None:
        """`held` as the parser's buffer again (empty since its reset)."""
        self._parser._buffer = held

    def reset(self) -> None:
        left = None
        if self._parser.is_complete and self._parser._buffer:  # (the buffer itself, not a copy of it)
            left, self._parser._buffer = self._parser._buffer, bytearray()
        self._parser.reset()
        if left:
            self._hold(left)

    def __getattr__(self, name: str):
        return getattr(self._parser, name)


class Worker(gasgi.ASGIWorker):
    """gunicorn's ASGI worker serving each connection with Protocol."""

    def _alive_until(self, done: threading.Event) -> None:
        while not done.wait(self.timeout / 4 if self.timeout else 5.0):
            self.notify()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.connections: weakref.WeakSet[Protocol] = weakref.WeakSet()

    def handle_exit_signal(self) -> None:
        """SIGTERM: the connections waiting for a request are closed at once, those with one close
        after its answer. (gunicorn's own waits for every connection, idle kept-alive ones too,
        until its graceful timeout.)"""
        super().handle_exit_signal()
        for connection in list(self.connections):
            connection.close_if_idle()

    def init_process(self) -> None:
        # gasgi builds each connection with the ASGIProtocol name of its own module, and has no
        # setting for another: that name is pointed at Protocol, in this worker process only
        gasgi.ASGIProtocol = Protocol
        super().init_process()

    def load_wsgi(self) -> None:
        # (loading may outlast gunicorn's timeout, the models a multi-model endpoint had loaded
        # loaded again: the worker tells the master it is alive meanwhile, as its loop will after)
        loaded = threading.Event()
        alive = threading.Thread(target=self._alive_until, args=(loaded,), name="loading-heartbeat", daemon=True)
        alive.start()
        try:
            super().load_wsgi()
        finally:
            loaded.set()
        # the model's millions of Python objects (TensorFlow's, the graph's) out of the collector's
        # reach: a full collection walks them all, a pause of the loop, and of /ping, each time a
        # crowd's garbage sets one off (docs/speed.md, Figures behind the code's choices: gc.freeze())
        gc.collect()
        gc.freeze()
