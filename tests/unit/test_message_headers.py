"""``message_headers``, the one source of a delivery's MESSAGE headers, against real frames.

For random AMQP properties and headers tables: ``Session.on_delivery`` renders the MESSAGE,
the adapter's STOMP parser reads it back, and what it reads is exactly the session's own
headers, then ``message_headers``' pairs, then ``content-length`` (a repeated name keeps its first
value, as STOMP 1.2 parsers read it).  And the Spark reader's row headers, built from the pairs
without a frame, equal what a STOMP subscriber reads from that frame.
"""

from __future__ import annotations

import datetime
import decimal

from hypothesis import example, given, settings
from hypothesis import strategies as st

from adapter.mapping import operations as ops
from adapter.mapping.properties import MessageProperties, message_headers
from adapter.session import Session, SessionSettings
from adapter.spark.messages import SUBSCRIPTION_HEADERS, MessageRenderer
from adapter.stomp.codec import FrameLimits, FrameParser
from adapter.stomp.frame import Command, Frame

SESSION_ID = "session-1"
# MESSAGE frames the adapter writes have no size limit; reading them back must not add one
NO_LIMITS = FrameLimits(max_frame_size=2**62, max_headers=2**31, max_header_length=2**62)


def subscribed_session(ack: str) -> Session:
    session = Session(SessionSettings(), session_id=SESSION_ID, peer_is_loopback=True)
    for frame in (
        Frame(Command.CONNECT, {"accept-version": "1.2", "login": "guest", "passcode": "guest"}),
        Frame(Command.SUBSCRIBE, {"destination": "/amq/queue/s", "id": "sub-0", "ack": ack}),
    ):
        steps = session.handle_frame(frame)
        answer: object = None
        try:
            while True:
                operation = steps.send(answer)
                answer = ops.LoginResult(ok=True) if isinstance(operation, ops.OpenConnection) else None
        except StopIteration:
            pass
    return session


SESSIONS = {ack: subscribed_session(ack) for ack in ("auto", "client-individual")}


def read_back(session: Session, delivery: ops.Delivery) -> Frame:
    """The MESSAGE the session renders for ``delivery``, as a STOMP 1.2 client parses it."""
    parser = FrameParser(NO_LIMITS)
    parser.set_version("1.2")
    parser.feed(session.on_delivery(delivery._replace(consumer_tag="T_sub-0")))
    frame = parser.next_frame()
    assert frame is not None and frame.command == "MESSAGE"
    assert parser.next_frame() is None
    return frame


def first_wins(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    headers: dict[str, str] = {}
    for name, value in pairs:
        headers.setdefault(name, value)
    return list(headers.items())


# Text as it reaches the adapter from the wire: UTF-8, with bytes that are not UTF-8 as
# surrogate escapes; and text full of the characters STOMP escapes.
wire_text = st.one_of(
    st.binary(max_size=24).map(lambda raw: raw.decode("utf-8", "surrogateescape")),
    st.text(alphabet=st.sampled_from(["a", "é", ":", "\\", "\n", "\r", " ", "\x00", "\u2603"]), max_size=12),
    st.text(max_size=12),
)
# names that collide with the session's own headers or the property headers, and any others
header_name = st.one_of(
    st.sampled_from(
        [
            "destination",
            "message-id",
            "subscription",
            "redelivered",
            "ack",
            "content-length",
            "content-type",
            "reply-to",
            "persistent",
            "x-stream-offset",
        ]
    ),
    wire_text,
)
scalar = st.one_of(
    wire_text,
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.floats(),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.datetimes(min_value=datetime.datetime(1971, 1, 1), max_value=datetime.datetime(2200, 1, 1)),
    st.none(),
    st.binary(max_size=12),
)
field_value = st.recursive(
    scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(wire_text, inner, max_size=3)),
    max_leaves=6,
)
octet = st.integers(0, 255)
properties = st.builds(
    MessageProperties,
    content_type=st.none() | wire_text,
    content_encoding=st.none() | wire_text,
    headers=st.none() | st.dictionaries(header_name, field_value, max_size=6),
    delivery_mode=st.none() | octet,
    priority=st.none() | octet,
    correlation_id=st.none() | wire_text,
    reply_to=st.none() | wire_text | st.sampled_from(["/queue/q", "/topic/t", "amq.gen-x"]),
    expiration=st.none() | wire_text,
    message_id=st.none() | wire_text,
    timestamp=st.none() | st.integers(0, 2**64 - 1),
    type=st.none() | wire_text,
    user_id=st.none() | wire_text,
    app_id=st.none() | wire_text,
    cluster_id=st.none() | wire_text,
)
deliveries = st.builds(
    ops.Delivery,
    consumer_tag=st.just("T_sub-0"),
    delivery_tag=st.integers(1, 2**64 - 1),
    redelivered=st.booleans(),
    exchange=st.sampled_from(["", "amq.topic", "amq.direct", "x"]) | wire_text,
    routing_key=wire_text,
    properties=properties,
    body=st.binary(max_size=16),
)

RICH = MessageProperties(
    headers={"custom": "a:b\nc\\d", "content-length": "99", "destination": "/queue/forged", "n": 7},
    content_type="text/plain",
    reply_to="answers",
    delivery_mode=2,
    priority=4,
    timestamp=1_700_000_000,
    correlation_id="c:1",
)


@settings(max_examples=300, deadline=None)
@given(delivery=deliveries, ack=st.sampled_from(sorted(SESSIONS)))
@example(delivery=ops.Delivery("T_sub-0", 1, False, "amq.topic", "t.x", RICH, b"body"), ack="auto")
def test_the_pairs_are_what_a_stomp_parser_reads_from_the_rendered_message(delivery, ack):
    session = SESSIONS[ack]
    frame = read_back(session, delivery)
    pairs = message_headers(delivery.properties)
    message_id = f"T_sub-0@@{SESSION_ID}@@{delivery.delivery_tag}"
    own = [
        ("subscription", "sub-0"),
        ("destination", frame.headers["destination"]),
        ("message-id", message_id),
        ("redelivered", "true" if delivery.redelivered else "false"),
    ]
    if ack != "auto":
        own.append(("ack", message_id))
    tail = [("content-length", str(len(delivery.body)))] if delivery.body else []
    assert list(frame.headers.items()) == first_wins(own + pairs + tail)
    assert frame.body == delivery.body


def round_trip_row_headers(delivery: ops.Delivery) -> dict[str, str]:
    """Row headers as the reader built them before message_headers existed: the MESSAGE
    rendered by the session, parsed, without the subscriber's own headers, made valid UTF-8."""
    frame = read_back(SESSIONS["auto"], delivery)
    return {
        valid(name): valid(value) for name, value in frame.headers.items() if name not in SUBSCRIPTION_HEADERS
    }


def valid(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@settings(max_examples=300, deadline=None)
@given(delivery=deliveries)
@example(delivery=ops.Delivery("T_sub-0", 1, True, "amq.topic", "t.x", RICH, b"body"))
def test_spark_row_headers_are_what_a_stomp_subscriber_reads(delivery):
    destination, headers = MessageRenderer().message_headers(delivery)
    expected = round_trip_row_headers(delivery)
    assert list(headers.items()) == list(expected.items())
    assert destination == expected["destination"]


def test_the_property_headers_in_the_plugins_order():
    pairs = message_headers(
        MessageProperties(
            content_type="t/p",
            content_encoding="gzip",
            headers={"h": decimal.Decimal("1.50"), "content-length": "3"},
            delivery_mode=1,
            priority=0,
            correlation_id="c",
            reply_to="/topic/r",
            expiration="60000",
            message_id="m",
            timestamp=5,
            type="t",
            user_id="u",
            app_id="a",
            cluster_id="ignored",
        )
    )
    assert pairs == [
        ("h", "1.50"),
        ("app-id", "a"),
        ("user-id", "u"),
        ("type", "t"),
        ("timestamp", "5"),
        ("amqp-message-id", "m"),
        ("expiration", "60000"),
        ("reply-to", "/topic/r"),
        ("correlation-id", "c"),
        ("priority", "0"),
        ("persistent", "1"),
        ("content-encoding", "gzip"),
        ("content-type", "t/p"),
    ]
    assert message_headers(MessageProperties()) == []


# ------------------------------------------------------------------ redelivery counts
def test_the_delivery_count_of_each_broker_generation() -> None:
    from adapter.mapping.properties import delivery_count

    assert delivery_count({"x-delivery-count": 3}) == 3  # a quorum queue before 4.0
    # 4.x: every earlier delivery is the acquired count; its x-delivery-count counts failures
    assert delivery_count({"x-acquired-count": 5, "x-delivery-count": 1}) == 5
    assert delivery_count({}) is None  # a classic queue: redelivered:true says it all
    assert delivery_count({"x-delivery-count": "3"}) is None  # not the broker's shape
    deaths = [
        {"queue": "retry", "reason": "expired", "count": 2, "exchange": ""},
        {"queue": "work", "reason": "rejected", "count": 2, "exchange": ""},
    ]
    assert delivery_count({"x-death": deaths}) == 2  # the consumers' rejections
    assert delivery_count({"x-death": [{"queue": "q", "reason": "expired", "count": 1}]}) is None


def test_redelivery_headers_lead_and_replace_the_broker_s_own_only_where_it_differs() -> None:
    from adapter.mapping.properties import redelivery_headers

    pairs = [("x-delivery-count", "3"), ("app", "a")]
    assert redelivery_headers({"x-delivery-count": 3}, pairs) == pairs  # 3.x: as the plugin
    four = [("x-acquired-count", "5"), ("x-delivery-count", "1"), ("app", "a")]
    assert redelivery_headers({"x-acquired-count": 5, "x-delivery-count": 1}, four) == [
        ("x-delivery-count", "5"),
        ("x-acquired-count", "5"),
        ("app", "a"),
    ]
    deaths = [
        {"queue": "retry", "reason": "expired", "count": 1},
        {"queue": "work", "reason": "rejected", "count": 1},
    ]
    assert redelivery_headers({"x-death": deaths}, [("x-death", "[...]")]) == [
        ("x-delivery-count", "1"),
        ("x-death-count", "2"),
        ("x-death-history", "retry expired x1, work rejected x1"),
        ("x-death", "[...]"),
    ]
    assert redelivery_headers({"x-death": "garbage"}, [("x-death", "garbage")]) == [("x-death", "garbage")]
