"""One client process of ``python -m bench.scale``: thousands of subscribed STOMP clients.

``python -m bench.scale_fleet`` reads commands from stdin and answers on stdout, one JSON object
a line (bench/scale_stats.py has the protocol); the bench starts several and drives them.  When
stdin closes (the bench is gone, whatever the reason) it closes every socket and exits.

Built so that the bench measures the servers, not itself:

* one small ``asyncio.Protocol`` per client (``Subscriber``, slotted), no task per client: the
  open is a few worker coroutines (``concurrency``) taking clients one after another;
* CONNECT, then SUBSCRIBE with a receipt once CONNECTED arrives, then nothing is sent (over
  WebSocket a bare EOL every ``keepalive`` seconds, see below);
* frames are cut at NUL bytes with ``bytes.find`` and only the command and, for MESSAGE, the
  body are looked at (the benchmark's bodies hold no NUL: ``<round> <monotonic ns>``);
* the arrival time is read once per ``data_received`` (time.monotonic_ns: CLOCK_MONOTONIC,
  the same clock in every process of the machine, so the sender's stamp is comparable).

Sockets are bound to a source address (127.0.0.x) with IP_BIND_ADDRESS_NO_PORT, so the port is
chosen at connect time and the 28,000 ephemeral ports are per destination, not per source.

WebSocket: the bench's own shim (bench/stomp.py ``WebSocketShim``, masked text messages out,
unmasked frames in).  Both servers close a WebSocket that sends nothing for 60 s
(``web_stomp.ws_opts.idle_timeout``), and opening 10,000 clients takes longer than that, so a
WebSocket client sends an EOL (allowed between STOMP frames, no heart-beat negotiated) every
``keepalive`` seconds, as a browser's heart-beats would keep it open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
import time
from typing import Any

from .scale_stats import event, parse_stamp
from .services import raise_own_nofile
from .stomp import WebSocketShim, frame

IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)
MAX_ERRORS = 5


class Fleet:
    """Every client of this process and what they received, per round."""

    def __init__(self) -> None:
        self.clients: list[Subscriber] = []
        self.subscribed = 0
        self.lost = 0
        self.errors: list[str] = []
        self.latencies: dict[int, list[int]] = {}
        self._round_waiters: dict[int, asyncio.Future[None]] = {}

    def error(self, text: str) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(text)

    def arrived(self, round_no: int, latency_ns: int) -> None:
        got = self.latencies.setdefault(round_no, [])
        got.append(latency_ns // 1000)
        if len(got) >= self.live():
            waiter = self._round_waiters.get(round_no)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def live(self) -> int:
        return self.subscribed - self.lost

    async def collect(self, round_no: int, timeout: float) -> bytes:
        got = self.latencies.setdefault(round_no, [])
        if len(got) < self.live():
            waiter = asyncio.get_running_loop().create_future()
            self._round_waiters[round_no] = waiter
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, timeout)
            self._round_waiters.pop(round_no, None)
        got = self.latencies.pop(round_no, [])
        return event(
            "round", round=round_no, latencies_us=got, missing=max(0, self.live() - len(got)), lost=self.lost
        )


class Subscriber(asyncio.Protocol):
    __slots__ = ("fleet", "transport", "rest", "subscribe", "state", "done", "ws")

    def __init__(self, fleet: Fleet, subscribe: bytes, ws: bool) -> None:
        self.fleet = fleet
        self.transport: Any = None
        self.rest = b""
        self.subscribe = subscribe
        self.state = "connecting"  # -> "subscribing" -> "subscribed" | "failed" | "lost"
        self.done: asyncio.Future[None] | None = None
        self.ws = ws

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        buf = self.rest + data if self.rest else data
        start = 0
        while True:
            nul = buf.find(b"\0", start)
            if nul < 0:
                break
            # EOLs after a NUL (and heart-beats) come before the next command
            while start < nul and buf[start] in (10, 13):
                start += 1
            if buf.startswith(b"MESSAGE", start):
                body_at = buf.find(b"\n\n", start, nul)
                try:
                    round_no, stamp = parse_stamp(buf[body_at + 2 : nul])
                except ValueError:
                    self.fleet.error(f"unexpected MESSAGE body {buf[body_at + 2 : nul][:40]!r}")
                else:
                    self.fleet.arrived(round_no, now - stamp)
            else:
                self._control(buf[start:nul])
            start = nul + 1
        n = len(buf)
        while start < n and buf[start] in (10, 13):  # keep no EOL-only rest
            start += 1
        self.rest = buf[start:] if start < n else b""

    def _control(self, raw: bytes) -> None:
        if raw.startswith(b"CONNECTED") and self.state == "connecting":
            self.state = "subscribing"
            self.transport.write(self.subscribe)
        elif raw.startswith(b"RECEIPT") and self.state == "subscribing":
            self.state = "subscribed"
            self.fleet.subscribed += 1
            self._settle()
        elif raw.startswith(b"ERROR"):
            message = raw.partition(b"\nmessage:")[2].partition(b"\n")[0]
            self.fleet.error(f"ERROR {message.decode(errors='replace')!r} while {self.state}")
            self._end("failed")

    def _settle(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def _end(self, state: str) -> None:
        if self.state == "subscribed":
            self.fleet.lost += 1
            state = "lost"
        if self.state not in ("failed", "lost", "closed"):
            self.state = state
        self._settle()
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state not in ("failed", "lost", "closed"):
            self.fleet.error(f"connection closed while {self.state}" + (f": {exc}" if exc else ""))
            self._end("failed")
        self.transport = None

    def pause_writing(self) -> None:  # nothing is written in bulk
        pass

    def resume_writing(self) -> None:
        pass


class Opener:
    """Opens ``tcp`` + ``ws`` clients, ``concurrency`` at a time."""

    def __init__(self, fleet: Fleet, spec: dict[str, Any]) -> None:
        self.fleet = fleet
        self.spec = spec
        self.host: str = spec["host"]
        self.timeout: float = float(spec.get("timeout", 30))
        destination = spec["destination"]
        self.connect_frame = frame(
            "CONNECT",
            {
                "accept-version": "1.2",
                "host": spec.get("vhost", "/"),
                "login": spec.get("login", "guest"),
                "passcode": spec.get("passcode", "guest"),
                "heart-beat": "0,0",
            },
        )
        self.subscribe_frame = frame(
            "SUBSCRIBE", {"id": "0", "destination": destination, "ack": "auto", "receipt": "s"}
        )

    async def run(self) -> bytes:
        started = time.monotonic()
        # interleaved, so that both kinds open during the whole open, not one after the other
        kinds = _interleave(int(self.spec["tcp"]), int(self.spec["ws"]))
        order = iter(kinds)
        failed = 0

        async def worker() -> None:
            nonlocal failed
            for kind in order:
                if not await self.open_one(kind == "ws"):
                    failed += 1

        concurrency = max(1, int(self.spec.get("concurrency", 16)))
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(kinds)) or 1)))
        return event(
            "opened",
            subscribed=self.fleet.subscribed,
            failed=failed,
            seconds=round(time.monotonic() - started, 3),
            errors=self.fleet.errors,
        )

    async def open_one(self, ws: bool) -> bool:
        loop = asyncio.get_running_loop()
        client = Subscriber(self.fleet, self.subscribe_frame, ws)
        client.done = loop.create_future()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((self.spec["source"], 0))
            async with asyncio.timeout(self.timeout):
                port = int(self.spec["ws_port"] if ws else self.spec["port"])
                await loop.sock_connect(sock, (self.host, port))
                if ws:
                    _, shim = await loop.create_connection(
                        lambda: WebSocketShim(client, self.host, port, self.spec.get("ws_path", "/ws")),  # type: ignore[arg-type]
                        sock=sock,
                    )
                    await shim.opened
                else:
                    await loop.create_connection(lambda: client, sock=sock)
                client.transport.write(self.connect_frame)
                await client.done
        except (OSError, TimeoutError, Exception) as error:  # noqa: BLE001 - counted and reported
            if client.state != "failed":
                self.fleet.error(f"{'ws' if ws else 'tcp'} open: {error!r}"[:300])
            client.state = "failed"
            if client.transport is not None:
                client.transport.close()
            else:
                sock.close()
            return False
        if client.state != "subscribed":
            return False
        client.done = None
        self.fleet.clients.append(client)
        return True


def _interleave(tcp: int, ws: int) -> list[str]:
    """``tcp`` "tcp" and ``ws`` "ws" spread evenly through one list."""
    total = tcp + ws
    out = []
    placed_ws = 0
    for i in range(total):
        if placed_ws < (i + 1) * ws // total:
            out.append("ws")
            placed_ws += 1
        else:
            out.append("tcp")
    return out


async def keepalive(fleet: Fleet, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        for client in fleet.clients:
            if client.ws and client.transport is not None and client.state == "subscribed":
                client.transport.write(b"\n")


async def serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    fleet = Fleet()
    background: set[asyncio.Task[Any]] = set()

    def reply(line: bytes) -> None:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()

    try:
        while True:
            line = await reader.readline()
            if not line:
                break  # the bench is gone
            spec = json.loads(line)
            cmd = spec.get("cmd")
            if cmd == "open":
                if spec.get("keepalive"):
                    background.add(asyncio.create_task(keepalive(fleet, float(spec["keepalive"]))))
                reply(await Opener(fleet, spec).run())
            elif cmd == "collect":
                reply(await fleet.collect(int(spec["round"]), float(spec.get("timeout", 30))))
            elif cmd == "close":
                break
            else:
                reply(event("failed", error=f"unknown command {cmd!r}"))
    finally:
        for task in background:
            task.cancel()
        for client in fleet.clients:
            client.state = "closed"
            if client.transport is not None:
                client.transport.close()
        with contextlib.suppress(Exception):
            reply(event("closed"))


def main() -> int:
    # the bench starts this process in its own session: a Ctrl-C reaches the bench, which closes
    # stdin; SIGINT is ignored all the same in case one arrives
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise_own_nofile()
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
