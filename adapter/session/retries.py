"""Retry with back-off for NACK (SUBSCRIBE ``x-retry-delays``; docs/destinations.md#retry-with-back-off).

A subscription whose SUBSCRIBE carries ``x-retry-delays: 1000,5000,30000`` (milliseconds) has
each NACK of one of its messages send the message to a *delay queue* for the delay of its
attempt; when the delay is over the broker dead-letters it back to the subscription's queue,
where it is delivered again with ``x-delivery-count`` raised.  A NACK after the last delay
dead-letters it: ``basic.nack`` without requeue (the queue's own dead-letter exchange), or,
with ``x-retry-dead-letter-exchange``, a copy published there.  Built from what RabbitMQ has
(a queue per delay with ``x-message-ttl`` dead-lettering into the default exchange with the
subscription queue's name as routing key), as the activemq profile's scheduled delivery is; no
broker plugin.

Never lost on the way: the copy is published mandatory with confirms, and the original is
acknowledged only once the broker has confirmed the copy without returning it; a refused,
returned (routed to no queue) or unconfirmed copy ends the session with an ERROR and the
unacknowledged original goes back to its queue.  A receipted NACK means the message is in the
delay queue (or a queue bound to the dead-letter exchange has it).  The attempt a message is at
is read from its ``x-death`` history (the delay queues it came back from), so it needs no state
of the adapter's and survives reconnects.

The bodies of a retry subscription's unsettled deliveries are kept for the NACK, against the
per-connection and process bounds of ``adapter.max_unacked_bytes`` / ``adapter.unacked_bytes_budget``.
Only ``ack:client-individual`` (a cumulative ``client`` NACK would name messages of other
subscriptions too); not in the activemq profile (its NACK has a meaning of its own); a NACK
inside a transaction is refused (the copy's confirm cannot wait for COMMIT).

Pure: no I/O; imports neither asyncio nor pydantic.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Final

from ..errors import StompError
from ..mapping.budget import Account, KeptDeliveries
from ..mapping.destinations import ProcessingError
from ..mapping.operations import (
    AwaitConfirms,
    BasicAck,
    BasicNack,
    BasicPublishMandatory,
    ConfirmSelect,
    Delivery,
    QueueDeclare,
)
from ..mapping.properties import RETRY_QUEUE_PREFIX, MessageProperties, death_history
from .subscription import RetryPlan, Subscription

if TYPE_CHECKING:
    from ..stomp.frame import Frame
    from .confirms import Confirms
    from .frames import Frames
    from .settings import Steps

__all__ = [
    "DELAYS_HEADER",
    "DEAD_LETTER_HEADER",
    "RETRY_QUEUE_PREFIX",
    "RetryPlan",
    "Retries",
    "attempts_made",
    "default_delays",
    "retry_plan",
    "retry_queue",
]

DELAYS_HEADER: Final = "x-retry-delays"
DEAD_LETTER_HEADER: Final = "x-retry-dead-letter-exchange"
MAX_DELAYS: Final = 32
MAX_DELAY_MS: Final = 24 * 3600 * 1000  # a day: longer is a scheduler's job, not a retry's
# a delay queue goes this long after it was last declared (each retry declares it again), so
# it outlives every message in it and does not outlive its use by much
_EXPIRES_AFTER_MS: Final = 60_000


def default_delays(destination: str, ack_mode: str, defaults: tuple[tuple[str, str], ...]) -> str | None:
    """The ``x-retry-delays`` ``adapter.default_retry_delays`` gives a client-individual
    subscription of ``destination`` that does not say (the longest matching prefix), or None."""
    if ack_mode != "client-individual" or not defaults:
        return None
    matching = [(prefix, delays) for prefix, delays in defaults if destination.startswith(prefix)]
    return max(matching, key=lambda entry: len(entry[0]))[1] if matching else None


def retry_plan(
    headers: Mapping[str, str], queue: str, ack_mode: str, default: str | None = None
) -> RetryPlan | None:
    """The plan of a SUBSCRIBE's ``x-retry-delays`` (or of ``default``, the setting's for its
    destination, without one; None without either); ProcessingError for a list that is not 1 to
    32 integers from 1 to 86,400,000, or an ack mode other than client-individual."""
    raw = headers.get(DELAYS_HEADER, default)
    if raw is None:
        return None
    parts = [part.strip() for part in raw.split(",")]
    if not 1 <= len(parts) <= MAX_DELAYS or not all(part.isdigit() and part.isascii() for part in parts):
        raise ProcessingError(
            f"header '{DELAYS_HEADER}' must be 1 to {MAX_DELAYS} delays in milliseconds separated "
            f"by commas, got {raw!r}"
        )
    delays = tuple(int(part) for part in parts)
    if not all(1 <= delay <= MAX_DELAY_MS for delay in delays):
        raise ProcessingError(
            f"header '{DELAYS_HEADER}': each delay must be 1 to {MAX_DELAY_MS} ms, got {raw!r}"
        )
    if ack_mode != "client-individual":
        raise ProcessingError(f"header '{DELAYS_HEADER}' needs ack:client-individual, got ack:{ack_mode}")
    return RetryPlan(delays, queue, headers.get(DEAD_LETTER_HEADER))


def retry_queue(delay: int, queue: str) -> QueueDeclare:
    """The delay queue of ``delay`` ms for messages returning to ``queue``: durable, its TTL the
    delay, dead-lettering into the default exchange with ``queue`` as the routing key, gone a
    minute after its last declare.  A long queue name is shortened with a digest (a queue name
    is at most 255 bytes)."""
    target = queue if len(queue.encode("utf-8", "surrogateescape")) <= 200 else _digest(queue)
    return QueueDeclare(
        f"{RETRY_QUEUE_PREFIX}{delay}ms.{target}",
        durable=True,
        nowait=True,
        arguments={
            "x-message-ttl": delay,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": queue,
            "x-expires": delay + _EXPIRES_AFTER_MS,
        },
    )


def _digest(queue: str) -> str:
    return hashlib.blake2b(queue.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


def attempts_made(properties_headers: Mapping[str, object] | None) -> int:
    """How many retries a message has had: how often it came back from a delay queue (its
    ``x-death`` entries of the ``stomp-retry.`` queues)."""
    if not properties_headers:
        return 0
    return sum(
        count
        for queue, reason, count in death_history(properties_headers)
        if queue.startswith(RETRY_QUEUE_PREFIX)
    )


class Retries:
    """A session's retry subscriptions' unsettled deliveries and what their NACKs do (see the
    module docstring).  It is the ``DeliveryHook`` of those subscriptions: each rendered
    delivery's body is kept until it is settled."""

    __slots__ = ("_account", "_confirms", "_frames", "_kept")

    def __init__(self, confirms: Confirms, frames: Frames, account: Account) -> None:
        self._confirms = confirms
        self._frames = frames
        self._account = account
        # by delivery tag (one channel per session, so unique)
        self._kept: KeptDeliveries[int] = KeptDeliveries(account)

    # ------------------------------------------------------------------ DeliveryHook
    def withholds(self, subscription: Subscription, delivery: Delivery) -> bool:
        return False

    def rendered(self, subscription: Subscription, delivery: Delivery, dispatched: bool) -> None:
        self._kept[delivery.delivery_tag] = delivery  # BudgetExceeded: the session closes

    @property
    def holding(self) -> bool:
        """Whether any delivery is kept (a cumulative ack must then sweep: ``swept``)."""
        return bool(self._kept)

    # ------------------------------------------------------------------ settling
    def swept(self, delivery_tag: int) -> None:
        """A cumulative ack or nack (``client`` mode) of another subscription settled every
        delivery up to ``delivery_tag`` on the channel, kept ones included."""
        for tag in [tag for tag in self._kept if tag <= delivery_tag]:
            del self._kept[tag]

    def forget(self, consumer_tag: str) -> None:
        """The subscription ended: its kept deliveries are not needed any more (a later NACK
        names no current subscription)."""
        for tag in [tag for tag, kept in self._kept.items() if kept.consumer_tag == consumer_tag]:
            del self._kept[tag]

    def settle(self, frame: Frame, subscription: Subscription, delivery_tag: int, nack: bool) -> Steps:
        """ACK: forget the kept body, acknowledge.  NACK: retry (or dead-letter after the last
        delay), then the RECEIPT."""
        plan = subscription.retry
        assert plan is not None
        delivery = self._kept.pop(delivery_tag, None)
        if not nack or delivery is None:
            # an ACK; or a NACK of a message not kept (never delivered to this subscription: the
            # broker refuses the tag as it would without retries)
            yield BasicNack(delivery_tag, False, True) if nack else BasicAck(delivery_tag, False)
            yield from self._frames.receipt_of(frame)
            return
        attempt = attempts_made(delivery.properties.headers)
        if attempt < len(plan.delays):
            declare = retry_queue(plan.delays[attempt], plan.queue)
            yield declare  # nowait, every time: it keeps the queue from expiring
            yield from self._confirmed_copy(
                BasicPublishMandatory("", declare.queue, _copy_properties(delivery), delivery.body)
            )
        elif plan.dead_letter_exchange is not None:
            yield from self._confirmed_copy(
                BasicPublishMandatory(
                    plan.dead_letter_exchange, delivery.routing_key, delivery.properties, delivery.body
                )
            )
        else:
            yield BasicNack(delivery_tag, False, False)  # the queue's own dead-lettering
            yield from self._frames.receipt_of(frame)
            return
        yield BasicAck(delivery_tag, False)
        yield from self._frames.receipt_of(frame)

    def _confirmed_copy(self, publish: BasicPublishMandatory) -> Steps:
        """Publish ``publish`` (mandatory) and wait for the broker's confirm; a refusal (or a
        refusal of any publish meanwhile, to be safe), a return (no queue took it: a dead-letter
        exchange bound to none, a delay queue deleted since its declare) or no confirm is a
        StompError: the original stays unacknowledged and goes back to its queue when the
        connection closes."""
        confirms = self._confirms
        if not confirms.on:
            yield ConfirmSelect()
            confirms.on = True
        refused_before = confirms.refused
        returned_before = confirms.returned
        yield publish
        confirms.count_copy()  # AwaitConfirms waits for it
        confirmed = yield AwaitConfirms()
        if confirmed is False or confirms.refused != refused_before:
            raise StompError(
                "Message rejected by the broker",
                f"The broker did not confirm the retry copy of the NACKed message on "
                f"{publish.exchange or publish.routing_key!r}; the message stays on its queue\n",
            )
        if confirms.returned != returned_before:
            raise StompError(
                "Message rejected by the broker",
                f"The broker could not route the retry copy of the NACKed message to any queue "
                f"through {publish.exchange or publish.routing_key!r}; the message stays on its queue\n",
            )

    def close(self) -> None:
        self._kept.clear()
        self._account.close()


def _copy_properties(delivery: Delivery) -> MessageProperties:
    """The copy's properties: the original's without a per-message ``expiration`` (the delay
    queue's TTL is the delay; the original's own would cut it short)."""
    properties = delivery.properties
    if properties.expiration is None:
        return properties
    return replace(properties, expiration=None)
