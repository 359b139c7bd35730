"""One AMQP 0-9-1 connection with one channel, for one STOMP client: the adapter's broker link.

Owns the socket to RabbitMQ, the handshake, the frame loop, synchronous method calls (one at a
time, as the session issues them in order), publisher-confirm and delivery dispatch, heart-beats
and flow control.  The only module with an AMQP socket; everything per message is written into
a buffer that is flushed once per event-loop iteration, so a burst of publishes or acks costs
one ``send()``.

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
from typing import Literal, Protocol, assert_never, cast

from ..mapping.destinations import NEWEST_BROKER, BrokerGeneration, broker_generation
from ..mapping.operations import (
    BasicCancel,
    BasicConsume,
    BasicQos,
    ConfirmSelect,
    Delivery,
    QueueBind,
    QueueDeclare,
    QueueDelete,
)
from ..mapping.properties import MessageProperties
from . import wire
from .framing import FrameReader
from .pool import PoolKey

# the session's synchronous operations that are one AMQP method and its reply (execute)
BrokerCall = ConfirmSelect | QueueDeclare | QueueBind | QueueDelete | BasicQos | BasicConsume | BasicCancel

log = logging.getLogger(__name__)

CHANNEL = 1  # the channel of a connection that is not reused (adapter.amqp_connection_reuse off)
# publish method frames kept per connection; clients use a handful of destinations
_PUBLISH_METHOD_CACHE_SIZE = 256

# AMQP reply codes -> the snake_case names the plugin puts in ERROR's message header
# (docs/behaviour.md#error-handling).
REPLY_CODE_NAMES = {
    320: "connection_forced",
    402: "invalid_path",
    403: "access_refused",
    404: "not_found",
    405: "resource_locked",
    406: "precondition_failed",
    501: "frame_error",
    502: "syntax_error",
    503: "command_invalid",
    504: "channel_error",
    505: "unexpected_frame",
    506: "resource_error",
    530: "not_allowed",
    540: "not_implemented",
    541: "internal_error",
}

CLIENT_CAPABILITIES = {
    "publisher_confirms": True,
    "consumer_cancel_notify": True,
    "basic.nack": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
}
# start-ok's client properties: all but connection_name are the same for every login, so they
# are encoded once (encoding them per login was ~3 % of a connect cycle's CPU)
_CONSTANT_CLIENT_PROPERTIES = b"".join(
    wire.shortstr(name) + wire.field_value(value)
    for name, value in (
        ("product", "stomp-amqp-adapter"),
        ("information", "STOMP client"),
        ("capabilities", CLIENT_CAPABILITIES),
    )
)
# decoded connection.start server properties by the method's bytes: one broker sends the same
# bytes to every login (decoding them was another ~3 %); a few entries cover several nodes
_SERVER_PROPERTIES: dict[bytes, dict[str, object]] = {}
_SERVER_PROPERTIES_CACHE_SIZE = 16


def client_properties_table(connection_name: str) -> bytes:
    """start-ok's client-properties table, encoded (the same fields as before the cache)."""
    fields = (
        _CONSTANT_CLIENT_PROPERTIES + wire.shortstr("connection_name") + wire.field_value(connection_name)
    )
    return len(fields).to_bytes(4, "big") + fields


def server_properties(payload: bytes) -> dict[str, object]:
    """The server properties of a connection.start payload, decoded once per distinct payload.
    The dict is shared between connections: read it, never change it."""
    properties = _SERVER_PROPERTIES.get(payload)
    if properties is None:
        properties = wire.decode_connection_start(payload)
        if len(_SERVER_PROPERTIES) >= _SERVER_PROPERTIES_CACHE_SIZE:
            _SERVER_PROPERTIES.clear()
        _SERVER_PROPERTIES[payload] = properties
    return properties


# Where the connection is: waiting for connection.start ("connect"), logging in ("auth": start-ok
# sent), opening the vhost ("vhost": tune-ok and open sent), or open ("").
Phase = Literal["connect", "auth", "vhost", ""]


class AmqpError(Exception):
    """The broker closed the channel or connection with a reply code, or the link died."""

    def __init__(self, code: int, text: str, *, phase: Phase = "", channel_only: bool = False) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text
        self.phase = phase  # "connect", "auth", "vhost" during the handshake, else ""
        # the broker closed only the channel: the connection is still open and must be closed
        self.channel_only = channel_only

    @property
    def name(self) -> str:
        return REPLY_CODE_NAMES.get(self.code, "AMQP connection died")


class BrokerEvents(Protocol):
    def on_deliver(self, delivery: Delivery) -> None: ...

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None: ...

    def on_server_cancel(self, consumer_tag: str) -> None: ...

    def on_amqp_closed(self, error: AmqpError) -> None: ...

    def on_broker_backpressure(self, paused: bool) -> None: ...

    def on_read_done(self) -> None: ...


class AmqpConnection(asyncio.Protocol):
    def __init__(
        self, events: BrokerEvents, *, heartbeat: int, connection_name: str, reusable: bool = False
    ) -> None:
        self._events = events
        # adapter.amqp_connection_reuse: the connection may serve several STOMP sessions, one
        # after the other, each on a channel of its own (recycle_channel)
        self._reusable = reusable
        self.channel = CHANNEL
        # The channel is opened by the first frame written on it, not at login: channel.open
        # costs the broker about a quarter of a login (a channel process, a limiter, stats),
        # and a client that connects, sends nothing that needs it and leaves (a health check,
        # a script that lost its work) never pays it.  channel.open goes in the same write as
        # the first method on the channel: the broker handles a connection's frames in order.
        self._channel_unopened = False  # set at open-ok; cleared by _open_channel
        self._open_ok_due: int | None = None  # the channel whose lazy channel.open-ok is due
        self.channel_max = 1  # negotiated in tune-ok: one channel unless reusable
        # set when a session declared an exclusive or auto-delete queue: it belongs to the
        # connection, not the channel, so the connection must not serve another session
        self.declared_connection_queue = False
        # set on any error: broker close, failed frame, lost link, missed heart-beats
        self.had_error = False
        # with reuse: the (node, vhost, user) key, passcode digest and login time the broker
        # authenticated this connection with (adapter/server/amqp_pool.py)
        self.pool_identity: tuple[PoolKey, bytes, float] | None = None
        self._requested_heartbeat = heartbeat
        self._connection_name = connection_name
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._reader = FrameReader(self._on_method, self._on_content_header, self._on_body)
        self._out: list[bytes | memoryview] = []
        self._out_large = False  # _out holds a large body: write it with writelines, unjoined
        self._publish_methods: dict[tuple[str, str], bytes] = {}
        self._flush_handle: asyncio.Handle | None = None
        # the call waiting: the replies that end it, and its future
        self._rpc: tuple[frozenset[tuple[int, int]], asyncio.Future[str | None]] | None = None
        self._handshake: asyncio.Future[None] = self._loop.create_future()
        self._phase: Phase = "connect"
        # open() handed this link to its caller; until then no failure is the session's news
        self._opened = False
        self._failed_before_handover: AmqpError | None = None
        self.server_properties: dict[str, object] = {}
        # what connection.start's server-properties say the broker is (None: no version), and
        # whose plugin's queue.declare flags suit it (unknown: the newest, which every version
        # accepts); read once per connection, at the handshake
        self.broker_version: str | None = None
        self.broker_generation: BrokerGeneration = NEWEST_BROKER
        self.frame_max = 131072
        self.heartbeat = 0
        self._closing = False  # the session has been told the link failed, or we are closing
        self._close_sent = False
        self._reading_paused = False
        self._closed: asyncio.Future[None] = self._loop.create_future()
        self._credentials = ("", "", "/")
        # a delivery in progress: method args, properties, expected size, body parts
        self._delivery: tuple[str, int, bool, str, str] | None = None
        self._delivery_props: MessageProperties | None = None
        self._delivery_size = 0
        self._delivery_parts: list[bytes | memoryview] = []
        self._delivery_received = 0
        self._read_since_check = False
        self._wrote_since_check = False
        self._heartbeat_handle: asyncio.TimerHandle | None = None
        self._missed_heartbeats = 0
        self._blocked = False
        self._paused_writing = False

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
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(
                    lambda: protocol, host, port, ssl=ssl_context, server_hostname=server_hostname
                )
                await protocol._handshake
        except BaseException:
            # given up (refused, failed, or timed out, possibly in the very iteration the
            # handshake finished): the link is dropped, and nothing it reports later reaches
            # the session, which may have logged in on another node by then
            if not protocol._handshake.done():
                protocol._handshake.cancel()  # so a late failure leaves no unretrieved exception
            protocol._abort()
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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have the same methods
        self._transport = cast(asyncio.Transport, transport)
        self._transport.write(wire.PROTOCOL_HEADER)

    def _on_handshake_method(self, method: tuple[int, int], payload: bytes) -> None:
        user, password, vhost = self._credentials
        if method == wire.CONNECTION_START:
            self.server_properties = server_properties(payload)
            version = self.server_properties.get("version")
            if isinstance(version, bytes | str):
                self.broker_version = (
                    version.decode("utf-8", "replace") if isinstance(version, bytes) else version
                )
            self.broker_generation = broker_generation(self.broker_version) or NEWEST_BROKER
            self._phase = "auth"
            self._write(
                wire.connection_start_ok(user, password, client_properties_table(self._connection_name))
            )
        elif method == wire.CONNECTION_TUNE:
            channel_max, frame_max, server_hb = wire.decode_connection_tune(payload)
            if self._reusable:
                # every session gets a new channel number (0 from the broker: no limit), and
                # RabbitMQ counts a closed channel until its process has ended, so the next
                # session's channel.open must not hit a limit of one
                self.channel_max = channel_max or 65535
            self.frame_max = min(frame_max or 131072, 131072)
            self._reader.frame_max = self.frame_max
            wanted = self._requested_heartbeat
            self.heartbeat = min(server_hb, wanted) if server_hb and wanted else 0
            # tune-ok and connection.open in one write (AMQP lets a client send open without
            # waiting), one round trip per login fewer; the channel is opened lazily
            self._phase = "vhost"
            self._write(
                wire.connection_tune_ok(self.channel_max, self.frame_max, self.heartbeat)
                + wire.connection_open(vhost)
            )
        elif method == wire.CONNECTION_OPEN_OK:
            self._phase = ""
            # nothing after the handshake needs the password (a recycled channel opens without
            # it, pooled reuse compares a keyed digest): a pooled connection must not keep it
            self._credentials = (user, "", vhost)
            self._channel_unopened = True
            if self.heartbeat:
                self._schedule_heartbeat()
            if not self._handshake.done():
                self._handshake.set_result(None)

    # --------------------------------------------------------------------- frame loop
    def data_received(self, data: bytes) -> None:
        self._read_since_check = True
        try:
            self._reader.feed(data)
        except wire.DecodeError as error:
            # the broker sent bytes we cannot read: bad input, not a bug, so no traceback
            self._broker_input_failed(501, f"undecodable frame from the broker: {error}", error)
        except Exception as error:  # a bug: report it, but end only this client's link
            log.exception("internal error on a frame from the broker%s", self._delivery_context())
            self._broker_input_failed(541, f"internal error on a frame from the broker: {error}", error)
        # deliveries and receipts of this read go to the client now, in one write
        self._events.on_read_done()
        self.flush()

    def _delivery_context(self) -> str:
        """Which message a failure concerns, for the log line."""
        if self._delivery is None:
            return ""
        tag, delivery_tag, redelivered, exchange, routing_key = self._delivery
        return (
            f" (consumer tag {tag!r}, delivery tag {delivery_tag}, exchange {exchange!r},"
            f" routing key {routing_key!r}, redelivered {redelivered})"
        )

    def _broker_input_failed(self, code: int, text: str, error: Exception) -> None:
        """End the link after a frame that could not be handled: tell the broker (so it requeues
        what this client had not acknowledged), reject any waiting call, and let the session
        send the client an ERROR naming the cause."""
        if code == 501:
            log.warning("%s%s; closing the link %s", text, self._delivery_context(), self._connection_name)
        self._delivery = None
        self._delivery_props = None
        self._delivery_parts = []
        if self._transport is not None and not self._close_sent:
            self._close_sent = True
            self._write(wire.connection_close(code, text[:255]))
            self._loop.call_later(5.0, self._abort)
        self._fail(AmqpError(code, text, phase=self._phase))

    def _on_method(self, channel: int, payload: bytes) -> None:
        method = ((payload[0] << 8) | payload[1], (payload[2] << 8) | payload[3])
        if method == wire.BASIC_DELIVER:
            self._delivery = wire.decode_deliver(payload)
            return
        if method == wire.BASIC_ACK or method == wire.BASIC_NACK:
            tag, multiple, ack = wire.decode_ack(payload)
            self._events.on_confirm(tag, multiple, ack)
            return
        if method == wire.CHANNEL_CLOSE or method == wire.CONNECTION_CLOSE:
            code, text = wire.decode_close(payload)
            if method == wire.CHANNEL_CLOSE:
                self._write(wire.channel_close_ok(channel))
            else:
                self._write(wire.connection_close_ok())
            self._fail(AmqpError(code, text, phase=self._phase, channel_only=method == wire.CHANNEL_CLOSE))
            return
        if method == wire.CONNECTION_CLOSE_OK:
            self._close_transport()
            return
        if method == wire.BASIC_CANCEL:
            consumer_tag, nowait = wire.decode_basic_cancel(payload)
            if not nowait:
                self._write(wire.basic_cancel_ok(self.channel, consumer_tag))
            self._events.on_server_cancel(consumer_tag)
            return
        if method == wire.CONNECTION_BLOCKED or method == wire.CONNECTION_UNBLOCKED:
            self._blocked = method == wire.CONNECTION_BLOCKED
            self._events.on_broker_backpressure(self._blocked or self._paused_writing)
            return
        if self._phase:
            self._on_handshake_method(method, payload)
            return
        if method == wire.CHANNEL_OPEN_OK and channel == self._open_ok_due:
            self._open_ok_due = None  # the lazy open's reply: nobody waits for it
            return
        rpc = self._rpc
        if rpc is not None and method in rpc[0]:
            # decode before taking the call off: a reply that does not decode fails the link
            # (data_received), and _fail then rejects the call still waiting for it
            reply = wire.decode_reply(method, payload)
            self._rpc = None
            if not rpc[1].done():
                rpc[1].set_result(reply)
            return
        if method == wire.BASIC_RETURN:
            return  # we never publish mandatory; ignore defensively
        log.debug("unexpected AMQP method %s on channel %s", method, channel)

    def _on_content_header(self, payload: bytes) -> None:
        size, properties = wire.decode_content_header(payload)
        self._delivery_props = properties
        self._delivery_size = size
        self._delivery_parts = []
        self._delivery_received = 0
        if size == 0:
            self._complete_delivery(b"")

    def _on_body(self, payload: bytes | memoryview) -> None:
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
            return
        self._events.on_deliver(Delivery(*delivery, properties, body))

    # --------------------------------------------------------------------- writing
    def _write(self, data: bytes) -> None:
        self._out.append(data)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        self.flush()

    def flush(self) -> None:
        """Write what is buffered now (see ClientConnection.flush)."""
        out = self._out
        if not out or self._transport is None:
            return
        self._out = []
        self._wrote_since_check = True
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

    # --------------------------------------------------------------------- operations
    # publish, ack, nack and declare_nowait only buffer: the client connection that owns this link
    # calls flush() after every batch of STOMP frames it handles.  Scheduling a flush per call
    # instead would cost an extra event-loop turn (a zero-timeout poll) for every read.
    def _open_channel(self) -> None:
        """Put channel.open before the first frame on the session's channel."""
        self._channel_unopened = False
        self._open_ok_due = self.channel
        self._out.append(wire.channel_open(self.channel))

    def publish(self, exchange: str, routing_key: str, properties: MessageProperties, body: bytes) -> None:
        if self._channel_unopened:
            self._open_channel()
        # clients publish to a handful of destinations: encode each one's method frame once
        method = self._publish_methods.get((exchange, routing_key))
        if method is None:
            method = wire.publish_method(self.channel, exchange, routing_key)
            if len(self._publish_methods) >= _PUBLISH_METHOD_CACHE_SIZE:
                self._publish_methods.clear()
            self._publish_methods[(exchange, routing_key)] = method
        out = self._out
        out.append(method)
        out += wire.content_frames(self.channel, properties, body, self.frame_max)
        if len(body) >= wire.ZERO_COPY_MIN:
            self._out_large = True

    def ack(self, delivery_tag: int, multiple: bool) -> None:
        if self._channel_unopened:
            self._open_channel()
        self._out.append(wire.basic_ack(self.channel, delivery_tag, multiple))

    def nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        if self._channel_unopened:
            self._open_channel()
        self._out.append(wire.basic_nack(self.channel, delivery_tag, multiple, requeue))

    def declare_nowait(self, op: QueueDeclare) -> None:
        """queue.declare with nowait (a /queue on SEND): buffered like a publish, no reply."""
        if op.exclusive or op.auto_delete:
            self.declared_connection_queue = True
        if self._channel_unopened:
            self._open_channel()
        self._out.append(_queue_declare(self.channel, op))

    async def execute(self, op: BrokerCall) -> str | None:
        """One of the session's synchronous operations as its AMQP method, waiting for the
        reply: the queue name for a QueueDeclare (the server-named one when asked), else None.
        Raises AmqpError."""
        if self._channel_unopened:
            self._open_channel()
        if isinstance(op, QueueDeclare):
            if op.exclusive or op.auto_delete:
                # the queue lives as long as the connection (exclusive) or until its last
                # consumer goes (auto-delete): a connection that declared one is never reused
                self.declared_connection_queue = True
            reply = await self.call(_queue_declare(self.channel, op), wire.QUEUE_DECLARE_OK)
            return reply if reply is not None else op.queue
        if isinstance(op, BasicConsume):
            frame = wire.basic_consume(
                self.channel, op.queue, op.consumer_tag, op.no_ack, op.arguments, op.exclusive
            )
            await self.call(frame, wire.BASIC_CONSUME_OK)
        elif isinstance(op, QueueBind):
            await self.call(
                wire.queue_bind(self.channel, op.queue, op.exchange, op.routing_key), wire.QUEUE_BIND_OK
            )
        elif isinstance(op, BasicQos):
            await self.call(wire.basic_qos(self.channel, op.prefetch_count), wire.BASIC_QOS_OK)
        elif isinstance(op, BasicCancel):
            await self.call(wire.basic_cancel(self.channel, op.consumer_tag), wire.BASIC_CANCEL_OK)
        elif isinstance(op, QueueDelete):
            await self.call(wire.queue_delete(self.channel, op.queue), wire.QUEUE_DELETE_OK)
        elif isinstance(op, ConfirmSelect):
            await self.call(wire.confirm_select(self.channel), wire.CONFIRM_SELECT_OK)
        else:
            assert_never(op)
        return None

    async def call(self, frame: bytes, *replies: tuple[int, int]) -> str | None:
        """Send a synchronous method and wait for one of ``replies``; returns what
        ``wire.decode_reply`` makes of it (a declared queue's name).  Raises AmqpError."""
        if self._transport is None:
            raise AmqpError(504, "AMQP connection is closed")
        assert self._rpc is None, "synchronous AMQP calls must not overlap"
        future: asyncio.Future[str | None] = self._loop.create_future()
        self._rpc = (frozenset(replies), future)
        self._write(frame)
        return await future

    async def delete_queue_on_fresh_channel(self, queue: str) -> None:
        """After the broker closed the session's channel: open another one and delete ``queue``
        there."""
        self._closing = True  # further failures are not news for the session
        self.declared_connection_queue = True  # it was the session's: this connection is not reused
        spare = self.channel % max(self.channel_max, 2) + 1  # 2 when only one channel was negotiated
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
        self.channel = self.channel % self.channel_max + 1
        self._channel_unopened = True
        self._publish_methods.clear()  # they carry the channel number

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
    def _schedule_heartbeat(self) -> None:
        self._heartbeat_handle = self._loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    def _heartbeat_tick(self) -> None:
        if self._transport is None:
            return
        if not self._wrote_since_check and not self._out:
            self._transport.write(wire.HEARTBEAT_FRAME)
        self._wrote_since_check = False
        if self._read_since_check or self._reading_paused:
            # while we hold the broker back for a slow client, its heart-beats wait unread
            self._missed_heartbeats = 0
        else:
            self._missed_heartbeats += 1
            # two heart-beat periods (four half-period ticks) of silence: the broker is gone
            if self._missed_heartbeats >= 4:
                self._fail(AmqpError(0, f"missed heart-beats from the broker for {2 * self.heartbeat} s"))
                self._abort()
                return
        self._read_since_check = False
        self._schedule_heartbeat()

    # --------------------------------------------------------------------- closing
    def _fail(self, error: AmqpError) -> None:
        """The link is unusable: reject the pending call and tell the session once."""
        self.had_error = True
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
        rpc, self._rpc = self._rpc, None
        if rpc is not None and not rpc[1].done():
            rpc[1].set_exception(error)
        if not self._closing:
            self._closing = True
            self._events.on_amqp_closed(error)

    def _node_failed(self, message: str) -> None:
        """End the handshake as a failure of this node (an OSError for open()'s caller, which
        tries the next node), not as a refusal by the broker."""
        self.had_error = True
        self._handshake.set_exception(ConnectionResetError(message))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._reader.stop()
        if self._heartbeat_handle is not None:
            self._heartbeat_handle.cancel()
        if not self._handshake.done() and (isinstance(exc, ssl.SSLError) or self._phase != "auth"):
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
                step = "before connection.start" if self._phase == "connect" else "opening the vhost"
                self._node_failed(f"the node closed the connection {step}" + (f": {exc}" if exc else ""))
        else:
            reason = str(exc) if exc else "connection closed by the broker"
            self._fail(AmqpError(0, reason, phase=self._phase))
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
        self._close_sent = True
        self._flush()
        self._transport.write(wire.connection_close())
        if self._reading_paused:
            self.resume_reading()  # close-ok must be read
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._closed)
        except TimeoutError:
            self._close_transport()

    def close_nowait(self) -> None:
        """Ask the broker to close, without waiting (used when the STOMP side is already gone)."""
        if self._transport is None:
            return
        self._closing = True
        self._close_sent = True
        self._flush()
        self._transport.write(wire.connection_close())
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


def _queue_declare(channel: int, op: QueueDeclare) -> bytes:
    return wire.queue_declare(
        channel,
        op.queue,
        passive=op.passive,
        durable=op.durable,
        exclusive=op.exclusive,
        auto_delete=op.auto_delete,
        nowait=op.nowait,
        arguments=op.arguments,
    )


def monotonic() -> float:
    return time.monotonic()
