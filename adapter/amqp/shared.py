"""One AMQP connection carrying several STOMP sessions, each on a channel of its own
(``adapter.amqp_sessions_per_connection``; which login joins which connection is
adapter/amqp/multiplex.py's business, the registry adapter/amqp/multiplex_runtime.py's).

``SharedConnection`` owns the socket (an ``AmqpSocket``: the handshake, the heart-beats, one per
connection as AMQP has them, connection.close, connection.blocked, the write side's back-
pressure) and the sessions' channels; its connection core routes every frame the broker sends
to the channel core its number names (``ConnectionCore.route``), and tells this object what
concerns a channel no session holds.  ``ChannelLink`` is what one session holds: the same
interface as a connection of its own (``link.SessionLink``: publish, ack, nack, execute, flush,
close ...), made of the same part (``link.AsyncChannel``: a channel core with its lazily opened
channel, its one synchronous call, its delivery being assembled, its confirms), writing into the
shared socket.  Nothing of the connection is copied into a channel: what it needs (frame_max,
the broker's version, the phase) it reads from the connection core.  So the session, the
dispatcher and the login's callers cannot tell a shared link from a connection of their own.

What differs, and why:

* A channel error (channel.close from the broker) ends only that session, as before.  A
  connection method on a session's channel number is the connection's, as on a connection of
  its own.  A
  connection error, a lost socket, missed heart-beats or refused input end every session on the
  connection, each with the ERROR it gets today (``on_amqp_closed`` with the same AmqpError).
  connection.blocked pauses every session on it, as it pauses one today.
* A slow STOMP client cannot pause the shared socket (that would stall its neighbours), and
  RabbitMQ does not implement channel.flow(active=false).  While a session's client does not
  read, its deliveries go on being written to it; the bytes delivered meanwhile are charged to a
  per-session bound and a process-wide one, and a session past either is ended with an ERROR
  naming the bound (its channel closes, so the broker requeues what it had not acknowledged).
  A prefetch (``prefetch-count``) bounds it earlier for acknowledged subscriptions.
* A session that ends closes only its channel, without waiting when a call is still pending;
  a channel the session never used costs nothing, neither at login nor at the end.
* The calls a client can make the broker answer with a connection error (an exchange type the
  broker has no plugin for, a basic.get on a stream) run on a probe connection of the
  session's own (adapter/amqp/probe.py), never on the shared one; their failure ends that
  session only, with the ERROR it gets without multiplexing.

Imports: the AMQP socket, link and cores of this package, the probe, the byte budget of the
mapping layer.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable

from ..mapping.budget import Account, BudgetExceeded, Pool
from ..mapping.destinations import BrokerGeneration
from ..mapping.operations import BasicConsume, Delivery, QueueDeclare
from . import wire
from .client import BrokerCall, RoutedChannel, UnexpectedMethod
from .connection import AmqpError, AmqpSocket
from .link import AsyncChannel, BrokerEvents
from .probe import Probe, needs_probe

log = logging.getLogger(__name__)

# how long a closing channel's number stays taken when its close-ok does not come
_CLOSE_OK_WAIT = 5.0
PAUSED_SETTING = "adapter.amqp_shared_max_paused_bytes"
# what a MESSAGE frame costs the client's buffer beyond its body and the broker's properties
# (command, destination, message-id, subscription, ack lines): charged per delivery while
# paused, so deliveries with empty bodies are bounded too
_FRAME_OVERHEAD = 128
PAUSED_BUDGET_SETTING = "adapter.amqp_shared_paused_bytes_budget"


class PausedBytes:
    """The bounds on what sessions on shared connections are delivered while their clients do
    not read: ``limit`` bytes per session, the pool's limit for the process."""

    __slots__ = ("limit", "pool")

    def __init__(self, limit: int, budget: int) -> None:
        self.limit = limit
        # when the process's bound is reached, the user holding the most gives up its largest
        # session (mapping/budget.py), not whichever session's delivery came last
        self.pool = Pool(budget, PAUSED_BUDGET_SETTING, "Messages delivered to slow clients", evicts=True)

    def account(self, user: str, on_evicted: Callable[[BudgetExceeded], None]) -> Account:
        return self.pool.account(
            self.limit, PAUSED_SETTING, "Slow consumer", owner=user, on_evicted=on_evicted
        )


class SharedConnection:
    """The socket of a shared AMQP connection and the channels it carries (see the module
    docstring): an ``AmqpSocket`` whose connection core routes frames by channel number, and
    the ``ChannelLink`` of each session on it.  ``events`` is the registry's sink for what
    concerns the connection as a whole (``on_amqp_closed``, ``on_broker_backpressure``)."""

    # the process's bounds: the registry (adapter/amqp/multiplex_runtime.py) gives every
    # connection the one it built from the settings; this default serves a connection made
    # without it (tests)
    paused_bytes: PausedBytes = PausedBytes(8 * 1024 * 1024, 256 * 1024 * 1024)

    def __init__(
        self,
        events: BrokerEvents,
        *,
        heartbeat: int,
        connection_name: str,
        reusable: bool = False,
        credentials: tuple[str, str, str] = ("", "", "/"),
    ) -> None:
        # many channels: negotiate the broker's channel_max (one channel per session)
        self.socket = AmqpSocket(
            self,
            heartbeat=heartbeat,
            connection_name=connection_name,
            many_channels=True,
            credentials=credentials,
        )
        self.events = events
        self._told = False  # the registry heard of the end (or asked for it)
        self.links: dict[int, ChannelLink] = {}
        self._link_of: dict[RoutedChannel, ChannelLink] = {}  # each channel core's link
        self._closing_channels: dict[int, asyncio.TimerHandle | None] = {}
        self._next = 0  # the last channel number handed out
        self.socket.core.route(self)

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
    ) -> Awaitable[SharedConnection]:
        """Connect, authenticate and open the vhost (``AmqpSocket.connect``, whose errors it
        raises, and which returns the connection); the sessions' channels open with their first
        frames."""
        connection = cls(
            events, heartbeat=heartbeat, connection_name=connection_name, credentials=(user, password, vhost)
        )
        return connection.socket.connect(
            host=host, port=port, timeout=timeout, ssl_context=ssl_context, server_hostname=server_hostname
        )

    def attach(self, events: BrokerEvents) -> None:
        """What concerns the connection as a whole goes to ``events`` from now on."""
        self.events = events

    # ------------------------------------------------------------------ channels
    def new_link(self, events: BrokerEvents) -> ChannelLink:
        """A channel for one more session (opened by its first frame); raises AmqpError when
        every channel number is taken."""
        number = self._free_channel()
        link = ChannelLink(self, events, number)
        self.links[number] = link
        self._link_of[link.core] = link
        self.socket.core.channels[number] = link.core
        return link

    def _free_channel(self) -> int:
        channel_max = self.socket.core.channel_max
        for _ in range(channel_max):
            # round robin: a number just given back is the last to be taken again, as RabbitMQ
            # may still count its channel while the channel's process ends
            self._next = self._next % channel_max + 1
            if self._next not in self.links and self._next not in self._closing_channels:
                return self._next
        raise AmqpError(504, "no free channel on the shared AMQP connection", channel_only=True)

    def renumber(self, link: ChannelLink, *, close_ok_due: bool) -> int:
        """Give ``link`` a new channel number (its own was closed by the broker); with
        ``close_ok_due`` the old number waits for the close-ok of a close sent without waiting."""
        self.channel_closing(link, close_ok_due=close_ok_due)
        self._link_of[link.core] = link
        number = self._free_channel()
        self.links[number] = link
        self.socket.core.channels[number] = link.core
        return number

    def channel_closing(self, link: ChannelLink, *, close_ok_due: bool) -> None:
        """``link``'s session is over, or its number was closed by the broker.  With
        ``close_ok_due`` its channel.close is on the way: the number stays taken (frames still
        in flight are dropped) until close-ok comes."""
        core = link.core
        if not core.in_read:  # else read_done forgets it, after its last frames
            self._link_of.pop(core, None)
        number = core.channel
        if self.links.get(number) is link:
            del self.links[number]
            del self.socket.core.channels[number]
        if close_ok_due and self.socket.transport is not None:
            # a close-ok that never comes must not hold the number for ever
            self._closing_channels[number] = self.socket.loop.call_later(
                _CLOSE_OK_WAIT, self._closing_channels.pop, number, None
            )

    # ------------------------------------------------------------------ the core's routing hooks
    def channel_input_refused(self, channel: RoutedChannel, error: Exception) -> None:
        link = self._link_of.get(channel)
        if link is not None:
            link.refuse_channel_input(error)

    def closed_channel_answered(self, channel: int) -> None:
        timer = self._closing_channels.pop(channel, None)
        if timer is not None:
            timer.cancel()

    # ------------------------------------------------------------------ the socket's owner
    def read_done(self) -> None:
        """The connection's events first, then each session that had frames in this read
        writes what they gave it, and what its channel answered (close-ok) goes out."""
        self.events.on_read_done()
        for routed in self.socket.core.take_touched():
            link = self._link_of.get(routed)
            if link is not None:
                link.core.events.on_read_done()
                link.flush()
                if link.left:  # during this read: forgotten after its last frames
                    self._link_of.pop(routed, None)

    def connection_failed(self, error: AmqpError) -> None:
        """The connection is gone: the registry forgets it, every session learns it as it
        would of a connection of its own."""
        if not self._told:
            self._told = True
            self.events.on_amqp_closed(error)
        links = list(self.links.values())
        self.links.clear()
        self.socket.core.channels.clear()
        for link in links:
            link.connection_failed(error)

    def socket_ended(self) -> None:
        """Its sessions have been told (``connection_failed``); each detaches its channel as it
        leaves (``ChannelLink._leave``)."""

    def backpressure(self, paused: bool) -> None:
        """connection.blocked (or unblocked), or the socket full: every session pauses."""
        self.events.on_broker_backpressure(paused)
        for link in list(self.links.values()):
            link.core.events.on_broker_backpressure(paused)

    # ------------------------------------------------------------------ the end
    async def close(self, timeout: float = 5.0) -> None:
        self._told = True
        await self.socket.close(timeout)

    def close_nowait(self) -> None:
        if self.socket.transport is not None:
            self._told = True
        self.socket.close_nowait()

    # ------------------------------------------------------------------ what the login and registry read
    @property
    def name(self) -> str:
        return self.socket.name

    @property
    def user(self) -> str:
        return self.socket.core.user

    @property
    def channel_max(self) -> int:
        return self.socket.core.channel_max

    @property
    def blocked(self) -> bool:
        return self.socket.core.blocked

    @property
    def broker_version(self) -> str | None:
        return self.socket.core.broker_version

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
        return self.socket.transport is not None and not self.socket.core.close_sent


class _WhilePaused:
    """A session's broker events while its client does not read: each delivery is charged to
    the session's paused-bytes account first.  Swapped in at the pause, so deliveries pay
    nothing for it otherwise."""

    __slots__ = ("_link", "account", "active", "events")

    def __init__(self, link: ChannelLink, events: BrokerEvents, account: Account) -> None:
        self._link = link
        self.events = events
        self.account = account
        self.active = True

    def on_deliver(self, delivery: Delivery) -> None:
        if self.active:
            try:
                self.account.reserve(len(delivery.body) + self._link.core.header_bytes + _FRAME_OVERHEAD)
            except BudgetExceeded as error:
                self._link.overflowed(error)
                return  # not delivered: the broker requeues it when the channel closes
        self.events.on_deliver(delivery)

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        self.events.on_confirm(delivery_tag, multiple, ack)

    def on_server_cancel(self, consumer_tag: str) -> None:
        self.events.on_server_cancel(consumer_tag)

    def on_return(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        self.events.on_return(code, text, exchange, routing_key)

    def on_amqp_closed(self, error: AmqpError) -> None:
        self.events.on_amqp_closed(error)

    def on_broker_backpressure(self, paused: bool) -> None:
        self.events.on_broker_backpressure(paused)

    def on_read_done(self) -> None:
        self.events.on_read_done()


class ChannelLink:
    """One session's channel on a ``SharedConnection``: the session's AMQP link (a
    ``link.SessionLink``, as a connection of its own is): an ``AsyncChannel`` with its own
    number and output buffer, writing into the shared socket.  The per-message methods
    (publish, ack, nack) are the channel core's own, bound at construction.  A channel has no
    handshake, socket, heart-beat or client properties of its own, so a login that joins a
    shared connection costs these few objects (docs/performance.md)."""

    def __init__(self, carrier: SharedConnection, events: BrokerEvents, channel: int) -> None:
        self.carrier = carrier
        socket = carrier.socket
        self._socket = socket
        self._out: list[bytes | memoryview] = []  # written to the shared socket at flush
        self._channel = AsyncChannel(
            socket.loop,
            socket.core,
            channel,
            self._out,
            events,
            flush=self.flush,
            connected=lambda: not self._carrier_lost and socket.transport is not None,
            failed=self._failed,
        )
        core = self._channel.core
        self.core = core
        # per message: the channel core's own methods, no call in between
        self.publish = core.publish
        self.publish_mandatory = core.publish_mandatory
        self.ack = core.ack
        self.nack = core.nack
        self.call = self._channel.call
        self._carrier_lost = False  # the shared connection is gone
        self._reading_paused = False
        self._channel_gone = False  # the broker closed the channel (or the session's close was sent)
        self.left = False  # the session gave the link back
        # a channel.close went without waiting for its close-ok (overflowed, refused input):
        # the number stays taken when the session leaves, as a reused number whose close-ok is
        # still to come would be a connection error (504) for every session on the connection
        self._close_ok_pending = False
        # a session that declared an exclusive queue that is not auto-delete leaves it on the
        # connection until the connection closes: the registry then retires the connection
        self._connection_queue = False
        # exclusive auto-delete queues it declared that no consumer of its own has consumed yet
        # (a SEND with durable:false or persistent:false): the broker deletes an auto-delete
        # queue only when its last consumer goes, so one never consumed also lives as long as
        # the connection
        self._unconsumed: set[str] = set()
        self.on_left: Callable[[ChannelLink], None] | None = None  # the registry's
        # the calls the shared connection must not carry run on a probe of the session's own
        # (adapter/amqp/probe.py); the registry's, None without one (they then run here)
        self.probe: Probe | None = None

    # ------------------------------------------------------------------ what the broker is
    @property
    def channel(self) -> int:
        return self.core.channel

    @property
    def server_properties(self) -> dict[str, object]:
        return self._socket.core.server_properties

    @property
    def broker_version(self) -> str | None:
        return self._socket.core.broker_version

    @property
    def broker_generation(self) -> BrokerGeneration:
        return self._socket.core.broker_generation

    # ------------------------------------------------------------------ calls in
    @property
    def left_connection_queue(self) -> bool:
        """The session declared a queue that lives as long as the connection and may still be
        there when it leaves: an exclusive one that is not auto-delete, or an exclusive
        auto-delete one that none of its consumers consumed."""
        return self._connection_queue or bool(self._unconsumed)

    def declare_nowait(self, op: QueueDeclare) -> None:
        if op.exclusive and not op.passive:
            if op.auto_delete:
                self._unconsumed.add(op.queue)
            else:
                self._connection_queue = True
        self.core.declare_nowait(op)

    async def execute(self, op: BrokerCall) -> str | Delivery | None:
        if self._channel_gone or self._carrier_lost or self._socket.transport is None:
            raise AmqpError(504, "AMQP channel is closed", channel_only=True)
        probe = self.probe
        if probe is not None and needs_probe(op):
            try:
                return await probe.execute(op)
            except AmqpError as error:
                raise self._probe_failed(error) from None
        if not isinstance(op, QueueDeclare) or not op.exclusive or op.passive:
            result = await self._channel.execute(op)
            if isinstance(op, BasicConsume):  # its consumer going deletes the queue
                self._unconsumed.discard(op.queue)
            return result
        if not op.auto_delete:
            self._connection_queue = True
            return await self._channel.execute(op)
        # counted before the call: a session that ends while it waits leaves the queue
        self._unconsumed.add(op.queue)
        try:
            result = await self._channel.execute(op)
        except AmqpError:  # refused: no queue
            self._unconsumed.discard(op.queue)
            raise
        if isinstance(result, str) and result != op.queue:  # named by the broker
            self._unconsumed.discard(op.queue)
            self._unconsumed.add(result)
        return result

    def requeue_got(self, delivery_tags: tuple[int, ...]) -> Awaitable[None] | None:
        if self.probe is not None:
            # the gets ran there, never on this channel; the session waits for the probe's close
            return self.probe.requeue_got(delivery_tags)
        return self.core.requeue_got(delivery_tags)

    def _probe_failed(self, error: AmqpError) -> AmqpError:
        """A call on the probe failed (the broker closed the probe's channel or connection, or
        refused its login): the session ends as it would with a connection of its own, with
        the probe's reply code and text, and only this channel of the shared connection closes
        (so its number is free again only after its close-ok)."""
        mine = AmqpError(error.code, error.text, channel_only=True, from_broker=error.from_broker)
        if not self._channel.closing:
            self._send_channel_close()
            self._failed(mine)
        return mine

    # ------------------------------------------------------------------ writing
    def flush(self) -> None:
        out = self._out
        if not out:
            return
        transport = self._socket.transport
        if transport is None or self._carrier_lost or self._channel_gone or self._socket.core.close_sent:
            # after the channel's close (or close-ok) nothing more may go on its number: a frame
            # on a closed channel is a connection error (504) that would end every neighbour
            out.clear()
            return
        self._socket.liveness.wrote = True  # the carrier's: no heart-beat needed
        core = self.core
        if core.out_large:
            core.out_large = False
            transport.writelines(out.copy())
        else:
            transport.write(b"".join(out) if len(out) > 1 else out[0])
        out.clear()

    # ------------------------------------------------------------------ flow control
    def pause_reading(self) -> None:
        """The session's client does not read: the shared socket goes on being read (its
        neighbours must be served); deliveries are charged to the paused-bytes bounds."""
        if self._reading_paused:
            return
        self._reading_paused = True
        account = self.carrier.paused_bytes.account(self.carrier.user, self.overflowed)
        self.core.events = _WhilePaused(self, self.core.events, account)

    def resume_reading(self) -> None:
        if not self._reading_paused:
            return
        self._reading_paused = False
        events = self.core.events
        if isinstance(events, _WhilePaused):
            self.core.events = events.events
            events.active = False
            events.account.close()

    def overflowed(self, error: BudgetExceeded) -> None:
        """The session's client fell too far behind: close its channel (the broker requeues
        what it had not acknowledged) and end the session with an ERROR naming the bound."""
        if self._channel_gone:
            return
        log.warning("%s channel %d: %s", self.carrier.name, self.core.channel, error.detail.rstrip("\n"))
        self._send_channel_close()
        self.resume_reading()
        self._failed(AmqpError(406, error.detail.rstrip("\n"), channel_only=True))

    # ------------------------------------------------------------------ failures
    def refuse_channel_input(self, error: Exception) -> None:
        """A frame on this channel could not be handled (undecodable, out of sequence, or our
        bug): as a connection of its own refuses it (``AmqpSocket.data_received``), but
        closing only this channel, so the broker requeues what the session had not acknowledged
        and the sessions sharing the connection go on (the carrier's frames are still in step:
        the frame itself was whole); the connection core then forgets the delivery in progress."""
        if isinstance(error, UnexpectedMethod):
            code, text = 503, f"unexpected method from the broker: {error}"
        elif isinstance(error, wire.DecodeError):
            code, text = 501, f"undecodable frame from the broker: {error}"
        else:
            context = self.core.delivery_context()
            log.error("internal error on a frame from the broker%s", context, exc_info=error)
            code, text = 541, f"internal error on a frame from the broker: {error}"
        if code != 541:
            log.warning(
                "%s%s; closing channel %d of %s",
                text,
                self.core.delivery_context(),
                self.core.channel,
                self.carrier.name,
            )
        if self._channel_gone:
            return
        self._send_channel_close()
        self._failed(AmqpError(code, text, channel_only=True))

    def _failed(self, error: AmqpError) -> None:
        if error.channel_only and not self._channel_gone:
            self.flush()  # the close-ok the channel core queued (and what came before it)
            self._channel_gone = True
        if self.probe is not None:
            self.probe.end()  # the session is over: the broker requeues what a probe held
        self._channel.fail(error)

    def connection_failed(self, error: AmqpError) -> None:
        """The shared connection is gone: this session learns it as it would of its own."""
        self._carrier_lost = True
        self._channel_gone = True
        self._failed(AmqpError(error.code, error.text, phase=error.phase, from_broker=error.from_broker))

    # ------------------------------------------------------------------ the end
    async def delete_queue_on_fresh_channel(self, queue: str) -> None:
        """At the session's end, delete ``queue``: on a channel with a new number if the broker
        closed the session's (its neighbours' channels are never touched), else on its own."""
        self._channel.closing = True  # further failures are not news for the session
        core = self.core
        if self._channel_gone:
            core.renumber(self.carrier.renumber(self, close_ok_due=self._close_ok_pending))
            self._close_ok_pending = False
            self._channel_gone = False
        if core.unopened:
            await self.call(wire.channel_open(core.channel), wire.CHANNEL_OPEN_OK)
            core.unopened = False
        await self.call(wire.queue_delete(core.channel, queue), wire.QUEUE_DELETE_OK)

    def _send_channel_close(self) -> bool:
        """Queue channel.close unless the channel was never opened or is closed; True if queued."""
        if self._channel_gone or self.core.unopened:
            self._channel_gone = True
            return False
        self._out.append(wire.channel_close(self.core.channel))
        self.flush()
        self._channel_gone = True
        self._close_ok_pending = True
        return True

    async def close(self, timeout: float = 5.0) -> None:
        """The session is over: close its channel (waiting for close-ok, by which time the
        broker has requeued what the session had not acknowledged), and give the number back."""
        if self.left:
            return
        self._channel.closing = True
        connected = not self._carrier_lost and self._socket.transport is not None
        in_use = connected and not self._channel_gone and not self.core.unopened
        if not in_use or self._channel.pending is not None:
            self.close_nowait()
            return
        try:
            async with asyncio.timeout(timeout):
                await self.call(wire.channel_close(self.core.channel), wire.CHANNEL_CLOSE_OK)
        except (AmqpError, TimeoutError):
            # no close-ok in time: the number stays taken until one comes (or for a while)
            self._channel_gone = True
            self._leave(close_ok_due=not self._carrier_lost and self._socket.transport is not None)
            return
        self._channel_gone = True
        self._leave(close_ok_due=False)

    def drop(self) -> None:
        """The end of a shutdown: the carrier's socket is its neighbours' too, so only this
        channel goes (``close_nowait``)."""
        self.close_nowait()

    def close_nowait(self) -> None:
        """Close the channel without waiting (the session is gone, or a call is pending)."""
        if self.left:
            return
        self._channel.closing = True
        connected = not self._carrier_lost and self._socket.transport is not None
        due = connected and self._send_channel_close()
        self._leave(close_ok_due=due)

    def _leave(self, *, close_ok_due: bool) -> None:
        self.left = True
        if self.probe is not None:
            self.probe.end()
        self.resume_reading()  # gives back what it held of the paused-bytes bounds
        if self._channel.pending is not None:
            self._channel.reject_pending(AmqpError(504, "AMQP channel is closed", channel_only=True))
        self.carrier.channel_closing(self, close_ok_due=close_ok_due or self._close_ok_pending)
        if self.on_left is not None:
            self.on_left(self)
        self._channel.detach()  # nothing more comes on this channel for the session

    @property
    def is_open(self) -> bool:
        return not self._carrier_lost and self._socket.transport is not None and not self.left
