"""adapter/spark without Spark or broker: rows rendered as MESSAGE frames, rows planned as SENDs,
and the broker URL option."""

from __future__ import annotations

import datetime

import pytest

from adapter.mapping.operations import Delivery
from adapter.mapping.properties import MessageProperties
from adapter.spark.broker import parse_broker_url
from adapter.spark.messages import MessageRenderer, PublishPlanner, RowColumns, RowError
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


def varied_deliveries() -> list[Delivery]:
    raw = b"caf\xe9".decode("utf-8", "surrogateescape")
    return [
        delivery(MessageProperties(headers={"x-stream-offset": 0}), b""),
        delivery(
            MessageProperties(headers={"x-stream-offset": 1, "custom": "v", "n": 5}, timestamp=1_700_000_000),
            exchange="amq.topic",
            key="t.x",
        ),
        delivery(MessageProperties(headers={"x-stream-offset": 2, "h": raw}, content_type="text/plain")),
        Delivery("ignored", 9, True, "", "s", MessageProperties(headers={"x-stream-offset": 3}), b"again"),
        delivery(MessageProperties(headers={"x-stream-offset": 4}, timestamp=2**63), b"far future"),
        delivery(MessageProperties(headers={"x-stream-offset": 5}), exchange="", key="a/b"),
        # names the session or a property also writes: the first value wins
        delivery(
            MessageProperties(headers={"x-stream-offset": 6, "persistent": "no", "ack": "x"}, delivery_mode=2)
        ),
        # two names that are one once their bytes that are not UTF-8 are replaced
        delivery(
            MessageProperties(headers={"x-stream-offset": 7, raw: "1", raw.replace("\udce9", "\udce8"): "2"})
        ),
    ]


def rows_of(columns: RowColumns) -> list[tuple[object, ...]]:
    """The columns as rows, the headers map rebuilt from its offsets, names and values."""
    columns.flatten_headers()
    ends, names, values = columns.header_ends, columns.header_names, columns.header_values
    assert len(ends) == len(columns) + 1 and ends[0] == 0
    return [
        (
            columns.destinations[i],
            dict(zip(names[ends[i] : ends[i + 1]], values[ends[i] : ends[i + 1]], strict=True)),
            columns.bodies[i],
            columns.offsets[i],
            columns.timestamps[i],
            columns.stream,
        )
        for i in range(len(columns))
    ]


def micros(timestamp: datetime.datetime | None) -> int | None:
    if timestamp is None:
        return None
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return (timestamp - epoch) // datetime.timedelta(microseconds=1)


@pytest.mark.parametrize("include_headers", [True, False])
def test_columns_hold_the_rows_the_renderer_makes(include_headers):
    deliveries = varied_deliveries()
    renderer = MessageRenderer(include_headers=include_headers)
    columns = RowColumns("s")
    # in two pieces, as two reads of the socket bring them
    renderer.add_rows(columns, deliveries[:2], [0, 1])
    renderer.add_rows(columns, deliveries[2:], list(range(2, len(deliveries))))
    rendered = [
        MessageRenderer().row(d, "s", n)
        if include_headers
        else MessageRenderer().row_without_headers(d, "s", n)
        for n, d in enumerate(deliveries)
    ]
    expected = [(d, h, b, n, micros(t), s) for d, h, b, n, t, s in rendered]
    assert rows_of(columns) == expected
    assert columns.body_bytes == sum(len(d.body) for d in deliveries)
    if include_headers:
        assert columns.header_values[columns.header_names.index("h")] == "caf\ufffd"
        assert rows_of(columns)[3][1]["redelivered"] == "true"
    else:
        assert columns.header_names == [] and set(columns.header_ends) == {0}
    assert columns.timestamps[1] == 1_700_000_000_000_000 and columns.timestamps[4] is None


def test_rows_without_headers_are_planned_once_per_destination_with_the_same_result():
    planner = PublishPlanner(max_body_size=10)
    first, _ = planner.plan("/queue/q", None, b"one")
    again, body = planner.plan("/queue/q", {}, "two")
    fresh, _ = PublishPlanner(max_body_size=10).plan("/queue/q", None, b"two")
    assert first.declare is not None and again.declare is None
    assert again._replace(declare=fresh.declare) == fresh
    assert body == b"two"
    with pytest.raises(RowError, match="over the frame limit of 10 bytes"):
        planner.plan("/queue/q", None, b"x" * 11)
    with_headers, _ = planner.plan("/queue/q", {"custom": "1"}, b"three")
    assert with_headers.properties.headers == {"custom": "1"}
    assert planner.plan("/queue/q", None, b"four")[0].properties.headers == first.properties.headers


def test_rows_are_planned_as_sends():
    planner = PublishPlanner()
    first, body = planner.plan("/queue/q", {"custom": "1", "content-type": "text/plain"}, "text")
    assert first.declare is not None and first.declare[0] == "q" and first.declare[1].durable
    assert (first.exchange, first.routing_key, body) == ("", "q", b"text")
    assert first.properties.content_type == "text/plain"
    assert first.properties.headers == {"custom": "1"}
    assert first.properties.delivery_mode == 2
    assert not first.mandatory
    assert planner.plan("/queue/q", None, b"again")[0].declare is None  # declared once, as per connection
    topic, _ = planner.plan("/exchange/amq.topic/k", None, b"")
    assert (topic.exchange, topic.routing_key) == ("amq.topic", "k")
    assert planner.plan("/amq/queue/named", None, b"")[0].mandatory


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
