"""AMQP 0-9-1 frame encoding for the methods the adapter sends, and decoding of the hot ones.

Why by hand and not through pamqp's command classes: (1) pamqp validates queue and exchange
names against ``[a-zA-Z0-9-_.:]`` and friends, while RabbitMQ and its STOMP plugin accept any
UTF-8 name (``/queue/a%2fb`` declares a queue literally named ``a%2fb``, reference §6.1, §22.5);
(2) the per-message path (publish, ack, deliver) costs a few microseconds here against tens
through pamqp's generic, attribute-by-attribute marshalling.  Replies that are not per message
(Connection.Start, Queue.DeclareOk, Channel.Close ...) are decoded with pamqp.

Pure: no I/O.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Mapping

from pamqp import decode  # only its field-table decoder; everything per message is by hand

from ..mapping.properties import MessageProperties

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
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
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
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)


def shortstr(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogateescape")
    if len(raw) > 255:
        raise ValueError(f"name longer than 255 bytes: {value[:40]!r}...")
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
            return b"T" + _u64.pack(int(inner))  # type: ignore[call-overload]
        if kind == "long":
            return b"l" + _i64.pack(int(inner))  # type: ignore[call-overload]
        return b"S" + longstr(str(inner))
    if isinstance(value, str | bytes):
        return b"S" + longstr(value)
    if isinstance(value, bool):
        return b"t" + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
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
    body = b"".join(shortstr(k) + field_value(v) for k, v in values.items())
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
def connection_start_ok(user: str, password: str, client_properties: Mapping[str, object]) -> bytes:
    response = f"\0{user}\0{password}".encode("utf-8", "surrogateescape")
    payload = table(client_properties) + shortstr("PLAIN") + longstr(response) + shortstr("en_US")
    return method_frame(0, CONNECTION_START_OK, payload)


def connection_tune_ok(channel_max: int, frame_max: int, heartbeat: int) -> bytes:
    return method_frame(
        0, CONNECTION_TUNE_OK, _u16.pack(channel_max) + _u32.pack(frame_max) + _u16.pack(heartbeat)
    )


def connection_open(vhost: str) -> bytes:
    return method_frame(0, CONNECTION_OPEN, shortstr(vhost) + shortstr("") + b"\x00")


def connection_close(code: int = 200, text: str = "Goodbye") -> bytes:
    return method_frame(0, CONNECTION_CLOSE, _u16.pack(code) + shortstr(text) + b"\0\0\0\0")


def connection_close_ok() -> bytes:
    return method_frame(0, CONNECTION_CLOSE_OK)


def channel_open(channel: int) -> bytes:
    return method_frame(channel, CHANNEL_OPEN, shortstr(""))


def channel_close_ok(channel: int) -> bytes:
    return method_frame(channel, CHANNEL_CLOSE_OK)


def confirm_select(channel: int) -> bytes:
    return method_frame(channel, CONFIRM_SELECT, b"\x00")


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


def queue_bind(channel: int, queue: str, exchange: str, routing_key: str) -> bytes:
    payload = b"\0\0" + shortstr(queue) + shortstr(exchange) + shortstr(routing_key) + b"\x00" + table(None)
    return method_frame(channel, QUEUE_BIND, payload)


def queue_delete(channel: int, queue: str) -> bytes:
    return method_frame(channel, QUEUE_DELETE, b"\0\0" + shortstr(queue) + b"\x00")


def basic_qos(channel: int, prefetch_count: int) -> bytes:
    return method_frame(channel, BASIC_QOS, _u32.pack(0) + _u16.pack(prefetch_count) + b"\x00")


def basic_consume(
    channel: int, queue: str, consumer_tag: str, no_ack: bool, arguments: Mapping[str, object] | None
) -> bytes:
    payload = (
        b"\0\0"
        + shortstr(queue)
        + shortstr(consumer_tag)
        + bits(False, no_ack, False, False)  # no-local, no-ack, exclusive, nowait
        + table(arguments)
    )
    return method_frame(channel, BASIC_CONSUME, payload)


def basic_cancel(channel: int, consumer_tag: str) -> bytes:
    return method_frame(channel, BASIC_CANCEL, shortstr(consumer_tag) + b"\x00")


def basic_cancel_ok(channel: int, consumer_tag: str) -> bytes:
    return method_frame(channel, BASIC_CANCEL_OK, shortstr(consumer_tag))


_ack_payload = struct.Struct(">HHQB")


def basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    body = _ack_payload.pack(60, 80, delivery_tag, 1 if multiple else 0)
    return _frame_head.pack(FRAME_METHOD, channel, 13) + body + FRAME_END


def basic_nack(channel: int, delivery_tag: int, multiple: bool, requeue: bool) -> bytes:
    body = _ack_payload.pack(60, 120, delivery_tag, (1 if multiple else 0) | (2 if requeue else 0))
    return _frame_head.pack(FRAME_METHOD, channel, 13) + body + FRAME_END


# --- publish: method + content header + body frames ------------------------------------------------
def encode_properties(p: MessageProperties) -> tuple[int, bytes]:
    """Return (property flags, property list) in the order AMQP 0-9-1 defines.

    Unrolled rather than looped over names: this runs for every message published."""
    flags = 0
    parts: list[bytes] = []
    if p.content_type is not None:
        flags |= 0x8000
        parts.append(shortstr(p.content_type))
    if p.content_encoding is not None:
        flags |= 0x4000
        parts.append(shortstr(p.content_encoding))
    if p.headers is not None:
        flags |= 0x2000
        parts.append(table(p.headers))
    if p.delivery_mode is not None:
        flags |= 0x1000
        parts.append(bytes((p.delivery_mode,)))
    if p.priority is not None:
        flags |= 0x0800
        parts.append(bytes((p.priority,)))
    if p.correlation_id is not None:
        flags |= 0x0400
        parts.append(shortstr(p.correlation_id))
    if p.reply_to is not None:
        flags |= 0x0200
        parts.append(shortstr(p.reply_to))
    if p.expiration is not None:
        flags |= 0x0100
        parts.append(shortstr(p.expiration))
    if p.message_id is not None:
        flags |= 0x0080
        parts.append(shortstr(p.message_id))
    if p.timestamp is not None:
        flags |= 0x0040
        parts.append(_u64.pack(p.timestamp))
    if p.type is not None:
        flags |= 0x0020
        parts.append(shortstr(p.type))
    if p.user_id is not None:
        flags |= 0x0010
        parts.append(shortstr(p.user_id))
    if p.app_id is not None:
        flags |= 0x0008
        parts.append(shortstr(p.app_id))
    return flags, b"".join(parts)


def publish_method(channel: int, exchange: str, routing_key: str) -> bytes:
    """The basic.publish method frame (mandatory and immediate off)."""
    return method_frame(
        channel, BASIC_PUBLISH, b"\0\0" + shortstr(exchange) + shortstr(routing_key) + b"\x00"
    )


def content_frames(channel: int, properties: MessageProperties, body: bytes, frame_max: int) -> list[bytes]:
    """The content header frame and the body frames of one message, body split to fit ``frame_max``.

    A body that fits one frame is not copied here: its frame head, the body and the frame end
    are separate items, joined once with everything else the connection writes."""
    flags, encoded = encode_properties(properties)
    header_payload = _content_head.pack(60, 0, len(body), flags) + encoded
    frames = [_frame_head.pack(FRAME_HEADER, channel, len(header_payload)) + header_payload + FRAME_END]
    chunk = frame_max - 8
    if len(body) <= chunk:
        if body:
            frames += (_frame_head.pack(FRAME_BODY, channel, len(body)), body, FRAME_END)
        return frames
    for start in range(0, len(body), chunk):
        piece = body[start : start + chunk]
        frames.append(_frame_head.pack(FRAME_BODY, channel, len(piece)) + piece + FRAME_END)
    return frames


def basic_publish(
    channel: int, exchange: str, routing_key: str, properties: MessageProperties, body: bytes, frame_max: int
) -> list[bytes]:
    """All frames of one publish (method, content header, body frames)."""
    return [
        publish_method(channel, exchange, routing_key),
        *content_frames(channel, properties, body, frame_max),
    ]


# --- decoding of the per-message frames -------------------------------------------------------------
def decode_shortstr(data: bytes | memoryview, offset: int) -> tuple[str, int]:
    length = data[offset]
    start = offset + 1
    return bytes(data[start : start + length]).decode("utf-8", "surrogateescape"), start + length


def decode_deliver(payload: bytes) -> tuple[str, int, bool, str, str]:
    """Basic.Deliver arguments after the 4-byte method id: tag, delivery tag, redelivered, exchange, key."""
    # inline rather than three decode_shortstr calls: this runs for every delivery
    end = 5 + payload[4]
    consumer_tag = payload[5:end].decode("utf-8", "surrogateescape")
    delivery_tag = _u64.unpack_from(payload, end)[0]
    redelivered = bool(payload[end + 8] & 1)
    start = end + 10
    end = start + payload[end + 9]
    exchange = payload[start:end].decode("utf-8", "surrogateescape")
    start = end + 1
    routing_key = payload[start : start + payload[end]].decode("utf-8", "surrogateescape")
    return consumer_tag, delivery_tag, redelivered, exchange, routing_key


def decode_ack(payload: bytes) -> tuple[int, bool, bool]:
    """Basic.Ack / Basic.Nack from the broker (publisher confirms): tag, multiple, is_ack."""
    delivery_tag = _u64.unpack_from(payload, 4)[0]
    return delivery_tag, bool(payload[12] & 1), payload[2:4] == b"\x00\x50"


def decode_content_header(payload: bytes) -> tuple[int, MessageProperties]:
    """Content header frame: (body size, properties).  The headers table goes through pamqp's
    decoder, which understands every field type RabbitMQ may put there (x-death and friends)."""
    body_size = _u64.unpack_from(payload, 4)[0]
    flags = _u16.unpack_from(payload, 12)[0]
    p = MessageProperties()
    if flags == 0:
        return body_size, p
    offset = 14
    if flags & 0x8000:
        p.content_type, offset = decode_shortstr(payload, offset)
    if flags & 0x4000:
        p.content_encoding, offset = decode_shortstr(payload, offset)
    if flags & 0x2000:
        consumed, headers = decode.field_table(payload[offset:])
        p.headers = headers  # type: ignore[assignment]
        offset += consumed
    if flags & 0x1000:
        p.delivery_mode = payload[offset]
        offset += 1
    if flags & 0x0800:
        p.priority = payload[offset]
        offset += 1
    if flags & 0x0400:
        p.correlation_id, offset = decode_shortstr(payload, offset)
    if flags & 0x0200:
        p.reply_to, offset = decode_shortstr(payload, offset)
    if flags & 0x0100:
        p.expiration, offset = decode_shortstr(payload, offset)
    if flags & 0x0080:
        p.message_id, offset = decode_shortstr(payload, offset)
    if flags & 0x0040:
        p.timestamp = _u64.unpack_from(payload, offset)[0]
        offset += 8
    if flags & 0x0020:
        p.type, offset = decode_shortstr(payload, offset)
    if flags & 0x0010:
        p.user_id, offset = decode_shortstr(payload, offset)
    if flags & 0x0008:
        p.app_id, offset = decode_shortstr(payload, offset)
    if flags & 0x0004:
        p.cluster_id, offset = decode_shortstr(payload, offset)
    return body_size, p
