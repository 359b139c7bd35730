"""One WebSocket read may not hold the event loop for the whole of it (issue #24, review).

wsproto turns every frame into an event, and each event costs the shell Python work (a pong
written, a message fed to the STOMP parser); frames can be 6 bytes.  A read of 256 KiB of empty
pings or empty messages from an anonymous client, before any login, was ~43,000 events handled
in one callback: measured 1-2 s with the event loop held (every other client waiting).  The
WebSocket now handles at most ``_TURN_EVENTS`` events (or ``_TURN_BYTES`` of message payload)
per loop turn, stops reading meanwhile, and goes on at the next turn: the steps per callback are
bounded, and nothing is dropped.  Counted in events and bytes, never with the clock.
"""

from __future__ import annotations

import asyncio
import base64
import zlib

from adapter.server import websocket
from adapter.server.websocket import WebSocketConnection, WebStompSettings
from tests.unit.test_shell import RawSocket, make_server

_KEY = base64.b64encode(b"0123456789abcdef").decode()


def _frame(payload: bytes, opcode: int = 0x1, *, fin: bool = True, rsv1: bool = False) -> bytes:
    """A masked client frame with a zero key (RFC 6455 5.2)."""
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    n = len(payload)
    if n < 126:
        length = bytes((0x80 | n,))
    elif n < 65536:
        length = bytes((0x80 | 126,)) + n.to_bytes(2, "big")
    else:
        length = bytes((0x80 | 127,)) + n.to_bytes(8, "big")
    return bytes((first,)) + length + b"\0\0\0\0" + payload


def _open(*, compress: bool = False) -> tuple[WebSocketConnection, RawSocket]:
    server = make_server()
    socket = WebSocketConnection(server, WebStompSettings(compress=compress), tls=False)
    raw = RawSocket()
    socket.connection_made(raw)  # type: ignore[arg-type]
    offer = "Sec-WebSocket-Extensions: permessage-deflate\r\n" if compress else ""
    socket.data_received(
        (
            "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {_KEY}\r\nSec-WebSocket-Version: 13\r\n{offer}\r\n"
        ).encode()
    )
    assert bytes(raw.written).startswith(b"HTTP/1.1 101")
    raw.written.clear()
    return socket, raw


def _pongs(data: bytes) -> int:
    return data.count(b"\x8a\x00")  # an empty, final, unmasked Pong


async def test_a_read_of_pings_is_answered_over_several_turns() -> None:
    socket, raw = _open()
    pings = 40_000  # 240 KB: about one read's worth
    socket.data_received(_frame(b"", 0x9) * pings)
    # one callback handled a bounded number of events, and the socket stopped reading
    assert _pongs(bytes(raw.written)) <= websocket._TURN_EVENTS
    assert not raw.reading
    turns = 1
    while _pongs(bytes(raw.written)) < pings:
        before = _pongs(bytes(raw.written))
        await asyncio.sleep(0)
        turns += 1
        assert _pongs(bytes(raw.written)) - before <= websocket._TURN_EVENTS
        assert turns <= pings, "the rest of the read was never handled"
    assert _pongs(bytes(raw.written)) == pings  # every ping answered, in the end
    await asyncio.sleep(0)
    assert raw.reading  # caught up: reading again
    socket.connection_lost(None)


async def test_a_read_of_tiny_messages_reaches_the_session_whole_over_several_turns() -> None:
    socket, raw = _open()
    session = socket._session
    assert session is not None
    fed: list[bytes] = []
    original = session.data_received

    def recording(data: bytes) -> None:
        fed.append(data)
        original(data)

    session.data_received = recording  # type: ignore[method-assign]
    messages = 30_000  # one "\n" each: heart-beats before CONNECT, 7 bytes on the wire
    socket.data_received(_frame(b"\n") * messages)
    first_turn = sum(len(chunk) for chunk in fed)
    assert first_turn <= websocket._TURN_EVENTS
    while sum(len(chunk) for chunk in fed) < messages:
        await asyncio.sleep(0)
    assert b"".join(fed) == b"\n" * messages  # nothing lost, nothing reordered
    # then a CONNECT is still read as a whole frame (no broker: it fails, but it is read)
    socket.connection_lost(None)


async def test_compressed_messages_are_bounded_per_turn_in_inflated_bytes() -> None:
    socket, raw = _open(compress=True)
    session = socket._session
    assert session is not None
    fed: list[int] = []
    original = session.data_received

    def recording(data: bytes) -> None:
        fed.append(len(data))
        original(data)

    session.data_received = recording  # type: ignore[method-assign]
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    one = compressor.compress(b"\n" * 60_000) + compressor.flush(zlib.Z_SYNC_FLUSH)
    payload = _frame(one[:-4], rsv1=True)  # about 80 bytes inflating to 60,000
    count = 200  # 12 MB of heart-beats from 16 KB on the wire
    socket.data_received(payload * count)
    assert sum(fed) <= websocket._TURN_BYTES + 60_000
    while sum(fed) < count * 60_000:
        await asyncio.sleep(0)
    assert sum(fed) == count * 60_000
    socket.connection_lost(None)
