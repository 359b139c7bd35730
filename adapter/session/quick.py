"""The two quick paths of the message flow: the common SEND and the common ACK, each as one
plain call that reads the parts' state directly.

Pure.  Owns nothing: it holds references to what the parts own, bound once per session (a call
into a part per message is the cost these paths exist to avoid), and the ack header of the
connection's STOMP version, which login sets.  The session binds the two paths while it is logged
in (``CONNECTED``) and ``declined`` otherwise, so they hold no reference back to it: a closed
session is freed by reference counting, not left to the cyclic garbage collector.  Whatever a
quick path declines (None) goes the general way (``Session.handle_frame``), which reports errors
in the plugin's order; the quick paths agree with it because tests/unit/test_session.py says so
frame by frame.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import StompError
from ..mapping.operations import BasicAck, BasicPublish
from ..stomp.frame import Frame
from .subscriptions import parse_ack_id

if TYPE_CHECKING:
    from .parts import Parts


def declined(frame: Frame) -> None:
    """Either quick path while the session is not logged in: the general way."""
    return None


class QuickPaths:
    """``send`` and ``ack`` of one session (the session binds them as its ``quick_send`` and
    ``quick_ack`` while it is logged in)."""

    __slots__ = (
        "_by_tag",
        "_confirms",
        "_count_publish",
        "_general_send_headers",
        "_quick_settle",
        "_retries",
        "_send_properties",
        "_send_targets",
        "_temp_queues",
        "ack_header",
    )

    def __init__(self, parts: Parts) -> None:
        rules, targets = parts.rules, parts.targets
        self._send_targets = targets.send_targets
        self._temp_queues = targets.temp_queues
        self._general_send_headers = rules.general_send_headers
        self._send_properties = rules.send_properties
        self._confirms = parts.confirms
        self._count_publish = parts.confirms.count
        self._by_tag = parts.by_tag
        self._retries = parts.retries
        # the extension's per-message hook, None for the default profile
        self._quick_settle = parts.extension.quick_settle_hook()
        self.ack_header = "message-id"  # "id" once a STOMP 1.2 connection has logged in

    def send(self, frame: Frame) -> BasicPublish | None:
        """The common SEND in one plain call, or None: then ``handle_frame`` handles it as usual.

        A SEND whose destination this connection has already published to (so it is parsed,
        valid and declared), outside a transaction, with no ``reply-to`` or one to an existing
        temp queue, and with a ``receipt`` only once confirms are on, needs exactly one publish.
        This path gives the same result as ``handle_frame`` without the generator machinery,
        which costs about a quarter of the adapter's per-SEND time (bench/micro.py).  Anything
        else, errors included, goes the general way (``Publishing.send``), which reports them
        in the plugin's order.
        """
        headers = frame.headers
        destination = headers.get("destination", "")
        target = self._send_targets.get(destination)
        if target is None or "transaction" in headers or "message-id" in headers:
            return None
        if not self._general_send_headers.isdisjoint(headers):
            # x- arguments are checked on every SEND, a declare-exchange may ask for a declare;
            # activemq: a scheduled SEND is planned there
            return None
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

    def ack(self, frame: Frame) -> BasicAck | None:
        """An ACK outside a transaction and without a receipt, for a message of a current
        subscription, as one plain call; None sends it the general way (see ``send``).
        The ack id is read by the general path's parser: any error declines."""
        headers = frame.headers
        if "transaction" in headers or "receipt" in headers:
            return None
        header = self.ack_header
        value = headers.get(header)
        if value is None:
            return None
        try:
            subscription, delivery_tag = parse_ack_id(value, self._by_tag, "ACK", header)
        except StompError:
            return None
        if subscription.shared or subscription.retry is not None:
            # the general path refuses it (adapter.shared_subscriptions), or settles what the
            # retries keep (x-retry-delays)
            return None
        # 'client' acks are cumulative: AMQP multiple=true (docs/behaviour.md#receipts)
        multiple = subscription.ack_mode == "client"
        if multiple and self._retries.holding:
            return None  # it settles kept retry deliveries too: the general path sweeps them
        settle = self._quick_settle
        if settle is not None and not settle(subscription, delivery_tag, multiple):
            return None
        return BasicAck(delivery_tag, multiple)
