"""A small conversation runner for the compatibility suite.

A *conversation* is a scripted list of raw STOMP byte strings sent over plain TCP sockets, so
that RabbitMQ's STOMP plugin and the adapter receive exactly the same bytes.  After every step the
runner reads what came back on every socket of the conversation, until the expected number of
frames arrived (or the socket closed, or a timeout), then a short settle period to catch extra
frames or a close.  The result is a :class:`Transcript`: per step and per connection the frames
received (command, ordered header list as on the wire, body) and whether the server closed the
socket, plus a snapshot of the broker state (queues the conversation created, their flags,
arguments, message and consumer counts, bindings) taken from the management API and AMQP.

The two transcripts are then normalised (the run's unique names, session ids, ``amq.gen-…`` and
random ``stomp-subscription-…`` names, content-length of bodies that contained them) and
compared.  Intended differences are declared per conversation as :class:`Difference` objects: each
one asserts that the plugin did X and the adapter did Y and then rewrites the adapter's
transcript into the plugin's form, so that anything else still has to match exactly.

Independent of the adapter's code on purpose: it has its own frame reader and writer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import dataclasses
import difflib
import json
import os
import re
import selectors
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.support import run_amqp

# ------------------------------------------------------------------------------ building frames

Header = tuple[str, str]


def frame(command: str, *headers: Header | str, body: str | bytes = "") -> str | bytes:
    """Raw bytes of one client frame: ``COMMAND\\nname:value\\n…\\n\\nbody\\0``.

    Headers are ``(name, value)`` pairs or literal ``"name:value"`` lines (written as given, which
    allows malformed lines).  Values are not escaped: write them as they must appear on the wire.
    ``str`` results are templates: ``{name}`` placeholders are filled per run (see ``Step``).
    """
    lines = [command]
    for header in headers:
        lines.append(header if isinstance(header, str) else f"{header[0]}:{header[1]}")
    head = "\n".join(lines) + "\n\n"
    if isinstance(body, bytes):
        return head.encode() + body + b"\0"
    return head + body + "\0"


def send(destination: str, *headers: Header | str, body: str | bytes = "") -> str | bytes:
    return frame("SEND", ("destination", destination), *headers, body=body)


def subscribe(destination: str, *headers: Header | str) -> str | bytes:
    return frame("SUBSCRIBE", ("destination", destination), *headers)


def disconnect(receipt: str | None = "bye") -> str | bytes:
    return frame("DISCONNECT", *([("receipt", receipt)] if receipt else []))


def connect(
    version: str | None = "1.2",
    *extra: Header | str,
    login: str = "guest",
    passcode: str = "guest",
    host: str | None = "/",
    command: str = "CONNECT",
) -> str | bytes:
    """A CONNECT frame: ``accept-version`` (omitted if ``version`` is None), ``host``, credentials."""
    headers: list[Header | str] = []
    if version is not None:
        headers.append(("accept-version", version))
    if host is not None:
        headers.append(("host", host))
    headers += [("login", login), ("passcode", passcode), *extra]
    return frame(command, *headers)


# ------------------------------------------------------------------------------ the script


AMQP_VIEW = -1  # pseudo connection holding what an AMQP 0-9-1 client observed in a Step.amqp


@dataclass(frozen=True)
class WsMessages:
    """``Step.data`` sent as these WebSocket messages, one per part (each part a template as
    ``Step.data`` is): several frames in one message, one frame over several.  ``opcode``: "auto"
    (text, binary if the part is not UTF-8), "text" (even when it is not UTF-8) or "binary".
    Over plain TCP the parts are simply sent one after the other."""

    parts: tuple[bytes | str, ...]
    opcode: Literal["auto", "text", "binary"] = "auto"


@dataclass
class Step:
    """Send ``data`` on connection ``conn`` (opened on first use), then read.

    ``expect``: how many frames to wait for — an int for ``conn``, or ``{conn: n}`` for several
    connections.  Reading stops early when every awaited connection has closed.  Then the runner
    keeps reading for ``settle`` seconds to catch extra frames or a close.

    ``data`` may be ``bytes`` (sent verbatim), a ``str`` template (``{q}`` etc. filled from the
    run's names and values captured by earlier steps, then UTF-8 encoded), or a callable
    ``ctx -> bytes|str``.  ``capture`` may extract values from the frames received in this step
    into the context for later steps.  ``amqp`` runs ``await amqp(channel, ctx)`` with an AMQP
    0-9-1 client (aio-pika) before ``data`` is sent, e.g. to publish a message as a non-STOMP peer
    would; if it returns a list of :class:`Frame` (e.g. :func:`amqp_message_frame`) they are
    recorded as received on the pseudo connection ``AMQP_VIEW`` and compared like STOMP frames.
    """

    data: bytes | str | Callable[[dict[str, str]], bytes | str] | WsMessages | None = None
    expect: int | Mapping[int, int] = 0
    conn: int = 0
    settle: float = 0.05
    timeout: float = 3.0
    capture: Callable[[list[Frame], dict[str, str]], None] | None = None
    amqp: Callable[[Any, dict[str, str]], Any] | None = None
    pause: float = 0.0  # sleep before sending (e.g. to let a broker-side effect happen)
    # the order of the frames received in this step is not meaningful (e.g. a SEND's RECEIPT,
    # released by a publisher confirm, and the MESSAGE delivering it race inside the broker):
    # compare them sorted
    unordered: bool = False


def capture(
    command: str, header: str, key: str, index: int = 0
) -> Callable[[list[Frame], dict[str, str]], None]:
    """A ``Step.capture`` storing header ``header`` of the ``index``-th ``command`` frame as ``{key}``."""

    def store(frames: list[Frame], ctx: dict[str, str]) -> None:
        matching = [f for f in frames if f.command == command]
        if len(matching) > index:
            value = matching[index].header(header)
            if value is not None:
                ctx[key] = value

    return store


@dataclass
class Conversation:
    """``names``: placeholders filled with a unique value per run (both runs get parallel values
    of equal length).  ``shared_names``: both runs use the *same* values (runs are sequential and
    the broker is cleaned in between) — for things that must be bit-identical, like durable
    subscription queue names.  ``keep_random_names``: do not mask ``stomp-subscription-…`` names."""

    steps: list[Step]
    names: tuple[str, ...] = ("q",)
    shared_names: bool = False
    keep_random_names: bool = False
    final_settle: float = 0.25
    state_after_close: bool = False
    # over WebSocket: the sub-protocols every connection offers (empty: no
    # Sec-WebSocket-Protocol header at all)
    subprotocols: tuple[str, ...] = ("v12.stomp",)
    # also count as this run's: new stomp-subscription-… queues without any binding (a
    # subscription queue declared but never bound cannot be attributed otherwise; on a broker
    # shared with other test runs this is a heuristic, so it is opt-in)
    claim_unbound_subscription_queues: bool = False


# ------------------------------------------------------------------------------ results


@dataclass
class Frame:
    command: str
    headers: list[Header]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def render(self) -> str:
        lines = [self.command] + [f"  {k}:{v}" for k, v in self.headers]
        if self.body:
            lines.append(f"  body={self.body!r}")
        return "\n".join(lines)


@dataclass
class ConnResult:
    frames: list[Frame] = field(default_factory=list)
    closed: bool = False  # the server closed the socket during this step
    send_failed: bool = False
    close_frame: str | None = None  # over WebSocket: the server's Close, "1000 STOMP died"


@dataclass
class StepResult:
    sent: dict[int, bytes]
    received: dict[int, ConnResult]
    unordered: bool = False


@dataclass
class Transcript:
    server: str
    steps: list[StepResult] = field(default_factory=list)
    state: list[dict[str, Any]] = field(default_factory=list)
    state_after_close: list[dict[str, Any]] | None = None
    names: dict[str, str] = field(default_factory=dict)
    # over WebSocket, per connection: the sub-protocol the server chose and the message types
    # (text, binary) it sent, e.g. "v12.stomp; server messages: text"
    websocket: dict[int, str] = field(default_factory=dict)

    # helpers for Difference implementations
    def frames(self, conn: int = 0, command: str | None = None) -> list[Frame]:
        return [
            f
            for step in self.steps
            for c, result in step.received.items()
            if c == conn
            for f in result.frames
            if command is None or f.command == command
        ]

    def closed_at(self, conn: int = 0) -> int | None:
        for i, step in enumerate(self.steps):
            result = step.received.get(conn)
            if result is not None and result.closed:
                return i
        return None

    def render(self, with_sent: bool = True) -> str:
        out = [f"=== {self.server}"]
        for i, step in enumerate(self.steps):
            for conn, data in step.sent.items():
                if with_sent:
                    out.append(f"--- step {i} conn {conn} sent {data!r}")
            for conn, result in sorted(step.received.items()):
                if not result.frames and not result.closed and not result.send_failed:
                    continue
                out.append(f"--- step {i} conn {conn} received:")
                out += [f.render() for f in result.frames]
                if result.send_failed:
                    out.append("(send failed: socket already closed)")
                if result.closed:
                    close = f": {result.close_frame}" if result.close_frame is not None else ""
                    out.append(f"(connection closed by server{close})")
        for conn, summary in sorted(self.websocket.items()):
            out.append(f"--- conn {conn} WebSocket sub-protocol: {summary}")
        out.append("--- broker state:")
        out += [json.dumps(q, sort_keys=True) for q in self.state]
        if self.state_after_close is not None:
            out.append("--- broker state after the client sockets closed:")
            out += [json.dumps(q, sort_keys=True) for q in self.state_after_close]
        return "\n".join(out)


def amqp_message_frame(message: Any) -> Frame:
    """An aio-pika message as a pseudo frame ``AMQP``: exchange, routing key, the properties that
    are set, then the headers table entries as ``table:<name>`` **sorted by name** (the table's
    order is compared on STOMP MESSAGE frames instead, see test_custom_header_order)."""
    headers: list[Header] = [("exchange", message.exchange or ""), ("routing-key", message.routing_key or "")]
    for name in (
        "content_type",
        "content_encoding",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
    ):
        value = getattr(message, name, None)
        if value is not None:
            headers.append((name, str(value)))
    for key, value in sorted((message.headers or {}).items()):
        if isinstance(value, bytes):
            value = value.decode("utf-8", "surrogateescape")
        headers.append((f"table:{key}", f"{type(value).__name__}:{value}"))
    return Frame("AMQP", headers, message.body)


# ------------------------------------------------------------------------------ reading frames


class FrameReader:
    """Incremental reader for server frames: skips heart-beat EOLs, honours content-length."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, data: bytes) -> list[Frame]:
        self.buffer += data
        frames = []
        while True:
            buf = self.buffer.lstrip(b"\r\n")
            self.buffer = buf
            end = buf.find(b"\n\n")
            if end < 0:
                return frames
            lines = buf[:end].decode("utf-8", "surrogateescape").split("\n")
            headers = []
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers.append((name, value))
            start = end + 2
            length = next((v for k, v in headers if k == "content-length"), None)
            if length is not None and length.strip().isdigit():
                stop = start + int(length)
                if len(buf) < stop + 1:
                    return frames
                assert buf[stop : stop + 1] == b"\0", f"no NUL after content-length body: {buf!r}"
            else:
                stop = buf.find(b"\0", start)
                if stop < 0:
                    return frames
            frames.append(Frame(lines[0], headers, buf[start:stop]))
            self.buffer = buf[stop + 1 :]


# ------------------------------------------------------------------------------ broker state


class Broker:
    """Management API (queue flags, arguments, bindings) + AMQP (exact message/consumer counts)."""

    def __init__(self, api: str, amqp_url: str, vhost: str = "/") -> None:
        self.api = api.rstrip("/")
        self.amqp_url = amqp_url
        self.vhost = vhost
        self._auth = "Basic " + __import__("base64").b64encode(b"guest:guest").decode()

    def _request(self, method: str, path: str) -> Any:
        request = urllib.request.Request(
            self.api + path, method=method, headers={"Authorization": self._auth}
        )
        for attempt in range(3):
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    data = response.read()
                break
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return None
                # the management API answers 500 now and then for a queue that another test
                # (or this conversation's cleanup) is deleting at that moment: ask again
                if error.code < 500 or attempt == 2:
                    raise
                error.close()
                time.sleep(0.2)
        return json.loads(data) if data else None

    def _vq(self, name: str) -> str:
        return urllib.parse.quote(self.vhost, safe="") + "/" + urllib.parse.quote(name, safe="")

    def queue_names(self) -> set[str]:
        vhost = urllib.parse.quote(self.vhost, safe="")
        return {q["name"] for q in self._request("GET", f"/api/queues/{vhost}?columns=name")}

    def queue(self, name: str) -> dict[str, Any] | None:
        info = self._request("GET", f"/api/queues/{self._vq(name)}")
        if info is None:
            return None
        bindings = self._request("GET", f"/api/queues/{self._vq(name)}/bindings") or []
        return {
            "name": name,
            "durable": info.get("durable"),
            "auto_delete": info.get("auto_delete"),
            "exclusive": info.get("exclusive"),
            "arguments": info.get("arguments"),
            "type": info.get("type"),
            "bindings": sorted([b["source"], b["routing_key"], b.get("arguments") or {}] for b in bindings),
        }

    def counts(self, names: Iterable[str]) -> dict[str, tuple[Any, Any]]:
        """(ready messages, consumers) per queue via passive declare; 'locked' for another
        connection's exclusive queue, 'missing' if gone."""
        import aio_pika
        from aiormq.exceptions import ChannelLockedResource, ChannelNotFoundEntity

        async def main() -> dict[str, tuple[Any, Any]]:
            result: dict[str, tuple[Any, Any]] = {}
            connection = await aio_pika.connect(self.amqp_url)
            try:
                for name in names:
                    channel = await connection.channel()
                    try:
                        declared = await channel.declare_queue(name, passive=True)
                        ok = declared.declaration_result
                        result[name] = (ok.message_count, ok.consumer_count)
                    except ChannelLockedResource:
                        result[name] = ("locked", "locked")
                    except ChannelNotFoundEntity:
                        result[name] = ("missing", "missing")
                    finally:
                        if not channel.is_closed:
                            await channel.close()
            finally:
                await connection.close()
            return result

        return asyncio.run(main())

    def snapshot(self, names: Iterable[str]) -> list[dict[str, Any]]:
        names = sorted(names)
        queues = [q for q in (self.queue(n) for n in names) if q is not None]
        counts = self.counts([q["name"] for q in queues]) if queues else {}
        for q in queues:
            q["messages"], q["consumers"] = counts[q["name"]]
        return [q for q in queues if q["messages"] != "missing"]

    def delete_queue(self, name: str) -> None:
        for _ in range(20):
            try:
                self._request("DELETE", f"/api/queues/{self._vq(name)}")
                return
            except urllib.error.HTTPError:  # e.g. still exclusive to a closing connection
                time.sleep(0.1)
        raise AssertionError(f"could not delete queue {name!r}")

    def run_amqp(self, work: Callable[[Any], Any]) -> Any:
        return run_amqp(self.amqp_url, work)


# ------------------------------------------------------------------------------ running


def amqp_sockets_of_this_process(port: int) -> set[str] | None:
    """Inodes of the established TCP connections of this process (hence of in-process adapters)
    to the AMQP port; None where /proc is not available."""
    try:
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                link = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        found = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as lines:
                for line in list(lines)[1:]:
                    fields = line.split()
                    if fields[3] == "01" and fields[2].endswith(f":{port:04X}") and fields[9] in inodes:
                        found.add(fields[9])
        return found
    except OSError:
        return None


def _render(data: Any, ctx: dict[str, str]) -> bytes:
    """Fill ``{name}`` placeholders (in str and bytes templates alike) from the run's context."""
    if callable(data):
        data = data(ctx)
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    for key, value in ctx.items():
        data = data.replace(b"{" + key.encode() + b"}", value.encode("utf-8", "surrogateescape"))
    return data


class WebSocketStream:
    """A client WebSocket that looks like a socket to ``run``: ``sendall`` sends one text
    message (binary if the bytes are not UTF-8, as a browser could not send them as text),
    ``recv`` returns the payload bytes of the messages received, as one stream.  Built on the
    `websockets` library's sans-IO client, so neither wsproto (the adapter's) nor cowboy (the
    plugin's) is on both sides.  ``close_frame`` is the server's Close ("code reason")."""

    def __init__(self, port: int, path: str = "/ws", subprotocols: tuple[str, ...] = ("v12.stomp",)) -> None:
        """``subprotocols``: offered in Sec-WebSocket-Protocol (empty: the header is left out)."""
        from websockets.client import ClientProtocol
        from websockets.http11 import Response
        from websockets.protocol import State
        from websockets.uri import parse_uri

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.protocol = ClientProtocol(
            parse_uri(f"ws://127.0.0.1:{port}{path}"),
            subprotocols=list(subprotocols) or None,
            max_size=None,
        )
        self.protocol.send_request(self.protocol.connect())
        self._send_pending()
        while self.protocol.state is not State.OPEN:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the WebSocket handshake failed: connection closed")
            self.protocol.receive_data(data)
            for event in self.protocol.events_received():
                if isinstance(event, Response) and event.status_code != 101:
                    raise ConnectionError(f"the WebSocket handshake failed: HTTP {event.status_code}")
        self.close_frame: str | None = None
        self.subprotocol: str | None = self.protocol.subprotocol
        self.message_types: set[str] = set()  # "text", "binary": what the server sent
        # every server message so far held exactly one frame (NUL, then the plugin's LF) or one
        # heart-beat EOL
        self.one_frame_per_message = True
        self._eof = False

    def _send_pending(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                with contextlib.suppress(OSError):
                    self.sock.sendall(data)

    def fileno(self) -> int:
        return self.sock.fileno()

    def setblocking(self, flag: bool) -> None:
        self.sock.setblocking(flag)

    def sendall(self, data: bytes) -> None:
        from websockets.protocol import State

        if self.protocol.state is not State.OPEN:
            raise BrokenPipeError("the WebSocket is closed")
        try:
            data.decode("utf-8")
            self.protocol.send_text(data)
        except UnicodeDecodeError:
            self.protocol.send_binary(data)
        self._send_pending()

    def send_messages(self, parts: list[bytes], opcode: str = "auto") -> None:
        """Each part as one message; "text" sends it as text even when it is not UTF-8 (the
        library checks nothing on the way out), to see what the server does with it."""
        from websockets.protocol import State

        for part in parts:
            if self.protocol.state is not State.OPEN:
                raise BrokenPipeError("the WebSocket is closed")
            if opcode == "binary":
                self.protocol.send_binary(part)
            elif opcode == "text":
                self.protocol.send_text(part)
            else:
                self.sendall(part)
                continue
            self._send_pending()

    def recv(self, size: int) -> bytes:
        from websockets.frames import Opcode

        if self._eof:
            return b""
        data = self.sock.recv(size)
        if not data:
            self.protocol.receive_eof()
            return b""
        self.protocol.receive_data(data)
        payload = b""
        for frame in self.protocol.events_received():
            if frame.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                if frame.opcode is not Opcode.CONT:
                    self.message_types.add(frame.opcode.name.lower())
                whole = frame.data == b"\n" or (frame.data.endswith(b"\0\n") and frame.data.count(b"\0") == 1)
                if not (frame.fin and frame.opcode is not Opcode.CONT and whole):
                    self.one_frame_per_message = False
                payload += frame.data
            elif frame.opcode is Opcode.CLOSE and self.protocol.close_rcvd is not None:
                close = self.protocol.close_rcvd
                self.close_frame = f"{close.code} {close.reason}".strip()
                self._eof = True
        self._send_pending()
        if self._eof and not payload:
            return b""
        if not payload:
            raise BlockingIOError  # only control frames: nothing for the reader yet
        return payload

    def close(self) -> None:
        self.sock.close()


def run(
    conversation: Conversation,
    server: str,
    port: int,
    names: dict[str, str],
    marker: str,
    broker: Broker,
    transport: str = "tcp",
) -> Transcript:
    transcript = Transcript(server=server, names=dict(names))
    claim = conversation.claim_unbound_subscription_queues
    ctx: dict[str, str] = dict(names)
    selector = selectors.DefaultSelector()
    sockets: dict[int, Any] = {}
    readers: dict[int, FrameReader] = {}
    closed: set[int] = set()
    before = broker.queue_names()

    def open_conn(conn: int) -> Any:
        sock: Any = (
            WebSocketStream(port, subprotocols=conversation.subprotocols)
            if transport == "ws"
            else socket.create_connection(("127.0.0.1", port), timeout=5)
        )
        sock.setblocking(False)
        sockets[conn] = sock
        readers[conn] = FrameReader()
        selector.register(sock, selectors.EVENT_READ, conn)
        return sock

    def read(
        results: dict[int, ConnResult], expect: Mapping[int, int], timeout: float, settle: float
    ) -> None:
        deadline = time.monotonic() + timeout
        settle_until: float | None = None
        while True:
            now = time.monotonic()
            waiting = [
                c
                for c, n in expect.items()
                if c not in closed and len(results.setdefault(c, ConnResult()).frames) < n
            ]
            if not waiting and settle_until is None:
                settle_until = now + settle
            limit = settle_until if settle_until is not None else deadline
            if now >= limit or (not sockets.keys() - closed):
                return
            for key, _ in selector.select(max(0.0, limit - now)):
                conn = key.data
                try:
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                result = results.setdefault(conn, ConnResult())
                if not data:
                    result.closed = True
                    result.close_frame = getattr(key.fileobj, "close_frame", None)
                    closed.add(conn)
                    selector.unregister(key.fileobj)
                    continue
                result.frames += readers[conn].feed(data)

    try:
        for index, step in enumerate(conversation.steps):
            if step.pause:
                time.sleep(step.pause)
            results: dict[int, ConnResult] = {}
            sent: dict[int, bytes] = {}
            if step.amqp is not None:
                seen_by_amqp = broker.run_amqp(lambda channel, step=step: step.amqp(channel, ctx))
                if seen_by_amqp is not None:  # what an AMQP client saw, recorded as "connection" -1
                    results[AMQP_VIEW] = ConnResult(frames=list(seen_by_amqp))
            if step.data is not None:
                messages = step.data if isinstance(step.data, WsMessages) else None
                parts = [_render(part, ctx) for part in messages.parts] if messages else []
                data = b"".join(parts) if messages else _render(step.data, ctx)
                sent[step.conn] = data
                sock = sockets.get(step.conn) or open_conn(step.conn)
                if step.conn in closed:
                    results[step.conn] = ConnResult(send_failed=True)
                else:
                    try:
                        sock.setblocking(True)
                        if messages is not None and isinstance(sock, WebSocketStream):
                            sock.send_messages(parts, messages.opcode)
                        elif messages is not None:
                            for part in parts:
                                sock.sendall(part)
                        else:
                            sock.sendall(data)
                    except OSError:
                        results[step.conn] = ConnResult(send_failed=True)
                    finally:
                        sock.setblocking(False)
            expect = step.expect if isinstance(step.expect, Mapping) else {step.conn: step.expect}
            last = index == len(conversation.steps) - 1
            settle = max(step.settle, conversation.final_settle) if last else step.settle
            read(results, expect, step.timeout, settle)
            transcript.steps.append(StepResult(sent, results, step.unordered))
            if step.capture is not None:
                step.capture([f for r in results.values() for f in r.frames], ctx)
        transcript.state = broker.snapshot(_ours(broker, before, marker, transcript, claim))
        for conn, sock in sockets.items():
            if isinstance(sock, WebSocketStream):
                types = ", ".join(sorted(sock.message_types)) or "none"
                shape = "one frame each" if sock.one_frame_per_message else "not one frame each"
                transcript.websocket[conn] = (
                    f"{sock.subprotocol or '(none)'}; server messages: {types}, {shape}"
                )
    finally:
        for sock in sockets.values():
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(sock)
            sock.close()
        selector.close()
    try:
        if conversation.state_after_close:
            transcript.state_after_close = _settled_state(broker, before, marker, transcript, claim)
    finally:
        for name in _ours(broker, before, marker, transcript, claim):
            broker.delete_queue(name)
    return transcript


def _ours(
    broker: Broker, before: set[str], marker: str, transcript: Transcript, claim_unbound: bool = False
) -> set[str]:
    """The queues this run created.  The broker is shared with other test runs, so a new queue
    counts only if its name or one of its bindings carries the run's marker, or its name appears
    in the transcript (server-named queues, subscription queues)."""
    seen = transcript.render()
    ours = set()
    for name in broker.queue_names() - before:
        if marker in name:
            ours.add(name)
        elif name.startswith(("stomp-subscription-", "amq.gen-")):
            info = None if name in seen else broker.queue(name)
            if name in seen or (info is not None and _claimed(info, marker, claim_unbound)):
                ours.add(name)
    return ours


def _claimed(info: dict[str, Any], marker: str, claim_unbound: bool) -> bool:
    bindings = info["bindings"]
    if any(marker in source or marker in key for source, key, _ in bindings):
        return True
    unbound = all(source == "" for source, _, _ in bindings)
    return claim_unbound and unbound and info["name"].startswith("stomp-subscription-")


def _settled_state(
    broker: Broker, before: set[str], marker: str, transcript: Transcript, claim: bool
) -> list[dict[str, Any]]:
    """State once the servers have released the connections: no exclusive queue and no consumer
    left, and two equal snapshots in a row."""
    previous = None
    deadline = time.monotonic() + 5
    while True:
        state = broker.snapshot(_ours(broker, before, marker, transcript, claim))
        quiet = all(not q["exclusive"] and q["consumers"] == 0 for q in state)
        if quiet and state == previous or time.monotonic() > deadline:
            return state
        previous = state if quiet else None
        time.sleep(0.1)


# ------------------------------------------------------------------------------ normalising

_RANDOM_NAMES = {
    "session": re.compile(r"session-[A-Za-z0-9_-]{22}"),
    "amq.gen": re.compile(r"amq\.gen-[A-Za-z0-9_-]{22}"),
    "stomp-subscription": re.compile(r"stomp-subscription-[A-Za-z0-9_-]{22}"),
}


class Normaliser:
    def __init__(self, names: Mapping[str, str], keep_random_names: bool) -> None:
        # longest first so that a name that contains another is replaced whole
        self.names = sorted(((v, k) for k, v in names.items()), key=lambda item: -len(item[0]))
        self.patterns = {
            k: p for k, p in _RANDOM_NAMES.items() if not (keep_random_names and k == "stomp-subscription")
        }
        self.seen: dict[str, str] = {}

    def text(self, value: str) -> str:
        for actual, placeholder in self.names:
            value = value.replace(actual, "{" + placeholder + "}")
        for kind, pattern in self.patterns.items():
            value = pattern.sub(self._number(kind), value)
        return value

    def _number(self, kind: str) -> Callable[[re.Match[str]], str]:
        def replace(match: re.Match[str]) -> str:
            key = match.group(0)
            if key not in self.seen:
                count = sum(1 for v in self.seen.values() if v.startswith(f"<{kind}#"))
                self.seen[key] = f"<{kind}#{count + 1}>"
            return self.seen[key]

        return replace

    def data(self, value: bytes) -> bytes:
        return self.text(value.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")

    def frame(self, f: Frame) -> Frame:
        body = self.data(f.body)
        headers = [(self.text(k), self.text(v)) for k, v in f.headers]
        if body != f.body:
            # the body contained a name of different length: compare the length of what is left
            headers = [(k, str(len(body)) if k == "content-length" else v) for k, v in headers]
        return Frame(f.command, headers, body)

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {self.text(k): self.value(v) for k, v in value.items()}
        return value

    def state(self, state: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # random names only seen in the state are numbered in a stable order
        def key(q: dict[str, Any]) -> str:
            text = json.dumps(q, sort_keys=True)
            for actual, placeholder in self.names:
                text = text.replace(actual, placeholder)
            for pattern in self.patterns.values():
                text = pattern.sub(lambda m: self.seen.get(m.group(0), "<?>"), text)
            return text

        return sorted(
            (self.value(q) for q in sorted(state, key=key)), key=lambda q: json.dumps(q, sort_keys=True)
        )


def _order(frames: list[Frame], unordered: bool) -> list[Frame]:
    return sorted(frames, key=Frame.render) if unordered else frames


def normalise(transcript: Transcript, keep_random_names: bool) -> Transcript:
    n = Normaliser(transcript.names, keep_random_names)
    out = Transcript(server=transcript.server, names={})
    for step in transcript.steps:
        out.steps.append(
            StepResult(
                {c: n.data(d) for c, d in step.sent.items()},
                {
                    c: ConnResult(
                        _order([n.frame(f) for f in r.frames], step.unordered),
                        r.closed,
                        r.send_failed,
                        r.close_frame,
                    )
                    for c, r in step.received.items()
                },
                step.unordered,
            )
        )
    out.state = n.state(transcript.state)
    out.websocket = dict(transcript.websocket)
    if transcript.state_after_close is not None:
        out.state_after_close = n.state(transcript.state_after_close)
    return out


# ------------------------------------------------------------------------------ differences


class Difference:
    """An intended difference: ``apply`` asserts what the plugin and the adapter each did, then
    rewrites the (normalised) adapter transcript into the plugin's form."""

    reason = ""
    # the difference changes the broker state while the connections are open (e.g. the adapter
    # closed its connection, so its consumers are gone): compare the state once every
    # connection is closed instead
    compare_state_after_close = False

    def apply(self, plugin: Transcript, adapter: Transcript) -> None:  # pragma: no cover
        raise NotImplementedError


def _error_step(transcript: Transcript, conn: int) -> tuple[int, Frame]:
    for i, step in enumerate(transcript.steps):
        result = step.received.get(conn)
        if result is not None:
            for f in result.frames:
                if f.command == "ERROR":
                    return i, f
    raise AssertionError(f"{transcript.server}: no ERROR on connection {conn}")


@dataclass
class ErrorCloses(Difference):
    """The plugin leaves the connection open after this ERROR; the adapter closes it right after
    the ERROR (STOMP 1.2: the server MUST close the connection after sending ERROR)."""

    conn: int = 0
    reason = "every ERROR closes the connection (STOMP 1.2 §ERROR)"
    compare_state_after_close = True

    def apply(self, plugin: Transcript, adapter: Transcript) -> None:
        p_step, p_error = _error_step(plugin, self.conn)
        a_step, a_error = _error_step(adapter, self.conn)
        assert p_step == a_step, f"ERROR in step {p_step} (plugin) vs {a_step} (adapter)"
        assert plugin.closed_at(self.conn) is None, "expected the plugin to keep the connection open"
        assert adapter.closed_at(self.conn) == a_step, "expected the adapter to close right after ERROR"
        frames = adapter.steps[a_step].received[self.conn].frames
        assert frames[-1] is a_error, "the adapter sent frames after its ERROR"
        for step in plugin.steps[p_step + 1 :]:
            assert self.conn not in step.sent, "ErrorCloses conversations must end at the ERROR"
        adapter.steps[a_step].received[self.conn].closed = False
        plugin.state = adapter.state = []  # compared after close instead


@dataclass
class ErrorReceiptId(Difference):
    """The adapter's ERROR carries ``receipt-id`` (STOMP 1.2: an ERROR for a frame with a receipt
    SHOULD carry receipt-id); the plugin never adds it."""

    receipt: str
    conn: int = 0
    reason = "ERROR carries receipt-id of the failed frame (STOMP 1.2 §ERROR)"

    def apply(self, plugin: Transcript, adapter: Transcript) -> None:
        _, p_error = _error_step(plugin, self.conn)
        _, a_error = _error_step(adapter, self.conn)
        assert p_error.header("receipt-id") is None
        assert ("receipt-id", self.receipt) in a_error.headers, a_error.headers
        # placed after message/content-type/version (and extras), before content-length
        names = [k for k, _ in a_error.headers]
        assert names.index("receipt-id") >= 3
        if "content-length" in names:
            assert names.index("receipt-id") == names.index("content-length") - 1
        a_error.headers.remove(("receipt-id", self.receipt))


@dataclass
class ClosedWithoutError(Difference):
    """The plugin closes the socket without any frame; the adapter sends ERROR ``message`` first."""

    message: str
    conn: int = 0
    reason = "an ERROR frame is sent before closing (STOMP 1.2 §ERROR)"

    def apply(self, plugin: Transcript, adapter: Transcript) -> None:
        step = plugin.closed_at(self.conn)
        assert step is not None, "expected the plugin to close the connection"
        assert not plugin.steps[step].received[self.conn].frames, "expected no frame from the plugin"
        assert adapter.closed_at(self.conn) == step, "expected the adapter to close in the same step"
        frames = adapter.steps[step].received[self.conn].frames
        assert [f.command for f in frames] == ["ERROR"], frames
        assert frames[0].header("message") == self.message, frames[0].headers
        names = [k for k, _ in frames[0].headers]
        assert names[:3] == ["message", "content-type", "version"], names
        frames.clear()


@dataclass
class ErrorBody(Difference):
    """Same ERROR ``message`` header, different body: ``plugin`` from the plugin, ``adapter``
    from the adapter (content-length follows the body)."""

    message: str
    plugin: bytes
    adapter: bytes
    why: str = ""
    conn: int = 0

    @property
    def reason(self) -> str:  # type: ignore[override]
        return self.why

    def apply(self, plugin: Transcript, adapter: Transcript) -> None:
        _, p_error = _error_step(plugin, self.conn)
        _, a_error = _error_step(adapter, self.conn)
        assert p_error.header("message") == a_error.header("message") == self.message, (
            p_error.headers,
            a_error.headers,
        )
        assert p_error.body == self.plugin, p_error.body
        assert a_error.body == self.adapter, a_error.body
        a_error.body = p_error.body
        a_error.headers = [
            (k, str(len(p_error.body)) if k == "content-length" else v) for k, v in a_error.headers
        ]


@dataclass
class NoFrameControlHeaders(Difference):
    """The plugin copies the SEND frame's control headers (``receipt``, ``transaction``,
    ``content-length``) into the AMQP headers table, so its MESSAGE frames carry them; the adapter
    does not.  Removes them from the plugin's MESSAGE frames (the table copy of content-length
    only: the real one stays) after checking that the adapter's frames lack them."""

    names: tuple[str, ...] = ("receipt",)
    reason = "frame-control headers of a SEND are not copied into the AMQP headers table"

    def apply(self, plugin: Transcript, adapter: Transcript) -> None:
        seen = 0
        for p_step, a_step in zip(plugin.steps, adapter.steps, strict=True):
            for conn, p_result in p_step.received.items():
                a_result = a_step.received.get(conn)
                p_messages = [f for f in p_result.frames if f.command == "MESSAGE"]
                a_messages = [f for f in a_result.frames if f.command == "MESSAGE"] if a_result else []
                for p, a in zip(p_messages, a_messages, strict=False):
                    for name in self.names:
                        occurrences = [i for i, (k, _) in enumerate(p.headers) if k == name]
                        a_count = sum(1 for k, _ in a.headers if k == name)
                        if name == "content-length":
                            if len(occurrences) == 2:
                                assert a_count == 1, a.headers
                                del p.headers[occurrences[0]]
                                seen += 1
                        elif occurrences:
                            assert a_count == 0, f"adapter MESSAGE has {name}: {a.headers}"
                            for i in reversed(occurrences):
                                del p.headers[i]
                            seen += 1
        assert seen, f"no plugin MESSAGE carried any of {self.names}"


@dataclass
class HeaderValue(Difference):
    """A header of a received frame has value ``plugin`` from the plugin and ``adapter`` from the
    adapter (same position)."""

    command: str
    name: str
    plugin: str
    adapter: str
    why: str = ""
    conn: int = 0
    index: int = 0  # which frame of that command

    @property
    def reason(self) -> str:  # type: ignore[override]
        return self.why

    def apply(self, plugin: Transcript, adapter: Transcript) -> None:
        p = plugin.frames(self.conn, self.command)[self.index]
        a = adapter.frames(self.conn, self.command)[self.index]
        assert p.header(self.name) == self.plugin, (self.name, p.headers)
        assert a.header(self.name) == self.adapter, (self.name, a.headers)
        a.headers = [(k, self.plugin if k == self.name else v) for k, v in a.headers]


@dataclass
class Custom(Difference):
    """Ad-hoc difference: ``check(plugin, adapter)`` asserts and rewrites."""

    check: Callable[[Transcript, Transcript], None]
    why: str = ""

    @property
    def reason(self) -> str:  # type: ignore[override]
        return self.why

    def apply(self, plugin: Transcript, adapter: Transcript) -> None:
        self.check(plugin, adapter)


# ------------------------------------------------------------------------------ comparing


def unique_names(keys: Iterable[str], shared: bool) -> tuple[str, dict[str, str], str, dict[str, str]]:
    """Parallel unique names of equal length for the plugin and the adapter run, each containing
    the run's marker (used to recognise the run's queues on the shared broker)."""
    token = uuid.uuid4().hex[:10]
    p_marker, a_marker = (f"{token}-s", f"{token}-s") if shared else (f"{token}-p", f"{token}-a")
    plugin = {k: f"compat-{k}-{p_marker}" for k in keys}
    adapter = {k: f"compat-{k}-{a_marker}" for k in keys}
    return p_marker, plugin, a_marker, adapter


def compare(
    conversation: Conversation,
    plugin_port: int,
    adapter_port: int,
    broker: Broker,
    expect: Iterable[Difference] = (),
    transport: str = "tcp",
) -> tuple[Transcript, Transcript]:
    """Run the conversation against both servers (over plain TCP, or over WebSocket with
    ``transport="ws"``: the ports are then the web_stomp listeners) and compare."""
    expect = list(expect)
    if any(d.compare_state_after_close for d in expect) and not conversation.state_after_close:
        conversation = dataclasses.replace(conversation, state_after_close=True)
    p_marker, p_names, a_marker, a_names = unique_names(conversation.names, conversation.shared_names)
    plugin_args = (conversation, "RabbitMQ STOMP plugin", plugin_port, p_names, p_marker, broker, transport)
    adapter_args = (conversation, "adapter", adapter_port, a_names, a_marker, broker, transport)
    if conversation.shared_names or conversation.claim_unbound_subscription_queues:
        # the runs would see each other's queues: one after the other
        plugin_raw = run(*plugin_args)
        adapter_raw = run(*adapter_args)
    else:
        # parallel names, each run recognises its own queues by its marker: run both at once
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            plugin_future = pool.submit(run, *plugin_args)
            adapter_future = pool.submit(run, *adapter_args)
            plugin_raw, adapter_raw = plugin_future.result(), adapter_future.result()
    plugin = normalise(plugin_raw, conversation.keep_random_names)
    adapter = normalise(adapter_raw, conversation.keep_random_names)
    transcripts = "\n\n" + plugin.render() + "\n\n" + adapter.render()
    for difference in expect:
        try:
            difference.apply(plugin, adapter)
        except AssertionError as error:
            raise AssertionError(
                f"expected difference {type(difference).__name__} not observed: {error}{transcripts}"
            ) from None
    p_text, a_text = plugin.render(with_sent=False), adapter.render(with_sent=False)
    if p_text.split("\n", 1)[1] != a_text.split("\n", 1)[1]:
        diff = "\n".join(
            difflib.unified_diff(p_text.splitlines(), a_text.splitlines(), "plugin", "adapter", lineterm="")
        )
        raise AssertionError(f"plugin and adapter differ:\n{diff}{transcripts}")
    return plugin_raw, adapter_raw


def copy_transcript(transcript: Transcript) -> Transcript:
    return copy.deepcopy(transcript)
