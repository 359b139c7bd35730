"""Hostile WebSocket input (issue #24): a permessage-deflate bomb before login, and seeded fuzzing
of the WebSocket framing itself, against an in-process adapter and the real RabbitMQ.

The bomb is written by hand on a raw socket (a WebSocket library would refuse to build it); the
bystander is the independent `websockets` client.  Memory is measured in bytes with tracemalloc
(the adapter runs in this process), never with the clock.
"""

from __future__ import annotations

import socket
import struct
import time
import tracemalloc
import zlib

from adapter.server.wsdeflate import CONTEXT_BYTES
from tests.integration.test_web_stomp import CONNECT, assert_still_served, command, open_ws, recv, ws_adapter

_HANDSHAKE = (
    b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: v12.stomp\r\n"
)
_DEFLATE = b"Sec-WebSocket-Extensions: permessage-deflate\r\n"


def raw_ws(port: int, *, deflate: bool) -> socket.socket:
    """A raw socket past the opening handshake (permessage-deflate offered when ``deflate``)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(_HANDSHAKE + (_DEFLATE if deflate else b"") + b"\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        assert chunk, f"closed during the handshake: {head!r}"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    assert (b"permessage-deflate" in head.lower()) == deflate, head
    return sock


def frame(payload: bytes, opcode: int = 0x1, *, rsv1: bool = False) -> bytes:
    """One final, masked client frame (RFC 6455 5.2)."""
    first = 0x80 | (0x40 if rsv1 else 0) | opcode
    n = len(payload)
    if n < 126:
        header = bytes((first, 0x80 | n))
    elif n < 65536:
        header = bytes((first, 0x80 | 126)) + struct.pack("!H", n)
    else:
        header = bytes((first, 0x80 | 127)) + struct.pack("!Q", n)
    mask = b"abcd"
    whole = (mask * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(whole, "big")).to_bytes(n, "big")
    return header + mask + masked


def deflated(data_chunks: list[bytes]) -> bytes:
    """permessage-deflate payload of one message (RFC 7692 7.2.1: without the final 00 00 ff ff)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    out = b"".join(compressor.compress(chunk) for chunk in data_chunks)
    out += compressor.flush(zlib.Z_SYNC_FLUSH)
    assert out.endswith(b"\x00\x00\xff\xff")
    return out[:-4]


def close_code(sock: socket.socket) -> int | None:
    """Read until the server's Close frame; its status code (None if the socket just ends)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionError, TimeoutError):
            chunk = b""
        if not chunk:
            break
        data += chunk
    while len(data) >= 2:
        opcode, length = data[0] & 0x0F, data[1] & 0x7F
        offset = 2
        if length == 126:
            length, offset = struct.unpack("!H", data[2:4])[0], 4
        elif length == 127:
            length, offset = struct.unpack("!Q", data[2:10])[0], 10
        if opcode == 0x8:
            payload = data[offset : offset + length]
            return int(struct.unpack("!H", payload[:2])[0]) if len(payload) >= 2 else None
        data = data[offset + length :]
    return None


BOMB_INFLATED = 64 * 1024 * 1024  # bytes of "\n" one small message inflates to


def test_deflate_bomb_before_login_closes_1009_and_holds_little_memory(start_adapter):
    _adapter, port = ws_adapter(start_adapter)
    with open_ws(port) as bystander:
        bystander.send(CONNECT)
        assert command(recv(bystander)) == "CONNECTED"
        bomb = deflated([b"\n" * (1024 * 1024)] * (BOMB_INFLATED // (1024 * 1024)))
        assert len(bomb) < BOMB_INFLATED // 500  # about 64 KB on the wire
        sock = raw_ws(port, deflate=True)
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            before, _ = tracemalloc.get_traced_memory()
            sock.sendall(frame(bomb, rsv1=True))
            code = close_code(sock)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            sock.close()
        assert code == 1009
        # before login a message may inflate to the pre-login frame limit (64 KiB) and a little
        # more: what the adapter allocated while reading it stays a few copies of that
        held = peak - before
        assert held < 4 * 1024 * 1024, f"{held} bytes allocated for one {len(bomb)}-byte message"
        assert_still_served(bystander)


def test_bomb_after_login_is_bounded_by_the_frame_limit(start_adapter):
    _adapter, port = ws_adapter(start_adapter, max_frame_size=100_000)
    with open_ws(port) as bystander:
        bystander.send(CONNECT)
        assert command(recv(bystander)) == "CONNECTED"
        sock = raw_ws(port, deflate=True)
        sock.sendall(frame(deflated([CONNECT.encode()]), rsv1=True))
        # a message of heart-beats a little over the logged-in limit is refused, one under it is read
        sock.sendall(frame(deflated([b"\n" * 90_000]), rsv1=True))
        sock.sendall(frame(deflated([b"\n" * 200_000]), rsv1=True))
        assert close_code(sock) == 1009
        sock.close()
        assert_still_served(bystander)


def test_configured_message_limit_bounds_inflated_size(start_adapter):
    _adapter, port = ws_adapter(start_adapter, web_stomp_max_frame_size=5000)
    sock = raw_ws(port, deflate=True)
    # 6000 bytes inflated from about 30 on the wire: over web_stomp.ws_opts.max_frame_size
    sock.sendall(frame(deflated([b"\n" * 6000]), rsv1=True))
    assert close_code(sock) == 1009
    sock.close()


def test_compression_budget_exhausted_serves_uncompressed(start_adapter):
    # room for the compression state of one WebSocket: the second is served uncompressed
    adapter, port = ws_adapter(start_adapter, web_stomp_compress_budget=CONTEXT_BYTES)
    with open_ws(port, compression="deflate") as first, open_ws(port, compression="deflate") as second:
        assert first.response.headers.get("Sec-WebSocket-Extensions", "").startswith("permessage-deflate")
        assert "Sec-WebSocket-Extensions" not in second.response.headers
        for ws in (first, second):
            ws.send(CONNECT)
            assert command(recv(ws)) == "CONNECTED"
        assert adapter.run(_budget_used(adapter)) == CONTEXT_BYTES
    deadline = time.monotonic() + 10
    while adapter.run(_budget_used(adapter)) and time.monotonic() < deadline:
        time.sleep(0.05)  # the share comes back when the adapter sees the socket go
    assert adapter.run(_budget_used(adapter)) == 0
    with open_ws(port, compression="deflate") as again:
        assert again.response.headers.get("Sec-WebSocket-Extensions", "").startswith("permessage-deflate")


async def _budget_used(adapter) -> int:  # type: ignore[no-untyped-def]
    return int(adapter.server.context.ws_compression.used)
