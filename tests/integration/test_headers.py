"""STOMP headers <-> AMQP properties and headers table, against the real broker
(docs/destinations.md#send--amqp; docs/destinations.md#amqp--message).

SEND side: what the adapter published is read back with aio-pika's basic.get (raw properties as
they were on the wire).  MESSAGE side: messages are published with aio-pika and the MESSAGE
frames are checked as stomp.py parsed them.
"""

from __future__ import annotations

import datetime
import decimal

import pytest

from tests.support import expect_receipt, next_of, unique


@pytest.fixture
def queue(broker):
    name = unique("hdr")
    broker.track_queue(name)
    return name


# ------------------------------------------------------------------------------ SEND → AMQP
def test_send_headers_become_amqp_properties(stomp_client, broker, queue):
    client = stomp_client()
    client.conn.send(
        f"/queue/{queue}",
        "body",
        content_type="text/plain",
        headers={
            "content-encoding": "identity",
            "correlation-id": "corr-1",
            "priority": " 5 ",
            "persistent": "true",
            "expiration": "60000",
            "amqp-message-id": "amqp-1",
            "type": "order.created",
            "app-id": "tests",
            "timestamp": "1700000000",
            "user-id": "guest",
            "reply-to": "/queue/answers",
            "x-custom": "v",
            "colon": "a:b",
            "newline": "line1\nline2",
            "ünïcode": "välue",
            "receipt": "r",
        },
    )
    expect_receipt(client, "r")
    got = broker.get(queue)
    assert got.body == b"body"
    p = got.properties
    assert p.content_type == "text/plain"
    assert p.content_encoding == "identity"
    assert p.correlation_id == "corr-1"
    assert p.priority == 5
    assert p.delivery_mode == 2
    assert p.expiration == "60000"
    assert p.message_id == "amqp-1"
    assert p.message_type == "order.created"
    assert p.app_id == "tests"
    assert p.timestamp == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    assert p.user_id == "guest"
    assert p.reply_to == "/queue/answers"
    # everything else goes into the headers table as strings; property headers, destination
    # and the frame-control headers (receipt, content-length) do not (adapter choice, session.py)
    assert got.headers == {
        "x-custom": "v",
        "colon": "a:b",
        "newline": "line1\nline2",
        "ünïcode": "välue",
    }


def test_minimal_send_has_empty_headers_table_and_no_properties(stomp_client, broker, queue):
    broker.declare_queue(queue, durable=True, track=False)
    client = stomp_client()
    # /amq/queue: persistent:false would also make a new /queue exclusive
    # (docs/destinations.md#queue-flag-headers)
    client.conn.send(f"/amq/queue/{queue}", "", headers={"persistent": "false", "receipt": "r"})
    expect_receipt(client, "r")
    got = broker.get(queue)
    assert got.body == b""
    p = got.properties
    assert p.headers == {}  # present but empty (docs/destinations.md#send--amqp)
    assert p.delivery_mode is None  # persistent:false → absent (docs/destinations.md#send--amqp)
    for name in ("content_type", "priority", "correlation_id", "expiration", "message_id", "timestamp"):
        assert getattr(p, name) is None, name


def test_protocol_headers_other_than_frame_control_are_copied(stomp_client, broker, queue):
    client = stomp_client()
    client.conn.send(
        f"/queue/{queue}",
        "x",
        headers={"id": "i", "ack": "client", "durable": "true", "x-max-priority": "4", "receipt": "r"},
    )
    expect_receipt(client, "r")
    assert broker.get(queue).headers == {"id": "i", "ack": "client", "durable": "true", "x-max-priority": "4"}


def test_stomp_1_0_header_values_are_left_trimmed(stomp_client, broker, queue):
    client = stomp_client("1.0")
    client.conn.send(f"/queue/{queue}", "x", headers={"x-pad": "  padded ", "receipt": "r"})
    expect_receipt(client, "r")
    assert broker.get(queue).headers == {"x-pad": "padded "}


@pytest.mark.parametrize("headers", [{"priority": "high"}, {"timestamp": "yesterday"}])
def test_bad_integer_property_is_a_processing_error(stomp_client, broker, queue, headers):
    client = stomp_client()
    client.conn.send(f"/queue/{queue}", "x", headers=headers)
    error = client.next("ERROR")
    assert error.headers["message"] == "Processing error"
    assert client.wait_disconnected()
    assert not broker.queue_exists(queue) or broker.depth(queue) == 0


def test_message_id_on_send_is_refused(stomp_client, broker, queue):
    client = stomp_client()
    client.conn.send(f"/queue/{queue}", "x", headers={"message-id": "mine", "receipt": "r"})
    error = next_of(client, ("RECEIPT", "ERROR"))
    assert error.command == "ERROR"
    assert error.headers["message"] == "Invalid header"
    assert error.body == "'message-id' is not allowed on 'SEND'.\n"
    assert client.wait_disconnected()
    assert not broker.queue_exists(queue)  # nothing declared, nothing published


def test_bad_expiration_is_refused_by_the_broker(stomp_client, broker, queue):
    client = stomp_client()
    client.conn.send(f"/queue/{queue}", "x", headers={"expiration": "abc"})
    error = client.next("ERROR")
    assert error.headers["message"] == "precondition_failed"
    assert error.body == "PRECONDITION_FAILED - invalid expiration 'abc': no_integer"
    assert client.wait_disconnected()


def test_user_id_must_match_login(stomp_client, broker, queue):
    client = stomp_client()
    client.conn.send(f"/queue/{queue}", "x", headers={"user-id": "somebody-else"})
    error = client.next("ERROR")
    assert error.headers["message"] == "precondition_failed"
    assert error.body == (
        "PRECONDITION_FAILED - user_id property set to 'somebody-else' but authenticated user was 'guest'"
    )


# --------------------------------------------------------------------------- AMQP → MESSAGE
PROPERTY_ORDER = [
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
]


def test_amqp_properties_and_headers_become_message_headers(stomp_client, broker, queue):
    broker.declare_queue(queue, durable=True, track=False)
    client = stomp_client()
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    table = {
        "str": "text",
        "small": 5,  # aio-pika sends a one-byte integer
        "big": 2**40,
        "negative": -7,
        "flag": True,
        "off": False,
        "ratio": 1.5,
        "exact": decimal.Decimal("1.25"),
        "when": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
        "nested": {"a": 1, "b": "x"},
        "list": [1, "two", True],
        "bytes": bytearray(b"raw"),
        "nothing": None,
        "escape": "a:b\nc\\d",
    }
    broker.publish(
        "",
        queue,
        b"payload",
        content_type="application/json",
        content_encoding="utf-8",
        correlation_id="c-1",
        reply_to="reply-here",
        priority=3,
        delivery_mode=2,
        expiration=60,
        message_id="mid-1",
        timestamp=1700000000,
        type="evt",
        app_id="amqp-app",
        user_id="guest",
        headers=table,
    )
    message = client.next("MESSAGE")
    h = message.headers
    assert message.body == "payload"
    assert list(h)[:5] == ["subscription", "destination", "message-id", "redelivered", "ack"]
    assert h["subscription"] == "s"
    assert h["destination"] == f"/queue/{queue}"
    assert h["redelivered"] == "false"
    assert h["ack"] == h["message-id"]
    # every AMQP field type is rendered as text (adapter choice; the plugin drops all but
    # strings and 32/64-bit integers, properties.field_value_text)
    assert {name: h[name] for name in table} == {
        "str": "text",
        "small": "5",
        "big": "1099511627776",
        "negative": "-7",
        "flag": "true",
        "off": "false",
        "ratio": "1.5",
        "exact": "1.25",
        "when": "1704067200",
        "nested": '{"a":1,"b":"x"}',
        "list": '[1,"two",true]',
        "bytes": "raw",
        "nothing": "",
        "escape": "a:b\nc\\d",
    }
    assert {name: h[name] for name in PROPERTY_ORDER} == {
        "app-id": "amqp-app",
        "user-id": "guest",
        "type": "evt",
        "timestamp": "1700000000",
        "amqp-message-id": "mid-1",
        "expiration": "60000",
        "reply-to": "/reply-queue/reply-here",  # a bare queue name gets the prefix
        # (docs/destinations.md#temporary-queues)
        "correlation-id": "c-1",
        "priority": "3",
        "persistent": "true",
        "content-encoding": "utf-8",
        "content-type": "application/json",
    }
    names = list(h)
    # table entries come before the properties, which come in the plugin's fixed order
    # (docs/destinations.md#message-header-order)
    assert max(names.index(n) for n in table) < names.index("app-id")
    assert [n for n in names if n in PROPERTY_ORDER] == PROPERTY_ORDER
    assert names[-1] == "content-length" and h["content-length"] == "7"


def test_delivery_mode_other_than_2_and_missing_properties(stomp_client, broker, queue):
    broker.declare_queue(queue, durable=True, track=False)
    client = stomp_client()
    client.conn.subscribe(f"/queue/{queue}", id="s", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    broker.publish("", queue, b"", delivery_mode=1)
    h = client.next("MESSAGE").headers
    assert h["persistent"] == "1"  # any other value is shown as the number
    # (docs/destinations.md#amqp--message)
    assert "content-length" not in h  # empty body
    for absent in ("content-type", "correlation-id", "reply-to", "expiration", "type", "app-id", "user-id"):
        assert absent not in h, absent


def test_reply_to_with_destination_prefix_is_unchanged(stomp_client, broker, queue):
    broker.declare_queue(queue, durable=True, track=False)
    client = stomp_client()
    client.conn.subscribe(f"/queue/{queue}", id="s", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    for reply_to in ("/queue/q", "/topic/t", "/exchange/x/k", "/amq/queue/q", "/reply-queue/r"):
        broker.publish("", queue, reply_to.encode(), reply_to=reply_to)
        message = client.next("MESSAGE")
        assert message.headers["reply-to"] == message.body


def test_headers_round_trip_between_stomp_clients(stomp_client, broker, queue):
    sender, receiver = stomp_client("1.1"), stomp_client("1.2")
    receiver.conn.subscribe(f"/queue/{queue}", id="s", headers={"receipt": "sub"})
    expect_receipt(receiver, "sub")
    sender.conn.send(
        f"/queue/{queue}",
        "hi",
        content_type="text/plain",
        headers={"custom": "x:y", "correlation-id": "c", "persistent": "true", "priority": "1"},
    )
    h = receiver.next("MESSAGE").headers
    assert (h["custom"], h["correlation-id"], h["persistent"], h["priority"]) == ("x:y", "c", "true", "1")
    assert h["content-type"] == "text/plain"
