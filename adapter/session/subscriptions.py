"""A session's subscriptions: what one is, and the one parser of the ack ids that name its messages.

Pure.  ``parse_ack_id`` serves both the general ACK/NACK path and the quick ACK path
(``Session.quick_ack``), so the two can only differ in when they decline, never in what an ack
id means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from ..mapping.destinations import Destination, DestinationError, ProcessingError, plugin_integer
from ..mapping.operations import Delivery
from ..mapping.selector import Selector

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
    # the profile extension watching its deliveries, or None (every default-profile subscription)
    hook: DeliveryHook | None = None
    # filled on the first delivery, reused for every MESSAGE: the command and subscription
    # lines, and the escaped message-id up to its delivery tag
    message_head: str = ""
    message_id_prefix: str = ""


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
    # ASCII digits first: the common case, and a subset of plugin_integer's rule
    delivery_tag = int(number) if number.isascii() and number.isdigit() else plugin_integer(number)
    if delivery_tag is None:
        raise ProcessingError(f"Bad delivery tag in {header} {value!r}")
    if not 0 <= delivery_tag < 18446744073709551616:  # 2**64: AMQP delivery tags are 64-bit
        raise ProcessingError(f"Delivery tag out of range in {header} {value!r}")
    return subscription, delivery_tag
