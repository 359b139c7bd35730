"""adapter/spark without Spark or broker: rows rendered as MESSAGE frames, rows planned as SENDs,
and the broker URL option."""

from __future__ import annotations

import datetime

import pytest

from adapter.mapping.operations import Delivery
from adapter.mapping.properties import MessageProperties
from adapter.spark.broker import parse_broker_url
from adapter.spark.messages import MessageRenderer, PublishPlanner, RowError
from adapter.spark.streams import StreamOptionError, split_range, stream_refs


def delivery(
    properties: MessageProperties, body: bytes = b"body", exchange: str = "", key: str = "s"
) -> Delivery:
    return Delivery("ignored", 7, False, exchange, key, properties, body)


def test_row_headers_are_the_message_headers_without_the_subscription_ones():
    renderer = MessageRenderer()
    properties = MessageProperties(
        headers={"custom": "a:b\nc\\d", "x-stream-offset": 12, "flag": True},
        content_type="text/plain",
        reply_to="answers",
        delivery_mode=2,
        timestamp=1_700_000_000,
    )
    message = renderer.render(delivery(properties, exchange="amq.topic", key="t.x"), "s")
    assert message.destination == "/topic/t.x"
    assert message.offset == 12
    assert message.timestamp == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    assert message.headers == {
        "destination": "/topic/t.x",
        "redelivered": "false",
        "custom": "a:b\nc\\d",  # escaped on the frame, read back as sent
        "x-stream-offset": "12",
        "flag": "true",
        "timestamp": "1700000000",
        "reply-to": "/reply-queue/answers",
        "persistent": "true",
        "content-type": "text/plain",
        "content-length": "4",
    }


def test_header_bytes_that_are_not_utf8_become_replacement_characters():
    renderer = MessageRenderer()
    raw = b"caf\xe9".decode("utf-8", "surrogateescape")
    message = renderer.render(delivery(MessageProperties(headers={"h": raw, "x-stream-offset": 0})), "s")
    assert message.headers["h"] == "caf\ufffd"


def test_a_row_without_headers_keeps_every_other_column():
    renderer = MessageRenderer()
    properties = MessageProperties(headers={"custom": "v", "x-stream-offset": 3}, timestamp=1_700_000_000)
    full = renderer.row(delivery(properties, exchange="amq.topic", key="t.x"), "s", 3)
    bare = renderer.row_without_headers(delivery(properties, exchange="amq.topic", key="t.x"), "s", 3)
    assert bare[1] == {} and full[1]["custom"] == "v"
    assert bare[:1] + bare[2:] == full[:1] + full[2:]


def test_a_delivery_without_stream_offset_is_refused():
    renderer = MessageRenderer()
    with pytest.raises(ValueError, match="is the queue a stream"):
        renderer.render(delivery(MessageProperties()), "s")


def test_rows_are_planned_as_sends():
    planner = PublishPlanner()
    first = planner.plan("/queue/q", {"custom": "1", "content-type": "text/plain"}, "text")
    assert first.declare is not None and first.declare[0] == "q" and first.declare[1].durable
    assert (first.exchange, first.routing_key, first.body) == ("", "q", b"text")
    assert first.properties.content_type == "text/plain"
    assert first.properties.headers == {"custom": "1"}
    assert first.properties.delivery_mode == 2
    assert not first.mandatory
    assert planner.plan("/queue/q", None, b"again").declare is None  # declared once, as per connection
    topic = planner.plan("/exchange/amq.topic/k", None, b"")
    assert (topic.exchange, topic.routing_key) == ("amq.topic", "k")
    assert planner.plan("/amq/queue/named", None, b"").mandatory


@pytest.mark.parametrize(
    ("destination", "headers", "body", "text"),
    [
        (None, None, b"", "Missing destination"),
        ("/nowhere/x", None, b"", "Unknown destination"),
        ("/temp-queue/t", None, b"", "Invalid destination"),
        ("/queue/q", {"message-id": "m"}, b"", "Invalid header"),
        ("/queue/q", {"priority": "high"}, b"", "must be an integer"),
        ("/queue/q", {"x-max-length": "many"}, b"", "must be an integer"),
        ("/queue/q", {"reply-to": "/temp-queue/r"}, b"", "needs a STOMP connection"),
        ("/queue/q", None, b"x" * 11, "over the frame limit of 10 bytes"),
    ],
)
def test_rows_the_adapter_would_refuse(destination, headers, body, text):
    with pytest.raises(RowError, match=text):
        PublishPlanner(max_body_size=10).plan(destination, headers, body)


def test_broker_url():
    url = parse_broker_url("amqps://user:p%40ss@broker:5671/%2F?cacertfile=/ca.pem")
    assert (url.host, url.port, url.tls, url.user, url.password, url.vhost) == (
        "broker",
        5671,
        True,
        "user",
        "p@ss",
        "/",
    )
    assert url.cafile == "/ca.pem"
    assert "p@ss" not in url.redacted
    assert parse_broker_url("amqp://localhost").vhost == "/"
    assert parse_broker_url("amqp://h/prod").vhost == "prod"
    with pytest.raises(ValueError, match="amqp:// or amqps://"):
        parse_broker_url("http://h/")


def test_stream_destination_option():
    assert [r.queue for r in stream_refs("/amq/queue/a, /amq/queue/b", None, {})] == ["a", "b"]
    assert stream_refs("/topic/readings", "kept", {})[0].queue == "kept"
    with pytest.raises(StreamOptionError, match="option 'stream'"):
        stream_refs("/topic/readings", None, {})
    with pytest.raises(StreamOptionError, match="Unknown destination"):
        stream_refs("/bad/x", None, {})


def test_ranges_are_split_for_parallel_tasks():
    assert [(r.start, r.end) for r in split_range("s", "/amq/queue/s", 5, 30, 10)] == [
        (5, 15),
        (15, 25),
        (25, 30),
    ]
    assert split_range("s", "/amq/queue/s", 5, 5, 10) == []


def test_several_broker_nodes_in_url():
    url = parse_broker_url("amqp://a:pa@h1:5673/v, amqps://b:pb@h2/v")
    assert (url.host, url.port, url.user) == ("h1", 5673, "a")
    nodes = url.nodes()
    assert {(n.host, n.port, n.tls, n.user, n.password, n.vhost) for n in nodes} == {
        ("h1", 5673, False, "a", "pa", "v"),
        ("h2", 5671, True, "b", "pb", "v"),
    }
    assert all(not n.others for n in nodes)
    assert [n.host for n in parse_broker_url("amqp://solo/").nodes()] == ["solo"]
