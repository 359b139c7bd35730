"""The asyncio shell around one STOMP client: socket in, session, AMQP link, socket out.

Owns the client socket, the frame pump that drives the session's operation generators, the
write buffer (flushed once per loop iteration), heart-beat and login timers, and the flow
control between the two sockets.  No protocol decisions are made here: they are in
``adapter/session.py``.

The pump runs inside ``data_received`` as long as operations need no reply (SEND, ACK, MESSAGE
...), so the per-message path has no task, future or queue.  When an operation must wait for the
broker (declare, consume, login ...), the pump hands over to a task and stops reading the
socket until the reply arrives, which keeps frames strictly in order.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import os
import socket
import ssl
import time
from collections.abc import Generator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from ..amqp import wire
from ..amqp.connection import AmqpConnection, AmqpError
from ..mapping import operations as ops
from ..mapping.budget import BudgetExceeded
from ..mapping.destinations import ProcessingError
from ..session import Session, SessionSettings, State, new_session_id
from ..stomp.codec import FrameError, FrameLimits, FrameParser
from ..stomp.frame import Frame
from .dispatching import DispatchLink
from .fdlimit import EXHAUSTED
from .proxy_protocol import ProxyHeaderError, ProxyTrust, parse_proxy_header

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from .amqp_pool import AmqpReuse
    from .brokers import BrokerNodes
    from .fdlimit import DescriptorWatch
    from .stats import ServerStats
    from .wsdeflate import CompressionBudget


class ServerState(Protocol):
    """What a connection may use of the server that accepted it, and nothing more: settings,
    the budgets and registries shared by all connections, and a task spawner.  The listener's
    ``Server`` implements it; a new transport (TLS, WebSocket, a test's in-memory socket) hands
    ``ClientConnection`` the same object, so the shell never sees listeners or sockets."""

    session_settings: SessionSettings
    broker: BrokerSettings
    nodes: BrokerNodes
    proxy_protocol: bool  # the TCP listeners' setting (TLS and WebSocket read theirs first)
    proxy_trust: ProxyTrust  # adapter.proxy_protocol_trusted: whose PROXY header is believed
    login_timeout: float
    heartbeat_tolerance: float
    frame_timeout: float
    incomplete_input: int  # bytes of unfinished frames held by all connections
    incomplete_input_budget: int
    ws_compression: CompressionBudget  # permessage-deflate state of all WebSockets
    descriptors: DescriptorWatch
    stats: ServerStats
    connections: set[ClientConnection]  # logged in or logging in; shutdown closes them
    amqp_reuse: AmqpReuse | None  # adapter.amqp_connection_reuse: the pool, None when off
    open_sockets: set[Any]  # every socket until connection_lost; shutdown aborts the rest

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...

    def tune_socket(self, sock: socket.socket) -> None: ...

    def add_finished(self, connection: ClientConnection) -> None: ...


# After the adapter closes a connection, how long it keeps reading (and dropping) what the
# client still sends, so that the client reads the final ERROR instead of a TCP reset.
_LINGER_SECONDS = 2.0

log = logging.getLogger("adapter.connection")

# Stop reading from the client while this many bytes of parsed-but-unhandled input wait
_MAX_BUFFERED_INPUT = 1024 * 1024
# receipts a connection times at once (see _receipt_asked)
_MAX_TIMED_RECEIPTS = 10_000
# never answered by a RECEIPT; plain strings: comparing with the enum members costs more
_ANSWERED_BY_CONNECTED = frozenset({"CONNECT", "STOMP"})
# How long DISCONNECT waits for outstanding publisher confirms before closing anyway
_CONFIRM_WAIT_ON_DISCONNECT = 30.0


class Lifecycle(Enum):
    """Where a client connection is.  ``ClientConnection._enter`` allows only the moves in
    ``_NEXT``; ``_closed`` and ``_finished`` are kept in step with it (plain attributes, read on
    every message)."""

    NEW = "new"  # constructed, no socket yet
    PROXY_HEADER = "proxy-header"  # stomp.proxy_protocol: waiting for the client's address
    OPEN = "open"  # STOMP frames are read and handled (before and after CONNECT)
    CLOSED = "closed"  # closed by either side: nothing more is read, handled or sent
    FINISHED = "finished"  # counted and logged; the AMQP link is closing or closed


_NEXT: dict[Lifecycle, frozenset[Lifecycle]] = {
    Lifecycle.NEW: frozenset({Lifecycle.PROXY_HEADER, Lifecycle.OPEN, Lifecycle.CLOSED}),
    Lifecycle.PROXY_HEADER: frozenset({Lifecycle.OPEN, Lifecycle.CLOSED}),
    Lifecycle.OPEN: frozenset({Lifecycle.CLOSED}),
    Lifecycle.CLOSED: frozenset({Lifecycle.FINISHED}),
    Lifecycle.FINISHED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """How AMQP connections are opened (the nodes themselves are in server.nodes)."""

    heartbeat: int
    connect_timeout: float
    # for amqps:// nodes: the TLS context (CA, client certificate, verification, minimum
    # version) and the name to check the certificate against (None: the node's host name)
    tls: ssl.SSLContext | None = None
    tls_server_name: str | None = None


def refuse_untrusted_proxy(server: ServerState, peer: str) -> None:
    """Log and count a connection that every listener closes before reading a byte, because
    its peer may not send a PROXY header (adapter.proxy_protocol_trusted)."""
    log.warning(
        "closing connection from %s: a PROXY header is not accepted from this address "
        "(not in adapter.proxy_protocol_trusted)",
        peer,
    )
    server.stats.connections_refused["proxy_untrusted"] += 1


@functools.lru_cache(maxsize=256)  # clients come from a few addresses; parsing one is ~1 % of a connect
def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


class ClientConnection(asyncio.Protocol):
    """One STOMP client.  ``proxy_protocol`` (default: the TCP listeners' setting) makes it
    expect a PROXY header first; ``label`` names the transport in the log ("WebSocket ");
    ``listener`` is the kind of listener in the metrics: tcp, tls or websocket (by default
    websocket for a labelled transport, since the WebSocket transport is the one that labels
    itself, else tcp)."""

    def __init__(
        self,
        server: ServerState,
        *,
        proxy_protocol: bool | None = None,
        label: str = "",
        listener: str | None = None,
        client_address: tuple[str, int] | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self._server = server
        # the client's address from a PROXY header read before the TLS handshake (listener.py)
        self._client_address = client_address
        self._expect_proxy_header = server.proxy_protocol if proxy_protocol is None else proxy_protocol
        self._label = label
        self.listener = listener or ("websocket" if label.startswith("WebSocket") else "tcp")
        # a transport that frames each write (WebSocket: one message per STOMP frame) gets the
        # frames as separate items of one writelines call instead of joined
        self.frame_per_write = False
        # a listener may give its clients other settings (adapter.activemq_listeners: the profile)
        self._settings: SessionSettings = session_settings or server.session_settings
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.session: Session | None = None
        self._parser = FrameParser(self._settings.unauthenticated_limits)
        self._amqp: AmqpConnection | None = None
        self._out: list[bytes] = []
        self._out_large = False  # _out holds a large MESSAGE: write with writelines, unjoined
        self._flush_handle: asyncio.Handle | None = None
        # the frame being handled and its operation generator
        self._frame: Frame | None = None
        self._steps: Generator[ops.Operation, object, None] | None = None
        self._busy = False  # a task is waiting for the broker
        self._in_read = False  # handling a batch of input: whoever runs it flushes at the end
        self._linger: asyncio.TimerHandle | None = None  # after our half-close, see _close
        self._held: list[bytes] = []  # MESSAGE frames waiting for the current frame to finish
        self._delete_on_close: list[str] = []  # queues to delete before the AMQP link closes
        # activemq profile: this connection's selector subscriptions on queues (created on the first)
        self._dispatch: DispatchLink | None = None
        self._amqp_flush_handle: asyncio.Handle | None = None
        self.lifecycle = Lifecycle.NEW
        self._closed = False  # lifecycle is CLOSED or FINISHED
        self._finished = False  # lifecycle is FINISHED
        self._close_reason = ""
        self._pause_reasons: set[str] = set()
        self._read_since_check = False
        self._wrote_since_check = False
        self._timers: list[asyncio.TimerHandle] = []
        self._confirm_waiter: asyncio.Future[None] | None = None
        # incomplete input: the bytes this connection holds that are not yet a whole frame (its
        # share of server.incomplete_input), and when the frame they start began arriving
        self._held_input = 0
        self._frames_read = 0  # frames taken from the parser; a new one restarts the frame clock
        self._frames_at_start = 0
        self._frame_started: float | None = None
        self._frame_timer: asyncio.TimerHandle | None = None
        # with stomp.proxy_protocol: the start of the PROXY header until it is complete
        self._proxy_header = b""
        self.done: asyncio.Future[None] = self._loop.create_future()
        # Counters for the metrics and the close log line: plain attributes, read by
        # adapter/server/metrics.py at scrape time and added to server.stats when the
        # connection finishes (adapter/server/stats.py says why not prometheus counters).
        # time.monotonic, not loop.time: uvloop's clock has millisecond steps
        self.opened_at = time.monotonic()
        self.frames_received: dict[str, int] = {}
        self.messages_published = 0
        self.acks = 0
        self.nacks = 0
        self.bytes_received = 0
        self.bytes_sent = 0
        self.paused_seconds: dict[str, float] = {}
        self.paused_since: dict[str, float] = {}  # pause reason -> when it started
        # publisher-confirm latency: one publish per connection is timed at a time (the
        # sequence number it got, when it was sent; 0 when none is being timed), so the
        # message path pays one comparison, not a clock read and a dict entry per message
        self._timed_publish = 0
        self._timed_publish_at = 0.0
        # receipt latency: receipt-id -> (command, when its frame was read) of each receipt
        # asked for and not yet answered; only frames with a receipt header read the clock.
        # A receipt-id reused while it still waits queues its later frames in the second dict.
        self._receipts_timed: dict[str, tuple[str, float]] = {}
        self._receipts_reused: dict[str, list[tuple[str, float]]] = {}
        self._receipt_latency = server.stats.receipt_latency  # by command
        # one clock reading shared by the receipted frames of one read, and by the RECEIPTs
        # one confirm releases (0: not read yet); only valid within that read or confirm
        self._read_clock = 0.0
        self._confirm_clock = 0.0
        # per-destination counts (adapter.metrics_destinations), None when off: the message
        # path then pays one comparison
        self._destinations = server.stats.destinations

    @property
    def closed(self) -> bool:
        """Closed by either side (the AMQP connection may still be closing)."""
        return self._closed

    @property
    def finished(self) -> bool:
        """Its counters are in server.stats (see Server.add_finished)."""
        return self._finished

    def _enter(self, state: Lifecycle) -> None:
        """Move to ``state``; any other move than those of ``_NEXT`` is a bug."""
        if state not in _NEXT[self.lifecycle]:
            raise AssertionError(
                f"connection lifecycle: {self.lifecycle.value} -> {state.value} is not allowed"
            )
        self.lifecycle = state
        self._closed = state is Lifecycle.CLOSED or state is Lifecycle.FINISHED
        self._finished = state is Lifecycle.FINISHED

    # ------------------------------------------------------------------ socket events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport
        self._server.open_sockets.add(self)
        peername = transport.get_extra_info("peername")
        host, port = (peername[0], peername[1]) if peername else ("?", 0)
        self.peer = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        proxy = None
        if self._client_address is not None:
            proxy, (host, port) = self.peer, self._client_address
            self.peer = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            self._server.tune_socket(sock)
            self._server.descriptors.accepted(sock.fileno())
        self.session = Session(
            self._settings, session_id=new_session_id(os.urandom(16)), peer_is_loopback=is_loopback(host)
        )
        self.session.on_receipt = self._receipt_sent
        self._server.connections.add(self)
        self._server.stats.connections_opened[self.listener] += 1
        # the login timeout also bounds a PROXY header that arrives slowly
        self._timers.append(self._loop.call_later(self._server.login_timeout, self._login_timed_out))
        if self._expect_proxy_header:
            self._enter(Lifecycle.PROXY_HEADER)  # the peer is the proxy: wait for the client's address
            if not self._server.proxy_trust.trusts(host):
                refuse_untrusted_proxy(self._server, self.peer)
                self._refuse_proxy("not a trusted proxy", "PROXY protocol", None)
            return
        self._enter(Lifecycle.OPEN)
        self._log_opened(f" via proxy {proxy}" if proxy is not None else "")

    def _log_opened(self, via: str = "") -> None:
        if not log.isEnabledFor(logging.INFO):
            return  # the fields cost ~1 % of a connect cycle each, for nothing at WARNING
        log.info(
            "%sconnection opened peer=%s%s",
            self._label,
            self.peer,
            via,
            extra={"fields": {"event": "connection_opened", "peer": self.peer, "listener": self.listener}},
        )

    def _read_proxy_header(self, data: bytes) -> bytes | None:
        """Collect and apply the PROXY header; the bytes after it, or None while incomplete.
        A connection without a valid header is closed at once (there is no STOMP peer yet to
        send an ERROR to: the bytes may not even be STOMP)."""
        buffered = self._proxy_header + data
        try:
            header = parse_proxy_header(buffered)
        except ProxyHeaderError as error:
            self._refuse_proxy(str(error), "invalid PROXY protocol header", "proxy_header")
            return None
        if header is None:
            self._proxy_header = buffered
            return None
        self._proxy_header = b""
        self._enter(Lifecycle.OPEN)
        if header.source is not None:
            proxy = self.peer
            host, port = header.source
            self.peer = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            assert self.session is not None
            self.session.peer_is_loopback = is_loopback(host)
            self._log_opened(f" via proxy {proxy}")
        else:
            self._log_opened(" (PROXY header without a client address)")
        return buffered[header.length :]

    def _refuse_proxy(self, problem: str, reason: str, counted_as: str | None) -> None:
        """Close at once (``counted_as`` None: already logged and counted)."""
        if counted_as is not None:
            log.warning("closing connection from proxy %s: %s", self.peer, problem)
            self._server.stats.connections_refused[counted_as] += 1
        self._proxy_header = b""
        self._enter(Lifecycle.CLOSED)
        self._close_reason = f"{reason}: {problem}"
        if self.transport is not None:
            self.transport.abort()
        self._finish()

    def data_received(self, data: bytes) -> None:
        self._read_since_check = True
        self.bytes_received += len(data)
        if self._closed:
            return
        if self.lifecycle is Lifecycle.PROXY_HEADER:
            rest = self._read_proxy_header(data)
            if not rest:
                return
            data = rest
        self._parser.feed(data)
        self._pump_batch()

    def _pump_batch(self) -> None:
        """Handle the frames available now, then write what they produced: publishes and acks
        to the broker (AmqpConnection only buffers them), then RECEIPTs and ERRORs to the
        client, one write per socket."""
        self._in_read = True
        try:
            try:
                self._pump()
            except Exception:  # a bug must not take the server down: report it, close this client
                self._internal_error()
            if not self._closed:
                held = self._parser.buffered
                if held or self._held_input:
                    self._account_input(held)
                else:  # the common case: every byte read was a whole frame
                    self._frame_started = None
        finally:
            self._in_read = False
            self._read_clock = 0.0
        if self._amqp is not None:
            self._amqp.flush()
        self.flush()

    def _account_input(self, held: int) -> None:
        """Bound what a client can make the adapter hold in frames it has not finished (``held``
        bytes now): the bytes count against one budget shared by all connections, and a frame
        must be complete within ``frame_timeout`` of the read that started it (docs/behaviour.md,
        Limits)."""
        server = self._server
        if held != self._held_input:
            server.incomplete_input += held - self._held_input
            grew = held > self._held_input
            self._held_input = held
            if grew and server.incomplete_input > server.incomplete_input_budget:
                log.warning(
                    "peer=%s: incomplete frames of all connections hold %d bytes, over the budget of %d;"
                    " closing this connection (it holds %d)",
                    self.peer,
                    server.incomplete_input,
                    server.incomplete_input_budget,
                    held,
                )
                self._fail_input(
                    "Too much incomplete input",
                    "Incomplete frames of all connections exceed the adapter's budget of "
                    f"{server.incomplete_input_budget} bytes\n",
                )
                return
        if held and not self._busy:
            # the clock restarts with every frame taken: a client streaming frames whose reads
            # end mid-frame is making progress
            if self._frame_started is None or self._frames_read != self._frames_at_start:
                self._frame_started = self._loop.time()
                self._frames_at_start = self._frames_read
                if self._frame_timer is None and server.frame_timeout:
                    self._frame_timer = self._loop.call_later(server.frame_timeout, self._check_frame_time)
        else:
            # nothing pending, or complete frames waiting for the broker: not the client's delay
            self._frame_started = None

    def _check_frame_time(self) -> None:
        self._frame_timer = None
        started = self._frame_started
        if self._closed or started is None:
            return
        timeout = self._server.frame_timeout
        waited = self._loop.time() - started
        if waited < timeout:
            self._frame_timer = self._loop.call_later(timeout - waited, self._check_frame_time)
            return
        log.info(
            "peer=%s: frame not completed within %g s (%d bytes held)", self.peer, timeout, self._held_input
        )
        self._fail_input("Frame timeout", f"A frame was not completed within {timeout:g} s\n")

    def _fail_input(self, message: str, detail: str) -> None:
        assert self.session is not None
        self._run_all(self.session.close_with_error(message, detail))
        self.flush()

    def _release_input(self) -> None:
        self._server.incomplete_input -= self._held_input
        self._held_input = 0
        self._frame_started = None
        if self._frame_timer is not None:
            self._frame_timer.cancel()
            self._frame_timer = None

    @property
    def frame_limits(self) -> FrameLimits:
        """The STOMP frame limits in force now (the smaller ones before login)."""
        return self._parser.limits

    def mark_read(self) -> None:
        """Input that carried no STOMP bytes (a WebSocket pong) still shows the client is alive."""
        self._read_since_check = True

    def eof_received(self) -> bool:
        return False  # the transport closes itself; after our half-close this ends the linger

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.open_sockets.discard(self)
        self.transport = None
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if not self._closed:
            self._enter(Lifecycle.CLOSED)
            self._close_reason = (
                f"client closed the connection ({exc})" if exc else "client closed the connection"
            )
        self._finish()

    def pause_writing(self) -> None:
        # the client reads slower than the broker delivers: stop reading deliveries from the
        # broker, so TCP back-pressure reaches RabbitMQ instead of our memory
        self.paused_since.setdefault("slow-client", time.monotonic())
        if self._amqp is not None:
            self._amqp.pause_reading()
        if self._dispatch is not None:
            self._dispatch.set_paused(True)  # and nothing routed from other channels either

    def resume_writing(self) -> None:
        self._end_pause_clock("slow-client")
        if self._amqp is not None:
            self._amqp.resume_reading()
        if self._dispatch is not None:
            self._dispatch.set_paused(False)

    def _end_pause_clock(self, reason: str) -> None:
        started = self.paused_since.pop(reason, None)
        if started is not None:
            seconds = self.paused_seconds
            seconds[reason] = seconds.get(reason, 0.0) + time.monotonic() - started

    # ------------------------------------------------------------------ the pump
    def _pump(self) -> None:
        session = self.session
        assert session is not None
        parser = self._parser
        while not self._busy and not self._closed:
            steps = self._steps
            if steps is None:
                try:
                    frame = parser.next_frame()
                except FrameError as error:
                    self._run_all(session.on_frame_error(error))
                    return
                if frame is None:
                    break
                self._frames_read += 1
                self._frame = frame
                received = self.frames_received
                received[frame.command] = received.get(frame.command, 0) + 1
                if "receipt" in frame.headers:
                    self._receipt_asked(frame)
                # the two frames of the message flow skip the generator when they can
                if frame.command == "SEND":
                    publish = session.quick_send(frame)
                    if publish is not None:
                        assert self._amqp is not None
                        try:
                            self._amqp.publish(
                                publish.exchange, publish.routing_key, publish.properties, publish.body
                            )
                            self.messages_published += 1
                            if not self._timed_publish:
                                self._time_publish()
                            if self._destinations is not None:
                                self._destinations.count_published(publish.destination)
                        except ProcessingError as error:  # a value AMQP cannot carry
                            self._processing_error(error)
                            return
                        self._frame = None
                        continue
                elif frame.command == "ACK":
                    ack = session.quick_ack(frame)
                    if ack is not None:
                        assert self._amqp is not None
                        self._amqp.ack(ack.delivery_tag, ack.multiple)
                        self.acks += 1
                        self._frame = None
                        continue
                steps = self._steps = session.handle_frame(frame)
                result: object = None
            else:
                result = self._result
            try:
                op = steps.send(result)
                self._result = self._execute(op)
            except StopIteration:
                self._steps = None
                self._frame = None
                self._result = None
                if self._held:
                    held, self._held = self._held, []
                    for data in held:
                        self._write(data)
                continue
            except ProcessingError as error:
                # a value AMQP cannot carry (a name over 255 bytes, an integer out of range ...)
                self._processing_error(error)
                return
        if not self._closed:
            if parser.buffered > _MAX_BUFFERED_INPUT and self._busy:
                self._pause("input")
            else:
                self._resume("input")

    _result: object = None

    def _time_publish(self) -> None:
        """Start timing the publish just made, if it will be confirmed (confirm mode is on
        once a SEND asked for a receipt)."""
        assert self.session is not None
        seq = self.session.publish_seq
        if seq:
            self._timed_publish = seq
            self._timed_publish_at = time.monotonic()

    def _receipt_asked(self, frame: Frame) -> None:
        """Start the clock of a frame's receipt (stopped by ``_receipt_sent``)."""
        command = frame.command
        if command in _ANSWERED_BY_CONNECTED:
            return
        timed = self._receipts_timed
        if len(timed) >= _MAX_TIMED_RECEIPTS:
            # receipts that never came (an aborted transaction's SENDs, a refused message) or a
            # client far ahead of its receipts: start over rather than grow
            timed.clear()
            self._receipts_reused.clear()
        if self._in_read:  # the frames of one read arrived together
            now = self._read_clock
            if not now:
                now = self._read_clock = time.monotonic()
        else:  # a frame left waiting behind a broker call, handled now
            now = time.monotonic()
        receipt = frame.headers["receipt"]
        if receipt in timed:  # reused before its RECEIPT came: timed in order
            self._receipts_reused.setdefault(receipt, []).append((command, now))
        else:
            timed[receipt] = (command, now)

    def _receipt_sent(self, receipt: str) -> None:
        started = self._receipts_timed.pop(receipt, None)
        if started is None:
            return
        if self._receipts_reused:
            reused = self._receipts_reused.get(receipt)
            if reused:
                self._receipts_timed[receipt] = reused.pop(0)
                if not reused:
                    del self._receipts_reused[receipt]
        command, asked_at = started
        histogram = self._receipt_latency.get(command)
        if histogram is None:
            histogram = self._server.stats.receipt_histogram(command)
        histogram.observe((self._confirm_clock or time.monotonic()) - asked_at)

    def _execute(self, op: ops.Operation, in_frame: bool = True) -> object:
        """The one interpreter of the session's operations: run one that needs no reply, or
        start the task for one that does (``_run_sync``/``_call``: the broker's answer goes back
        into the frame's generator).  Outside a frame's generator (``in_frame`` False: an
        error, a timeout, a broker event) there is nothing to answer, so an operation that needs
        a reply there is a bug and raises, never dropped."""
        amqp = self._amqp
        if isinstance(op, ops.BasicPublish):
            assert amqp is not None
            amqp.publish(op.exchange, op.routing_key, op.properties, op.body)
            self.messages_published += 1
            if not self._timed_publish:
                self._time_publish()
            if self._destinations is not None and op.destination:  # "": a dead-letter copy
                self._destinations.count_published(op.destination)
        elif isinstance(op, ops.SendFrame):
            self._write(op.data)
        elif isinstance(op, ops.BasicAck):
            assert amqp is not None
            amqp.ack(op.delivery_tag, op.multiple)
            self.acks += 1
        elif isinstance(op, ops.BasicNack):
            assert amqp is not None
            amqp.nack(op.delivery_tag, op.multiple, op.requeue)
            self.nacks += 1
        elif isinstance(op, ops.QueueDeclare) and op.nowait:
            assert amqp is not None
            amqp.declare_nowait(op)
        elif isinstance(op, ops.Established):
            self._established(op)
        elif isinstance(op, ops.CloseClient):
            self._close(op.reason)
        elif isinstance(op, ops.DeleteQueueOnClose):
            self._delete_on_close.append(op.queue)  # deleted before the AMQP link closes
        elif isinstance(op, ops.DISPATCH_OPS):
            self._dispatch_op(op)
        elif isinstance(op, ops.OpenConnection) and (pooled := self._pooled_amqp(op)) is not None:
            return self._logged_in(pooled)  # no broker call: the pump goes on, no task
        elif in_frame:
            self._busy = True
            self._pause("broker")
            self._server.spawn(self._run_sync(op))
        else:
            raise AssertionError(f"operation {op!r} cannot run outside a frame's handling")
        return None

    async def _run_sync(self, op: ops.Operation) -> None:
        if self._closed:
            return  # closed between spawning this task and its first step: the link is gone
        try:
            self._result = await self._call(op)
        except AmqpError:
            # on_amqp_closed has already sent the ERROR and closed the client
            return
        except ProcessingError as error:
            self._processing_error(error)
            return
        except (OSError, TimeoutError) as error:
            assert self.session is not None
            self._run_all(self.session.on_connection_lost(str(error) or type(error).__name__))
            return
        except Exception:  # a bug must not take the server down: report and close this client
            self._internal_error()
            return
        self._busy = False
        if self._closed:
            return
        self._resume("broker")
        self._pump_batch()

    async def _call(self, op: ops.Operation) -> object:
        if isinstance(op, ops.OpenConnection):
            return await self._open_amqp(op)
        amqp = self._amqp
        assert amqp is not None
        if isinstance(op, ops.BROKER_CALLS):
            return await amqp.execute(op)
        if isinstance(op, ops.AwaitConfirms):
            # the result says whether every confirm came (DISCONNECT goes ahead either way; a
            # NACK to a dead-letter queue does not acknowledge the original without it)
            assert self.session is not None
            if self.session.confirms_outstanding:
                self._confirm_waiter = self._loop.create_future()
                try:
                    async with asyncio.timeout(_CONFIRM_WAIT_ON_DISCONNECT):
                        await self._confirm_waiter
                except TimeoutError:
                    log.warning(
                        "peer=%s: publisher confirms did not all come within %g s",
                        self.peer,
                        _CONFIRM_WAIT_ON_DISCONNECT,
                    )
                    return False
            return True
        elif isinstance(op, ops.CloseAmqp):
            self._leave_dispatchers()  # before the channel closes (its unacked messages requeue)
            self._amqp = None
            await self._release_amqp(amqp, queues_to_delete=bool(self._delete_on_close))
        else:  # pragma: no cover - exhaustive over SYNCHRONOUS_OPS
            raise AssertionError(f"unhandled operation {op!r}")
        return None

    async def _open_amqp(self, op: ops.OpenConnection) -> ops.LoginResult:
        """Log in on the first broker node that answers, in the order server.nodes gives, all
        within the login timeout.  A refusing, unreachable or timing-out node is skipped (and
        rested); a login the broker refuses is final (docs/behaviour.md, "Broker nodes")."""
        broker = self._server.broker
        nodes = self._server.nodes
        failures = self._server.stats.amqp_connection_failures
        deadline = self._loop.time() + self._server.login_timeout
        amqp: AmqpConnection | None = None
        reuse = self._server.amqp_reuse
        for node in nodes.attempt_order():
            # closed meanwhile (by the login timeout; a client that leaves is not seen yet:
            # its socket is not read while a broker call is pending)
            if self._closed:
                return ops.LoginResult(False, "other", "closed")
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                break
            target = node.resolver.target()
            try:
                amqp = await AmqpConnection.open(
                    self,
                    host=target,
                    port=node.port,
                    user=op.user,
                    password=op.password,
                    vhost=op.vhost,
                    heartbeat=broker.heartbeat,
                    timeout=min(broker.connect_timeout, remaining),
                    connection_name=f"STOMP {self.peer}",
                    ssl_context=broker.tls if node.tls else None,
                    server_hostname=(broker.tls_server_name or node.host) if node.tls else None,
                    reusable=reuse is not None,
                )
            except AmqpError as error:
                log.info(
                    "login refused peer=%s user=%s vhost=%s node=%s: %s",
                    self.peer,
                    op.user,
                    op.vhost,
                    node.label,
                    error.text,
                )
                if error.code == 403 or (error.phase == "auth" and error.code == 0):
                    # RabbitMQ closes the socket on a failed login (authentication_failure_close)
                    failures["access_refused"] += 1
                    return ops.LoginResult(False, "auth", error.text)
                if error.code in (530, 402) or error.phase == "vhost":
                    failures["vhost"] += 1
                    return ops.LoginResult(False, "vhost", error.text)
                failures["refused"] += 1
                # the broker's text may name its node or the adapter's internals: logged above,
                # and the client gets the plugin's body for a login that failed otherwise
                return ops.LoginResult(False, "other")
            except ssl.SSLError as error:
                failures["tls"] += 1
                nodes.failed(node)
                if isinstance(error, ssl.SSLCertVerificationError):
                    problem = f"TLS certificate verification failed for {node.label}: {error.verify_message}"
                else:
                    problem = f"TLS handshake with {node.label} failed: {_tls_failure(error)}"
                log.warning("peer=%s: %s (%s)", self.peer, problem, error)
            except (OSError, TimeoutError) as error:
                if isinstance(error, OSError) and error.errno in EXHAUSTED:
                    failures["file_descriptors"] += 1
                    self._server.descriptors.exhausted(f"cannot open an AMQP connection: {error.strerror}")
                    return ops.LoginResult(
                        False, "other", "The adapter is out of file descriptors, try again later"
                    )
                failures["timeout" if isinstance(error, TimeoutError) else "unreachable"] += 1
                nodes.failed(node)
                reason = str(error) or type(error).__name__
                log.warning("broker node unreachable for peer=%s: %s: %s", self.peer, node.label, reason)
            else:
                nodes.connected(node, target, amqp.peer_address)
                nodes.announced(node, amqp.broker_version)  # logged and exported once per node
                if reuse is not None:
                    reuse.logged_in(amqp, node.label, op.user, op.vhost, op.password)
                break
        if amqp is None:
            # the client has not logged in: it learns no node, address, certificate problem or
            # setting (the log above has them all), only what an unreachable broker tells it
            return ops.LoginResult(False, "other", "The broker is unreachable, try again later")
        return self._logged_in(amqp)

    def _pooled_amqp(self, op: ops.OpenConnection) -> AmqpConnection | None:
        """With adapter.amqp_connection_reuse: a pooled connection of this user, vhost and
        passcode, with a fresh channel number (adapter/server/amqp_pool.py); None: log in
        afresh, and the broker decides, as without reuse."""
        reuse = self._server.amqp_reuse
        if reuse is None:
            return None
        # the configured order: attempt_order() would advance the round robin of fresh logins
        labels = (node.label for node in self._server.nodes.nodes)
        return reuse.acquire(labels, op.user, op.vhost, op.password, self)

    def _logged_in(self, amqp: AmqpConnection) -> ops.LoginResult:
        if self._closed:
            if self._server.amqp_reuse is None:
                amqp.close_nowait()
            else:
                self._server.spawn(self._release_amqp(amqp, queues_to_delete=False))
            return ops.LoginResult(False, "other", "closed")
        self._amqp = amqp
        props = amqp.server_properties
        product = _text(props.get("product", "RabbitMQ"))
        version = _text(props.get("version", ""))
        server = f"{product}/{version}" if version else product
        return ops.LoginResult(True, server_version=server, broker=amqp.broker_generation)

    def _internal_error(self) -> None:
        """Called from an ``except`` block: log the traceback (a bug), answer ERROR, close."""
        log.exception("internal error peer=%s", self.peer)
        self._steps = None
        if self.session is not None and not self._closed:
            self._run_all(self.session.close_with_error("Internal error", "Internal error", self._frame))

    def _processing_error(self, error: ProcessingError) -> None:
        assert self.session is not None
        log.info("processing error peer=%s: %s", self.peer, error.detail)
        self._run_all(self.session.close_with_error(error.message, f"{error.detail}\n", self._frame))

    def _run_all(self, operations: list[ops.Operation]) -> None:
        """The operations of an answer outside a frame's generator (an error, a timeout)."""
        for op in operations:
            self._execute(op, in_frame=False)

    # ------------------------------------------------------------------ login and heart-beats
    def _established(self, op: ops.Established) -> None:
        session = self.session
        assert session is not None
        self._parser.set_version(op.version)
        self._parser.limits = self._settings.frame_limits
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        if log.isEnabledFor(logging.INFO):  # the fields cost ~1 % of a connect cycle
            self._log_logged_in(session, op)
        if op.send_ms:
            self._timers.append(
                self._loop.call_later(op.send_ms / 2000, self._send_heartbeat, op.send_ms / 2000)
            )
        if op.receive_ms:
            interval = op.receive_ms * self._server.heartbeat_tolerance / 1000
            self._read_since_check = False
            self._timers.append(self._loop.call_later(interval, self._check_heartbeat, interval))

    def _log_logged_in(self, session: Session, op: ops.Established) -> None:
        log.info(
            "connection logged in peer=%s user=%s vhost=%s version=%s heart-beat=%s,%s",
            self.peer,
            session.user,
            session.vhost,
            op.version,
            op.send_ms,
            op.receive_ms,
            extra={
                "fields": {
                    "event": "connection_logged_in",
                    "peer": self.peer,
                    "listener": self.listener,
                    "user": session.user,
                    "vhost": session.vhost,
                    "version": op.version,
                    "heart_beat": f"{op.send_ms},{op.receive_ms}",
                }
            },
        )

    def _send_heartbeat(self, interval: float) -> None:
        if self._closed or self.transport is None:
            return
        if not self._wrote_since_check and not self._out:
            self.transport.write(b"\n")
            self.bytes_sent += 1
        self._wrote_since_check = False
        self._timers.append(self._loop.call_later(interval, self._send_heartbeat, interval))

    def _check_heartbeat(self, interval: float) -> None:
        if self._closed:
            return
        # while we are not reading the client (waiting for the broker, broker flow control)
        # its heart-beats wait unread in the socket: not the client's fault
        if not self._read_since_check and not self._pause_reasons:
            assert self.session is not None
            self._run_all(
                self.session.close_with_error(
                    "Heart-beat timeout", f"No data received from the client for {interval:.1f} s\n"
                )
            )
            return
        self._read_since_check = False
        self._timers.append(self._loop.call_later(interval, self._check_heartbeat, interval))

    def _login_timed_out(self) -> None:
        session = self.session
        if self._closed or session is None or session.state is State.CONNECTED:
            return
        if self.lifecycle is Lifecycle.PROXY_HEADER:  # no STOMP peer yet to send an ERROR to
            self._refuse_proxy(
                "no complete PROXY header within the login timeout", "PROXY protocol", "proxy_timeout"
            )
            return
        self._run_all(session.close_with_error("Login timeout", "No successful CONNECT in time\n"))

    # ------------------------------------------------------------------ broker events
    def on_deliver(self, delivery: ops.Delivery) -> None:
        if self._closed or self.session is None:
            return
        try:
            data = self.session.on_delivery(delivery)
        except BudgetExceeded as error:  # activemq profile: too many unacknowledged bytes kept
            self._over_budget(error)
            return
        if not data:
            # filtered out by the subscription's selector, or for the queue's dispatcher
            # (activemq profile): settle it now, or hand it over
            ack = self.session.dropped_delivery_ack(delivery)
            if ack is not None:
                self._execute(ack)
            return
        if self._destinations is not None:
            self._count_delivered(delivery.consumer_tag)
        if self._steps is not None:
            # A frame is still being handled (e.g. a SUBSCRIBE waiting for its bind): its
            # RECEIPT must reach the client before the messages its consume let through, as
            # with the plugin, which finishes a frame before it handles deliveries.
            self._held.append(data)
            return
        # called from AmqpConnection.data_received, whose on_read_done flushes: no scheduling
        self._out.append(data)
        if len(delivery.body) >= wire.ZERO_COPY_MIN:
            self._out_large = True

    def _over_budget(self, error: BudgetExceeded) -> None:
        """A delivery the session would have to keep does not fit its byte budget: ERROR, then
        close.  The delivery is not sent and stays unacknowledged, so the broker requeues it."""
        if self._closed or self.session is None:
            return
        log.warning("peer=%s: %s", self.peer, error.detail.rstrip("\n"))
        self._run_all(self.session.close_with_error(error.message, error.detail))

    def _count_delivered(self, consumer_tag: str) -> None:
        """Per-destination series: a MESSAGE for the subscription behind ``consumer_tag``."""
        assert self.session is not None and self._destinations is not None
        destination = self.session.subscription_destination(consumer_tag)
        if destination is not None:
            self._destinations.count_delivered(destination)

    # ------------------------------------------------------------------ queue dispatchers
    def _dispatch_op(self, op: ops.DispatchOp) -> None:
        link = self._dispatch
        if link is None:
            assert self.session is not None and self.session.vhost is not None
            link = self._dispatch = DispatchLink(
                self, self._settings.dispatchers, self.session.vhost, self._loop
            )
        link.execute(op)

    def deliver_dispatched(self, delivery: ops.Delivery) -> None:
        """The queue's dispatcher gives this client a message (adapter/server/dispatching.py)."""
        if self._closed or self.session is None:
            return
        try:
            data = self.session.render_dispatched(delivery)
        except BudgetExceeded as error:
            # closed one loop turn later, once the dispatcher has finished the actions it is
            # running: leaving then gives this message (and the others routed here) back
            self._loop.call_soon(self._over_budget, error)
            return
        if data and self._destinations is not None:
            self._count_delivered(delivery.consumer_tag)
        # written now, even while a frame is being handled: a member is only activated after its
        # SUBSCRIBE's RECEIPT, so there is no RECEIPT to wait for (on_deliver holds its MESSAGEs
        # back), and an auto-ack member's message is acknowledged at its origin as it is sent: held
        # here, it would be lost if the frame being handled ends the connection
        self._write(data)

    def settle_dispatched(self, delivery_tag: int, ack: bool, requeue: bool) -> None:
        """The queue's dispatcher settles a delivery of this connection's channel (acks are
        gathered and written, coalesced, one loop turn later: DispatchLink.flush_acks)."""
        amqp, link = self._amqp, self._dispatch
        if amqp is None or link is None or not amqp.is_open:
            return  # the channel is gone: the broker has requeued it
        if ack:
            self.acks += 1
        else:
            self.nacks += 1
        link.settle(amqp, delivery_tag, ack, requeue)
        if self._amqp_flush_handle is None:
            self._amqp_flush_handle = self._loop.call_soon(self._flush_amqp)

    def _flush_amqp(self) -> None:
        self._amqp_flush_handle = None
        amqp, link = self._amqp, self._dispatch
        if amqp is None:
            return
        if link is not None and self.session is not None:
            link.flush_acks(amqp, coalesce=not self.session.plain_acks)
        amqp.flush()

    def _leave_dispatchers(self) -> None:
        if self._amqp is not None and self._dispatch is not None and self.session is not None:
            # the acks of this loop turn first: they are the client's (or auto mode's) answer
            self._dispatch.flush_acks(self._amqp, coalesce=not self.session.plain_acks)
        link, self._dispatch = self._dispatch, None
        if link is not None:
            link.channel_closed()

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        session = self.session
        if session is None or self._closed:
            return
        now = 0.0
        timed = self._timed_publish
        if timed and (delivery_tag == timed or (multiple and delivery_tag > timed)):
            now = time.monotonic()
            self._server.stats.confirm_latency.observe(now - self._timed_publish_at)
            self._timed_publish = 0
        if self._receipts_timed:  # the RECEIPTs this confirm releases share one clock reading
            self._confirm_clock = now or time.monotonic()
        data = session.on_confirm(delivery_tag, multiple, ack)
        self._confirm_clock = 0.0
        if data:
            self._out.append(data)  # flushed by on_read_done, as for deliveries
            if not ack:
                self._close("the broker refused a message (basic.nack)")
        waiter = self._confirm_waiter
        if waiter is not None and not session.confirms_outstanding and not waiter.done():
            waiter.set_result(None)

    def on_server_cancel(self, consumer_tag: str) -> None:
        session = self.session
        if session is not None and not self._closed:
            dispatched = session.is_dispatched(consumer_tag)
            self._write(session.on_server_cancel(consumer_tag))
            if dispatched:
                # out of its dispatcher, or messages routed to it would be rendered for a
                # subscription that is gone (and, with auto acks, acked on their way there)
                self._dispatch_op(ops.LeaveDispatch(consumer_tag))

    def on_amqp_closed(self, error: AmqpError) -> None:
        session = self.session
        if not error.channel_only:
            self._amqp = None  # the connection itself is gone; a closed channel still needs closing
        if session is None or self._closed:
            return
        if not error.channel_only:
            # the broker closed the connection (connection.close: forced, a memory alarm ...) or
            # the link died without one (network, broker crash)
            reason = "closed_by_broker" if error.code else "connection_lost"
            self._server.stats.amqp_connection_failures[reason] += 1
        if error.code:
            # a synchronous call of the current frame was waiting: ERROR, RECEIPT, close
            # (docs/behaviour.md#error-handling)
            frame = self._frame if self._busy else None
            self._run_all(session.on_broker_error(error.name, error.text, frame))
        else:
            self._run_all(session.on_connection_lost(error.text))

    def on_read_done(self) -> None:
        self.flush()

    def on_broker_backpressure(self, paused: bool) -> None:
        if paused:
            self._pause("broker-flow")
        else:
            self._resume("broker-flow")

    # ------------------------------------------------------------------ output
    def _write(self, data: bytes) -> None:
        if not data:
            return
        self._out.append(data)
        # inside a pump or a broker read the flush comes at its end (_pump_batch, on_read_done);
        # elsewhere (timers, close) one loop turn later
        if self._flush_handle is None and not self._in_read:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        self.flush()

    def flush(self) -> None:
        """Write what is buffered now.  Called at the end of every read from either socket, so a
        batch goes out without waiting for the next loop iteration (latency); the scheduled
        ``_flush`` still covers writes made outside a read (timers, tasks)."""
        out = self._out
        if not out or self.transport is None:
            return
        self._out = []
        if self._linger is not None:
            return  # after our half-close (see _close) nothing more goes to the client
        self._wrote_since_check = True
        if self._out_large or self.frame_per_write:
            self._out_large = False  # large MESSAGEs are not copied again into one write
            self.bytes_sent += sum(map(len, out))
            self.transport.writelines(out)
        else:
            data = b"".join(out) if len(out) > 1 else out[0]
            self.bytes_sent += len(data)
            self.transport.write(data)

    def _pause(self, reason: str) -> None:
        if not self._pause_reasons and self.transport is not None:
            self.transport.pause_reading()
        if reason not in self._pause_reasons:
            self._pause_reasons.add(reason)
            self.paused_since[reason] = time.monotonic()

    def _resume(self, reason: str) -> None:
        if reason not in self._pause_reasons:
            return
        self._pause_reasons.discard(reason)
        self._end_pause_clock(reason)
        if not self._pause_reasons and self.transport is not None and not self._closed:
            self.transport.resume_reading()

    # ------------------------------------------------------------------ closing
    def _close(self, reason: str) -> None:
        """Flush what was written, close the client socket, release the AMQP connection."""
        if self._closed:
            return
        self._enter(Lifecycle.CLOSED)
        self._close_reason = reason
        self._flush()
        transport = self.transport
        if transport is not None:
            if transport.can_write_eof():
                # Half-close: the client gets our last bytes (an ERROR, a RECEIPT) and then EOF.
                # Closing outright while its input is unread would send a TCP reset, and a client
                # still writing (an oversized frame, a burst after an error) would see
                # "connection reset" instead of the ERROR.  Input is read and dropped until the
                # client closes too (eof_received), or until it stops making progress (_linger_check).
                try:
                    transport.write_eof()
                except OSError:  # the peer reset the connection before we saw it go
                    transport.abort()
                else:
                    transport.resume_reading()
                    self._linger = self._loop.call_later(_LINGER_SECONDS, self._linger_check, transport, None)
            else:
                transport.close()  # sends buffered bytes first
        self._finish()

    def _linger_check(self, transport: asyncio.Transport, unsent_before: int | None) -> None:
        """After the half-close: give up on a client that neither closes nor reads.  One that is
        still reading what we wrote last (a slow consumer's final batch and its RECEIPT) gets
        more time as long as the unsent amount shrinks."""
        unsent = transport.get_write_buffer_size()
        if unsent and (unsent_before is None or unsent < unsent_before):
            self._linger = self._loop.call_later(_LINGER_SECONDS, self._linger_check, transport, unsent)
            return
        self._linger = None
        transport.abort()

    def abort(self) -> None:
        """End of server shutdown: drop the socket if it is still open (lingering)."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self.transport is not None:
            self.transport.abort()

    def shutdown(self) -> None:
        """Server shutdown: tell the client why, then close."""
        if self._closed or self.session is None:
            return
        self._write(self.session.shutdown_notice())
        self._close("server shutdown")

    def _finish(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._release_input()
        if self.session is not None:
            self.session.on_closed()  # activemq profile: frees its client-id
        if self._dispatch is not None:
            self._leave_dispatchers()
        if self._steps is not None:
            self._steps.close()
            self._steps = None
        amqp, self._amqp = self._amqp, None
        if self._confirm_waiter is not None and not self._confirm_waiter.done():
            self._confirm_waiter.cancel()
        if self._finished:
            return
        self._enter(Lifecycle.FINISHED)
        for reason in list(self.paused_since):
            self._end_pause_clock(reason)
        self._server.add_finished(self)
        self._log_closed()
        if amqp is not None and amqp.is_open:
            task = self._server.spawn(self._close_amqp(amqp, self._delete_on_close))
            task.add_done_callback(lambda _t: self._set_done())
        else:
            self._set_done()

    def _log_closed(self) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        session = self.session
        logged_in = session is not None and session.user is not None
        frames_sent = sum(session.frames_sent.values()) + session.messages_sent if session else 0
        fields = {
            "event": "connection_closed",
            "peer": self.peer,
            "listener": self.listener,
            "user": session.requested_user if session else None,
            "vhost": session.requested_vhost if session else None,
            "logged_in": logged_in,
            "version": session.version if session and logged_in else None,
            "duration_seconds": round(time.monotonic() - self.opened_at, 3),
            "frames_received": sum(self.frames_received.values()),
            "frames_sent": frames_sent,
            "messages_published": self.messages_published,
            "messages_delivered": session.messages_sent if session else 0,
            "bytes_received": self.bytes_received,
            "bytes_sent": self.bytes_sent,
            "reason": self._close_reason,
        }
        log.info(
            "connection closed peer=%s user=%s vhost=%s version=%s duration=%.3fs frames_in=%d"
            " frames_out=%d published=%d delivered=%d reason=%s",
            self.peer,
            fields["user"],
            fields["vhost"],
            fields["version"],
            fields["duration_seconds"],
            fields["frames_received"],
            frames_sent,
            self.messages_published,
            fields["messages_delivered"],
            self._close_reason,
            extra={"fields": fields},
        )

    async def _close_amqp(self, amqp: AmqpConnection, delete_queues: list[str]) -> None:
        for queue in delete_queues:
            try:
                await asyncio.wait_for(amqp.delete_queue_on_fresh_channel(queue), 5.0)
            except (AmqpError, TimeoutError) as error:
                log.info("peer=%s: could not delete subscription queue %r: %s", self.peer, queue, error)
        await self._release_amqp(amqp, queues_to_delete=bool(delete_queues))

    async def _release_amqp(self, amqp: AmqpConnection, *, queues_to_delete: bool) -> None:
        """The session is done with its AMQP connection: close it, or, with
        adapter.amqp_connection_reuse, give it back to the pool if nothing of the session can
        outlive its channel (adapter/server/amqp_pool.py decides)."""
        reuse = self._server.amqp_reuse
        if reuse is None:
            await amqp.close()
        else:
            failed = self.session is None or bool(self.session.errors_sent)
            await reuse.release(amqp, queues_to_delete=queues_to_delete, session_failed=failed)

    def _set_done(self) -> None:
        self._server.connections.discard(self)
        if not self.done.done():
            self.done.set_result(None)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# OpenSSL's reason codes for a failed handshake with a broker node, in an operator's words
_TLS_CLIENT_CERTIFICATE_REFUSED = frozenset(
    {
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "TLSV1_ALERT_ACCESS_DENIED",
    }
)
_TLS_NO_COMMON_VERSION = frozenset(
    {"TLSV1_ALERT_PROTOCOL_VERSION", "UNSUPPORTED_PROTOCOL", "NO_PROTOCOLS_AVAILABLE", "WRONG_SSL_VERSION"}
)


def _tls_failure(error: ssl.SSLError) -> str:
    """What went wrong in a TLS handshake with a broker node (the log keeps OpenSSL's text)."""
    reason = error.reason or ""
    if reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
        return "the broker requires a client certificate (adapter.amqp_tls_certfile and _keyfile)"
    if reason in _TLS_CLIENT_CERTIFICATE_REFUSED:
        return f"the broker refused the adapter's client certificate ({reason.lower()})"
    if reason in _TLS_NO_COMMON_VERSION:
        return "no TLS version in common with the broker (adapter.amqp_tls_min_version)"
    if reason == "SSLV3_ALERT_HANDSHAKE_FAILURE":
        return "the broker ended the handshake: it may require a client certificate, or share no cipher"
    if reason == "WRONG_VERSION_NUMBER":
        return "the node does not answer in TLS (is it a plain amqp:// port?)"
    return reason.lower().replace("_", " ") or str(error)
