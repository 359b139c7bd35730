"""The SUBSCRIBE headers of the current plugin (x-priority, the stream filters, the
``x-stream-offset`` forms) and the queue-argument headers the broker supports
(x-delivery-limit, x-single-active-consumer, x-overflow), against the real RabbitMQ 3.10.8, and
through the AMQP proxy's method log (tests/amqp_proxy.py) where 3.10.8 cannot show the effect.

A bystander client of the same adapter stays served when a header is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from pamqp import commands

from tests.amqp_proxy import MethodLog, ProxyThread
from tests.support import AdapterProcess, BrokerProbe, StompClient, unique


@pytest.fixture
def logged(
    amqp_url: str, start_adapter: Callable[..., AdapterProcess]
) -> Iterator[tuple[AdapterProcess, MethodLog]]:
    log = MethodLog()
    with ProxyThread(amqp_url, [log]) as proxy:
        yield start_adapter(amqp_url=proxy.url), log


def _connected(port: int) -> StompClient:
    client = StompClient(port)
    client.next("CONNECTED")
    return client


def _subscribe(client: StompClient, destination: str, sub_id: str, ack: str = "auto", **headers: str) -> None:
    client.conn.subscribe(destination, id=sub_id, ack=ack, headers={"receipt": f"r-{sub_id}", **headers})
    answer = client.next(("RECEIPT", "ERROR"))
    assert answer.command == "RECEIPT", answer


def _consume_arguments(log: MethodLog, tag_part: str) -> dict[str, object]:
    [consume] = [c for c in log.sent(commands.Basic.Consume) if tag_part in c.consumer_tag]
    return dict(consume.arguments)


def test_x_priority_consumer_gets_every_message(
    logged: tuple[AdapterProcess, MethodLog], broker: BrokerProbe
) -> None:
    adapter, log = logged
    queue = unique("prio-")
    broker.track_queue(queue)
    low, high = _connected(adapter.port), _connected(adapter.port)
    # the low-priority consumer first: without priorities round-robin would give it some
    _subscribe(low, f"/queue/{queue}", "low", ack="client")
    _subscribe(high, f"/queue/{queue}", "high", ack="client", **{"x-priority": " 10 "})
    assert _consume_arguments(log, "high") == {"x-priority": 10}
    for n in range(4):
        high.conn.send(f"/queue/{queue}", f"m{n}")
    assert [high.next("MESSAGE").body for _ in range(4)] == ["m0", "m1", "m2", "m3"]
    low.conn.send("/queue/unused-" + queue, "x", headers={"receipt": "done"})  # a round trip
    broker.track_queue("unused-" + queue)
    assert low.next(("MESSAGE", "RECEIPT")).command == "RECEIPT"  # nothing was left for it


def test_x_priority_outside_a_byte_is_a_clean_error(adapter: AdapterProcess, broker: BrokerProbe) -> None:
    queue = unique("prio-")
    broker.track_queue(queue)
    bystander = _connected(adapter.port)
    client = _connected(adapter.port)
    client.conn.subscribe(f"/queue/{queue}", id="s", headers={"x-priority": "1000"})
    error = client.next("ERROR")
    assert "x-priority" in error.body and "-128 to 127" in error.body
    _subscribe(bystander, f"/queue/{queue}", "b")
    bystander.conn.send(f"/queue/{queue}", "still here")
    assert bystander.next("MESSAGE").body == "still here"


def test_stream_filter_headers_are_passed_as_the_plugin_passes_them(
    logged: tuple[AdapterProcess, MethodLog], broker: BrokerProbe
) -> None:
    adapter, log = logged
    stream = unique("stream-")
    broker.track_queue(stream)
    client = _connected(adapter.port)
    headers = {
        "x-queue-type": "stream",
        "durable": "true",
        "auto-delete": "false",
        "x-stream-filter-size-bytes": "32",
        "x-stream-filter": "red,blue",
        "x-stream-match-unfiltered": "True",
        "x-stream-offset": "offset=0",
        "prefetch-count": "10",
    }
    _subscribe(client, f"/queue/{stream}", "f", ack="client", **headers)
    [declare] = log.declares(stream)
    assert declare.arguments["x-stream-filter-size-bytes"] == 32
    assert _consume_arguments(log, "f") == {
        "x-stream-offset": 0,
        "x-stream-filter": ["red", "blue"],
        "x-stream-match-unfiltered": True,
    }
    client.conn.send(f"/queue/{stream}", "red one", headers={"x-stream-filter-value": "red"})
    message = client.next("MESSAGE")
    assert message.body == "red one"
    [publish] = log.sent(commands.Basic.Publish)[-1:]
    assert publish.routing_key == stream


def test_stream_offset_forms_on_a_real_stream(adapter: AdapterProcess, broker: BrokerProbe) -> None:
    stream = unique("stream-")
    broker.track_queue(stream)
    broker.declare_queue(stream, durable=True, arguments={"x-queue-type": "stream"})
    client = _connected(adapter.port)
    for n in range(3):
        client.conn.send(f"/amq/queue/{stream}", f"m{n}", headers={"receipt": f"p{n}"})
        client.next("RECEIPT")
    reader = _connected(adapter.port)
    _subscribe(
        reader,
        f"/amq/queue/{stream}",
        "o",
        ack="client",
        **{"x-stream-offset": "offset=1", "prefetch-count": "5"},
    )
    assert [reader.next("MESSAGE").body for _ in range(2)] == ["m1", "m2"]
    other = _connected(adapter.port)
    _subscribe(
        other,
        f"/amq/queue/{stream}",
        "t",
        ack="client",
        **{"x-stream-offset": "timestamp=0", "prefetch-count": "5"},
    )
    assert other.next("MESSAGE").body == "m0"  # from the start of time: everything


def test_queue_argument_headers_reach_the_broker(adapter: AdapterProcess, broker: BrokerProbe) -> None:
    quorum, classic = unique("qq-"), unique("sac-")
    broker.track_queue(quorum, classic)
    client = _connected(adapter.port)
    _subscribe(
        client,
        f"/queue/{quorum}",
        "q",
        **{"x-queue-type": "quorum", "durable": "true", "auto-delete": "false", "x-delivery-limit": "3"},
    )
    _subscribe(
        client,
        f"/queue/{classic}",
        "c",
        **{"x-single-active-consumer": "true", "x-overflow": "reject-publish"},
    )
    arguments = {q: broker.management(f"/api/queues/%2F/{q}")["arguments"] for q in (quorum, classic)}
    assert arguments[quorum]["x-delivery-limit"] == 3 and arguments[quorum]["x-queue-type"] == "quorum"
    assert arguments[classic] == {"x-single-active-consumer": True, "x-overflow": "reject-publish"}
    assert broker.management(f"/api/queues/%2F/{quorum}")["type"] == "quorum"
