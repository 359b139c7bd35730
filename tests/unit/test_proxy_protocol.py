"""PROXY protocol v1 and v2 headers (adapter/server/proxy_protocol.py): whole, byte by byte, with
the STOMP bytes that follow, and every way a header can be wrong; and the TLS listeners' reader
of the header (read_proxy_header) on a local socket pair."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from adapter.server.proxy_prelude import Opened, ProxyPrelude, read_proxy_header
from adapter.server.proxy_protocol import (
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    ProxyTrust,
    parse_proxy_header,
)
from adapter.server.stats import ServerStats

STOMP = b"CONNECT\naccept-version:1.2\n\n\0"


def v2(command: int, family: int, address: bytes) -> bytes:
    return V2_SIGNATURE + struct.pack(">BBH", 0x20 | command, family, len(address)) + address


V2_TCP4 = v2(
    1, 0x11, socket.inet_aton("10.1.2.3") + socket.inet_aton("10.0.0.1") + struct.pack(">HH", 40000, 61613)
)
V2_TCP6 = v2(
    1, 0x21, socket.inet_pton(socket.AF_INET6, "2001:db8::7") + bytes(16) + struct.pack(">HH", 5, 61613)
)

CASES = [
    (b"PROXY TCP4 10.1.2.3 10.0.0.1 40000 61613\r\n", ("10.1.2.3", 40000)),
    (b"PROXY TCP6 2001:db8::7 ::1 5 61613\r\n", ("2001:db8::7", 5)),
    (b"PROXY UNKNOWN\r\n", None),
    (b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n", None),
    (V2_TCP4, ("10.1.2.3", 40000)),
    (V2_TCP6, ("2001:db8::7", 5)),
    (v2(0, 0x00, b""), None),  # LOCAL: the proxy's health check
    (v2(1, 0x31, bytes(216)), None),  # a unix socket: no address to use
]


@pytest.mark.parametrize(("header", "source"), CASES)
def test_whole_header_then_stomp(header: bytes, source: tuple[str, int] | None) -> None:
    assert parse_proxy_header(header + STOMP) == ProxyHeader(source, len(header))


@pytest.mark.parametrize(("header", "source"), CASES)
def test_byte_at_a_time(header: bytes, source: tuple[str, int] | None) -> None:
    for end in range(len(header)):
        assert parse_proxy_header(header[:end]) is None, end
    assert parse_proxy_header(header) == ProxyHeader(source, len(header))


@pytest.mark.parametrize(
    "data",
    [
        STOMP,  # no header at all
        b"GET / HTTP/1.1\r\n\r\n",
        b"PROXY TCP4 10.1.2.3 10.0.0.1 40000\r\n",  # a field missing
        b"PROXY TCP4 2001:db8::7 ::1 5 61613\r\n",  # family and address disagree
        b"PROXY TCP4 10.1.2.300 10.0.0.1 1 2\r\n",
        b"PROXY TCP4 10.1.2.3 10.0.0.1 99999 2\r\n",
        b"PROXY UDP4 10.1.2.3 10.0.0.1 1 2\r\n",
        b"PROXY TCP4 " + b"1" * 120,  # no CRLF within 107 bytes
        V2_SIGNATURE[:-1] + b"X" + V2_TCP4[12:],
        V2_SIGNATURE + struct.pack(">BBH", 0x31, 0x11, 12) + bytes(12),  # version 3
        V2_SIGNATURE + struct.pack(">BBH", 0x21, 0x11, 4) + bytes(4),  # IPv4 addresses truncated
    ],
)
def test_invalid_headers_are_refused(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        parse_proxy_header(data)


# read_proxy_header (adapter/server/proxy_prelude.py) on a socket pair: what a TLS listener reads
# before it hands the socket to the TLS transport.

TLS_HELLO = b"\x16\x03\x01\x02\x00\x01"  # the start of a TLS ClientHello record


async def feed_slowly(sock: socket.socket, data: bytes) -> None:
    for index in range(len(data)):
        sock.send(data[index : index + 1])
        await asyncio.sleep(0.002)


@pytest.mark.parametrize(("header", "source"), CASES)
async def test_read_proxy_header_takes_the_header_and_leaves_the_rest(
    header: bytes, source: tuple[str, int] | None
) -> None:
    server, client = socket.socketpair()
    with server, client:
        server.setblocking(False)
        loop = asyncio.get_running_loop()
        reading = asyncio.create_task(read_proxy_header(loop, server))
        await feed_slowly(client, header)
        client.sendall(TLS_HELLO)
        assert await asyncio.wait_for(reading, 5) == ProxyHeader(source, len(header))
        await asyncio.sleep(0.01)
        assert server.recv(64) == TLS_HELLO  # left for the TLS transport


async def test_a_partial_header_is_taken_off_the_socket_while_the_rest_is_awaited() -> None:
    """Bytes that belong to an incomplete header are consumed, so the socket is no longer
    readable and the reader truly waits (left in the kernel's buffer, they kept the socket
    readable: the reader re-peeked them in a loop, costing CPU for every slow header)."""
    server, client = socket.socketpair()
    with server, client:
        server.setblocking(False)
        reading = asyncio.create_task(read_proxy_header(asyncio.get_running_loop(), server))
        client.sendall(b"PROXY TCP4 10.1.2.3")
        await asyncio.sleep(0.05)
        assert not reading.done()
        with pytest.raises(BlockingIOError):
            server.recv(64, socket.MSG_PEEK)  # nothing left to look at again
        client.sendall(b" 10.0.0.1 40000 61613\r\n")
        assert (await asyncio.wait_for(reading, 5)).source == ("10.1.2.3", 40000)


async def test_a_connection_closed_mid_header_is_a_header_error() -> None:
    server, client = socket.socketpair()
    with server:
        server.setblocking(False)
        reading = asyncio.create_task(read_proxy_header(asyncio.get_running_loop(), server))
        client.sendall(b"PROXY TCP4 10.1")
        client.close()
        with pytest.raises(ProxyHeaderError, match="closed before"):
            await asyncio.wait_for(reading, 5)


# ------------------------------------------------------------------ ProxyTrust


def test_without_a_list_every_peer_is_trusted():
    trust = ProxyTrust.parse([])
    assert trust.everyone
    assert trust.trusts("203.0.113.9") and trust.trusts("::1") and trust.trusts("?")


@pytest.mark.parametrize(
    ("peer", "trusted"),
    [
        ("10.1.2.3", True),  # in 10.0.0.0/8
        ("11.0.0.1", False),
        ("192.0.2.7", True),  # a single address
        ("192.0.2.8", False),
        ("::ffff:10.9.9.9", True),  # an IPv4 peer on a dual-stack listener
        ("2001:db8::1", True),
        ("2001:db8::1%eth0", True),  # a scoped address: the scope is no part of the match
        ("2001:db9::1", False),
        ("127.0.0.1", False),  # loopback is not trusted unless listed
        ("?", False),  # no IP peer at all
        ("", False),
    ],
)
def test_only_listed_peers_are_trusted(peer, trusted):
    trust = ProxyTrust.parse(["10.0.0.0/8", "192.0.2.7", " 2001:db8::/32 "])
    assert not trust.everyone
    assert trust.trusts(peer) is trusted


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "lb.example", "10.1.2.3/8", ""])
def test_a_bad_entry_is_named(entry):
    with pytest.raises(ValueError, match=f"{entry!r} is not an address or network"):
        ProxyTrust.parse(["192.0.2.1", entry])


# ProxyPrelude (adapter/server/proxy_prelude.py): the header at the start of a byte stream, as
# the TCP and WebSocket listeners read it; whole, a byte at a time, and with what follows.
@pytest.mark.parametrize("split", ["whole", "bytewise"])
def test_the_prelude_hands_over_the_address_and_the_bytes_after_the_header(split: str) -> None:
    prelude = ProxyPrelude(ServerStats())
    header = b"PROXY TCP4 203.0.113.7 127.0.0.1 5000 61613\r\n"
    if split == "whole":
        assert prelude.opened(header + b"CONNECT\n", "10.0.0.1:1") == Opened(
            ("203.0.113.7", 5000), b"CONNECT\n"
        )
    else:  # incomplete until its CRLF; the bytes after it are the stream's, not the prelude's
        assert all(prelude.opened(bytes([byte]), "10.0.0.1:1") is None for byte in header[:-1])
        assert prelude.opened(header[-1:], "10.0.0.1:1") == Opened(("203.0.113.7", 5000), b"")
    assert prelude.refusal == ""


def test_the_prelude_refuses_what_is_not_a_header_and_counts_it() -> None:
    stats = ServerStats()
    prelude = ProxyPrelude(stats)
    assert prelude.opened(b"CONNECT\naccept-version:1.2\n\n\0", "10.0.0.1:1") is None
    assert prelude.refusal.startswith("invalid PROXY protocol header: ")
    assert stats.connections_refused["proxy_header"] == 1


def test_the_prelude_counts_a_header_late_at_the_timeout_and_an_untrusted_peer() -> None:
    stats = ServerStats()
    prelude = ProxyPrelude(stats)
    assert prelude.opened(b"PROXY TCP4 203.0", "10.0.0.1:1") is None and prelude.refusal == ""
    reason = prelude.timed_out("10.0.0.1:1")
    assert reason == "PROXY protocol: no complete PROXY header within the login timeout"
    assert not prelude.trusted(ProxyTrust.parse(["192.0.2.0/24"]), "10.0.0.1", "10.0.0.1:1")
    assert stats.connections_refused == {"proxy_timeout": 1, "proxy_untrusted": 1}
