"""SEND, the general way: destinations planned and declared, reply-to queues, the publish and its
receipt.

Pure.  ``Publishing.send`` is the generator ``handle_frame`` runs for a SEND that
``Session.quick_send`` declined; it is the one that reports errors, in the plugin's order.
``publish`` and ``confirm_mode`` are shared with COMMIT (core.py) and the profile extension
(a dead-letter copy is a publish too).  What a publish's receipt waits for is the confirms
part's business (confirms.py).
"""

from __future__ import annotations

from collections.abc import Generator

from ..mapping.destinations import (
    DestinationError,
    ProcessingError,
    parse_destination,
    publish_target,
    reply_to_temp_queue,
)
from ..mapping.operations import BasicConsume, BasicPublish, ConfirmSelect, Operation, QueueDeclare
from ..mapping.profile import RabbitMQRules
from ..stomp.frame import Frame
from .confirms import Confirms
from .extension import ProfileExtension
from .frames import Frames
from .settings import SessionSettings, Steps
from .subscription import Subscription
from .targets import Targets, remember
from .transactions import Transactions


class Publishing:
    def __init__(
        self,
        settings: SessionSettings,
        rules: RabbitMQRules,
        targets: Targets,
        transactions: Transactions,
        confirms: Confirms,
        frames: Frames,
        extension: ProfileExtension,
        subscriptions: dict[str, Subscription],
    ) -> None:
        self._settings = settings
        self._rules = rules
        self._targets = targets
        self._transactions = transactions
        self._confirms = confirms
        self._frames = frames
        self._extension = extension
        self._subscriptions = subscriptions

    def send(self, frame: Frame) -> Steps:
        headers = frame.headers
        raw = headers.get("destination")
        if raw is None:
            raise DestinationError("Missing destination", "\"SEND\" must include a 'destination' header\n")
        if "message-id" in headers:
            raise DestinationError("Invalid header", "'message-id' is not allowed on 'SEND'.\n")
        rules = self._rules
        targets = self._targets
        # activemq profile: a composite destination, "/queue/a,/topic/b", is one publish per
        # element, each planned as a SEND to it alone; the plugin reads the comma as part of a name
        composite = "," in raw and rules.composite_destinations
        parts = raw.split(",") if composite else [raw]
        if composite and not all(parts):
            raise DestinationError("Invalid destination", f"'{raw}' has an empty element\n")
        dests = []
        for part in parts:
            dest = targets.parse(part)
            # the mapping rule, in the plugin's order: x- arguments checked for every destination
            # kind, then /temp-queue refused, then a /queue declared once per connection
            params = rules.send_queue_params(dest, headers, targets.declared)
            if params is not None:
                yield from targets.declare_queue_once(dest, params)
            yield from targets.declare_exchange_once(part, dest, headers)
            dests.append(dest)
        # checked after the destination and its declare, in the plugin's order (docs/behaviour.md#limits)
        transaction = self._transactions.of(headers)
        reply_to = headers.get("reply-to")
        resolved_reply_to = None
        if reply_to is not None:
            resolved_reply_to = yield from self._resolve_reply_to(reply_to)
        exchanges = [publish_target(dest, self._settings.default_topic_exchange) for dest in dests]
        properties = rules.send_properties(headers, resolved_reply_to)
        if not composite:
            remember(targets.send_targets, raw, exchanges[0])  # quick_send takes it from here on
        receipt = headers.get("receipt")
        if properties is None:
            # activemq profile: expired before it was sent.  ActiveMQ accepts and discards it,
            # so the SEND succeeds (with its RECEIPT) and nothing is published.
            yield from self._frames.receipt_of(frame)
            return
        publishes = [
            BasicPublish(exchange, key, properties, frame.body, part)
            for (exchange, key), part in zip(exchanges, parts, strict=True)
        ]
        # activemq profile: a scheduled SEND (AMQ_SCHEDULED_DELAY) publishes through a delay
        # queue, which its preparing operations declare and bind (the extension's plan)
        prepare: list[Operation] = []
        scheduled = self._extension.scheduled(headers, publishes)
        if scheduled is not None:
            prepare, publishes = scheduled
        if transaction is not None:
            last = len(publishes) - 1
            for op in prepare:
                self._transactions.buffer(transaction, op, None)  # replayed at COMMIT, in order
            for n, publish in enumerate(publishes):
                self._transactions.buffer(transaction, publish, receipt if n == last else None)
            return
        for op in prepare:
            yield op
        if not composite:
            yield from self.publish(publishes[0], receipt)
            return
        # a composite SEND's receipt waits for the confirms of all its publishes, as a COMMIT's
        # does; a nack of any of them becomes an ERROR
        if receipt is not None:
            yield from self.confirm_mode()
        confirms = self._confirms
        first_seq = confirms.seq + 1
        for publish in publishes:
            yield publish
            confirms.count(None)
        if receipt is not None:
            confirms.wait_for_all(receipt, first_seq)

    def confirm_mode(self) -> Steps:
        """Confirm mode on, once (a receipt that waits for the broker needs it)."""
        if not self._confirms.on:
            yield ConfirmSelect()
            self._confirms.on = True

    def publish(self, publish: BasicPublish, receipt: str | None) -> Steps:
        if receipt is not None and not self._confirms.on:
            yield from self.confirm_mode()
        yield publish
        self._confirms.count(receipt)

    def _resolve_reply_to(self, reply_to: str) -> Generator[Operation, object, str | None]:
        """docs/destinations.md#temporary-queues: a /temp-queue/<name> becomes a private server-named
        queue."""
        if reply_to.startswith("/temp-queue/"):
            # the mapping rule refuses what is not one temp-queue name ("/temp-queue/", "a/b")
            name = reply_to_temp_queue(reply_to)
            assert name is not None
            return (yield from self._reply_queue(self._targets.temp_queues, name, reply_to))
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
