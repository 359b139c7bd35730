"""The plan of a scheduled SEND (adapter/mapping/scheduled.py): delays bucketed so the number of
delay queues is bounded whatever the clients send, never early, at most 10 % late."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapter.mapping.destinations import DestinationError, ProcessingError
from adapter.mapping.operations import BasicPublish, QueueBind, QueueDeclare
from adapter.mapping.properties import MessageProperties
from adapter.mapping.scheduled import (
    DELAY_NOW,
    DELAY_REFUSED,
    MAX_BUCKETS,
    MAX_DELAY_MS,
    ROUTE_HEADER,
    bucket,
    delay_plan,
    delay_queue,
    scheduled_delay,
    scheduled_publishes,
)


@given(st.integers(min_value=1, max_value=MAX_DELAY_MS))
def test_a_bucket_is_never_early_and_at_most_ten_percent_late(delay: int) -> None:
    b = bucket(delay)
    assert delay <= b <= max(delay, delay * 11 // 10 + 1)
    assert bucket(b) == b


def test_the_number_of_buckets_is_bounded() -> None:
    assert len({bucket(d) for d in range(1, 1_000_001)}) == 99 + 90 * 4 + 1
    assert MAX_BUCKETS == 99 + 90 * 7 + 31  # up to 4.0e9 ms: 1..99, d * 10**k (k = 1..7), 1.0e9..4.0e9
    assert bucket(1234) == 1300 and bucket(99) == 99 and bucket(101) == 110 and bucket(1000) == 1000


def test_the_delay_headers() -> None:
    assert scheduled_delay({}) is None
    assert scheduled_delay({"AMQ_SCHEDULED_DELAY": "0"}) is None
    assert scheduled_delay({"AMQ_SCHEDULED_DELAY": "-5"}) is None
    assert scheduled_delay({"AMQ_SCHEDULED_DELAY": " 1500 "}) == 1500
    assert scheduled_delay({"AMQ_SCHEDULED_DELAY": "10", "AMQ_SCHEDULED_REPEAT": "0"}) == 10
    for bad in ("soon", "1.5", "9" * 40, str(MAX_DELAY_MS + 1)):
        with pytest.raises(ProcessingError, match="AMQ_SCHEDULED_DELAY"):
            scheduled_delay({"AMQ_SCHEDULED_DELAY": bad})
    for name, value in (
        ("AMQ_SCHEDULED_PERIOD", "10"),
        ("AMQ_SCHEDULED_REPEAT", "2"),
        ("AMQ_SCHEDULED_CRON", "* * * * *"),
    ):
        with pytest.raises(DestinationError, match=name) as raised:
            scheduled_delay({name: value, "AMQ_SCHEDULED_DELAY": "10"})
        assert raised.value.message == "Scheduled delivery not supported"


def test_delay_plan_is_the_bucket_or_now_or_refused() -> None:
    """The migration report's key for a recorded delay (adapter/migrate/report.py groups by it)."""
    assert delay_plan(None) is None
    assert [delay_plan(v) for v in ("1234", "1250", " 1300 ", "7", "99", "100")] == [
        "1300",
        "1300",
        "1300",
        "7",
        "99",
        "100",
    ]
    assert {delay_plan(v) for v in ("0", "-5", "-0")} == {DELAY_NOW}
    assert {delay_plan(v) for v in ("soon", "1.5", "9" * 40, str(MAX_DELAY_MS + 1), "")} == {DELAY_REFUSED}
    # the other scheduling headers are not its business
    assert delay_plan("10") == "10"


@given(st.integers(min_value=-10, max_value=MAX_DELAY_MS), st.integers(min_value=-10, max_value=MAX_DELAY_MS))
def test_two_delays_of_one_plan_have_one_delay_queue(first: int, second: int) -> None:
    """So the report may keep any one recorded value of a plan: it plans the same queue."""
    plans = delay_plan(str(first)), delay_plan(str(second))
    queues = [
        delay_queue(bucket(d), "")[0] if d > 0 else None
        for d in (first, second)  # > 0: delayed
    ]
    assert (plans[0] == plans[1]) == (queues[0] == queues[1])
    assert plans[0] == (str(bucket(first)) if first > 0 else DELAY_NOW)


def test_the_plan_routes_through_a_delay_queue_that_dead_letters_into_the_target() -> None:
    props = MessageProperties(headers={"a": "1", "AMQ_SCHEDULED_DELAY": "1234"}, expiration="500")
    publishes = [
        BasicPublish("", "orders", props, b"x", "/queue/orders"),
        BasicPublish("amq.topic", "prices", props, b"x", "/topic/prices"),
        BasicPublish("", "other", props, b"x", "/queue/other"),
    ]
    prepare, routed = scheduled_publishes(publishes, 1234, "amq.topic")
    queue_q, params_q = delay_queue(1300, "")
    queue_t, _ = delay_queue(1300, "amq.topic")
    assert params_q.arguments == {"x-message-ttl": 1300, "x-expires": 61300, "x-dead-letter-exchange": ""}
    declares = [op.queue for op in prepare if isinstance(op, QueueDeclare)]
    assert declares == [queue_q, queue_t]  # one per delay queue, not per publish
    assert all(op.nowait and op.durable for op in prepare if isinstance(op, QueueDeclare))
    binds = [op for op in prepare if isinstance(op, QueueBind)]
    assert binds[0] == QueueBind(queue_q, "amq.headers", "", (("x-match", "all"), (ROUTE_HEADER, queue_q)))
    assert [(p.exchange, p.routing_key) for p in routed] == [
        ("amq.headers", "orders"),
        ("amq.headers", "prices"),
        ("amq.headers", "other"),
    ]
    assert routed[1].properties.headers == {"a": "1", ROUTE_HEADER: queue_t}
    assert routed[0].properties.expiration is None  # it would dead-letter the message early
    with pytest.raises(DestinationError, match="/exchange/x/k"):
        scheduled_publishes([BasicPublish("x", "k", props, b"", "/exchange/x/k")], 10, "amq.topic")
