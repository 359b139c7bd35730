"""adapter/server/wsdeflate.py: the bounded permessage-deflate inflater, driven through wsproto's
own server connection (the frames are written here as a client would), and the process-wide
compression budget."""

from __future__ import annotations

import zlib

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Ping, Request, TextMessage
from wsproto.extensions import PerMessageDeflate

from adapter.server.wsdeflate import BoundedDeflate, CompressionBudget


def _server(limit: int, offer: str = "permessage-deflate") -> tuple[WSConnection, BoundedDeflate]:
    server = WSConnection(ConnectionType.SERVER)
    client = WSConnection(ConnectionType.CLIENT)
    extension = PerMessageDeflate()
    if "client_no_context_takeover" in offer:
        extension.client_no_context_takeover = True
    server.receive_data(client.send(Request(host="x", target="/ws", extensions=[extension])))
    next(server.events())
    bounded = BoundedDeflate(lambda: limit)
    server.send(AcceptConnection(extensions=[bounded]))
    assert bounded.enabled()
    return server, bounded


def frame(payload: bytes, opcode: int = 0x1, *, fin: bool = True, rsv1: bool = False) -> bytes:
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    n = len(payload)
    if n < 126:
        header = bytes((first, 0x80 | n))
    elif n < 65536:
        header = bytes((first, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        header = bytes((first, 0x80 | 127)) + n.to_bytes(8, "big")
    return header + b"\0\0\0\0" + payload  # a zero mask


def deflate(*parts: bytes, compressor: object = None) -> list[bytes]:
    """Each part deflated and sync-flushed (one frame each), the last without 00 00 ff ff."""
    c = compressor or zlib.compressobj(9, zlib.DEFLATED, -15)
    out = [c.compress(p) + c.flush(zlib.Z_SYNC_FLUSH) for p in parts]  # type: ignore[attr-defined]
    out[-1] = out[-1][:-4]
    return out


def events(server: WSConnection, data: bytes) -> list[object]:
    server.receive_data(data)
    return list(server.events())


def text(evs: list[object]) -> str:
    return "".join(e.data for e in evs if isinstance(e, TextMessage))


def test_compressed_messages_within_the_bound_are_read() -> None:
    server, _ = _server(1000)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    for n in range(3):  # context takeover: the window carries over
        (payload,) = deflate(b"\n" * 1000, compressor=compressor)
        got = events(server, frame(payload, rsv1=True))
        assert text(got) == "\n" * 1000, n
        (payload,) = deflate(b"abc", compressor=compressor)
        assert text(events(server, frame(payload, rsv1=True))) == "abc"


def test_a_bomb_is_refused_with_1009_having_inflated_one_byte_over_the_bound() -> None:
    server, bounded = _server(64 * 1024)
    (bomb,) = deflate(b"\n" * (32 * 1024 * 1024))
    got = events(server, frame(bomb, rsv1=True))
    assert [type(e) for e in got] == [CloseConnection]
    assert got[0].code == 1009  # type: ignore[attr-defined]
    assert not [e for e in got if isinstance(e, TextMessage)]


def test_the_bound_holds_across_the_fragments_of_one_message() -> None:
    server, _ = _server(2500)
    first, second, third = deflate(b"a" * 1000, b"b" * 1000, b"c" * 1000)
    got = events(server, frame(first, fin=False, rsv1=True) + frame(second, 0x0, fin=False))
    assert text(got) == "a" * 1000 + "b" * 1000
    got = events(server, frame(third, 0x0))
    assert isinstance(got[-1], CloseConnection) and got[-1].code == 1009


def test_a_ping_between_fragments_leaves_the_compressed_message_alone() -> None:
    # wsproto's own extension forgets the message is compressed after a control frame
    server, _ = _server(10_000)
    first, second = deflate(b"CONNECT\n", b"login:guest\n\n\0")
    got = events(server, frame(first, fin=False, rsv1=True) + frame(b"hi", 0x9) + frame(second, 0x0))
    assert [type(e) for e in got] == [TextMessage, Ping, TextMessage]
    assert text(got) == "CONNECT\nlogin:guest\n\n\0"


def test_the_bound_is_read_again_for_every_message() -> None:
    limits = [100]  # e.g. the pre-login frame limit, then the larger one after login
    server = WSConnection(ConnectionType.SERVER)
    client = WSConnection(ConnectionType.CLIENT)
    server.receive_data(client.send(Request(host="x", target="/ws", extensions=[PerMessageDeflate()])))
    next(server.events())
    server.send(AcceptConnection(extensions=[BoundedDeflate(lambda: limits[0])]))
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    (payload,) = deflate(b"x" * 100, compressor=compressor)
    assert text(events(server, frame(payload, rsv1=True))) == "x" * 100
    limits[0] = 200
    (payload,) = deflate(b"y" * 150, compressor=compressor)
    assert text(events(server, frame(payload, rsv1=True))) == "y" * 150
    limits[0] = 100
    (payload,) = deflate(b"z" * 150, compressor=compressor)
    got = events(server, frame(payload, rsv1=True))
    assert isinstance(got[-1], CloseConnection) and got[-1].code == 1009


def test_uncompressed_messages_are_not_bounded_here() -> None:
    server, _ = _server(10)
    assert text(events(server, frame(b"x" * 1000))) == "x" * 1000
    assert [type(e) for e in events(server, frame(b"\x01\x02", 0x2))] == [BytesMessage]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(b"\xff\xff\xff", rsv1=True), 1007),  # not deflate data
        (frame(b"ping", 0x9, rsv1=True), 1002),  # a compressed control frame
        (frame(deflate(b"a")[0], fin=False, rsv1=True) + frame(b"x", 0x0, rsv1=True), 1002),
    ],
)
def test_broken_compression_fails_the_connection(data: bytes, code: int) -> None:
    server, _ = _server(1000)
    got = events(server, data)
    assert isinstance(got[-1], CloseConnection) and got[-1].code == code


def test_no_context_takeover_starts_every_message_afresh() -> None:
    server, _ = _server(1000, offer="permessage-deflate; client_no_context_takeover")
    for _ in range(3):
        (payload,) = deflate(b"same message")  # a fresh compressor each time
        assert text(events(server, frame(payload, rsv1=True))) == "same message"


def test_budget() -> None:
    budget = CompressionBudget(100)
    assert budget.reserve(60) and not budget.reserve(41) and budget.reserve(40)
    assert budget.used == 100
    budget.release(60)
    assert budget.reserve(50) and budget.used == 90
