"""The asyncio shell (adapter/server/connection.py, websocket.py) with in-memory transports and no
broker: what reaches the client socket for input that never needs the broker (bad frames,
frames before CONNECT, a PROXY header, incomplete frames), a CONNECT when every broker node
refuses, and a WebSocket upgrade carrying the same session.  Frames written by the shell are
read back with a plain split on NUL, not with the adapter's codec."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from adapter.cli import build_server
from adapter.config import load_settings
from adapter.server.connection import ClientConnection
from adapter.server.listener import Server
from adapter.server.websocket import WebSocketConnection, WebStompSettings
from tests.support import MemoryTransport

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0"


def make_server(**settings: Any) -> Server:
    # port 1 on loopback: nothing listens there, so every broker connection is refused at once
    overrides: dict[str, Any] = {"listeners": [], "amqp_url": "amqp://guest:guest@127.0.0.1:1/"}
    overrides.update(settings)
    return build_server(load_settings(None, overrides))


def connect_client(server: Server, **kwargs: Any) -> tuple[ClientConnection, MemoryTransport]:
    client = ClientConnection(server, **kwargs)
    transport = MemoryTransport()
    client.connection_made(transport)  # type: ignore[arg-type]
    return client, transport


async def test_frame_before_connect_gets_error_and_half_close() -> None:
    server = make_server()
    client, transport = connect_client(server)
    client.data_received(b"SEND\ndestination:/queue/a\nreceipt:r1\n\nx\0")
    (error,) = transport.frames()
    assert error.startswith(b"ERROR\n") and b"receipt-id:r1\n" in error
    assert transport.eof_written  # half-close: the client reads the ERROR, then EOF
    assert client.closed
    client.connection_lost(None)
    await asyncio.wait_for(client.done, 1)
    assert client not in server.connections


async def test_bad_frame_gets_error() -> None:
    server = make_server()
    client, transport = connect_client(server)
    client.data_received(b"CONNECT\nno colon here\n\n\0")
    (error,) = transport.frames()
    assert error.startswith(b"ERROR\nmessage:") and client.closed


async def test_connect_with_every_node_refusing() -> None:
    server = make_server(amqp_url="amqp://guest:guest@127.0.0.1:1/,amqp://guest:guest@127.0.0.1:2/")
    client, transport = connect_client(server)
    client.data_received(CONNECT)
    for _ in range(200):
        if transport.frames():
            break
        await asyncio.sleep(0.01)
    (error,) = transport.frames()
    assert b"message:Bad CONNECT" in error or b"unreachable" in error, error
    assert b"The broker is unreachable" in error
    assert client.closed


async def test_proxy_header_gives_the_peer_and_loopback_rule() -> None:
    server = make_server(proxy_protocol=True)
    client, transport = connect_client(server)
    client.data_received(b"PROXY TCP4 203.0.113.7 127.0.0.1 5000 61613\r\n")
    assert client.peer == "203.0.113.7:5000"
    client.data_received(CONNECT)  # guest from a non-loopback address: refused before any broker call
    (error,) = transport.frames()
    assert b"non-loopback access denied" in error


async def test_invalid_proxy_header_aborts_without_a_frame() -> None:
    server = make_server(proxy_protocol=True)
    client, transport = connect_client(server)
    client.data_received(CONNECT)
    assert transport.aborted and transport.frames() == []


async def test_incomplete_frames_count_against_the_budget_until_complete() -> None:
    server = make_server(incomplete_frames_budget=1000)
    client, _transport = connect_client(server)
    client.data_received(b"CONNECT\naccept-version:1.2\n")
    assert server.incomplete_input == len(b"CONNECT\naccept-version:1.2\n")
    other, other_transport = connect_client(server)
    other.data_received(b"CONNECT\n" + b"x" * 2000)  # over the shared budget: that one is closed
    assert other.closed and b"Too much incomplete input" in other_transport.frames()[0]
    assert not client.closed
    client.connection_lost(None)
    assert server.incomplete_input == 0


class RawSocket(MemoryTransport):
    """The socket under a WebSocket: no half-close."""

    def can_write_eof(self) -> bool:
        return False


def client_message(payload: bytes) -> bytes:
    """A masked client text frame with a zero key (RFC 6455 5.2)."""
    length = (
        bytes((0x80 | len(payload),))
        if len(payload) < 126
        else bytes((0x80 | 126,)) + len(payload).to_bytes(2, "big")
    )
    return b"\x81" + length + b"\0\0\0\0" + payload


async def test_websocket_upgrade_carries_the_same_session() -> None:
    server = make_server()
    socket = WebSocketConnection(server, WebStompSettings(compress=False), tls=False)
    raw = RawSocket()
    socket.connection_made(raw)  # type: ignore[arg-type]
    key = base64.b64encode(b"0123456789abcdef").decode()
    socket.data_received(
        (
            "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: v10.stomp, v12.stomp\r\n\r\n"
        ).encode()
    )
    head, _, rest = bytes(raw.written).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101") and b"sec-websocket-protocol: v12.stomp" in head.lower()
    assert rest == b""
    raw.written.clear()
    # a frame before CONNECT: the session's ERROR, as one text message, then Close 1000
    socket.data_received(client_message(b"SEND\ndestination:/queue/a\n\nx\0"))
    data = bytes(raw.written)
    assert data[0] == 0x81  # FIN + text
    length, start = data[1], 2
    if length == 126:
        length, start = int.from_bytes(data[2:4], "big"), 4
    message = data[start : start + length]
    assert message.startswith(b"ERROR\n") and message.endswith(b"\0\n")
    close = data[start + length :]
    assert close[0] == 0x88 and close[2:4] == (1000).to_bytes(2, "big") and close[4:] == b"STOMP died"


async def test_plain_get_on_the_websocket_path_gets_426() -> None:
    server = make_server()
    socket = WebSocketConnection(server, WebStompSettings(), tls=False)
    raw = RawSocket()
    socket.connection_made(raw)  # type: ignore[arg-type]
    socket.data_received(b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n")
    assert bytes(raw.written).startswith(b"HTTP/1.1 426 ") and raw.closed
