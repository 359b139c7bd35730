"""The STOMP and AMQP clients of tests/cluster: a producer of receipted messages that reconnects
when its connection ends, a drain of a queue through an independent AMQP client, and an HTTP GET.

The producer speaks raw STOMP over a socket (no client library between the test and the
adapter), so what counts as "receipted" is exactly the RECEIPT frames that arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aio_pika

from adapter.config import DECLARED

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


@dataclass
class Outage:
    """One lost connection of a producer: when it noticed (the ERROR or the close), why, and
    when it was CONNECTED again (time.monotonic() values)."""

    noticed: float
    error: str
    connected: float | None = None


@dataclass
class ReceiptedProducer:
    """Persistent SENDs with a receipt each, ``window`` outstanding, to ``destination`` through
    the STOMP port ``port``; message bodies are ``<name>-<n>``.  When the connection ends (an
    ERROR frame, or the peer closes) the messages in flight are neither counted as receipted nor
    resent; the producer reconnects to the same port and goes on with new ones until stopped."""

    name: str
    port: int
    destination: str
    window: int = 20
    receipted: set[str] = field(default_factory=set)
    receipt_times: list[float] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        sock = self._connect(deadline=time.monotonic() + 15)
        assert sock is not None, f"{self.name}: no CONNECTED from port {self.port}"
        self._thread = threading.Thread(target=self._run, args=(sock,), name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            assert not self._thread.is_alive(), f"{self.name} did not stop"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.receipted)

    def receipts_since(self, moment: float) -> int:
        with self._lock:
            return sum(1 for t in self.receipt_times if t > moment)

    def longest_wait_after(self, moment: float) -> float:
        """The longest stretch without a RECEIPT from ``moment`` on, in seconds (from
        ``moment`` to the first RECEIPT after it, or between two RECEIPTs after it)."""
        with self._lock:
            times = [moment] + [t for t in self.receipt_times if t > moment]
        return max(b - a for a, b in zip(times, times[1:], strict=False))

    def _connect(self, deadline: float) -> socket.socket | None:
        """A new STOMP connection, or None if none could be made before ``deadline`` (or stop)."""
        while not self._stop.is_set() and time.monotonic() < deadline:
            sock = None
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                sock.sendall(CONNECT)
                buffer = b""
                while b"\0" not in buffer:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    buffer += chunk
                if buffer.lstrip(b"\r\n").startswith(b"CONNECTED"):
                    sock.settimeout(0.5)
                    return sock
            except OSError:
                pass
            if sock is not None:
                sock.close()
            time.sleep(0.05)  # e.g. the balancer has no adapter yet, or no node answers yet
        return None

    def _run(self, sock: socket.socket) -> None:
        outstanding: dict[str, str] = {}  # receipt id -> body
        buffer = b""
        while not self._stop.is_set():
            ended = ""
            try:
                while len(outstanding) < self.window:
                    self.sent += 1
                    body = f"{self.name}-{self.sent}"
                    outstanding[f"r{self.sent}"] = body
                    sock.sendall(
                        f"SEND\ndestination:{self.destination}\npersistent:true\n"
                        f"receipt:r{self.sent}\ncontent-type:text/plain\n\n{body}\0".encode()
                    )
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    ended = "closed"
                buffer += chunk
            except OSError as error:
                ended = f"socket error {error}"
            while b"\0" in buffer:
                frame, _, buffer = buffer.partition(b"\0")
                frame = frame.lstrip(b"\r\n")
                if frame.startswith(b"RECEIPT"):
                    receipt = next(
                        line[11:].decode() for line in frame.split(b"\n") if line.startswith(b"receipt-id:")
                    )
                    now = time.monotonic()
                    with self._lock:
                        self.receipted.add(outstanding.pop(receipt))
                        self.receipt_times.append(now)
                elif frame.startswith(b"ERROR"):
                    message = next((line for line in frame.split(b"\n") if line.startswith(b"message:")), b"")
                    ended = message[8:].decode(errors="replace") or "ERROR"
            if ended:
                outage = Outage(time.monotonic(), ended)
                self.outages.append(outage)
                outstanding.clear()  # unknown fate: maybe on the broker, never counted
                buffer = b""
                sock.close()
                new = self._connect(deadline=time.monotonic() + 90)
                if new is None:
                    return
                outage.connected = time.monotonic()
                sock = new
        with contextlib.suppress(OSError):
            sock.sendall(b"DISCONNECT\n\n\0")
        sock.close()


def drain(amqp_url: str, queue: str) -> Counter[str]:
    """Every body in ``queue``, counted (an AMQP consumer on ``amqp_url`` takes and acks them
    all; a message the queue holds twice counts twice)."""

    async def main() -> Counter[str]:
        connection = await aio_pika.connect(amqp_url)
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=1000)
            q = await channel.declare_queue(queue, passive=True)
            total = q.declaration_result.message_count
            bodies: Counter[str] = Counter()
            if total:
                async with q.iterator() as messages:
                    async for message in messages:
                        await message.ack()
                        bodies[message.body.decode()] += 1
                        if sum(bodies.values()) >= total:
                            break
            return bodies
        finally:
            await connection.close()

    return asyncio.run(main())


def declare_quorum_queue(amqp_url: str, queue: str) -> None:
    """A durable quorum queue, declared through the node of ``amqp_url`` (RabbitMQ places its
    leader there)."""
    run_on(
        amqp_url,
        lambda channel: channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"}),
    )


def delete_queue(amqp_url: str, queue: str) -> None:
    run_on(amqp_url, lambda channel: channel.queue_delete(queue))


def publish(amqp_url: str, queue: str, bodies: list[str]) -> None:
    """Persistent messages, confirmed, with ``message_id`` = body."""

    async def work(channel: aio_pika.abc.AbstractChannel) -> None:
        for body in bodies:
            message = aio_pika.Message(
                body.encode(), message_id=body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            )
            await channel.default_exchange.publish(message, routing_key=queue)

    run_on(amqp_url, work, confirms=True)


def run_on(amqp_url: str, work, confirms: bool = False):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        connection = await aio_pika.connect(amqp_url)
        try:
            channel = await connection.channel(publisher_confirms=confirms)
            return await work(channel)
        finally:
            await connection.close()

    return asyncio.run(main())


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


def wait_until(condition, what: str, timeout: float = 60.0) -> float:  # type: ignore[no-untyped-def]
    """Poll ``condition`` until true; the time it took (a generous ``timeout`` is a safety net,
    never the assertion)."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - start


def ini_text(settings: dict[str, Any]) -> str:
    """``settings`` (names as adapter/config/settings.py declares them) as lines of an adapter ini file."""
    lines = []
    for name, value in settings.items():
        key = DECLARED[name].setting.keys[0].name
        text = str(value).lower() if isinstance(value, bool) else str(value)
        lines.append(f"{key} = {text}\n")
    return "".join(lines)
