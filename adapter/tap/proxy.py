"""The tap's proxy: the asyncio shell that passes bytes between STOMP clients and the upstream.

Owns the listening sockets, the pairs of connections (``TappedConnection``) and their life: every byte read
from one side is written to the other unchanged and in order, before anything else is done with
it; only then does the connection's recorder (adapter/tap/recorder.py) look at it.  Each side's
reading pauses while the other side's write buffer is full (asyncio's flow control), so a slow
reader holds the writer back exactly as a direct connection would, and the tap buffers no more
than the transports' high-water marks per connection.  Each read is written on in one write.
With ``tcp_nodelay`` off (``--tcp-nodelay false``; asyncio sets it on every TCP socket) the
kernel also coalesces small writes on both sockets while an earlier one is not acknowledged
(Nagle's algorithm): the broker and the client read fewer, larger segments, which raises the
throughput and the tail latency (docs/performance.md, "The recording tap").

Life of a connection: the tap accepts the client and stops reading from it until the upstream
connection is open.  If the upstream cannot be reached (refused, unreachable, TLS handshake
failed, ``connect_timeout`` exceeded) the client's connection is reset at once (TCP RST, not a
graceful close): nothing was read from it and nothing is sent to it.  An end of stream on one
side is passed on as an end of stream to the other (half-close; over TLS to the upstream, which
asyncio cannot half-close, the upstream connection is closed once what the client sent is
written); the pair is done when both sides are closed.  A side that fails or resets closes the
other after what was already read from it has been written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..busy_poll import NO_POLL, BusyPoller, NoPoll
from ..busy_poll import install as install_busy_poll
from ..busy_poll import uninstall as uninstall_busy_poll
from ..stomp.codec import FrameLimits
from .recorder import MAX_RECORD_BYTES, Batches, ConnectionRecorder, DirectionRecorder, Emit, ParseBudget

log = logging.getLogger("adapter.tap")

# the reads waiting to be recorded are scanned and written together this often (the recorder's
# per-read work paid once per flush: docs/performance.md, "The recording tap"), at once for a
# direction that holds DIRECTION_WAITING bytes of them, and all of them past WAITING bytes
FLUSH_SECONDS = 0.02
DIRECTION_WAITING = 256 * 1024
WAITING = 32 * 1024 * 1024


@dataclass(frozen=True)
class TapSettings:
    listeners: list[tuple[str, int]]
    upstream: tuple[str, int]
    upstream_tls: ssl.SSLContext | None = None
    upstream_server_name: str | None = None
    # the CAs the upstream's certificate is checked against, as the log names them ("" when it
    # is not checked): a refused certificate's log line says where the tap looked
    upstream_trust: str = ""
    record_bodies: bool = False
    limits: FrameLimits = field(default_factory=lambda: FrameLimits(64 * 1024 * 1024, 10_000, 1024 * 1024))
    parse_buffer_bytes: int = 256 * 1024 * 1024
    max_record_bytes: int = MAX_RECORD_BYTES
    connect_timeout: float = 10.0
    # TCP_NODELAY on both sockets of a connection; off, the kernel coalesces small writes (Nagle)
    tcp_nodelay: bool = True
    # microseconds the loop polls after a read before it sleeps (adapter/busy_poll.py; 0: none)
    busy_poll_microseconds: int = 0


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return host_port(str(peer[0]), int(peer[1]))
    return str(peer)


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _set_nodelay(transport: asyncio.BaseTransport, on: bool) -> None:
    """TCP_NODELAY on the transport's socket (asyncio and uvloop set it on every TCP socket)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if on else 0)


def _reset(transport: asyncio.Transport) -> None:
    """Close with a TCP RST: what a client of a refused connection should see."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class TappedConnection:
    """One client and its upstream connection."""

    __slots__ = (
        "tap",
        "client",
        "upstream",
        "recorder",
        "_record_in",
        "_record_out",
        "bytes_in",
        "bytes_out",
        "_connecting",
        "_early",
        "_client_eof",
        "_upstream_eof",
        "_client_lost",
        "_upstream_lost",
        "_ended_by",
        "_done",
    )

    def __init__(self, tap: Tap, client: asyncio.Transport, listen: str) -> None:
        self.tap = tap
        self.client = client
        self.upstream: asyncio.Transport | None = None
        self.bytes_in = 0
        self.bytes_out = 0
        self._client_eof = self._upstream_eof = False
        self._client_lost = False
        self._upstream_lost = False
        self._ended_by: tuple[str, str] | None = None
        self._done = False
        # what a client sends before the upstream answers: its reading is paused at once, but an
        # event loop may already hold one read (uvloop does), kept here until the upstream is open
        self._early: list[bytes] | None = []
        client.pause_reading()
        self.recorder = tap.recorder_for(_peer(client), listen)
        self._record_in: DirectionRecorder | None = None
        self._record_out: DirectionRecorder | None = None
        if self.recorder is not None:
            self._record_in, self._record_out = self.recorder.inbound, self.recorder.outbound
        tap.links.add(self)
        self._connecting: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        tap = self.tap
        settings = tap.settings
        host, port = settings.upstream
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(settings.connect_timeout):
                transport, _ = await loop.create_connection(
                    lambda: UpstreamSide(self),
                    host,
                    port,
                    ssl=settings.upstream_tls,
                    server_hostname=(settings.upstream_server_name or host)
                    if settings.upstream_tls
                    else None,
                )
        except (OSError, TimeoutError, ssl.SSLError, ValueError) as error:
            self._connecting = None
            tap.upstream_failures += 1
            reason = (
                f"timed out after {settings.connect_timeout:g} s"
                if isinstance(error, TimeoutError)
                else error
            )
            self._end("upstream", f"upstream connect failed: {reason}")
            trusted = (
                f"; CAs trusted: {settings.upstream_trust}"
                if isinstance(error, ssl.SSLCertVerificationError) and settings.upstream_trust
                else ""
            )
            log.warning(
                "tap: upstream %s not reachable (%s%s): client %s reset",
                tap.upstream_label,
                reason,
                trusted,
                self.peer,
            )
            self._upstream_lost = True
            if not self._client_lost:
                _reset(self.client)
            self._maybe_done()
            return
        self._connecting = None
        self.upstream = transport
        _set_nodelay(transport, settings.tcp_nodelay)
        _set_nodelay(self.client, settings.tcp_nodelay)
        early, self._early = self._early, None
        for data in early or ():
            self.from_client(data)
        if self._client_eof:
            self.client_eof()
        if self._client_lost:  # the client went away while the upstream was being reached
            transport.close()
            return
        self.client.resume_reading()

    @property
    def peer(self) -> str:
        return self.recorder.client if self.recorder is not None else _peer(self.client)

    def _end(self, by: str, reason: str) -> None:
        if self._ended_by is None:
            self._ended_by = (by, reason)

    # ------------------------------------------------------------------ bytes
    def from_client(self, data: bytes) -> None:
        upstream = self.upstream
        if upstream is None:
            if self._early is not None:
                self._early.append(data)
            return
        upstream.write(data)
        self.bytes_in += len(data)
        if self._record_in is not None:
            self._record_in.feed(data, time.time_ns())

    def from_upstream(self, data: bytes) -> None:
        self.client.write(data)
        self.bytes_out += len(data)
        if self._record_out is not None:
            self._record_out.feed(data, time.time_ns())

    # ------------------------------------------------------------------ ends of stream
    def client_eof(self) -> bool:
        self._client_eof = True
        self._end("client", "client closed its side (end of stream)")
        upstream = self.upstream
        if upstream is not None and not upstream.is_closing():
            if upstream.can_write_eof():
                upstream.write_eof()
            else:  # TLS: no half-close; what was written is still sent before the close
                upstream.close()
        if self._upstream_eof:
            self.close()
        return True  # keep our sending side to the client open

    def upstream_eof(self) -> bool:
        self._upstream_eof = True
        self._end("upstream", "upstream closed its side (end of stream)")
        if not self.client.is_closing():
            self.client.write_eof()
        if self._client_eof:
            self.close()
        return True

    def client_lost(self, error: Exception | None) -> None:
        self._client_lost = True
        self._end("client", f"client connection lost: {_describe(error)}" if error else "client closed")
        if self._connecting is not None:
            self._connecting.cancel()
            self._upstream_lost = True
        elif self.upstream is not None and not self.upstream.is_closing():
            self.upstream.close()
        self._maybe_done()

    def upstream_lost(self, error: Exception | None) -> None:
        self._upstream_lost = True
        self._end("upstream", f"upstream connection lost: {_describe(error)}" if error else "upstream closed")
        if isinstance(error, ssl.SSLError):
            # a refusal after the handshake (TLS 1.3 sends "certificate required" then): the
            # operator must see it as a connect failure is seen, not only in the recording
            log.warning(
                "tap: TLS with upstream %s failed (%s): client %s closed",
                self.tap.upstream_label,
                error,
                self.peer,
            )
        if not self.client.is_closing():
            self.client.close()
        self._maybe_done()

    def close(self, by: str | None = None, reason: str = "") -> None:
        """Close both sides (after what is buffered for them is written)."""
        if by is not None:
            self._end(by, reason)
        if self._connecting is not None:
            self._connecting.cancel()
        for transport in (self.client, self.upstream):
            if transport is not None and not transport.is_closing():
                transport.close()

    def abort(self) -> None:
        for transport in (self.client, self.upstream):
            if transport is not None:
                transport.abort()

    def _maybe_done(self) -> None:
        if self._done or not (self._client_lost and self._upstream_lost):
            return
        self._done = True
        self.tap.finished(self)
        by, reason = self._ended_by or ("tap", "closed")
        if self.recorder is not None:
            self.recorder.close(
                time.time(), by=by, reason=reason, bytes_in=self.bytes_in, bytes_out=self.bytes_out
            )

    # ------------------------------------------------------------------ flow control
    def pause_client_reading(self) -> None:
        if not self.client.is_closing():
            self.client.pause_reading()

    def resume_client_reading(self) -> None:
        if not self.client.is_closing():
            self.client.resume_reading()

    def pause_upstream_reading(self) -> None:
        if self.upstream is not None and not self.upstream.is_closing():
            self.upstream.pause_reading()

    def resume_upstream_reading(self) -> None:
        if self.upstream is not None and not self.upstream.is_closing():
            self.upstream.resume_reading()


class ClientSide(asyncio.Protocol):
    def __init__(self, tap: Tap, listen: str) -> None:
        self._tap = tap
        self._listen = listen
        self._busy_poll = tap.busy_poll
        self.link: TappedConnection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.link = TappedConnection(self._tap, transport, self._listen)  # type: ignore[arg-type]  # a stream transport

    def data_received(self, data: bytes) -> None:
        self._busy_poll.touch()
        assert self.link is not None
        self.link.from_client(data)

    def eof_received(self) -> bool:
        assert self.link is not None
        return self.link.client_eof()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.link is not None:
            self.link.client_lost(exc)

    def pause_writing(self) -> None:  # the client reads slower than the upstream sends
        assert self.link is not None
        self.link.pause_upstream_reading()

    def resume_writing(self) -> None:
        assert self.link is not None
        self.link.resume_upstream_reading()


class UpstreamSide(asyncio.Protocol):
    def __init__(self, link: TappedConnection) -> None:
        self.link = link
        self._busy_poll = link.tap.busy_poll

    def data_received(self, data: bytes) -> None:
        self._busy_poll.touch()
        self.link.from_upstream(data)

    def eof_received(self) -> bool:
        keep_open = self.link.upstream_eof()
        # TLS has no half-close in asyncio: the transport closes whatever is returned, and
        # returning True only adds a warning to the log on every close
        return keep_open and self.link.tap.settings.upstream_tls is None

    def connection_lost(self, exc: Exception | None) -> None:
        self.link.upstream_lost(exc)

    def pause_writing(self) -> None:  # the upstream reads slower than the client sends
        self.link.pause_client_reading()

    def resume_writing(self) -> None:
        self.link.resume_client_reading()


class Tap:
    """The proxy: its listeners, its links, and where their records go (``emit``)."""

    def __init__(
        self, settings: TapSettings, emit: Emit | None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.settings = settings
        self._emit = emit
        self._clock = clock
        self.instance = secrets.token_hex(3)
        self.upstream_label = host_port(*settings.upstream)
        self.budget = ParseBudget(settings.parse_buffer_bytes)
        self.busy_poll: BusyPoller | NoPoll = NO_POLL  # the loop's, from start() on
        self.batches = Batches(self._wake, limit=WAITING, direction_limit=DIRECTION_WAITING)
        self._flushing: asyncio.TimerHandle | None = None
        self.links: set[TappedConnection] = set()
        self.servers: list[asyncio.Server] = []
        self.connections = 0
        self.upstream_failures = 0
        # figures of the links already closed (the open ones are read from the links)
        self.closed_bytes = {"in": 0, "out": 0}
        self.closed_frames = {"in": 0, "out": 0}
        self._all_closed: asyncio.Event | None = None

    def _wake(self) -> None:
        """A read waits to be recorded: the batch is flushed in ``FLUSH_SECONDS``."""
        if self._flushing is None:
            self._flushing = asyncio.get_running_loop().call_later(FLUSH_SECONDS, self._flush)

    def _flush(self) -> None:
        self._flushing = None
        self.batches.flush()

    def recorder_for(self, client: str, listen: str) -> ConnectionRecorder | None:
        self.connections += 1
        if self._emit is None:
            return None
        return ConnectionRecorder(
            f"{self.instance}-{self.connections}",
            client=client,
            listen=listen,
            upstream=self.upstream_label,
            tls=self.settings.upstream_tls is not None,
            emit=self._emit,
            bodies=self.settings.record_bodies,
            limits=self.settings.limits,
            budget=self.budget,
            batches=self.batches,
            now=self._clock(),
            max_record_bytes=self.settings.max_record_bytes,
        )

    def finished(self, link: TappedConnection) -> None:
        self.links.discard(link)
        self.closed_bytes["in"] += link.bytes_in
        self.closed_bytes["out"] += link.bytes_out
        if link.recorder is not None:
            self.closed_frames["in"] += link.recorder.inbound.frames
            self.closed_frames["out"] += link.recorder.outbound.frames
        if not self.links and self._all_closed is not None:
            self._all_closed.set()

    def figures(self, what: str) -> dict[str, int]:
        """Bytes or frames per direction, closed and open connections together."""
        if what == "bytes":
            totals = dict(self.closed_bytes)
            for link in self.links:
                totals["in"] += link.bytes_in
                totals["out"] += link.bytes_out
        else:
            totals = dict(self.closed_frames)
            for link in self.links:
                if link.recorder is not None:
                    totals["in"] += link.recorder.inbound.frames
                    totals["out"] += link.recorder.outbound.frames
        return totals

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # a round trip through the tap crosses it twice: the loop polls after a read instead of
        # sleeping, so the answer finds it awake (adapter/busy_poll.py)
        self.busy_poll = install_busy_poll(loop, self.settings.busy_poll_microseconds) or NO_POLL
        for host, port in self.settings.listeners:
            label = host_port(host, port)
            server = await loop.create_server(
                lambda label=label: ClientSide(self, label),
                host or None,
                port,
                reuse_address=True,
            )
            self.servers.append(server)
            log.info("tap: listening on %s, forwarding to %s", self.addresses[-1], self.upstream_label)

    @property
    def addresses(self) -> list[str]:
        """The addresses listened on (``--listen`` with port 0 gets its real port here)."""
        return [host_port(*sock.getsockname()[:2]) for server in self.servers for sock in server.sockets]

    async def stop(self, grace: float = 5.0) -> None:
        """Stop listening, close every connection (``by`` tap), abort those that take longer
        than ``grace`` seconds to flush."""
        if self.busy_poll is not NO_POLL:
            uninstall_busy_poll(asyncio.get_running_loop())
            self.busy_poll = NO_POLL
        for server in self.servers:
            server.close()
        if self.links:
            self._all_closed = asyncio.Event()
            for link in list(self.links):
                link.close("tap", "the tap stopped")
            try:
                async with asyncio.timeout(grace):
                    await self._all_closed.wait()
            except TimeoutError:
                for link in list(self.links):
                    link.abort()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._all_closed.wait()
        for server in self.servers:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await server.wait_closed()
        # what the links still open have read is recorded before the writer is closed
        if self._flushing is not None:
            self._flushing.cancel()
        self._flush()
