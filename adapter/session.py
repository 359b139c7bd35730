"""The per-connection STOMP session: client frames and broker events in, ordered operations out.

Pure (sans-IO): imports neither asyncio, aio-pika, pamqp nor pydantic.  The shell
(``adapter/server/connection.py``) owns the sockets and the AMQP connection.

Each client frame is handled by a generator that yields operations (``adapter.mapping.operations``)
in the order they must happen; the shell executes them strictly in that order and sends each
synchronous operation's result back into the generator.  That order is what gives STOMP its
semantics over AMQP (see docs/architecture.md): a SEND's RECEIPT is released by the publisher
confirm that covers its sequence number, a transaction is a buffer replayed at COMMIT, and a
SUBSCRIBE's RECEIPT follows its consume and bind.

Broker events (deliveries, confirms, server-side cancels, channel errors) come in through the
``on_*`` methods, which return the bytes or operations to send.

Errors: every ERROR this module produces for a client frame is followed by closing the connection,
as STOMP 1.2 requires ("the server MUST ... close the connection").  The plugin leaves the
connection open after most of them; docs/compatibility.md lists that difference.  The one
exception is a server-initiated subscription cancel, which is not the client's error and leaves
the connection open, as in the plugin.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Generator, Iterable, MutableMapping
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, Literal

from .caps import ConnectionCap
from .errors import StompError
from .mapping import dispatch
from .mapping.budget import BudgetExceeded, Budgets, KeptDeliveries
from .mapping.destinations import (
    QUEUE_ARGUMENTS,
    Destination,
    DestinationError,
    DestinationKind,
    ProcessingError,
    QueueParams,
    consumer_tag,
    is_durable,
    message_destination,
    parse_destination,
    plugin_integer,
    publish_target,
    reply_to_temp_queue,
    require_id_for_durable,
    stream_offset_argument,
)
from .mapping.operations import (
    ActivateDispatch,
    AwaitConfirms,
    BasicAck,
    BasicCancel,
    BasicConsume,
    BasicNack,
    BasicPublish,
    BasicQos,
    CloseAmqp,
    CloseClient,
    ConfirmSelect,
    DeleteQueueOnClose,
    Delivery,
    DispatchDelivery,
    DispatchSettle,
    Established,
    JoinDispatch,
    LeaveDispatch,
    LoginResult,
    OpenConnection,
    Operation,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    SendFrame,
)
from .mapping.profile import (
    ClientIds,
    Profile,
    client_id_in_use,
    dead_letter_copy,
    rules_for,
    selector_lookup,
)
from .mapping.properties import PROPERTY_HEADERS, MessageProperties, message_headers
from .mapping.selector import Selector
from .numbers import TooManyDigits, decimal_integer
from .stomp import heartbeat
from .stomp.codec import FrameError, FrameLimits, encode_frame, escape
from .stomp.frame import SUPPORTED_VERSIONS, Command, Frame

Steps = Generator[Operation, object, None]

AckMode = Literal["auto", "client", "client-individual"]
ACK_MODES: tuple[AckMode, ...] = ("auto", "client", "client-individual")
# Transaction limits of the newer plugin (docs/behaviour.md#limits, [main]); 3.10.8 has none.
MAX_TRANSACTIONS = 16
# The ERROR body of a CONNECT over stomp.max_connections (message "Bad CONNECT"), the plugin's words
NODE_LIMIT_REACHED = "Connection refused: node connection limit reached"
MAX_TRANSACTION_ACTIONS = 1024
_QUEUE_ARGUMENT_HEADERS = frozenset(QUEUE_ARGUMENTS)
# Parsed destinations are cached per session: clients reuse a handful of destinations.
_DESTINATION_CACHE_SIZE = 256


def _remember(cache: dict[Any, Any], key: object, value: object) -> None:
    """Store in a per-session cache, emptied when full so a client cycling through endless
    destination names cannot grow it without bound."""
    if len(cache) >= _DESTINATION_CACHE_SIZE:
        cache.clear()
    cache[key] = value


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What the session needs from the configuration; built by ``adapter.config``."""

    default_user: str | None = "guest"
    default_pass: str | None = field(default="guest", repr=False)  # a password: never in a repr
    default_vhost: str = "/"
    implicit_connect: bool = False
    hide_server_info: bool = False
    default_nack_requeue: bool = True
    default_topic_exchange: str = "amq.topic"
    loopback_users: frozenset[str] = frozenset({"guest"})
    trailing_lf: bool = True
    frame_limits: FrameLimits = field(default_factory=FrameLimits)
    unauthenticated_limits: FrameLimits = field(default_factory=lambda: FrameLimits(max_frame_size=65536))
    # the STOMP dialect: "rabbitmq" (the plugin's) or "activemq" (adapter/mapping/profile.py)
    profile: str = Profile.RABBITMQ
    # activemq profile: the client ids connected now, shared by every connection of the process
    client_ids: ClientIds = field(default_factory=ClientIds, compare=False)
    # activemq profile: the dispatchers of selector subscriptions on queues, per process
    dispatchers: dispatch.Dispatchers = field(default_factory=dispatch.Dispatchers, compare=False)
    # stomp.max_connections: the sessions of every listener of the process, or None (no cap)
    connection_cap: ConnectionCap | None = field(default=None, compare=False)
    # the byte pools of transactions and kept deliveries, per process, and the per-connection
    # bounds (adapter/mapping/budget.py)
    budgets: Budgets = field(default_factory=Budgets, compare=False)


class State(Enum):
    AWAITING_CONNECT = auto()
    CONNECTED = auto()
    CLOSED = auto()


@dataclass(slots=True)
class Subscription:
    consumer_tag: str
    id: str | None  # the SUBSCRIBE id header; None for id-less (Q_) subscriptions
    destination: str  # the destination header as sent
    parsed: Destination | None  # None for the implicit temp-queue subscriptions
    ack_mode: AckMode
    # activemq profile: deliveries it does not match are acked and dropped (topic subscriptions)
    selector: Selector | None = None
    # activemq profile: a selector subscription on a queue, whose deliveries go through the
    # process's dispatcher of that queue (adapter/mapping/dispatch.py); its selector is there
    dispatched: bool = False
    # filled on the first delivery, reused for every MESSAGE: the command and subscription
    # lines, and the escaped message-id up to its delivery tag
    message_head: str = ""
    message_id_prefix: str = ""


def _match_all(_properties: MessageProperties) -> bool:
    """The selector of a subscription without one (a member of a queue's dispatcher)."""
    return True


def _selector_matcher(selector: Selector) -> Callable[[MessageProperties], bool]:
    """A selector as the dispatcher asks it (adapter/mapping/dispatch.py)."""

    def matches(properties: MessageProperties) -> bool:
        return selector.matches(selector_lookup(properties))

    return matches


def new_session_id(random16: bytes) -> str:
    """``session-`` + base64url (no padding) of 16 random bytes, as the plugin does
    (docs/behaviour.md#authentication)."""
    return "session-" + base64.urlsafe_b64encode(random16).rstrip(b"=").decode("ascii")


class Session:
    def __init__(
        self,
        settings: SessionSettings,
        *,
        session_id: str,
        peer_is_loopback: bool,
    ) -> None:
        self.settings = settings
        self._rules = rules_for(settings.profile)
        # bound once: quick_send runs for every message
        self._send_properties = self._rules.send_properties
        # activemq profile: CONNECT's client-id, the owner of named durable subscriptions
        self.client_id: str | None = None
        self.session_id = session_id
        self.peer_is_loopback = peer_is_loopback
        # login and passcode that replace CONNECT's (web_stomp.use_http_auth: the WebSocket
        # request's HTTP Basic credentials, else the default user, as the plugin forces them)
        self.forced_credentials: tuple[str, str] | None = None
        self.state = State.AWAITING_CONNECT
        self.version = "1.0"
        self.user: str | None = None
        self.vhost: str | None = None
        self._subscriptions: dict[str, Subscription] = {}
        self._declared_queues: set[str] = set()
        self._temp_queues: dict[str, str] = {}
        # activemq profile: /temp-topic/NAME -> its private queue, apart from the temp queues
        self._temp_topics: dict[str, str] = {}
        self._transactions: dict[str, list[tuple[Operation, str | None]]] = {}
        # the bytes of SEND bodies the open transactions hold, against the per-connection and
        # process-wide bounds (adapter/mapping/budget.py); given back at COMMIT, ABORT and close
        budgets = settings.budgets
        self._transaction_bytes = budgets.transaction_account()
        self._destinations: dict[str, Destination] = {}
        # SEND destinations already published to once: raw destination -> (exchange, routing key)
        self._send_targets: dict[str, tuple[str, str]] = {}
        self._message_destinations: dict[tuple[str, str], str] = {}
        # publisher confirms: once confirm mode is on, every publish takes the next sequence
        # number; receipts wait here until the broker's basic.ack covers their number
        # (docs/behaviour.md#receipts)
        self._confirming = False
        self._publish_seq = 0
        self._pending_receipts: dict[int, str] = {}
        # COMMIT receipts: each waits until every publish of its transaction is confirmed,
        # (receipt, sequence numbers not yet confirmed)
        self._pending_commits: list[tuple[str, set[int]]] = []
        # NACK to a dead-letter queue (activemq profile, docs/migration-activemq.md): the
        # unsettled deliveries of client-ack subscriptions by delivery tag (their bodies are
        # copied there), and the sequence numbers of copies the broker has not yet confirmed
        self._dead_letter_queue = self._rules.dead_letter_queue
        # the bytes of the bodies kept here and in _dispatched, against the per-connection and
        # process-wide bounds (adapter/mapping/budget.py); given back as they are settled
        self._kept_bytes = budgets.unacked_account()
        self._unsettled: MutableMapping[int, Delivery] | None = None
        # the unsettled messages of dispatched subscriptions of client-ack modes, by (consumer
        # tag, message number): their bodies go to the dead-letter queue on NACK
        self._dispatched: MutableMapping[tuple[str, int], Delivery] = KeptDeliveries(self._kept_bytes)
        # whether a subscription outside the dispatchers ever asked for client acks: then the
        # channel may hold unsettled deliveries the dispatchers do not know, and their acks
        # are never coalesced into a multiple ack (adapter/server/dispatching.py)
        self.plain_acks = False
        self._dead_letter_seqs: set[int] = set()
        self._dead_letter_refused = False
        self._dead_letter_declared = False
        if self._dead_letter_queue is not None:
            self._unsettled = KeptDeliveries(self._kept_bytes)
            # kept only in this profile: the default profile's per-delivery path is untouched
            self.on_delivery = self._on_delivery_kept  # type: ignore[method-assign]
        self._ack_header = "message-id"
        # the subscription queue a SUBSCRIBE has declared but not yet consumed and bound: if
        # the broker refuses the consume or the bind, the plugin deletes it
        # (docs/destinations.md#common-steps)
        self._unfinished_subscription_queue: str | None = None
        # counted for the metrics (adapter/server/stats.py): MESSAGE frames rendered, every other
        # frame by command, ERROR frames by message, and why a login failed (None: it did not)
        self.messages_sent = 0
        self.frames_sent: dict[str, int] = {}
        self.errors_sent: dict[str, int] = {}
        self.login_failure: str | None = None
        # told the receipt-id of each RECEIPT as it is rendered (the shell times receipts)
        self.on_receipt: Callable[[str], None] | None = None
        # the login and vhost the last CONNECT asked for, successful or not (for the close log line)
        self.requested_user: str | None = None
        self.requested_vhost: str | None = None

    # ------------------------------------------------------------------ frames from the client
    def handle_frame(self, frame: Frame) -> Steps:
        """Generator of the operations for one client frame (see module docstring)."""
        try:
            if self.state is State.CONNECTED:
                handler = self._HANDLERS.get(frame.command)
                if handler is None:
                    if frame.command in (Command.CONNECT, Command.STOMP):
                        yield from self._fail("Already connected", "A second CONNECT is not allowed", frame)
                    else:
                        yield from self._fail(
                            "Bad command", f'Could not interpret command "{frame.command}"\n', frame
                        )
                    return
                yield from handler(self, frame)
            elif self.state is State.AWAITING_CONNECT:
                if frame.command in (Command.CONNECT, Command.STOMP):
                    yield from self._connect(frame)
                elif self.settings.implicit_connect:
                    yield from self._implicit_connect(frame)
                else:
                    yield from self._fail("Illegal command", "You must log in using CONNECT first", frame)
        except StompError as error:  # DestinationError, ProcessingError
            yield from self._fail(error.message, error.detail, frame)

    def on_frame_error(self, error: FrameError) -> list[Operation]:
        """The byte stream broke the grammar or a limit: ERROR, then close (the plugin is silent)."""
        return list(self._fail(error.message, error.detail, None))

    # ------------------------------------------------------------------ CONNECT
    def _connect(self, frame: Frame) -> Steps:
        if not self._admitted():
            yield from self._fail("Bad CONNECT", NODE_LIMIT_REACHED, frame)
            return
        headers = frame.headers
        version = self._negotiate_version(headers.get("accept-version"))
        if version is None:
            yield from self._fail(
                "Version mismatch",
                "Supported versions are " + ",".join(SUPPORTED_VERSIONS) + "\n",
                frame,
            )
            return
        if version == "1.0":
            # 1.0 header values are left-trimmed, the CONNECT frame included (docs/behaviour.md#limits)
            headers = {k: v.lstrip() for k, v in headers.items()}
        yield from self._login(version, headers, frame, send_connected=True)

    def _implicit_connect(self, frame: Frame) -> Steps:
        # docs/behaviour.md#authentication: log in with no headers as a 1.0 client, send no CONNECTED, then
        # process the frame as usual
        if not self._admitted():
            yield from self._fail("Bad CONNECT", NODE_LIMIT_REACHED, frame)
            return
        yield from self._login("1.0", {}, frame, send_connected=False)
        if self.state is State.CONNECTED:
            yield from self._HANDLERS.get(frame.command, Session._bad_command)(self, frame)

    def _admitted(self) -> bool:
        """stomp.max_connections, checked first as the plugin does: the session takes its slot
        here (a login in progress counts, so the cap holds however many log in at once) and
        gives it back in on_closed, whether the login succeeds or not."""
        cap = self.settings.connection_cap
        if cap is None or cap.acquire(self):
            return True
        self.login_failure = "max_connections"
        return False

    @staticmethod
    def _negotiate_version(accept: str | None) -> str | None:
        # split on "," without trimming; the highest supported version wins (docs/behaviour.md#authentication)
        offered = ["1.0"] if accept is None else accept.split(",")
        common = [v for v in SUPPORTED_VERSIONS if v in offered]
        return common[-1] if common else None

    def _credentials(self, headers: dict[str, str]) -> tuple[str | None, str | None]:
        # docs/behaviour.md#authentication: a missing passcode falls back to the default passcode, a missing
        # login to the default user
        if self.forced_credentials is not None:
            return self.forced_credentials
        settings = self.settings
        login = headers.get("login")
        passcode = headers.get("passcode")
        if login is not None:
            return login, passcode if passcode is not None else settings.default_pass
        return settings.default_user, passcode if passcode is not None else settings.default_pass

    def _login(self, version: str, headers: dict[str, str], frame: Frame, send_connected: bool) -> Steps:
        user, password = self._credentials(headers)
        self.requested_user = user
        if user is None:
            self.login_failure = "missing_credentials"
            yield from self._fail("Bad CONNECT", "Missing login or passcode header(s)", frame)
            return
        if user in self.settings.loopback_users and not self.peer_is_loopback:
            # RabbitMQ's loopback_users: the broker sees every connection coming from the
            # adapter's host, so the adapter applies the rule to the STOMP client's address
            self.login_failure = "loopback_only"
            yield from self._fail("Bad CONNECT", "non-loopback access denied", frame)
            return
        vhost = headers.get("host", self.settings.default_vhost)
        self.requested_vhost = vhost
        try:
            client_heart_beat = heartbeat.parse_heart_beat(headers.get("heart-beat"))
        except heartbeat.HeartBeatError as error:
            yield from self._fail("Processing error", str(error), frame)
            return
        result = yield OpenConnection(user, password or "", vhost)
        assert isinstance(result, LoginResult)
        if not result.ok:
            self.login_failure = {"auth": "access_refused", "vhost": "vhost"}.get(
                result.failure or "", "broker_unavailable"
            )
            if result.failure == "auth":
                yield from self._fail("Bad CONNECT", f"Access refused for user '{user}'\n", frame)
            elif result.failure == "vhost":
                yield from self._fail("Bad CONNECT", f"Virtual host '{vhost}' access denied", frame)
            else:
                yield from self._fail("Processing error", result.detail or "Processing error", frame)
            return
        self._rules.broker = result.broker  # the declare flags of this broker's plugin
        client_id = self._rules.client_id(headers)
        if client_id is not None:
            if not self.settings.client_ids.claim(client_id, self):
                yield from self._fail(*client_id_in_use(client_id), frame)
                return
            self.client_id = client_id
        self.state = State.CONNECTED
        self.version = version
        self.user = user
        self.vhost = vhost
        self._ack_header = "id" if version == "1.2" else "message-id"
        send_ms, receive_ms = heartbeat.negotiate(client_heart_beat)
        yield Established(version, send_ms, receive_ms)
        if send_connected:
            connected = []
            if not self.settings.hide_server_info:
                connected.append(("server", result.server_version or "RabbitMQ"))
            connected += [
                ("session", self.session_id),
                ("heart-beat", f"{send_ms},{receive_ms}"),
                ("version", version),
            ]
            # CONNECTED is never escaped (STOMP 1.2 "Value Encoding")
            yield SendFrame(self._encode(Command.CONNECTED, connected, escape_headers=False))

    # ------------------------------------------------------------------ SEND
    def _destination(self, raw: str) -> Destination:
        dest = self._destinations.get(raw)
        if dest is None:
            dest = self._rules.parse_destination(raw)
            _remember(self._destinations, raw, dest)
        return dest

    def _send(self, frame: Frame) -> Steps:
        headers = frame.headers
        raw = headers.get("destination")
        if raw is None:
            raise DestinationError("Missing destination", "\"SEND\" must include a 'destination' header\n")
        if "message-id" in headers:
            raise DestinationError("Invalid header", "'message-id' is not allowed on 'SEND'.\n")
        # activemq profile: a composite destination, "/queue/a,/topic/b", is one publish per
        # element, each planned as a SEND to it alone; the plugin reads the comma as part of a name
        composite = "," in raw and self._rules.composite_destinations
        parts = raw.split(",") if composite else [raw]
        if composite and not all(parts):
            raise DestinationError("Invalid destination", f"'{raw}' has an empty element\n")
        dests = []
        for part in parts:
            dest = self._destination(part)
            # the mapping rule, in the plugin's order: x- arguments checked for every destination
            # kind, then /temp-queue refused, then a /queue declared once per connection
            params = self._rules.send_queue_params(dest, headers, self._declared_queues)
            if params is not None:
                yield from self._declare_queue_once(dest, params)
            dests.append(dest)
        # checked after the destination and its declare, in the plugin's order (docs/behaviour.md#limits)
        transaction = self._transaction_of(headers)
        reply_to = headers.get("reply-to")
        resolved_reply_to = None
        if reply_to is not None:
            resolved_reply_to = yield from self._resolve_reply_to(reply_to)
        targets = [publish_target(dest, self.settings.default_topic_exchange) for dest in dests]
        properties = self._send_properties(headers, resolved_reply_to)
        if not composite:
            _remember(self._send_targets, raw, targets[0])  # quick_send takes it from here on
        receipt = headers.get("receipt")
        if properties is None:
            # activemq profile: expired before it was sent.  ActiveMQ accepts and discards it,
            # so the SEND succeeds (with its RECEIPT) and nothing is published.
            yield from self._receipt(frame)
            return
        publishes = [
            BasicPublish(exchange, key, properties, frame.body, part)
            for (exchange, key), part in zip(targets, parts, strict=True)
        ]
        if transaction is not None:
            last = len(publishes) - 1
            for n, publish in enumerate(publishes):
                self._buffer(transaction, publish, receipt if n == last else None)
            return
        if not composite:
            yield from self._publish(publishes[0], receipt)
            return
        # a composite SEND's receipt waits for the confirms of all its publishes, as a COMMIT's
        # does; a nack of any of them becomes an ERROR
        if receipt is not None and not self._confirming:
            yield ConfirmSelect()
            self._confirming = True
        first_seq = self._publish_seq + 1
        for publish in publishes:
            yield publish
            self._count_publish(None)
        if receipt is not None:
            self._pending_commits.append((receipt, set(range(first_seq, self._publish_seq + 1))))

    def quick_send(self, frame: Frame) -> BasicPublish | None:
        """The common SEND in one plain call, or None: then ``handle_frame`` handles it as usual.

        A SEND whose destination this connection has already published to (so it is parsed,
        valid and declared), outside a transaction, with no ``reply-to`` or one to an existing
        temp queue, and with a ``receipt`` only once confirms are on, needs exactly one publish.
        This path gives the same result as ``handle_frame`` without the generator machinery,
        which costs about a quarter of the adapter's per-SEND time (bench/micro.py).  Anything
        else, errors included, goes the general way, which reports them in the plugin's order.
        """
        if self.state is not State.CONNECTED:
            return None
        headers = frame.headers
        destination = headers.get("destination", "")
        target = self._send_targets.get(destination)
        if target is None or "transaction" in headers or "message-id" in headers:
            return None
        if not _QUEUE_ARGUMENT_HEADERS.isdisjoint(headers):
            return None  # x- arguments are checked on every SEND: the general path does it
        receipt = headers.get("receipt")
        if receipt is not None and not self._confirming:
            return None
        reply_to = headers.get("reply-to")
        if reply_to is not None:
            if not reply_to.startswith("/temp-queue/"):
                return None
            reply_to = self._temp_queues.get(reply_to[12:])
            if reply_to is None:
                return None
        try:
            properties = self._send_properties(headers, reply_to)
        except StompError:
            return None  # the general path sends the ERROR
        if properties is None:
            return None  # not to be published (activemq: already expired): the general path
        self._count_publish(receipt)
        return BasicPublish(target[0], target[1], properties, frame.body, destination)

    def quick_ack(self, frame: Frame) -> BasicAck | None:
        """An ACK outside a transaction and without a receipt, for a message of a current
        subscription, as one plain call; None sends it the general way (see ``quick_send``)."""
        headers = frame.headers
        if self.state is not State.CONNECTED or "transaction" in headers or "receipt" in headers:
            return None
        value = headers.get(self._ack_header)
        if value is None:
            return None
        parts = value.split("@@")
        if len(parts) != 3:
            return None
        try:
            delivery_tag = decimal_integer(parts[2], signed=False)
        except TooManyDigits:
            return None  # the general path answers ERROR
        subscription = self._subscriptions.get(parts[0])
        if delivery_tag is None or subscription is None or delivery_tag >= 2**64:
            return None
        # 'client' acks are cumulative: AMQP multiple=true (docs/behaviour.md#receipts)
        multiple = subscription.ack_mode == "client"
        if self._unsettled is not None:
            self._forget(delivery_tag, multiple)
        return BasicAck(delivery_tag, multiple)

    def _publish(self, publish: BasicPublish, receipt: str | None) -> Steps:
        if receipt is not None and not self._confirming:
            yield ConfirmSelect()
            self._confirming = True
        yield publish
        self._count_publish(receipt)

    def _count_publish(self, receipt: str | None) -> None:
        """After a publish: once confirms are on, the broker numbers publishes 1, 2, ...; a
        receipt waits for the confirm of its number."""
        if self._confirming:
            self._publish_seq += 1
            if receipt is not None:
                self._pending_receipts[self._publish_seq] = receipt

    def _declare_queue_once(self, dest: Destination, params: QueueParams) -> Steps:
        # /queue declares are nowait and happen once per connection, whatever later frames
        # say (docs/destinations.md#common-steps)
        yield QueueDeclare(
            dest.name,
            durable=params.durable,
            exclusive=params.exclusive,
            auto_delete=params.auto_delete,
            arguments=dict(params.arguments),
            nowait=True,
        )
        self._declared_queues.add(dest.name)

    def _resolve_reply_to(self, reply_to: str) -> Generator[Operation, object, str | None]:
        """docs/destinations.md#temporary-queues: a /temp-queue/<name> becomes a private server-named
        queue."""
        if reply_to.startswith("/temp-queue/"):
            # the mapping rule refuses what is not one temp-queue name ("/temp-queue/", "a/b")
            name = reply_to_temp_queue(reply_to)
            assert name is not None
            return (yield from self._reply_queue(self._temp_queues, name, reply_to))
        temp_topic = self._rules.temp_topic_reply_to(reply_to)  # activemq profile only
        if temp_topic is not None:
            return (yield from self._reply_queue(self._temp_topics, temp_topic.name, reply_to))
        if not reply_to:
            return None  # an empty reply-to is passed on as it is, like the plugin does
        try:
            parse_destination(reply_to)
        except DestinationError:
            raise ProcessingError(f"reply-to {reply_to!r} is not a valid destination") from None
        return None

    def _reply_queue(
        self, temporaries: dict[str, str], name: str, reply_to: str
    ) -> Generator[Operation, object, str]:
        """The private queue of a temporary destination named in a ``reply-to``: declared and
        consumed (auto-ack, by an implicit subscription) the first time it is named."""
        queue = temporaries.get(name)
        if queue is None:
            declared = yield QueueDeclare("", exclusive=True, auto_delete=True)
            assert isinstance(declared, str)
            queue = declared
            tag = "T_" + reply_to
            self._subscriptions[tag] = Subscription(tag, reply_to, reply_to, None, "auto")
            yield BasicConsume(queue, tag, no_ack=True)
            temporaries[name] = queue
        return queue

    # ------------------------------------------------------------------ SUBSCRIBE / UNSUBSCRIBE
    def _subscribe(self, frame: Frame) -> Steps:
        headers = frame.headers
        raw = headers.get("destination")
        if raw is None:
            raise DestinationError(
                "Missing destination", "\"SUBSCRIBE\" must include a 'destination' header\n"
            )
        durable = is_durable(headers)
        if durable:
            require_id_for_durable(headers)
        rules = self._rules
        prefetch_count = rules.prefetch(headers)
        ack_mode = headers.get("ack", "auto")
        if ack_mode not in ACK_MODES:
            raise ProcessingError(f"ack must be one of auto, client, client-individual, got {ack_mode!r}")
        dest = self._destination(raw)
        rules.check_subscribe_destination(dest)
        selector = rules.selector(dest, headers)
        tag = consumer_tag(headers, raw)
        if tag in self._subscriptions:
            # checked before anything is declared, so no queue leaks (the plugin declares first)
            yield from self._fail(
                "Duplicated subscription identifier",
                f"A subscription identified by '{tag}' already exists.",
                frame,
                also_receipt=True,
            )
            return
        sub_id = headers.get("id")
        if dest.kind is DestinationKind.TEMP_QUEUE or dest.kind is DestinationKind.TEMP_TOPIC:
            # activemq profile only (the plugin's rules refused it above)
            yield from self._subscribe_temp_queue(frame, dest, tag, prefetch_count, ack_mode)
            return
        target = rules.subscribe_target(
            dest, headers, sub_id, self.settings.default_topic_exchange, self.client_id
        )
        queue = target.queue
        assert queue is not None
        if target.declare is not None:
            if dest.kind is DestinationKind.QUEUE:
                if dest.name not in self._declared_queues:
                    yield from self._declare_queue_once(dest, target.declare)
            else:
                params = target.declare
                declared = yield QueueDeclare(
                    queue,
                    durable=params.durable,
                    exclusive=params.exclusive,
                    auto_delete=params.auto_delete,
                    arguments=dict(params.arguments),
                )
                if not queue and isinstance(declared, str):
                    queue = declared  # an empty x-queue-name lets the broker name the queue
                self._unfinished_subscription_queue = queue
        if dest.kind in (DestinationKind.QUEUE, DestinationKind.AMQ_QUEUE) and (
            selector is not None
            or (
                rules.plain_joins_dispatcher(headers)
                and self.settings.dispatchers.has(self.vhost or "", queue)
            )
        ):
            # activemq profile: a selector on a shared queue (competing consumers), or a plain
            # subscription on a queue whose selector subscriptions may hold messages for it
            yield from self._subscribe_dispatched(frame, queue, tag, dest, ack_mode, selector, prefetch_count)
            return
        if prefetch_count is not None:
            yield BasicQos(prefetch_count)
        arguments: dict[str, object] = {}
        offset = stream_offset_argument(headers.get("x-stream-offset"))
        if offset is not None:
            arguments["x-stream-offset"] = offset
        # registered before the consume is sent: the broker may deliver right after consume-ok
        self._subscriptions[tag] = Subscription(tag, sub_id, raw, dest, ack_mode, selector)
        if ack_mode != "auto":
            self.plain_acks = True
        yield BasicConsume(
            queue,
            tag,
            no_ack=ack_mode == "auto",
            arguments=arguments,
            exclusive=rules.exclusive_consumer(headers),
        )
        if target.bind_exchange is not None:
            yield QueueBind(queue, target.bind_exchange, target.bind_key)
        self._unfinished_subscription_queue = None
        yield from self._receipt(frame)

    def _subscribe_dispatched(
        self,
        frame: Frame,
        queue: str,
        tag: str,
        dest: Destination,
        ack_mode: AckMode,
        selector: Selector | None,
        credit: int | None,
    ) -> Steps:
        """activemq profile: a selector subscription on a queue (competing consumers), or one
        without a selector on a queue that has a dispatcher (it matches everything).  It joins
        the process's dispatcher of the queue before it consumes and is activated once the
        broker accepted the consume, after its RECEIPT: until then nothing is delivered to it, so
        a refused consume takes no held message with it.  It always consumes with acks
        (``auto`` is acked by the adapter as each message is sent, so a message no selector
        matches can be held), with a prefetch that leaves room for those held messages; the
        STOMP prefetch is enforced by the dispatcher (adapter/mapping/dispatch.py)."""
        headers = frame.headers
        auto_ack = ack_mode == "auto"
        yield BasicQos(dispatch.window(credit, auto_ack))
        self._subscriptions[tag] = Subscription(
            tag, headers.get("id"), dest.raw, dest, ack_mode, dispatched=True
        )
        self.quick_ack = self._quick_ack_undispatched  # type: ignore[method-assign]

        matches = _match_all if selector is None else _selector_matcher(selector)
        yield JoinDispatch(queue, tag, matches, auto_ack, None if auto_ack else credit)
        yield BasicConsume(queue, tag, no_ack=False, exclusive=self._rules.exclusive_consumer(headers))
        yield from self._receipt(frame)
        yield ActivateDispatch(tag)

    def _quick_ack_undispatched(self, frame: Frame) -> BasicAck | None:
        """``quick_ack`` once the session has a dispatched subscription: their ACKs take the
        general way (they are settled on the channel each message came from)."""
        value = frame.headers.get(self._ack_header)
        if value is not None:
            subscription = self._subscriptions.get(value.split("@@", 1)[0])
            if subscription is not None and subscription.dispatched:
                return None
        return Session.quick_ack(self, frame)

    def _subscribe_temp_queue(
        self, frame: Frame, dest: Destination, tag: str, prefetch_count: int | None, ack_mode: AckMode
    ) -> Steps:
        """activemq profile: SUBSCRIBE to ``/temp-queue/NAME`` (or ``/temp-topic/NAME``) consumes
        the connection's private queue of that name, the one a ``reply-to`` with the same
        destination names (created by whichever comes first).  Its implicit reply consumer, if
        any, gives way to this subscription, so replies are not shared between two consumers."""
        temporaries = self._temp_topics if dest.kind is DestinationKind.TEMP_TOPIC else self._temp_queues
        queue = temporaries.get(dest.name)
        if queue is None:
            declared = yield QueueDeclare("", exclusive=True, auto_delete=True)
            assert isinstance(declared, str)
            queue = declared
            temporaries[dest.name] = queue
        else:
            implicit = "T_" + dest.raw
            if implicit in self._subscriptions and implicit != tag:
                yield BasicCancel(implicit)
                self._subscriptions.pop(implicit, None)
        if prefetch_count is not None:
            yield BasicQos(prefetch_count)
        self._subscriptions[tag] = Subscription(tag, frame.headers.get("id"), dest.raw, dest, ack_mode)
        if ack_mode != "auto":
            self.plain_acks = True
        yield BasicConsume(queue, tag, no_ack=ack_mode == "auto")
        yield from self._receipt(frame)

    def _unsubscribe(self, frame: Frame) -> Steps:
        headers = frame.headers
        sub_id = headers.get("id")
        raw = headers.get("destination")
        rules = self._rules
        if sub_id is None and raw is None and rules.names_durable_subscription(headers):
            # activemq profile: UNSUBSCRIBE naming only the durable subscription removes it
            queue = rules.unsubscribe_queue(None, headers, None, self.client_id)
            assert queue is not None
            yield QueueDelete(queue)
            yield from self._receipt(frame)
            return
        if sub_id is None and raw is None:
            raise DestinationError(
                "Missing destination or id", "UNSUBSCRIBE must include a 'destination' or 'id' header"
            )
        durable = is_durable(headers)
        if durable:
            require_id_for_durable(headers)
        if sub_id is not None:
            if sub_id.startswith("/temp-queue/"):
                raise DestinationError("Invalid id", "UNSUBSCRIBE 'id' may not start with /temp-queue/\n")
            tag, description = "T_" + sub_id, f"id='{sub_id}'"
        else:
            assert raw is not None
            tag, description = "Q_" + raw, f"destination='{raw}'"
        subscription = self._subscriptions.get(tag)
        if subscription is None:
            if not rules.names_durable_subscription(headers):
                raise DestinationError(
                    "No subscription found",
                    "UNSUBSCRIBE must refer to an existing subscription.\n"
                    f'Subscription to "{description}" not found.\n',
                )
            # activemq profile: ActiveMQ's sequence, "UNSUBSCRIBE id" then UNSUBSCRIBE with the
            # subscription name (and the same id) to remove the durable subscription
        else:
            if subscription.dispatched:
                # leave first: nothing more is routed to it while its cancel is on the way, and
                # what still arrives on its channel goes back to the queue
                self._forget_dispatched(tag)
                yield LeaveDispatch(tag)
            else:
                self._forget_consumer(tag)
            yield BasicCancel(tag)
            self._subscriptions.pop(tag, None)
        subscribed = subscription.parsed if subscription is not None else None
        queue = rules.unsubscribe_queue(subscribed, headers, sub_id, self.client_id)
        if queue is not None:
            yield QueueDelete(queue)
        yield from self._receipt(frame)

    # ------------------------------------------------------------------ ACK / NACK
    def _ack(self, frame: Frame) -> Steps:
        yield from self._settle(frame, nack=False)

    def _nack(self, frame: Frame) -> Steps:
        yield from self._settle(frame, nack=True)

    def _settle(self, frame: Frame, nack: bool) -> Steps:
        headers = frame.headers
        command = frame.command
        header = self._ack_header
        value = headers.get(header)
        if value is None:
            raise DestinationError("Missing header", f'"{command}" must include the "{header}" header\n')
        parts = value.split("@@")
        if len(parts) != 3:
            raise DestinationError("Invalid header", f'"{command}" must include a valid "{header}" header\n')
        subscription = self._subscriptions.get(parts[0])
        if subscription is None:
            raise DestinationError("Subscription not found", f'Message with id "{value}" has no subscription')
        delivery_tag = plugin_integer(parts[2])
        if delivery_tag is None:
            raise ProcessingError(f"Bad delivery tag in {header} {value!r}")
        if not 0 <= delivery_tag < 2**64:
            raise ProcessingError(f"Delivery tag out of range in {header} {value!r}")
        transaction = self._transaction_of(headers)
        # 'client' acks are cumulative: AMQP multiple=true (docs/behaviour.md#receipts)
        multiple = subscription.ack_mode == "client"
        if subscription.dispatched:
            yield from self._settle_dispatched(frame, subscription, delivery_tag, multiple, nack, transaction)
            return
        op: Operation
        if nack and transaction is None and self._unsettled is not None:
            settled = self._take_unsettled(delivery_tag, multiple)
            if settled is not None:
                yield from self._dead_letter(settled, BasicAck(delivery_tag, multiple))
                yield from self._receipt(frame)
                return
        if not nack and transaction is None and self._unsettled is not None:
            self._forget(delivery_tag, multiple)
        if nack:
            requeue_header = headers.get("requeue")
            if requeue_header in ("true", "True"):
                requeue = True
            elif requeue_header in ("false", "False"):
                requeue = False
            else:
                requeue = self.settings.default_nack_requeue
            op = BasicNack(delivery_tag, multiple, requeue)
        else:
            op = BasicAck(delivery_tag, multiple)
        if transaction is not None:
            self._buffer(transaction, op, None)
        else:
            yield op
        yield from self._receipt(frame)

    def _settle_dispatched(
        self,
        frame: Frame,
        subscription: Subscription,
        number: int,
        multiple: bool,
        nack: bool,
        transaction: str | None,
    ) -> Steps:
        """ACK / NACK of a dispatched subscription's message: the dispatcher settles it on the
        channel it came from.  A NACK outside a transaction moves it to the dead-letter queue,
        as for any other queue subscription of this profile."""
        tag = subscription.consumer_tag
        if multiple:
            keys = sorted(key for key in self._dispatched if key[0] == tag and key[1] <= number)
        else:
            keys = [(tag, number)]
        if (
            nack
            and transaction is None
            and keys
            and keys[-1] == (tag, number)
            and all(key in self._dispatched for key in keys)
        ):
            deliveries = [self._dispatched.pop(key) for key in keys]
            yield from self._dead_letter(deliveries, DispatchSettle(tag, number, multiple, ack=True))
            yield from self._receipt(frame)
            return
        requeue = True
        if nack:
            requeue_header = frame.headers.get("requeue")
            if requeue_header is None:
                requeue = self.settings.default_nack_requeue
            else:
                requeue = requeue_header in ("true", "True")
        op = DispatchSettle(tag, number, multiple, ack=not nack, requeue=requeue)
        if transaction is not None:
            self._buffer(transaction, op, None)  # forgotten at COMMIT, kept at ABORT
        else:
            for key in keys:
                self._dispatched.pop(key, None)
            yield op
        yield from self._receipt(frame)

    def _forget_dispatched(self, consumer_tag: str, number: int | None = None, multiple: bool = True) -> None:
        """Dispatched messages of ``consumer_tag`` are settled (a committed ACK or NACK: message
        ``number``, with ``multiple`` every earlier one too; None: all, the subscription ended),
        so a later NACK must not copy them to the dead-letter queue."""
        if not multiple:
            self._dispatched.pop((consumer_tag, number or 0), None)
            return
        for key in [
            key for key in self._dispatched if key[0] == consumer_tag and (number is None or key[1] <= number)
        ]:
            del self._dispatched[key]

    def render_dispatched(self, delivery: Delivery) -> bytes:
        """A message the dispatcher gives one of this session's dispatched subscriptions
        (its consumer tag and message number in place of the AMQP ones)."""
        data = Session.on_delivery(self, delivery)
        subscription = self._subscriptions.get(delivery.consumer_tag)
        if data and subscription is not None and subscription.ack_mode != "auto":
            self._keep(self._dispatched, (delivery.consumer_tag, delivery.delivery_tag), delivery)
        return data

    # ------------------------------------------------------------------ NACK to a dead-letter queue
    def _on_delivery_kept(self, delivery: Delivery) -> bytes:
        """``on_delivery`` when NACKs go to a dead-letter queue: a delivery of a client-ack
        subscription is kept until it is acknowledged (at most the prefetch of each).
        A delivery of a dispatched subscription renders nothing here: the shell hands it to
        the dispatcher (``dropped_delivery_ack``)."""
        subscription = self._subscriptions.get(delivery.consumer_tag)
        if subscription is not None and subscription.dispatched:
            return b""
        data = Session.on_delivery(self, delivery)
        if (
            data
            and subscription is not None
            and subscription.ack_mode != "auto"
            and self._unsettled is not None
        ):
            self._keep(self._unsettled, delivery.delivery_tag, delivery)
        return data

    def _keep(self, kept: MutableMapping[Any, Delivery], key: object, delivery: Delivery) -> None:
        """Keep a delivery for NACK; over the byte budget (``BudgetExceeded``) it is not sent:
        the shell closes the connection and the broker requeues it."""
        try:
            kept[key] = delivery
        except BudgetExceeded:
            self.messages_sent -= 1  # rendered, never sent
            raise

    def _forget(self, delivery_tag: int, multiple: bool) -> None:
        unsettled = self._unsettled
        if not unsettled:
            return
        if multiple:
            for tag in [tag for tag in unsettled if tag <= delivery_tag]:
                del unsettled[tag]
        else:
            unsettled.pop(delivery_tag, None)

    def _forget_consumer(self, consumer_tag: str) -> None:
        """The subscription ended: its deliveries can no longer be ACKed or NACKed (they stay
        unacknowledged on the channel until it closes), so their bodies need not be kept."""
        unsettled = self._unsettled
        if unsettled:
            for tag in [tag for tag, kept in unsettled.items() if kept.consumer_tag == consumer_tag]:
                del unsettled[tag]

    def _take_unsettled(self, delivery_tag: int, multiple: bool) -> list[Delivery] | None:
        """The deliveries a NACK settles, or None if any is not known (then the NACK goes to
        the broker as a basic.nack, as in the default profile)."""
        unsettled = self._unsettled
        assert unsettled is not None
        tags = sorted(tag for tag in unsettled if tag <= delivery_tag) if multiple else [delivery_tag]
        if not tags or tags[-1] != delivery_tag or any(tag not in unsettled for tag in tags):
            return None
        return [unsettled.pop(tag) for tag in tags]

    def _dead_letter(self, deliveries: list[Delivery], settle: BasicAck | DispatchSettle) -> Steps:
        """ActiveMQ's NACK: a persistent message moves to the dead-letter queue with
        ``original-destination``; a non-persistent one is dropped.  The copy is published with
        confirms and the original acknowledged only once the broker has confirmed the copy; if
        it refuses it, or the confirm does not come, the connection closes with an ERROR and
        the unacknowledged original goes back to its queue: a NACKed message is never lost."""
        queue = self._dead_letter_queue
        assert queue is not None
        persistent = [d for d in deliveries if d.properties.delivery_mode == 2]
        if persistent:
            if not self._dead_letter_declared:
                yield QueueDeclare(queue, durable=True)
                self._dead_letter_declared = True
            if not self._confirming:
                yield ConfirmSelect()
                self._confirming = True
            for delivery in persistent:
                yield BasicPublish("", queue, dead_letter_copy(delivery), delivery.body)
                self._count_publish(None)
                self._dead_letter_seqs.add(self._publish_seq)
            confirmed = yield AwaitConfirms()
            if confirmed is False or self._dead_letter_refused:
                raise StompError(
                    "Message rejected by the broker",
                    f"The broker did not confirm the copy of the NACKed message on {queue!r}; "
                    "the message stays on its queue\n",
                )
        yield settle

    def _settle_dead_letters(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        seqs = self._dead_letter_seqs
        hit = {seq for seq in seqs if seq <= delivery_tag} if multiple else seqs & {delivery_tag}
        if hit:
            seqs -= hit
            if not ack:
                self._dead_letter_refused = True

    # ------------------------------------------------------------------ transactions
    def _transaction_of(self, headers: dict[str, str]) -> str | None:
        name = headers.get("transaction")
        if name is not None and name not in self._transactions:
            raise DestinationError("Bad transaction", f'Invalid transaction identifier: "{name}"\n')
        return name

    def _transaction_name(self, frame: Frame) -> str:
        name = frame.headers.get("transaction")
        if name is None:
            raise DestinationError(
                "Missing transaction", f"\"{frame.command}\" must include a 'transaction' header\n"
            )
        return name

    def _buffer(self, transaction: str, op: Operation, receipt: str | None) -> None:
        actions = self._transactions[transaction]
        if len(actions) >= MAX_TRANSACTION_ACTIONS:
            raise DestinationError(
                "Transaction too large",
                f'Transaction "{transaction}" already holds {MAX_TRANSACTION_ACTIONS} actions\n',
            )
        if isinstance(op, BasicPublish):
            self._transaction_bytes.reserve(len(op.body))
        actions.append((op, receipt))

    def _end_transaction(self, name: str) -> list[tuple[Operation, str | None]]:
        """The actions of transaction ``name`` (COMMIT, ABORT), its bytes given back."""
        actions = self._transactions.pop(name, None)
        if actions is None:
            raise DestinationError("Bad transaction", f'Invalid transaction identifier: "{name}"\n')
        self._transaction_bytes.release(
            sum(len(op.body) for op, _ in actions if isinstance(op, BasicPublish))
        )
        return actions

    def _begin(self, frame: Frame) -> Steps:
        name = self._transaction_name(frame)
        if name in self._transactions:
            # the plugin silently resets the open transaction (docs/behaviour.md#limits); we refuse
            raise DestinationError("Bad transaction", f'Transaction "{name}" is already open\n')
        if len(self._transactions) >= MAX_TRANSACTIONS:
            raise DestinationError(
                "Transaction limit exceeded", f"At most {MAX_TRANSACTIONS} transactions may be open\n"
            )
        self._transactions[name] = []
        yield from self._receipt(frame)

    def _commit(self, frame: Frame) -> Steps:
        actions = self._end_transaction(self._transaction_name(frame))
        receipt = frame.headers.get("receipt")
        # A COMMIT's RECEIPT means what a SEND's does: the broker has every message of the
        # transaction.  So with a receipt, confirms go on before its first publish, and the
        # RECEIPT waits for the confirms of all of them (the plugin, inside the broker, sends it
        # at once: docs/compatibility.md).
        publishes = receipt is not None and any(isinstance(op, BasicPublish) for op, _ in actions)
        if publishes and not self._confirming:
            yield ConfirmSelect()
            self._confirming = True
        first_seq = self._publish_seq + 1
        for op, op_receipt in actions:
            if isinstance(op, BasicPublish):
                yield from self._publish(op, op_receipt)
            else:
                if isinstance(op, DispatchSettle):
                    self._forget_dispatched(op.consumer_tag, op.number, op.multiple)
                yield op
        if publishes:
            assert receipt is not None
            self._pending_commits.append((receipt, set(range(first_seq, self._publish_seq + 1))))
        else:
            yield from self._receipt(frame)

    def _abort(self, frame: Frame) -> Steps:
        self._end_transaction(self._transaction_name(frame))
        yield from self._receipt(frame)

    # ------------------------------------------------------------------ DISCONNECT
    def _disconnect(self, frame: Frame) -> Steps:
        # Unlike the plugin, which drops SEND receipts still waiting for their confirm
        # (docs/behaviour.md#receipts), we wait for the confirms so that every receipt asked for is sent.
        if self.confirms_outstanding:
            yield AwaitConfirms()
        self._transactions.clear()
        self._transaction_bytes.release(self._transaction_bytes.held)
        yield CloseAmqp()
        yield from self._receipt(frame)
        self.state = State.CLOSED
        yield CloseClient("client sent DISCONNECT")

    def _bad_command(self, frame: Frame) -> Steps:
        yield from self._fail("Bad command", f'Could not interpret command "{frame.command}"\n', frame)

    # keyed by str: frame.command is any text the client sent (Command is a StrEnum)
    _HANDLERS: dict[str, Callable[[Session, Frame], Steps]] = {
        Command.SEND: _send,
        Command.SUBSCRIBE: _subscribe,
        Command.UNSUBSCRIBE: _unsubscribe,
        Command.ACK: _ack,
        Command.NACK: _nack,
        Command.BEGIN: _begin,
        Command.COMMIT: _commit,
        Command.ABORT: _abort,
        Command.DISCONNECT: _disconnect,
    }

    # ------------------------------------------------------------------ broker events
    def on_delivery(self, delivery: Delivery) -> bytes:
        """Render one AMQP delivery as a MESSAGE frame (docs/destinations.md#amqp--message)."""
        consumer_tag, delivery_tag, redelivered, exchange, routing_key, properties, body = delivery
        subscription = self._subscriptions.get(consumer_tag)
        if subscription is None:
            return self._error_frame(
                "Subscription not found",
                f"There is no current subscription with tag '{consumer_tag}'.",
            )
        if subscription.selector is not None and not subscription.selector.matches(
            selector_lookup(properties)
        ):
            return b""  # never meant for this subscriber: the shell settles it (dropped_delivery_ack)
        destination = self._message_destinations.get((exchange, routing_key))
        if destination is None:
            destination = escape(message_destination(exchange, routing_key))
            _remember(self._message_destinations, (exchange, routing_key), destination)
        head = subscription.message_head
        if not head:
            head = "MESSAGE\n"
            if subscription.id is not None:
                head += f"subscription:{escape(subscription.id)}\n"
            subscription.message_head = head
            # digits never need escaping, so the prefix can be escaped once
            subscription.message_id_prefix = escape(f"{consumer_tag}@@{self.session_id}@@")
        message_id = subscription.message_id_prefix + str(delivery_tag)
        self.messages_sent += 1
        lines = [
            head,
            "destination:",
            destination,
            "\nmessage-id:",
            message_id,
            "\nredelivered:true\n" if redelivered else "\nredelivered:false\n",
        ]
        if self.version == "1.2" and subscription.ack_mode != "auto":
            lines.append(f"ack:{message_id}\n")
        # the headers the message carries, from the one function that knows their order
        pairs = message_headers(properties)
        if pairs:
            escaped_name, append = _ESCAPED_NAMES.get, lines.append
            for name, value in pairs:
                append(f"{escaped_name(name) or _escape_name(name)}:{escape(value)}\n")
        if body:
            lines.append(f"content-length:{len(body)}\n")
        lines.append("\n")
        return b"".join(
            (
                "".join(lines).encode("utf-8", "surrogateescape"),
                body,
                b"\0\n" if self.settings.trailing_lf else b"\0",
            )
        )

    def subscription_destination(self, consumer_tag: str) -> str | None:
        """The destination header of the SUBSCRIBE behind a consumer (per-destination metrics)."""
        subscription = self._subscriptions.get(consumer_tag)
        return subscription.destination if subscription is not None else None

    def dropped_delivery_ack(self, delivery: Delivery) -> BasicAck | DispatchDelivery | None:
        """What to do with a delivery ``on_delivery`` rendered no bytes for: its subscription's
        selector does not match it, so it leaves that subscription's own queue (acked; None for
        auto-ack subscriptions, whose deliveries the broker has already forgotten); or its
        subscription is dispatched (a selector on a queue), and the dispatcher decides."""
        subscription = self._subscriptions.get(delivery.consumer_tag)
        if subscription is None:
            return None
        if subscription.dispatched:
            return DispatchDelivery(delivery)
        if subscription.ack_mode == "auto":
            return None
        return BasicAck(delivery.delivery_tag, False)

    def on_confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> bytes:
        """The broker confirmed (ack) or refused (nack) publishes up to ``delivery_tag``."""
        pending = self._pending_receipts
        receipts: list[str] = []
        if pending:
            if multiple:
                settled = []
                for seq in pending:
                    if seq > delivery_tag:
                        break
                    settled.append(seq)
                receipts = [pending.pop(seq) for seq in settled]
            else:
                receipt = pending.pop(delivery_tag, None)
                if receipt is not None:
                    receipts.append(receipt)
        if self._pending_commits:
            receipts += self._settle_commits(delivery_tag, multiple, ack)
        if self._dead_letter_seqs:
            self._settle_dead_letters(delivery_tag, multiple, ack)
        if not receipts:
            return b""
        if ack:
            on_receipt = self.on_receipt
            if on_receipt is not None:
                for receipt in receipts:
                    on_receipt(receipt)
            return b"".join(self._encode(Command.RECEIPT, [("receipt-id", r)]) for r in receipts)
        # a broker nack means the message may not be stored: never turn it into a RECEIPT
        return b"".join(
            self._error_frame(
                "Message rejected by the broker",
                "The broker refused (basic.nack) the message sent with this receipt; "
                "it may not have been stored.\n",
                receipt=r,
            )
            for r in receipts
        )

    def _settle_commits(self, delivery_tag: int, multiple: bool, ack: bool) -> list[str]:
        """The COMMIT receipts this confirm completes; on a nack, those it touches (they
        become ERRORs, never RECEIPTs)."""
        done: list[str] = []
        waiting: list[tuple[str, set[int]]] = []
        for receipt, seqs in self._pending_commits:
            if multiple:
                hit = {seq for seq in seqs if seq <= delivery_tag}
                seqs -= hit
            else:
                hit = {delivery_tag} & seqs
                seqs.discard(delivery_tag)
            if (hit and not ack) or not seqs:
                done.append(receipt)
            else:
                waiting.append((receipt, seqs))
        self._pending_commits = waiting
        return done

    @property
    def publish_seq(self) -> int:
        """The confirm sequence number of the last publish (0: confirms are off)."""
        return self._publish_seq

    @property
    def confirms_outstanding(self) -> bool:
        return bool(self._pending_receipts or self._pending_commits or self._dead_letter_seqs)

    def is_dispatched(self, consumer_tag: str) -> bool:
        """Whether ``consumer_tag`` is a subscription of a queue dispatcher (activemq profile)."""
        subscription = self._subscriptions.get(consumer_tag)
        return subscription is not None and subscription.dispatched

    def on_server_cancel(self, consumer_tag: str) -> bytes:
        """The broker cancelled a consumer (e.g. its queue was deleted): docs/behaviour.md#error-handling."""
        subscription = self._subscriptions.pop(consumer_tag, None)
        if subscription is None:
            return b""
        if subscription.dispatched:  # the shell takes it out of its dispatcher (is_dispatched)
            self._forget_dispatched(consumer_tag)
        else:
            self._forget_consumer(consumer_tag)
        if subscription.id is not None:
            header, description = subscription.id, f"id='{subscription.id}'"
        else:
            header, description = subscription.destination, f"destination='{subscription.destination}'"
        return self._error_frame(
            "Server cancelled subscription",
            "The server has canceled a subscription.\n"
            f'No more messages will be delivered for "{description}".\n',
            extra=[("subscription", header)],
        )

    def on_broker_error(self, name: str, text: str, frame: Frame | None) -> list[Operation]:
        """The broker closed the channel or connection (docs/behaviour.md#error-handling).

        ``frame`` is the client frame whose synchronous AMQP call was waiting, if any: the plugin
        then sends ERROR, the frame's RECEIPT, and closes; we do the same.  Except for SEND: its
        RECEIPT only ever means "confirmed by the broker", so a SEND whose declare, temp-queue
        or confirm.select failed gets none (the plugin's do_receipt ignores SEND too,
        docs/behaviour.md#error-handling).
        """
        also_receipt = frame is not None and frame.command != Command.SEND
        operations: list[Operation] = []
        queue, self._unfinished_subscription_queue = self._unfinished_subscription_queue, None
        if queue and frame is not None and frame.command == Command.SUBSCRIBE:
            operations.append(DeleteQueueOnClose(queue))
        operations += self._fail(name, text, frame, also_receipt=also_receipt)
        return operations

    def close_with_error(self, message: str, detail: str, frame: Frame | None = None) -> list[Operation]:
        """An error found by the shell (timeouts, values AMQP cannot carry): ERROR, then close."""
        return list(self._fail(message, detail, frame))

    def on_connection_lost(self, reason: str) -> list[Operation]:
        """The AMQP connection died without a close from the broker (network, broker crash)."""
        return list(self._fail("AMQP connection died", f"Reason: {reason}", None))

    def on_closed(self) -> None:
        """The connection is gone (whatever closed it): give back its client id, its
        stomp.max_connections slot and the bytes it held (its transactions, its kept deliveries,
        which the broker requeues)."""
        if self.client_id is not None:
            self.settings.client_ids.release(self.client_id, self)
        cap = self.settings.connection_cap
        if cap is not None:
            cap.release(self)
        self._transaction_bytes.close()
        self._kept_bytes.close()

    def shutdown_notice(self) -> bytes:
        return self._error_frame("Server shutdown", "The server is shutting down\n")

    # ------------------------------------------------------------------ frame building
    def _encode(
        self, command: str, headers: Iterable[tuple[str, str]], body: bytes = b"", escape_headers: bool = True
    ) -> bytes:
        sent = self.frames_sent
        sent[command] = sent.get(command, 0) + 1
        return encode_frame(
            command, headers, body, trailing_lf=self.settings.trailing_lf, escape_headers=escape_headers
        )

    def _error_frame(
        self,
        message: str,
        detail: str,
        *,
        receipt: str | None = None,
        extra: Iterable[tuple[str, str]] = (),
    ) -> bytes:
        # header order of the plugin (docs/behaviour.md#error-catalogue), plus receipt-id as STOMP 1.2 asks
        headers = [
            ("message", message),
            ("content-type", "text/plain"),
            ("version", ",".join(SUPPORTED_VERSIONS)),
            *extra,
        ]
        if receipt is not None:
            headers.append(("receipt-id", receipt))
        errors = self.errors_sent
        errors[message] = errors.get(message, 0) + 1
        return self._encode(Command.ERROR, headers, detail.encode("utf-8", "surrogateescape"))

    def _receipt(self, frame: Frame) -> Steps:
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            yield SendFrame(self._receipt_frame(receipt))

    def _receipt_frame(self, receipt: str) -> bytes:
        if self.on_receipt is not None:
            self.on_receipt(receipt)
        return self._encode(Command.RECEIPT, [("receipt-id", receipt)])

    def _fail(self, message: str, detail: str, frame: Frame | None, *, also_receipt: bool = False) -> Steps:
        """ERROR (with receipt-id if the frame asked for a receipt), then close the connection.

        ``also_receipt`` additionally sends the RECEIPT frame the plugin sends after ERROR when a
        synchronous AMQP call failed (docs/behaviour.md#receipts), so plugin clients see what they expect.
        """
        if self.state is State.CLOSED:
            return
        receipt = None
        if frame is not None and frame.command not in (Command.CONNECT, Command.STOMP):
            receipt = frame.headers.get("receipt")
        yield SendFrame(self._error_frame(message, detail, receipt=receipt))
        if also_receipt and receipt is not None:
            yield SendFrame(self._receipt_frame(receipt))
        self.state = State.CLOSED
        yield CloseClient(message)


# Header names escaped for MESSAGE frames: the property names (which need no escaping) and the
# headers-table names seen so far, which repeat from message to message.  Bounded: past the
# limit a new name is escaped each time.
_ESCAPED_NAMES: dict[str, str] = {name: name for name in PROPERTY_HEADERS}
_ESCAPED_NAMES_LIMIT = 4096


def _escape_name(name: str) -> str:
    escaped = escape(name)
    if len(_ESCAPED_NAMES) < _ESCAPED_NAMES_LIMIT:
        _ESCAPED_NAMES[name] = escaped
    return escaped
