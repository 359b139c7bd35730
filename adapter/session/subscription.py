"""One subscription's data, and the types the subscription parts and the profile extension share.

Its own module so that ``subscriptions.py`` (SUBSCRIBE, ACK, NACK), ``extension.py`` and
``frames.py`` can name a ``Subscription`` without importing each other (tests/unit/test_layers.py
fails on import cycles, ``TYPE_CHECKING`` ones included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from ..mapping.destinations import Destination
from ..mapping.operations import Delivery
from ..mapping.selector import Selector

__all__ = ["ACK_MODES", "AckMode", "DeliveryHook", "RetryPlan", "Subscription"]

AckMode = Literal["auto", "client", "client-individual"]
ACK_MODES: tuple[AckMode, ...] = ("auto", "client", "client-individual")


class DeliveryHook(Protocol):
    """What a profile extension does with the deliveries of a subscription it watches
    (``Subscription.hook``; adapter/session/extension.py).  A subscription of the default
    profile has no hook, so its deliveries pay one ``is None`` test for it."""

    def withholds(self, subscription: Subscription, delivery: Delivery) -> bool:
        """Whether a delivery from the broker is not rendered (a selector does not match it, or
        the queue's dispatcher decides who gets it)."""
        ...

    def rendered(self, subscription: Subscription, delivery: Delivery, dispatched: bool) -> None:
        """A MESSAGE was rendered for it (``dispatched``: handed over by a dispatcher); may raise
        ``BudgetExceeded`` when the delivery must be kept and does not fit."""
        ...


@dataclass(frozen=True, slots=True)
class RetryPlan:
    """A subscription's retries (SUBSCRIBE ``x-retry-delays``, adapter/session/retries.py): the
    delays in milliseconds, the queue its messages return to, and the exchange that gets them
    after the last delay (None: the queue's own dead-lettering)."""

    delays: tuple[int, ...]
    queue: str
    dead_letter_exchange: str | None


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
    # process's dispatcher of that queue (adapter/dispatch/rules.py); its selector is there
    dispatched: bool = False
    # adapter.shared_subscriptions: a member of the process's shared subscription of its
    # destination (adapter/sharing/rules.py), not a consumer on this session's channel
    shared: bool = False
    # the profile extension watching its deliveries (or the session's retries), or None
    hook: DeliveryHook | None = None
    # SUBSCRIBE x-retry-delays: what its NACKs do (adapter/session/retries.py), else None
    retry: RetryPlan | None = None
    # its deliveries came from a stream (they carry x-stream-offset): RabbitMQ answers a NACK
    # of one with a connection error, so the session answers it itself (subscriptions.py)
    stream: bool = False
    # filled on the first delivery, reused for every MESSAGE: the command and subscription
    # lines, and the escaped message-id up to its delivery tag
    message_head: str = ""
    message_id_prefix: str = ""
