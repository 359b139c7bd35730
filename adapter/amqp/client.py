"""The AMQP 0-9-1 connection core, sans-IO: bytes in, events out; calls in, bytes out.

Owns everything about an AMQP connection that is not a socket, a clock or a channel: the
handshake (connection.start, tune, open, with the broker's version read from connection.start
and the password forgotten at open-ok), the connection's phases and the one table of their
transitions, the negotiated values (frame_max, channel_max, heart-beat interval), the
connection-class methods (close, close-ok, blocked, unblocked), and where every frame after the
handshake goes: to the one channel of a connection that carries one session at a time
(``ConnectionCore.carry``: the reader calls that channel core's handlers directly), or to the
channel its number names (``ConnectionCore.route``: a shared connection).  Also here: what a
channel core needs beside it (the calls a session makes, their encoding checks, the events a
channel reports).  The channel core itself (pending call, delivery assembly, confirms, publish
cache) is adapter/amqp/channel.py.

Shells own these cores, none extends them: the server's asyncio socket
(adapter/amqp/connection.py ``AmqpSocket``: socket, handshake future, heart-beat timer, flow
control) with a session's link on it (``AmqpConnection``, a connection of its own;
adapter/amqp/shared.py ``ChannelLink``, a channel on a shared one), and the Spark reader's
blocking client (adapter/spark/broker.py: a blocking socket and deadlines).

Bytes in: a shell hands what it read to ``reader.feed`` (the ``FrameReader``, one call per
read); bytes out: everything to send is appended to ``out``, which the shell writes when it
likes.  Events out, as direct calls on the shell's ``ConnectionHooks`` (and, for routing by
number, ``RoutingHooks``): this runs per frame, and a direct call is the cheapest way out, the
same reason the frame reader uses callbacks.

Phases: ``TRANSITIONS`` maps (phase, input) to the next phase; an input the table has no entry
for is the broker breaking the protocol (``UnexpectedMethod``: the shell closes with 503
command_invalid).  The per-message handlers need no lookup: during the handshake the reader's
method callback is the core's handshake handler, and from open-ok on the channel's (or the
router's).

Heart-beats stay in the asyncio shell (``connection.py``): only their negotiation is here.

Pure: no asyncio, no sockets, no clock, no logging of its own beyond one debug line.
"""

from __future__ import annotations

import logging
import re
import struct
from collections import deque
from collections.abc import Callable
from enum import StrEnum
from typing import Final, Protocol

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
    UPDATE_SECRET_OK = "connection.update-secret-ok"  # the broker took a new token
    OTHER_CONNECTION_METHOD = "another connection method"  # secure, tune out of turn ...: never valid
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
    # the answer to connection.update-secret (a token refreshed; a close may cross it)
    (Phase.OPEN, Input.UPDATE_SECRET_OK): Phase.OPEN,
    (Phase.CLOSING, Input.UPDATE_SECRET_OK): Phase.CLOSING,
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
    wire.CONNECTION_UPDATE_SECRET_OK: Input.UPDATE_SECRET_OK,
}


_method_id: Final[Callable[[bytes], tuple[int, int]]] = struct.Struct(">HH").unpack_from


def _method_of(payload: bytes) -> tuple[int, int]:
    """(class id, method id) of a method frame's payload."""
    try:
        return _method_id(payload)
    except struct.error:
        raise wire.DecodeError("method frame shorter than its method id") from None


_OTHER: Final = Input.OTHER_CONNECTION_METHOD


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


# tune-ok + connection.open by (channel_max, frame_max, heart-beat, vhost): the same for every
# login of a vhost to one broker (building them was a tenth of a login's encoding calls)
_TUNE_OK_AND_OPEN: dict[tuple[int, int, int, str], bytes] = {}
_TUNE_OK_AND_OPEN_CACHE_SIZE: Final = 64


def tune_ok_and_open(channel_max: int, frame_max: int, heartbeat: int, vhost: str) -> bytes:
    """connection.tune-ok with the negotiated values and connection.open of ``vhost``, encoded."""
    key = (channel_max, frame_max, heartbeat, vhost)
    frames = _TUNE_OK_AND_OPEN.get(key)
    if frames is None:
        frames = wire.connection_tune_ok(channel_max, frame_max, heartbeat) + wire.connection_open(vhost)
        if len(_TUNE_OK_AND_OPEN) >= _TUNE_OK_AND_OPEN_CACHE_SIZE:
            _TUNE_OK_AND_OPEN.clear()
        _TUNE_OK_AND_OPEN[key] = frames
    return frames


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
    """What the broker sends on a channel, for whoever consumes it (a STOMP session, the
    Spark reader): called as each arrives."""

    def on_deliver(self, delivery: Delivery) -> None: ...

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None: ...

    def on_server_cancel(self, consumer_tag: str) -> None: ...


class ConnectionHooks(Protocol):
    """What the connection core tells the shell that owns it."""

    def handshake_done(self) -> None:
        """open-ok: the connection is open."""

    def connection_failed(self, error: AmqpError) -> None:
        """The connection is unusable (the broker closed it, its input was refused, the socket
        ended); a channel's own failure goes to that channel's owner instead."""

    def close_ok_received(self) -> None:
        """Our connection.close is answered: nothing more comes."""

    def blocked_changed(self) -> None:
        """connection.blocked or unblocked (``ConnectionCore.blocked``)."""


class RoutingHooks(Protocol):
    """What the connection core tells the owner of the channels it routes frames to by number
    (a shared connection)."""

    def channel_input_refused(self, channel: RoutedChannel, error: Exception) -> None:
        """A frame on ``channel`` could not be handled (undecodable, out of sequence, or a
        bug); the connection's other channels go on (the frame itself was whole)."""

    def closed_channel_answered(self, channel: int) -> None:
        """The close-ok of a channel no session holds came, or the broker closed such a channel
        and was answered: its number is free."""


class RoutedChannel(Protocol):
    """What the connection core uses of a channel core (adapter/amqp/channel.py) it hands
    frames to."""

    channel: int
    in_read: bool  # had frames in the current read (routing by number)
    header_bytes: int  # the size of the last content header routed to it

    def on_method(self, channel: int, payload: bytes) -> None: ...

    def on_content_header(self, payload: bytes) -> None: ...

    def on_body(self, payload: bytes | memoryview) -> None: ...

    def forget_delivery(self) -> None: ...

    def delivery_context(self) -> str: ...


# --------------------------------------------------------------------------- the connection core
class ConnectionCore:
    """One AMQP connection without I/O: the handshake, the phases, the negotiated values and
    what connection.start said of the broker, connection-class methods, and where every frame
    after the handshake goes (see the module docstring).  A shell feeds ``reader`` what it
    reads and writes ``out``."""

    def __init__(
        self,
        hooks: ConnectionHooks,
        *,
        heartbeat: int,
        client_properties: bytes,
        many_channels: bool = False,
        credentials: tuple[str, str, str] = ("", "", "/"),
    ) -> None:
        self.hooks = hooks
        # adapter.amqp_connection_reuse or a shared connection: negotiate the broker's
        # channel_max (a channel per session, one after the other or side by side)
        self._many_channels = many_channels
        self._client_properties = client_properties
        self._credentials = credentials  # (user, password, vhost); the password goes at open-ok
        self._requested_heartbeat = heartbeat
        self.phase = Phase.CONNECT
        self.reader = FrameReader(HandshakeFrames(self))
        # bytes out: the socket's buffer; a channel of a connection of its own appends to it too
        self.out: list[bytes | memoryview] = [wire.PROTOCOL_HEADER]
        self.close_sent = False  # we queued connection.close (a shell's close, or refused input)
        self.had_error = False  # a broker close, refused input, a lost socket
        # negotiated: connection.tune's values as tune-ok gives them back
        self.frame_max = DEFAULT_FRAME_MAX
        self.channel_max = 1  # one channel unless many_channels
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
        self.blocked = False  # connection.blocked (a resource alarm) until unblocked
        # where frames go after open-ok: the one channel (``carry``), or by number (``route``)
        self._only: RoutedChannel | None = None
        self._routing: RoutingHooks | None = None
        self.channels: dict[int, RoutedChannel] = {}
        self.touched: list[RoutedChannel] = []  # channels that had frames in this read
        # connection.update-secret calls waiting for their -ok, oldest first (a token refresh:
        # adapter/amqp/secret.py); each is told None (taken) or the error that ended the connection
        self.secret_waiters: deque[Callable[[AmqpError | None], None]] = deque()

    # ----------------------------------------------------------------- where frames go
    def carry(self, channel: RoutedChannel) -> None:
        """Hand every frame after the handshake to ``channel`` (a connection with one session
        at a time): the reader calls the channel's own handlers, no routing in between."""
        self._only = channel

    def route(self, hooks: RoutingHooks) -> None:
        """Hand frames after the handshake to the channel of ``channels`` their number names
        (a shared connection); connection methods come on channel 0."""
        self._only = None
        self._routing = hooks

    def login_as(self, user: str, password: str, vhost: str) -> None:
        self._credentials = (user, password, vhost)

    @property
    def user(self) -> str:
        """The user the connection logs in (or logged in) as."""
        return self._credentials[0]

    def delivery_context(self) -> str:
        """Which message a failure concerns, for a log line ("" when no channel is carried)."""
        return self._only.delivery_context() if self._only is not None else ""

    @property
    def handshake_step(self) -> str:
        """The handshake phase ("connect", "auth", "vhost"), "" once it is over."""
        return self.phase.value if self.phase in HANDSHAKE else ""

    # ----------------------------------------------------------------- phases
    def advance(self, event: Input) -> Phase:
        """Take the transition for ``event``; returns the phase it leaves.  No transition: the
        broker broke the protocol (UnexpectedMethod)."""
        before = self.phase
        after = TRANSITIONS.get((before, event))
        if after is None:
            where = "after the handshake" if before is Phase.OPEN else f"in phase {before.name.lower()}"
            raise UnexpectedMethod(f"{event} is not expected {where}")
        self.phase = after
        if after is Phase.CLOSED:
            self.reader.stop()  # nothing the broker sends after the end is read
            self._only = None  # nor carried to the channel (which refers back to this core)
        return before

    def fail(self, error: AmqpError) -> None:
        self.had_error = True
        self._secret_not_taken(error)
        self.hooks.connection_failed(error)

    def lost(self) -> None:
        """The socket ended."""
        self.advance(Input.LOST)
        if self.secret_waiters:  # the error is made only for someone to tell
            self._secret_not_taken(AmqpError(0, "the AMQP connection was lost"))

    # ----------------------------------------------------------------- connection.update-secret
    def update_secret(self, secret: bytes, reason: str, answered: Callable[[AmqpError | None], None]) -> None:
        """Queue connection.update-secret; ``answered`` is told None at its -ok, or the error
        that ended the connection first (RabbitMQ answers a secret it refuses with 530, which
        closes the whole connection).  Raises AmqpError when the connection is not open."""
        if self.phase is not Phase.OPEN:
            raise AmqpError(0, "the AMQP connection is not open")
        self.secret_waiters.append(answered)
        self.out.append(wire.connection_update_secret(secret, reason))

    def _secret_not_taken(self, error: AmqpError) -> None:
        waiters = self.secret_waiters
        while waiters:
            waiters.popleft()(error)

    def refuse_input(self, code: int, text: str) -> bool:
        """The broker's bytes could not be handled (``code`` 501 undecodable, 503 out of
        sequence, 541 our bug): forget the delivery in progress, ask the broker to close (so it
        requeues what was not acknowledged) and fail.  True if a close was queued."""
        if self._only is not None:
            self._only.forget_delivery()
        error = AmqpError(code, text, phase=self.handshake_step)
        queued = self.send_close(code, text)
        self.fail(error)
        return queued

    def send_close(self, code: int = 200, text: str = "Goodbye") -> bool:
        """Queue connection.close unless one is queued or the connection is over; True if queued."""
        if self.close_sent or self.phase is Phase.CLOSED or self.phase is Phase.CLOSING:
            return False
        self.advance(Input.SEND_CLOSE)
        self.close_sent = True
        self.out.append(wire.connection_close(code, text[:255]))
        return True

    # ----------------------------------------------------------------- the handshake
    def on_handshake_method(self, channel: int, payload: bytes) -> None:
        """A method frame before connection.open-ok (``HandshakeFrames``)."""
        try:
            method = _method_id(payload)
        except struct.error:
            raise wire.DecodeError("method frame shorter than its method id") from None
        # method_input, inline: a login runs this once per handshake step
        event = _CONNECTION_INPUTS.get(method, _OTHER) if method[0] == 10 else Input.CHANNEL_METHOD
        if event is Input.START:
            self.advance(event)
            self.server_properties = server_properties(payload)
            version = self.server_properties.get("version")
            if isinstance(version, bytes | str):
                self.broker_version = (
                    version.decode("utf-8", "replace") if isinstance(version, bytes) else version
                )
            self.broker_generation = broker_generation(self.broker_version) or NEWEST_BROKER
            self.strict_utf8 = checks_utf8_strictly(self.broker_version)
            user, password, _ = self._credentials
            self.out.append(wire.connection_start_ok(user, password, self._client_properties))
        elif event is Input.TUNE:
            channel_max, frame_max, server_heartbeat = wire.decode_connection_tune(payload)
            self.advance(event)
            if self._many_channels:
                # every session gets a new channel number (0 from the broker: no limit), and
                # RabbitMQ counts a closed channel until its process has ended, so the next
                # session's channel.open must not hit a limit of one
                self.channel_max = channel_max or 65535
            self.frame_max = min(frame_max or DEFAULT_FRAME_MAX, DEFAULT_FRAME_MAX)
            self.reader.frame_max = self.frame_max
            wanted = self._requested_heartbeat
            self.heartbeat = min(server_heartbeat, wanted) if server_heartbeat and wanted else 0
            # tune-ok and connection.open in one write (AMQP lets a client send open without
            # waiting), one round trip per login fewer; the channel is opened lazily
            self.out.append(
                tune_ok_and_open(self.channel_max, self.frame_max, self.heartbeat, self._credentials[2])
            )
        elif event is Input.OPEN_OK:
            self.advance(event)
            # nothing after the handshake needs the password (a recycled channel opens without
            # it, pooled reuse compares a keyed digest): a pooled connection must not keep it
            user, _, vhost = self._credentials
            self._credentials = (user, "", vhost)
            # from now on every frame goes to its channel; takes effect within the current read
            # (a connection of one channel: straight to it; else the routing by number below)
            self.reader.handler = self._only if self._only is not None else self
            self.hooks.handshake_done()
        elif event is Input.CHANNEL_METHOD:
            # refused in the handshake phases; in a close begun before open-ok (refused input)
            # there is no channel yet for it to mean anything: dropped
            self.advance(event)
        else:
            self.on_connection_method(event, channel, payload)

    def on_connection_method(self, event: Input, channel: int, payload: bytes) -> None:
        """connection.close, close-ok, blocked, unblocked; in the handshake also any method
        that is not the next step (the table refuses it)."""
        if event is Input.CLOSE:
            code, text = wire.decode_close(payload)
            step = self.handshake_step
            self.out.append(wire.connection_close_ok())
            self.advance(event)
            self.fail(AmqpError(code, text, phase=step, from_broker=True))
        elif event is Input.CLOSE_OK:
            self.advance(event)
            self.hooks.close_ok_received()
        elif event is Input.BLOCKED or event is Input.UNBLOCKED:
            self.advance(event)
            self.blocked = event is Input.BLOCKED
            self.hooks.blocked_changed()
        elif event is Input.UPDATE_SECRET_OK:
            self.advance(event)
            if self.secret_waiters:  # an -ok nobody asked for changes nothing: ignored
                self.secret_waiters.popleft()(None)
        else:
            self.advance(event)  # raises: nothing else is valid here (a handshake step out of turn)
            raise AssertionError(f"TRANSITIONS lets {event} through in phase {self.phase!r}")

    # ----------------------------------------------------------------- routing by number (per frame)
    # The reader's handler (adapter/amqp/framing.py FrameHandler) once the connection is open,
    # when it carries several channels.
    def on_method(self, channel: int, payload: bytes) -> None:
        routed = self.channels.get(channel)
        if routed is not None:
            if not routed.in_read:
                routed.in_read = True
                self.touched.append(routed)
            try:
                routed.on_method(channel, payload)
            except Exception as error:  # noqa: BLE001 - one channel's input ends that channel only
                self._refused(routed, error)
            return
        method = _method_of(payload)
        if channel != 0:
            self._closed_channel_method(channel, method)
        elif method[0] == 10:
            self.on_connection_method(method_input(method), channel, payload)
        else:
            self.advance(Input.CHANNEL_METHOD)  # checked: OPEN or CLOSING
            log.debug("unexpected AMQP method %s on channel 0", method)

    def _refused(self, routed: RoutedChannel, error: Exception) -> None:
        if self._routing is not None:
            self._routing.channel_input_refused(routed, error)
        routed.forget_delivery()

    # A delivery may be completed by its content frames alone, in a read after its method's
    # (a body larger than one read, TCP segments split anywhere): the content routes mark
    # their channel as having had frames in this read too, or its MESSAGE would wait for the
    # next method of its channel.
    def on_content_header(self, payload: bytes) -> None:
        routed = self.channels.get(self.reader.channel)
        if routed is not None:
            if not routed.in_read:
                routed.in_read = True
                self.touched.append(routed)
            routed.header_bytes = len(payload)  # what the properties cost, should it be paused
            try:
                routed.on_content_header(payload)
            except Exception as error:  # noqa: BLE001
                self._refused(routed, error)

    def on_body(self, payload: bytes | memoryview) -> None:
        routed = self.channels.get(self.reader.channel)
        if routed is not None:
            if not routed.in_read:
                routed.in_read = True
                self.touched.append(routed)
            try:
                routed.on_body(payload)
            except Exception as error:  # noqa: BLE001
                self._refused(routed, error)

    def _closed_channel_method(self, channel: int, method: tuple[int, int]) -> None:
        """A method on a channel no session holds: a closing one's close-ok frees its number
        (``RoutingHooks.closed_channel_answered``); the broker closing one we no longer track
        gets its close-ok; the rest (deliveries in flight) is dropped: the broker requeues them
        when the channel closes."""
        if method == wire.CHANNEL_CLOSE:
            self.out.append(wire.channel_close_ok(channel))
        elif method != wire.CHANNEL_CLOSE_OK:
            return
        if self._routing is not None:
            self._routing.closed_channel_answered(channel)

    def take_touched(self) -> list[RoutedChannel]:
        """The channels that had frames in this read (each once), cleared for the next read."""
        touched, self.touched = self.touched, []
        for routed in touched:
            routed.in_read = False
        return touched


class HandshakeFrames:
    """The reader's handler until connection.open-ok (adapter/amqp/framing.py FrameHandler):
    methods go to the connection core's handshake; content frames, before any channel is open,
    are dropped (a content header decoded first: a bad one is refused as any undecodable frame
    is)."""

    __slots__ = ("_core",)

    def __init__(self, core: ConnectionCore) -> None:
        self._core = core

    def on_method(self, channel: int, payload: bytes) -> None:
        self._core.on_handshake_method(channel, payload)

    def on_content_header(self, payload: bytes) -> None:
        wire.decode_content_header(payload)

    def on_body(self, payload: bytes | memoryview) -> None:
        pass
