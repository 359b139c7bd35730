"""The PROXY protocol header (HAProxy's, versions 1 and 2) that a load balancer puts before the
first byte of the client's stream, so the adapter learns the client's real address.

Sans-IO: ``parse_proxy_header(data)`` takes the bytes received so far and returns the client's
address and the header's length, ``None`` while the header is incomplete, or raises
``ProxyHeaderError`` for anything that is not a valid header (a missing header included: with
``stomp.proxy_protocol = true`` every connection must start with one).  The shell feeds what
follows the header to the STOMP parser.

Why by hand: the two formats are short and fixed (HAProxy's proxy-protocol.txt), the parser must
work on a partial buffer inside the shell's own read path, and it is tested here byte by byte
(tests/unit/test_proxy_protocol.py).

Also owns ``ProxyTrust``: the peers a header is believed from (``adapter.proxy_protocol_trusted``).
A header is only as true as its sender: without the list, anyone who reaches the port can
claim any address (127.0.0.1 past ``loopback_users``, say).

Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable
from dataclasses import dataclass

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_PREFIX = b"PROXY "
V1_MAX_LENGTH = 107  # the longest v1 line, CRLF included
_V2_HEAD = struct.Struct(">BBH")  # version/command, family/transport, address length


class ProxyHeaderError(ValueError):
    """Not a valid PROXY protocol header (``timed_out``: not a complete one in time)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """``source`` is the client's (host, port), or None when the proxy sent none (v1 UNKNOWN, v2
    LOCAL: a health check of the proxy itself, or an address family it does not describe)."""

    source: tuple[str, int] | None
    length: int  # bytes of the stream the header took


_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class ProxyTrust:
    """The peers (addresses and networks) whose PROXY header is believed; empty: every peer,
    as the plugins do.  ``trusts`` is asked once per connection, on listeners that expect a
    header only."""

    networks: tuple[_Network, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> ProxyTrust:
        """From addresses and CIDR networks as an operator writes them (``10.0.0.0/8``,
        ``192.0.2.7``, ``2001:db8::/32``); ValueError names a bad entry."""
        networks = []
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=True))
            except ValueError as error:
                raise ValueError(f"{entry!r} is not an address or network ({error})") from None
        return cls(tuple(networks))

    @property
    def everyone(self) -> bool:
        return not self.networks

    def trusts(self, host: str) -> bool:
        """Whether a header from the peer at ``host`` (the socket's address) is believed."""
        if not self.networks:
            return True
        try:
            address = ipaddress.ip_address(host.split("%")[0])  # an IPv6 scope is no part of it
        except ValueError:
            return False  # not an IP peer (a Unix socket): never listed
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # a dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d
        return any(address in network for network in self.networks)


def parse_proxy_header(data: bytes) -> ProxyHeader | None:
    """The header at the start of ``data``; None if more bytes are needed."""
    if data[:12] == V2_SIGNATURE[: len(data[:12])] and data[:1] == b"\r":
        return _parse_v2(data) if len(data) >= 16 else None
    if data[:6] == V1_PREFIX[: len(data[:6])]:
        return _parse_v1(data) if len(data) >= 6 else None
    raise ProxyHeaderError(f"the connection does not start with a PROXY protocol header: {data[:16]!r}")


def _parse_v1(data: bytes) -> ProxyHeader | None:
    end = data.find(b"\r\n", 0, V1_MAX_LENGTH)
    if end < 0:
        if len(data) >= V1_MAX_LENGTH:
            raise ProxyHeaderError("PROXY v1 line longer than 107 bytes")
        return None
    parts = data[:end].split(b" ")
    if len(parts) >= 2 and parts[1] == b"UNKNOWN":
        return ProxyHeader(None, end + 2)
    if len(parts) != 6 or parts[1] not in (b"TCP4", b"TCP6"):
        raise ProxyHeaderError(f"malformed PROXY v1 line {data[:end]!r}")
    try:
        source = ipaddress.ip_address(parts[2].decode("ascii"))
        ipaddress.ip_address(parts[3].decode("ascii"))
        port = int(parts[4])
        int(parts[5])
    except (UnicodeDecodeError, ValueError):
        raise ProxyHeaderError(f"malformed PROXY v1 addresses {data[:end]!r}") from None
    if (source.version == 4) != (parts[1] == b"TCP4") or not 0 <= port <= 65535 or not parts[4].isdigit():
        raise ProxyHeaderError(f"malformed PROXY v1 addresses {data[:end]!r}")
    return ProxyHeader((str(source), port), end + 2)


def _parse_v2(data: bytes) -> ProxyHeader | None:
    if data[:12] != V2_SIGNATURE:
        raise ProxyHeaderError("bad PROXY v2 signature")
    version_command, family, length = _V2_HEAD.unpack_from(data, 12)
    if version_command >> 4 != 2 or version_command & 0x0F not in (0, 1):
        raise ProxyHeaderError(f"unsupported PROXY v2 version/command {version_command:#04x}")
    total = 16 + length
    if len(data) < total:
        return None
    if version_command & 0x0F == 0:  # LOCAL: the proxy's own connection (health check)
        return ProxyHeader(None, total)
    address = data[16:total]
    if family == 0x11:  # TCP over IPv4
        if length < 12:
            raise ProxyHeaderError("PROXY v2 IPv4 addresses truncated")
        source = str(ipaddress.IPv4Address(address[0:4]))
        port = struct.unpack_from(">H", address, 8)[0]
        return ProxyHeader((source, port), total)
    if family == 0x21:  # TCP over IPv6
        if length < 36:
            raise ProxyHeaderError("PROXY v2 IPv6 addresses truncated")
        source = str(ipaddress.IPv6Address(address[0:16]))
        port = struct.unpack_from(">H", address, 32)[0]
        return ProxyHeader((source, port), total)
    return ProxyHeader(None, total)  # UNSPEC, UDP, unix sockets: no client address to use
