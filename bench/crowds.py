"""The clients of bench.serve's crowds: kept-alive single-image clients by the hundred, stalled
uploads and lingering closes, all on one asyncio event loop of a process of their own (raw
streams, HTTP/1.1 written by hand), so that 300 of them cost the client side a fraction of a core,
not 300 threads fighting over one GIL, and /ping's own process is left alone.

    python -m bench.crowds SETTINGS_JSON    # what bench.serve runs: prints the tally as JSON

The clients (the photo as application/x-image, each request's clock started as its client begins
to send it, its connection's opening included where it opens one):
  kept-alive   one connection each, sending the next request as soon as it has its answer. After
               a 503 too: its Retry-After is not waited out, as SageMaker's front end does not
               retry by itself and a caller that does not back off is the harsher load. A
               connection the server closes (Connection: close) or breaks is opened again (after
               RECONNECT_S where it broke, so that a dead server is not spun on).
  stalled      a new connection; the headers and half the body, then silence until the server
               answers (408, after its BODY_IDLE_S) or closes; then again on a new connection.
  lingering    a new connection, one request with Connection: close (a /ping or an image, in
               turn), its answer read, and the connection never closed from this end (held until
               the process ends): whether the server closed its end is counted.
A client sends nothing new after `seconds`; answers to requests in flight then are still awaited
(and counted), each for at most `patience` seconds from its sending (past it: unanswered).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

HOST = "127.0.0.1"
RECONNECT_S = 0.1
# an exchange ends in one of these instead of an answer (TimeoutError: no answer within `patience`)
FAILURES = (OSError, EOFError, asyncio.LimitOverrunError, ValueError, IndexError)


@dataclass(frozen=True)
class Scenario:
    name: str
    clients: int  # kept-alive single-image clients
    stalled: int = 0  # stalled uploads, this many at any time
    lingering: int = 0  # lingering closes, started evenly over the scenario


SCENARIOS = (Scenario("100 clients", 100), Scenario("300 clients", 300),
             Scenario("80 stalled uploads + 8 clients", 8, stalled=80),
             Scenario("300 lingering closes + 8 clients", 8, lingering=300))
# (--quick: one crowd of kept-alive clients, and both kinds of bad client in one scenario, which its
# stalled uploads hold open for the server's BODY_IDLE_S, 10 s, whatever its seconds: every kind of
# client still, in two scenarios instead of four)
QUICK_SCENARIOS = (Scenario("80 clients", 80),
                   Scenario("8 stalled, 30 lingering, 2 clients", 2, stalled=8, lingering=30))


def settings(scenario: Scenario, port: int, photo: Path, seconds: float, patience: float) -> str:
    """The argument of `python -m bench.crowds`."""
    return json.dumps({**asdict(scenario), "port": port, "photo": str(photo), "seconds": seconds,
                       "patience": patience})


def request(method: str, path: str, body: bytes = b"", kind: str | None = None, close: bool = False) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\n"
    if kind:
        head += f"Content-Type: {kind}\r\n"
    if method == "POST":
        head += f"Content-Length: {len(body)}\r\n"
    if close:
        head += "Connection: close\r\n"
    return (head + "\r\n").encode("latin-1") + body


async def answer(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """The answer's status, its body read and dropped; and whether the server closes the connection."""
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    fields = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    if "content-length" not in fields:
        await reader.read()  # (the body runs to the server's close)
        return status, True
    await reader.readexactly(int(fields["content-length"]))
    return status, fields.get("connection", "").lower() == "close"


class Tally:
    """The answers of one scenario: by status, the slowest of the kept-alive clients' and of the
    bad ones', and the image 200s answered within the scenario's seconds."""

    def __init__(self, seconds: float, patience: float):
        self.started = time.monotonic()
        self.until = self.started + seconds
        self.patience = patience
        self.statuses: Counter[str] = Counter()
        self.slowest = {"clients": 0.0, "bad": 0.0}
        self.images = 0
        self.stalls: list[float] = []  # seconds from each stalled upload's sending to its answer
        self.took: dict[str, list[float]] = {}  # the kept-alive clients' seconds to each answer, by status

    def sending(self) -> bool:
        return time.monotonic() < self.until

    def answered(self, status: int, sent: float, bad: bool = False, image: bool = True) -> float:
        now = time.monotonic()
        kind = "bad" if bad else "clients"
        self.slowest[kind] = max(self.slowest[kind], now - sent)
        self.statuses[str(status)] += 1
        if not bad:
            self.took.setdefault(str(status), []).append(now - sent)
        if status == 200 and image and now < self.until:
            self.images += 1
        return now - sent

    def failed(self, failure: Exception, sent: float, bad: bool = False) -> None:
        unanswered = isinstance(failure, TimeoutError)
        self.statuses["unanswered" if unanswered else "error"] += 1
        if unanswered:
            kind = "bad" if bad else "clients"
            self.slowest[kind] = max(self.slowest[kind], time.monotonic() - sent)


async def kept_alive(tally: Tally, port: int, sent_as: bytes) -> None:
    connection = None
    while tally.sending():
        sent = time.monotonic()
        try:
            async with asyncio.timeout(tally.patience):
                if connection is None:
                    connection = await asyncio.open_connection(HOST, port)
                reader, writer = connection
                writer.write(sent_as)
                await writer.drain()
                status, closes = await answer(reader)
        except FAILURES as failure:
            tally.failed(failure, sent)
            status, closes = None, True
        else:
            tally.answered(status, sent)
        if closes and connection is not None:
            connection[1].close()
            connection = None
        if status is None:
            await asyncio.sleep(RECONNECT_S)
    if connection is not None:
        connection[1].close()


async def stalled(tally: Tally, port: int, half: bytes) -> None:
    while tally.sending():
        sent, writer = time.monotonic(), None
        try:
            async with asyncio.timeout(tally.patience):
                reader, writer = await asyncio.open_connection(HOST, port)
                writer.write(half)
                await writer.drain()
                status, _ = await answer(reader)
        except FAILURES as failure:
            tally.failed(failure, sent, bad=True)
            await asyncio.sleep(RECONNECT_S)
        else:
            tally.stalls.append(tally.answered(status, sent, bad=True, image=False))
        finally:
            if writer is not None:
                writer.close()


async def lingering(tally: Tally, port: int, sent_as: bytes, image: bool, held: list) -> None:
    sent = time.monotonic()
    try:
        async with asyncio.timeout(tally.patience):
            reader, writer = await asyncio.open_connection(HOST, port)
            held.append((reader, writer))  # (never closed here: the process's end closes it)
            writer.write(sent_as)
            await writer.drain()
            status, _ = await answer(reader)
    except FAILURES as failure:
        tally.failed(failure, sent, bad=True)
    else:
        tally.answered(status, sent, bad=True, image=image)


async def cpu_share(seconds: float) -> float:
    """This process's CPU over the next `seconds`, a share of a core (the drain after them left out)."""
    cpu = time.process_time()
    await asyncio.sleep(seconds)
    return (time.process_time() - cpu) / seconds


async def crowd(scenario: Scenario, port: int, jpeg: bytes, seconds: float, patience: float) -> dict:
    tally = Tally(seconds, patience)
    used = asyncio.create_task(cpu_share(seconds))
    one = request("POST", "/invocations", jpeg, "application/x-image")
    tasks = [asyncio.create_task(kept_alive(tally, port, one)) for _ in range(scenario.clients)]
    tasks += [asyncio.create_task(stalled(tally, port, one[:len(one) - len(jpeg) // 2]))
              for _ in range(scenario.stalled)]
    held: list = []
    closing = (request("GET", "/ping", close=True),
               request("POST", "/invocations", jpeg, "application/x-image", close=True))
    for i in range(scenario.lingering):
        await asyncio.sleep(max(0.0, tally.started + i * seconds / scenario.lingering - time.monotonic()))
        tasks.append(asyncio.create_task(lingering(tally, port, closing[i % 2], i % 2 == 1, held)))
    await asyncio.gather(used, *tasks)
    await asyncio.sleep(0.5)  # (the server's close of the last lingering connections arrives)
    return {"statuses": dict(tally.statuses), "images_per_s": tally.images / seconds, "slowest": tally.slowest,
            "stalls": sorted(tally.stalls), "lingered": len(held),
            "closed_by_server": sum(reader.at_eof() for reader, _ in held),
            "cpu": used.result(), "took": tally.took}


def main() -> None:
    given = json.loads(sys.argv[1])
    scenario = Scenario(**{name: given[name] for name in ("name", "clients", "stalled", "lingering")})
    result = asyncio.run(crowd(scenario, given["port"], Path(given["photo"]).read_bytes(), given["seconds"],
                               given["patience"]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
