"""Test helpers: the adapter in a background thread, a stomp.py client wrapper that records
every frame, a raw-socket frame reader, and broker-side checks through aio-pika.

The integration tests speak STOMP through stomp.py and inspect the broker through aio-pika,
never through the adapter's own codec, so a misunderstanding shared by both sides of the
adapter cannot make a test pass.
"""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import stomp

from adapter.cli import build_server
from adapter.config import load_settings


def broker_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class AdapterProcess:
    """The adapter's server on 127.0.0.1:<free port>, run by an event loop in a thread."""

    def __init__(self, amqp_url: str, **settings: Any) -> None:
        overrides: dict[str, Any] = {"listeners": ["127.0.0.1:0"], "amqp_url": amqp_url}
        overrides.update(settings)
        self.settings = load_settings(None, overrides)
        self.server = build_server(self.settings)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="adapter", daemon=True)
        self.port = 0

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        self.port = self.server.addresses[0][1]

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def connection_count(self) -> int:
        async def count() -> int:
            return len(self.server.connections)

        return self.run(count())

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.run(self.server.shutdown(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@dataclass
class Recorded:
    command: str
    headers: dict[str, str]
    body: str | bytes


class _Recorder(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.frames: queue.Queue[Recorded] = queue.Queue()
        self.disconnected = threading.Event()

    def _put(self, command: str, frame: Any) -> None:
        self.frames.put(Recorded(command, dict(frame.headers), frame.body))

    def on_connected(self, frame: Any) -> None:
        self._put("CONNECTED", frame)

    def on_message(self, frame: Any) -> None:
        self._put("MESSAGE", frame)

    def on_receipt(self, frame: Any) -> None:
        self._put("RECEIPT", frame)

    def on_error(self, frame: Any) -> None:
        self._put("ERROR", frame)

    def on_disconnected(self) -> None:
        self.disconnected.set()


@dataclass
class StompClient:
    """A stomp.py connection plus a queue of every frame it received."""

    port: int
    version: str = "1.2"
    login: str | None = "guest"
    passcode: str | None = "guest"
    vhost: str = "/"
    heartbeats: tuple[int, int] = (0, 0)
    connect: bool = True
    headers: dict[str, str] = field(default_factory=dict)
    auto_decode: bool = True
    conn: Any = None
    recorder: _Recorder = field(default_factory=_Recorder)
    _pending: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        cls = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}[self.version]
        kwargs: dict[str, Any] = {"auto_decode": self.auto_decode}
        if self.version != "1.0":
            kwargs.update(vhost=self.vhost, heartbeats=self.heartbeats)
        self.conn = cls([("127.0.0.1", self.port)], **kwargs)
        self.conn.set_listener("recorder", self.recorder)
        if self.connect:
            self.conn.connect(self.login, self.passcode, wait=True, headers=dict(self.headers))

    def next(self, command: str | None = None, timeout: float = 5.0) -> Recorded:
        """The next received frame (of ``command``, if given; others are kept for later)."""
        for i, frame in enumerate(self._pending):
            if command is None or frame.command == command:
                return self._pending.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {command or 'frame'} within {timeout} s; pending {self._pending}")
            try:
                frame = self.recorder.frames.get(timeout=remaining)
            except queue.Empty:
                continue
            if command is None or frame.command == command:
                return frame
            self._pending.append(frame)

    def messages(self, count: int, timeout: float = 5.0) -> list[Recorded]:
        return [self.next("MESSAGE", timeout) for _ in range(count)]

    def nothing_more(self, command: str = "MESSAGE", wait: float = 0.3) -> bool:
        try:
            self.next(command, timeout=wait)
        except AssertionError:
            return True
        return False

    def wait_disconnected(self, timeout: float = 5.0) -> bool:
        return self.recorder.disconnected.wait(timeout)

    def close(self) -> None:
        try:
            if self.conn.is_connected():
                self.conn.disconnect()
        except Exception:
            pass


def read_frames(
    sock: socket.socket, timeout: float = 5.0, count: int | None = None
) -> tuple[list[bytes], bool]:
    """Read raw frames until the peer closes, ``count`` frames arrived, or ``timeout``.

    Returns (frames, closed).  With ``count``, a close that follows the frames at once (as
    after an ERROR) is still noticed: the socket is read for a short moment more.
    """
    data = b""
    closed = False
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if count is not None and data.count(b"\0") >= count:
            remaining = min(remaining, 0.2)
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if count is not None and data.count(b"\0") >= count:
                break
            continue
        except OSError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        data += chunk
    frames = [f.lstrip(b"\r\n") for f in data.split(b"\0") if f.strip(b"\r\n")]
    return frames, closed


def frame_headers(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    """Minimal independent parse of a server frame (for raw-socket tests)."""
    head, _, body = raw.partition(b"\n\n")
    lines = head.decode().split("\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name, value)
    return lines[0], headers, body


def run_amqp(amqp_url: str, work: Callable[[Any], Any]) -> Any:
    """Run ``await work(channel)`` with a fresh aio-pika connection (the independent client)."""
    import aio_pika

    async def main() -> Any:
        connection = await aio_pika.connect(amqp_url)
        try:
            channel = await connection.channel()
            return await work(channel)
        finally:
            await connection.close()

    return asyncio.run(main())
