"""A small, fast STOMP 1.2 client on raw asyncio sockets, for the benchmark only.

Independent of the adapter on purpose: it shares no code with ``adapter.stomp`` so a codec bug
cannot hide itself by being on both ends.  It only handles what the benchmark needs:

* frames are written as pre-built ``bytes`` (``frame()``), and batched: ``send()`` queues bytes
  and flushes them with one ``transport.write`` per event-loop iteration; producers write whole
  batches (``frame * n``) themselves;
* frames are read with ``bytes.find`` on the receive buffer and ``content-length`` when present;
  headers are not parsed unless asked for (``header()`` finds one header in the raw header block).
  Values are used in their escaped form, which is what a 1.2 client must send back (ack ids) and
  harmless for the plain names the benchmark uses;
* flow control: ``pause_writing``/``resume_writing`` back ``drain()``.

An ERROR frame or a lost connection is reported to ``on_failure`` (the running measurement), so a
measurement never waits for something a broken connection will not deliver.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
import zlib
from collections.abc import Callable
from typing import Any

Handler = Callable[[bytes, bytes], None]

_receipts = itertools.count(1)


def frame(command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    """Encode one frame.  Header values must not need escaping (the benchmark's never do)."""
    lines = [command]
    if headers:
        lines.extend(f"{name}:{value}" for name, value in headers.items())
    if body:
        lines.append(f"content-length:{len(body)}")
    return ("\n".join(lines) + "\n\n").encode() + body + b"\0"


def header(raw: bytes, name: bytes) -> bytes | None:
    """The first ``name`` header in a raw header block (``COMMAND\\nk:v\\n...``), or None."""
    key = b"\n" + name + b":"
    at = raw.find(key)
    if at < 0:
        return None
    start = at + len(key)
    end = raw.find(b"\n", start)
    return raw[start:] if end < 0 else raw[start:end]


def headers(raw: bytes) -> dict[str, str]:
    """All headers of a raw header block; the first occurrence of a repeated header wins."""
    result: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").split("\n")[1:]:
        name, _, value = line.partition(":")
        result.setdefault(name, value)
    return result


class StompError(Exception):
    pass


class StompClient(asyncio.Protocol):
    """One STOMP connection.  Set ``on_message`` / ``on_receipt`` for the scenario's hot path."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._rest = b""
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._paused = False
        self._drain: asyncio.Future[None] | None = None
        self.connected: asyncio.Future[bytes] = self.loop.create_future()
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self._waiters: dict[bytes, asyncio.Future[bytes]] = {}
        self.on_message: Handler | None = None  # (raw headers, body)
        self.on_receipt: Callable[[bytes], None] | None = None  # receipts nobody waits for
        self.on_chunk: Callable[[], None] | None = None  # after each read that produced frames
        self.on_failure: Callable[[str], None] | None = None
        self.messages = 0  # MESSAGE frames received
        self.error: str | None = None
        self.expect_close = False

    # ------------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.expect_close:
            self._fail(f"{self.name}: connection lost" + (f" ({exc})" if exc else " (closed by the server)"))
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(StompError(self.error or "connection closed"))
        if not self.connected.done():
            self.connected.set_exception(StompError(self.error or "connection closed before CONNECTED"))
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    def data_received(self, data: bytes) -> None:
        buf = self._rest + data if self._rest else data
        n = len(buf)
        pos = 0
        frames = 0
        while pos < n:
            first = buf[pos]
            if first == 10 or first == 13:  # heart-beats and the LF after each NUL
                pos += 1
                continue
            hend = buf.find(b"\n\n", pos)
            if hend < 0:
                break
            bstart = hend + 2
            cl = buf.find(b"\ncontent-length:", pos, hend)
            if cl >= 0:
                eol = buf.find(b"\n", cl + 16, bstart)
                bend = bstart + int(buf[cl + 16 : eol])
                if bend >= n:
                    break
                if buf[bend] != 0:
                    self._fail(f"{self.name}: frame body not followed by NUL")
                    return
            else:
                bend = buf.find(b"\0", bstart)
                if bend < 0:
                    break
            raw = buf[pos:hend]
            pos = bend + 1
            frames += 1
            if raw.startswith(b"MESSAGE\n"):
                self.messages += 1
                handler = self.on_message
                if handler is not None:
                    handler(raw, buf[bstart:bend])
            else:
                self._control(raw, buf[bstart:bend])
        self._rest = buf[pos:] if pos < n else b""
        if frames and self.on_chunk is not None:
            self.on_chunk()

    def _control(self, raw: bytes, body: bytes) -> None:
        command = raw.split(b"\n", 1)[0]
        if command == b"RECEIPT":
            receipt = header(raw, b"receipt-id") or b""
            waiter = self._waiters.pop(receipt, None)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(raw)
            elif self.on_receipt is not None:
                self.on_receipt(receipt)
        elif command == b"CONNECTED":
            if not self.connected.done():
                self.connected.set_result(raw)
        elif command == b"ERROR":
            message = (header(raw, b"message") or b"").decode("utf-8", "replace")
            detail = body.decode("utf-8", "replace").strip()
            self._fail(f"{self.name}: ERROR {message!r}" + (f": {detail[:300]}" if detail else ""))
            if not self.connected.done():
                self.connected.set_exception(StompError(self.error or "ERROR"))
            for waiter in self._waiters.values():
                if not waiter.done():
                    waiter.set_exception(StompError(self.error or "ERROR"))
            self._waiters.clear()
        # anything else is ignored

    def _fail(self, text: str) -> None:
        if self.error is None:
            self.error = text
        if self.on_failure is not None:
            self.on_failure(text)

    # ------------------------------------------------------------------ writing
    def send(self, data: bytes) -> None:
        """Queue bytes; all bytes queued in one loop iteration go out in one write."""
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if out and self.transport is not None:
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    def write(self, data: bytes) -> None:
        """Write now (producers write whole batches)."""
        if self.transport is None:
            raise StompError(self.error or f"{self.name}: not connected")
        self.transport.write(data)

    @property
    def paused(self) -> bool:
        return self._paused

    async def drain(self) -> None:
        if self._paused and self.transport is not None:
            if self._drain is None:
                self._drain = self.loop.create_future()
            await self._drain

    # ------------------------------------------------------------------ requests
    async def request(self, command: str, headers: dict[str, str], timeout: float = 10.0) -> bytes:
        """Send a frame with a receipt header and wait for its RECEIPT."""
        receipt = f"r{next(_receipts)}"
        waiter: asyncio.Future[bytes] = self.loop.create_future()
        self._waiters[receipt.encode()] = waiter
        self.send(frame(command, {**headers, "receipt": receipt}))
        try:
            async with asyncio.timeout(timeout):
                return await waiter
        except TimeoutError:
            raise StompError(f"{self.name}: no RECEIPT for {command} within {timeout:g} s") from None

    async def disconnect(self, timeout: float = 10.0) -> None:
        """DISCONNECT with a receipt, then close; errors are ignored (teardown)."""
        if self.transport is None:
            return
        self.expect_close = True
        with contextlib.suppress(StompError, OSError):
            await self.request("DISCONNECT", {}, timeout)
        self.abort()

    def abort(self) -> None:
        self.expect_close = True
        if self.transport is not None:
            self.transport.close()


class _WebSocketTransport:
    """What a StompClient writes to when it speaks over WebSocket: each write is one masked
    text message (RFC 6455 5.2), as a browser's stompjs sends one message per frame or batch."""

    def __init__(self, raw: asyncio.Transport) -> None:
        self.raw = raw

    def write(self, data: bytes) -> None:
        n = len(data)
        if n < 126:
            head = bytes((0x81, 0x80 | n))
        elif n < 65536:
            head = bytes((0x81, 0x80 | 126)) + n.to_bytes(2, "big")
        else:
            head = bytes((0x81, 0x80 | 127)) + n.to_bytes(8, "big")
        # a zero masking key: valid framing, and the bench spends no CPU on XOR; the server
        # unmasks every byte whatever the key is
        self.raw.write(head + b"\0\0\0\0" + data)

    def close(self) -> None:
        self.raw.close()

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self.raw.get_extra_info(name, default)


class WebSocketShim(asyncio.Protocol):
    """A StompClient over WebSocket: the opening handshake, then server messages (unmasked, any
    opcode) become the byte stream the StompClient parses.  Pings are answered; fragmented
    messages need no special case because the payloads are one stream anyway."""

    def __init__(self, client: StompClient, host: str, port: int, path: str, compress: bool = False) -> None:
        self.client = client
        # compress: offer permessage-deflate, as browsers do; the client's own messages stay
        # uncompressed (RFC 7692 lets each message choose), the server's are inflated here
        offer = "Sec-WebSocket-Extensions: permessage-deflate\r\n" if compress else ""
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: c3RvbXAtYmVuY2gta2V5MQ==\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Protocol: v12.stomp\r\n{offer}\r\n"
        ).encode()
        self._inflater: Any = None
        self._takeover = True
        self._buffer = b""
        self._open = False
        self._raw: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = transport  # type: ignore[assignment]
        transport.write(self._request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        buf = self._buffer + data if self._buffer else data
        if not self._open:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self._buffer = buf
                return
            if not buf.startswith(b"HTTP/1.1 101"):
                self.opened.set_exception(StompError(f"WebSocket handshake refused: {buf[:60]!r}"))
                assert self._raw is not None
                self._raw.close()
                return
            self._open = True
            response = buf[:end].lower()
            if b"permessage-deflate" in response:
                self._inflater = zlib.decompressobj(-15)
                self._takeover = b"server_no_context_takeover" not in response
            assert self._raw is not None
            self.client.connection_made(_WebSocketTransport(self._raw))  # type: ignore[arg-type]
            self.opened.set_result(None)
            buf = buf[end + 4 :]
        payload: list[bytes] = []
        pos, n = 0, len(buf)
        while n - pos >= 2:
            opcode, length = buf[pos] & 0x0F, buf[pos + 1] & 0x7F
            start = pos + 2
            if length == 126:
                if n - pos < 4:
                    break
                length, start = int.from_bytes(buf[pos + 2 : pos + 4], "big"), pos + 4
            elif length == 127:
                if n - pos < 10:
                    break
                length, start = int.from_bytes(buf[pos + 2 : pos + 10], "big"), pos + 10
            if n < start + length:
                break
            body = buf[start : start + length]
            compressed = buf[pos] & 0x40
            pos = start + length
            if opcode in (0, 1, 2):
                if compressed and self._inflater is not None:
                    body = self._inflater.decompress(body + b"\x00\x00\xff\xff")
                    if not self._takeover:
                        self._inflater = zlib.decompressobj(-15)
                payload.append(body)
            elif opcode == 9 and self._raw is not None:  # ping: pong with the same payload
                self._raw.write(bytes((0x8A, 0x80 | len(body))) + b"\0\0\0\0" + body)
            elif opcode == 8 and self._raw is not None:
                self._raw.close()
        self._buffer = buf[pos:]
        if payload:
            self.client.data_received(b"".join(payload) if len(payload) > 1 else payload[0])

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(StompError("connection closed during the WebSocket handshake"))
        self.client.connection_lost(exc)

    def pause_writing(self) -> None:
        self.client.pause_writing()

    def resume_writing(self) -> None:
        self.client.resume_writing()


async def connect(
    host: str,
    port: int,
    name: str = "",
    *,
    timeout: float = 15.0,
    login: str = "guest",
    passcode: str = "guest",
    tls: ssl.SSLContext | None = None,
    websocket: str | None = None,
    compress: bool = False,
) -> StompClient:
    """Open a connection (over TLS with ``tls``; over WebSocket at path ``websocket``) and log in
    (STOMP 1.2, no heart-beats)."""
    loop = asyncio.get_running_loop()
    client: StompClient | None = None
    try:
        async with asyncio.timeout(timeout):
            if websocket is not None:
                client = StompClient(name)
                _, shim = await loop.create_connection(
                    lambda: WebSocketShim(client, host, port, websocket, compress),  # type: ignore[arg-type]
                    host,
                    port,
                    ssl=tls,
                    server_hostname="localhost" if tls else None,
                )
                await shim.opened
            else:
                _, client = await loop.create_connection(
                    lambda: StompClient(name),
                    host,
                    port,
                    ssl=tls,
                    server_hostname="localhost" if tls else None,
                )
            client.send(
                frame(
                    "CONNECT",
                    {
                        "accept-version": "1.2",
                        "host": "/",
                        "login": login,
                        "passcode": passcode,
                        "heart-beat": "0,0",
                    },
                )
            )
            await client.connected
    except TimeoutError:
        if client is not None:
            client.abort()
        raise StompError(f"{name}: no CONNECTED from {host}:{port} within {timeout:g} s") from None
    except BaseException:
        if client is not None:
            client.abort()
        raise
    return client
