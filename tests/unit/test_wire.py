"""The hand-written AMQP encoders and decoders of the per-message path, checked against pamqp.

``adapter.amqp.wire`` writes publishes and reads deliveries itself for speed; pamqp is an
independent implementation of the same wire format, so each side is checked against the other:
frames we encode must unmarshal in pamqp to the same values, and frames pamqp marshals must decode
with ours to the same values.
"""

from __future__ import annotations

import datetime

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, frame, header

from adapter.amqp import wire
from adapter.mapping.properties import MessageProperties

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


@settings(max_examples=200, deadline=None)
@given(
    NAMES,
    NAMES,
    properties(),
    st.binary(max_size=100) | st.binary(min_size=200, max_size=600),
    st.sampled_from([128, 256, 131072]),  # small frames make the body split
)
def test_our_publish_frames_read_back_in_pamqp(exchange, routing_key, props, body, frame_max):
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
    for name in ("content_type", "correlation_id", "reply_to", "message_id", "message_type", "app_id"):
        assert getattr(content_header.properties, name) == getattr(expected, name)
    assert (content_header.properties.headers or None) == (props.headers or None)
    assert content_header.properties.delivery_mode == props.delivery_mode
    assert content_header.properties.priority == props.priority
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
        if name in ("headers", "cluster_id"):
            continue
        assert getattr(decoded, name) == getattr(props, name), name
    assert (decoded.headers or None) == (props.headers or None)
