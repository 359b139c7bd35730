"""The asyncio shell around one STOMP client: socket events, the pump, output and close.

``ClientConnection`` owns the client socket, the frame pump that drives the session's operation
generators, the write buffer (flushed once per read or loop iteration), the flow control between
the two sockets, and the close (half-close and linger).  Everything else a connection needs is
an object of its own, which the shell only calls:

* ``AmqpLinkGlue`` (adapter/amqp/link_lifecycle.py): the way to the AMQP link and back (its
  ``login.BrokerLogin``: the login over the broker nodes, the pool, the shared connections, TLS
  diagnosis; the queues to delete and the release at the end);
* ``input_guard.InputGuard``: the incomplete-input budget and the frame timeout;
* ``heartbeats.HeartBeats`` (over ``adapter.liveness.Liveness``): STOMP heart-beats;
* ``latency.LatencyClocks``: the confirm and receipt latency histograms;
* ``dispatching.DispatchGlue``: the queue dispatchers of the activemq profile;
* ``sharing.SharedLink``: the shared topic subscriptions (``adapter.shared_subscriptions``).

The session's operations are interpreted by one table, ``INTERPRETER``, keyed by operation type.
No protocol decisions are made here: they are in ``adapter/session.py``.

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
import time
from collections.abc import Awaitable, Callable, Generator
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from ..amqp import wire
from ..amqp.admission import Gate
from ..amqp.connection import AmqpError, SessionLink
from ..amqp.link_lifecycle import AmqpLinkGlue
from ..mapping import operations as ops
from ..mapping.budget import BudgetExceeded
from ..mapping.destinations import ProcessingError
from ..session import Session, SessionSettings, State, new_session_id
from ..session.token_session import EXPIRED_MESSAGE
from ..stomp.codec import FrameError, FrameLimits, FrameParser
from ..stomp.frame import Frame
from . import connection_log
from .dispatching import DispatchGlue, DispatchLink
from .heartbeats import HeartBeats
from .input_guard import FrameClock, InputGuard
from .latency import LatencyClocks
from .login import BrokerLogin, BrokerSettings, logged_in, tls_failure
from .proxy_protocol import ProxyHeaderError, ProxyTrust, parse_proxy_header
from .sharing import SharedLink
from .token_expiry import TokenExpiryGuard, update_secret_call

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from ..amqp.multiplex_runtime import AmqpMultiplex
    from ..amqp.pool_runtime import AmqpReuse
    from ..session.fanout import Member
    from .brokers import BrokerNodes
    from .fdlimit import DescriptorWatch
    from .stats import ServerStats
    from .wsdeflate import CompressionBudget

__all__ = [
    "INTERPRETER",
    "BrokerSettings",
    "ClientConnection",
    "ConnectionServices",
    "ConnectionSettings",
    "Lifecycle",
    "ServerState",
    "SharedCounters",
    "is_loopback",
    "refuse_untrusted_proxy",
    "tls_failure",
]


# ---------------------------------------------------------------------- what the shell sees of the server
class ConnectionSettings(Protocol):
    """Read-only settings every connection of a server shares."""

    session_settings: SessionSettings
    broker: BrokerSettings
    proxy_protocol: bool  # the TCP listeners' setting (TLS and WebSocket read theirs first)
    proxy_trust: ProxyTrust  # adapter.proxy_protocol_trusted: whose PROXY header is believed
    login_timeout: float
    heartbeat_tolerance: float
    idle_client_timeout: float  # adapter.idle_client_timeout (0: off)
    incomplete_input_budget: int

    @property
    def limits(self) -> FrameClock: ...  # the group "limits", as input_guard.IncompleteInput reads it


class SharedCounters(Protocol):
    """Counters and budgets all connections of the process add to."""

    stats: ServerStats
    incomplete_input: int  # bytes of unfinished frames held by all connections (InputGuard)
    descriptors: DescriptorWatch
    ws_compression: CompressionBudget  # permessage-deflate state of all WebSockets
    logins: Gate  # the AMQP logins under way at once (adapter.max_logins_in_flight)
    amqp_closes: Gate  # the AMQP connections closing at once (AMQP_CLOSES_AT_ONCE)


class ConnectionServices(Protocol):
    """What a connection asks the server to do or keep for it."""

    nodes: BrokerNodes
    amqp_reuse: AmqpReuse | None  # adapter.amqp_connection_reuse: the pool, None when off
    amqp_mux: AmqpMultiplex | None  # adapter.amqp_sessions_per_connection > 1, None when off
    connections: set[ClientConnection]  # logged in or logging in; shutdown closes them
    open_sockets: set[Any]  # every socket until connection_lost; shutdown aborts the rest

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...

    def tune_socket(self, sock: socket.socket) -> None: ...

    def add_finished(self, connection: ClientConnection) -> None: ...


class ServerState(ConnectionSettings, SharedCounters, ConnectionServices, Protocol):
    """What a connection may use of the server that accepted it, and nothing more: its
    settings, the counters shared by all connections, and its services.  The listener's
    ``Server`` implements it; a new transport (TLS, WebSocket, a test's in-memory socket) hands
    ``ClientConnection`` the same object, so the shell never sees listeners or sockets.  The
    parts of a connection are each given the narrowest view they need (``InputGuard`` an
    ``IncompleteInput``, ``BrokerLogin`` its ``LoginServices``, ``LatencyClocks`` the stats)."""


# After the adapter closes a connection, how long it keeps reading (and dropping) what the
# client still sends, so that the client reads the final ERROR instead of a TCP reset.
_LINGER_SECONDS = 2.0

log = logging.getLogger("adapter.connection")

# Stop reading from the client while this many bytes of parsed-but-unhandled input wait
_MAX_BUFFERED_INPUT = 1024 * 1024
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


def refuse_untrusted_proxy(server: SharedCounters, peer: str) -> None:
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


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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
        self.label = label  # the transport's name in the log
        self.listener = listener or ("websocket" if label.startswith("WebSocket") else "tcp")
        # a transport that frames each write (WebSocket: one message per STOMP frame) gets the
        # frames as separate items of one writelines call instead of joined
        self.frame_per_write = False
        # a listener may give its clients other settings (adapter.activemq_listeners: the profile)
        self._settings: SessionSettings = session_settings or server.session_settings
        self._loop = loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        # the session exists from the start; connection_made tells it whether its peer is local
        self.session = Session(
            self._settings, session_id=new_session_id(os.urandom(16)), peer_is_loopback=False
        )
        self._parser = FrameParser(self._settings.unauthenticated_limits)
        self._amqp: SessionLink | None = None  # the session's link (AmqpLinkGlue: how it comes and goes)
        self._out: list[bytes] = []
        self._out_large = False  # _out holds a large MESSAGE: write with writelines, unjoined
        self._flush_handle: asyncio.Handle | None = None
        # the frame being handled, its operation generator, and the last broker call's answer
        self._frame: Frame | None = None
        self._steps: Generator[ops.Operation, object, None] | None = None
        self._result: object = None
        self._busy = False  # a task is waiting for the broker
        self._in_read = False  # handling a batch of input: whoever runs it flushes at the end
        self._held: list[bytes] = []  # MESSAGE frames waiting for the current frame to finish
        self._confirm_waiter: asyncio.Future[None] | None = None  # DISCONNECT's AwaitConfirms
        self.lifecycle = Lifecycle.NEW
        self._closed = False  # lifecycle is CLOSED or FINISHED
        self._finished = False  # lifecycle is FINISHED
        self.close_reason = ""  # why it closed, for the close log line
        self._linger: asyncio.TimerHandle | None = None  # after our half-close, see _close
        self._pause_reasons: set[str] = set()
        self._proxy_header = b""  # with stomp.proxy_protocol: the header's start until complete
        self._login_timer: asyncio.TimerHandle | None = None
        # the parts (see the module docstring); liveness is the heart-beat monitor's flags,
        # set on every read and flush
        self._link_glue = AmqpLinkGlue(server, BrokerLogin(server, loop))
        self._guard = InputGuard(server, loop, self._fail_input, lambda: self.peer)
        self._heartbeats = HeartBeats(self, loop)
        self._liveness = self._heartbeats.liveness
        self._clocks = LatencyClocks(server.stats)
        self.session.on_receipt = self._clocks.receipt_sent
        self._dispatch: DispatchGlue | None = None  # activemq profile: made on the first selector
        # adapter.shared_subscriptions: this connection's side of the shared groups, made at
        # its CONNECT (adapter/server/sharing.py)
        self._shared: SharedLink | None = None
        # an OAuth 2.0 token's expiry (adapter/server/token_expiry.py)
        self._token_expiry = TokenExpiryGuard(loop, self._token_expired)
        self.done: asyncio.Future[None] = loop.create_future()
        # Counters for the metrics and the close log line: plain attributes, read by
        # adapter/server/metrics.py at scrape time and added to server.stats when the
        # connection finishes (adapter/server/stats.py says why not prometheus counters).
        # time.monotonic, not loop.time: uvloop's clock has millisecond steps
        self.opened_at = time.monotonic()
        self.frames_received: dict[str, int] = {}
        self.messages_published = 0
        self.acks = 0
        self.nacks = 0
        self.shared_messages = 0  # MESSAGE frames of shared subscriptions (adapter.shared_subscriptions)
        self.bytes_received = 0
        self.bytes_sent = 0
        self.paused_seconds: dict[str, float] = {}
        self.paused_since: dict[str, float] = {}  # pause reason -> when it started
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
        server = self._server
        server.open_sockets.add(self)
        peername = transport.get_extra_info("peername")
        host, port = (peername[0], peername[1]) if peername else ("?", 0)
        self.peer = _address(host, port)
        proxy = None
        if self._client_address is not None:
            proxy, (host, port) = self.peer, self._client_address
            self.peer = _address(host, port)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            server.tune_socket(sock)
            server.descriptors.accepted(sock.fileno())
        self.session.peer_is_loopback = is_loopback(host)
        server.connections.add(self)
        server.stats.connections_opened[self.listener] += 1
        # the login timeout also bounds a PROXY header that arrives slowly
        self._login_timer = self._loop.call_later(server.login_timeout, self._login_timed_out)
        if self._expect_proxy_header:
            self._enter(Lifecycle.PROXY_HEADER)  # the peer is the proxy: wait for the client's address
            if not server.proxy_trust.trusts(host):
                refuse_untrusted_proxy(server, self.peer)
                self._refuse_proxy("not a trusted proxy", "PROXY protocol", None)
            return
        self._enter(Lifecycle.OPEN)
        connection_log.opened(self, f" via proxy {proxy}" if proxy is not None else "")

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
            self.peer = _address(host, port)
            self.session.peer_is_loopback = is_loopback(host)
            connection_log.opened(self, f" via proxy {proxy}")
        else:
            connection_log.opened(self, " (PROXY header without a client address)")
        return buffered[header.length :]

    def _refuse_proxy(self, problem: str, reason: str, counted_as: str | None) -> None:
        """Close at once (``counted_as`` None: already logged and counted)."""
        if counted_as is not None:
            log.warning("closing connection from proxy %s: %s", self.peer, problem)
            self._server.stats.connections_refused[counted_as] += 1
        self._proxy_header = b""
        self._enter(Lifecycle.CLOSED)
        self.close_reason = f"{reason}: {problem}"
        if self.transport is not None:
            self.transport.abort()
        self._finish()

    def data_received(self, data: bytes) -> None:
        self._liveness.read = True
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
        to the broker (the AMQP link only buffers them), then RECEIPTs and ERRORs to the
        client, one write per socket."""
        self._in_read = True
        try:
            try:
                self._pump()
            except Exception:  # a bug must not take the server down: report it, close this client
                self._internal_error()
            if not self._closed:
                held = self._parser.buffered
                guard = self._guard
                if held or guard.held:  # the common case, every byte read a whole frame, skips it
                    guard.account(held, self.bytes_received - held, self._busy)
        finally:
            self._in_read = False
        if self._amqp is not None:
            self._amqp.flush()
        self.flush()

    def _fail_input(self, message: str, detail: str) -> None:
        """The input guard's verdict: ERROR naming the limit, then close."""
        if self._closed:
            return
        self._run_all(self.session.close_with_error(message, detail))
        self.flush()

    @property
    def frame_limits(self) -> FrameLimits:
        """The STOMP frame limits in force now (the smaller ones before login)."""
        return self._parser.limits

    def mark_read(self) -> None:
        """Input that carried no STOMP bytes (a WebSocket pong) still shows the client is alive."""
        self._liveness.read = True

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
            self.close_reason = (
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
        parser = self._parser
        clocks = self._clocks
        clocks.read_clock = 0.0  # the receipted frames of this batch share one reading
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
                self._frame = frame
                received = self.frames_received
                received[frame.command] = received.get(frame.command, 0) + 1
                if "receipt" in frame.headers:
                    clocks.receipt_asked(frame)
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
                            if not clocks.timed_publish:
                                clocks.time_publish(session.publish_seq)
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
                self._result = INTERPRETER[type(op)](self, op, True)
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

    def _execute(self, op: ops.Operation, in_frame: bool = True) -> object:
        """Run one operation through ``INTERPRETER``.  ``in_frame`` False: outside a frame's
        generator (an error, a timeout, a broker event), where nothing could take a broker
        call's answer, so an operation needing one is a bug and raises, never dropped."""
        handler = INTERPRETER.get(type(op))
        if handler is None:
            raise AssertionError(f"no interpreter entry for operation {op!r}")
        return handler(self, op, in_frame)

    def _run_all(self, operations: list[ops.Operation]) -> None:
        """The operations of an answer outside a frame's generator (an error, a timeout)."""
        for op in operations:
            self._execute(op, in_frame=False)

    # the entries of INTERPRETER that run at once: (self, op, in_frame) -> the generator's input
    def _op_publish(self, op: ops.BasicPublish, in_frame: bool) -> None:
        amqp = self._amqp
        assert amqp is not None
        amqp.publish(op.exchange, op.routing_key, op.properties, op.body)
        self.messages_published += 1
        clocks = self._clocks
        if not clocks.timed_publish:
            clocks.time_publish(self.session.publish_seq)
        if self._destinations is not None and op.destination:  # "": a dead-letter copy
            self._destinations.count_published(op.destination)

    def _op_send_frame(self, op: ops.SendFrame, in_frame: bool) -> None:
        self._write(op.data)

    def _op_ack(self, op: ops.BasicAck, in_frame: bool) -> None:
        assert self._amqp is not None
        self._amqp.ack(op.delivery_tag, op.multiple)
        self.acks += 1

    def _op_nack(self, op: ops.BasicNack, in_frame: bool) -> None:
        assert self._amqp is not None
        self._amqp.nack(op.delivery_tag, op.multiple, op.requeue)
        self.nacks += 1

    def _op_requeue_got(self, op: ops.RequeueGot, in_frame: bool) -> None:
        assert self._amqp is not None
        # on the link the gets ran on; a probe's close is waited for (adapter/amqp/probe.py)
        closing = self._amqp.requeue_got(op.delivery_tags)
        self.nacks += len(op.delivery_tags)
        if closing is not None:
            self._start_call(functools.partial(_handed_back, closing), op, in_frame)

    def _op_declare(self, op: ops.QueueDeclare, in_frame: bool) -> None:
        if not op.nowait:
            self._start_call(_amqp_call, op, in_frame)
            return
        assert self._amqp is not None
        self._amqp.declare_nowait(op)

    def _op_established(self, op: ops.Established, in_frame: bool) -> None:
        self._established(op)

    def _op_close_client(self, op: ops.CloseClient, in_frame: bool) -> None:
        self._close(op.reason)

    def _op_delete_on_close(self, op: ops.DeleteQueueOnClose, in_frame: bool) -> None:
        self._link_glue.delete_on_close.append(op.queue)  # deleted before the AMQP link goes

    def _op_token_expiry(self, op: ops.TokenExpiry, in_frame: bool) -> None:
        self._token_expiry.arm(op.expires_at)

    def _token_expired(self) -> None:
        """The token's exp passed: ERROR and close, unless a refresh moved it meanwhile."""
        if self._closed:
            return
        tokens = self.session.tokens
        if tokens.refresh_pending:
            return  # a refresh received before exp: its TokenExpiry arms the timer again
        detail = tokens.expired()
        if detail is None:
            self._token_expiry.arm(tokens.claims.expires_at if tokens.claims is not None else None)
            return
        self.close_with_error(EXPIRED_MESSAGE, detail)
        self.flush()

    def _op_dispatch(self, op: ops.DispatchOp, in_frame: bool) -> None:
        self._dispatch_op(op)

    def _op_open(self, op: ops.OpenConnection, in_frame: bool) -> ops.LoginResult | None:
        self._shared = SharedLink.at_login(self._settings.shared, self._server, self._loop, self, op)
        pooled = self._link_glue.login.pooled(op, self)
        if pooled is not None:
            return self._logged_in(pooled)  # no broker call: the pump goes on, no task
        self._start_call(_open_connection, op, in_frame)
        return None

    def _start_call(self, call: _Call, op: ops.Operation, in_frame: bool) -> None:
        """An operation that waits for the broker: stop reading the client and run it as a
        task, whose answer goes back into the frame's generator (``_run_call``)."""
        if not in_frame:
            raise AssertionError(f"operation {op!r} cannot run outside a frame's handling")
        self._busy = True
        self._pause("broker")
        self._server.spawn(self._run_call(call, op))

    async def _run_call(self, call: _Call, op: Any) -> None:
        if self._closed:
            return  # closed between spawning this task and its first step: the link is gone
        try:
            self._result = await call(self, op)
        except AmqpError:
            # on_amqp_closed has already sent the ERROR and closed the client
            return
        except ProcessingError as error:
            self._processing_error(error)
            return
        except (OSError, TimeoutError) as error:
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

    # the broker calls (the awaited half of INTERPRETER's entries that wait)
    async def _await_confirms(self, op: ops.AwaitConfirms) -> bool:
        """True when every confirm came (DISCONNECT goes ahead either way; a NACK to a
        dead-letter queue does not acknowledge the original without it)."""
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

    async def _close_amqp_link(self, op: ops.CloseAmqp) -> None:
        amqp = self._let_go()  # DISCONNECT
        assert amqp is not None
        await self._link_glue.release(amqp, session_failed=bool(self.session.errors_sent))

    async def _open_amqp(self, op: ops.OpenConnection) -> ops.LoginResult:
        """Log in (``BrokerLogin.open``: the node loop, within the login timeout)."""
        result = await self._link_glue.login.open(op, self, self.peer, lambda: self._closed)
        if isinstance(result, ops.LoginResult):
            return result
        return self._logged_in(result)

    def _logged_in(self, amqp: SessionLink) -> ops.LoginResult:
        if self._closed:  # by the login timeout, while the broker answered
            self._link_glue.came_too_late(amqp, session_failed=bool(self.session.errors_sent))
            return ops.LoginResult(False, "other", "closed")
        self._amqp = amqp
        return logged_in(amqp)

    def _internal_error(self) -> None:
        """Called from an ``except`` block: log the traceback (a bug), answer ERROR, close."""
        log.exception("internal error peer=%s", self.peer)
        self._steps = None
        if not self._closed:
            self._run_all(self.session.close_with_error("Internal error", "Internal error", self._frame))

    def _processing_error(self, error: ProcessingError) -> None:
        log.info("processing error peer=%s: %s", self.peer, error.detail)
        self._run_all(self.session.close_with_error(error.message, f"{error.detail}\n", self._frame))

    # ------------------------------------------------------------------ login and heart-beats
    def _established(self, op: ops.Established) -> None:
        self._parser.set_version(op.version)
        self._parser.limits = self._settings.frame_limits
        if self._login_timer is not None:
            self._login_timer.cancel()
            self._login_timer = None
        connection_log.logged_in(self, op)
        # a heart-beat every half of the client's interval (it is late after a whole one); the
        # client may be late by the tolerance (adapter.heartbeat_tolerance)
        server = self._server
        self._heartbeats.start(
            op.send_ms / 2000, op.receive_ms * server.heartbeat_tolerance / 1000, server.idle_client_timeout
        )

    # the HeartBeatHost side (adapter/server/heartbeats.py)
    def heartbeat_output_pending(self) -> bool:
        return bool(self._out)

    def write_heartbeat(self) -> None:
        if self._closed or self.transport is None:
            return
        self.transport.write(b"\n")
        self.bytes_sent += 1

    def reading_excused(self) -> bool:
        # while we are not reading the client (waiting for the broker, broker flow control)
        # its heart-beats wait unread in the socket: not the client's fault
        return bool(self._pause_reasons)

    def heartbeat_timed_out(self, interval: float) -> None:
        self.close_with_error(
            "Heart-beat timeout", f"No data received from the client for {interval:.1f} s\n"
        )

    def idle_timed_out(self, seconds: float) -> None:
        self.close_with_error(
            "Idle timeout",
            f"Nothing received from the client for {seconds:g} s and no heart-beats negotiated "
            "(adapter.idle_client_timeout)\n",
        )

    def _login_timed_out(self) -> None:
        self._login_timer = None
        session = self.session
        if self._closed or session.state is State.CONNECTED:
            return
        if self.lifecycle is Lifecycle.PROXY_HEADER:  # no STOMP peer yet to send an ERROR to
            self._refuse_proxy(
                "no complete PROXY header within the login timeout", "PROXY protocol", "proxy_timeout"
            )
            return
        self._run_all(session.close_with_error("Login timeout", "No successful CONNECT in time\n"))

    # ------------------------------------------------------------------ broker events
    def on_deliver(self, delivery: ops.Delivery) -> None:
        if self._closed:
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
        # called within a read of the broker's socket, whose on_read_done flushes: no scheduling
        self._out.append(data)
        if len(delivery.body) >= wire.ZERO_COPY_MIN:
            self._out_large = True

    def _over_budget(self, error: BudgetExceeded) -> None:
        """A delivery the session would have to keep does not fit its byte budget: ERROR, then
        close.  The delivery is not sent and stays unacknowledged, so the broker requeues it."""
        if self._closed:
            return
        log.warning("peer=%s: %s", self.peer, error.detail.rstrip("\n"))
        self.close_with_error(error.message, error.detail)

    def _count_delivered(self, consumer_tag: str) -> None:
        """Per-destination series: a MESSAGE for the subscription behind ``consumer_tag``."""
        assert self._destinations is not None
        destination = self.session.subscription_destination(consumer_tag)
        if destination is not None:
            self._destinations.count_delivered(destination)

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        if self._closed:
            return
        session = self.session
        clocks = self._clocks
        clocks.confirmed(delivery_tag, multiple)
        data = session.on_confirm(delivery_tag, multiple, ack)
        clocks.confirm_clock = 0.0
        if data:
            self._out.append(data)  # flushed by on_read_done, as for deliveries
            if not ack:
                self._close("the broker refused a message (basic.nack)")
        waiter = self._confirm_waiter
        if waiter is not None and not session.confirms_outstanding and not waiter.done():
            waiter.set_result(None)

    def on_server_cancel(self, consumer_tag: str) -> None:
        if self._closed:
            return
        session = self.session
        dispatched = session.is_dispatched(consumer_tag)
        self._write(session.on_server_cancel(consumer_tag))
        if dispatched:
            # out of its dispatcher, or messages routed to it would be rendered for a
            # subscription that is gone (and, with auto acks, acked on their way there)
            self._dispatch_op(ops.LeaveDispatch(consumer_tag))

    def on_amqp_closed(self, error: AmqpError) -> None:
        if not error.channel_only:
            self._amqp = None  # the connection itself is gone; a closed channel still needs closing
        if self._closed:
            return
        if not error.channel_only:
            # the broker closed the connection (connection.close: forced, a memory alarm ...) or
            # the link died without one (network, broker crash)
            reason = "closed_by_broker" if error.code else "connection_lost"
            self._server.stats.amqp_connection_failures[reason] += 1
        # a synchronous call of the current frame was waiting: ERROR, RECEIPT, close
        # (docs/behaviour.md#error-handling)
        self.broker_failed(error, of_frame=self._busy)

    def on_read_done(self) -> None:
        self.flush()

    def on_broker_backpressure(self, paused: bool) -> None:
        if paused:
            self._pause("broker-flow")
        else:
            self._resume("broker-flow")

    # ------------------------------------------------------------------ queue dispatchers
    def _dispatch_op(self, op: ops.DispatchOp) -> None:
        glue = self._dispatch
        if glue is None:
            session = self.session
            assert session.vhost is not None
            link = DispatchLink(self, self._settings.dispatchers, session.vhost, self._loop)
            glue = self._dispatch = DispatchGlue(
                link, self._loop, lambda: self._amqp, lambda: not self.session.plain_acks
            )
        glue.execute(op)

    def deliver_dispatched(self, delivery: ops.Delivery) -> None:
        """The queue's dispatcher gives this client a message (adapter/server/dispatching.py)."""
        if self._closed:
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
        gathered and written, coalesced, one loop turn later: DispatchGlue.flush)."""
        amqp, glue = self._amqp, self._dispatch
        if amqp is None or glue is None or not amqp.is_open:
            return  # the channel is gone: the broker has requeued it
        if ack:
            self.acks += 1
        else:
            self.nacks += 1
        glue.settle(amqp, delivery_tag, ack, requeue)

    def _leave_dispatchers(self) -> None:
        glue, self._dispatch = self._dispatch, None
        if glue is not None:
            glue.leave()

    # ------------------------------------------------------------------ shared subscriptions
    # the SharingHost side of adapter/server/sharing.py (its SharedLink is the hubs' Subscriber)
    def _op_leave_shared(self, op: ops.LeaveShared, in_frame: bool) -> None:
        if self._shared is not None:
            self._shared.leave(op.consumer_tag)

    def deliver_shared(self, member: Member, pieces: tuple[bytes, ...]) -> None:
        """One MESSAGE of a shared group: the member's own bytes around the delivery's."""
        if self._closed:
            return
        self.shared_messages += 1
        if self._destinations is not None:
            self._count_delivered(member.consumer_tag)
        if self._steps is not None or self.frame_per_write:
            data = b"".join((member.head, pieces[0], member.id_prefix, *pieces[1:]))
            if self._steps is not None:
                # behind the RECEIPT of the frame being handled (see on_deliver)
                self._held.append(data)
            else:
                self._out.append(data)  # one WebSocket message per frame
            return
        out = self._out
        out.append(member.head)
        out.append(pieces[0])
        out.append(member.id_prefix)
        out.extend(pieces[1:])
        if len(pieces) > 2:
            self._out_large = True  # a large body: written with writelines, never joined

    def shared_lag(self) -> int:
        """Bytes written for this client that its socket has not taken (or that wait behind
        the RECEIPT of the frame being handled)."""
        transport = self.transport
        unsent = transport.get_write_buffer_size() if transport is not None else 0
        if self._held:
            unsent += sum(map(len, self._held))
        return unsent

    def close_with_error(self, message: str, detail: str) -> None:
        """ERROR, then close (a timeout, a bound passed)."""
        if not self._closed:
            self._run_all(self.session.close_with_error(message, detail))

    def broker_failed(self, error: AmqpError, *, of_frame: bool) -> None:
        """The broker refused or ended something of this session: ERROR (with the RECEIPT of the
        frame being handled, ``of_frame``), then close."""
        if self._closed:
            return
        if error.code:
            self._run_all(
                self.session.on_broker_error(error.name, error.text, self._frame if of_frame else None)
            )
        else:
            self._run_all(self.session.on_connection_lost(error.text))

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
        self._liveness.wrote = True
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
        self.close_reason = reason
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
        if self._closed:
            return
        self._write(self.session.shutdown_notice())
        self._close("server shutdown")

    def _finish(self) -> None:
        if self._login_timer is not None:
            self._login_timer.cancel()
            self._login_timer = None
        self._token_expiry.cancel()
        self._heartbeats.stop()
        self._guard.release()
        self.session.on_closed()  # activemq profile: frees its client-id
        if self._steps is not None:
            self._steps.close()
            self._steps = None
        if self._confirm_waiter is not None and not self._confirm_waiter.done():
            self._confirm_waiter.cancel()
        if self._finished:
            return
        amqp = self._let_go()
        self._enter(Lifecycle.FINISHED)
        for reason in list(self.paused_since):
            self._end_pause_clock(reason)
        self._server.add_finished(self)
        connection_log.closed(self)
        if amqp is None:
            self._set_done()
        else:
            failed = bool(self.session.errors_sent)
            self._link_glue.close(amqp, self.peer, session_failed=failed, done=self._set_done)

    def _let_go(self) -> SessionLink | None:
        """The session is done with its AMQP link: leave the queue dispatchers (before the
        channel closes, so its unacknowledged messages requeue) and the shared groups; the link,
        if any, is the caller's to give back."""
        if self._dispatch is not None:
            self._leave_dispatchers()
        if self._shared is not None:
            self._shared.leave_all()
        amqp, self._amqp = self._amqp, None
        return amqp

    def _set_done(self) -> None:
        self._server.connections.discard(self)
        if not self.done.done():
            self.done.set_result(None)


# ---------------------------------------------------------------------- the operation interpreter
# a broker call: awaited in the frame's task, its result goes back into the frame's generator
_Call = Callable[[ClientConnection, Any], Awaitable[object]]
# an entry: (connection, operation, in_frame) -> what goes back into the frame's generator
_Entry = Callable[[ClientConnection, Any, bool], object]


async def _amqp_call(connection: ClientConnection, op: Any) -> object:
    amqp = connection._amqp  # noqa: SLF001 - the interpreter is the connection's own table
    assert amqp is not None
    return await amqp.execute(op)


async def _handed_back(closing: Awaitable[None], connection: ClientConnection, op: ops.RequeueGot) -> object:
    """A probe's close after a browse (``RequeueGot``): over, however it ended (a close that
    timed out dropped the socket, and the broker requeued what the probe held then)."""
    await asyncio.wait([asyncio.ensure_future(closing)])
    return None


async def _open_connection(connection: ClientConnection, op: ops.OpenConnection) -> object:
    return await connection._open_amqp(op)  # noqa: SLF001


async def _update_secret(connection: ClientConnection, op: ops.UpdateSecret) -> object:
    return await update_secret_call(connection._amqp, op.token)  # noqa: SLF001


async def _join_shared(connection: ClientConnection, op: ops.JoinShared) -> object:
    shared = connection._shared  # noqa: SLF001
    assert shared is not None
    return await shared.join(op)


def _broker_call(call: _Call) -> _Entry:
    """The entry of an operation that always waits for the broker."""

    def start(connection: ClientConnection, op: Any, in_frame: bool) -> None:
        connection._start_call(call, op, in_frame)  # noqa: SLF001

    return start


# Every operation the session emits, and what the shell does with it.  A type missing here is a
# bug that closes the connection with "Internal error" (tests/unit/test_shell_interpreter.py
# checks that every operation type has an entry).
INTERPRETER: dict[type, _Entry] = {
    ops.BasicPublish: ClientConnection._op_publish,
    ops.SendFrame: ClientConnection._op_send_frame,
    ops.BasicAck: ClientConnection._op_ack,
    ops.BasicNack: ClientConnection._op_nack,
    ops.RequeueGot: ClientConnection._op_requeue_got,
    ops.Established: ClientConnection._op_established,
    ops.CloseClient: ClientConnection._op_close_client,
    ops.DeleteQueueOnClose: ClientConnection._op_delete_on_close,
    ops.QueueDeclare: ClientConnection._op_declare,  # nowait: at once; else a broker call
    ops.OpenConnection: ClientConnection._op_open,  # pooled: at once; else the login task
    **{kind: ClientConnection._op_dispatch for kind in ops.DISPATCH_OPS},
    **{kind: _broker_call(_amqp_call) for kind in ops.BROKER_CALLS if kind is not ops.QueueDeclare},
    ops.AwaitConfirms: _broker_call(ClientConnection._await_confirms),
    ops.CloseAmqp: _broker_call(ClientConnection._close_amqp_link),
    ops.JoinShared: _broker_call(_join_shared),
    ops.LeaveShared: ClientConnection._op_leave_shared,
    ops.UpdateSecret: _broker_call(_update_secret),  # a token refresh (SEND to /auth/token)
    ops.TokenExpiry: ClientConnection._op_token_expiry,
}
