"""Retry with back-off for NACK (issue 38 item 2; docs/destinations.md#retry-with-back-off), against
the real broker, with an independent client (raw STOMP frames) and RabbitMQ's own view (queue
depths): a NACK sends the message to the delay queue of its attempt and it comes back with
``x-delivery-count`` raised; after the last delay a NACK dead-letters it; nothing is lost or
duplicated on the way."""

from __future__ import annotations

from typing import Any

import pytest

from adapter.session.retries import retry_queue
from tests.support import AdapterProcess, BrokerProbe, Frame, RawSession, unique


def next_message(session: RawSession, timeout: float = 10) -> Frame:
    while True:
        frames = session.frames_until(("MESSAGE",), timeout=timeout)
        messages = [frame for frame in frames if frame[0] == "MESSAGE"]
        assert frames, "closed"
        if messages:
            return messages[-1]


def settle(session: RawSession, command: str, message: Frame) -> None:
    got = session.send(f"{command}\nid:{message[1]['ack']}\nreceipt:n\n\n")
    assert got[-1][0] == "RECEIPT", got


def retry_subscriber(adapter: AdapterProcess, queue: str, delays: str, extra: str = "") -> RawSession:
    session = RawSession(adapter.port)
    got = session.send(
        f"SUBSCRIBE\nid:s\ndestination:/amq/queue/{queue}\nack:client-individual\n"
        f"x-retry-delays:{delays}\n{extra}receipt:r\n\n"
    )
    assert got[-1][0] == "RECEIPT", got
    return session


def test_each_nack_waits_its_delay_and_the_last_dead_letters(
    adapter: AdapterProcess, broker: BrokerProbe
) -> None:
    work, dead = unique("retry-work"), unique("retry-dead")
    broker.declare_queue(dead)
    broker.declare_queue(work, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    broker.track_queue(*(retry_queue(delay, work).queue for delay in (100, 300)))
    session = retry_subscriber(adapter, work, "100,300")
    broker.publish("", work, b"flaky", headers={"app": "a"})
    message = next_message(session)
    assert "x-delivery-count" not in message[1]
    for attempt in (1, 2):
        settle(session, "NACK", message)
        # the RECEIPT means the copy is in the delay queue and the original acknowledged
        message = next_message(session)
        assert message[2] == b"flaky" and message[1]["app"] == "a"
        assert message[1]["x-delivery-count"] == str(attempt), message
    settle(session, "NACK", message)  # after the last delay: the queue's own dead-lettering
    assert broker.wait_depth(dead, 1) == 1
    assert broker.wait_depth(work, 0) == 0
    session.disconnect()


def test_after_the_last_delay_a_named_exchange_gets_it(adapter: AdapterProcess, broker: BrokerProbe) -> None:
    work, parked = unique("retry-work"), unique("retry-parked")
    exchange = unique("retry-dlx")
    broker.declare_exchange(exchange, "fanout")
    broker.declare_queue(work)
    broker.declare_queue(parked)
    broker.bind(parked, exchange)
    broker.track_queue(retry_queue(50, work).queue)
    session = retry_subscriber(adapter, work, "50", f"x-retry-dead-letter-exchange:{exchange}\n")
    broker.publish("", work, b"poison")
    message = next_message(session)
    settle(session, "NACK", message)
    message = next_message(session)
    assert message[1]["x-delivery-count"] == "1"
    settle(session, "NACK", message)
    assert broker.wait_depth(parked, 1) == 1
    assert broker.wait_depth(work, 0) == 0
    session.disconnect()


def test_a_dead_letter_exchange_that_routes_it_nowhere_keeps_the_message(
    adapter: AdapterProcess, broker: BrokerProbe
) -> None:
    """After the last delay the copy goes to ``x-retry-dead-letter-exchange``; an exchange that
    routes it to no queue returns it (the copy is mandatory), so the NACK is an ERROR and the
    original goes back to its queue rather than being acknowledged and lost.  Another session
    of the adapter is served meanwhile."""
    work, exchange, elsewhere = unique("retry-work"), unique("retry-nowhere"), unique("retry-other")
    broker.declare_exchange(exchange, "fanout")  # no queue bound
    broker.declare_queue(work)
    broker.track_queue(elsewhere, retry_queue(50, work).queue)
    bystander = RawSession(adapter.port)
    session = retry_subscriber(adapter, work, "50", f"x-retry-dead-letter-exchange:{exchange}\n")
    broker.publish("", work, b"poison")
    settle(session, "NACK", next_message(session))
    message = next_message(session)
    assert message[1]["x-delivery-count"] == "1"
    got = session.send(f"NACK\nid:{message[1]['ack']}\nreceipt:n\n\n")
    assert got[-1][0] == "ERROR" and got[-1][1]["message"] == "Message rejected by the broker", got
    assert broker.idle_depth(work) == 1
    kept = broker.get(work)
    assert kept is not None and kept.body == b"poison"
    bystander.round_trip(elsewhere)
    bystander.disconnect()


def test_an_ack_settles_as_usual(adapter: AdapterProcess, broker: BrokerProbe) -> None:
    work = unique("retry-work")
    broker.declare_queue(work)
    session = retry_subscriber(adapter, work, "100")
    broker.publish("", work, b"fine")
    settle(session, "ACK", next_message(session))
    session.disconnect()
    assert broker.wait_depth(work, 0) == 0


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ("ack:client-individual\nx-retry-delays:1000,soon\n", b"x-retry-delays"),
        ("ack:client-individual\nx-retry-delays:0\n", b"x-retry-delays"),
        ("ack:client-individual\nx-retry-delays:\n", b"x-retry-delays"),
        ("ack:auto\nx-retry-delays:1000\n", b"client-individual"),
        ("ack:client\nx-retry-delays:1000\n", b"client-individual"),
    ],
)
def test_a_retry_header_that_cannot_work_is_a_processing_error(
    adapter: AdapterProcess, broker: BrokerProbe, headers: str, reason: bytes
) -> None:
    queue = unique("retry-bad")
    broker.declare_queue(queue)
    session = RawSession(adapter.port)
    got = session.send(f"SUBSCRIBE\nid:s\ndestination:/amq/queue/{queue}\n{headers}receipt:r\n\n")
    command, frame_headers, body = got[-1]
    assert (command, frame_headers["message"]) == ("ERROR", "Processing error"), got
    assert reason in body


def test_a_destination_prefix_can_retry_by_default(start_adapter: Any, broker: BrokerProbe) -> None:
    """adapter.default_retry_delays gives the client-individual subscriptions of matching
    destinations their retries, without the header; other destinations and ack modes as before."""
    work, other = unique("retry-default"), unique("retry-other")
    broker.declare_queue(work)
    broker.declare_queue(other)
    broker.track_queue(retry_queue(50, work).queue)
    adapter = start_adapter(default_retry_delays="/amq/queue/retry-nothing=9; /amq/queue/retry-def=50")
    session = RawSession(adapter.port)
    got = session.send(
        f"SUBSCRIBE\nid:s\ndestination:/amq/queue/{work}\nack:client-individual\nreceipt:r\n\n"
    )
    assert got[-1][0] == "RECEIPT", got
    broker.publish("", work, b"again")
    message = next_message(session)
    settle(session, "NACK", message)
    message = next_message(session)
    assert message[1]["x-delivery-count"] == "1" and message[2] == b"again"
    plain = RawSession(adapter.port)
    got = plain.send(f"SUBSCRIBE\nid:s\ndestination:/amq/queue/{other}\nack:client-individual\nreceipt:r\n\n")
    assert got[-1][0] == "RECEIPT", got
    broker.publish("", other, b"requeued")
    message = next_message(plain)
    settle(plain, "NACK", message)
    message = next_message(plain)  # requeued at once, as without the setting
    assert message[1]["redelivered"] == "true" and "x-delivery-count" not in message[1]
