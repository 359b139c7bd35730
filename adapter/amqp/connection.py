"""The asyncio socket to RabbitMQ over the AMQP connection core, and the session's link with a
connection of its own.

``AmqpSocket`` is the one asyncio shell over a ``client.ConnectionCore``: it owns the socket and
everything that needs the event loop: ``connect()`` with its timeout and the contract with the
login's node loop (which failures are the broker refusing and which a node failing, TLS
included), the future of the handshake, the flush of the connection's output buffer, flow
control in both directions, the heart-beat timer, and closing.  What the bytes
mean (handshake, phases, connection methods) is the core's.  It reports to its owner
(``SocketOwner``): a session's link with a connection of its own (``AmqpConnection``, here) or a
shared connection (adapter/amqp/shared.py), each of which owns one socket.

``AmqpConnection`` is a session's link (``link.SessionLink``) made of that socket and one
channel (``link.AsyncChannel``: the channel core and its call's future); the connection core
hands every frame after the handshake straight to that channel core (``ConnectionCore.carry``).
The per-message methods the shell calls (``publish``, ``ack``, ``nack``) are the channel core's
own, bound at construction: no call in between.  With ``adapter.amqp_connection_reuse`` it also
recycles its channel for the next session.

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
from collections.abc import Awaitable
from typing import Generic, Protocol, TypeVar, cast

from ..busy_poll import NO_POLL, BusyPoller, NoPoll, poller_of
from ..liveness import Liveness
from ..mapping.destinations import BrokerGeneration
from . import wire
from .client import (
    CHANNEL,
    CLIENT_CAPABILITIES,
    BrokerCall,
    ConnectionCore,
    Phase,
    UnexpectedMethod,
    client_properties_table,
    server_properties,
)
from .errors import REPLY_CODE_NAMES, AmqpError
from .link import AsyncChannel, BrokerEvents, SessionLink
from .pool import PoolKey

__all__ = [
    "CHANNEL",
    "CLIENT_CAPABILITIES",
    "REPLY_CODE_NAMES",
    "AmqpConnection",
    "AmqpError",
    "AmqpSocket",
    "BrokerCall",
    "BrokerEvents",
    "HandshakeTimeout",
    "NotAmqp",
    "Phase",
    "SessionLink",
    "client_properties_table",
    "monotonic",
    "server_properties",
]

log = logging.getLogger(__name__)


class HandshakeTimeout(TimeoutError):
    """connect() ran out of time: ``connected`` says whether the TCP connection was made,
    ``step`` how far the AMQP handshake got (a ``Phase`` value; ``connect``: no
    connection.start)."""

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


class NotAmqp(ConnectionError):
    """The node's first bytes were not AMQP 0-9-1: another server listens on the port (a STOMP
    or HTTP one given by mistake, an AMQP 1.0-only broker).  A failure of the node, as a reset
    is, so the login tries the next one; the text shows what it answered."""

    def __init__(self, first_bytes: bytes) -> None:
        super().__init__(f"the node answered in another protocol than AMQP 0-9-1, starting {first_bytes!r}")


class SocketOwner(Protocol):
    """What the socket tells the link (or shared connection) that owns it."""

    def read_done(self) -> None:
        """A read was handed to the core (deliveries and receipts of it go to the client now)."""

    def connection_failed(self, error: AmqpError) -> None:
        """The connection is unusable (only once the socket was handed over by ``connect``)."""

    def backpressure(self, paused: bool) -> None:
        """The broker blocked the connection, or its socket is full (or neither any more)."""

    def socket_ended(self) -> None:
        """The socket has ended and told everything it had to tell: nothing more comes from
        it (the owner lets go of what refers back to it)."""


Owner = TypeVar("Owner", bound=SocketOwner)


class _Ended:
    """The owner and the core's hooks of a socket that has ended: nothing more is told."""

    def read_done(self) -> None:
        pass

    def connection_failed(self, error: AmqpError) -> None:
        pass

    def backpressure(self, paused: bool) -> None:
        pass

    def socket_ended(self) -> None:
        pass

    def handshake_done(self) -> None:
        pass

    def close_ok_received(self) -> None:
        pass

    def blocked_changed(self) -> None:
        pass


_ENDED = _Ended()


class AmqpSocket(asyncio.Protocol, Generic[Owner]):
    """The asyncio shell over one ``ConnectionCore`` (see the module docstring); its core's
    ``ConnectionHooks``."""

    def __init__(
        self,
        owner: Owner,
        *,
        heartbeat: int,
        connection_name: str,
        many_channels: bool = False,
        credentials: tuple[str, str, str] = ("", "", "/"),
    ) -> None:
        self.owner = owner
        self.loop = asyncio.get_running_loop()
        # the loop's spin after a read (adapter/busy_poll.py), once the handshake is done
        self.busy_poll: BusyPoller | NoPoll = NO_POLL
        self.name = connection_name
        self.core = ConnectionCore(
            self,
            heartbeat=heartbeat,
            client_properties=client_properties_table(connection_name),
            many_channels=many_channels,
            credentials=credentials,
        )
        self.transport: asyncio.Transport | None = None
        self._handshake: asyncio.Future[None] = self.loop.create_future()
        # connect() handed the owner over; until then no failure is the session's news
        self.opened = False
        self._failed_before_handover: AmqpError | None = None
        self.reading_paused = False
        self.writing_paused = False
        self._closed: asyncio.Future[None] = self.loop.create_future()
        # heart-beats (below): the monitor the STOMP shell uses too, ticked at half the
        # negotiated interval; four silent ticks (two heart-beat periods) fail the link.  A read
        # or a write on any channel is one on the socket.
        self.liveness = Liveness(misses_allowed=4)
        self._heartbeat_handle: asyncio.TimerHandle | None = None

    # --------------------------------------------------------------------- opening
    async def connect(
        self,
        *,
        host: str,
        port: int,
        timeout: float,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> Owner:
        """Connect, authenticate and open the vhost (the core's credentials; channels open with
        their first frame); returns the owner, handed over.  Raises AmqpError (the broker
        refused: final for this login) or OSError / TimeoutError (this node failed: try another;
        ssl.SSLError for TLS problems)."""
        connected = False
        try:
            async with asyncio.timeout(timeout):
                await self.loop.create_connection(
                    lambda: self, host, port, ssl=ssl_context, server_hostname=server_hostname
                )
                connected = True
                await self._handshake
        except TimeoutError as error:
            self._give_up()
            # which step ran out of time tells the operator what failed: no TCP connection
            # (host down, packets dropped, the broker's accept queue full) or a TCP connection
            # the broker never answered (a broker out of sockets keeps it waiting unanswered)
            raise HandshakeTimeout(timeout, connected, self.core.handshake_step) from error
        except BaseException:
            self._give_up()
            raise
        if self._failed_before_handover is not None:
            # open-ok and a close (say CONNECTION_FORCED) in one read: the handshake finished,
            # then the link failed before connect() could hand it over; this node failed
            self.abort()
            raise ConnectionResetError(
                f"the node closed the connection as it opened: {self._failed_before_handover.text}"
            )
        self.opened = True
        return self.owner

    def _give_up(self) -> None:
        """connect() gave up (refused, failed, or timed out, possibly in the very iteration the
        handshake finished): the socket is dropped, and nothing it reports later reaches the
        session, which may have logged in on another node by then."""
        if not self._handshake.done():
            self._handshake.cancel()  # so a late failure leaves no unretrieved exception
        self.abort()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same methods
        self.transport = cast(asyncio.Transport, transport)
        self.flush()  # the protocol header

    def handshake_done(self) -> None:
        self.busy_poll = poller_of(self.loop)
        if self.core.heartbeat:
            self._schedule_heartbeat()
        if not self._handshake.done():
            self._handshake.set_result(None)

    # --------------------------------------------------------------------- reading
    def data_received(self, data: bytes) -> None:
        self.busy_poll.touch()
        self.liveness.read = True
        try:
            self.core.reader.feed(data)
        except UnexpectedMethod as error:
            self._refuse_input(503, f"unexpected method from the broker: {error}")
        except wire.DecodeError as error:
            if self.core.handshake_step == Phase.CONNECT and not self._handshake.done():
                # not one AMQP frame yet: no broker at all answers (no connection.close to send)
                self._node_failed(NotAmqp(bytes(data[:24])))
                self.abort()
                return
            # the broker sent bytes we cannot read: bad input, not a bug, so no traceback
            self._refuse_input(501, f"undecodable frame from the broker: {error}")
        except Exception as error:  # a bug: report it, but end only this client's link
            log.exception("internal error on a frame from the broker%s", self.core.delivery_context())
            self._refuse_input(541, f"internal error on a frame from the broker: {error}")
        # deliveries and receipts of this read go to the client now, in one write
        self.owner.read_done()
        self.flush()

    def _refuse_input(self, code: int, text: str) -> None:
        """End the connection after a frame that could not be handled: tell the broker (so it
        requeues what was not acknowledged), reject any waiting call, and let the session send
        the client an ERROR naming the cause; the socket goes within 5 s either way."""
        if code != 541:
            log.warning("%s%s; closing the link %s", text, self.core.delivery_context(), self.name)
        if self.core.refuse_input(code, text) and self.transport is not None:
            self.loop.call_later(5.0, self.abort)

    def blocked_changed(self) -> None:
        self.owner.backpressure(self.core.blocked or self.writing_paused)

    def close_ok_received(self) -> None:
        self.close_transport()

    # --------------------------------------------------------------------- writing
    def flush(self) -> None:
        """Write what the connection buffered (see ClientConnection.flush)."""
        out = self.core.out
        transport = self.transport
        if not out or transport is None:
            return
        self.liveness.wrote = True
        transport.write(b"".join(out) if len(out) > 1 else out[0])
        out.clear()

    def pause_writing(self) -> None:
        self.writing_paused = True
        self.owner.backpressure(True)

    def resume_writing(self) -> None:
        self.writing_paused = False
        self.owner.backpressure(self.core.blocked)

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.reading_paused = False
            self.transport.resume_reading()

    # --------------------------------------------------------------------- heart-beats
    def _schedule_heartbeat(self) -> None:
        self._heartbeat_handle = self.loop.call_later(self.core.heartbeat / 2, self._heartbeat_tick)

    def _heartbeat_tick(self) -> None:
        transport = self.transport
        if transport is None:
            return
        liveness = self.liveness
        if liveness.send_tick(bool(self.core.out)):
            transport.write(wire.HEARTBEAT_FRAME)
        # while we hold the broker back for a slow client, its heart-beats wait unread: excused
        if liveness.receive_tick(self.reading_paused):
            self.core.fail(
                AmqpError(0, f"missed heart-beats from the broker for {2 * self.core.heartbeat} s")
            )
            self.abort()
            return
        self._schedule_heartbeat()

    # --------------------------------------------------------------------- failing
    def connection_failed(self, error: AmqpError) -> None:
        """The core failed: before the handover the login's business, after it the owner's."""
        if not self._handshake.done():
            if error.code == 320:  # CONNECTION_FORCED: this node is shutting down, try another
                self._node_failed(ConnectionResetError(f"the node closed the connection: {error.text}"))
            else:
                self._handshake.set_exception(error)
            return
        if not self.opened:
            # connect() failed or gave up (the session never had this link), or has yet to
            # resume after the handshake finished: it checks this and tries another node
            if self._failed_before_handover is None:
                self._failed_before_handover = error
            return
        self.owner.connection_failed(error)

    def _node_failed(self, error: OSError) -> None:
        """End the handshake as a failure of this node (an OSError for connect()'s caller,
        which tries the next node), not as a refusal by the broker."""
        self.core.had_error = True
        self._handshake.set_exception(error)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        step = self.core.handshake_step
        self.core.lost()
        if self._heartbeat_handle is not None:
            self._heartbeat_handle.cancel()
        if not self._handshake.done() and (isinstance(exc, ssl.SSLError) or step != Phase.AUTH):
            # the node failed, the broker refused nothing: connect() raises an OSError and the
            # login tries the next node.  A TLS alert is named as such (e.g. a broker that wants
            # a client certificate: TLS 1.3 says so only after the handshake).  A close before
            # connection.start or after connection.open was sent is a node going away:
            # RabbitMQ refuses a vhost with connection.close.  Only a close right after
            # start-ok stays a refused login: RabbitMQ reports a bad password with
            # connection.close (authentication_failure_close), other brokers by closing.
            if isinstance(exc, ssl.SSLError):
                self.core.had_error = True
                self._handshake.set_exception(exc)
            else:
                where = "before connection.start" if step == Phase.CONNECT else "opening the vhost"
                how = "reset" if isinstance(exc, ConnectionResetError) else "closed"
                text = f"the node {how} the connection {where}" + (f": {exc}" if exc else "")
                self._node_failed(ConnectionResetError(text))
        else:
            reason = str(exc) if exc else "connection closed by the broker"
            self.core.fail(AmqpError(0, reason, phase=step))
        if not self._closed.done():
            self._closed.set_result(None)
        # all is told: the core and this socket let go of whom they told (they refer back to
        # them: dropped, the ended connection is freed by reference counting)
        owner = self.owner
        self.core.hooks = _ENDED
        self.owner = cast(Owner, _ENDED)
        owner.socket_ended()

    # --------------------------------------------------------------------- closing
    def abort(self) -> None:
        """Drop a socket judged dead (missed heart-beats, bad input, a failed open) now: abort,
        not close, as close() would keep the socket (and what is buffered for it) until a peer
        that no longer reads has taken it all."""
        if self.transport is not None:
            self.transport.abort()

    def close_transport(self) -> None:
        """End a socket whose AMQP close is done or overdue: close(), which still hands the
        broker what is buffered (e.g. SENDs without receipts while a resource alarm blocks us)."""
        if self.transport is not None:
            self.transport.close()

    async def close(self, timeout: float = 5.0) -> None:
        """Close cleanly: the broker cancels consumers and requeues unacknowledged messages."""
        if self.transport is None:
            return
        self.core.send_close()
        self.flush()
        if self.reading_paused:
            self.resume_reading()  # close-ok must be read
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._closed)
        except TimeoutError:
            self.close_transport()

    def close_nowait(self) -> None:
        """Ask the broker to close, without waiting (used when the STOMP side is already gone)."""
        if self.transport is None:
            return
        self.core.send_close()
        self.flush()
        self.loop.call_later(5.0, self.close_transport)


class AmqpConnection:
    """A session's link with a connection of its own (``SessionLink``; see the module
    docstring): one ``AmqpSocket`` and one ``AsyncChannel`` on it."""

    def __init__(
        self,
        events: BrokerEvents,
        *,
        heartbeat: int,
        connection_name: str,
        reusable: bool = False,
        credentials: tuple[str, str, str] = ("", "", "/"),
    ) -> None:
        socket = AmqpSocket(
            self,
            heartbeat=heartbeat,
            connection_name=connection_name,
            many_channels=reusable,
            credentials=credentials,
        )
        self.socket = socket
        # adapter.amqp_connection_reuse: the connection may serve several sessions, one after
        # the other, each on a channel of its own (recycle_channel)
        self._reusable = reusable
        # with reuse: the (node, vhost, user) key, passcode digest and login time the broker
        # authenticated this connection with (adapter/amqp/pool_runtime.py)
        self.pool_identity: tuple[PoolKey, bytes, float] | None = None
        # the channel writes into the socket's own buffer: one write per flush, in order
        self._out = socket.core.out
        self._channel = AsyncChannel(
            socket.loop,
            socket.core,
            CHANNEL,
            self._out,
            events,
            flush=self.flush,
            connected=self._connected,
            failed=socket.connection_failed,
        )
        core = self._channel.core
        self._core = core
        socket.core.carry(core)
        # per message: the channel core's own methods, no call in between
        self.publish = core.publish
        self.publish_mandatory = core.publish_mandatory
        self.ack = core.ack
        self.nack = core.nack
        self.declare_nowait = core.declare_nowait
        self.requeue_got = core.requeue_got
        # the session's calls, flow control
        self.execute = self._channel.execute
        self.call = self._channel.call
        self.pause_reading = socket.pause_reading
        self.resume_reading = socket.resume_reading
        # what the socket reports: reads done go to the session's events, failures to the channel
        self.read_done = events.on_read_done
        self.connection_failed = self._channel.fail

    @classmethod
    def open(
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
    ) -> Awaitable[AmqpConnection]:
        """Connect, authenticate and open the vhost (the channel opens with its first frame):
        ``AmqpSocket.connect``, whose errors it raises, and which returns the link."""
        link = cls(
            events,
            heartbeat=heartbeat,
            connection_name=connection_name,
            reusable=reusable,
            credentials=(user, password, vhost),
        )
        return link.socket.connect(
            host=host, port=port, timeout=timeout, ssl_context=ssl_context, server_hostname=server_hostname
        )

    # --------------------------------------------------------------------- what the broker is
    @property
    def server_properties(self) -> dict[str, object]:
        return self.socket.core.server_properties

    @property
    def broker_version(self) -> str | None:
        return self.socket.core.broker_version

    @property
    def broker_generation(self) -> BrokerGeneration:
        return self.socket.core.broker_generation

    # --------------------------------------------------------------------- the socket's owner
    def backpressure(self, paused: bool) -> None:
        self._core.events.on_broker_backpressure(paused)

    def socket_ended(self) -> None:
        self._channel.detach()  # nothing more comes on the channel

    def _connected(self) -> bool:
        return self.socket.transport is not None

    # --------------------------------------------------------------------- writing
    def flush(self) -> None:
        """Write what is buffered now (see ClientConnection.flush)."""
        out = self._out
        transport = self.socket.transport
        if not out or transport is None:
            return
        self.socket.liveness.wrote = True
        core = self._core
        if core.out_large:
            # large bodies go to the socket as the slices they are (one writev, no copy)
            core.out_large = False
            transport.writelines(out.copy())
        else:
            transport.write(b"".join(out) if len(out) > 1 else out[0])
        out.clear()

    # --------------------------------------------------------------------- the end of a session
    async def delete_queue_on_fresh_channel(self, queue: str) -> None:
        """After the broker closed the session's channel: open another one and delete ``queue``
        there."""
        self._channel.closing = True  # further failures are not news for the session
        self._core.declared_connection_queue = True  # it was the session's: this connection is not reused
        spare = self._core.spare_channel()
        await self.call(wire.channel_open(spare), wire.CHANNEL_OPEN_OK)
        await self.call(wire.queue_delete(spare, queue), wire.QUEUE_DELETE_OK)

    # adapter.amqp_connection_reuse (adapter/amqp/pool_runtime.py): a connection serves one
    # STOMP session after the other; at the end of each, its channel is closed and the next
    # session's opened with a new number, so nothing of a session (consumers, qos, confirm
    # mode, delivery tags) reaches the next one.
    def attach(self, events: BrokerEvents) -> None:
        """From now on broker events go to ``events`` (the next session, or the pool)."""
        self._core.events = events
        self.read_done = events.on_read_done

    async def recycle_channel(self) -> None:
        """Close the session's channel and wait for close-ok: by then the broker has cancelled
        the session's consumers and requeued what it had not acknowledged, and nothing more
        comes on that channel.  The next session's channel has a new number and is opened by
        its first frame, like a fresh login's.  Raises AmqpError."""
        if self.socket.reading_paused:
            # a slow client paused the broker's socket; the next session must read it (and the
            # channel's close-ok must be read first)
            self.socket.resume_reading()
        core = self._core
        if core.unopened:
            return  # the session wrote nothing on its channel: there is nothing to reset
        await self.call(wire.channel_close(core.channel), wire.CHANNEL_CLOSE_OK)
        core.next_channel()

    @property
    def reusable(self) -> bool:
        """Fit to serve another session: open, never failed, not blocked by the broker nor
        with its socket full or its reading paused, not closing, no call waiting, no
        connection-bound queue left by a session."""
        socket = self.socket
        connection = socket.core
        return (
            self._reusable
            and socket.transport is not None
            and not connection.close_sent
            and not self._channel.closing
            and not connection.had_error
            and not self._core.had_error
            and not self._core.declared_connection_queue
            and not connection.blocked
            and not socket.writing_paused
            and not socket.reading_paused
            and self._channel.pending is None
        )

    async def close(self, timeout: float = 5.0) -> None:
        """Close cleanly: the broker cancels consumers and requeues unacknowledged messages."""
        if self.socket.transport is None:
            return
        self._channel.closing = True
        await self.socket.close(timeout)

    def drop(self) -> None:
        """End the connection now, without the AMQP close (the end of a shutdown whose deadline
        came first): what is buffered still goes (a clean TCP close, not a reset where it can
        be helped), and the broker cleans up as for a client that went away: it requeues the
        unacknowledged messages and deletes the exclusive and auto-delete queues."""
        self._channel.closing = True
        self.flush()
        self.socket.close_transport()

    def close_nowait(self) -> None:
        """Ask the broker to close, without waiting (used when the STOMP side is already gone)."""
        if self.socket.transport is None:
            return
        self._channel.closing = True
        self.socket.close_nowait()

    @property
    def peer_address(self) -> str | None:
        """The broker's IP address this connection reached."""
        transport = self.socket.transport
        if transport is None:
            return None
        peer = transport.get_extra_info("peername")
        return str(peer[0]) if peer else None

    @property
    def is_open(self) -> bool:
        """The socket is up and nobody has asked the broker to close the connection yet."""
        return self.socket.transport is not None and not self.socket.core.close_sent

    @property
    def channel(self) -> int:
        """The session's channel number (a new one for each session with reuse)."""
        return self._core.channel


def monotonic() -> float:
    return time.monotonic()
