"""STOMP headers <-> AMQP 0-9-1 basic properties and headers table.

Owns the translation in both directions (docs/destinations.md#send--amqp for SEND,
docs/destinations.md#amqp--message for MESSAGE) and the text
form of AMQP field values that STOMP cannot carry natively.  Pure: imports neither asyncio,
aio-pika, pamqp nor pydantic.
"""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Mapping
from dataclasses import dataclass

from .destinations import ProcessingError, message_reply_to, plugin_integer


@dataclass(slots=True)
class MessageProperties:
    """The AMQP ``basic`` content properties, in wire order.  ``None`` means absent."""

    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, object] | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None  # seconds since the epoch
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


# STOMP header -> attribute, for the headers that become AMQP properties (docs/destinations.md#send--amqp).
# Everything else, protocol headers included, goes into the headers table (docs/destinations.md#send--amqp).
_TEXT_PROPERTIES = {
    "content-type": "content_type",
    "content-encoding": "content_encoding",
    "correlation-id": "correlation_id",
    "reply-to": "reply_to",
    "expiration": "expiration",
    "amqp-message-id": "message_id",
    "type": "type",
    "user-id": "user_id",
    "app-id": "app_id",
}

# STOMP frame-control headers that the plugin copies into the AMQP headers table
# (docs/destinations.md#send--amqp)
# although they describe the SEND frame, not the message.  We leave them out: a consumer should
# not receive the publisher's receipt id or transaction name.  Listed in docs/compatibility.md.
FRAME_CONTROL_HEADERS = frozenset({"receipt", "transaction", "content-length"})


def _integer(name: str, value: str) -> int:
    number = plugin_integer(value, strip=True)
    if number is None:
        raise ProcessingError(f"Header '{name}' must be an integer, got {value!r}")
    return number


def properties_from_send(headers: Mapping[str, str], reply_to: str | None) -> MessageProperties:
    """Build the publish properties for a SEND frame's headers.

    ``reply_to`` is the already-resolved reply address (a temp-queue reference replaced by the
    real queue name, docs/destinations.md#temporary-queues), or None to use the header as given.
    """
    props = MessageProperties()
    table: dict[str, object] = {}
    for name, value in headers.items():
        attribute = _TEXT_PROPERTIES.get(name)
        if attribute is not None:
            setattr(props, attribute, value)
        elif name == "persistent":
            # only true/True means persistent; anything else leaves delivery-mode absent
            # (docs/destinations.md#send--amqp)
            if value in ("true", "True"):
                props.delivery_mode = 2
        elif name == "priority":
            props.priority = _integer(name, value)
            if not 0 <= props.priority <= 255:
                raise ProcessingError(f"Header 'priority' must be between 0 and 255, got {value!r}")
        elif name == "timestamp":
            props.timestamp = _integer(name, value)
            if not 0 <= props.timestamp < 2**64:
                raise ProcessingError(f"Header 'timestamp' is out of range: {value!r}")
        elif name == "destination" or name in FRAME_CONTROL_HEADERS:
            continue
        else:
            table[name] = value
    if reply_to is not None:
        props.reply_to = reply_to
    # The plugin's parser prepends each header, so its table lists them in reverse frame order
    # (docs/destinations.md#send--amqp); RabbitMQ keeps the order it is given, so consumers see that order.
    props.headers = dict(reversed(table.items())) if len(table) > 1 else table
    return props


_PERSISTENT_TEXT = {2: "true"}

# The MESSAGE headers the AMQP properties become, in the order message_headers gives them
PROPERTY_HEADERS = (
    "app-id",
    "user-id",
    "type",
    "timestamp",
    "amqp-message-id",
    "expiration",
    "reply-to",
    "correlation-id",
    "priority",
    "persistent",
    "content-encoding",
    "content-type",
)


def message_headers(p: MessageProperties) -> list[tuple[str, str]]:
    """The MESSAGE headers a delivery's properties become, as unescaped (name, value) pairs in
    the plugin's order (docs/destinations.md#message-header-order): the headers table in the
    order the broker delivered it, then the AMQP properties in the plugin's fixed order (item 7).

    The one source of these headers: ``Session.on_delivery`` escapes and writes each pair, the
    Spark reader (adapter/spark/messages.py) puts them in its rows.  Not included: the headers
    the session adds around them (``subscription``, ``destination``, ``message-id``,
    ``redelivered``, ``ack`` before; ``content-length`` after).  A ``content-length`` in the
    headers table is left out: it would describe a frame that no longer exists.
    """
    pairs: list[tuple[str, str]] = []
    table = p.headers
    if table:
        for name, value in table.items():
            if name != "content-length":
                pairs.append((name, value if type(value) is str else field_value_text(value)))
    if p.app_id is not None:
        pairs.append(("app-id", p.app_id))
    if p.user_id is not None:
        pairs.append(("user-id", p.user_id))
    if p.type is not None:
        pairs.append(("type", p.type))
    if p.timestamp is not None:
        pairs.append(("timestamp", str(p.timestamp)))
    if p.message_id is not None:
        pairs.append(("amqp-message-id", p.message_id))
    if p.expiration is not None:
        pairs.append(("expiration", p.expiration))
    if p.reply_to is not None:
        pairs.append(("reply-to", message_reply_to(p.reply_to) or ""))
    if p.correlation_id is not None:
        pairs.append(("correlation-id", p.correlation_id))
    if p.priority is not None:
        pairs.append(("priority", str(p.priority)))
    if p.delivery_mode is not None:
        pairs.append(("persistent", _PERSISTENT_TEXT.get(p.delivery_mode) or str(p.delivery_mode)))
    if p.content_encoding is not None:
        pairs.append(("content-encoding", p.content_encoding))
    if p.content_type is not None:
        pairs.append(("content-type", p.content_type))
    return pairs


def field_value_text(value: object) -> str:
    """Text form of an AMQP field-table value on a MESSAGE frame (docs/compatibility.md).

    The plugin keeps only long strings and 32/64-bit integers and silently drops the rest; we
    render every type: integers in decimal, booleans as ``true``/``false``, floats and decimals
    with Python's ``str`` (exponent form for very large or small values), timestamps as
    integer seconds since the epoch, void as the empty string, byte arrays as their bytes, and
    nested tables and arrays as JSON.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "surrogateescape")
    if isinstance(value, float | decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.datetime):
        return str(int(value.replace(tzinfo=value.tzinfo or datetime.UTC).timestamp()))
    if value is None:
        return ""
    return json.dumps(_jsonable(value), separators=(",", ":"), ensure_ascii=False)


def _jsonable(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool | int | float) or value is None:
        return value
    return field_value_text(value)
