"""One AMQP channel, sans-IO: the channel core a session's link (or the Spark reader) is made of.

Owns what belongs to one channel of a connection: its number and its lazy channel.open, the one
synchronous call at a time (which replies end it), delivery assembly (method, content header,
body frames) and basic.get's message, publisher confirms, the broker's channel.close and
basic.cancel, basic.return, and the encoding of publish / ack / nack / declare with the
publish method frames cached per destination (a mandatory publish's are not cached: only the
adapter's own copies are mandatory, one per NACK).  What is the connection's (the handshake, the
phases, frame_max, the broker's version, connection methods) it reads from the
``ConnectionCore`` it belongs to (adapter/amqp/client.py): nothing of it is copied here.

Bytes in: the connection core's reader calls ``on_method``, ``on_content_header`` and
``on_body``: directly for a connection that carries one channel (``ConnectionCore.carry``),
through the routing by number for a shared one.  Bytes out: appended to ``out``, the
connection's own buffer for a connection of its own, a buffer of the channel's own on a shared
connection (its link writes it to the shared socket, or drops it once the channel is closed).

Events out, as direct calls: deliveries, confirms and cancels go to ``events`` (a session, the
Spark reader); what concerns the link that owns the channel (a call's reply, the channel
closed by the broker, a return, an encoding failure) goes to ``owner`` (``ChannelOwner``).
The per-message methods (``publish``, ``ack``, ``nack``, the frame callbacks) are this
object's own, and a link binds them as its own: no call in between.

Pure: no asyncio, no sockets, no clock.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Final, Generic, Protocol, TypeVar, assert_never, cast

from ..mapping.operations import (
    BasicCancel,
    BasicConsume,
    BasicGet,
    BasicQos,
    ConfirmSelect,
    Delivery,
    ExchangeDeclare,
    QueueBind,
    QueueDeclare,
    QueueDelete,
)
from ..mapping.properties import MessageProperties
from . import wire
from .client import (
    BrokerCall,
    ChannelEvents,
    ConnectionCore,
    Input,
    fits,
    method_input,
    queue_declare_frame,
    refuse_surrogates,
)
from .errors import AmqpError

log = logging.getLogger(__name__)

# publish method frames kept per channel; clients use a handful of destinations
_PUBLISH_METHOD_CACHE_SIZE: Final = 256
_new_delivery: Final = tuple.__new__
_method_id: Final[Callable[[bytes], tuple[int, int]]] = struct.Struct(">HH").unpack_from

Events = TypeVar("Events", bound=ChannelEvents)


class ChannelOwner(Protocol):
    """What a channel core tells the link (or client) that owns it."""

    def replied(self, method: tuple[int, int], payload: bytes) -> None:
        """The reply of the call ``start_call`` began (``payload`` includes the method id)."""

    def got(self, delivery: Delivery) -> None:
        """The message of a basic.get (its get-ok and content): the reply of that call."""

    def channel_failed(self, error: AmqpError) -> None:
        """The broker closed the channel (``error.channel_only``)."""

    def returned(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        """basic.return: a mandatory publish could not be routed."""

    def encode_failed(self, error: wire.EncodeError) -> Exception:
        """What to raise for a value AMQP cannot carry (the link: the STOMP error)."""


class _GetReply:
    """The channel's events while a basic.get's content comes: that message is the call's reply
    (``ChannelCore.reply_got``), then the events go back to their owner; every other event
    passes through.  Swapped in for that one message, so deliveries pay nothing for it."""

    __slots__ = ("_channel", "_events")

    def __init__(self, channel: ChannelCore[ChannelEvents], events: ChannelEvents) -> None:
        self._channel = channel
        self._events = events

    def on_deliver(self, delivery: Delivery) -> None:
        self._channel.reply_got(self._events, delivery)

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        self._events.on_confirm(delivery_tag, multiple, ack)

    def on_server_cancel(self, consumer_tag: str) -> None:
        self._events.on_server_cancel(consumer_tag)

    def __getattr__(self, name: str) -> object:
        # the owner's other events (a link's: reads done, the link closing) pass through
        return getattr(self._events, name)


class ChannelCore(Generic[Events]):
    """One channel of a ``ConnectionCore``, without I/O (see the module docstring)."""

    def __init__(
        self,
        connection: ConnectionCore,
        channel: int,
        out: list[bytes | memoryview],
        events: Events,
        owner: ChannelOwner,
    ) -> None:
        self.connection = connection
        self.channel = channel
        self.out = out
        self.out_large = False  # out holds a large body: write it with writelines, unjoined
        self.events = events
        self.owner = owner
        # The channel is opened by the first frame written on it, not at login: channel.open
        # costs the broker about a quarter of a login (a channel process, a limiter, stats),
        # and a client that connects, sends nothing that needs it and leaves (a health check,
        # a script that lost its work) never pays it.  channel.open goes in the same write as
        # the first method on the channel: the broker handles a connection's frames in order.
        self.unopened = True
        self._open_ok_due: int | None = None  # the channel whose lazy channel.open-ok is due
        # set when a session declared an exclusive or auto-delete queue: it belongs to the
        # connection, not the channel, so the connection must not serve another session
        self.declared_connection_queue = False
        self.had_error = False  # the broker closed the channel
        self._publish_methods: dict[tuple[str, str], bytes] = {}
        # the replies that end the synchronous call waiting, if one is
        self.call_replies: frozenset[tuple[int, int]] | None = None
        # a delivery in progress: method args, properties, expected size, body parts
        self._delivery: tuple[str, int, bool, str, str] | None = None
        self._get_tag = ""  # the consumer tag a basic.get's message is given (BasicGet)
        self._delivery_props: MessageProperties | None = None
        self._delivery_size = 0
        self._delivery_parts: list[bytes | memoryview] = []
        self._delivery_received = 0
        # routing by number (a shared connection): frames in the current read, and the size
        # of the last content header's properties (what a paused session is charged)
        self.in_read = False
        self.header_bytes = 0

    # ----------------------------------------------------------------- frames in (per message)
    def on_method(self, channel: int, payload: bytes) -> None:
        """A method after the handshake: deliveries and confirms first (per message)."""
        try:
            method = _method_id(payload)  # (class, method): one C call, compared with wire's tuples
        except struct.error:
            raise wire.DecodeError("method frame shorter than its method id") from None
        if method == wire.BASIC_DELIVER:
            self._delivery = wire.decode_deliver(payload)
            return
        if method == wire.BASIC_ACK or method == wire.BASIC_NACK:
            tag, multiple, ack = wire.decode_ack(payload)
            self.events.on_confirm(tag, multiple, ack)
            return
        connection = self.connection
        if method[0] == 10:
            connection.on_connection_method(method_input(method), channel, payload)
            return
        connection.advance(Input.CHANNEL_METHOD)  # checked: OPEN or CLOSING, never after the end
        if method == wire.CHANNEL_CLOSE:
            code, text = wire.decode_close(payload)
            self.out.append(wire.channel_close_ok(channel))
            self.fail(AmqpError(code, text, channel_only=True, from_broker=True))
            return
        if method == wire.BASIC_CANCEL:
            consumer_tag, nowait = wire.decode_basic_cancel(payload)
            if not nowait:
                self.out.append(wire.basic_cancel_ok(self.channel, consumer_tag))
            self.events.on_server_cancel(consumer_tag)
            return
        if method == wire.CHANNEL_OPEN_OK and channel == self._open_ok_due:
            self._open_ok_due = None  # the lazy open's reply: nobody waits for it
            return
        replies = self.call_replies
        if replies is not None and method in replies:
            self.call_replies = None
            if method == wire.BASIC_GET_OK:
                # the call's reply is the message, once its content has come (_complete_delivery)
                delivery_tag, redelivered, exchange, routing_key, _ = wire.decode_get_ok(payload)
                self._delivery = (self._get_tag, delivery_tag, redelivered, exchange, routing_key)
                # its content is the reply, not a delivery: it goes to reply_got (no test per delivery)
                self.events = cast(Events, _GetReply(cast(ChannelCore[ChannelEvents], self), self.events))
                return
            self.owner.replied(method, payload)
            return
        if method == wire.BASIC_RETURN:
            self.owner.returned(*wire.decode_basic_return(payload))
            return
        log.debug("unexpected AMQP method %s on channel %s", method, channel)

    def on_content_header(self, payload: bytes) -> None:
        size, properties = wire.decode_content_header(payload)
        self._delivery_props = properties
        self._delivery_size = size
        self._delivery_parts = []
        self._delivery_received = 0
        if size == 0:
            self._complete_delivery(b"")

    def on_body(self, payload: bytes | memoryview) -> None:
        self._delivery_received += len(payload)
        if self._delivery_received >= self._delivery_size and not self._delivery_parts:
            self._complete_delivery(payload if isinstance(payload, bytes) else bytes(payload))
            return
        self._delivery_parts.append(payload)
        if self._delivery_received >= self._delivery_size:
            self._complete_delivery(b"".join(self._delivery_parts))

    def _complete_delivery(self, body: bytes) -> None:
        delivery = self._delivery
        properties = self._delivery_props
        self._delivery = None
        self._delivery_props = None
        self._delivery_parts = []
        if delivery is None or properties is None:
            return  # a basic.return's content, or a header without its method
        # tuple.__new__ directly: a NamedTuple's generated __new__ is one more Python call per message
        self.events.on_deliver(_new_delivery(Delivery, (*delivery, properties, body)))

    def reply_got(self, events: ChannelEvents, delivery: Delivery) -> None:
        """basic.get's message is complete: the events go back to ``events``, the message to
        the call waiting for it."""
        self.events = cast(Events, events)
        self.owner.got(delivery)

    def forget_delivery(self) -> None:
        """Drop the delivery being assembled (its frames could not be handled)."""
        self._delivery = None
        self._delivery_props = None
        self._delivery_parts = []

    def delivery_context(self) -> str:
        """Which message a failure concerns, for a log line."""
        if self._delivery is None:
            return ""
        tag, delivery_tag, redelivered, exchange, routing_key = self._delivery
        return (
            f" (consumer tag {tag!r}, delivery tag {delivery_tag}, exchange {exchange!r},"
            f" routing key {routing_key!r}, redelivered {redelivered})"
        )

    def fail(self, error: AmqpError) -> None:
        self.had_error = True
        self.owner.channel_failed(error)

    # ----------------------------------------------------------------- calls in, bytes out
    # publish, ack, nack and declare_nowait only buffer: the link writes out when it likes.
    def open(self) -> None:
        """Put channel.open before the first frame on the channel."""
        self.unopened = False
        self._open_ok_due = self.channel
        self.out.append(wire.channel_open(self.channel))

    def publish(self, exchange: str, routing_key: str, properties: MessageProperties, body: bytes) -> None:
        if self.unopened:
            self.open()
        # clients publish to a handful of destinations: encode each one's method frame once
        method = self._publish_methods.get((exchange, routing_key))
        try:
            if method is None:
                method = wire.publish_method(self.channel, exchange, routing_key)
                if len(self._publish_methods) >= _PUBLISH_METHOD_CACHE_SIZE:
                    self._publish_methods.clear()
                self._publish_methods[(exchange, routing_key)] = method
            frames = wire.content_frames(self.channel, properties, body, self.connection.frame_max)
        except wire.EncodeError as error:
            raise self.owner.encode_failed(error) from error
        out = self.out
        out.append(method)
        out += frames
        if len(body) >= wire.ZERO_COPY_MIN:
            self.out_large = True

    def publish_mandatory(
        self, exchange: str, routing_key: str, properties: MessageProperties, body: bytes
    ) -> None:
        """``publish`` with the mandatory flag: a message no queue takes comes back as
        basic.return (``ChannelOwner.returned``), ahead of its confirm.  Only the adapter's own
        copies of a message it then settles (one per NACK, not per message sent), so its
        method frame is encoded each time and ``publish`` stays as it was."""
        if self.unopened:
            self.open()
        try:
            method = wire.publish_method(self.channel, exchange, routing_key, mandatory=True)
            frames = wire.content_frames(self.channel, properties, body, self.connection.frame_max)
        except wire.EncodeError as error:
            raise self.owner.encode_failed(error) from error
        out = self.out
        out.append(method)
        out += frames
        if len(body) >= wire.ZERO_COPY_MIN:
            self.out_large = True

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        if self.unopened:
            self.open()
        self.out.append(wire.basic_ack(self.channel, delivery_tag, multiple))

    def nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        if self.unopened:
            self.open()
        self.out.append(wire.basic_nack(self.channel, delivery_tag, multiple, requeue))

    def requeue_got(self, delivery_tags: tuple[int, ...]) -> Awaitable[None] | None:
        """Hand back what basic.get took (``RequeueGot``): one nack each, never ``multiple``,
        which would also cover the deliveries of the channel's subscriptions.  Returns what the
        session must wait for before its next call: nothing here (the nacks precede it on this
        channel); a probe's close on a shared connection (adapter/amqp/probe.py)."""
        for delivery_tag in delivery_tags:
            self.nack(delivery_tag, False, True)
        return None

    def declare_nowait(self, op: QueueDeclare) -> None:
        """queue.declare with nowait (a /queue on SEND): buffered like a publish, no reply."""
        if op.exclusive or op.auto_delete:
            self.declared_connection_queue = True
        if self.unopened:
            self.open()
        try:
            if self.connection.strict_utf8:
                refuse_surrogates(op)
            self.out.append(fits(queue_declare_frame(self.channel, op), self.connection.frame_max))
        except wire.EncodeError as error:
            raise self.owner.encode_failed(error) from error

    def operation_call(self, op: BrokerCall) -> tuple[bytes, tuple[int, int]]:
        """The method frame of one of the session's synchronous operations and its reply."""
        if self.unopened:
            self.open()
        try:
            if self.connection.strict_utf8:
                refuse_surrogates(op)
            return self._encode_call(op)
        except wire.EncodeError as error:
            raise self.owner.encode_failed(error) from error

    def _encode_call(self, op: BrokerCall) -> tuple[bytes, tuple[int, int]]:
        channel = self.channel
        frame_max = self.connection.frame_max
        if isinstance(op, QueueDeclare):
            if op.exclusive or op.auto_delete:
                # the queue lives as long as the connection (exclusive) or until its last
                # consumer goes (auto-delete): a connection that declared one is never reused
                self.declared_connection_queue = True
            return fits(queue_declare_frame(channel, op), frame_max), wire.QUEUE_DECLARE_OK
        if isinstance(op, BasicConsume):
            frame = wire.basic_consume(
                channel, op.queue, op.consumer_tag, op.no_ack, op.arguments, op.exclusive
            )
            return fits(frame, frame_max), wire.BASIC_CONSUME_OK
        if isinstance(op, ExchangeDeclare):
            frame = wire.exchange_declare(
                channel, op.exchange, op.type, durable=op.durable, auto_delete=op.auto_delete
            )
            return frame, wire.EXCHANGE_DECLARE_OK
        if isinstance(op, QueueBind):
            frame = wire.queue_bind(channel, op.queue, op.exchange, op.routing_key, dict(op.arguments))
            return fits(frame, frame_max), wire.QUEUE_BIND_OK
        if isinstance(op, BasicQos):
            return wire.basic_qos(channel, op.prefetch_count), wire.BASIC_QOS_OK
        if isinstance(op, BasicCancel):
            return wire.basic_cancel(channel, op.consumer_tag), wire.BASIC_CANCEL_OK
        if isinstance(op, QueueDelete):
            return wire.queue_delete(channel, op.queue), wire.QUEUE_DELETE_OK
        if isinstance(op, ConfirmSelect):
            return wire.confirm_select(channel), wire.CONFIRM_SELECT_OK
        if isinstance(op, BasicGet):
            # the reply is get-ok (this one) or get-empty (the link waits for both)
            self._get_tag = op.consumer_tag
            return wire.basic_get(channel, op.queue), wire.BASIC_GET_OK
        assert_never(op)

    def start_call(self, frame: bytes, replies: tuple[tuple[int, int], ...]) -> None:
        """Queue a synchronous method; ``owner.replied`` comes with the first of ``replies``."""
        assert self.call_replies is None, "synchronous AMQP calls must not overlap"
        self.call_replies = frozenset(replies)
        self.out.append(frame)

    def next_channel(self) -> None:
        """After the session's channel closed (close-ok): the next session's has a new number
        and is opened by its first frame, like a fresh login's."""
        self.channel = self.channel % self.connection.channel_max + 1
        self.unopened = True
        self._publish_methods.clear()  # they carry the channel number

    def renumber(self, channel: int) -> None:
        """The channel goes on under a new number (its old one was closed by the broker),
        opened by its first frame."""
        self.channel = channel
        self.unopened = True
        self._publish_methods.clear()

    def spare_channel(self) -> int:
        """A channel other than this one (2 when only one was negotiated)."""
        return self.channel % max(self.connection.channel_max, 2) + 1
