"""Redelivery counts on MESSAGE (issue 38 item 1; docs/destinations.md#redelivery-counts), against the
real broker: a quorum queue's count as the broker gives it, a count rebuilt from ``x-death`` for a
message that comes back through dead-lettering after NACKs, and nothing but ``redelivered:true``
where nothing counts (a classic queue)."""

from __future__ import annotations

from tests.support import AdapterProcess, BrokerProbe, Frame, RawSession, unique


def next_message(session: RawSession) -> Frame:
    while True:
        frames = session.frames_until(("MESSAGE",), timeout=10)
        messages = [frame for frame in frames if frame[0] == "MESSAGE"]
        if messages:
            return messages[-1]


def nack(session: RawSession, message: Frame, requeue: bool) -> None:
    got = session.send(f"NACK\nid:{message[1]['ack']}\nrequeue:{str(requeue).lower()}\nreceipt:n\n\n")
    assert got[-1][0] == "RECEIPT", got


def subscribe(adapter: AdapterProcess, queue: str) -> RawSession:
    session = RawSession(adapter.port)
    got = session.send(
        f"SUBSCRIBE\nid:s\ndestination:/amq/queue/{queue}\nack:client-individual\nreceipt:r\n\n"
    )
    assert got[-1][0] == "RECEIPT", got
    return session


def test_a_quorum_queue_counts_each_requeue(adapter: AdapterProcess, broker: BrokerProbe) -> None:
    queue = unique("rc-quorum")
    broker.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
    broker.publish("", queue, b"again")
    session = subscribe(adapter, queue)
    message = next_message(session)
    assert message[1]["redelivered"] == "false" and "x-delivery-count" not in message[1]
    for expected in ("1", "2"):
        nack(session, message, requeue=True)
        message = next_message(session)
        assert message[1]["redelivered"] == "true" and message[1]["x-delivery-count"] == expected, message
    session.disconnect()


def test_a_classic_queue_says_redelivered_and_no_count(adapter: AdapterProcess, broker: BrokerProbe) -> None:
    queue = unique("rc-classic")
    broker.declare_queue(queue)
    broker.publish("", queue, b"again")
    session = subscribe(adapter, queue)
    nack(session, next_message(session), requeue=True)
    again = next_message(session)
    assert again[1]["redelivered"] == "true" and "x-delivery-count" not in again[1], again
    session.disconnect()


def test_a_message_back_from_dead_lettering_counts_its_rejections(
    adapter: AdapterProcess, broker: BrokerProbe
) -> None:
    """A retry loop made of RabbitMQ's own parts: NACK without requeue dead-letters the message to
    a queue whose TTL dead-letters it back.  It is a new delivery for the broker
    (``redelivered:false``), and the adapter counts the consumers' rejections from ``x-death``."""
    work, retry = unique("rc-work"), unique("rc-retry")
    broker.declare_queue(work, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": retry})
    broker.declare_queue(
        retry,
        arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": work},
    )
    broker.publish("", work, b"retried")
    session = subscribe(adapter, work)
    message = next_message(session)
    assert "x-delivery-count" not in message[1]
    for rejected in (1, 2):
        nack(session, message, requeue=False)
        message = next_message(session)
        headers = message[1]
        assert headers["x-delivery-count"] == str(rejected), headers
        assert headers["x-death-count"] == str(2 * rejected), headers
        assert headers["x-death-history"] == f"{retry} expired x{rejected}, {work} rejected x{rejected}", (
            headers
        )
        assert message[2] == b"retried"
    session.disconnect()
