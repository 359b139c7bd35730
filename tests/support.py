"""Test helpers: the adapter in a background thread, a stomp.py client wrapper that records
every frame, a raw-socket frame reader, and broker-side checks through aio-pika.

The integration tests speak STOMP through stomp.py and inspect the broker through aio-pika,
never through the adapter's own codec, so a misunderstanding shared by both sides of the
adapter cannot make a test pass.
"""

from __future__ import annotations

import asyncio
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

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
    """The adapter's server on 127.0.0.1:<free port>, run by an event loop in a thread
    (asyncio's own unless ``event_loop`` makes another, e.g. ``uvloop.new_event_loop``, the
    loop the adapter's command runs on)."""

    def __init__(
        self,
        amqp_url: str,
        *,
        event_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
        **settings: Any,
    ) -> None:
        overrides: dict[str, Any] = {"listeners": ["127.0.0.1:0"], "amqp_url": amqp_url}
        overrides.update(settings)
        self.settings = load_settings(None, overrides)
        self.server = build_server(self.settings)
        self.loop = event_loop()
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
            return len(self.server.context.connections)

        return self.run(count())

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self.run(self.server.shutdown(), timeout=30)
            self.run(_transports_ended(self.loop), timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


async def _transports_ended(loop: asyncio.AbstractEventLoop, timeout: float = 2.0) -> None:
    """Let every socket transport of ``loop`` finish closing before the loop is closed: one
    still closing (its last bytes or its connection_lost pending) would be freed with its
    socket open once the loop is gone, and the ResourceWarning would land in whichever test
    runs when the garbage collector finds it.  What has not ended within ``timeout`` is
    aborted.  (asyncio's selector loops keep their transports by file descriptor; other loops
    are left as they are.)"""
    transports = getattr(loop, "_transports", None)
    if transports is None:
        return

    def open_transports() -> list[asyncio.BaseTransport]:
        return [t for t in list(transports.values()) if getattr(t, "_sock", None) is not None]

    deadline = loop.time() + timeout
    while open_transports() and loop.time() < deadline:
        await asyncio.sleep(0.01)
    for transport in open_transports():
        transport.abort()  # type: ignore[attr-defined]
    await asyncio.sleep(0)  # their connection_lost


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

    def next(self, command: str | tuple[str, ...] | None = None, timeout: float = 5.0) -> Recorded:
        """The next received frame (of ``command``, or of one of several, if given; others are
        kept for later)."""
        wanted = (command,) if isinstance(command, str) else command

        def matches(frame: Recorded) -> bool:
            return wanted is None or frame.command in wanted

        for i, frame in enumerate(self._pending):
            if matches(frame):
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
            if matches(frame):
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


Frame = tuple[str, dict[str, str], bytes]  # frame_headers' (command, headers, body)


class RawSession:
    """One STOMP 1.2 session on a raw socket, CONNECTed at once: ``command``, ``headers`` and
    ``body`` are the adapter's answer, ``closed`` whether it closed the socket after it.  Later
    frames are read as they come and handed out in order (the reuse and multiplexing tests).
    Every socket it opens is in ``opened``, and closed after each integration test
    (tests/integration/conftest.py); a test may add its own."""

    opened: ClassVar[list[socket.socket]] = []

    def __init__(self, port: int, login: str = "guest", passcode: str = "guest") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.opened.append(self.sock)
        self.sock.sendall(
            f"CONNECT\naccept-version:1.2\nhost:/\nlogin:{login}\npasscode:{passcode}\n\n\0".encode()
        )
        frames, self.closed = read_frames(self.sock, timeout=5, count=1)
        assert frames, "no answer to CONNECT"
        self.command, self.headers, self.body = frame_headers(frames[0])
        self._data = b""
        self._pending: list[Frame] = []

    @classmethod
    def close_opened(cls) -> None:
        for sock in cls.opened:
            sock.close()
        cls.opened.clear()

    def _more(self, deadline: float) -> bool:
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self._data += chunk
        *whole, self._data = self._data.split(b"\0")
        self._pending += [frame_headers(raw.lstrip(b"\r\n")) for raw in whole if raw.strip(b"\r\n")]
        return True

    def frames_until(self, commands: tuple[str, ...], timeout: float = 5) -> list[Frame]:
        """The frames received up to the first of ``commands`` (included); later ones wait.  If
        the adapter closes the socket first: what came until then."""
        deadline = time.monotonic() + timeout
        while True:
            for index, frame in enumerate(self._pending):
                if frame[0] in commands:
                    got, self._pending = self._pending[: index + 1], self._pending[index + 1 :]
                    return got
            assert time.monotonic() < deadline, f"none of {commands} came: {self._pending}"
            if not self._more(deadline):
                got, self._pending = self._pending, []
                return got

    def send(self, frame: str) -> list[Frame]:
        """Send ``frame`` (it must ask for a receipt) and return what came up to the RECEIPT (or
        an ERROR)."""
        self.sock.sendall(frame.encode() + b"\0")
        return self.frames_until(("RECEIPT", "ERROR"))

    def round_trip(self, queue: str) -> None:
        """This session is served: a message it sends to ``queue`` comes back to it."""
        body = unique("body").encode()
        got = self.send(f"SUBSCRIBE\nid:{unique('rt')}\ndestination:/queue/{queue}\nreceipt:s\n\n")
        assert got[-1][0] == "RECEIPT", got
        got = self.send(f"SEND\ndestination:/queue/{queue}\nreceipt:p\n\n{body.decode()}")
        assert got[-1][0] == "RECEIPT", got
        while not any(frame[0] == "MESSAGE" and frame[2] == body for frame in got):
            got = self.frames_until(("MESSAGE",))
            assert got, "closed before the message came back"

    def disconnect(self) -> None:
        got = self.send("DISCONNECT\nreceipt:bye\n\n")
        assert got[-1][0] == "RECEIPT", got
        self.sock.close()


def peak_allocated(work: Callable[[], object]) -> tuple[int, object]:
    """tracemalloc's peak (bytes) while ``work`` runs, and its result; what existed before does
    not count.  tracemalloc counts every thread's allocations, so the other threads of the test
    process (pytest-xdist's channel to its controller, a background adapter) are kept from
    running meanwhile: ``work`` must not wait on them (pure code, no I/O).  The interpreter
    only hands the GIL to another thread after the switch interval, or at a blocking call."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = work()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        sys.setswitchinterval(interval)
    return peak, result


def wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` every 50 ms until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


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


# --------------------------------------------------------------------------------------------------
# Broker-side probes for the integration tests (aio-pika + management HTTP API), never the adapter.


@dataclass
class Got:
    """One message fetched with basic.get: raw AMQP properties (None = absent on the wire)."""

    body: bytes
    properties: Any  # pamqp Basic.Properties as decoded from the wire
    exchange: str
    routing_key: str
    redelivered: bool

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.properties.headers or {})


class BrokerProbe:
    """Synchronous access to the broker through aio-pika (own event loop, one AMQP connection),
    plus the management HTTP API.  Queues and exchanges registered with ``track_*`` are deleted
    by ``close()``."""

    def __init__(self, amqp_url: str, management_url: str = "http://127.0.0.1:15672") -> None:
        import aio_pika

        self._aio_pika = aio_pika
        self.amqp_url = amqp_url
        self.management_url = management_url
        self._loop = asyncio.new_event_loop()
        self._connection: Any = self._loop.run_until_complete(aio_pika.connect(amqp_url))
        self._queues: list[str] = []
        self._exchanges: list[str] = []
        self._vhosts: list[str] = []
        self._users: list[str] = []

    # -- plumbing
    def run(self, work: Callable[[Any], Any]) -> Any:
        """``await work(channel)`` on a fresh channel of the probe's connection."""

        async def main() -> Any:
            channel = await self._connection.channel()
            try:
                return await work(channel)
            finally:
                if not channel.is_closed:
                    await channel.close()

        return self._loop.run_until_complete(main())

    def close(self) -> None:
        """Delete what was tracked (best effort: an exclusive queue may still be owned by a
        connection that is closing), then close the AMQP connection."""
        import contextlib

        try:
            for name in self._queues:
                with contextlib.suppress(Exception):
                    self.delete_queue(name)
            for name in self._exchanges:
                with contextlib.suppress(Exception):
                    self.delete_exchange(name)
            for name in self._vhosts:
                from urllib.parse import quote

                with contextlib.suppress(Exception):
                    self.management(f"/api/vhosts/{quote(name, safe='')}", "DELETE")
            for name in self._users:
                with contextlib.suppress(Exception):
                    self.delete_user(name)
        finally:
            self._loop.run_until_complete(self._connection.close())
            self._loop.close()

    def track_queue(self, *names: str) -> None:
        self._queues.extend(names)

    def track_exchange(self, *names: str) -> None:
        self._exchanges.extend(names)

    # -- queues
    def declare_queue(self, name: str, *, track: bool = True, **kwargs: Any) -> None:
        async def work(channel: Any) -> None:
            await channel.declare_queue(name, **kwargs)

        self.run(work)
        if track:
            self.track_queue(name)

    def queue_exists(self, name: str) -> bool:
        import aiormq

        async def work(channel: Any) -> bool:
            try:
                await channel.declare_queue(name, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                return False
            except aiormq.exceptions.ChannelLockedResource:
                return True  # exclusive to another connection, but it exists
            return True

        return self.run(work)

    def depth(self, name: str) -> int:
        """Ready messages in queue ``name`` (passive declare; fails if the queue is missing)."""

        async def work(channel: Any) -> int:
            queue = await channel.declare_queue(name, passive=True)
            return queue.declaration_result.message_count

        return self.run(work)

    def wait_depth(self, name: str, expected: int, timeout: float = 5.0) -> int:
        """Poll until ``depth(name) == expected`` (asynchronous broker work such as requeue on
        close or dead-lettering); returns the last depth seen."""
        deadline = time.monotonic() + timeout
        while True:
            current = self.depth(name)
            if current == expected or time.monotonic() > deadline:
                return current
            time.sleep(0.02)

    def idle_depth(self, name: str, timeout: float = 5.0) -> int:
        """Ready messages once queue ``name`` has no consumer left.  The broker requeues a
        closed channel's unacknowledged messages when it removes its consumers, so after a
        client disconnected this is the number of messages it had not acknowledged (plus any
        it never received)."""

        async def work(channel: Any) -> tuple[int, int]:
            queue = await channel.declare_queue(name, passive=True)
            result = queue.declaration_result
            return result.consumer_count, result.message_count

        deadline = time.monotonic() + timeout
        while True:
            consumers, messages = self.run(work)
            if consumers == 0:
                return messages
            if time.monotonic() > deadline:
                raise AssertionError(f"queue {name} still has {consumers} consumer(s)")
            time.sleep(0.02)

    def wait_gone(self, name: str, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while self.queue_exists(name):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def get(self, name: str) -> Got | None:
        """basic.get with auto-ack; the raw properties as they were on the wire."""

        async def work(channel: Any) -> Got | None:
            underlay = await channel.get_underlay_channel()
            message = await underlay.basic_get(name, no_ack=True)
            if message.delivery_tag is None:  # Basic.GetEmpty
                return None
            return Got(
                message.body,
                message.header.properties,
                message.exchange,
                message.routing_key,
                bool(message.redelivered),
            )

        return self.run(work)

    def delete_queue(self, name: str) -> None:
        async def work(channel: Any) -> None:
            await channel.queue_delete(name)

        try:
            self.run(work)
        except ValueError:  # a name pamqp refuses to encode: use the management API
            self.management(f"/api/queues/%2F/{_quote(name)}", method="DELETE")

    # -- exchanges and publishing
    def declare_exchange(self, name: str, type_: str = "fanout", *, track: bool = True) -> None:
        async def work(channel: Any) -> None:
            await channel.declare_exchange(name, type_, auto_delete=False, durable=False)

        self.run(work)
        if track:
            self.track_exchange(name)

    def bind(self, queue: str, exchange: str, routing_key: str = "") -> None:
        async def work(channel: Any) -> None:
            q = await channel.declare_queue(queue, passive=True)
            await q.bind(exchange, routing_key)

        self.run(work)

    def delete_exchange(self, name: str) -> None:
        async def work(channel: Any) -> None:
            await channel.exchange_delete(name)

        self.run(work)

    def publish(self, exchange: str, routing_key: str, body: bytes, **properties: Any) -> None:
        """Publish with publisher confirms (so the message is routed when this returns)."""
        aio_pika = self._aio_pika

        async def work(_channel: Any) -> None:
            channel = await self._connection.channel(publisher_confirms=True)
            try:
                target = (
                    channel.default_exchange
                    if exchange == ""
                    else await channel.get_exchange(exchange, ensure=False)
                )
                await target.publish(aio_pika.Message(body, **properties), routing_key=routing_key)
            finally:
                await channel.close()

        self.run(work)

    # -- management HTTP API (queue flags, arguments, bindings)
    def scratch_vhost(self, prefix: str) -> str:
        """A new virtual host that guest may use, deleted (with everything in it) by close():
        for tests whose clients create queues nobody can predict (fuzzing)."""
        from urllib.parse import quote

        name = unique(prefix)
        self.management(f"/api/vhosts/{quote(name, safe='')}", "PUT")
        self.management(
            f"/api/permissions/{quote(name, safe='')}/guest",
            "PUT",
            {"configure": ".*", "write": ".*", "read": ".*"},
        )
        self._vhosts.append(name)
        return name

    def management(self, path: str, method: str = "GET", body: Any = None) -> Any:
        """One call of RabbitMQ's management HTTP API as guest (``path`` from ``/api/``): the
        decoded JSON answer, None for an empty one or a 404."""
        import base64
        import json
        import urllib.error
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.management_url + path, data=data, method=method)
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                data = response.read()
                return json.loads(data) if data else None
        except urllib.error.HTTPError as error:
            if error.code == 404:
                error.close()
                return None
            raise

    def create_user(
        self, password: str, prefix: str = "user", permissions: dict[str, str] | None = None
    ) -> str:
        """A throwaway user with ``password`` and ``permissions`` on "/" (default: full rights),
        deleted by close() (never guest: tests change and delete these)."""
        from urllib.parse import quote

        name = unique(prefix)
        self.set_password(name, password)
        self._users.append(name)
        self.management(
            f"/api/permissions/%2F/{quote(name, safe='')}",
            "PUT",
            permissions or {"configure": ".*", "write": ".*", "read": ".*"},
        )
        return name

    def set_password(self, user: str, password: str) -> None:
        from urllib.parse import quote

        self.management(f"/api/users/{quote(user, safe='')}", "PUT", {"password": password, "tags": ""})

    def delete_user(self, user: str) -> None:
        from urllib.parse import quote

        self.management(f"/api/users/{quote(user, safe='')}", "DELETE")

    def queue_info(self, name: str, vhost: str = "/") -> dict[str, Any] | None:
        """The management API's view of a queue (durable, auto_delete, exclusive, arguments,
        type ...), or None if there is no such queue."""
        from urllib.parse import quote

        return self.management(f"/api/queues/{quote(vhost, safe='')}/{quote(name, safe='')}")

    def queue_bindings(self, name: str, vhost: str = "/") -> list[dict[str, Any]]:
        from urllib.parse import quote

        result = self.management(f"/api/queues/{quote(vhost, safe='')}/{quote(name, safe='')}/bindings")
        return [b for b in (result or []) if b["source"] != ""]  # drop the default-exchange binding

    def exchange_bindings(self, exchange: str, vhost: str = "/") -> list[dict[str, Any]]:
        from urllib.parse import quote

        path = f"/api/exchanges/{quote(vhost, safe='')}/{quote(exchange, safe='')}/bindings/source"
        return self.management(path) or []


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")


def next_of(client: StompClient, commands: tuple[str, ...], timeout: float = 5.0) -> Recorded:
    """The first received frame whose command is in ``commands``, in arrival order; other frames
    (e.g. MESSAGEs that overtake a SEND's RECEIPT) stay available to ``client.next``."""
    return client.next(commands, timeout)


def amqp_client_ports(broker_port: int = 5672) -> set[int]:
    """Local ports of this process's established TCP connections to ``broker_port`` (Linux
    /proc).  The adapter under test runs in-process, so this shows its AMQP links without the
    management API's statistics delay."""
    import os

    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    ports = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as table:
                lines = table.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == broker_port and inode in inodes:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def expect_receipt(client: StompClient, receipt_id: str, timeout: float = 5.0) -> Recorded:
    """The next RECEIPT-or-ERROR frame must be the RECEIPT ``receipt_id`` (MESSAGEs that
    arrive meanwhile stay available to ``client.next``)."""
    frame = next_of(client, ("RECEIPT", "ERROR"), timeout)
    assert frame.command == "RECEIPT", frame
    assert frame.headers["receipt-id"] == receipt_id, frame
    return frame


class TcpRelay:
    """A TCP relay on 127.0.0.1:<free port> to (host, port), run by its own event loop in a
    thread: it stands for a broker node that a test can take away (``stop`` closes the listener
    and every relayed connection, as a node that goes down does).  ``sip``, ``pause`` and
    ``receive_buffer`` make it a slow reader of what its clients send (reads of ``sip`` bytes
    ``pause`` seconds apart, a small kernel receive buffer), so a client's transport keeps what
    it could not send; the other way goes at full speed."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        sip: int = 65536,
        pause: float = 0.0,
        receive_buffer: int | None = None,
    ) -> None:
        self.target = (host, port)
        self.sip = sip
        self.pause = pause
        self.receive_buffer = receive_buffer
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def start(self) -> None:
        listener = socket.socket()
        if self.receive_buffer is not None:  # inherited by the accepted sockets
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer)
        listener.bind(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._relay, sock=listener, limit=self.sip), self._loop
        ).result(10)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, sip: int, pause: float) -> None:
            try:
                while data := await src.read(sip):
                    dst.write(data)
                    await dst.drain()
                    if pause:
                        await asyncio.sleep(pause)
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(
            pipe(reader, up_writer, self.sip, self.pause), pipe(up_reader, writer, 1 << 20, 0.0)
        )
        self._writers -= {writer, up_writer}

    def stop(self) -> None:
        if self._loop.is_closed():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            await asyncio.sleep(0.05)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def free_port() -> int:
    """A TCP port nothing listens on right now (for a process the test starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_adapter_with_config(
    tmp_path: Path, amqp_url: str, config_text: str, tcp_port: int
) -> tuple[subprocess.Popen[bytes], Path]:
    """A real adapter process: ``--config`` with ``config_text``, ``--listen`` on ``tcp_port``."""
    config = tmp_path / "adapter.ini"
    config.write_text(config_text)
    log_path = tmp_path / "adapter.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "adapter",
                "--config",
                str(config),
                "--listen",
                f"127.0.0.1:{tcp_port}",
                "--amqp-url",
                amqp_url,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return process, log_path


def start_stunnel(
    connect: str, cert_pem: bytes, directory: Path, options: str = "", port: int | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """Debian's stunnel serving TLS on 127.0.0.1:``port`` (a free one by default) with
    ``cert_pem`` (key and chain) and relaying in plain TCP to ``connect`` (host:port): a real TLS
    server in front of the broker's AMQP port or of its STOMP plugin.  ``options`` are extra
    lines of its service section (stunnel.conf syntax).  Its log is ``directory``/stunnel.log."""
    binary = shutil.which("stunnel4") or shutil.which("stunnel")
    assert binary, "stunnel is not installed: .ci/run installs Debian's stunnel4"
    (directory / "server.pem").write_bytes(cert_pem)
    port = port or free_port()
    config = directory / "stunnel.conf"
    config.write_text(
        "foreground = yes\n"
        f"pid = {directory / 'stunnel.pid'}\n"
        "[tls]\n"
        f"accept = 127.0.0.1:{port}\n"
        f"connect = {connect}\n"
        f"cert = {directory / 'server.pem'}\n" + options
    )
    with (directory / "stunnel.log").open("wb") as log:
        process = subprocess.Popen([binary, str(config)], stdout=log, stderr=subprocess.STDOUT)
    wait_for_port(port, process, "stunnel", directory / "stunnel.log")
    return process, port


def wait_for_port(port: int, process: Any, what: str, log_path: Any = None, timeout: float = 20) -> None:
    """Wait until ``process`` (a subprocess.Popen) accepts connections on 127.0.0.1:``port``;
    fail with its log if it exits or does not get there in time."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            log = log_path.read_text(errors="replace") if log_path is not None else ""
            assert process.poll() is None, f"{what} exited: {log}"
            assert time.monotonic() < deadline, f"{what} did not start on port {port}: {log}"
            time.sleep(0.05)


class MemoryTransport:
    """An in-memory socket for the unit tests of the shell and the AMQP connection: records
    writes, half-close, close and pauses."""

    def __init__(self, peer: tuple[str, int] = ("127.0.0.1", 40000)) -> None:
        self.written = bytearray()
        self.eof_written = False
        self.closed = False
        self.aborted = False
        self.reading = True
        self._peer = peer

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, items: list[bytes]) -> None:
        for item in items:
            self.written += item

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._peer if name == "peername" else default

    def frames(self) -> list[bytes]:
        return [f.lstrip(b"\r\n") for f in bytes(self.written).split(b"\0") if f.strip(b"\r\n")]


class FrameCallbacks:
    """A ``FrameHandler`` (adapter/amqp/framing.py) made of three callables: the frame reader's
    unit tests hand each kind of frame to a function of their own."""

    def __init__(
        self,
        on_method: Callable[[int, bytes], None],
        on_content_header: Callable[[bytes], None],
        on_body: Callable[[bytes | memoryview], None],
    ) -> None:
        self.on_method = on_method
        self.on_content_header = on_content_header
        self.on_body = on_body
