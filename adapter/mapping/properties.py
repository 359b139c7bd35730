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

from .destinations import ProcessingError, plugin_integer


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
NOT_IN_HEADERS_TABLE = frozenset({*_TEXT_PROPERTIES, "persistent", "priority", "timestamp", "destination"})

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
