"""The per-connection STOMP session: a small router over named parts.

Pure (sans-IO): imports neither asyncio, aio-pika, pamqp nor pydantic.  The shell
(``adapter/server/connection.py``) owns the sockets and the AMQP connection.

Each client frame is handled by a generator that yields operations (``adapter.mapping.operations``)
in the order they must happen; the shell executes them strictly in that order and sends each
synchronous operation's result back into the generator.  That order is what gives STOMP its
semantics over AMQP (see docs/architecture.md): a SEND's RECEIPT is released by the publisher
confirm that covers its sequence number, a transaction is a buffer replayed at COMMIT, and a
SUBSCRIBE's RECEIPT follows its consume and bind.

The session keeps the state machine (``state``), the frame handlers and the destinations it
has seen; the rest belongs to its parts:

* ``Login`` (login.py): admission, version, credentials, broker login -> an ``Identity``;
* subscriptions (subscriptions.py): ``Subscription`` and the one ack-id parser;
* ``Transactions`` (transactions.py), ``Confirms`` (confirms.py);
* ``Frames`` (frames.py): MESSAGE rendering (``on_delivery``), RECEIPT, ERROR, their counts;
* the profile's extension (extension.py; activemq.py), called at fixed hooks.

Broker events (deliveries, confirms, server-side cancels, channel errors) come in through the
``on_*`` methods, which return the bytes or operations to send.

Errors: every ERROR this module produces for a client frame is followed by closing the connection,
as STOMP 1.2 requires ("the server MUST ... close the connection").  The plugin leaves the
connection open after most of them; docs/compatibility.md lists that difference.  The one
exception is a server-initiated subscription cancel, which is not the client's error and leaves
the connection open, as in the plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

from ..errors import StompError
from ..mapping.destinations import (
    QUEUE_ARGUMENTS,
    Destination,
    DestinationError,
    DestinationKind,
    ProcessingError,
    QueueParams,
    consumer_tag,
    is_durable,
    parse_destination,
    publish_target,
    reply_to_temp_queue,
    require_id_for_durable,
    stream_offset_argument,
)
from ..mapping.operations import (
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
    Established,
    Operation,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    SendFrame,
)
from ..mapping.profile import rules_for
from ..stomp.codec import FrameError
from ..stomp.frame import Command, Frame
from .activemq import extension_for
from .confirms import Confirms
from .frames import Frames, remember
from .login import Admitted, Identity, Login, LoginSteps, Refused
from .settings import SessionSettings, State, Steps
from .subscriptions import ACK_MODES, Subscription, parse_ack_id
from .transactions import Transactions

_QUEUE_ARGUMENT_HEADERS = frozenset(QUEUE_ARGUMENTS)
_CONNECTED = State.CONNECTED


class Session:
    # MESSAGE rendering: the Frames part's own method, bound once per session (the shell calls
    # it for every delivery, so a forwarding call here would cost one more call per message)
    on_delivery: Callable[[Delivery], bytes]

    def __init__(
        self,
        settings: SessionSettings,
        *,
        session_id: str,
        peer_is_loopback: bool,
    ) -> None:
        self.settings = settings
        self.session_id = session_id
        self.state = State.AWAITING_CONNECT
        self._rules = rules_for(settings.profile)
        # bound once: quick_send runs for every message
        self._send_properties = self._rules.send_properties
        self._identity: Identity | None = None
        self._login = Login(settings, self._rules, self, peer_is_loopback)
        self._subscriptions: dict[str, Subscription] = {}
        self._frames = frames = Frames(self._subscriptions, session_id, settings.trailing_lf)
        self.on_delivery = frames.deliver
        self._confirms = confirms = Confirms()
        self._count_publish = confirms.count  # bound once: quick_send calls it for every message
        self._transactions = Transactions(settings.budgets.transaction_account())
        self._extension = extension = extension_for(self)
        # the extension's per-message hooks, None for the default profile
        self._quick_settle = extension.quick_settle_hook()
        self._confirm_hook = extension.confirm_hook()
        self._declared_queues: set[str] = set()
        self._temp_queues: dict[str, str] = {}
        self._destinations: dict[str, Destination] = {}
        # SEND destinations already published to once: raw destination -> (exchange, routing key)
        self._send_targets: dict[str, tuple[str, str]] = {}
        self._ack_header = "message-id"
        # whether a subscription outside the dispatchers ever asked for client acks: then the
        # channel may hold unsettled deliveries the dispatchers do not know, and their acks
        # are never coalesced into a multiple ack (adapter/server/dispatching.py)
        self.plain_acks = False
        # the subscription queue a SUBSCRIBE has declared but not yet consumed and bound: if
        # the broker refuses the consume or the bind, the plugin deletes it
        # (docs/destinations.md#common-steps)
        self._unfinished_subscription_queue: str | None = None

    # ------------------------------------------------------------------ identity and figures
    @property
    def identity(self) -> Identity:
        """Who the connection is logged in as; only asked once it is."""
        assert self._identity is not None, "not logged in"
        return self._identity

    @property
    def user(self) -> str | None:
        return self._identity.user if self._identity is not None else None

    @property
    def vhost(self) -> str | None:
        return self._identity.vhost if self._identity is not None else None

    @property
    def version(self) -> str:
        return self._identity.version if self._identity is not None else "1.0"

    @property
    def client_id(self) -> str | None:
        """activemq profile: CONNECT's client-id, the owner of named durable subscriptions."""
        return self._identity.client_id if self._identity is not None else None

    @property
    def peer_is_loopback(self) -> bool:
        return self._login.peer_is_loopback

    @peer_is_loopback.setter
    def peer_is_loopback(self, value: bool) -> None:
        self._login.peer_is_loopback = value

    @property
    def forced_credentials(self) -> tuple[str, str] | None:
        return self._login.forced_credentials

    @forced_credentials.setter
    def forced_credentials(self, value: tuple[str, str] | None) -> None:
        self._login.forced_credentials = value

    @property
    def login_failure(self) -> str | None:
        return self._login.failure

    @property
    def requested_user(self) -> str | None:
        return self._login.requested_user

    @property
    def requested_vhost(self) -> str | None:
        return self._login.requested_vhost

    @property
    def messages_sent(self) -> int:
        return self._frames.messages_sent

    @property
    def frames_sent(self) -> dict[str, int]:
        return self._frames.frames_sent

    @property
    def errors_sent(self) -> dict[str, int]:
        return self._frames.errors_sent

    @property
    def on_receipt(self) -> Callable[[str], None] | None:
        """Told the receipt-id of each RECEIPT as it is rendered (the shell times receipts)."""
        return self._frames.on_receipt

    @on_receipt.setter
    def on_receipt(self, value: Callable[[str], None] | None) -> None:
        self._frames.on_receipt = value

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
                    yield from self._connect(self._login.connect(frame), frame, send_connected=True)
                elif self.settings.implicit_connect:
                    # docs/behaviour.md#authentication: log in, send no CONNECTED, then process
                    # the frame as usual
                    yield from self._connect(self._login.implicit(), frame, send_connected=False)
                    if self._identity is not None:  # logged in
                        yield from self._HANDLERS.get(frame.command, Session._bad_command)(self, frame)
                else:
                    yield from self._fail("Illegal command", "You must log in using CONNECT first", frame)
        except StompError as error:  # DestinationError, ProcessingError
            yield from self._fail(error.message, error.detail, frame)

    def on_frame_error(self, error: FrameError) -> list[Operation]:
        """The byte stream broke the grammar or a limit: ERROR, then close (the plugin is silent)."""
        return list(self._fail(error.message, error.detail, None))

    # ------------------------------------------------------------------ CONNECT
    def _connect(self, login: LoginSteps, frame: Frame, send_connected: bool) -> Steps:
        outcome = yield from login
        if isinstance(outcome, Refused):
            yield from self._fail(outcome.message, outcome.detail, frame)
            return
        self._establish(outcome)
        yield Established(outcome.identity.version, outcome.send_ms, outcome.receive_ms)
        if send_connected:
            yield SendFrame(self._login.connected_frame(outcome, self.session_id, self._frames))

    def _establish(self, admitted: Admitted) -> None:
        identity = self._identity = admitted.identity
        self.state = State.CONNECTED
        version_12 = identity.version == "1.2"
        self._ack_header = "id" if version_12 else "message-id"
        self._frames.ack_lines = version_12

    # ------------------------------------------------------------------ SEND
    def _destination(self, raw: str) -> Destination:
        dest = self._destinations.get(raw)
        if dest is None:
            dest = self._rules.parse_destination(raw)
            remember(self._destinations, raw, dest)
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
        transaction = self._transactions.of(headers)
        reply_to = headers.get("reply-to")
        resolved_reply_to = None
        if reply_to is not None:
            resolved_reply_to = yield from self._resolve_reply_to(reply_to)
        targets = [publish_target(dest, self.settings.default_topic_exchange) for dest in dests]
        properties = self._send_properties(headers, resolved_reply_to)
        if not composite:
            remember(self._send_targets, raw, targets[0])  # quick_send takes it from here on
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
                self._transactions.buffer(transaction, publish, receipt if n == last else None)
            return
        if not composite:
            yield from self._publish(publishes[0], receipt)
            return
        # a composite SEND's receipt waits for the confirms of all its publishes, as a COMMIT's
        # does; a nack of any of them becomes an ERROR
        if receipt is not None:
            yield from self._confirm_mode()
        confirms = self._confirms
        first_seq = confirms.seq + 1
        for publish in publishes:
            yield publish
            confirms.count(None)
        if receipt is not None:
            confirms.wait_for_all(receipt, first_seq)

    def quick_send(self, frame: Frame) -> BasicPublish | None:
        """The common SEND in one plain call, or None: then ``handle_frame`` handles it as usual.

        A SEND whose destination this connection has already published to (so it is parsed,
        valid and declared), outside a transaction, with no ``reply-to`` or one to an existing
        temp queue, and with a ``receipt`` only once confirms are on, needs exactly one publish.
        This path gives the same result as ``handle_frame`` without the generator machinery,
        which costs about a quarter of the adapter's per-SEND time (bench/micro.py).  Anything
        else, errors included, goes the general way, which reports them in the plugin's order.
        """
        if self.state is not _CONNECTED:
            return None
        headers = frame.headers
        destination = headers.get("destination", "")
        target = self._send_targets.get(destination)
        if target is None or "transaction" in headers or "message-id" in headers:
            return None
        if not _QUEUE_ARGUMENT_HEADERS.isdisjoint(headers):
            return None  # x- arguments are checked on every SEND: the general path does it
        receipt = headers.get("receipt")
        if receipt is not None and not self._confirms.on:
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
        subscription, as one plain call; None sends it the general way (see ``quick_send``).
        The ack id is read by the general path's parser: any error declines."""
        headers = frame.headers
        if self.state is not _CONNECTED or "transaction" in headers or "receipt" in headers:
            return None
        header = self._ack_header
        value = headers.get(header)
        if value is None:
            return None
        try:
            subscription, delivery_tag = parse_ack_id(value, self._subscriptions, "ACK", header)
        except StompError:
            return None
        # 'client' acks are cumulative: AMQP multiple=true (docs/behaviour.md#receipts)
        multiple = subscription.ack_mode == "client"
        settle = self._quick_settle
        if settle is not None and not settle(subscription, delivery_tag, multiple):
            return None
        return BasicAck(delivery_tag, multiple)

    def _confirm_mode(self) -> Steps:
        """Confirm mode on, once (a receipt that waits for the broker needs it)."""
        if not self._confirms.on:
            yield ConfirmSelect()
            self._confirms.on = True

    def _publish(self, publish: BasicPublish, receipt: str | None) -> Steps:
        if receipt is not None and not self._confirms.on:
            yield from self._confirm_mode()
        yield publish
        self._confirms.count(receipt)

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
            temporaries = self._extension.temporaries(temp_topic.kind)
            return (yield from self._reply_queue(temporaries, temp_topic.name, reply_to))
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
    def _add_subscription(self, subscription: Subscription) -> None:
        """Registered before its consume is sent: the broker may deliver right after consume-ok."""
        self._subscriptions[subscription.consumer_tag] = subscription
        if subscription.ack_mode != "auto":
            self.plain_acks = True

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
        extension = self._extension
        if dest.kind is DestinationKind.TEMP_QUEUE or dest.kind is DestinationKind.TEMP_TOPIC:
            # activemq profile only (the plugin's rules refused it above)
            yield from extension.subscribe_temporary(frame, dest, tag, prefetch_count, ack_mode)
            return
        target = rules.subscribe_target(
            dest, headers, sub_id, self.settings.default_topic_exchange, self.identity.client_id
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
        if extension.dispatches(dest, queue, selector, headers):
            yield from extension.subscribe_dispatched(
                frame, queue, tag, dest, ack_mode, selector, prefetch_count
            )
            return
        if prefetch_count is not None:
            yield BasicQos(prefetch_count)
        arguments: dict[str, object] = {}
        offset = stream_offset_argument(headers.get("x-stream-offset"))
        if offset is not None:
            arguments["x-stream-offset"] = offset
        self._add_subscription(
            Subscription(
                tag, sub_id, raw, dest, ack_mode, selector, hook=extension.delivery_hook(ack_mode, selector)
            )
        )
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

    def _unsubscribe(self, frame: Frame) -> Steps:
        headers = frame.headers
        sub_id = headers.get("id")
        raw = headers.get("destination")
        rules = self._rules
        client_id = self.identity.client_id
        if sub_id is None and raw is None and rules.names_durable_subscription(headers):
            # activemq profile: UNSUBSCRIBE naming only the durable subscription removes it
            queue = rules.unsubscribe_queue(None, headers, None, client_id)
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
            yield from self._extension.cancelled(subscription)
            yield BasicCancel(tag)
            self._subscriptions.pop(tag, None)
        subscribed = subscription.parsed if subscription is not None else None
        queue = rules.unsubscribe_queue(subscribed, headers, sub_id, client_id)
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
        subscription, delivery_tag = parse_ack_id(value, self._subscriptions, command, header)
        transaction = self._transactions.of(headers)
        # 'client' acks are cumulative: AMQP multiple=true (docs/behaviour.md#receipts)
        multiple = subscription.ack_mode == "client"
        steps = self._extension.settle(frame, subscription, delivery_tag, multiple, nack, transaction)
        if steps is not None:
            yield from steps
            return
        op: Operation
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
            self._transactions.buffer(transaction, op, None)
        else:
            yield op
        yield from self._receipt(frame)

    def render_dispatched(self, delivery: Delivery) -> bytes:
        """A message the dispatcher gives one of this session's dispatched subscriptions
        (its consumer tag and message number in place of the AMQP ones)."""
        return self._frames.deliver(delivery, True)

    # ------------------------------------------------------------------ transactions
    def _begin(self, frame: Frame) -> Steps:
        self._transactions.begin(Transactions.name(frame))
        yield from self._receipt(frame)

    def _commit(self, frame: Frame) -> Steps:
        actions = self._transactions.end(Transactions.name(frame))
        receipt = frame.headers.get("receipt")
        # A COMMIT's RECEIPT means what a SEND's does: the broker has every message of the
        # transaction.  So with a receipt, confirms go on before its first publish, and the
        # RECEIPT waits for the confirms of all of them (the plugin, inside the broker, sends it
        # at once: docs/compatibility.md).
        publishes = receipt is not None and any(isinstance(op, BasicPublish) for op, _ in actions)
        if publishes:
            yield from self._confirm_mode()
        first_seq = self._confirms.seq + 1
        for op, op_receipt in actions:
            if isinstance(op, BasicPublish):
                yield from self._publish(op, op_receipt)
            else:
                self._extension.committed(op)
                yield op
        if publishes:
            assert receipt is not None
            self._confirms.wait_for_all(receipt, first_seq)
        else:
            yield from self._receipt(frame)

    def _abort(self, frame: Frame) -> Steps:
        self._transactions.end(Transactions.name(frame))
        yield from self._receipt(frame)

    # ------------------------------------------------------------------ DISCONNECT
    def _disconnect(self, frame: Frame) -> Steps:
        # Unlike the plugin, which drops SEND receipts still waiting for their confirm
        # (docs/behaviour.md#receipts), we wait for the confirms so that every receipt asked for is sent.
        if self.confirms_outstanding:
            yield AwaitConfirms()
        self._transactions.clear()
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
        receipts = self._confirms.settle(delivery_tag, multiple, ack)
        hook = self._confirm_hook
        if hook is not None:
            hook(delivery_tag, multiple, ack)
        if not receipts:
            return b""
        return self._frames.confirmed(receipts, ack)

    @property
    def publish_seq(self) -> int:
        """The confirm sequence number of the last publish (0: confirms are off)."""
        return self._confirms.seq

    @property
    def confirms_outstanding(self) -> bool:
        return self._confirms.outstanding or self._extension.confirms_outstanding

    def is_dispatched(self, consumer_tag: str) -> bool:
        """Whether ``consumer_tag`` is a subscription of a queue dispatcher (activemq profile)."""
        subscription = self._subscriptions.get(consumer_tag)
        return subscription is not None and subscription.dispatched

    def on_server_cancel(self, consumer_tag: str) -> bytes:
        """The broker cancelled a consumer (e.g. its queue was deleted): docs/behaviour.md#error-handling."""
        subscription = self._subscriptions.pop(consumer_tag, None)
        if subscription is None:
            return b""
        # the shell takes a dispatched one out of its dispatcher (is_dispatched), so the
        # operations the extension asks for before a cancel are not needed here
        self._extension.cancelled(subscription)
        if subscription.id is not None:
            header, description = subscription.id, f"id='{subscription.id}'"
        else:
            header, description = subscription.destination, f"destination='{subscription.destination}'"
        return self._frames.error(
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
        self._login.close()
        self._transactions.close()
        self._extension.close()

    def shutdown_notice(self) -> bytes:
        return self._frames.error("Server shutdown", "The server is shutting down\n")

    # ------------------------------------------------------------------ receipts and errors
    def _receipt(self, frame: Frame) -> Steps:
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            yield SendFrame(self._frames.receipt(receipt))

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
        yield SendFrame(self._frames.error(message, detail, receipt=receipt))
        if also_receipt and receipt is not None:
            yield SendFrame(self._frames.receipt(receipt))
        self.state = State.CLOSED
        yield CloseClient(message)
