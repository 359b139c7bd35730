"""ACK / NACK and ack modes against the real broker (docs/destinations.md#common-steps;
docs/behaviour.md#receipts).

Whether a delivery was settled is observed from the broker: unacknowledged messages go back to
the queue when the STOMP connection closes, so the queue depth after a disconnect tells which
messages were acknowledged.
"""

from __future__ import annotations

import socket

import pytest

from tests.support import StompClient, expect_receipt, unique


def fill(client: StompClient, queue: str, count: int, **headers: str) -> list[str]:
    """SEND ``count`` messages and wait for their confirms; returns the bodies."""
    bodies = [f"m{i}" for i in range(count)]
    for i, body in enumerate(bodies):
        client.conn.send(f"/queue/{queue}", body, headers={**headers, "receipt": f"fill-{i}"})
    for i in range(count):
        expect_receipt(client, f"fill-{i}")
    return bodies


def disconnect(client: StompClient) -> None:
    client.conn.disconnect(receipt="bye")
    assert client.wait_disconnected()


@pytest.fixture
def queue(broker):
    name = unique("acks")
    broker.track_queue(name)
    return name


def test_auto_ack_settles_on_delivery(stomp_client, broker, queue):
    client = stomp_client()
    fill(client, queue, 3)
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="auto")
    messages = client.messages(3)
    assert [m.body for m in messages] == ["m0", "m1", "m2"]
    assert all("ack" not in m.headers for m in messages)  # nothing to acknowledge
    disconnect(client)
    # nothing comes back: there was nothing unacknowledged
    assert client.nothing_more() and broker.idle_depth(queue) == 0
    assert broker.get(queue) is None


def test_client_ack_is_cumulative(stomp_client, broker, queue):
    client = stomp_client()
    fill(client, queue, 4)
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client")
    messages = client.messages(4)
    client.conn.ack(messages[2].headers["ack"], receipt="a")  # acknowledges m0, m1 and m2
    expect_receipt(client, "a")
    disconnect(client)
    assert broker.idle_depth(queue) == 1
    returned = broker.get(queue)
    assert returned.body == b"m3"
    assert returned.redelivered


def test_client_individual_ack_is_per_message(stomp_client, broker, queue):
    client = stomp_client()
    fill(client, queue, 3)
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client-individual")
    messages = client.messages(3)
    client.conn.ack(messages[1].headers["ack"], receipt="a")  # only m1
    expect_receipt(client, "a")
    disconnect(client)
    assert broker.idle_depth(queue) == 2
    assert sorted([broker.get(queue).body, broker.get(queue).body]) == [b"m0", b"m2"]


def test_client_ack_is_cumulative_across_subscriptions(stomp_client, broker):
    """One channel per connection: a 'client' ACK covers every earlier delivery
    (docs/behaviour.md#receipts)."""
    q1, q2 = unique("acks"), unique("acks")
    broker.track_queue(q1, q2)
    client = stomp_client()
    client.conn.subscribe(f"/queue/{q1}", id="individual", ack="client-individual")
    client.conn.send(f"/queue/{q1}", "first")
    first = client.next("MESSAGE")
    client.conn.subscribe(f"/queue/{q2}", id="cumulative", ack="client")
    client.conn.send(f"/queue/{q2}", "second")
    second = client.next("MESSAGE")
    client.conn.ack(second.headers["ack"], receipt="a")
    expect_receipt(client, "a")
    disconnect(client)
    assert first.body == "first"
    assert broker.idle_depth(q1) == 0 and broker.idle_depth(q2) == 0
    assert broker.get(q1) is None


def test_nack_requeues_by_default(stomp_client, broker, queue):
    client = stomp_client()
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client-individual", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    client.conn.send(f"/queue/{queue}", "again")
    message = client.next("MESSAGE")
    assert message.headers["redelivered"] == "false"
    client.conn.nack(message.headers["ack"])
    redelivery = client.next("MESSAGE")
    assert redelivery.body == "again"
    assert redelivery.headers["redelivered"] == "true"
    assert redelivery.headers["ack"] != message.headers["ack"]  # a new delivery tag
    client.conn.ack(redelivery.headers["ack"], receipt="a")
    expect_receipt(client, "a")
    disconnect(client)
    assert broker.idle_depth(queue) == 0
    assert broker.get(queue) is None


def test_nack_without_requeue_dead_letters(stomp_client, broker, queue):
    dlx, dlq = unique("dlx"), unique("dlq")
    broker.declare_exchange(dlx, "fanout")
    broker.declare_queue(dlq)
    broker.bind(dlq, dlx)
    client = stomp_client()
    client.conn.subscribe(
        f"/queue/{queue}",
        id="s",
        ack="client-individual",
        headers={"x-dead-letter-exchange": dlx, "receipt": "sub"},
    )
    expect_receipt(client, "sub")
    client.conn.send(f"/queue/{queue}", "rejected")
    message = client.next("MESSAGE")
    client.conn.nack(message.headers["ack"], requeue="false", receipt="n")
    expect_receipt(client, "n")
    assert broker.wait_depth(dlq, 1) == 1
    dead = broker.get(dlq)
    assert dead.body == b"rejected"
    death = dead.headers["x-death"][0]
    assert death["reason"] == "rejected"
    assert death["queue"] == queue
    assert client.nothing_more()  # not redelivered
    disconnect(client)
    assert broker.idle_depth(queue) == 0


def test_nack_in_client_mode_is_cumulative(stomp_client, broker, queue):
    client = stomp_client()
    fill(client, queue, 3)
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client")
    messages = client.messages(3)
    client.conn.nack(messages[1].headers["ack"], requeue="false", receipt="n")  # drops m0 and m1
    expect_receipt(client, "n")
    disconnect(client)
    assert broker.idle_depth(queue) == 1
    assert broker.get(queue).body == b"m2"


def test_prefetch_count_limits_unacked_deliveries(stomp_client, broker, queue):
    client = stomp_client()
    fill(client, queue, 5)
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client-individual", headers={"prefetch-count": "2"})
    first = client.messages(2)
    assert [m.body for m in first] == ["m0", "m1"]
    assert client.nothing_more()
    assert broker.depth(queue) == 3  # the rest waits in the queue
    client.conn.ack(first[0].headers["ack"])
    third = client.next("MESSAGE")
    assert third.body == "m2"
    assert client.nothing_more()
    for message in (first[1], third):
        client.conn.ack(message.headers["ack"])
    assert [m.body for m in client.messages(2)] == ["m3", "m4"]


def test_prefetch_count_also_limits_later_subscriptions_of_the_connection(stomp_client, broker):
    """basic.qos is channel state: a later SUBSCRIBE without prefetch-count inherits it
    (docs/destinations.md#common-steps)."""
    q1, q2 = unique("acks"), unique("acks")
    broker.track_queue(q1, q2)
    client = stomp_client()
    fill(client, q2, 5)
    client.conn.subscribe(f"/queue/{q1}", id="limited", ack="client", headers={"prefetch-count": "2"})
    client.conn.subscribe(f"/queue/{q2}", id="later", ack="client")
    assert [m.body for m in client.messages(2)] == ["m0", "m1"]
    assert client.nothing_more()
    assert broker.depth(q2) == 3


def test_unacked_messages_return_when_the_client_disconnects(stomp_client, broker, queue):
    first = stomp_client()
    fill(first, queue, 2)
    first.conn.subscribe(f"/queue/{queue}", id="s", ack="client")
    assert [m.body for m in first.messages(2)] == ["m0", "m1"]
    assert broker.depth(queue) == 0  # both delivered, unacknowledged
    disconnect(first)
    assert broker.idle_depth(queue) == 2

    second = stomp_client()
    second.conn.subscribe(f"/queue/{queue}", id="s", ack="client-individual")
    again = second.messages(2)
    assert sorted(m.body for m in again) == ["m0", "m1"]
    assert all(m.headers["redelivered"] == "true" for m in again)


def test_unacked_messages_return_when_the_socket_drops(stomp_client, broker, queue):
    client = stomp_client()
    fill(client, queue, 1)
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client")
    client.next("MESSAGE")
    client.conn.transport.socket.shutdown(socket.SHUT_RDWR)  # no DISCONNECT frame
    assert broker.idle_depth(queue) == 1


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_ack_header_per_version(stomp_client, broker, queue, version):
    client = stomp_client(version)
    fill(client, queue, 1)
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client")
    message = client.next("MESSAGE")
    message_id = message.headers["message-id"]
    assert message_id.startswith("T_s@@session-") and message_id.endswith("@@1")
    if version == "1.2":
        assert message.headers["ack"] == message_id
        client.conn.send_frame("ACK", {"id": message_id, "receipt": "a"})
    else:
        assert "ack" not in message.headers
        client.conn.send_frame("ACK", {"message-id": message_id, "receipt": "a"})
    expect_receipt(client, "a")
    disconnect(client)
    assert broker.idle_depth(queue) == 0
    assert broker.get(queue) is None


@pytest.mark.parametrize(
    ("version", "wrong", "needed"),
    [("1.2", "message-id", "id"), ("1.1", "id", "message-id"), ("1.0", "id", "message-id")],
)
def test_ack_with_the_other_versions_header_is_refused(stomp_client, broker, queue, version, wrong, needed):
    client = stomp_client(version)
    fill(client, queue, 1)
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client")
    message = client.next("MESSAGE")
    client.conn.send_frame("ACK", {wrong: message.headers["message-id"], "subscription": "s"})
    error = client.next("ERROR")
    assert error.headers["message"] == "Missing header"
    assert error.body == f'"ACK" must include the "{needed}" header\n'
    assert client.wait_disconnected()
    assert broker.idle_depth(queue) == 1  # not acknowledged


def test_ack_of_unknown_subscription(stomp_client, broker, queue):
    client = stomp_client()
    value = "T_nope@@session-whatever@@1"
    client.conn.send_frame("ACK", {"id": value})
    error = client.next("ERROR")
    assert error.headers["message"] == "Subscription not found"
    assert error.body == f'Message with id "{value}" has no subscription'
    assert client.wait_disconnected()


def test_ack_after_unsubscribe_is_unknown_subscription(stomp_client, broker, queue):
    client = stomp_client()
    fill(client, queue, 1)
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client")
    message = client.next("MESSAGE")
    client.conn.unsubscribe(id="s", headers={"receipt": "u"})
    expect_receipt(client, "u")
    client.conn.ack(message.headers["ack"])
    error = client.next("ERROR")
    assert error.headers["message"] == "Subscription not found"
    assert client.wait_disconnected()
    assert broker.idle_depth(queue) == 1  # stayed unacked, requeued on close


def test_malformed_ack_id(stomp_client, broker):
    client = stomp_client()
    client.conn.send_frame("ACK", {"id": "no-separators"})
    error = client.next("ERROR")
    assert error.headers["message"] == "Invalid header"
    assert error.body == '"ACK" must include a valid "id" header\n'
