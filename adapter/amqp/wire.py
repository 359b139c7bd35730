"""AMQP 0-9-1 frame encoding for the methods the adapter sends, and decoding of the hot ones.

Why by hand and not through pamqp's command classes: (1) pamqp validates queue and exchange
names against ``[a-zA-Z0-9-_.:]`` and friends, while RabbitMQ and its STOMP plugin accept any
UTF-8 name (``/queue/a%2fb`` declares a queue literally named ``a%2fb``, docs/destinations.md#parsing);
(2) the per-message path (publish, ack, deliver) costs a few microseconds here against tens
through pamqp's generic, attribute-by-attribute marshalling; (3) pamqp decodes strings and
field-table keys as strict UTF-8 and raises on anything else, while RabbitMQ passes any bytes
through (a consumer tag, a header name or a close text that is not UTF-8 is accepted by the
broker and comes back to us).  pamqp stays the oracle of tests/unit/test_wire.py.

Everything the broker sends is untrusted input.  One rule for its text: shortstr, longstr,
table keys and values are decoded with ``errors="surrogateescape"``, so bytes that are not
UTF-8 are kept exactly and come out byte for byte wherever the adapter writes them again
(STOMP headers, AMQP frames); nothing is dropped and nothing raises (docs/compatibility.md).
Bytes that do not form a valid frame or value raise ``DecodeError``; a value the encoder cannot
put into a frame raises ``EncodeError`` (adapter/amqp/errors.py maps it to STOMP).

Pure: no I/O.
"""

from __future__ import annotations

import datetime
import decimal
import struct
from collections.abc import Callable, Mapping
from typing import Final

from ..codegen import generate_function
from ..mapping.properties import BASIC_PROPERTIES, MessageProperties

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = b"\xce"
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"

_frame_head = struct.Struct(">BHI")
_method_id = struct.Struct(">HH")
_u16 = struct.Struct(">H")
_u32 = struct.Struct(">I")
_u64 = struct.Struct(">Q")
_i64 = struct.Struct(">q")
_content_head = struct.Struct(">HHQH")  # class, weight, body size, property flags
_i8 = struct.Struct(">b")
_i16 = struct.Struct(">h")
_i32 = struct.Struct(">i")
_f32 = struct.Struct(">f")
_f64 = struct.Struct(">d")
_decimal_head = struct.Struct(">Bi")
_close_head = struct.Struct(">H")
_tune = struct.Struct(">HIH")

# Nested tables and arrays deeper than this are refused rather than decoded recursively: a
# 128 KiB frame could otherwise nest 26,000 levels and exhaust Python's stack.  RabbitMQ's own
# headers (x-death and friends) nest three levels.
MAX_TABLE_DEPTH = 100


class DecodeError(ValueError):
    """Bytes from the broker that do not form a valid AMQP 0-9-1 frame, method or field value."""


class EncodeError(ValueError):
    """A value AMQP 0-9-1 cannot carry (a short string over 255 bytes, an integer out of the
    range of a long, a timestamp before 1970).  The encoder knows nothing of STOMP: the link maps
    this to the STOMP error the plugin answers with in one place (``errors.stomp_error``)."""


# method ids (class, method)
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CONNECTION_BLOCKED = (10, 60)
CONNECTION_UNBLOCKED = (10, 61)
CONNECTION_UPDATE_SECRET = (10, 70)  # RabbitMQ's extension (3.8 and newer): a new token
CONNECTION_UPDATE_SECRET_OK = (10, 71)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
EXCHANGE_DECLARE = (40, 10)
EXCHANGE_DECLARE_OK = (40, 11)
QUEUE_DECLARE = (50, 10)
QUEUE_DECLARE_OK = (50, 11)
QUEUE_BIND = (50, 20)
QUEUE_BIND_OK = (50, 21)
QUEUE_DELETE = (50, 40)
QUEUE_DELETE_OK = (50, 41)
BASIC_QOS = (60, 10)
BASIC_QOS_OK = (60, 11)
BASIC_CONSUME = (60, 20)
BASIC_CONSUME_OK = (60, 21)
BASIC_CANCEL = (60, 30)
BASIC_CANCEL_OK = (60, 31)
BASIC_PUBLISH = (60, 40)
BASIC_RETURN = (60, 50)
BASIC_DELIVER = (60, 60)
BASIC_GET = (60, 70)
BASIC_GET_OK = (60, 71)
BASIC_GET_EMPTY = (60, 72)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)


NOT_UTF8: Final = (
    "a queue, exchange, routing key, consumer tag or virtual host name is not valid UTF-8; "
    "AMQP 0-9-1 carries it as a UTF-8 short string"
)


def shortstr(value: str) -> bytes:
    """A short string in a method without content (queue.declare, basic.consume, queue.bind,
    exchange.declare ...).  RabbitMQ checks these are UTF-8 and answers anything else with a
    *connection* error (501 ``FRAME_ERROR - Malformed UTF-8 in shortstr``), which would end
    every session a shared connection carries; so text that is not UTF-8 (a client's header
    bytes, kept with surrogateescape) is refused here, an EncodeError for the one session that
    sent it.  What is refused is what every broker refuses: up to 4.2 RabbitMQ also takes
    encoded surrogates (CESU-8, as Java's modified UTF-8 writes characters outside the BMP),
    which pass here; 4.3 refuses those too, and the client core checks them for it
    (``client.refuse_surrogates``).  The value is not quoted: it is a client's, and the message
    goes back to the client."""
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        try:
            raw = value.encode("utf-8", "surrogateescape")
            raw.decode("utf-8", "surrogatepass")  # well-formed but for encoded surrogates
        except UnicodeError:
            raise EncodeError(NOT_UTF8) from None
    if len(raw) > 255:
        raise EncodeError(f"name longer than 255 bytes: {value[:40]!r}...")
    return bytes((len(raw),)) + raw


def any_shortstr(value: str) -> bytes:
    """A short string RabbitMQ passes through without checking its encoding: the exchange and
    routing key of basic.publish (content-bearing methods are not checked, rabbit_common's
    codegen), the basic properties and field-table keys.  Bytes that are not UTF-8 go out as
    they came (surrogateescape), as the broker would send them on."""
    raw = value.encode("utf-8", "surrogateescape")
    if len(raw) > 255:
        raise EncodeError(f"name longer than 255 bytes: {value[:40]!r}...")
    return bytes((len(raw),)) + raw


def longstr(value: str | bytes) -> bytes:
    raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    return _u32.pack(len(raw)) + raw


def field_value(value: object) -> bytes:
    """Encode one field-table value.  Integers are always 64-bit ``l``, as the plugin sends them,
    so that queue arguments compare equal when a plugin-declared queue is redeclared."""
    if isinstance(value, tuple):  # (type, value) from the mapping layer, e.g. stream offsets
        kind, inner = value
        if kind == "timestamp":
            if not 0 <= int(inner) < 2**64:
                raise EncodeError(f"timestamp out of range: {inner}")
            return b"T" + _u64.pack(int(inner))
        if kind == "long":
            return field_value(int(inner))
        if kind == "byte":  # x-priority, as the current plugin sends it
            if not -128 <= int(inner) < 128:
                raise EncodeError(f"integer out of the range of an AMQP byte: {inner}")
            return b"b" + struct.pack(">b", int(inner))
        return b"S" + longstr(str(inner))
    if isinstance(value, list):  # an array (x-stream-filter)
        items = b"".join(field_value(item) for item in value)
        return b"A" + _u32.pack(len(items)) + items
    if isinstance(value, str | bytes):
        return b"S" + longstr(value)
    if isinstance(value, bool):
        return b"t" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise EncodeError(f"integer out of the range of an AMQP long: {value}")
        return b"l" + _i64.pack(value)
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if isinstance(value, datetime.datetime):
        return b"T" + _u64.pack(int(value.timestamp()))
    if isinstance(value, Mapping):
        return b"F" + table(value)
    if value is None:
        return b"V"
    raise TypeError(f"cannot encode {type(value).__name__} in an AMQP table")


def table(values: Mapping[str, object] | None) -> bytes:
    if not values:
        return b"\x00\x00\x00\x00"
    body = b"".join(any_shortstr(k) + field_value(v) for k, v in values.items())
    return _u32.pack(len(body)) + body


def method_frame(channel: int, method: tuple[int, int], payload: bytes = b"") -> bytes:
    body = _method_id.pack(*method) + payload
    return _frame_head.pack(FRAME_METHOD, channel, len(body)) + body + FRAME_END


def bits(*flags: bool) -> bytes:
    value = 0
    for position, flag in enumerate(flags):
        if flag:
            value |= 1 << position
    return bytes((value,))


# --- methods -------------------------------------------------------------------------------------
def connection_start_ok(user: str, password: str, client_properties: Mapping[str, object] | bytes) -> bytes:
    """``client_properties``: a mapping, or the table already encoded (the adapter's are constant
    but for one field, adapter/amqp/connection.py)."""
    response = f"\0{user}\0{password}".encode("utf-8", "surrogateescape")
    encoded = client_properties if isinstance(client_properties, bytes) else table(client_properties)
    payload = encoded + shortstr("PLAIN") + longstr(response) + shortstr("en_US")
    return method_frame(0, CONNECTION_START_OK, payload)


def connection_tune_ok(channel_max: int, frame_max: int, heartbeat: int) -> bytes:
    return method_frame(
        0, CONNECTION_TUNE_OK, _u16.pack(channel_max) + _u32.pack(frame_max) + _u16.pack(heartbeat)
    )


def connection_open(vhost: str) -> bytes:
    return method_frame(0, CONNECTION_OPEN, shortstr(vhost) + shortstr("") + b"\x00")


def connection_close(code: int = 200, text: str = "Goodbye") -> bytes:
    # a reply text is a shortstr the broker checks is UTF-8: cut to 255 bytes on a character
    # boundary, anything that is not UTF-8 replaced, never fail
    raw = text.encode("utf-8", "replace")[:255].decode("utf-8", "ignore").encode("utf-8")
    return method_frame(0, CONNECTION_CLOSE, _u16.pack(code) + bytes((len(raw),)) + raw + b"\0\0\0\0")


def connection_close_ok() -> bytes:
    return method_frame(0, CONNECTION_CLOSE_OK)


def connection_update_secret(secret: bytes, reason: str) -> bytes:
    """RabbitMQ's connection.update-secret: the connection's new credential (an OAuth 2.0
    token) and why, for the broker's log."""
    return method_frame(0, CONNECTION_UPDATE_SECRET, longstr(secret) + shortstr(reason))


def channel_open(channel: int) -> bytes:
    return method_frame(channel, CHANNEL_OPEN, shortstr(""))


def channel_close(channel: int) -> bytes:
    """A normal close by the client (reply 200, no failing method)."""
    return method_frame(channel, CHANNEL_CLOSE, _u16.pack(200) + shortstr("Goodbye") + b"\0\0\0\0")


def channel_close_ok(channel: int) -> bytes:
    return method_frame(channel, CHANNEL_CLOSE_OK)


def confirm_select(channel: int) -> bytes:
    return method_frame(channel, CONFIRM_SELECT, b"\x00")


def exchange_declare(channel: int, exchange: str, kind: str, *, durable: bool, auto_delete: bool) -> bytes:
    """Never passive, internal or nowait; no arguments (adapter/mapping/exchanges.py)."""
    payload = (
        b"\0\0"
        + shortstr(exchange)
        + shortstr(kind)
        + bits(False, durable, auto_delete, False, False)
        + table(None)
    )
    return method_frame(channel, EXCHANGE_DECLARE, payload)


def queue_declare(
    channel: int,
    queue: str,
    *,
    passive: bool = False,
    durable: bool = False,
    exclusive: bool = False,
    auto_delete: bool = False,
    nowait: bool = False,
    arguments: Mapping[str, object] | None = None,
) -> bytes:
    payload = (
        b"\0\0" + shortstr(queue) + bits(passive, durable, exclusive, auto_delete, nowait) + table(arguments)
    )
    return method_frame(channel, QUEUE_DECLARE, payload)


def queue_bind(
    channel: int, queue: str, exchange: str, routing_key: str, arguments: Mapping[str, object] | None = None
) -> bytes:
    payload = (
        b"\0\0" + shortstr(queue) + shortstr(exchange) + shortstr(routing_key) + b"\x00" + table(arguments)
    )
    return method_frame(channel, QUEUE_BIND, payload)


def queue_delete(channel: int, queue: str) -> bytes:
    return method_frame(channel, QUEUE_DELETE, b"\0\0" + shortstr(queue) + b"\x00")


def basic_qos(channel: int, prefetch_count: int) -> bytes:
    return method_frame(channel, BASIC_QOS, _u32.pack(0) + _u16.pack(prefetch_count) + b"\x00")


def basic_consume(
    channel: int,
    queue: str,
    consumer_tag: str,
    no_ack: bool,
    arguments: Mapping[str, object] | None,
    exclusive: bool = False,
) -> bytes:
    payload = (
        b"\0\0"
        + shortstr(queue)
        + shortstr(consumer_tag)
        + bits(False, no_ack, exclusive, False)  # no-local, no-ack, exclusive, nowait
        + table(arguments)
    )
    return method_frame(channel, BASIC_CONSUME, payload)


def basic_get(channel: int, queue: str) -> bytes:
    """basic.get with acknowledgement (no-ack off)."""
    return method_frame(channel, BASIC_GET, b"\0\0" + shortstr(queue) + b"\x00")


def decode_get_ok(payload: bytes) -> tuple[int, bool, str, str, int]:
    """Basic.GetOk after the 4-byte method id: delivery tag, redelivered, exchange, routing
    key, message count."""
    try:
        delivery_tag = _u64.unpack_from(payload, 4)[0]
        redelivered = bool(payload[12] & 1)
        exchange, offset = decode_shortstr(payload, 13)
        routing_key, offset = decode_shortstr(payload, offset)
        return delivery_tag, redelivered, exchange, routing_key, _u32.unpack_from(payload, offset)[0]
    except (IndexError, struct.error) as error:
        raise _truncated("basic.get-ok", error) from None


def basic_cancel(channel: int, consumer_tag: str) -> bytes:
    return method_frame(channel, BASIC_CANCEL, shortstr(consumer_tag) + b"\x00")


def basic_cancel_ok(channel: int, consumer_tag: str) -> bytes:
    return method_frame(channel, BASIC_CANCEL_OK, any_shortstr(consumer_tag))  # the broker's own, echoed


_ack_payload = struct.Struct(">HHQB")


def basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    body = _ack_payload.pack(60, 80, delivery_tag, 1 if multiple else 0)
    return _frame_head.pack(FRAME_METHOD, channel, 13) + body + FRAME_END


def basic_nack(channel: int, delivery_tag: int, multiple: bool, requeue: bool) -> bytes:
    body = _ack_payload.pack(60, 120, delivery_tag, (1 if multiple else 0) | (2 if requeue else 0))
    return _frame_head.pack(FRAME_METHOD, channel, 13) + body + FRAME_END


# --- publish: method + content header + body frames ------------------------------------------------
# The content header's property list, encoded and decoded by functions generated from the one
# table of the basic properties (BASIC_PROPERTIES, adapter/mapping/properties.py): unrolled,
# because they run for every message, and generated, so that the wire order, the flag bits and the
# wire types are written once.  What each wire type becomes, in both directions:
_ENCODE_BY_WIRE_TYPE: Final = {
    "shortstr": "any_shortstr(value)",
    "table": "table(value)",
    "octet": "bytes((value,))",
    "timestamp": "_u64.pack(value)",
}
_DECODE_BY_WIRE_TYPE: Final = {
    "shortstr": ("p.{attribute}, offset = decode_shortstr(payload, offset)",),
    "table": ("p.{attribute}, offset = decode_table(payload, offset)",),
    "octet": ("p.{attribute} = payload[offset]", "offset += 1"),
    "timestamp": ("p.{attribute} = _u64.unpack_from(payload, offset)[0]", "offset += 8"),
}


def _encode_properties_source() -> str:
    lines = ["def encode_properties(p):", "    flags = 0", "    parts = []"]
    for prop in BASIC_PROPERTIES:
        if not prop.published:
            continue
        lines += [
            f"    value = p.{prop.attribute}",
            "    if value is not None:",
            f"        flags |= {prop.flag:#06x}",
            f"        parts.append({_ENCODE_BY_WIRE_TYPE[prop.wire_type]})",
        ]
    lines.append('    return flags, b"".join(parts)')
    return "\n".join(lines) + "\n"


def _decode_properties_source() -> str:
    lines = [
        "def decode_properties(payload, flags):",
        "    p = MessageProperties()",
        "    offset = 14",
    ]
    for prop in BASIC_PROPERTIES:
        lines.append(f"    if flags & {prop.flag:#06x}:")
        lines += [
            f"        {step.format(attribute=prop.attribute)}"
            for step in _DECODE_BY_WIRE_TYPE[prop.wire_type]
        ]
    lines.append("    return p")
    return "\n".join(lines) + "\n"


def publish_method(channel: int, exchange: str, routing_key: str, mandatory: bool = False) -> bytes:
    """The basic.publish method frame (immediate off; mandatory as asked: the Spark sink's
    publishes come back as basic.return when no queue takes them)."""
    flags = b"\x01" if mandatory else b"\x00"
    return method_frame(
        channel, BASIC_PUBLISH, b"\0\0" + any_shortstr(exchange) + any_shortstr(routing_key) + flags
    )


# Bodies at least this large are passed on as memoryview slices, never copied into frames: the
# connection then writes its buffer with writelines (one writev, no join).
ZERO_COPY_MIN = 64 * 1024


def content_frames(
    channel: int, properties: MessageProperties, body: bytes, frame_max: int
) -> list[bytes | memoryview]:
    """The content header frame and the body frames of one message, body split to fit ``frame_max``.

    The body is never copied here: each body frame is its head, a slice of the body (a
    memoryview) and the frame end, as separate items, joined once with everything else the
    connection writes, or handed to the socket as they are (ZERO_COPY_MIN)."""
    flags, encoded = encode_properties(properties)
    header_payload = _content_head.pack(60, 0, len(body), flags) + encoded
    if len(header_payload) > frame_max - 8:
        # the broker would close the whole connection (501 frame_error), with every session a
        # shared connection carries: refuse the one message instead
        raise EncodeError(
            f"message properties and headers take {len(header_payload)} bytes, more than one AMQP "
            f"frame carries (frame_max {frame_max})"
        )
    frames: list[bytes | memoryview] = [
        _frame_head.pack(FRAME_HEADER, channel, len(header_payload)) + header_payload + FRAME_END
    ]
    chunk = frame_max - 8
    if len(body) <= chunk:
        if body:
            frames += (_frame_head.pack(FRAME_BODY, channel, len(body)), body, FRAME_END)
        return frames
    view = memoryview(body)
    for start in range(0, len(body), chunk):
        piece = view[start : start + chunk]
        frames += (_frame_head.pack(FRAME_BODY, channel, len(piece)), piece, FRAME_END)
    return frames


def basic_publish(
    channel: int, exchange: str, routing_key: str, properties: MessageProperties, body: bytes, frame_max: int
) -> list[bytes | memoryview]:
    """All frames of one publish (method, content header, body frames)."""
    return [
        publish_method(channel, exchange, routing_key),
        *content_frames(channel, properties, body, frame_max),
    ]


# --- decoding -------------------------------------------------------------------------------------
def _text(raw: bytes | memoryview) -> str:
    return bytes(raw).decode("utf-8", "surrogateescape")


def decode_shortstr(data: bytes | memoryview, offset: int) -> tuple[str, int]:
    length = data[offset]
    start = offset + 1
    end = start + length
    if end > len(data):
        raise DecodeError("short string runs past the end of its frame")
    return _text(data[start:end]), end


def _decode_longstr_raw(data: bytes, offset: int) -> tuple[bytes, int]:
    length = _u32.unpack_from(data, offset)[0]
    start = offset + 4
    end = start + length
    if end > len(data):
        raise DecodeError("long string runs past the end of its frame")
    return data[start:end], end


def _timestamp(seconds: int) -> datetime.datetime | int:
    # 64-bit seconds since the epoch (AMQP 0-9-1 §4.2.5.4); outside datetime's range it stays an
    # integer, which renders the same way on a MESSAGE frame (field_value_text)
    try:
        return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return seconds


def _decode_value(data: bytes, offset: int, depth: int) -> tuple[object, int]:
    """One field value (type octet, then the value) in RabbitMQ's field-type table."""
    kind = data[offset]
    offset += 1
    if kind == 0x53:  # S long string
        raw, offset = _decode_longstr_raw(data, offset)
        return _text(raw), offset
    if kind == 0x6C or kind == 0x4C:  # l, L signed 64-bit
        return _i64.unpack_from(data, offset)[0], offset + 8
    if kind == 0x49:  # I signed 32-bit
        return _i32.unpack_from(data, offset)[0], offset + 4
    if kind == 0x74:  # t boolean
        return data[offset] != 0, offset + 1
    if kind == 0x46:  # F nested table
        return decode_table(data, offset, depth + 1)
    if kind == 0x41:  # A array
        return _decode_array(data, offset, depth + 1)
    if kind == 0x54:  # T timestamp
        return _timestamp(_u64.unpack_from(data, offset)[0]), offset + 8
    if kind == 0x56:  # V void
        return None, offset
    if kind == 0x69:  # i unsigned 32-bit
        return _u32.unpack_from(data, offset)[0], offset + 4
    if kind == 0x62:  # b signed 8-bit
        return _i8.unpack_from(data, offset)[0], offset + 1
    if kind == 0x42:  # B unsigned 8-bit
        return data[offset], offset + 1
    if kind == 0x73:  # s signed 16-bit
        return _i16.unpack_from(data, offset)[0], offset + 2
    if kind == 0x75:  # u unsigned 16-bit
        return _u16.unpack_from(data, offset)[0], offset + 2
    if kind == 0x66:  # f 32-bit float
        return _f32.unpack_from(data, offset)[0], offset + 4
    if kind == 0x64:  # d 64-bit float
        return _f64.unpack_from(data, offset)[0], offset + 8
    if kind == 0x44:  # D decimal: scale octet, signed 32-bit unscaled value
        scale, unscaled = _decimal_head.unpack_from(data, offset)
        return decimal.Decimal(unscaled).scaleb(-scale), offset + 5
    if kind == 0x78:  # x byte array
        raw, offset = _decode_longstr_raw(data, offset)
        return raw, offset
    raise DecodeError(f"unknown field type {bytes((kind,))!r} at byte {offset - 1}")


def decode_table(data: bytes, offset: int, depth: int = 0) -> tuple[dict[str, object], int]:
    """A field table at ``offset``: (table, offset after it).  Keys and strings keep bytes that
    are not UTF-8 (surrogateescape); a later duplicate key wins, as in RabbitMQ's decoding."""
    if depth > MAX_TABLE_DEPTH:
        raise DecodeError(f"field tables nested deeper than {MAX_TABLE_DEPTH} levels")
    try:
        length = _u32.unpack_from(data, offset)[0]
        offset += 4
        end = offset + length
        if end > len(data):
            raise DecodeError("field table runs past the end of its frame")
        values: dict[str, object] = {}
        while offset < end:
            key_end = offset + 1 + data[offset]
            key = _text(data[offset + 1 : key_end])
            values[key], offset = _decode_value(data, key_end, depth)
        if offset != end:
            raise DecodeError("field table length does not match its contents")
    except (struct.error, IndexError) as error:
        raise DecodeError(f"truncated field table ({error})") from None
    return values, end


def _decode_array(data: bytes, offset: int, depth: int) -> tuple[list[object], int]:
    if depth > MAX_TABLE_DEPTH:
        raise DecodeError(f"field arrays nested deeper than {MAX_TABLE_DEPTH} levels")
    length = _u32.unpack_from(data, offset)[0]
    offset += 4
    end = offset + length
    if end > len(data):
        raise DecodeError("field array runs past the end of its frame")
    items: list[object] = []
    while offset < end:
        item, offset = _decode_value(data, offset, depth)
        items.append(item)
    if offset != end:
        raise DecodeError("field array length does not match its contents")
    return items, end


def decode_deliver(payload: bytes) -> tuple[str, int, bool, str, str]:
    """Basic.Deliver arguments after the 4-byte method id: tag, delivery tag, redelivered, exchange, key."""
    # inline rather than three decode_shortstr calls: this runs for every delivery
    try:
        end = 5 + payload[4]
        consumer_tag = payload[5:end].decode("utf-8", "surrogateescape")
        delivery_tag = _u64.unpack_from(payload, end)[0]
        redelivered = bool(payload[end + 8] & 1)
        start = end + 10
        end = start + payload[end + 9]
        exchange = payload[start:end].decode("utf-8", "surrogateescape")
        start = end + 1
        end = start + payload[end]
    except (struct.error, IndexError):
        raise DecodeError("truncated basic.deliver") from None
    if end > len(payload):
        raise DecodeError("truncated basic.deliver")
    routing_key = payload[start:end].decode("utf-8", "surrogateescape")
    return consumer_tag, delivery_tag, redelivered, exchange, routing_key


def decode_ack(payload: bytes) -> tuple[int, bool, bool]:
    """Basic.Ack / Basic.Nack from the broker (publisher confirms): tag, multiple, is_ack."""
    if len(payload) < 13:
        raise DecodeError("truncated basic.ack/basic.nack")
    delivery_tag = _u64.unpack_from(payload, 4)[0]
    return delivery_tag, bool(payload[12] & 1), payload[2:4] == b"\x00\x50"


def decode_content_header(payload: bytes) -> tuple[int, MessageProperties]:
    """Content header frame: (body size, properties)."""
    try:
        return _decode_content_header(payload)
    except (struct.error, IndexError) as error:
        raise DecodeError(f"truncated content header ({error})") from None


def _decode_content_header(payload: bytes) -> tuple[int, MessageProperties]:
    body_size = _u64.unpack_from(payload, 4)[0]
    flags = _u16.unpack_from(payload, 12)[0]
    if flags == 0:
        return body_size, MessageProperties()
    return body_size, _decode_properties(payload, flags)


# --- the other methods the broker sends us (not per message) ----------------------------------------
# Each takes the method frame's payload (method id included) and returns only the fields the
# adapter uses; a short or inconsistent payload raises DecodeError.
def _truncated(method: str, error: Exception) -> DecodeError:
    return DecodeError(f"truncated {method} ({error})")


def decode_connection_start(payload: bytes) -> dict[str, object]:
    """The server properties (after version-major and -minor; mechanisms and locales unused)."""
    try:
        return decode_table(payload, 6)[0]
    except (struct.error, IndexError) as error:
        raise _truncated("connection.start", error) from None


def decode_connection_tune(payload: bytes) -> tuple[int, int, int]:
    """channel-max, frame-max, heartbeat."""
    try:
        channel_max, frame_max, heartbeat = _tune.unpack_from(payload, 4)
    except struct.error as error:
        raise _truncated("connection.tune", error) from None
    return channel_max, frame_max, heartbeat


def decode_close(payload: bytes) -> tuple[int, str]:
    """Connection.Close or Channel.Close: reply-code, reply-text (class and method unused)."""
    try:
        text, _ = decode_shortstr(payload, 6)
        code: int = _close_head.unpack_from(payload, 4)[0]
    except (struct.error, IndexError) as error:
        raise _truncated("close", error) from None
    return code, text


def decode_basic_return(payload: bytes) -> tuple[int, str, str, str]:
    """Basic.Return: reply-code, reply-text, exchange, routing-key."""
    try:
        code: int = _close_head.unpack_from(payload, 4)[0]
        text, offset = decode_shortstr(payload, 6)
        exchange, offset = decode_shortstr(payload, offset)
        routing_key, _ = decode_shortstr(payload, offset)
    except (struct.error, IndexError) as error:
        raise _truncated("basic.return", error) from None
    return code, text, exchange, routing_key


def decode_basic_cancel(payload: bytes) -> tuple[str, bool]:
    """A broker-initiated Basic.Cancel: consumer-tag, nowait."""
    try:
        tag, offset = decode_shortstr(payload, 4)
        return tag, bool(payload[offset] & 1)
    except IndexError as error:
        raise _truncated("basic.cancel", error) from None


def decode_queue_declare_ok(payload: bytes) -> str:
    """The queue name (message and consumer counts unused)."""
    try:
        return decode_shortstr(payload, 4)[0]
    except IndexError as error:
        raise _truncated("queue.declare-ok", error) from None


def decode_reply(method: tuple[int, int], payload: bytes) -> str | None:
    """The result of a synchronous call's reply: the queue name of Queue.DeclareOk, else None
    (the other replies the adapter waits for carry nothing it uses; Basic.GetOk's reply is its
    message, ChannelCore.reply_got)."""
    if method == QUEUE_DECLARE_OK:
        return decode_queue_declare_ok(payload)
    return None


# Generated last: their code calls the helpers defined above.
encode_properties: Callable[[MessageProperties], tuple[int, bytes]] = generate_function(
    "encode_properties", _encode_properties_source(), globals()
)
encode_properties.__doc__ = (
    """(property flags, property list) of a message, in the order AMQP 0-9-1 defines."""
)

# (content header payload, property flags) -> the properties; the list starts at byte 14
_decode_properties: Callable[[bytes, int], MessageProperties] = generate_function(
    "decode_properties", _decode_properties_source(), globals()
)
