"""Scheduled delivery (activemq profile, adapter/mapping/scheduled.py) against the real RabbitMQ:
hostile input first.  10,000 distinct ``AMQ_SCHEDULED_DELAY`` values create at most the bounded
number of delay queues, every message still arrives, the refused scheduling headers
get an ERROR, and a bystander connection stays served throughout.  The STOMP side is stomp.py,
the broker side the management API (BrokerProbe)."""

from __future__ import annotations

from collections.abc import Callable

from adapter.mapping.scheduled import MAX_BUCKETS, bucket
from tests.support import AdapterProcess, BrokerProbe, StompClient, expect_receipt, unique

DELAYS = range(1, 10_001)


def delay_queues(broker: BrokerProbe, vhost: str) -> list[str]:
    from urllib.parse import quote

    queues = broker.management(f"/api/queues/{quote(vhost, safe='')}?columns=name") or []
    return [q["name"] for q in queues if q["name"].startswith("activemq.scheduled.")]


def bystander_round_trip(bystander: StompClient, queue: str, body: str) -> None:
    bystander.conn.send(f"/queue/{queue}", body, headers={"receipt": f"b-{body}"})
    expect_receipt(bystander, f"b-{body}")
    assert bystander.next("MESSAGE", timeout=10).body == body


def test_ten_thousand_distinct_delays_make_a_bounded_number_of_delay_queues(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    adapter = start_adapter(profile="activemq")
    vhost = broker.scratch_vhost("sched")  # deleted with every queue in it
    bystander_queue = unique("by")
    broker.track_queue(bystander_queue)
    bystander = StompClient(adapter.port)
    bystander.conn.subscribe(f"/queue/{bystander_queue}", "b", headers={"receipt": "bs"})
    expect_receipt(bystander, "bs")

    hostile = StompClient(adapter.port, vhost=vhost)
    hostile.conn.subscribe("/queue/target", "t", headers={"receipt": "ts"})
    expect_receipt(hostile, "ts")
    for delay in DELAYS:
        headers = {"AMQ_SCHEDULED_DELAY": str(delay)}
        if delay == DELAYS[-1]:
            headers["receipt"] = "last"
        hostile.conn.send("/queue/target", str(delay), headers=headers)
    expect_receipt(hostile, "last", timeout=120)
    bystander_round_trip(bystander, bystander_queue, "during")

    names = delay_queues(broker, vhost)
    expected = {bucket(delay) for delay in DELAYS}
    assert len(names) == len(expected) <= MAX_BUCKETS, (len(names), len(expected))
    assert len(expected) == 280  # 1..99, then 10 ms, 100 ms and 1 s steps, and 10 s

    # every message arrives (the order against undelayed messages: tests/activemq)
    arrived = [hostile.next("MESSAGE", timeout=60).body for _ in DELAYS]
    assert sorted(arrived) == sorted(map(str, DELAYS))
    assert hostile.nothing_more()
    bystander_round_trip(bystander, bystander_queue, "after")
    hostile.close()
    bystander.close()


def test_repeated_delivery_is_refused(
    start_adapter: Callable[..., AdapterProcess], broker: BrokerProbe
) -> None:
    adapter = start_adapter(profile="activemq")
    queue = unique("rep")
    broker.track_queue(queue)
    bystander = StompClient(adapter.port)
    bystander.conn.subscribe(f"/queue/{queue}", "b", headers={"receipt": "bs"})
    expect_receipt(bystander, "bs")
    cases = [
        ({"AMQ_SCHEDULED_PERIOD": "1000", "AMQ_SCHEDULED_REPEAT": "3"}, "Scheduled delivery not supported"),
        ({"AMQ_SCHEDULED_CRON": "* * * * *"}, "Scheduled delivery not supported"),
        ({"AMQ_SCHEDULED_DELAY": "soon"}, "Processing error"),
        ({"AMQ_SCHEDULED_DELAY": "9" * 30}, "Processing error"),
        ({"AMQ_SCHEDULED_DELAY": "5000000000"}, "Processing error"),
    ]
    for headers, message in cases:
        client = StompClient(adapter.port)
        client.conn.send(f"/queue/{queue}", "never", headers={**headers, "receipt": "r"})
        error = client.next("ERROR")
        assert error.headers["message"] == message, (headers, error)
        client.close()
    bystander_round_trip(bystander, queue, "served")  # and no "never" came before it
    # /exchange/ destinations are not scheduled: a delay queue per exchange would be unbounded
    client = StompClient(adapter.port)
    client.conn.send("/exchange/amq.direct/k", "never", headers={"AMQ_SCHEDULED_DELAY": "10", "receipt": "r"})
    assert client.next("ERROR").headers["message"] == "Scheduled delivery not supported"
    client.close()
    bystander.close()
