"""PROXY protocol v1 and v2 headers (adapter/server/proxy_protocol.py): whole, byte by byte, with
the STOMP bytes that follow, and every way a header can be wrong."""

from __future__ import annotations

import socket
import struct

import pytest

from adapter.server.proxy_protocol import V2_SIGNATURE, ProxyHeader, ProxyHeaderError, parse_proxy_header

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
