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
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, overload

from ..codegen import generate_function
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


WireType = Literal["shortstr", "table", "octet", "timestamp"]


@dataclass(frozen=True, slots=True)
class BasicProperty:
    """One AMQP ``basic`` content property: where it sits on the wire and which STOMP header it is."""

    attribute: str  # the MessageProperties field
    flag: int  # its bit in the content header's property flags
    wire_type: WireType
    header: str | None  # the STOMP header on SEND and on MESSAGE; None: not mapped
    published: bool = True  # False: read from deliveries, never written on a publish


# The one table of the basic properties, in wire order (AMQP 0-9-1, class basic).  It drives the
# content-header encoder and decoder (adapter/amqp/wire.py generates both from it), the SEND
# mapping below and the MESSAGE rendering (``message_headers``, generated from it too).  The
# headers table has no STOMP header of its own: each of its entries is one.  cluster-id is
# deprecated ("must be empty" on a publish, AMQP 0-9-1) and has no STOMP header: it is decoded,
# never published nor rendered.
BASIC_PROPERTIES: Final = (
    BasicProperty("content_type", 0x8000, "shortstr", "content-type"),
    BasicProperty("content_encoding", 0x4000, "shortstr", "content-encoding"),
    BasicProperty("headers", 0x2000, "table", None),
    BasicProperty("delivery_mode", 0x1000, "octet", "persistent"),
    BasicProperty("priority", 0x0800, "octet", "priority"),
    BasicProperty("correlation_id", 0x0400, "shortstr", "correlation-id"),
    BasicProperty("reply_to", 0x0200, "shortstr", "reply-to"),
    BasicProperty("expiration", 0x0100, "shortstr", "expiration"),
    BasicProperty("message_id", 0x0080, "shortstr", "amqp-message-id"),
    BasicProperty("timestamp", 0x0040, "timestamp", "timestamp"),
    BasicProperty("type", 0x0020, "shortstr", "type"),
    BasicProperty("user_id", 0x0010, "shortstr", "user-id"),
    BasicProperty("app_id", 0x0008, "shortstr", "app-id"),
    BasicProperty("cluster_id", 0x0004, "shortstr", None, published=False),
)

# STOMP header -> attribute, for the text headers that become AMQP properties
# (docs/destinations.md#send--amqp).  ``persistent``, ``priority`` and ``timestamp`` are parsed
# in properties_from_send; everything else, protocol headers included, goes into the headers table.
_TEXT_PROPERTIES: Final = {
    prop.header: prop.attribute
    for prop in BASIC_PROPERTIES
    if prop.wire_type == "shortstr" and prop.header is not None
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

# The MESSAGE headers the AMQP properties become, in the order message_headers gives them: the
# plugin's fixed order, which is the wire order reversed (docs/destinations.md#message-header-order)
_RENDERED: Final = tuple(prop for prop in reversed(BASIC_PROPERTIES) if prop.header is not None)
PROPERTY_HEADERS: Final = tuple(prop.header for prop in _RENDERED if prop.header is not None)

# How a property's value becomes header text: by attribute where the rule is the property's own,
# else by wire type
_RENDER_BY_ATTRIBUTE: Final = {
    "reply_to": 'message_reply_to(value) or ""',
    "delivery_mode": "_PERSISTENT_TEXT.get(value) or str(value)",
}
_RENDER_BY_WIRE_TYPE: Final = {"shortstr": "value", "octet": "str(value)", "timestamp": "str(value)"}


def _render_text(prop: BasicProperty) -> str:
    """The expression (over ``value``) that renders one property as header text."""
    return _RENDER_BY_ATTRIBUTE.get(prop.attribute) or _RENDER_BY_WIRE_TYPE[prop.wire_type]


def _message_headers_source() -> str:
    lines = [
        "def message_headers(p):",
        "    pairs = []",
        "    table = p.headers",
        "    if table:",
        "        for name, value in table.items():",
        '            if name != "content-length":',
        "                if type(value) is not str:",
        # an integer (a stream's x-stream-offset on every delivery) without the call
        "                    value = str(value) if type(value) is int else field_value_text(value)",
        "                pairs.append((name, value))",
    ]
    for prop in _RENDERED:
        text = _render_text(prop)
        lines += [
            f"    value = p.{prop.attribute}",
            "    if value is not None:",
            f"        pairs.append(({prop.header!r}, {text}))",
        ]
    lines.append("    return pairs")
    return "\n".join(lines) + "\n"


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


# The MESSAGE headers a delivery's properties become (generated here, after field_value_text)
message_headers: Callable[[MessageProperties], list[tuple[str, str]]] = generate_function(
    "message_headers",
    _message_headers_source(),
    {
        "field_value_text": field_value_text,
        "message_reply_to": message_reply_to,
        "_PERSISTENT_TEXT": _PERSISTENT_TEXT,
    },
)
message_headers.__doc__ = """The MESSAGE headers a delivery's properties become, as unescaped (name,
value) pairs in the plugin's order (docs/destinations.md#message-header-order): the headers table in
the order the broker delivered it, then the AMQP properties in the plugin's fixed order (item 7),
by the code ``_message_headers_source`` generates from ``BASIC_PROPERTIES``.

The one source of these headers: ``Session.on_delivery`` escapes and writes each pair, the Spark
reader (adapter/spark/messages.py) puts them in its rows.  Not included: the headers the session
adds around them (``subscription``, ``destination``, ``message-id``, ``redelivered``, ``ack``
before; ``content-length`` after).  A ``content-length`` in the headers table is left out: it would
describe a frame that no longer exists."""


class DecimalTexts(Sequence[str]):
    """The decimal text of each of ``integers`` (``str(integer)``), made only where one is read:
    a column of ``message_header_columns`` that its reader may render all at once (the Spark
    reader has Arrow do it, adapter/spark/source.py), as a stream's ``x-stream-offset``."""

    __slots__ = ("integers",)

    def __init__(self, integers: list[int]) -> None:
        self.integers = integers

    def __len__(self) -> int:
        return len(self.integers)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return list(map(str, self.integers[index]))
        return str(self.integers[index])

    def __iter__(self) -> Iterator[str]:
        return map(str, self.integers)

    def __repr__(self) -> str:
        return f"DecimalTexts({self.integers!r})"


def _message_header_columns_source() -> str:
    # message_headers for a list of messages at once, a column at a time; the value rules are
    # message_headers' own (_RENDER_BY_*, the table's below), applied once to a value every
    # message shares
    table_text = (
        "value if type(value) is str else str(value) if type(value) is int else field_value_text(value)"
    )
    lines = [
        "def message_header_columns(ps):",
        "    n = len(ps)",
        "    columns = []",
        "    if not n:",
        "        return columns",
        "    tables = [p.headers for p in ps]",
        "    try:",
        "        sizes = list(map(len, tables))",
        "    except TypeError:  # a message without a headers table",
        "        sizes = [len(table) if table else 0 for table in tables]",
        "    size = sizes[0]",
        "    if sizes.count(size) != n:",
        "        return None",
        "    if size:",
        "        names = tuple(tables[0])",
        "        if size > 1 and list(map(tuple, tables)).count(names) != n:",
        "            return None  # other names, or the same in another order",
        "        for name in names:",
        '            if name != "content-length":',
        "                try:",
        "                    values = list(map(itemgetter(name), tables))",
        "                except KeyError:",
        "                    return None",
        "                kinds = set(map(type, values))",
        "                if kinds == _INT:",
        "                    values = DecimalTexts(values)",
        "                elif kinds != _STR:",
        f"                    values = [{table_text} for value in values]",
        "                columns.append((name, values))",
        # the properties: first whether every message has the same values (one pass)
        "    rows = [(" + ", ".join(f"p.{prop.attribute}" for prop in _RENDERED) + ") for p in ps]",
        "    if rows.count(rows[0]) == n:",
        "        p = ps[0]",
    ]
    for prop in _RENDERED:
        text = _render_text(prop)
        lines += [
            f"        value = p.{prop.attribute}",
            "        if value is not None:",
            f"            columns.append(({prop.header!r}, [{text}] * n))",
        ]
    lines.append("        return columns")
    for prop in _RENDERED:
        text = _render_text(prop)
        lines += [
            f"    values = [p.{prop.attribute} for p in ps]",
            "    absent = values.count(None)",
            "    if absent != n:",
            "        if absent:",
            "            return None",
        ]
        if text == "value":
            lines.append(f"        columns.append(({prop.header!r}, values))")
        else:
            lines += [
                "        value = values[0]",
                "        if values.count(value) == n:",
                f"            columns.append(({prop.header!r}, [{text}] * n))",
                "        else:",
                f"            columns.append(({prop.header!r}, [{text} for value in values]))",
            ]
    lines.append("    return columns")
    return "\n".join(lines) + "\n"


message_header_columns: Callable[[Sequence[MessageProperties]], list[tuple[str, Sequence[str]]] | None] = (
    generate_function(
        "message_header_columns",
        _message_header_columns_source(),
        {
            "field_value_text": field_value_text,
            "message_reply_to": message_reply_to,
            "itemgetter": operator.itemgetter,
            "_PERSISTENT_TEXT": _PERSISTENT_TEXT,
            "DecimalTexts": DecimalTexts,
            "_INT": frozenset({int}),
            "_STR": frozenset({str}),
        },
    )
)
message_header_columns.__doc__ = """``message_headers`` of many messages whose headers have the same
names in the same order (the messages of one stream, typically), column-wise: one (name, values)
pair per header, in ``message_headers``' order, ``values[i]`` the header's value for message i, so
that ``[(name, values[i]) for name, values in columns] == message_headers(ps[i])`` for every i (a
headers-table entry that is an integer in every message is a ``DecimalTexts``, each text made
where it is read).
None where the messages' headers differ in names or order (a property some have and some have
not, headers tables with other names): ``message_headers`` one message at a time is the way then.

A column at a time costs the Spark reader (adapter/spark/messages.py) a fraction of a call per
message, and a value every message shares is rendered once (tests/unit/test_message_headers.py
checks it against ``message_headers``)."""

# ---------------------------------------------------------------------------------------------
# Redelivery counts (docs/destinations.md#redelivery-counts)
# ---------------------------------------------------------------------------------------------

DELIVERY_COUNT_HEADER: Final = "x-delivery-count"
DEATH_COUNT_HEADER: Final = "x-death-count"
DEATH_HISTORY_HEADER: Final = "x-death-history"
# the delay queues of NACK retries (adapter/session/retries.py): a message back from one was
# delivered and NACKed once more
RETRY_QUEUE_PREFIX: Final = "stomp-retry."


def delivery_count(table: Mapping[str, object]) -> int | None:
    """How many times the message was delivered before, where the broker says so: a quorum
    queue's ``x-acquired-count`` (RabbitMQ 4.x: every earlier delivery) or, before 4.0, its
    ``x-delivery-count`` (the same count); else the ``x-death`` entries of a message that came
    back through dead-lettering after consumers rejected it (their ``rejected`` counts) or back
    from a NACK retry's delay queue.  None
    where nothing counts (a classic queue's redelivery has only ``redelivered:true``)."""
    for name in ("x-acquired-count", DELIVERY_COUNT_HEADER):
        value = table.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    returned = sum(
        count
        for queue, reason, count in death_history(table)
        if reason == "rejected" or queue.startswith(RETRY_QUEUE_PREFIX)
    )
    return returned or None


def death_history(table: Mapping[str, object]) -> list[tuple[str, str, int]]:
    """The ``x-death`` entries as (queue, reason, count), most recent first (RabbitMQ's order);
    entries that are not tables of the broker's shape are skipped."""
    deaths = table.get("x-death")
    if not isinstance(deaths, list):
        return []
    history = []
    for death in deaths:
        if not isinstance(death, Mapping):
            continue
        queue, reason, count = death.get("queue"), death.get("reason"), death.get("count")
        if isinstance(queue, bytes):
            queue = queue.decode("utf-8", "surrogateescape")
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "surrogateescape")
        if isinstance(queue, str) and isinstance(reason, str) and isinstance(count, int):
            history.append((queue, reason, count))
    return history


def redelivery_headers(table: Mapping[str, object], pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``pairs`` (``message_headers``) with the redelivery count and a readable ``x-death``:
    ``x-delivery-count`` first unless the broker's own header says the same (replacing it where
    it does not: on 4.x it counts only failed deliveries), then, for a dead-lettered message,
    ``x-death-count`` (every dead-lettering, all queues and reasons) and ``x-death-history``
    (``queue reason xcount`` entries, most recent first, comma-separated).  Called only for a
    redelivered message or one with ``x-death``: the others pay nothing."""
    count = delivery_count(table)
    history = death_history(table)
    if count is None and not history:
        return pairs
    added: list[tuple[str, str]] = []
    if count is not None and table.get(DELIVERY_COUNT_HEADER) != count:
        # (before 4.0 the broker's own header is this count already: left where it is, as the
        # plugin renders it)
        added.append((DELIVERY_COUNT_HEADER, str(count)))
    if history:
        added.append((DEATH_COUNT_HEADER, str(sum(entry[2] for entry in history))))
        added.append(
            (DEATH_HISTORY_HEADER, ", ".join(f"{queue} {reason} x{n}" for queue, reason, n in history))
        )
    names = {name for name, _ in added}
    return added + [pair for pair in pairs if pair[0] not in names]
