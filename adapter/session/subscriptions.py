"""A session's subscriptions: what one is, the one parser of the ack ids that name its messages,
and the part that handles SUBSCRIBE, UNSUBSCRIBE, ACK and NACK.

Pure.  ``parse_ack_id`` serves both the general ACK/NACK path and the quick ACK path
(``Session.quick_ack``), so the two can only differ in when they decline, never in what an ack
id means.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

from ..mapping.destinations import (
    Destination,
    DestinationError,
    DestinationKind,
    ProcessingError,
    consume_arguments,
    consumer_tag,
    is_durable,
    plugin_integer,
    require_id_for_durable,
)
from ..mapping.operations import (
    BasicAck,
    BasicCancel,
    BasicConsume,
    BasicNack,
    BasicQos,
    Delivery,
    DispatchDelivery,
    JoinShared,
    LeaveShared,
    Operation,
    QueueBind,
    QueueDeclare,
    QueueDelete,
)
from ..mapping.profile import Profile, RabbitMQRules
from ..sharing.rules import shareable
from ..stomp.frame import Frame
from .edition import edition_for
from .retries import DELAYS_HEADER, default_delays, retry_plan
from .settings import RefusedWithReceipt, SessionSettings, Steps
from .subscription import ACK_MODES, Subscription
from .targets import Targets
from .transactions import Transactions

if TYPE_CHECKING:
    from .extension import ProfileExtension
    from .frames import Frames
    from .retries import Retries


def parse_ack_id(
    value: str, subscriptions: dict[str, Subscription], command: str, header: str
) -> tuple[Subscription, int]:
    """The subscription and delivery tag an ACK/NACK's ``header`` (``id`` in 1.2, else
    ``message-id``) names: ``<consumer tag>@@<session id>@@<delivery tag>``.

    Raises the plugin's errors in the plugin's order (docs/behaviour.md#error-catalogue): not
    three parts, no such subscription, not an integer (Erlang's rule, ``plugin_integer``), out
    of AMQP's 64-bit range.  The session id part is not checked, as in the plugin.
    """
    parts = value.split("@@")
    if len(parts) != 3:
        raise DestinationError("Invalid header", f'"{command}" must include a valid "{header}" header\n')
    subscription = subscriptions.get(parts[0])
    if subscription is None:
        raise DestinationError("Subscription not found", f'Message with id "{value}" has no subscription')
    number = parts[2]
    # ASCII digits first: the common case, and a subset of plugin_integer's rule; a longer text
    # goes to plugin_integer, which bounds the digits before int() (adapter/numbers.py)
    if len(number) <= 20 and number.isascii() and number.isdigit():
        delivery_tag: int | None = int(number)
    else:
        delivery_tag = plugin_integer(number)
    if delivery_tag is None:
        raise ProcessingError(f"Bad delivery tag in {header} {value!r}")
    if not 0 <= delivery_tag < 18446744073709551616:  # 2**64: AMQP delivery tags are 64-bit
        raise ProcessingError(f"Delivery tag out of range in {header} {value!r}")
    return subscription, delivery_tag


class Subscriptions:
    """A connection's subscriptions: SUBSCRIBE, UNSUBSCRIBE, ACK and NACK, and what the broker's
    deliveries and cancels need to know about them.

    ``by_tag`` (consumer tag -> ``Subscription``) is shared with the MESSAGE renderer
    (frames.py).  The profile's extension decides which subscriptions it serves itself (a
    queue's dispatcher, a temporary destination) and settles what it keeps.
    """

    def __init__(
        self,
        settings: SessionSettings,
        rules: RabbitMQRules,
        targets: Targets,
        transactions: Transactions,
        frames: Frames,
        extension: ProfileExtension,
        by_tag: dict[str, Subscription],
        retries: Retries,
    ) -> None:
        self._settings = settings
        self._retries = retries  # x-retry-delays subscriptions' NACKs (retries.py)
        self._rules = rules
        self._targets = targets
        self._transactions = transactions
        self._frames = frames
        self._extension = extension
        self.by_tag = by_tag
        # STOMP 1.2 names the message to ACK with ``id``, earlier versions with ``message-id``
        self.ack_header = "message-id"
        # the logged-in connection's client id (activemq profile: named durable subscriptions)
        self.client_id: str | None = None
        # whether a subscription outside the dispatchers ever asked for client acks: then the
        # channel may hold unsettled deliveries the dispatchers do not know, and their acks
        # are never coalesced into a multiple ack (adapter/dispatch/runtime.py)
        self.plain_acks = False
        # the subscription queue a SUBSCRIBE has declared but not yet consumed and bound: if
        # the broker refuses the consume or the bind, the plugin deletes it
        # (docs/destinations.md#common-steps)
        self.unfinished_queue: str | None = None
        # the prefetch the channel's later consumers get (the last basic.qos of a plain
        # SUBSCRIBE; 0: none): an auto-ack consume lifts it around itself (subscribe)
        self.channel_prefetch = 0
        # adapter.shared_subscriptions is on and this profile shares (the activemq profile's
        # topic subscriptions carry its own semantics: never shared)
        self._shares = settings.registries.shared is not None and settings.profile == Profile.RABBITMQ
        self._edition = edition_for(settings.plugin_behaviour)

    def without_sharing(self) -> None:
        """An OAuth 2.0 token session: every subscription is its own.  A shared group keeps
        the credentials of the member that opened it for the group's life, while a token
        session's rights change with each refresh (docs/configuration.md, "OAuth 2.0 tokens")."""
        self._shares = False

    def add(self, subscription: Subscription) -> None:
        """Registered before its consume is sent: the broker may deliver right after consume-ok."""
        self.by_tag[subscription.consumer_tag] = subscription
        if subscription.ack_mode != "auto":
            self.plain_acks = True

    # ------------------------------------------------------------------ SUBSCRIBE / UNSUBSCRIBE
    def subscribe(self, frame: Frame) -> Steps:
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
        targets = self._targets
        dest = targets.parse(raw)
        rules.check_subscribe_destination(dest)
        selector = rules.selector(dest, headers)
        tag = consumer_tag(headers, raw)
        if tag in self.by_tag:
            # checked before anything is declared, so no queue leaks (the plugin declares first)
            raise RefusedWithReceipt(
                "Duplicated subscription identifier", f"A subscription identified by '{tag}' already exists."
            )
        if DELAYS_HEADER in headers:
            # checked before anything is declared; the activemq profile's NACK means its own
            if self._settings.profile != Profile.RABBITMQ:
                raise ProcessingError(f"header '{DELAYS_HEADER}' is not supported in the activemq profile")
            retry_plan(headers, "", ack_mode)
        # before the subscription queue, so a refused declare leaves no queue behind
        yield from targets.declare_exchange_once(raw, dest, headers)
        sub_id = headers.get("id")
        if self._shares and shareable(dest.kind, headers):
            joined = yield from self._subscribe_shared(frame, raw, dest, tag, sub_id)
            if joined:
                return
            # declined (too many shared subscriptions opened): a plain one, as with it off
        extension = self._extension
        if dest.kind is DestinationKind.TEMP_QUEUE or dest.kind is DestinationKind.TEMP_TOPIC:
            # activemq profile only (the plugin's rules refused it above)
            yield from extension.subscribe_temporary(frame, dest, tag, prefetch_count, ack_mode)
            return
        target = rules.subscribe_target(
            dest, headers, sub_id, self._settings.default_topic_exchange, self.client_id
        )
        queue = target.queue
        assert queue is not None
        if target.declare is not None:
            if dest.kind is DestinationKind.QUEUE:
                if dest.name not in targets.declared:
                    yield from targets.declare_queue_once(dest, target.declare)
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
                self.unfinished_queue = queue
        if extension.dispatches(dest, queue, selector, headers):
            yield from extension.subscribe_dispatched(
                frame, queue, tag, dest, ack_mode, selector, prefetch_count
            )
            return
        auto = ack_mode == "auto"
        if prefetch_count is not None and not auto:
            yield BasicQos(prefetch_count)
            self.channel_prefetch = prefetch_count
        elif auto and self.channel_prefetch:
            # a no-ack consume of a stream with a prefetch in effect is a connection error (540),
            # which would end every session of a shared AMQP connection; without one, a channel
            # error (406): the prefetch is lifted for the consume and put back after it (a no-ack
            # consumer has no use for it, and later consumers get it as before)
            yield BasicQos(0)
        arguments = consume_arguments(headers)
        hook = extension.delivery_hook(ack_mode, selector)
        settings = self._settings
        default = (
            default_delays(raw, ack_mode, settings.default_retry_delays)
            if settings.profile == Profile.RABBITMQ
            else None
        )
        retry = retry_plan(headers, queue, ack_mode, default)
        if retry is not None:
            hook = self._retries  # keeps each delivery's body for its NACK
        self.add(Subscription(tag, sub_id, raw, dest, ack_mode, selector, hook=hook, retry=retry))
        yield BasicConsume(
            queue,
            tag,
            no_ack=auto,
            arguments=arguments,
            exclusive=rules.exclusive_consumer(headers),
        )
        if auto:
            if prefetch_count is not None:
                self.channel_prefetch = prefetch_count  # what the plugin's qos leaves for later consumers
            if self.channel_prefetch:
                yield BasicQos(self.channel_prefetch)
        if target.bind_exchange is not None:
            yield QueueBind(queue, target.bind_exchange, target.bind_key, target.bind_arguments)
        self.unfinished_queue = None
        yield from self._frames.receipt_of(frame)

    def _subscribe_shared(
        self, frame: Frame, raw: str, dest: Destination, tag: str, sub_id: str | None
    ) -> Generator[Operation, object, bool]:
        """adapter.shared_subscriptions: join the process's shared subscription of ``raw``
        instead of consuming on this session's channel (adapter/sharing/rules.py).  The plan
        is the plain one, which the group's first member carries out with its credentials."""
        target = self._rules.subscribe_target(
            dest, frame.headers, sub_id, self._settings.default_topic_exchange, self.client_id
        )
        params = target.declare
        assert params is not None and target.queue is not None and target.bind_exchange is not None
        head, id_prefix = self._frames.shared_head(sub_id, tag)
        joined = yield JoinShared(
            raw,
            tag,
            head,
            id_prefix,
            QueueDeclare(
                target.queue,
                durable=params.durable,
                exclusive=params.exclusive,
                auto_delete=params.auto_delete,
                arguments=dict(params.arguments),
            ),
            target.bind_exchange,
            target.bind_key,
        )
        if joined is not True:
            return False
        self.add(Subscription(tag, sub_id, raw, dest, "auto", shared=True))
        yield from self._frames.receipt_of(frame)
        return True

    def unsubscribe(self, frame: Frame) -> Steps:
        headers = frame.headers
        sub_id = headers.get("id")
        raw = headers.get("destination")
        rules = self._rules
        client_id = self.client_id
        if sub_id is None and raw is None and rules.names_durable_subscription(headers):
            # activemq profile: UNSUBSCRIBE naming only the durable subscription removes it
            queue = rules.unsubscribe_queue(None, headers, None, client_id)
            assert queue is not None
            yield QueueDelete(queue)
            yield from self._frames.receipt_of(frame)
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
        subscription = self.by_tag.get(tag)
        if subscription is None:
            if not rules.names_durable_subscription(headers):
                raise DestinationError(
                    "No subscription found",
                    "UNSUBSCRIBE must refer to an existing subscription.\n"
                    f'Subscription to "{description}" not found.\n',
                )
            # activemq profile: ActiveMQ's sequence, "UNSUBSCRIBE id" then UNSUBSCRIBE with the
            # subscription name (and the same id) to remove the durable subscription
        elif subscription.shared:
            yield LeaveShared(tag)
            self.by_tag.pop(tag, None)
        else:
            yield from self._extension.cancelled(subscription)
            yield BasicCancel(tag)
            self.by_tag.pop(tag, None)
            if subscription.retry is not None:
                self._retries.forget(tag)
        subscribed = subscription.parsed if subscription is not None else None
        queue = rules.unsubscribe_queue(subscribed, headers, sub_id, client_id)
        if queue is not None:
            yield QueueDelete(queue)
        yield from self._frames.receipt_of(frame)

    # ------------------------------------------------------------------ ACK / NACK
    def ack(self, frame: Frame) -> Steps:
        return self.settle(frame, nack=False)

    def nack(self, frame: Frame) -> Steps:
        return self.settle(frame, nack=True)

    def settle(self, frame: Frame, nack: bool) -> Steps:
        headers = frame.headers
        command = frame.command
        header = self.ack_header
        value = headers.get(header)
        if value is None:
            raise DestinationError("Missing header", f'"{command}" must include the "{header}" header\n')
        subscription, delivery_tag = parse_ack_id(value, self.by_tag, command, header)
        if subscription.shared:
            # its messages were never on this session's channel; the plugin's channel would
            # refuse the ack of an auto-ack message with 406 and close (docs/compatibility.md)
            raise DestinationError(
                *self._edition.broker_error(
                    "precondition_failed", f"PRECONDITION_FAILED - unknown delivery tag {delivery_tag}"
                )
            )
        transaction = self._transactions.of(headers)
        if nack and subscription.stream:
            # RabbitMQ answers basic.nack or basic.reject on a stream with a connection error
            # (540), which would end every session of a shared AMQP connection: the same ERROR,
            # for this session only, and the broker never sees the NACK
            raise DestinationError(
                *self._edition.broker_error(
                    "not_implemented",
                    "NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues",
                )
            )
        if subscription.retry is not None:
            if transaction is not None and nack:
                raise ProcessingError(
                    f"a NACK of a subscription with '{DELAYS_HEADER}' cannot be in a transaction"
                )
            if transaction is None:
                yield from self._retries.settle(frame, subscription, delivery_tag, nack)
                return
        # 'client' acks are cumulative: AMQP multiple=true (docs/behaviour.md#receipts)
        multiple = subscription.ack_mode == "client"
        if multiple and self._retries.holding:
            self._retries.swept(delivery_tag)
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
                requeue = self._settings.default_nack_requeue
            op = BasicNack(delivery_tag, multiple, requeue)
        else:
            op = BasicAck(delivery_tag, multiple)
        if transaction is not None:
            self._transactions.buffer(transaction, op, None)
        else:
            yield op
        yield from self._frames.receipt_of(frame)

    # ------------------------------------------------------------------ broker events
    def dropped_delivery_ack(self, delivery: Delivery) -> BasicAck | DispatchDelivery | None:
        """What to do with a delivery the renderer withheld: its subscription's selector does not
        match it, so it leaves that subscription's own queue (acked; None for auto-ack
        subscriptions, whose deliveries the broker has already forgotten); or its subscription
        is dispatched (a selector on a queue), and the dispatcher decides."""
        subscription = self.by_tag.get(delivery.consumer_tag)
        if subscription is None:
            return None
        if subscription.dispatched:
            return DispatchDelivery(delivery)
        if subscription.ack_mode == "auto":
            return None
        return BasicAck(delivery.delivery_tag, False)

    def destination_of(self, consumer_tag: str) -> str | None:
        """The destination header of the SUBSCRIBE behind a consumer (per-destination metrics)."""
        subscription = self.by_tag.get(consumer_tag)
        return subscription.destination if subscription is not None else None

    def is_dispatched(self, consumer_tag: str) -> bool:
        """Whether ``consumer_tag`` is a subscription of a queue dispatcher (activemq profile)."""
        subscription = self.by_tag.get(consumer_tag)
        return subscription is not None and subscription.dispatched

    def server_cancel(self, consumer_tag: str) -> bytes:
        """The broker cancelled a consumer (e.g. its queue was deleted): the ERROR that says so,
        the connection left open (docs/behaviour.md#error-handling); nothing for a consumer
        that is no longer a subscription."""
        subscription = self.cancelled_by_server(consumer_tag)
        if subscription is None:
            return b""
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

    def cancelled_by_server(self, consumer_tag: str) -> Subscription | None:
        """The broker cancelled a consumer: the subscription it was, now gone, if any."""
        subscription = self.by_tag.pop(consumer_tag, None)
        if subscription is not None and subscription.retry is not None:
            self._retries.forget(consumer_tag)
        if subscription is not None:
            # the shell takes a dispatched one out of its dispatcher (Session.is_dispatched), so
            # the operations the extension asks for before a cancel are not needed here
            self._extension.cancelled(subscription)
        return subscription
