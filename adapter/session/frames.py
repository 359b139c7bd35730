"""The frames a session sends: MESSAGE rendering, RECEIPT, ERROR and CONNECTED, and their counts.

Pure.  ``Frames.deliver`` is the per-delivery path (``Session.on_delivery`` is this method,
bound once): it looks up the subscription, lets its profile hook (if any) withhold the message,
and renders the MESSAGE from a head cached per subscription (docs/destinations.md#amqp--message).
The counters (MESSAGE frames rendered, other frames by command, ERROR frames by message) are read
by the metrics (adapter/server/stats.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..mapping.budget import BudgetExceeded
from ..mapping.destinations import message_destination
from ..mapping.operations import Delivery, SendFrame
from ..mapping.properties import PROPERTY_HEADERS, message_headers, redelivery_headers
from ..sharing.rules import member_head
from ..stomp.codec import encode_frame, escape
from ..stomp.frame import SUPPORTED_VERSIONS, Command, Frame
from .settings import Steps
from .targets import remember

if TYPE_CHECKING:
    from .subscription import Subscription


_WITHHELD = (b"", b"", b"")


class Frames:
    __slots__ = (
        "_subscriptions",
        "_session_id",
        "_trailing_lf",
        "_trailer",
        "_destinations",
        "ack_lines",
        "messages_sent",
        "frames_sent",
        "errors_sent",
        "on_receipt",
    )

    def __init__(self, subscriptions: dict[str, Subscription], session_id: str, trailing_lf: bool) -> None:
        self._subscriptions = subscriptions  # the session's, shared
        self._session_id = session_id
        self._trailing_lf = trailing_lf
        self._trailer = b"\0\n" if trailing_lf else b"\0"
        # (exchange, routing key) -> the escaped destination header of its MESSAGEs
        self._destinations: dict[tuple[str, str], str] = {}
        # STOMP 1.2: a MESSAGE of a client-ack subscription carries an ack header; set at login
        self.ack_lines = False
        self.messages_sent = 0
        self.frames_sent: dict[str, int] = {}
        self.errors_sent: dict[str, int] = {}
        # told the receipt-id of each RECEIPT as it is rendered (the shell times receipts)
        self.on_receipt: Callable[[str], None] | None = None

    # ------------------------------------------------------------------ MESSAGE
    def render_message(self, delivery: Delivery, dispatched: bool = False) -> bytes:
        """Render one AMQP delivery as a MESSAGE frame (docs/destinations.md#amqp--message);
        ``dispatched``: a queue dispatcher hands it over (its consumer tag and message number in
        place of the AMQP ones), so the hook does not withhold it again."""
        return b"".join(self.message_pieces(delivery, dispatched))

    def message_pieces(self, delivery: Delivery, dispatched: bool = False) -> tuple[bytes, bytes, bytes]:
        """``render_message`` not joined: the MESSAGE's head (up to its blank line), its body
        (the delivery's own ``bytes``, not copied) and its NUL (and EOL), so that a large body
        can go to the socket without being copied into a frame; ``(b"", b"", b"")`` for a
        withheld delivery; an ERROR frame whole in the head, for a subscription that is gone."""
        consumer_tag, delivery_tag, redelivered, exchange, routing_key, properties, body = delivery
        subscription = self._subscriptions.get(consumer_tag)
        if subscription is None:
            missing = self.error(
                "Subscription not found",
                f"There is no current subscription with tag '{consumer_tag}'.",
            )
            return missing, b"", b""
        hook = subscription.hook
        if hook is not None and not dispatched and hook.withholds(subscription, delivery):
            return _WITHHELD  # the shell settles it or hands it to the dispatcher (dropped_delivery_ack)
        destination = self._destinations.get((exchange, routing_key))
        if destination is None:
            destination = escape(message_destination(exchange, routing_key))
            remember(self._destinations, (exchange, routing_key), destination)
        head = subscription.message_head
        if not head:
            head = "MESSAGE\n"
            if subscription.id is not None:
                head += f"subscription:{escape(subscription.id)}\n"
            subscription.message_head = head
            # digits never need escaping, so the prefix can be escaped once
            subscription.message_id_prefix = escape(f"{consumer_tag}@@{self._session_id}@@")
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
        if self.ack_lines and subscription.ack_mode != "auto":
            lines.append(f"ack:{message_id}\n")
        # the headers the message carries, from the one function that knows their order
        pairs = message_headers(properties)
        table = properties.headers
        if table:
            if redelivered or "x-death" in table:
                pairs = redelivery_headers(table, pairs)  # x-delivery-count (docs/destinations.md)
            if not subscription.stream and "x-stream-offset" in table:
                subscription.stream = True  # its NACKs never reach the broker (subscriptions.py)
        if pairs:
            escaped_name, append = _ESCAPED_NAMES.get, lines.append
            for name, value in pairs:
                append(f"{escaped_name(name) or _escape_name(name)}:{escape(value)}\n")
        if body:
            lines.append(f"content-length:{len(body)}\n")
        lines.append("\n")
        pieces = ("".join(lines).encode("utf-8", "surrogateescape"), body, self._trailer)
        if hook is not None:
            try:
                hook.rendered(subscription, delivery, dispatched)
            except BudgetExceeded:
                self.messages_sent -= 1  # rendered, never sent: the shell closes the connection
                raise
        return pieces

    def dispatched_message(self, delivery: Delivery) -> bytes:
        """A message the dispatcher gives one of this session's dispatched subscriptions
        (its consumer tag and message number in place of the AMQP ones)."""
        return self.render_message(delivery, True)

    def shared_head(self, sub_id: str | None, consumer_tag: str) -> tuple[bytes, bytes]:
        """A shared subscription's own bytes of every MESSAGE (adapter/sharing/rules.py)."""
        return member_head(sub_id, consumer_tag, self._session_id)

    # ------------------------------------------------------------------ other frames
    def encode(
        self, command: str, headers: Iterable[tuple[str, str]], body: bytes = b"", escape_headers: bool = True
    ) -> bytes:
        sent = self.frames_sent
        sent[command] = sent.get(command, 0) + 1
        return encode_frame(
            command, headers, body, trailing_lf=self._trailing_lf, escape_headers=escape_headers
        )

    def error(
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
        return self.encode(Command.ERROR, headers, detail.encode("utf-8", "surrogateescape"))

    def receipt(self, receipt: str) -> bytes:
        if self.on_receipt is not None:
            self.on_receipt(receipt)
        return self.encode(Command.RECEIPT, [("receipt-id", receipt)])

    def receipt_of(self, frame: Frame) -> Steps:
        """The RECEIPT a client frame asked for, if it did."""
        receipt = frame.headers.get("receipt")
        if receipt is not None:
            yield SendFrame(self.receipt(receipt))

    def confirmed(self, receipts: list[str], ack: bool) -> list[bytes]:
        """The frames for receipts a broker confirm completed, one item per frame (a WebSocket
        client gets each as its own message): RECEIPTs, or for a broker nack (the message may
        not be stored) ERRORs, never RECEIPTs."""
        if ack:
            return [self.receipt(r) for r in receipts]
        return [
            self.error(
                "Message rejected by the broker",
                "The broker refused (basic.nack) the message sent with this receipt; "
                "it may not have been stored.\n",
                receipt=r,
            )
            for r in receipts
        ]


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
