"""The hooks through which a behaviour profile changes what a session does, and the null profile.

Pure.  The profile's *rules* (adapter/mapping/profile.py) answer questions (which queue to
declare, which prefetch, which selector); an *extension* holds the state a profile adds to a
connection and acts at fixed points of the session, like wsproto's extensions plug into its
connection:

* subscribe: ``dispatches`` / ``subscribe_dispatched`` (a subscription served by a queue's
  dispatcher), ``subscribe_temporary`` (SUBSCRIBE to a temporary destination), and
  ``delivery_hook`` (the ``DeliveryHook`` a new subscription's deliveries go through, or None);
* send: ``scheduled`` (a SEND delivered later: its publishes through a delay queue);
* delivery: the ``DeliveryHook`` (adapter/session/subscriptions.py), called by
  ``Frames.render_message`` only for subscriptions that have one;
* settle: ``settle`` (ACK/NACK on the general path), ``quick_settle_hook`` (the quick ACK path),
  ``committed`` (a settle replayed at COMMIT), ``cancelled`` (a subscription ended);
* confirm: ``confirm_hook`` (publisher confirms of the extension's own publishes) and
  ``confirms_outstanding``;
* close: ``close``.

``ProfileExtension`` is the rabbitmq profile: it does nothing, and its per-message hooks are
None, so the default profile's per-message path tests one None and calls nothing.  The session
never asks which profile it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..mapping.destinations import Destination, DestinationKind
from ..mapping.operations import BasicPublish, Operation
from ..mapping.selector import Selector
from ..stomp.frame import Frame
from .settings import Steps
from .subscription import AckMode, DeliveryHook, Subscription

# the quick ACK path's hook: (subscription, delivery tag, multiple) -> whether it may go on
QuickSettle = Callable[[Subscription, int, bool], bool]
# publisher confirms: (delivery tag, multiple, ack)
ConfirmHook = Callable[[int, bool, bool], None]


class ProfileExtension:
    """The null extension (the rabbitmq profile): every hook leaves the session's way alone."""

    # ------------------------------------------------------------------ subscribe
    def delivery_hook(self, ack_mode: AckMode, selector: Selector | None) -> DeliveryHook | None:
        """The hook of a new subscription's deliveries; None: rendered as they come."""
        return None

    def dispatches(
        self, dest: Destination, queue: str, selector: Selector | None, headers: Mapping[str, str]
    ) -> bool:
        """Whether a queue subscription is served through the queue's dispatcher."""
        return False

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
        raise AssertionError("no dispatchers in this profile")

    def subscribe_temporary(
        self, frame: Frame, dest: Destination, tag: str, prefetch_count: int | None, ack_mode: AckMode
    ) -> Steps:
        raise AssertionError("the rules refuse SUBSCRIBE to a temporary destination in this profile")

    def temporaries(self, kind: DestinationKind) -> dict[str, str]:
        """The private queues of a kind of temporary destination the rules let a reply-to name
        beyond /temp-queue/ (by name)."""
        raise AssertionError(f"no {kind} in this profile")

    # ------------------------------------------------------------------ send
    def scheduled(
        self, headers: Mapping[str, str], publishes: list[BasicPublish]
    ) -> tuple[list[Operation], list[BasicPublish]] | None:
        """A SEND the profile delivers later: the operations to run before its publishes and
        the publishes to make instead; None: published as they are."""
        return None

    # ------------------------------------------------------------------ settle
    def quick_settle_hook(self) -> QuickSettle | None:
        return None

    def settle(
        self,
        frame: Frame,
        subscription: Subscription,
        delivery_tag: int,
        multiple: bool,
        nack: bool,
        transaction: str | None,
    ) -> Steps | None:
        """The steps of an ACK/NACK the profile handles itself, or None: the session's way."""
        return None

    def committed(self, op: Operation) -> None:
        """A buffered non-publish operation is replayed at COMMIT."""

    def cancelled(self, subscription: Subscription) -> list[Operation]:
        """A subscription ended (UNSUBSCRIBE, or the broker cancelled it): the operations that
        go before its basic.cancel."""
        return []

    # ------------------------------------------------------------------ confirm
    def confirm_hook(self) -> ConfirmHook | None:
        return None

    @property
    def confirms_outstanding(self) -> bool:
        return False

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """The connection is gone, whatever closed it."""
