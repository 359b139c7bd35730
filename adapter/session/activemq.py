"""The activemq profile's extension: what ActiveMQ's STOMP idioms add to a connection's state.

Pure.  Plugs into the session through the hooks of ``ProfileExtension``
(adapter/session/extension.py); the decisions without state stay in the profile's rules
(``ActiveMQRules``, adapter/mapping/profile.py).  Owns:

* NACK to a dead-letter queue (docs/migration-activemq.md): the unsettled deliveries of
  client-ack subscriptions (their bodies are copied there on NACK), against the kept-bytes
  budget (adapter/mapping/budget.py), and the confirms of those copies (published mandatory:
  one the broker returns is not in the queue, ``_dead_letter``);
* selector subscriptions: on a topic, deliveries the selector does not match are withheld; on a
  queue, the subscription joins the process's dispatcher of the queue
  (adapter/dispatch/rules.py), which hands it messages, and its ACK/NACK settle there;
* SUBSCRIBE to ``/temp-queue/NAME`` and ``/temp-topic/NAME`` (the temporary topics' queues);
* queue browsers (``browser:true``): the queue's messages taken, sent and handed back;
* a scheduled SEND (``AMQ_SCHEDULED_DELAY``): its publishes through a delay queue;
* a dispatched subscription to a virtual topic's consumer queue binds it to its topic.

It acts on its session (``host``) through the session's own parts: its subscriptions
(``_subscriptions``, ``_by_tag``), temporary queues, publishing, confirms, transactions and
frames (receipts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Protocol

from ..dispatch import rules as dispatch
from ..errors import StompError
from ..mapping.budget import KeptDeliveries
from ..mapping.destinations import Destination, DestinationKind
from ..mapping.operations import (
    ActivateDispatch,
    AwaitConfirms,
    BasicAck,
    BasicCancel,
    BasicConsume,
    BasicGet,
    BasicPublish,
    BasicPublishMandatory,
    BasicQos,
    Delivery,
    DispatchSettle,
    JoinDispatch,
    LeaveDispatch,
    Operation,
    QueueBind,
    QueueDeclare,
    RequeueGot,
    SendFrame,
)
from ..mapping.profile import BROWSE_BYTES, BROWSE_LIMIT, browses, dead_letter_copy, selector_lookup
from ..mapping.properties import MessageProperties
from ..mapping.scheduled import scheduled_publishes
from ..mapping.selector import Selector
from ..stomp.frame import Frame
from .extension import ConfirmHook, ProfileExtension, QuickSettle
from .settings import Steps
from .subscription import AckMode, DeliveryHook, Subscription

if TYPE_CHECKING:
    from ..mapping.profile import RabbitMQRules
    from .confirms import Confirms
    from .frames import Frames
    from .login import Identity
    from .publishing import Publishing
    from .settings import SessionSettings
    from .subscriptions import Subscriptions
    from .targets import Targets
    from .transactions import Transactions


class ExtensionHost(Protocol):
    """What the extension uses of its session's parts (``Parts``, adapter/session/parts.py, has
    them), reached midway through a frame (a NACK to the dead-letter queue needs confirms,
    transactions and receipts)."""

    settings: SessionSettings
    rules: RabbitMQRules
    by_tag: dict[str, Subscription]
    frames: Frames
    confirms: Confirms
    transactions: Transactions
    subscriptions: Subscriptions
    publishing: Publishing
    targets: Targets

    @property
    def identity(self) -> Identity: ...


def _match_all(_properties: MessageProperties) -> bool:
    """The selector of a subscription without one (a member of a queue's dispatcher)."""
    return True


def _selector_matcher(selector: Selector) -> Callable[[MessageProperties], bool]:
    """A selector as the dispatcher asks it (adapter/dispatch/rules.py)."""

    def matches(properties: MessageProperties) -> bool:
        return selector.matches(selector_lookup(properties))

    return matches


class ActiveMQExtension(ProfileExtension):
    def __init__(self, host: ExtensionHost, dead_letter_queue: str) -> None:
        self._host = host
        self._dead_letter_queue = dead_letter_queue
        # the bytes of the bodies kept in _unsettled and _dispatched, against the per-connection
        # and process-wide bounds (adapter/mapping/budget.py); given back as they are settled
        self._kept_bytes = host.settings.registries.budgets.unacked_account()
        # the unsettled deliveries of client-ack subscriptions by delivery tag
        self._unsettled: MutableMapping[int, Delivery] = KeptDeliveries(self._kept_bytes)
        # the unsettled messages of dispatched subscriptions of client-ack modes, by (consumer
        # tag, message number)
        self._dispatched: MutableMapping[tuple[str, int], Delivery] = KeptDeliveries(self._kept_bytes)
        # the confirm sequence numbers of dead-letter copies the broker has not yet confirmed
        self._dead_letter_seqs: set[int] = set()
        self._dead_letter_refused = False
        self._dead_letter_declared = False
        # /temp-topic/NAME -> its private queue, apart from the temp queues
        self._temp_topics: dict[str, str] = {}

    # ------------------------------------------------------------------ subscribe
    def delivery_hook(self, ack_mode: AckMode, selector: Selector | None) -> DeliveryHook | None:
        # a client-ack subscription's deliveries are kept for NACK; a selector withholds some
        return self if selector is not None or ack_mode != "auto" else None

    def dispatches(
        self, dest: Destination, queue: str, selector: Selector | None, headers: Mapping[str, str]
    ) -> bool:
        # a selector on a shared queue (competing consumers), or a plain subscription on a queue
        # whose selector subscriptions may hold messages for it; or a queue browser
        if browses(headers, dest):
            return True
        host = self._host
        return dest.kind in (DestinationKind.QUEUE, DestinationKind.AMQ_QUEUE) and (
            selector is not None
            or (
                host.rules.plain_joins_dispatcher(headers)
                and host.settings.registries.dispatchers.has(host.identity.vhost, queue)
            )
        )

    def subscribe_dispatched(
        self,
        frame: Frame,
        queue: str,
        tag: str,
        dest: Destination,
        ack_mode: AckMode,
        selector: Selector | None,
        credit: int | None,
    ) -> Steps:
        """A selector subscription on a queue (competing consumers), or one without a selector
        on a queue that has a dispatcher (it matches everything).  It joins the process's
        dispatcher of the queue before it consumes and is activated once the broker accepted the
        consume, after its RECEIPT: until then nothing is delivered to it, so a refused consume
        takes no held message with it.  It always consumes with acks (``auto`` is acked by the
        adapter as each message is sent, so a message no selector matches can be held), with a
        prefetch that leaves room for those held messages; the STOMP prefetch is enforced by the
        dispatcher (adapter/dispatch/rules.py)."""
        if browses(frame.headers, dest):
            yield from self._browse(frame, queue, tag, dest, selector)
            return
        host = self._host
        headers = frame.headers
        auto_ack = ack_mode == "auto"
        yield BasicQos(dispatch.window(credit, auto_ack))
        host.by_tag[tag] = Subscription(
            tag, headers.get("id"), dest.raw, dest, ack_mode, dispatched=True, hook=self
        )
        matches = _match_all if selector is None else _selector_matcher(selector)
        yield JoinDispatch(queue, tag, matches, auto_ack, None if auto_ack else credit)
        yield BasicConsume(queue, tag, no_ack=False, exclusive=host.rules.exclusive_consumer(headers))
        # a virtual topic's consumer queue is bound to its topic, as on the plain path
        binding = host.rules.virtual_topic_binding(dest, host.settings.default_topic_exchange)
        if binding is not None:
            yield QueueBind(queue, *binding)
        yield from host.frames.receipt_of(frame)
        yield ActivateDispatch(tag)

    def _browse(
        self, frame: Frame, queue: str, tag: str, dest: Destination, selector: Selector | None
    ) -> Steps:
        """ActiveMQ's queue browser (``browser:true``): the queue's messages without consuming
        them, then a MESSAGE with ``browser:end``.  AMQP reads a queue only by taking its
        messages, so the browse takes them one by one with basic.get (unacknowledged: they stay
        the queue's), sends each matching one as a MESSAGE of the subscription, and then hands
        them all back (``RequeueGot``: basic.nack, requeue, one by one, where the gets ran),
        so RabbitMQ puts each back in its place; the queue's other
        consumers see them again marked redelivered, and not while the browse lasts.  Bounded:
        at most ``BROWSE_LIMIT`` messages and ``BROWSE_BYTES`` of bodies (ActiveMQ's browser
        stops at its page size too); the adapter keeps only their delivery tags.  The
        subscription stays until UNSUBSCRIBE, without a consumer, as ActiveMQ's does."""
        host = self._host
        sub_id = frame.headers.get("id")
        host.subscriptions.add(
            Subscription(
                tag, sub_id, dest.raw, dest, "auto", selector, hook=None if selector is None else self
            )
        )
        yield from host.frames.receipt_of(frame)
        taken: list[int] = []
        size = 0
        while len(taken) < BROWSE_LIMIT and size < BROWSE_BYTES:
            got = yield BasicGet(queue, tag)
            if not isinstance(got, Delivery):
                break  # the queue has no more ready messages
            taken.append(got.delivery_tag)
            size += len(got.body)
            data = host.frames.render_message(got)
            if data:  # b"": the selector does not match it
                yield SendFrame(data)
        # if the connection closes before this, the broker requeues them with the channel;
        # also when none was taken (a probe that carried the gets closes: adapter/amqp/probe.py)
        yield RequeueGot(tuple(taken))
        headers = [("destination", dest.raw), ("message-id", f"{tag}@@browser-end"), ("browser", "end")]
        if sub_id is not None:
            headers.insert(0, ("subscription", sub_id))
        yield SendFrame(host.frames.encode("MESSAGE", headers))

    def subscribe_temporary(
        self, frame: Frame, dest: Destination, tag: str, prefetch_count: int | None, ack_mode: AckMode
    ) -> Steps:
        """SUBSCRIBE to ``/temp-queue/NAME`` (or ``/temp-topic/NAME``) consumes the connection's
        private queue of that name, the one a ``reply-to`` with the same destination names
        (created by whichever comes first).  Its implicit reply consumer, if any, gives way to
        this subscription, so replies are not shared between two consumers."""
        browses(frame.headers, dest)  # refused: not a queue
        host = self._host
        temporaries = self.temporaries(dest.kind)
        queue = temporaries.get(dest.name)
        if queue is None:
            declared = yield QueueDeclare("", exclusive=True, auto_delete=True)
            assert isinstance(declared, str)
            queue = declared
            temporaries[dest.name] = queue
        else:
            implicit = "T_" + dest.raw
            if implicit in host.by_tag and implicit != tag:
                yield BasicCancel(implicit)
                host.by_tag.pop(implicit, None)
        if prefetch_count is not None:
            yield BasicQos(prefetch_count)
        host.subscriptions.add(
            Subscription(
                tag,
                frame.headers.get("id"),
                dest.raw,
                dest,
                ack_mode,
                hook=self.delivery_hook(ack_mode, None),
            )
        )
        yield BasicConsume(queue, tag, no_ack=ack_mode == "auto")
        yield from host.frames.receipt_of(frame)

    def temporaries(self, kind: DestinationKind) -> dict[str, str]:
        return self._temp_topics if kind is DestinationKind.TEMP_TOPIC else self._host.targets.temp_queues

    # ------------------------------------------------------------------ send
    def scheduled(
        self, headers: Mapping[str, str], publishes: list[BasicPublish]
    ) -> tuple[list[Operation], list[BasicPublish]] | None:
        """ActiveMQ's ``AMQ_SCHEDULED_DELAY``: the publishes go through a delay queue
        (adapter/mapping/scheduled.py); the other scheduling headers are refused there."""
        rules = self._host.rules
        delay = rules.scheduled_delay(headers)
        if delay is None:
            return None
        return scheduled_publishes(publishes, delay, self._host.settings.default_topic_exchange)

    # ------------------------------------------------------------------ delivery (DeliveryHook)
    def withholds(self, subscription: Subscription, delivery: Delivery) -> bool:
        if subscription.dispatched:
            return True  # the shell hands it to the dispatcher (dropped_delivery_ack)
        selector = subscription.selector
        return selector is not None and not selector.matches(selector_lookup(delivery.properties))

    def rendered(self, subscription: Subscription, delivery: Delivery, dispatched: bool) -> None:
        """Keep a client-ack delivery for NACK (at most the prefetch of each subscription);
        over the byte budget (``BudgetExceeded``) it is not sent: the shell closes the
        connection and the broker requeues it."""
        if subscription.ack_mode == "auto":
            return
        if dispatched:
            self._dispatched[(delivery.consumer_tag, delivery.delivery_tag)] = delivery
        else:
            self._unsettled[delivery.delivery_tag] = delivery

    # ------------------------------------------------------------------ settle
    def quick_settle_hook(self) -> QuickSettle | None:
        return self._quick_settle

    def _quick_settle(self, subscription: Subscription, delivery_tag: int, multiple: bool) -> bool:
        if subscription.dispatched:
            return False  # settled on the channel each message came from: the general way
        self._forget(delivery_tag, multiple)
        return True

    def settle(
        self,
        frame: Frame,
        subscription: Subscription,
        delivery_tag: int,
        multiple: bool,
        nack: bool,
        transaction: str | None,
    ) -> Steps | None:
        if subscription.dispatched:
            return self._settle_dispatched(frame, subscription, delivery_tag, multiple, nack, transaction)
        if transaction is not None:
            return None
        if nack:
            settled = self._take_unsettled(delivery_tag, multiple)
            if settled is not None:
                return self._dead_letter(settled, BasicAck(delivery_tag, multiple), frame)
        else:
            self._forget(delivery_tag, multiple)
        return None

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
            yield from self._dead_letter(deliveries, DispatchSettle(tag, number, multiple, ack=True), frame)
            return
        requeue = True
        if nack:
            requeue_header = frame.headers.get("requeue")
            if requeue_header is None:
                requeue = self._host.settings.default_nack_requeue
            else:
                requeue = requeue_header in ("true", "True")
        op = DispatchSettle(tag, number, multiple, ack=not nack, requeue=requeue)
        if transaction is not None:
            self._host.transactions.buffer(transaction, op, None)  # forgotten at COMMIT, kept at ABORT
        else:
            for key in keys:
                self._dispatched.pop(key, None)
            yield op
        yield from self._host.frames.receipt_of(frame)

    def committed(self, op: Operation) -> None:
        if isinstance(op, DispatchSettle):
            self._forget_dispatched(op.consumer_tag, op.number, op.multiple)

    def cancelled(self, subscription: Subscription) -> list[Operation]:
        tag = subscription.consumer_tag
        if subscription.dispatched:
            # leave first: nothing more is routed to it while its cancel is on the way, and
            # what still arrives on its channel goes back to the queue
            self._forget_dispatched(tag)
            return [LeaveDispatch(tag)]
        self._forget_consumer(tag)
        return []

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
        tags = sorted(tag for tag in unsettled if tag <= delivery_tag) if multiple else [delivery_tag]
        if not tags or tags[-1] != delivery_tag or any(tag not in unsettled for tag in tags):
            return None
        return [unsettled.pop(tag) for tag in tags]

    def _dead_letter(
        self, deliveries: list[Delivery], settle: BasicAck | DispatchSettle, frame: Frame
    ) -> Steps:
        """ActiveMQ's NACK: a persistent message moves to the dead-letter queue with
        ``original-destination``; a non-persistent one is dropped.  The copy is published
        mandatory with confirms, and the original acknowledged only once the broker has
        confirmed the copy without returning it.  If the broker returns every copy (no queue
        took them: the dead-letter queue was deleted since this session declared it), the queue
        is declared again and the copies published once more, as ActiveMQ creates its
        dead-letter queue when it needs one.  If the broker refuses a copy, returns one after
        that (or returns only some of a NACK's copies), or a confirm does not come, the
        connection closes with an ERROR and the unacknowledged original goes back to its
        queue: a NACKed message is never lost (a copy that did reach the queue stays there,
        and the message may be copied again when it is NACKed again).  Then the NACK's RECEIPT."""
        host = self._host
        queue = self._dead_letter_queue
        persistent = [d for d in deliveries if d.properties.delivery_mode == 2]
        if persistent:
            if not self._dead_letter_declared:
                yield QueueDeclare(queue, durable=True)
                self._dead_letter_declared = True
            yield from host.publishing.confirm_mode()
            confirms = host.confirms
            for attempt in (1, 2):
                returned_before = confirms.returned  # a return comes before its publish's confirm
                for delivery in persistent:
                    yield BasicPublishMandatory("", queue, dead_letter_copy(delivery), delivery.body)
                    confirms.count(None)
                    self._dead_letter_seqs.add(confirms.seq)
                confirmed = yield AwaitConfirms()
                if confirmed is False or self._dead_letter_refused:
                    raise StompError(
                        "Message rejected by the broker",
                        f"The broker did not confirm the copy of the NACKed message on {queue!r}; "
                        "the message stays on its queue\n",
                    )
                returned = confirms.returned - returned_before
                if returned != len(persistent) or attempt == 2:
                    break
                yield QueueDeclare(queue, durable=True)  # deleted since: declared again
            if returned:
                raise StompError(
                    "Message rejected by the broker",
                    f"The broker could not route the copy of the NACKed message to {queue!r}; "
                    "the message stays on its queue\n",
                )
        yield settle
        yield from host.frames.receipt_of(frame)

    # ------------------------------------------------------------------ confirm
    def confirm_hook(self) -> ConfirmHook | None:
        return self._confirm

    def _confirm(self, delivery_tag: int, multiple: bool, ack: bool) -> None:
        seqs = self._dead_letter_seqs
        if not seqs:
            return
        hit = {seq for seq in seqs if seq <= delivery_tag} if multiple else seqs & {delivery_tag}
        if hit:
            seqs -= hit
            if not ack:
                self._dead_letter_refused = True

    @property
    def confirms_outstanding(self) -> bool:
        return bool(self._dead_letter_seqs)

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        self._kept_bytes.close()


def extension_for(host: ExtensionHost) -> ProfileExtension:
    """The extension of the session's profile: ActiveMQ's when its rules have a dead-letter
    queue (the activemq profile), else the null extension."""
    queue = host.rules.dead_letter_queue
    return ProfileExtension() if queue is None else ActiveMQExtension(host, queue)


__all__ = ["ActiveMQExtension", "extension_for"]
