"""The asyncio shell around one STOMP client: the transport, its timers, flow control and close.

``ClientConnection`` holds the client's sans-IO STOMP connection (``StompConnection``,
adapter/session/connection.py: the pump, the quick paths, the operation interpreter, the
sources of MESSAGEs and the RECEIPT-before-MESSAGE order) and keeps only what needs a socket or
a loop: it feeds the socket's bytes in, builds the client's output (``ClientOutput``,
adapter/stomp/output.py: the bytes for the client and the transport they are written to, as
the transport takes frames), binds it to the transport while the client can be written to,
flushes it at the end of every read and counts what it wrote, and carries out the operations
that need the shell.  The rest is an object of its own, which the shell holds:

* ``client_link.ClientLink``: the login, the broker calls of the frame being handled, the
  link's events and release (over ``LinkGlue``, adapter/amqp/link_lifecycle.py);
* ``client_features.ClientFeatures``: the shared subscriptions and the queue dispatchers;
* ``client_timers.ClientTimers``: the login timeout, the heart-beats and an OAuth 2.0 token's
  expiry;
* ``flow.FlowControl``: the pause reasons of the client's socket and their clocks;
* ``half_close.HalfClose``: the half-close and the linger after it;
* ``input_guard.InputGuard``: the incomplete-input budget and the frame timeout;
* ``proxy_prelude.ProxyPrelude``: the PROXY header before the first STOMP byte.

The pump runs inside ``data_received`` as long as operations need no reply (SEND, ACK, MESSAGE
...), so the per-message path has no task, future or queue.  When an operation must wait for the
broker (declare, consume, login ...), ``ClientLink`` runs it as a task and the socket is not read
until the reply arrives, which keeps frames strictly in order.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from ..amqp import wire
from ..amqp.connection import SessionLink
from ..amqp.login import BrokerSettings, tls_failure
from ..busy_poll import NO_POLL, BusyPoller, NoPoll, poller_of
from ..mapping import operations as ops
from ..mapping.budget import BudgetExceeded
from ..session import Session, SessionSettings, new_session_id
from ..session.connection import INTERPRETER, ConnectionCounters, Lifecycle, StompConnection
from ..stomp.output import STREAM_FRAMES, ClientOutput, FrameOutput
from . import connection_log
from .client_features import ClientFeatures
from .client_link import ClientLink
from .client_timers import ClientTimers
from .flow import FlowControl
from .half_close import HalfClose
from .input_guard import InputGuard
from .latency import LatencyClocks
from .proxy_prelude import ProxyPrelude, address, is_loopback, refuse_untrusted_proxy
from .server_state import ConnectionServices, ConnectionSettings, ServerState, SharedCounters

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

log = logging.getLogger("adapter.connection")

# Stop reading from the client while this many bytes of parsed-but-unhandled input wait
_MAX_BUFFERED_INPUT = 1024 * 1024

_PROXY_HEADER = Lifecycle.PROXY_HEADER


class ClientConnection(asyncio.Protocol):
    """One STOMP client.  ``proxy_protocol`` (default: the TCP listeners' setting) makes it
    expect a PROXY header first; ``label`` names the transport in the log ("WebSocket ");
    ``listener`` is the kind of listener in the metrics (tcp, tls or websocket); ``frames`` how
    the transport takes frames (a byte stream by default; WebSocket: one message each)."""

    def __init__(
        self,
        server: ServerState,
        *,
        proxy_protocol: bool | None = None,
        label: str = "",
        listener: str = "tcp",
        client_address: tuple[str, int] | None = None,
        session_settings: SessionSettings | None = None,
        frames: FrameOutput = STREAM_FRAMES,
    ) -> None:
        self._server = server
        self.performed = _PERFORMED  # the operations the STOMP connection hands to the shell
        # the client's address from a PROXY header read before the TLS handshake (listener.py)
        self._client_address = client_address
        expect_proxy = server.proxy_protocol if proxy_protocol is None else proxy_protocol
        self._proxy = ProxyPrelude(server.stats) if expect_proxy else None
        self.label = label  # the transport's name in the log
        self.listener = listener
        self._loop = loop = asyncio.get_running_loop()
        # the loop's spin after a read (adapter/busy_poll.py), from the login on: not for a login's steps
        self.busy_poll: BusyPoller | NoPoll = NO_POLL
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        # a listener may give its clients other settings (adapter.activemq_listeners: the profile);
        # the session exists from the start; connection_made tells it whether its peer is local
        self.session = session = Session(
            session_settings or server.session_settings,
            session_id=new_session_id(os.urandom(16)),
            peer_is_loopback=False,
        )
        clocks = LatencyClocks(server.stats)
        session.on_receipt = clocks.receipt_sent
        # time.monotonic, not loop.time: uvloop's clock has millisecond steps
        self.counters = ConnectionCounters(time.monotonic())
        self.flow = FlowControl()
        # the same set as flow.reasons, under the name a cluster test reads it by
        # (tests/cluster/test_resource_alarm.py)
        self._pause_reasons = self.flow.reasons
        self.link = ClientLink(self, server, loop)
        # the bytes for the client, bound to the transport from connection_made
        self.output = ClientOutput(frames, wire.ZERO_COPY_MIN)
        self.stomp: StompConnection[SessionLink] = StompConnection(
            session,
            self,
            self.link,
            self.output,
            clocks,
            server.stats.destinations,
            self.counters,
        )
        self.features = ClientFeatures(self, self.stomp, server, loop)
        self.timers = ClientTimers(self, self.stomp, self.flow, server, loop)
        # the heart-beat monitor's flags, set on every read and write
        self._liveness = self.timers.liveness
        self._guard = InputGuard(server, loop, self._fail_input, lambda: self.peer)
        self._flush_handle: asyncio.Handle | None = None
        self._linger: HalfClose | None = None  # after our half-close, see close
        self.close_reason = ""  # why it closed, for the close log line
        self.done: asyncio.Future[None] = loop.create_future()

    @property
    def closed(self) -> bool:
        """Closed by either side (the AMQP connection may still be closing)."""
        return self.stomp.closed

    @property
    def _amqp(self) -> SessionLink | None:
        """The session's AMQP link (its holder is ``stomp.amqp``), under the name an integration
        test reads it by (tests/integration/test_connection_reuse.py)."""
        return self.stomp.amqp

    # ------------------------------------------------------------------ socket events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = self.flow.transport = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport
        self.output.transport = self.transport
        server = self._server
        server.open_sockets.add(self)
        peername = transport.get_extra_info("peername")
        host, port = (peername[0], peername[1]) if peername else ("?", 0)
        self.peer = address(host, port)
        proxy = None
        if self._client_address is not None:
            proxy, (host, port) = self.peer, self._client_address
            self.peer = address(host, port)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            server.tune_socket(sock)
            server.descriptors.accepted(sock.fileno())
        self.session.peer_is_loopback = is_loopback(host)
        server.connections.add(self)
        server.stats.connections_opened[self.listener] += 1
        # the login timeout also bounds a PROXY header that arrives slowly
        self.timers.start_login()
        if self._proxy is not None:
            self.stomp.enter(_PROXY_HEADER)  # the peer is the proxy: wait for the client's address
            if not self._proxy.trusted(server.proxy_trust, host, self.peer):
                self._refuse_proxy(self._proxy.refusal)
            return
        self.stomp.enter(Lifecycle.OPEN)
        connection_log.opened(self, f" via proxy {proxy}" if proxy is not None else "")

    def _refuse_proxy(self, reason: str) -> None:
        """No STOMP peer yet to send an ERROR to (the bytes may not even be STOMP): close at
        once."""
        self.stomp.enter(Lifecycle.CLOSED)
        self.close_reason = reason
        if self.transport is not None:
            self.transport.abort()
        self._finish()

    def data_received(self, data: bytes) -> None:
        self.busy_poll.touch()
        self._liveness.read = True
        self.counters.bytes_received += len(data)
        stomp = self.stomp
        if stomp.closed:
            return
        if stomp.lifecycle is _PROXY_HEADER:
            assert self._proxy is not None
            opened = self._proxy.opened(data, self.peer)
            if opened is None:
                if self._proxy.refusal:
                    self._refuse_proxy(self._proxy.refusal)
                return
            stomp.enter(Lifecycle.OPEN)
            if opened.source is not None:
                proxy, self.peer = self.peer, address(*opened.source)
                self.session.peer_is_loopback = is_loopback(opened.source[0])
                connection_log.opened(self, f" via proxy {proxy}")
            else:
                connection_log.opened(self, " (PROXY header without a client address)")
            data = opened.rest
            if not data:
                return
        stomp.parser.feed(data)  # receive_data, without the call
        self.pump_batch()

    def pump_batch(self) -> None:
        """Handle the frames available now, then write what they produced: publishes and acks
        to the broker (the AMQP link only buffers them), then RECEIPTs and ERRORs to the
        client, one write per socket."""
        stomp = self.stomp
        stomp.in_read = True
        try:
            try:
                stomp.pump()
            except Exception:  # a bug must not take the server down: report it, close this client
                stomp.internal_error()
            if not stomp.closed:
                held = stomp.parser.buffered
                if held > _MAX_BUFFERED_INPUT and stomp.busy:
                    self.flow.pause("input")
                elif "input" in self._pause_reasons:  # the usual read skips the call
                    self.flow.resume("input")
                guard = self._guard
                if held or guard.held:  # the common case, every byte read a whole frame, skips it
                    guard.account(held, self.counters.bytes_received - held, stomp.busy)
        finally:
            stomp.in_read = False
        if stomp.amqp is not None:
            stomp.amqp.flush()
        self.flush()

    def _fail_input(self, message: str, detail: str) -> None:
        """The input guard's verdict: ERROR naming the limit, then close."""
        self.stomp.close_with_error(message, detail)
        self.flush()

    def mark_read(self) -> None:
        """Input that carried no STOMP bytes (a WebSocket pong) still shows the client is alive."""
        self._liveness.read = True

    def eof_received(self) -> bool:
        return False  # the transport closes itself; after our half-close this ends the linger

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.open_sockets.discard(self)
        self.transport = self.flow.transport = self.output.transport = None
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if not self.stomp.closed:
            self.stomp.enter(Lifecycle.CLOSED)
            self.close_reason = (
                f"client closed the connection ({exc})" if exc else "client closed the connection"
            )
        self._finish()

    def pause_writing(self) -> None:
        # the client reads slower than the broker delivers: stop reading deliveries from the
        # broker, so TCP back-pressure reaches RabbitMQ instead of our memory
        self.flow.start_clock("slow-client")
        if self.stomp.amqp is not None:
            self.stomp.amqp.pause_reading()
        self.features.set_paused(True)  # and nothing routed from other channels either

    def resume_writing(self) -> None:
        self.flow.stop_clock("slow-client")
        if self.stomp.amqp is not None:
            self.stomp.amqp.resume_reading()
        self.features.set_paused(False)

    # ------------------------------------------------------------------ what the STOMP connection asks
    def over_budget(self, error: BudgetExceeded, later: bool) -> None:
        """A delivery the session would have to keep does not fit its byte budget: ERROR, then
        close (``later``: one loop turn later).  The delivery is not sent and stays
        unacknowledged, so the broker requeues it."""
        if later:
            self._loop.call_soon(self.over_budget, error, False)
            return
        if self.stomp.closed:
            return
        log.warning("peer=%s: %s", self.peer, error.detail.rstrip("\n"))
        self.stomp.close_with_error(error.message, error.detail)

    def login_timed_out(self) -> None:
        if self.stomp.lifecycle is _PROXY_HEADER:  # no STOMP peer yet to send an ERROR to
            assert self._proxy is not None
            self._refuse_proxy(self._proxy.timed_out(self.peer))
            return
        self.stomp.close_with_error("Login timeout", "No successful CONNECT in time\n")

    # ------------------------------------------------------------------ output
    def flush_soon(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what is buffered now (``ClientOutput.flush``: to the transport, as it takes
        frames).  Called at the end of every read from either socket, so a batch goes out
        without waiting for the next loop iteration (latency); ``flush_soon`` still covers
        writes made outside a read (timers, tasks), one loop turn later."""
        self._flush_handle = None  # a flush already scheduled finds nothing left, or what came since
        sent = self.output.flush()
        if sent:
            self._liveness.wrote = True
            self.counters.bytes_sent += sent

    def write_heartbeat(self) -> None:
        if self.stomp.closed or self.transport is None:
            return
        self.transport.write(b"\n")
        self.counters.bytes_sent += 1

    # ------------------------------------------------------------------ closing
    def close(self, reason: str) -> None:
        """Flush what was written, close the client socket, release the AMQP connection."""
        if self.stomp.closed:
            return
        self.stomp.enter(Lifecycle.CLOSED)
        self.close_reason = reason
        self.flush()
        transport = self.transport
        if transport is not None:
            if transport.can_write_eof():
                self._linger = HalfClose(self._loop, transport)  # adapter/server/half_close.py
                self.output.transport = None  # after our half-close nothing more goes to the client
            else:
                transport.close()  # sends buffered bytes first
        self._finish()

    def abort(self) -> None:
        """End of server shutdown: drop the socket if it is still open (lingering)."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self.transport is not None:
            self.transport.abort()

    def shutdown(self) -> None:
        """Server shutdown: tell the client why, then close."""
        if self.stomp.closed:
            return
        self.stomp.write(self.session.shutdown_notice())
        self.close("server shutdown")

    def _finish(self) -> None:
        """Closed by either side: everything the connection holds goes, once (a close that
        lingers finishes at once; its socket's end later finds it finished)."""
        stomp = self.stomp
        if stomp.finished:
            return
        self.timers.stop()
        self._guard.release()
        self.session.on_closed()  # activemq profile: frees its client-id
        if stomp.steps is not None:
            stomp.steps.close()
            stomp.steps = None
        stomp.enter(Lifecycle.FINISHED)
        self.flow.stop_clocks()
        self._server.add_finished(self)
        connection_log.closed(self)
        self.link.finish(self._set_done)
        # the parts have let go of this shell (timers, input guard, features, link); the STOMP
        # connection lets go of it and of the link too, so nothing refers back and reference
        # counting frees the finished connection; a late event finds no-ops
        stomp.shell = stomp.broker = _Finished(self.peer)

    def _set_done(self) -> None:
        self._server.connections.discard(self)
        if not self.done.done():
            self.done.set_result(None)


class _Finished:
    """What a finished STOMP connection has as its shell and its broker side: nothing to
    write, close, pump or call any more (its peer stays for a late log line)."""

    __slots__ = ("peer",)

    performed: dict[type, Callable[[Any, Any, bool], object]] = collections.defaultdict(lambda: _nothing)

    def __init__(self, peer: str) -> None:
        self.peer = peer

    def flush(self) -> None:
        pass

    def flush_soon(self) -> None:
        pass

    def close(self, reason: str) -> None:
        pass

    def over_budget(self, error: BudgetExceeded, later: bool) -> None:
        pass

    def start_call(self, op: ops.Operation) -> None:
        pass

    def confirms_settled(self) -> None:
        pass

    def amqp_closed(self, error: Any) -> None:
        pass

    def broker_backpressure(self, paused: bool) -> None:
        pass


def _nothing(shell: object, op: object, in_frame: bool) -> None:
    """An operation for the shell of a finished connection: there is none any more."""


# ---------------------------------------------------------------------- the shell's operations
def _established(shell: ClientConnection, op: ops.Established, in_frame: bool) -> None:
    connection_log.logged_in(shell, op)
    shell.timers.logged_in(op)
    shell.busy_poll = poller_of(asyncio.get_running_loop())


def _close_client(shell: ClientConnection, op: ops.CloseClient, in_frame: bool) -> None:
    shell.close(op.reason)


def _delete_on_close(shell: ClientConnection, op: ops.DeleteQueueOnClose, in_frame: bool) -> None:
    shell.link.glue.delete_on_close.append(op.queue)  # deleted before the AMQP link goes


def _open(shell: ClientConnection, op: ops.OpenConnection, in_frame: bool) -> object:
    return shell.link.open(op, in_frame)


def _requeue_got(shell: ClientConnection, op: ops.RequeueGot, in_frame: bool) -> None:
    shell.link.requeue_got(op, in_frame)


def _dispatch(shell: ClientConnection, op: ops.DispatchOp, in_frame: bool) -> None:
    shell.features.dispatch_op(op)


def _leave_shared(shell: ClientConnection, op: ops.LeaveShared, in_frame: bool) -> None:
    shell.features.leave_shared(op)


def _token_expiry(shell: ClientConnection, op: ops.TokenExpiry, in_frame: bool) -> None:
    shell.timers.token_expires(op.expires_at)  # an OAuth 2.0 token's exp (client_timers.py)


# The operations the STOMP connection's INTERPRETER hands to the shell, and what it does.
_PERFORMED: dict[type, Callable[[ClientConnection, Any, bool], object]] = {
    ops.Established: _established,
    ops.CloseClient: _close_client,
    ops.DeleteQueueOnClose: _delete_on_close,
    ops.OpenConnection: _open,
    ops.RequeueGot: _requeue_got,
    ops.LeaveShared: _leave_shared,
    ops.TokenExpiry: _token_expiry,
    **{kind: _dispatch for kind in ops.DISPATCH_OPS},
}
