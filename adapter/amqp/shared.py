"""One AMQP connection carrying several STOMP sessions, each on a channel of its own
(``adapter.amqp_sessions_per_connection``; which login joins which connection is
adapter/amqp/multiplex.py's business, the registry adapter/server/amqp_mux.py's).

``SharedConnection`` is the link that owns the socket: the handshake, the heart-beats (one per
connection, as AMQP has them), connection.close, connection.blocked, the write side's back-
pressure, and the routing of every frame the broker sends to the channel it names.
``ChannelLink`` is what one session holds: the same interface as a connection of its own
(``link.SessionLink``: publish, ack, nack, execute, flush, close ...), made of the same parts
(``link.AsyncClient``: the per-channel state the sans-IO client keeps, its lazily opened
channel, its one synchronous call, its delivery being assembled, its confirms), writing into the
shared socket.  So the session, the dispatcher and the login's callers cannot tell a shared link
from a connection of their own.

What differs, and why:

* A channel error (channel.close from the broker) ends only that session, as before.  A
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

Imports: the AMQP connection, link and client of this package, the probe, the byte budget of the mapping
layer, the heart-beat monitor (the carrier's, shared by its channels).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Final

from ..liveness import Liveness
from ..mapping.budget import Account, BudgetExceeded, Pool
from ..mapping.operations import BasicConsume, Delivery, QueueDeclare
from . import wire
from .client import BrokerCall, UnexpectedMethod
from .connection import AmqpConnection, AmqpError
from .link import AsyncClient, BrokerEvents
from .probe import Probe, needs_probe

log = logging.getLogger(__name__)
_method_id: Final = struct.Struct(">HH").unpack_from

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


class SharedConnection(AmqpConnection):
    """The socket of a shared AMQP connection and the channels it carries.  Opened with
    ``AmqpConnection.open`` (the handshake is the same); ``events`` is the registry's sink for
    what concerns the connection as a whole (``on_amqp_closed``, ``on_broker_backpressure``)."""

    # the process's bounds: the registry (adapter/server/amqp_mux.py) gives every connection the
    # one it built from the settings; this default serves a connection made without it (tests)
    paused_bytes: PausedBytes = PausedBytes(8 * 1024 * 1024, 256 * 1024 * 1024)

    def __init__(
        self, events: BrokerEvents, *, heartbeat: int, connection_name: str, reusable: bool = False
    ) -> None:
        # reusable: negotiate the broker's channel_max (one channel per session)
        super().__init__(events, heartbeat=heartbeat, connection_name=connection_name, reusable=True)
        self.links: dict[int, ChannelLink] = {}
        self._closing_channels: dict[int, asyncio.TimerHandle | None] = {}
        self._next = 0  # the last channel number handed out
        self._touched: list[ChannelLink] = []  # links that had frames in this read

    def _handshake_done(self) -> None:
        # open-ok: from now on every frame goes to the channel it names (connection methods
        # come on channel 0); both take effect within the current read
        self._reader.set_method_handler(self._route_method)
        self._reader.set_content_handlers(self._route_header, self._route_body)
        super()._handshake_done()

    # ------------------------------------------------------------------ channels
    def new_link(self, events: BrokerEvents) -> ChannelLink:
        """A channel for one more session (opened by its first frame); raises AmqpError when
        every channel number is taken."""
        number = self._free_channel()
        link = ChannelLink(self, events, number)
        self.links[number] = link
        return link

    def _free_channel(self) -> int:
        channel_max = self.channel_max
        for _ in range(channel_max):
            # round robin: a number just given back is the last to be taken again, as RabbitMQ
            # may still count its channel while the channel's process ends
            self._next = self._next % channel_max + 1
            if self._next not in self.links and self._next not in self._closing_channels:
                return self._next
        raise AmqpError(504, "no free channel on the shared AMQP connection", channel_only=True)

    def renumber(self, link: ChannelLink) -> None:
        """Give ``link`` a new channel number (its own was closed by the broker)."""
        # its close-ok may still be due (a close sent without waiting): the old number waits for it
        self.channel_closing(link, close_ok_due=link._close_ok_pending)  # noqa: SLF001
        link._close_ok_pending = False  # noqa: SLF001
        link.channel = self._free_channel()
        self.links[link.channel] = link

    def channel_closing(self, link: ChannelLink, *, close_ok_due: bool) -> None:
        """``link``'s session is over.  With ``close_ok_due`` its channel.close is on the way:
        the number stays taken (frames still in flight are dropped) until close-ok comes."""
        if self.links.get(link.channel) is link:
            del self.links[link.channel]
        if close_ok_due and self._transport is not None:
            # a close-ok that never comes must not hold the number for ever
            self._closing_channels[link.channel] = self._loop.call_later(
                _CLOSE_OK_WAIT, self._closing_channels.pop, link.channel, None
            )

    # ------------------------------------------------------------------ routing (per frame)
    def _route_method(self, channel: int, payload: bytes) -> None:
        link = self.links.get(channel)
        if link is not None:
            if not link.in_read:
                link.in_read = True
                self._touched.append(link)
            try:
                link._on_method(channel, payload)  # noqa: SLF001 - the channel's own handler
            except Exception as error:  # noqa: BLE001 - one channel's input ends that channel only
                link.refuse_channel_input(error)
            return
        if channel == 0:
            self._on_method(channel, payload)  # connection.close, blocked ...
            return
        self._closed_channel_method(channel, payload)

    # A delivery may be completed by its content frames alone, in a read after its method's
    # (a body larger than one read, TCP segments split anywhere): the content routes mark
    # their link as having had frames in this read too, or its MESSAGE would wait for the
    # next method of its channel.
    def _route_header(self, payload: bytes) -> None:
        link = self.links.get(self._reader.channel)
        if link is not None:
            if not link.in_read:
                link.in_read = True
                self._touched.append(link)
            link.header_bytes = len(payload)  # what the properties cost, should the link be paused
            try:
                link._on_content_header(payload)  # noqa: SLF001
            except Exception as error:  # noqa: BLE001
                link.refuse_channel_input(error)

    def _route_body(self, payload: bytes | memoryview) -> None:
        link = self.links.get(self._reader.channel)
        if link is not None:
            if not link.in_read:
                link.in_read = True
                self._touched.append(link)
            try:
                link._on_body(payload)  # noqa: SLF001
            except Exception as error:  # noqa: BLE001
                link.refuse_channel_input(error)

    def _closed_channel_method(self, channel: int, payload: bytes) -> None:
        """A method on a channel no session holds: a closing one's close-ok frees its number;
        the broker closing one we no longer track gets its close-ok; the rest (deliveries in
        flight) is dropped: the broker requeues them when the channel closes."""
        method = _method_id(payload)
        if method == wire.CHANNEL_CLOSE_OK:
            timer = self._closing_channels.pop(channel, None)
            if timer is not None:
                timer.cancel()
        elif method == wire.CHANNEL_CLOSE:
            self._out.append(wire.channel_close_ok(channel))
            timer = self._closing_channels.pop(channel, None)
            if timer is not None:
                timer.cancel()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # the connection's events: read done, then flush
        touched, self._touched = self._touched, []
        for link in touched:
            link.in_read = False
            link.read_done()
        self.flush()

    # ------------------------------------------------------------------ the connection as a whole
    def _failed(self, error: AmqpError) -> None:
        super()._failed(error)  # before open(): the login's business; after: the registry's
        if self._opened:
            links = list(self.links.values())
            self.links.clear()
            for link in links:
                link.connection_failed(error)

    def _blocked_changed(self) -> None:
        paused = self._blocked or self._paused_writing
        super()._blocked_changed()
        for link in list(self.links.values()):
            link.backpressure(paused)

    def pause_writing(self) -> None:
        super().pause_writing()
        for link in list(self.links.values()):
            link.backpressure(True)

    def resume_writing(self) -> None:
        super().resume_writing()
        for link in list(self.links.values()):
            link.backpressure(self._blocked)

    @property
    def name(self) -> str:
        return self._connection_name

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def liveness(self) -> Liveness:
        return self._liveness

    @property
    def blocked(self) -> bool:
        return self._blocked

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._transport


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
                self.account.reserve(len(delivery.body) + self._link.header_bytes + _FRAME_OVERHEAD)
            except BudgetExceeded as error:
                self._link.overflowed(error)
                return  # not delivered: the broker requeues it when the channel closes
        self.events.on_deliver(delivery)

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        self.events.on_confirm(delivery_tag, multiple, ack)

    def on_server_cancel(self, consumer_tag: str) -> None:
        self.events.on_server_cancel(consumer_tag)

    def on_amqp_closed(self, error: AmqpError) -> None:
        self.events.on_amqp_closed(error)

    def on_broker_backpressure(self, paused: bool) -> None:
        self.events.on_broker_backpressure(paused)

    def on_read_done(self) -> None:
        self.events.on_read_done()


class ChannelLink(AsyncClient):
    """One session's channel on a ``SharedConnection``: the session's AMQP link (a
    ``link.SessionLink``, as a connection of its own is).  The per-message methods (publish,
    ack, nack) and the calls are the sans-IO client's own, on this channel's number; what they
    buffer goes to the shared socket at ``flush``.  A channel has no handshake, socket,
    heart-beat or client properties of its own, so a login that joins a shared connection costs
    this one object (docs/performance.md)."""

    __slots__ = (
        "_channel_gone",
        "_close_ok_pending",
        "_connection_queue",
        "_left",
        "_liveness",
        "_reading_paused",
        "_unconsumed",
        "carrier",
        "header_bytes",
        "in_read",
        "on_left",
        "probe",
    )

    def __init__(self, carrier: SharedConnection, events: BrokerEvents, channel: int) -> None:
        super().__init__(events, carrier.loop, transport=carrier.transport)
        self.carrier = carrier
        self._liveness = carrier.liveness  # the carrier's: a write on a channel is one on the socket
        self._reading_paused = False
        self.in_read = False  # had frames in the carrier's current read
        self.header_bytes = 0  # the size of the last content header's properties (the carrier's)
        # the handshake is the carrier's: this channel starts where its open-ok left a client
        self.phase = carrier.phase
        self._out = []
        self._channel_unopened = True
        self.channel = channel
        self.channel_max = carrier.channel_max
        self.frame_max = carrier.frame_max
        self.server_properties = carrier.server_properties
        self.broker_version = carrier.broker_version
        self.broker_generation = carrier.broker_generation
        self.strict_utf8 = carrier.strict_utf8
        self._blocked = carrier.blocked
        self._channel_gone = False  # the broker closed the channel (or the session's close was sent)
        self._left = False  # the session gave the link back
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

    # ------------------------------------------------------------------ calls in
    @property
    def left_connection_queue(self) -> bool:
        """The session declared a queue that lives as long as the connection and may still be
        there when it leaves: an exclusive one that is not auto-delete, or an exclusive
        auto-delete one that none of its consumers consumed."""
        return self._connection_queue or bool(self._unconsumed)

    def _operation_call(self, op: BrokerCall) -> tuple[bytes, tuple[int, int]]:
        if isinstance(op, QueueDeclare) and op.exclusive and not op.auto_delete and not op.passive:
            self._connection_queue = True
        return super()._operation_call(op)

    def declare_nowait(self, op: QueueDeclare) -> None:
        if op.exclusive and not op.passive:
            if op.auto_delete:
                self._unconsumed.add(op.queue)
            else:
                self._connection_queue = True
        super().declare_nowait(op)

    async def execute(self, op: BrokerCall) -> str | Delivery | None:
        if self._channel_gone or self._transport is None:
            raise AmqpError(504, "AMQP channel is closed", channel_only=True)
        probe = self.probe
        if probe is not None and needs_probe(op):
            try:
                return await probe.execute(op)
            except AmqpError as error:
                raise self._probe_failed(error) from None
        if isinstance(op, QueueDeclare) and op.exclusive and op.auto_delete and not op.passive:
            # counted before the call: a session that ends while it waits leaves the queue
            self._unconsumed.add(op.queue)
            try:
                result = await super().execute(op)
            except AmqpError:  # refused: no queue
                self._unconsumed.discard(op.queue)
                raise
            if isinstance(result, str) and result != op.queue:  # named by the broker
                self._unconsumed.discard(op.queue)
                self._unconsumed.add(result)
            return result
        result = await super().execute(op)
        if isinstance(op, BasicConsume):  # its consumer going deletes the queue
            self._unconsumed.discard(op.queue)
        return result

    def requeue_got(self, delivery_tags: tuple[int, ...]) -> Awaitable[None] | None:
        if self.probe is not None:
            # the gets ran there, never on this channel; the session waits for the probe's close
            return self.probe.requeue_got(delivery_tags)
        return super().requeue_got(delivery_tags)

    def _probe_failed(self, error: AmqpError) -> AmqpError:
        """A call on the probe failed (the broker closed the probe's channel or connection, or
        refused its login): the session ends as it would with a connection of its own, with
        the probe's reply code and text, and only this channel of the shared connection closes
        (so its number is free again only after its close-ok)."""
        mine = AmqpError(error.code, error.text, channel_only=True, from_broker=error.from_broker)
        if not self._closing:
            self._send_channel_close()
            self._fail(mine)
        return mine

    # ------------------------------------------------------------------ writing
    def flush(self) -> None:
        out = self._out
        if not out:
            return
        transport = self._transport
        if transport is None or self._channel_gone or self.carrier._close_sent:  # noqa: SLF001
            # after the channel's close (or close-ok) nothing more may go on its number: a frame
            # on a closed channel is a connection error (504) that would end every neighbour
            self._out = []
            return
        self._out = []
        self._liveness.wrote = True  # the carrier's: no heart-beat needed
        if self._out_large:
            self._out_large = False
            transport.writelines(out)
        else:
            transport.write(b"".join(out) if len(out) > 1 else out[0])

    def read_done(self) -> None:
        """The carrier's read had frames for this channel: the session writes what they gave
        it, and what the channel answered (close-ok) goes out."""
        self._events.on_read_done()
        self.flush()

    # ------------------------------------------------------------------ flow control
    def pause_reading(self) -> None:
        """The session's client does not read: the shared socket goes on being read (its
        neighbours must be served); deliveries are charged to the paused-bytes bounds."""
        if self._reading_paused:
            return
        self._reading_paused = True
        account = self.carrier.paused_bytes.account(self.carrier.user, self.overflowed)
        self._events = _WhilePaused(self, self._events, account)

    def resume_reading(self) -> None:
        if not self._reading_paused:
            return
        self._reading_paused = False
        events = self._events
        if isinstance(events, _WhilePaused):
            self._events = events.events
            events.active = False
            events.account.close()

    def overflowed(self, error: BudgetExceeded) -> None:
        """The session's client fell too far behind: close its channel (the broker requeues
        what it had not acknowledged) and end the session with an ERROR naming the bound."""
        if self._channel_gone:
            return
        log.warning("%s channel %d: %s", self.carrier.name, self.channel, error.detail.rstrip("\n"))
        self._send_channel_close()
        self.resume_reading()
        self._fail(AmqpError(406, error.detail.rstrip("\n"), channel_only=True))

    def backpressure(self, paused: bool) -> None:
        self._blocked = self.carrier.blocked
        self._events.on_broker_backpressure(paused)

    def _blocked_changed(self) -> None:
        # connection.blocked on this channel's number instead of channel 0 (the broker's
        # mistake): the session pauses as a connection of its own would
        self._events.on_broker_backpressure(self._blocked)

    # ------------------------------------------------------------------ failures
    def refuse_channel_input(self, error: Exception) -> None:
        """A frame on this channel could not be handled (undecodable, out of sequence, or our
        bug): as a connection of its own refuses it (``AmqpConnection.data_received``), but
        closing only this channel, so the broker requeues what the session had not acknowledged
        and the sessions sharing the connection go on (the carrier's frames are still in step:
        the frame itself was whole)."""
        if isinstance(error, UnexpectedMethod):
            code, text = 503, f"unexpected method from the broker: {error}"
        elif isinstance(error, wire.DecodeError):
            code, text = 501, f"undecodable frame from the broker: {error}"
        else:
            log.error("internal error on a frame from the broker%s", self.delivery_context(), exc_info=error)
            code, text = 541, f"internal error on a frame from the broker: {error}"
        if code != 541:
            log.warning(
                "%s%s; closing channel %d of %s",
                text,
                self.delivery_context(),
                self.channel,
                self.carrier.name,
            )
        self._delivery = None
        self._delivery_props = None
        self._delivery_parts = []
        if self._channel_gone:
            return
        self._send_channel_close()
        self._fail(AmqpError(code, text, channel_only=True))

    def _failed(self, error: AmqpError) -> None:
        if error.channel_only and not self._channel_gone:
            self.flush()  # the close-ok client._on_method queued (and what came before it)
            self._channel_gone = True
        if self.probe is not None:
            self.probe.end()  # the session is over: the broker requeues what a probe held
        super()._failed(error)

    def connection_failed(self, error: AmqpError) -> None:
        """The shared connection is gone: this session learns it as it would of its own."""
        self._transport = None
        self._channel_gone = True
        self._fail(AmqpError(error.code, error.text, phase=error.phase, from_broker=error.from_broker))

    # ------------------------------------------------------------------ the end
    async def delete_queue_on_fresh_channel(self, queue: str) -> None:
        """At the session's end, delete ``queue``: on a channel with a new number if the broker
        closed the session's (its neighbours' channels are never touched), else on its own."""
        self._closing = True  # further failures are not news for the session
        if self._channel_gone:
            self.carrier.renumber(self)
            self._channel_gone = False
            self._channel_unopened = True
        if self._channel_unopened:
            await self.call(wire.channel_open(self.channel), wire.CHANNEL_OPEN_OK)
            self._channel_unopened = False
        await self.call(wire.queue_delete(self.channel, queue), wire.QUEUE_DELETE_OK)

    def _send_channel_close(self) -> bool:
        """Queue channel.close unless the channel was never opened or is closed; True if queued."""
        if self._channel_gone or self._channel_unopened:
            self._channel_gone = True
            return False
        self._out.append(wire.channel_close(self.channel))
        self.flush()
        self._channel_gone = True
        self._close_ok_pending = True
        return True

    async def close(self, timeout: float = 5.0) -> None:
        """The session is over: close its channel (waiting for close-ok, by which time the
        broker has requeued what the session had not acknowledged), and give the number back."""
        if self._left:
            return
        self._closing = True
        in_use = self._transport is not None and not self._channel_gone and not self._channel_unopened
        if not in_use or self._rpc is not None:
            self.close_nowait()
            return
        try:
            async with asyncio.timeout(timeout):
                await self.call(wire.channel_close(self.channel), wire.CHANNEL_CLOSE_OK)
        except (AmqpError, TimeoutError):
            # no close-ok in time: the number stays taken until one comes (or for a while)
            self._channel_gone = True
            self._leave(close_ok_due=self._transport is not None)
            return
        self._channel_gone = True
        self._leave(close_ok_due=False)

    def close_nowait(self) -> None:
        """Close the channel without waiting (the session is gone, or a call is pending)."""
        if self._left:
            return
        self._closing = True
        due = self._transport is not None and self._send_channel_close()
        self._leave(close_ok_due=due)

    def _leave(self, *, close_ok_due: bool) -> None:
        self._left = True
        if self.probe is not None:
            self.probe.end()
        self.resume_reading()  # gives back what it held of the paused-bytes bounds
        rpc, self._rpc = self._rpc, None
        if rpc is not None and not rpc.done():
            rpc.set_exception(AmqpError(504, "AMQP channel is closed", channel_only=True))
        self.carrier.channel_closing(self, close_ok_due=close_ok_due or self._close_ok_pending)
        if self.on_left is not None:
            self.on_left(self)

    def drop(self) -> None:
        """The end of a shutdown whose deadline came first: close the channel without waiting
        (the carrier's socket is its neighbours' too, and closes with its last session)."""
        self.close_nowait()

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._left
