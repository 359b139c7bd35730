"""The PROXY protocol prelude: the one place a client's PROXY header is read, in front of every
kind of listener (TCP, TLS, WebSocket), before the first byte of what it carries.

``ProxyPrelude`` collects the header from a byte stream's first reads (TCP's STOMP, the HTTP
request of a WebSocket) and hands over the client's address and the bytes after the header;
``before_tls`` reads it off an accepted socket before the TLS handshake (the header comes first
on the wire, and the TLS transport must not see it).  Both check the sender against
``adapter.proxy_protocol_trusted`` first, log and count a refusal (``connections_refused``:
proxy_untrusted, proxy_header, proxy_timeout) the same way, and leave the parsing to the pure
parser (adapter/server/proxy_protocol.py).  The listeners only close what was refused.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import socket
from typing import TYPE_CHECKING, NamedTuple, Protocol

from .proxy_protocol import ProxyHeader, ProxyHeaderError, ProxyTrust, parse_proxy_header

if TYPE_CHECKING:
    from .stats import ServerStats

__all__ = [
    "Opened",
    "ProxyPrelude",
    "address",
    "before_tls",
    "is_loopback",
    "readable",
    "refuse_untrusted_proxy",
]

log = logging.getLogger("adapter.connection")

# Bytes looked at for a PROXY header: v2's largest (16 + 65535), v1's are at most 107.
_PROXY_PEEK = 16 + 65535
_TIMED_OUT = "no complete PROXY header within the login timeout"


class Counted(Protocol):
    @property
    def stats(self) -> ServerStats: ...


class Guarded(Counted, Protocol):
    @property
    def proxy_trust(self) -> ProxyTrust: ...

    @property
    def login_timeout(self) -> float: ...


def address(host: str, port: int) -> str:
    """A peer as the log lines write it (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@functools.lru_cache(maxsize=256)  # clients come from a few addresses; parsing one is ~1 % of a connect
def is_loopback(host: str) -> bool:
    try:
        parsed = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return parsed.is_loopback


def refuse_untrusted_proxy(server: Counted, peer: str) -> None:
    """Log and count a connection that every listener closes before reading a byte, because
    its peer may not send a PROXY header (adapter.proxy_protocol_trusted)."""
    log.warning(
        "closing connection from %s: a PROXY header is not accepted from this address "
        "(not in adapter.proxy_protocol_trusted)",
        peer,
    )
    server.stats.connections_refused["proxy_untrusted"] += 1


class Opened(NamedTuple):
    """A complete PROXY header: the client's address (None: the header carried none) and the
    bytes that followed it in the same read."""

    source: tuple[str, int] | None
    rest: bytes


class ProxyPrelude:
    """The PROXY header at the start of one byte stream (see the module docstring).  ``what``
    names the connection in the refusal's log line ("connection", "WebSocket connection")."""

    __slots__ = ("_buffered", "_log", "_stats", "_what", "refusal")

    def __init__(self, stats: ServerStats, what: str = "connection", logger: logging.Logger = log) -> None:
        self._stats = stats
        self._what = what
        self._log = logger
        self._buffered = b""  # the header's start until it is complete
        self.refusal = ""  # why the stream was refused (the close reason), "" while it is not

    def trusted(self, trust: ProxyTrust, host: str, peer: str) -> bool:
        """May ``host`` send a header at all?  A refusal is logged, counted and kept."""
        if trust.trusts(host):
            return True
        refuse_untrusted_proxy(self, peer)
        self.refusal = "PROXY protocol: not a trusted proxy"
        return False

    @property
    def stats(self) -> ServerStats:
        return self._stats

    def opened(self, data: bytes, peer: str) -> Opened | None:
        """The header and what follows once it is complete; None while it is not, or when it is
        not a valid header (then ``refusal`` says why: the stream is closed at once, there is no
        peer yet to answer)."""
        buffered = self._buffered + data
        try:
            header = parse_proxy_header(buffered)
        except ProxyHeaderError as error:
            self._log.warning("closing %s from proxy %s: %s", self._what, peer, error)
            self._stats.connections_refused["proxy_header"] += 1
            self._buffered = b""
            self.refusal = f"invalid PROXY protocol header: {error}"
            return None
        if header is None:
            self._buffered = buffered
            return None
        self._buffered = b""
        return Opened(header.source, buffered[header.length :])

    def timed_out(self, peer: str, *, logged: bool = True) -> str:
        """No complete header in time: counted (and logged unless the caller logs it); the
        close reason."""
        if logged:
            self._log.warning("closing %s from proxy %s: %s", self._what, peer, _TIMED_OUT)
        self._stats.connections_refused["proxy_timeout"] += 1
        self._buffered = b""
        return f"PROXY protocol: {_TIMED_OUT}"


async def before_tls(
    server: Guarded,
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    host: str,
    peer: str,
    logger: logging.Logger = log,
) -> ProxyHeader | None:
    """The header off an accepted socket, before its TLS handshake, within the login timeout;
    None: refused (logged, counted, the socket closed)."""
    if not server.proxy_trust.trusts(host):
        refuse_untrusted_proxy(server, peer)
        sock.close()
        return None
    try:
        try:
            async with asyncio.timeout(server.login_timeout):
                return await read_proxy_header(loop, sock)
        except TimeoutError:
            raise ProxyHeaderError(_TIMED_OUT, timed_out=True) from None
    except ProxyHeaderError as error:
        logger.warning("closing connection from proxy %s: %s", peer, error)
        server.stats.connections_refused["proxy_timeout" if error.timed_out else "proxy_header"] += 1
        sock.close()
        return None


async def read_proxy_header(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> ProxyHeader:
    """Read exactly the PROXY header from an accepted socket and nothing after it (the TLS
    handshake that follows belongs to the TLS transport).  Each time the socket is readable:
    peek, parse what has come so far, and take off the socket only the bytes that belong to the
    header (all of them while it is incomplete), so that waiting for the rest of a slow header
    really waits: bytes left in the kernel's buffer would keep the socket readable."""
    received = b""
    while True:
        await readable(loop, sock)
        try:
            peeked = sock.recv(_PROXY_PEEK - len(received), socket.MSG_PEEK)
        except BlockingIOError:
            continue
        if not peeked:
            raise ProxyHeaderError("the connection closed before its PROXY header was complete")
        header = parse_proxy_header(received + peeked)
        wanted = len(peeked) if header is None else header.length - len(received)
        taken = 0
        while taken < wanted:  # already in the kernel's buffer: no waiting
            taken += len(sock.recv(wanted - taken))
        if header is not None:
            return header
        received += peeked


async def readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Wait until ``sock`` (non-blocking, outside any transport) has something to read: bytes,
    a connection to accept, or its end."""
    ready: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
