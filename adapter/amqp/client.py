"""The AMQP 0-9-1 client with one channel, sans-IO: bytes in, events out; calls in, bytes out.

Owns everything about an AMQP connection that is not a socket or a clock: the handshake
(connection.start, tune, open, with the broker's version read from connection.start and the
password forgotten at open-ok), the connection's phases and the one table of their transitions,
the lazily opened channel, the one synchronous call at a time, delivery assembly (method,
content header, body frames), publisher confirms, the broker's closes and cancels, and the
publish / ack / nack / declare encoding.  Thin shells drive it: the server's asyncio links
(``link.AsyncClient``, the future of the one call; ``connection.AmqpConnection``: socket,
handshake future, heart-beat timer, flow control, reuse; ``shared.ChannelLink``: one channel on a
shared connection) and the Spark reader's blocking client (``adapter/spark/broker.py``: a
blocking socket and deadlines).

Bytes in: a shell hands what it read to ``self._reader.feed`` (the ``FrameReader``, one call
per read); bytes out: everything to send is appended to ``self._out``, which the shell writes
when it likes (the link once per batch of frames, the Spark client before every wait).

Events out, as direct calls, not returned event objects: this runs for every delivery and every
confirm, and a call on the sink (``ChannelEvents``: on_deliver, on_confirm, on_server_cancel) is
the cheapest way out, the same reason the frame reader uses callbacks.  What concerns the shell
itself comes as calls to the hooks a shell overrides (``_handshake_done``, ``_replied``,
``_failed``, ``_close_ok_received``, ``_blocked_changed``, ``_returned``, ``_encode_failed``).
The shells subclass the core rather than wrap it, so the per-message methods (``publish``,
``ack``, ``nack``, the frame callbacks) are the core's own: no call in between.

Phases: ``TRANSITIONS`` maps (phase, input) to the next phase; an input the table has no entry
for is the broker breaking the protocol (``UnexpectedMethod``: the shell closes with 503
command_invalid).  The per-message methods need no lookup: during the handshake the reader's
method callback is ``_on_handshake_method``, and ``_on_method`` (deliveries and confirms first)
only from open-ok on.

Heart-beats stay in the asyncio shell (``connection.py``): only their negotiation is here.

Pure: no asyncio, no sockets, no clock, no logging of its own beyond one debug line.
"""

from __future__ import annotations

import logging
import re
import struct
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Final, Protocol, assert_never

from ..mapping.destinations import NEWEST_BROKER, BrokerGeneration, broker_generation
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
from .errors import AmqpError
from .framing import DEFAULT_FRAME_MAX, FrameReader

log = logging.getLogger(__name__)

# the session's synchronous operations that are one AMQP method and its reply
BrokerCall = (
    ConfirmSelect
    | ExchangeDeclare
    | QueueDeclare
    | QueueBind
    | QueueDelete
    | BasicQos
    | BasicConsume
    | BasicCancel
    | BasicGet
)

CHANNEL: Final = 1  # the first channel of a connection (the only one unless it is reused)
# publish method frames kept per connection; clients use a handful of destinations
_PUBLISH_METHOD_CACHE_SIZE: Final = 256


# --------------------------------------------------------------------------- phases
class Phase(StrEnum):
    """Where the connection is.  The handshake phases keep the names ``AmqpError.phase`` has
    always carried (the login tells a refused password from a failed node by them)."""

    CONNECT = "connect"  # protocol header sent, waiting for connection.start
    AUTH = "auth"  # start-ok sent (the credentials), waiting for connection.tune
    VHOST = "vhost"  # tune-ok and connection.open sent, waiting for open-ok
    OPEN = ""  # open: channel methods flow
    CLOSING = "closing"  # we sent connection.close, waiting for close-ok
    CLOSED = "closed"  # close-ok came, the broker closed the connection, or the socket ended


class Input(StrEnum):
    """What moves a connection between phases: a connection-class method from the broker, any
    method on a channel, or something the shell does."""

    START = "connection.start"
    TUNE = "connection.tune"
    OPEN_OK = "connection.open-ok"
    CLOSE = "connection.close"  # the broker closes the connection
    CLOSE_OK = "connection.close-ok"
    BLOCKED = "connection.blocked"
    UNBLOCKED = "connection.unblocked"
    OTHER_CONNECTION_METHOD = "another connection method"  # secure, update-secret-ok ...: never valid
    CHANNEL_METHOD = "a channel method"
    SEND_CLOSE = "send connection.close"  # the shell closes, or refuses the broker's input
    LOST = "socket lost"


HANDSHAKE: Final = frozenset((Phase.CONNECT, Phase.AUTH, Phase.VHOST))
# the phases in which the broker may still send something
_ALIVE: Final = (*HANDSHAKE, Phase.OPEN, Phase.CLOSING)

TRANSITIONS: Final[dict[tuple[Phase, Input], Phase]] = {
    (Phase.CONNECT, Input.START): Phase.AUTH,
    (Phase.AUTH, Input.TUNE): Phase.VHOST,
    (Phase.VHOST, Input.OPEN_OK): Phase.OPEN,
    (Phase.OPEN, Input.CHANNEL_METHOD): Phase.OPEN,
    # a close crosses what is still in flight: deliveries, confirms, the channel's close-ok
    (Phase.CLOSING, Input.CHANNEL_METHOD): Phase.CLOSING,
    (Phase.CLOSING, Input.CLOSE_OK): Phase.CLOSED,
    # RabbitMQ blocks a connection when an alarm goes off, whatever it is doing
    **{(phase, flow): phase for phase in _ALIVE for flow in (Input.BLOCKED, Input.UNBLOCKED)},
    # the broker may refuse at any step (403 after start-ok, 530 after open) or close at any time
    **{(phase, Input.CLOSE): Phase.CLOSED for phase in _ALIVE},
    **{(phase, Input.SEND_CLOSE): Phase.CLOSING for phase in _ALIVE},
    **{(phase, Input.LOST): Phase.CLOSED for phase in Phase},
}

# connection-class methods by (class, method); anything else of class 10 is OTHER_CONNECTION_METHOD
_CONNECTION_INPUTS: Final = {
    wire.CONNECTION_START: Input.START,
    wire.CONNECTION_TUNE: Input.TUNE,
    wire.CONNECTION_OPEN_OK: Input.OPEN_OK,
    wire.CONNECTION_CLOSE: Input.CLOSE,
    wire.CONNECTION_CLOSE_OK: Input.CLOSE_OK,
    wire.CONNECTION_BLOCKED: Input.BLOCKED,
    wire.CONNECTION_UNBLOCKED: Input.UNBLOCKED,
}


_new_delivery: Final = tuple.__new__
_method_id: Final[Callable[[bytes], tuple[int, int]]] = struct.Struct(">HH").unpack_from


def _method_of(payload: bytes) -> tuple[int, int]:
    """(class id, method id) of a method frame's payload."""
    try:
        return _method_id(payload)
    except struct.error:
        raise wire.DecodeError("method frame shorter than its method id") from None


def method_input(method: tuple[int, int]) -> Input:
    """The phase-table input a method from the broker is."""
    if method[0] == 10:
        return _CONNECTION_INPUTS.get(method, Input.OTHER_CONNECTION_METHOD)
    return Input.CHANNEL_METHOD


class UnexpectedMethod(wire.DecodeError):
    """The broker sent a method its phase has no transition for (AMQP 0-9-1 §2.3.2: 503
    command-invalid).  A DecodeError, so a shell that refuses undecodable input refuses this
    too; the link answers it with 503 instead of 501."""


# --------------------------------------------------------------------------- client properties
CLIENT_CAPABILITIES: Final = {
    "publisher_confirms": True,
    "consumer_cancel_notify": True,
    "basic.nack": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
}
# start-ok's client properties: all but connection_name are the same for every login, so they
# are encoded once (encoding them per login was ~3 % of a connect cycle's CPU)
_CONSTANT_CLIENT_PROPERTIES: Final = b"".join(
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
_SERVER_PROPERTIES_CACHE_SIZE: Final = 16


def client_properties_table(connection_name: str) -> bytes:
    """start-ok's client-properties table of the adapter's link, encoded."""
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


_UTF8_STRICT_SINCE: Final = (4, 3)
_VERSION_PREFIX: Final = re.compile(r"([0-9]+)\.([0-9]+)")


def checks_utf8_strictly(version: str | None) -> bool:
    """Whether a broker of ``version`` refuses encoded surrogates (CESU-8) in a method's short
    strings: 4.3 and newer check UTF-8 with Erlang's ``unicode`` module, older ones with
    ``xmerl_ucs``, which takes them (rabbit_binary_parser:validate_utf8).  Unknown: strictly."""
    match = _VERSION_PREFIX.match((version or "").strip())
    if match is None or (int(match[1]), int(match[2])) == (0, 0):
        return True
    return (int(match[1]), int(match[2])) >= _UTF8_STRICT_SINCE


# the short strings of each call that a client's headers can fill
_CLIENT_NAMES: Final[dict[type, tuple[str, ...]]] = {
    QueueDeclare: ("queue",),
    BasicConsume: ("queue", "consumer_tag"),
    ExchangeDeclare: ("exchange", "type"),
    QueueBind: ("queue", "exchange", "routing_key"),
    BasicCancel: ("consumer_tag",),
    QueueDelete: ("queue",),
    BasicGet: ("queue",),
}


def refuse_surrogates(op: BrokerCall) -> None:
    """EncodeError if a name of ``op`` is not strictly UTF-8 (encoded surrogates included), for
    a broker that answers those with a connection error (``checks_utf8_strictly``); the
    encoder itself refuses only what every broker refuses (``wire.shortstr``)."""
    for field in _CLIENT_NAMES.get(type(op), ()):
        try:
            getattr(op, field).encode("utf-8")
        except UnicodeEncodeError:
            raise wire.EncodeError(wire.NOT_UTF8) from None


def fits(frame: bytes, frame_max: int) -> bytes:
    """``frame`` if it is within ``frame_max``, else EncodeError: the broker closes the whole
    connection on a larger frame (501 frame_error), with every session a shared connection
    carries; only the methods whose arguments come from a client (queue.declare, basic.consume,
    queue.bind) can get so large."""
    if len(frame) > frame_max:
        raise wire.EncodeError(
            f"queue or consumer arguments take {len(frame)} bytes, more than one AMQP frame carries "
            f"(frame_max {frame_max})"
        )
    return frame


def queue_declare_frame(channel: int, op: QueueDeclare) -> bytes:
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


class ChannelEvents(Protocol):
    """What the broker sends on the channel, for whoever consumes it (a STOMP session, the
    Spark reader): called as each arrives."""

    def on_deliver(self, delivery: Delivery) -> None: ...

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None: ...

    def on_server_cancel(self, consumer_tag: str) -> None: ...


class _GetReply:
    """The channel's events while a basic.get's content comes: that message is the call's reply
    (``AmqpClient._got``), then the events go back to their owner; every other event passes
    through.  Swapped in for that one message, so deliveries pay nothing for it."""

    __slots__ = ("_client", "_events")

    def __init__(self, client: AmqpClient, events: ChannelEvents) -> None:
        self._client = client
        self._events = events

    def on_deliver(self, delivery: Delivery) -> None:
        client = self._client
        client._events = self._events  # noqa: SLF001 - the client's own helper
        client._got(delivery)  # noqa: SLF001

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        self._events.on_confirm(delivery_tag, multiple, ack)

    def on_server_cancel(self, consumer_tag: str) -> None:
        self._events.on_server_cancel(consumer_tag)

    def __getattr__(self, name: str) -> object:
        # the owner's other events (a shell's: reads done, the link closing) pass through
        return getattr(self._events, name)


# --------------------------------------------------------------------------- the client
class AmqpClient:
    """One AMQP connection with one channel at a time, without I/O.  A shell subclasses it,
    feeds ``_reader`` what it reads, writes ``_out`` and overrides the hooks."""

    def __init__(
        self,
        events: ChannelEvents,
        *,
        heartbeat: int,
        client_properties: bytes,
        reusable: bool = False,
        credentials: tuple[str, str, str] = ("", "", "/"),
    ) -> None:
        self._events = events
        # adapter.amqp_connection_reuse: the connection may serve several sessions, one after
        # the other, each on a channel of its own (recycle_channel)
        self._reusable = reusable
        self._client_properties = client_properties
        self._credentials = credentials  # (user, password, vhost); the password goes at open-ok
        self._requested_heartbeat = heartbeat
        self.phase = Phase.CONNECT
        self._reader = FrameReader(self._on_handshake_method, self._on_content_header, self._on_body)
        self._out: list[bytes | memoryview] = [wire.PROTOCOL_HEADER]
        self._out_large = False  # _out holds a large body: write it with writelines, unjoined
        self._close_sent = False  # we queued connection.close (a shell's close, or refused input)
        self.had_error = False  # a broker close, refused input, a lost socket
        # negotiated: connection.tune's values as tune-ok gives them back
        self.frame_max = DEFAULT_FRAME_MAX
        self.channel_max = 1  # one channel unless reusable
        self.heartbeat = 0
        # what connection.start's server-properties say the broker is (None: no version), and
        # whose plugin's queue.declare flags suit it (unknown: the newest, which every version
        # accepts); read once per connection, at the handshake
        self.server_properties: dict[str, object] = {}
        self.broker_version: str | None = None
        self.broker_generation: BrokerGeneration = NEWEST_BROKER
        # whether the broker refuses encoded surrogates in method short strings (4.3 and
        # newer, and a broker of unknown version): ``refuse_surrogates``
        self.strict_utf8 = True
        self.channel = CHANNEL
        # The channel is opened by the first frame written on it, not at login: channel.open
        # costs the broker about a quarter of a login (a channel process, a limiter, stats),
        # and a client that connects, sends nothing that needs it and leaves (a health check,
        # a script that lost its work) never pays it.  channel.open goes in the same write as
        # the first method on the channel: the broker handles a connection's frames in order.
        self._channel_unopened = False  # set at open-ok; cleared by _open_channel
        self._open_ok_due: int | None = None  # the channel whose lazy channel.open-ok is due
        # set when a session declared an exclusive or auto-delete queue: it belongs to the
        # connection, not the channel, so the connection must not serve another session
        self.declared_connection_queue = False
        self._blocked = False  # connection.blocked (a resource alarm) until unblocked
        self._publish_methods: dict[tuple[str, str], bytes] = {}
        # the replies that end the synchronous call waiting, if one is
        self._call_replies: frozenset[tuple[int, int]] | None = None
        # a delivery in progress: method args, properties, expected size, body parts
        self._delivery: tuple[str, int, bool, str, str] | None = None
        # the consumer tag a basic.get's message is given (BasicGet)
        self._get_tag = ""
        self._delivery_props: MessageProperties | None = None
        self._delivery_size = 0
        self._delivery_parts: list[bytes | memoryview] = []
        self._delivery_received = 0

    # ----------------------------------------------------------------- hooks (shells override)
    def _handshake_done(self) -> None:
        """open-ok: the connection is open."""

    def _replied(self, method: tuple[int, int], payload: bytes) -> None:
        """The reply of the call ``_start_call`` began (``payload`` includes the method id)."""

    def _got(self, delivery: Delivery) -> None:
        """The message of a basic.get (its get-ok and content): the reply of that call."""

    def _failed(self, error: AmqpError) -> None:
        """The connection (or, ``error.channel_only``, its channel) is unusable."""

    def _close_ok_received(self) -> None:
        """Our connection.close is answered: nothing more comes."""

    def _blocked_changed(self) -> None:
        """connection.blocked or unblocked (``_blocked``)."""

    def _returned(self, code: int, text: str, exchange: str, routing_key: str) -> None:
        """basic.return: a mandatory publish could not be routed."""

    def _encode_failed(self, error: wire.EncodeError) -> Exception:
        """What to raise for a value AMQP cannot carry (the link: the STOMP error)."""
        return error

    # ----------------------------------------------------------------- phases
    def _advance(self, event: Input) -> Phase:
        """Take the transition for ``event``; returns the phase it leaves.  No transition: the
        broker broke the protocol (UnexpectedMethod)."""
        before = self.phase
        after = TRANSITIONS.get((before, event))
        if after is None:
            where = "after the handshake" if before is Phase.OPEN else f"in phase {before.name.lower()}"
            raise UnexpectedMethod(f"{event} is not expected {where}")
        self.phase = after
        if after is Phase.CLOSED:
            self._reader.stop()  # nothing the broker sends after the end is read
        return before

    @property
    def user(self) -> str:
        """The user the connection logs in (or logged in) as."""
        return self._credentials[0]

    @property
    def handshake_step(self) -> str:
        """The handshake phase ("connect", "auth", "vhost"), "" once it is over."""
        return self.phase.value if self.phase in HANDSHAKE else ""

    def _fail(self, error: AmqpError) -> None:
        self.had_error = True
        self._failed(error)

    def _lost(self) -> None:
        """The socket ended."""
        self._advance(Input.LOST)
        self._call_replies = None

    def _refuse_input(self, code: int, text: str) -> bool:
        """The broker's bytes could not be handled (``code`` 501 undecodable, 503 out of
        sequence, 541 our bug): forget the delivery in progress, ask the broker to close (so it
        requeues what was not acknowledged) and fail.  True if a close was queued."""
        self._delivery = None
        self._delivery_props = None
        self._delivery_parts = []
        error = AmqpError(code, text, phase=self.handshake_step)
        queued = self._send_close(code, text)
        self._fail(error)
        return queued

    def _send_close(self, code: int = 200, text: str = "Goodbye") -> bool:
        """Queue connection.close unless one is queued or the connection is over; True if queued."""
        if self._close_sent or self.phase is Phase.CLOSED or self.phase is Phase.CLOSING:
            return False
        self._advance(Input.SEND_CLOSE)
        self._close_sent = True
        self._out.append(wire.connection_close(code, text[:255]))
        return True

    # ----------------------------------------------------------------- the handshake
    def _on_handshake_method(self, channel: int, payload: bytes) -> None:
        method = _method_of(payload)
        event = method_input(method)
        if event is Input.START:
            self._advance(event)
            self.server_properties = server_properties(payload)
            version = self.server_properties.get("version")
            if isinstance(version, bytes | str):
                self.broker_version = (
                    version.decode("utf-8", "replace") if isinstance(version, bytes) else version
                )
            self.broker_generation = broker_generation(self.broker_version) or NEWEST_BROKER
            self.strict_utf8 = checks_utf8_strictly(self.broker_version)
            user, password, _ = self._credentials
            self._out.append(wire.connection_start_ok(user, password, self._client_properties))
        elif event is Input.TUNE:
            channel_max, frame_max, server_heartbeat = wire.decode_connection_tune(payload)
            self._advance(event)
            if self._reusable:
                # every session gets a new channel number (0 from the broker: no limit), and
                # RabbitMQ counts a closed channel until its process has ended, so the next
                # session's channel.open must not hit a limit of one
                self.channel_max = channel_max or 65535
            self.frame_max = min(frame_max or DEFAULT_FRAME_MAX, DEFAULT_FRAME_MAX)
            self._reader.frame_max = self.frame_max
            wanted = self._requested_heartbeat
            self.heartbeat = min(server_heartbeat, wanted) if server_heartbeat and wanted else 0
            # tune-ok and connection.open in one write (AMQP lets a client send open without
            # waiting), one round trip per login fewer; the channel is opened lazily
            self._out.append(
                wire.connection_tune_ok(self.channel_max, self.frame_max, self.heartbeat)
                + wire.connection_open(self._credentials[2])
            )
        elif event is Input.OPEN_OK:
            self._advance(event)
            # nothing after the handshake needs the password (a recycled channel opens without
            # it, pooled reuse compares a keyed digest): a pooled connection must not keep it
            user, _, vhost = self._credentials
            self._credentials = (user, "", vhost)
            self._channel_unopened = True
            self._reader.set_method_handler(self._on_method)
            self._handshake_done()
        elif event is Input.CHANNEL_METHOD:
            # refused in the handshake phases; in a close begun before open-ok (refused input)
            # there is no channel yet for it to mean anything: dropped
            self._advance(event)
        else:
            self._on_connection_method(event, channel, payload)

    # ----------------------------------------------------------------- frames
    def _on_method(self, channel: int, payload: bytes) -> None:
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
            self._events.on_confirm(tag, multiple, ack)
            return
        if method[0] == 10:
            self._on_connection_method(method_input(method), channel, payload)
            return
        self._advance(Input.CHANNEL_METHOD)  # checked: OPEN or CLOSING, never after the end
        if method == wire.CHANNEL_CLOSE:
            code, text = wire.decode_close(payload)
            self._out.append(wire.channel_close_ok(channel))
            self._fail(AmqpError(code, text, channel_only=True, from_broker=True))
            return
        if method == wire.BASIC_CANCEL:
            consumer_tag, nowait = wire.decode_basic_cancel(payload)
            if not nowait:
                self._out.append(wire.basic_cancel_ok(self.channel, consumer_tag))
            self._events.on_server_cancel(consumer_tag)
            return
        if method == wire.CHANNEL_OPEN_OK and channel == self._open_ok_due:
            self._open_ok_due = None  # the lazy open's reply: nobody waits for it
            return
        replies = self._call_replies
        if replies is not None and method in replies:
            self._call_replies = None
            if method == wire.BASIC_GET_OK:
                # the call's reply is the message, once its content has come (_complete_delivery)
                delivery_tag, redelivered, exchange, routing_key, _ = wire.decode_get_ok(payload)
                self._delivery = (self._get_tag, delivery_tag, redelivered, exchange, routing_key)
                # its content is the reply, not a delivery: it goes to _got (no test per delivery)
                self._events = _GetReply(self, self._events)
                return
            self._replied(method, payload)
            return
        if method == wire.BASIC_RETURN:
            self._returned(*wire.decode_basic_return(payload))
            return
        log.debug("unexpected AMQP method %s on channel %s", method, channel)

    def _on_connection_method(self, event: Input, channel: int, payload: bytes) -> None:
        """connection.close, close-ok, blocked, unblocked; in the handshake also any method
        that is not the next step (the table refuses it)."""
        if event is Input.CLOSE:
            code, text = wire.decode_close(payload)
            step = self.handshake_step
            self._out.append(wire.connection_close_ok())
            self._advance(event)
            self._call_replies = None
            self._fail(AmqpError(code, text, phase=step, from_broker=True))
        elif event is Input.CLOSE_OK:
            self._advance(event)
            self._close_ok_received()
        elif event is Input.BLOCKED or event is Input.UNBLOCKED:
            self._advance(event)
            self._blocked = event is Input.BLOCKED
            self._blocked_changed()
        else:
            self._advance(event)  # raises: nothing else is valid here (a handshake step out of turn)
            raise AssertionError(f"TRANSITIONS lets {event} through in phase {self.phase!r}")

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
            return  # a basic.return's content, or a header without its method
        # tuple.__new__ directly: a NamedTuple's generated __new__ is one more Python call per message
        self._events.on_deliver(_new_delivery(Delivery, (*delivery, properties, body)))

    def delivery_context(self) -> str:
        """Which message a failure concerns, for a log line."""
        if self._delivery is None:
            return ""
        tag, delivery_tag, redelivered, exchange, routing_key = self._delivery
        return (
            f" (consumer tag {tag!r}, delivery tag {delivery_tag}, exchange {exchange!r},"
            f" routing key {routing_key!r}, redelivered {redelivered})"
        )

    # ----------------------------------------------------------------- calls in, bytes out
    # publish, ack, nack and declare_nowait only buffer: the shell writes _out when it likes.
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
        try:
            if method is None:
                method = wire.publish_method(self.channel, exchange, routing_key)
                if len(self._publish_methods) >= _PUBLISH_METHOD_CACHE_SIZE:
                    self._publish_methods.clear()
                self._publish_methods[(exchange, routing_key)] = method
            frames = wire.content_frames(self.channel, properties, body, self.frame_max)
        except wire.EncodeError as error:
            raise self._encode_failed(error) from error
        out = self._out
        out.append(method)
        out += frames
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
        if self._channel_unopened:
            self._open_channel()
        try:
            if self.strict_utf8:
                refuse_surrogates(op)
            self._out.append(fits(queue_declare_frame(self.channel, op), self.frame_max))
        except wire.EncodeError as error:
            raise self._encode_failed(error) from error

    def _operation_call(self, op: BrokerCall) -> tuple[bytes, tuple[int, int]]:
        """The method frame of one of the session's synchronous operations and its reply."""
        if self._channel_unopened:
            self._open_channel()
        channel = self.channel
        try:
            if self.strict_utf8:
                refuse_surrogates(op)
            if isinstance(op, QueueDeclare):
                if op.exclusive or op.auto_delete:
                    # the queue lives as long as the connection (exclusive) or until its last
                    # consumer goes (auto-delete): a connection that declared one is never reused
                    self.declared_connection_queue = True
                return fits(queue_declare_frame(channel, op), self.frame_max), wire.QUEUE_DECLARE_OK
            if isinstance(op, BasicConsume):
                frame = wire.basic_consume(
                    channel, op.queue, op.consumer_tag, op.no_ack, op.arguments, op.exclusive
                )
                return fits(frame, self.frame_max), wire.BASIC_CONSUME_OK
            if isinstance(op, ExchangeDeclare):
                frame = wire.exchange_declare(
                    channel, op.exchange, op.type, durable=op.durable, auto_delete=op.auto_delete
                )
                return frame, wire.EXCHANGE_DECLARE_OK
            if isinstance(op, QueueBind):
                frame = wire.queue_bind(channel, op.queue, op.exchange, op.routing_key, dict(op.arguments))
                return fits(frame, self.frame_max), wire.QUEUE_BIND_OK
            if isinstance(op, BasicQos):
                return wire.basic_qos(channel, op.prefetch_count), wire.BASIC_QOS_OK
            if isinstance(op, BasicCancel):
                return wire.basic_cancel(channel, op.consumer_tag), wire.BASIC_CANCEL_OK
            if isinstance(op, QueueDelete):
                return wire.queue_delete(channel, op.queue), wire.QUEUE_DELETE_OK
            if isinstance(op, ConfirmSelect):
                return wire.confirm_select(channel), wire.CONFIRM_SELECT_OK
            if isinstance(op, BasicGet):
                # the reply is get-ok (this one) or get-empty (AsyncClient.execute waits for both)
                self._get_tag = op.consumer_tag
                return wire.basic_get(channel, op.queue), wire.BASIC_GET_OK
            assert_never(op)
        except wire.EncodeError as error:
            raise self._encode_failed(error) from error

    def _start_call(self, frame: bytes, replies: tuple[tuple[int, int], ...]) -> None:
        """Queue a synchronous method; ``_replied`` comes with the first of ``replies``."""
        assert self._call_replies is None, "synchronous AMQP calls must not overlap"
        self._call_replies = frozenset(replies)
        self._out.append(frame)

    def _next_channel(self) -> None:
        """After the session's channel closed (close-ok): the next session's has a new number
        and is opened by its first frame, like a fresh login's."""
        self.channel = self.channel % self.channel_max + 1
        self._channel_unopened = True
        self._publish_methods.clear()  # they carry the channel number

    def _spare_channel(self) -> int:
        """A channel other than the session's (2 when only one was negotiated)."""
        return self.channel % max(self.channel_max, 2) + 1
