"""The broker link of one STOMP client with an AMQP connection of its own: the asyncio shell
over the sans-IO AMQP client.

Owns the socket to RabbitMQ and everything that needs the event loop: ``open()`` with its
timeout and the contract with the login's node loop (which failures are the broker refusing and
which a node failing, TLS included), the future of the handshake, the flush of the output buffer
(once per event-loop iteration, so a burst of publishes or acks costs one ``send()``), flow
control in both directions, the heart-beat timer, channel recycling for connection reuse, and
closing.  What the bytes mean (handshake, phases, deliveries, confirms, closes, encoding) is
``client.AmqpClient``'s, and the one synchronous call's future ``link.AsyncClient``'s, which this
class extends: the per-message methods the shell calls (``publish``, ``ack``, ``nack``) are the
core's own.  It is one of the two kinds of ``link.SessionLink``; the other is a channel on a
shared connection (adapter/amqp/shared.py).

Why not aio-pika's connection here: it costs ~115 µs of CPU and one socket write per message
(docs/performance.md); and a robust (reconnecting) connection is the wrong tool for a per-client
bridge, because delivery tags the STOMP client still holds would silently point at nothing after
a reconnect.  aio-pika is still a dependency: the tests use it as the independent AMQP client.

One channel per STOMP connection, as the plugin has (docs/architecture.md): delivery tags are one
counter per connection, ``basic.qos`` persists across subscriptions, a ``client`` ack is
``multiple=true`` over the whole channel, and any channel error ends the STOMP session.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import cast

from ..liveness import Liveness
from ..mapping.operations import Delivery
from . import wire
from .client import (
    CHANNEL,
    CLIENT_CAPABILITIES,
    BrokerCall,
    Phase,
    UnexpectedMethod,
    client_properties_table,
    server_properties,
)
from .errors import REPLY_CODE_NAMES, AmqpError
from .link import AsyncClient, BrokerEvents, SessionLink
from .pool import PoolKey

__all__ = [
    "CHANNEL",
    "CLIENT_CAPABILITIES",
    "REPLY_CODE_NAMES",
    "AmqpConnection",
    "AmqpError",
    "BrokerCall",
    "BrokerEvents",
    "DropChannelEvents",
    "HandshakeTimeout",
    "Phase",
    "SessionLink",
    "client_properties_table",
    "monotonic",
    "server_properties",
]

log = logging.getLogger(__name__)


class HandshakeTimeout(TimeoutError):
    """open() ran out of time: ``connected`` says whether the TCP connection was made, ``step``
    how far the AMQP handshake got (a ``Phase`` value; ``connect``: no connection.start)."""

    def __init__(self, timeout: float, connected: bool, step: str) -> None:
        if not connected:
            what = f"no TCP connection within {timeout:g} s"
        elif step == Phase.CONNECT:
            what = f"TCP connected, but no connection.start within {timeout:g} s"
        else:
            what = f"TCP connected, but the AMQP handshake did not finish within {timeout:g} s ({step})"
        super().__init__(what)
        self.connected = connected
        self.step = step


class DropChannelEvents:
    """The ``BrokerEvents`` of a connection that no session reads from (an idle pooled one, or
    a shared one, whose channels' events go to their sessions): deliveries, confirms, cancels and
    the end of a read are dropped; a subclass says what a close and a block mean to its owner."""

    __slots__ = ()

    def on_deliver(self, delivery: Delivery) -> None:
        pass

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        pass

    def on_server_cancel(self, consumer_tag: str) -> None:
        pass

    def on_read_done(self) -> None:
        pass


class AmqpConnection(AsyncClient, asyncio.Protocol):
    """A session's link with a connection of its own (``SessionLink``; the shared connection
    extends it, adapter/amqp/shared.py)."""

    def __init__(
        self, events: BrokerEvents, *, heartbeat: int, connection_name: str, reusable: bool = False
    ) -> None:
        super().__init__(
            events,
            asyncio.get_running_loop(),
            heartbeat=heartbeat,
            client_properties=client_properties_table(connection_name),
            reusable=reusable,
        )
        # with reuse: the (node, vhost, user) key, passcode digest and login time the broker
        # authenticated this connection with (adapter/server/amqp_pool.py)
        self.pool_identity: tuple[PoolKey, bytes, float] | None = None
        self._connection_name = connection_name
        self._handshake: asyncio.Future[None] = self._loop.create_future()
        # open() handed this link to its caller; until then no failure is the session's news
        self._opened = False
        self._failed_before_handover: AmqpError | None = None
        self._reading_paused = False
        self._paused_writing = False
        self._closed: asyncio.Future[None] = self._loop.create_future()
        # heart-beats (kept apart, below): the monitor the STOMP shell uses too, ticked at half
        # the negotiated interval; four silent ticks (two heart-beat periods) fail the link
        self._liveness = Liveness(misses_allowed=4)
        self._heartbeat_handle: asyncio.TimerHandle | None = None

    # --------------------------------------------------------------------- opening
    @classmethod
    async def open(
        cls,
        events: BrokerEvents,
        *,
        host: str,
        port: int,
        user: str,
        password: str,
        vhost: str,
        heartbeat: int,
        timeout: float,
        connection_name: str,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        reusable: bool = False,
    ) -> AmqpConnection:
        """Connect, authenticate and open the vhost (the channel opens with its first frame).
        Raises AmqpError (the broker refused: final for this login) or OSError / TimeoutError
        (this node failed: try another; ssl.SSLError for TLS problems)."""
        loop = asyncio.get_running_loop()
        protocol = cls(events, heartbeat=heartbeat, connection_name=connection_name, reusable=reusable)
        protocol._credentials = (user, password, vhost)
        connected = False
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(
                    lambda: protocol, host, port, ssl=ssl_context, server_hostname=server_hostname
                )
                connected = True
                await protocol._handshake
        except TimeoutError as error:
            protocol._give_up()
            # which step ran out of time tells the operator what failed: no TCP connection
            # (host down, packets dropped, the broker's accept queue full) or a TCP connection
            # the broker never answered (a broker out of sockets keeps it waiting unanswered)
            raise HandshakeTimeout(timeout, connected, protocol.handshake_step) from error
        except BaseException:
            protocol._give_up()
            raise
        if protocol._failed_before_handover is not None:
            # open-ok and a close (say CONNECTION_FORCED) in one read: the handshake finished,
            # then the link failed before open() could hand it over; this node failed
            protocol._abort()
            raise ConnectionResetError(
                f"the node closed the connection as it opened: {protocol._failed_before_handover.text}"
            )
        protocol._opened = True
        return protocol

    def _give_up(self) -> None:
        """open() gave up (refused, failed, or timed out, possibly in the very iteration the
        handshake finished): the link is dropped, and nothing it reports later reaches the
        session, which may have logged in on another node by then."""
        if not self._handshake.done():
            self._handshake.cancel()  # so a late failure leaves no unretrieved exception
        self._abort()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same methods
        self._transport = cast(asyncio.Transport, transport)
        self.flush()  # the protocol header

    def _handshake_done(self) -> None:
        if self.heartbeat:
            self._schedule_heartbeat()
        if not self._handshake.done():
            self._handshake.set_result(None)

    # --------------------------------------------------------------------- reading
    def data_received(self, data: bytes) -> None:
        self._liveness.read = True
        try:
            self._reader.feed(data)
        except UnexpectedMethod as error:
            self._refuse_input(503, f"unexpected method from the broker: {error}")
        except wire.DecodeError as error:
            # the broker sent bytes we cannot read: bad input, not a bug, so no traceback
            self._refuse_input(501, f"undecodable frame from the broker: {error}")
        except Exception as error:  # a bug: report it, but end only this client's link
            log.exception("internal error on a frame from the broker%s", self.delivery_context())
            self._refuse_input(541, f"internal error on a frame from the broker: {error}")
        # deliveries and receipts of this read go to the client now, in one write
        self._events.on_read_done()
        self.flush()

    def _refuse_input(self, code: int, text: str) -> bool:
        """End the link after a frame that could not be handled: tell the broker (so it requeues
        what this client had not acknowledged), reject any waiting call, and let the session
        send the client an ERROR naming the cause; the socket goes within 5 s either way."""
        if code != 541:
            log.warning("%s%s; closing the link %s", text, self.delivery_context(), self._connection_name)
        queued = super()._refuse_input(code, text)
        if queued and self._transport is not None:
            self._loop.call_later(5.0, self._abort)
        return queued

    def _blocked_changed(self) -> None:
        self._events.on_broker_backpressure(self._blocked or self._paused_writing)

    def _close_ok_received(self) -> None:
        self._close_transport()

    # --------------------------------------------------------------------- writing
    def flush(self) -> None:
        """Write what is buffered now (see ClientConnection.flush)."""
        out = self._out
        if not out or self._transport is None:
            return
        self._out = []
        self._liveness.wrote = True
        if self._out_large:
            # large bodies go to the socket as the slices they are (one writev, no copy)
            self._out_large = False
            self._transport.writelines(out)
        else:
            self._transport.write(b"".join(out) if len(out) > 1 else out[0])

    def pause_writing(self) -> None:
        self._paused_writing = True
        self._events.on_broker_backpressure(True)

    def resume_writing(self) -> None:
        self._paused_writing = False
        self._events.on_broker_backpressure(self._blocked)

    def pause_reading(self) -> None:
        if self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._reading_paused = False
            self._transport.resume_reading()

    # --------------------------------------------------------------------- synchronous calls
    # execute and call are AsyncClient's (adapter/amqp/link.py)
    async def delete_queue_on_fresh_channel(self, queue: str) -> None:
        """After the broker closed the session's channel: open another one and delete ``queue``
        there."""
        self._closing = True  # further failures are not news for the session
        self.declared_connection_queue = True  # it was the session's: this connection is not reused
        spare = self._spare_channel()
        await self.call(wire.channel_open(spare), wire.CHANNEL_OPEN_OK)
        await self.call(wire.queue_delete(spare, queue), wire.QUEUE_DELETE_OK)

    # --------------------------------------------------------------------- reuse
    # adapter.amqp_connection_reuse (adapter/server/amqp_pool.py): a connection serves one STOMP
    # session after the other; at the end of each, its channel is closed and the next session's
    # opened with a new number, so nothing of a session (consumers, qos, confirm mode, delivery
    # tags) reaches the next one.
    def attach(self, events: BrokerEvents) -> None:
        """From now on broker events go to ``events`` (the next session, or the pool)."""
        self._events = events

    async def recycle_channel(self) -> None:
        """Close the session's channel and wait for close-ok: by then the broker has cancelled
        the session's consumers and requeued what it had not acknowledged, and nothing more
        comes on that channel.  The next session's channel has a new number and is opened by
        its first frame, like a fresh login's.  Raises AmqpError."""
        if self._reading_paused:
            # a slow client paused the broker's socket; the next session must read it (and the
            # channel's close-ok must be read first)
            self.resume_reading()
        if self._channel_unopened:
            return  # the session wrote nothing on its channel: there is nothing to reset
        await self.call(wire.channel_close(self.channel), wire.CHANNEL_CLOSE_OK)
        self._next_channel()

    @property
    def reusable(self) -> bool:
        """Fit to serve another session: open, never failed, not blocked by the broker nor
        with its socket full or its reading paused, not closing, no call waiting, no
        connection-bound queue left by a session."""
        return (
            self._reusable
            and self._transport is not None
            and not self._close_sent
            and not self._closing
            and not self.had_error
            and not self.declared_connection_queue
            and not self._blocked
            and not self._paused_writing
            and not self._reading_paused
            and self._rpc is None
        )

    # --------------------------------------------------------------------- heart-beats
    # Kept as they were, apart from the AMQP client (which only negotiates the interval), so
    # that the shared heart-beat monitor can replace this section later: two flags set by
    # data_received and flush, a half-period timer.
    def _schedule_heartbeat(self) -> None:
        self._heartbeat_handle = self._loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    def _heartbeat_tick(self) -> None:
        if self._transport is None:
            return
        liveness = self._liveness
        if liveness.send_tick(bool(self._out)):
            self._transport.write(wire.HEARTBEAT_FRAME)
        # while we hold the broker back for a slow client, its heart-beats wait unread: excused
        if liveness.receive_tick(self._reading_paused):
            self._fail(AmqpError(0, f"missed heart-beats from the broker for {2 * self.heartbeat} s"))
            self._abort()
            return
        self._schedule_heartbeat()

    # --------------------------------------------------------------------- closing
    def _failed(self, error: AmqpError) -> None:
        """The link is unusable: reject the pending call and tell the session once."""
        if not self._handshake.done():
            if error.code == 320:  # CONNECTION_FORCED: this node is shutting down, try another
                self._node_failed(f"the node closed the connection: {error.text}")
            else:
                self._handshake.set_exception(error)
            return
        if not self._opened:
            # open() failed or gave up (the session never had this link), or has yet to resume
            # after the handshake finished: it checks this and tries another node
            if self._failed_before_handover is None:
                self._failed_before_handover = error
            return
        super()._failed(error)

    def _node_failed(self, message: str) -> None:
        """End the handshake as a failure of this node (an OSError for open()'s caller, which
        tries the next node), not as a refusal by the broker."""
        self.had_error = True
        self._handshake.set_exception(ConnectionResetError(message))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        step = self.handshake_step
        self._lost()
        if self._heartbeat_handle is not None:
            self._heartbeat_handle.cancel()
        if not self._handshake.done() and (isinstance(exc, ssl.SSLError) or step != Phase.AUTH):
            # the node failed, the broker refused nothing: open() raises an OSError and the
            # login tries the next node.  A TLS alert is named as such (e.g. a broker that wants
            # a client certificate: TLS 1.3 says so only after the handshake).  A close before
            # connection.start or after connection.open was sent is a node going away:
            # RabbitMQ refuses a vhost with connection.close.  Only a close right after
            # start-ok stays a refused login: RabbitMQ reports a bad password with
            # connection.close (authentication_failure_close), other brokers by closing.
            if isinstance(exc, ssl.SSLError):
                self.had_error = True
                self._handshake.set_exception(exc)
            else:
                where = "before connection.start" if step == Phase.CONNECT else "opening the vhost"
                how = "reset" if isinstance(exc, ConnectionResetError) else "closed"
                self._node_failed(f"the node {how} the connection {where}" + (f": {exc}" if exc else ""))
        else:
            reason = str(exc) if exc else "connection closed by the broker"
            self._fail(AmqpError(0, reason, phase=step))
        if not self._closed.done():
            self._closed.set_result(None)

    def _abort(self) -> None:
        """Drop a link judged dead (missed heart-beats, bad input, a failed open) now: abort,
        not close, as close() would keep the socket (and what is buffered for it) until a peer
        that no longer reads has taken it all."""
        if self._transport is not None:
            self._transport.abort()

    def _close_transport(self) -> None:
        """End a link whose AMQP close is done or overdue: close(), which still hands the broker
        what is buffered (e.g. SENDs without receipts while a resource alarm blocks us)."""
        if self._transport is not None:
            self._transport.close()

    async def close(self, timeout: float = 5.0) -> None:
        """Close cleanly: the broker cancels consumers and requeues unacknowledged messages."""
        if self._transport is None:
            return
        self._closing = True
        self._send_close()
        self.flush()
        if self._reading_paused:
            self.resume_reading()  # close-ok must be read
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._closed)
        except TimeoutError:
            self._close_transport()

    def drop(self) -> None:
        """End the connection now, without the AMQP close (the end of a shutdown whose deadline
        came first): what is buffered still goes (a clean TCP close, not a reset where it can
        be helped), and the broker cleans up as for a client that went away: it requeues the
        unacknowledged messages and deletes the exclusive and auto-delete queues."""
        self._closing = True
        self.flush()
        self._close_transport()

    def close_nowait(self) -> None:
        """Ask the broker to close, without waiting (used when the STOMP side is already gone)."""
        if self._transport is None:
            return
        self._closing = True
        self._send_close()
        self.flush()
        self._loop.call_later(5.0, self._close_transport)

    @property
    def peer_address(self) -> str | None:
        """The broker's IP address this connection reached."""
        if self._transport is None:
            return None
        peer = self._transport.get_extra_info("peername")
        return str(peer[0]) if peer else None

    @property
    def is_open(self) -> bool:
        """The socket is up and nobody has asked the broker to close the connection yet."""
        return self._transport is not None and not self._close_sent


def monotonic() -> float:
    return time.monotonic()
