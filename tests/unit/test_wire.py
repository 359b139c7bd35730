"""The hand-written AMQP encoders and decoders of the per-message path, checked against pamqp.

``adapter.amqp.wire`` writes publishes and reads deliveries itself for speed; pamqp is an
independent implementation of the same wire format, so each side is checked against the other:
frames we encode must unmarshal in pamqp to the same values, and frames pamqp marshals must decode
with ours to the same values.
"""

from __future__ import annotations

import contextlib
import datetime
import struct
import traceback
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, frame, header

from adapter.amqp import wire
from adapter.codegen import generated_source
from adapter.mapping.properties import BASIC_PROPERTIES, MessageProperties

# pamqp validates exchange and queue names; stay inside what it accepts
NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.:", max_size=40)
SHORT_TEXT = st.text(max_size=30).filter(lambda t: len(t.encode()) <= 255)
# pamqp leaves an empty string property out (absent) where we send it empty: compare the rest
OPTIONAL_TEXT = st.none() | st.text(min_size=1, max_size=30)
HEADERS = st.none() | st.dictionaries(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=10),
    st.text(max_size=20) | st.integers(-(2**31), 2**31 - 1) | st.booleans(),
    max_size=4,
)


@st.composite
def properties(draw: st.DrawFn) -> MessageProperties:
    return MessageProperties(
        content_type=draw(OPTIONAL_TEXT),
        content_encoding=draw(OPTIONAL_TEXT),
        headers=draw(HEADERS),
        delivery_mode=draw(st.none() | st.sampled_from([1, 2])),
        priority=draw(st.none() | st.integers(0, 255)),
        correlation_id=draw(OPTIONAL_TEXT),
        reply_to=draw(OPTIONAL_TEXT),
        expiration=draw(st.none() | st.sampled_from(["0", "1000"])),
        message_id=draw(OPTIONAL_TEXT),
        timestamp=draw(st.none() | st.integers(0, 2**32)),
        type=draw(OPTIONAL_TEXT),
        user_id=draw(OPTIONAL_TEXT),
        app_id=draw(OPTIONAL_TEXT),
    )


def split_frames(data: bytes) -> list[object]:
    """Unmarshal a byte string of frames with pamqp."""
    values = []
    while data:
        consumed, _channel, value = frame.unmarshal(data)
        values.append(value)
        data = data[consumed:]
    return values


def pamqp_properties(p: MessageProperties) -> commands.Basic.Properties:
    return commands.Basic.Properties(
        content_type=p.content_type,
        content_encoding=p.content_encoding,
        headers=p.headers,  # type: ignore[arg-type]
        delivery_mode=p.delivery_mode,
        priority=p.priority,
        correlation_id=p.correlation_id,
        reply_to=p.reply_to,
        expiration=p.expiration,
        message_id=p.message_id,
        timestamp=None if p.timestamp is None else datetime.datetime.fromtimestamp(p.timestamp, datetime.UTC),
        message_type=p.type,
        user_id=p.user_id,
        app_id=p.app_id,
    )


# our attribute -> pamqp's, where the names differ
PAMQP_NAMES = {"type": "message_type"}


def test_the_property_table_is_amqps_basic_properties():
    # pamqp (generated from the AMQP 0-9-1 XML spec) is the oracle for the order and the flag bits
    ours = [(PAMQP_NAMES.get(prop.attribute, prop.attribute), prop.flag) for prop in BASIC_PROPERTIES]
    assert ours == list(commands.Basic.Properties.flags.items())
    assert [prop.attribute for prop in BASIC_PROPERTIES] == list(MessageProperties.__slots__)


def test_a_failure_in_generated_code_shows_its_line():
    # the generated source is registered with linecache: a traceback names the property's line
    with pytest.raises(ValueError) as failure:
        wire.encode_properties(MessageProperties(priority=256))
    assert "parts.append(bytes((value,)))" in "".join(traceback.format_exception(failure.value))
    assert "p.priority" in generated_source("encode_properties")


def test_cluster_id_is_read_from_deliveries_and_never_published():
    # deprecated in AMQP 0-9-1 ("must be empty"): a delivery may carry one, a publish never does
    payload = struct.pack(">HHQH", 60, 0, 0, 0x0004 | 0x0008) + wire.shortstr("app") + wire.shortstr("c1")
    _, decoded = wire.decode_content_header(payload)
    assert (decoded.app_id, decoded.cluster_id) == ("app", "c1")
    assert wire.encode_properties(decoded) == (0x0008, wire.shortstr("app"))


@settings(max_examples=200, deadline=None)
@given(
    NAMES,
    NAMES,
    properties(),
    st.binary(max_size=100) | st.binary(min_size=200, max_size=600),
    st.sampled_from([128, 256, 131072]),  # small frames make the body split
)
def test_our_publish_frames_read_back_in_pamqp(exchange, routing_key, props, body, frame_max):
    if 14 + len(wire.encode_properties(props)[1]) > frame_max - 8:  # no content header frame fits
        with pytest.raises(wire.EncodeError, match="frame_max"):
            wire.basic_publish(1, exchange, routing_key, props, body, frame_max)
        return
    data = b"".join(wire.basic_publish(1, exchange, routing_key, props, body, frame_max))
    method, content_header, *bodies = split_frames(data)
    assert isinstance(method, commands.Basic.Publish)
    assert (method.exchange, method.routing_key, method.mandatory, method.immediate) == (
        exchange,
        routing_key,
        False,
        False,
    )
    assert isinstance(content_header, header.ContentHeader)
    assert content_header.body_size == len(body)
    expected = pamqp_properties(props)
    for prop in BASIC_PROPERTIES:  # every property, through the encoder generated from the table
        if not prop.published:
            continue
        name = PAMQP_NAMES.get(prop.attribute, prop.attribute)
        if name == "headers":
            assert (content_header.properties.headers or None) == (props.headers or None)
        elif name == "timestamp" and (props.timestamp or 0) > 0xFFFFFFFF:
            # pamqp's decoder reads a timestamp past 2106 as milliseconds; RabbitMQ and we keep seconds
            assert content_header.properties.timestamp is not None
        else:
            assert getattr(content_header.properties, name) == getattr(expected, name), name
    assert b"".join(piece.value for piece in bodies) == body
    assert all(len(piece.value) <= frame_max - 8 for piece in bodies)


@settings(max_examples=200, deadline=None)
# pamqp encodes the delivery tag as a signed long-long
@given(SHORT_TEXT, st.integers(1, 2**63 - 1), st.booleans(), NAMES, SHORT_TEXT)
def test_pamqp_deliveries_decode_with_ours(consumer_tag, delivery_tag, redelivered, exchange, routing_key):
    data = frame.marshal(
        commands.Basic.Deliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key), 1
    )
    payload = data[7:-1]
    assert wire.decode_deliver(payload) == (consumer_tag, delivery_tag, redelivered, exchange, routing_key)


@settings(max_examples=200, deadline=None)
@given(properties(), st.integers(0, 2**40))
def test_pamqp_content_headers_decode_with_ours(props, body_size):
    data = frame.marshal(header.ContentHeader(0, body_size, pamqp_properties(props)), 1)
    size, decoded = wire.decode_content_header(data[7:-1])
    assert size == body_size
    for name in MessageProperties.__slots__:
        if name in ("headers", "cluster_id"):  # pamqp refuses to encode a cluster-id: below
            continue
        assert getattr(decoded, name) == getattr(props, name), name
    assert (decoded.headers or None) == (props.headers or None)


# --- field tables: every type RabbitMQ sends, checked against pamqp's encoder --------------------
FIELD_VALUES = st.recursive(
    st.text(max_size=20)
    | st.integers(-(2**63), 2**63 - 1)
    | st.booleans()
    | st.floats(allow_nan=False, width=32)  # pamqp encodes every float as a 32-bit "f"
    | st.none()
    | st.datetimes(min_value=datetime.datetime(1970, 1, 2), max_value=datetime.datetime(2200, 1, 1)).map(
        lambda d: d.replace(microsecond=0, tzinfo=datetime.UTC)
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.text(max_size=12).filter(lambda k: len(k.encode()) <= 255), FIELD_VALUES, max_size=5)
)
def test_pamqp_field_tables_decode_with_ours(table):
    from pamqp import encode

    data = encode.field_table(table)
    decoded, end = wire.decode_table(data, 0)
    assert end == len(data)
    assert decoded == table


def table_bytes(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return len(body).to_bytes(4, "big") + body


def test_invalid_utf8_in_table_keys_and_values_is_kept_byte_for_byte():
    # the reproduction: a header name the broker accepted although it is not UTF-8
    data = table_bytes(b"\x08x-\xff-name" + b"S" + b"\x00\x00\x00\x01v", b"\x01k" + b"S\x00\x00\x00\x02\xc3(")
    decoded, _ = wire.decode_table(data, 0)
    assert [k.encode("utf-8", "surrogateescape") for k in decoded] == [b"x-\xff-name", b"k"]
    assert decoded["k"].encode("utf-8", "surrogateescape") == b"\xc3("


def test_every_numeric_field_type():
    data = table_bytes(
        b"\x01b" + b"b\xff",
        b"\x01B" + b"B\xff",
        b"\x01s" + b"s\xff\xfe",
        b"\x01u" + b"u\xff\xfe",
        b"\x01I" + b"I\xff\xff\xff\xfe",
        b"\x01i" + b"i\xff\xff\xff\xfe",
        b"\x01D" + b"D\x02\x00\x00\x01\x2c",
        b"\x01x" + b"x\x00\x00\x00\x02\x00\xff",
        b"\x01T" + b"T\xff\xff\xff\xff\xff\xff\xff\xff",
    )
    decoded, _ = wire.decode_table(data, 0)
    assert decoded["b"] == -1 and decoded["B"] == 255
    assert decoded["s"] == -2 and decoded["u"] == 65534
    assert decoded["I"] == -2 and decoded["i"] == 2**32 - 2
    assert str(decoded["D"]) == "3.00"
    assert decoded["x"] == b"\x00\xff"
    assert decoded["T"] == 2**64 - 1  # beyond datetime's range: kept as the integer it is


@given(st.binary(max_size=64))
@settings(max_examples=500, deadline=None)
def test_arbitrary_bytes_decode_or_raise_decode_error(data):
    """Whatever the broker sends, the decoders either decode it or raise DecodeError."""
    for decode in (
        lambda d: wire.decode_table(d, 0),
        wire.decode_deliver,
        wire.decode_content_header,
        wire.decode_ack,
    ):
        with contextlib.suppress(wire.DecodeError):
            decode(data)
    for method_decoder in (
        wire.decode_connection_start,
        wire.decode_connection_tune,
        wire.decode_close,
        wire.decode_basic_cancel,
        wire.decode_queue_declare_ok,
    ):
        with contextlib.suppress(wire.DecodeError):
            method_decoder(data)


def test_nesting_is_bounded():
    data = b"\x00\x00\x00\x00"
    for _ in range(wire.MAX_TABLE_DEPTH + 5):
        entry = b"\x01k" + b"F" + data
        data = len(entry).to_bytes(4, "big") + entry
    try:
        wire.decode_table(data, 0)
    except wire.DecodeError as error:
        assert "nested deeper" in str(error)
    else:
        raise AssertionError("a table nested beyond the bound was decoded")


def test_close_and_cancel_with_invalid_utf8_text_decode():
    close = frame.marshal(commands.Channel.Close(404, "x", 50, 10), 1)[7:-1]
    close = close[:6] + b"\x03\xff\xfez" + close[8:]  # reply text "\xff\xfez" instead of "x"
    code, text = wire.decode_close(close)
    assert code == 404 and text.encode("utf-8", "surrogateescape") == b"\xff\xfez"
    # CESU-8 bytes, as a broker may send them (the adapter itself never sends such a tag)
    cancel = wire.method_frame(1, wire.BASIC_CANCEL, wire.any_shortstr("s1\udced\udca0\udc80") + b"\x00")[
        7:-1
    ]
    tag, nowait = wire.decode_basic_cancel(cancel)
    assert tag.encode("utf-8", "surrogateescape") == b"s1\xed\xa0\x80" and nowait is False


def test_connection_close_cuts_a_long_text_instead_of_failing():
    data = wire.connection_close(501, "é" * 200)
    code, text = wire.decode_close(data[7:-1])
    assert code == 501 and len(text.encode("utf-8", "surrogateescape")) <= 255
    text.encode("utf-8")  # cut on a character boundary: still UTF-8, which the broker checks


def test_connection_close_text_is_always_utf8():
    """connection.close has no content: RabbitMQ checks its reply text is UTF-8 (501 otherwise).
    A text holding a client's bytes that are not UTF-8, or cut in the middle of a character,
    still goes out as UTF-8."""
    for text in ("a\udcff\udcfeb", "x" + "é" * 200, "\udcff" * 300):
        _, decoded = wire.decode_close(wire.connection_close(541, text)[7:-1])
        raw = decoded.encode("utf-8", "surrogateescape")
        assert len(raw) <= 255
        raw.decode("utf-8")  # strict: raises if not UTF-8


NOT_UTF8 = b"q\xff\xfe".decode("utf-8", "surrogateescape")  # a header value as the codec keeps it


@pytest.mark.parametrize(
    "encode",
    [
        lambda: wire.queue_declare(1, NOT_UTF8),
        lambda: wire.queue_bind(1, "q", "amq.topic", NOT_UTF8),
        lambda: wire.queue_bind(1, "q", NOT_UTF8, "k"),
        lambda: wire.queue_delete(1, NOT_UTF8),
        lambda: wire.basic_consume(1, "q", NOT_UTF8, False, {}, False),
        lambda: wire.basic_cancel(1, NOT_UTF8),
        lambda: wire.basic_get(1, NOT_UTF8),
        lambda: wire.exchange_declare(1, NOT_UTF8, "topic", durable=False, auto_delete=False),
        lambda: wire.connection_open(NOT_UTF8),
    ],
)
def test_a_method_short_string_that_is_not_utf8_is_an_encode_error(encode: Any) -> None:
    """RabbitMQ checks the short strings of methods without content and answers bytes that are
    not UTF-8 with a connection error, ending every session of a shared connection: the
    encoder refuses them instead, without quoting the client's bytes."""
    with pytest.raises(wire.EncodeError, match="not valid UTF-8") as caught:
        encode()
    assert "\udcff" not in str(caught.value) and "\\xff" not in str(caught.value)


def test_publish_properties_and_table_keys_pass_bytes_that_are_not_utf8_through():
    """basic.publish (content-bearing), the basic properties and field-table keys are not
    checked by RabbitMQ: they go out byte for byte, as before."""
    from adapter.mapping.properties import MessageProperties

    properties = MessageProperties()
    properties.reply_to = NOT_UTF8
    properties.headers = {NOT_UTF8: "v"}
    frames = wire.basic_publish(1, "", NOT_UTF8, properties, b"x", 131072)
    assert b"q\xff\xfe" in frames[0] and frames[1].count(b"q\xff\xfe") == 2


def test_values_amqp_cannot_carry_are_encode_errors_answered_as_processing_errors():
    """The encoder raises its own error (it knows nothing of STOMP); the one mapping
    (adapter/amqp/errors.py) makes it the one STOMP error class for them (adapter/errors.py),
    answered with ERROR Processing error."""
    from adapter.amqp.errors import stomp_error
    from adapter.errors import StompError
    from adapter.mapping.destinations import ProcessingError

    for encode in (
        lambda: wire.shortstr("q" * 256),
        lambda: wire.table({"x-max-length": 2**63}),
        lambda: wire.table({"x-stream-offset": ("timestamp", -1)}),
    ):
        try:
            encode()
        except wire.EncodeError as error:
            assert not isinstance(error, StompError)
            mapped = stomp_error(error)
            assert isinstance(mapped, ProcessingError) and isinstance(mapped, StompError)
            assert mapped.message == "Processing error" and mapped.detail == str(error) and mapped.detail
        else:
            raise AssertionError("encoded a value AMQP cannot carry")


def test_a_content_header_over_frame_max_is_an_encode_error():
    """The broker closes the whole connection (501 frame_error) on a frame over frame_max, so a
    message whose properties do not fit one frame is refused before anything is written: on a
    shared connection (adapter.amqp_sessions_per_connection) the broker's refusal would end
    every session on it.  A header that just fits is encoded."""
    frame_max = 4096
    too_big = MessageProperties(headers={"x-a": "h" * frame_max})
    with pytest.raises(wire.EncodeError, match="frame_max"):
        wire.content_frames(1, too_big, b"x", frame_max)
    fits = MessageProperties(headers={"x-a": "h" * 1000})
    frames = wire.content_frames(1, fits, b"x", frame_max)
    assert len(frames[0]) <= frame_max
