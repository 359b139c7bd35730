"""Receipts against the real broker (docs/behaviour.md#receipts; docs/behaviour.md#error-handling).

A SEND's RECEIPT is a publisher confirm: once it arrives the message is in the queue.  Other
frames get their RECEIPT after their work is done.  Broker state is checked through aio-pika.
"""

from __future__ import annotations

import time

import pytest

from tests.support import StompClient, amqp_client_ports, expect_receipt, next_of, unique


def no_receipt(client: StompClient) -> bool:
    return client.nothing_more("RECEIPT")


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_send_receipt_means_the_message_is_queued(stomp_client, broker, version):
    queue = unique("confirmed")
    broker.track_queue(queue)
    client = stomp_client(version)
    for i in range(5):
        client.conn.send(f"/queue/{queue}", f"m{i}", headers={"persistent": "true", "receipt": f"r{i}"})
    for i in range(5):
        expect_receipt(client, f"r{i}")  # in order
    # no polling: the broker confirmed every publish before the RECEIPT was sent
    assert broker.depth(queue) == 5
    first = broker.get(queue)
    assert first.body == b"m0"
    assert first.properties.delivery_mode == 2


def test_send_without_receipt_on_confirming_connection_gets_none(stomp_client, broker):
    queue = unique("mixed")
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.send(f"/queue/{queue}", "a", headers={"receipt": "ra"})
    client.conn.send(f"/queue/{queue}", "b")
    client.conn.send(f"/queue/{queue}", "c", headers={"receipt": "rc"})
    expect_receipt(client, "ra")
    expect_receipt(client, "rc")
    assert no_receipt(client)
    assert broker.depth(queue) == 3


def test_send_to_missing_exchange_is_not_found_without_receipt(stomp_client, broker):
    exchange = unique("no-such-exchange")
    client = stomp_client()
    client.conn.send(f"/exchange/{exchange}/k", "lost", headers={"receipt": "r"})
    error = next_of(client, ("RECEIPT", "ERROR"))
    assert error.command == "ERROR"
    assert error.headers["message"] == "not_found"
    assert error.body == f"NOT_FOUND - no exchange '{exchange}' in vhost '/'"
    assert client.wait_disconnected()
    assert no_receipt(client)


def test_failed_queue_declare_on_send_gets_no_receipt(stomp_client, broker):
    """The SEND was never published (its /queue declare failed): no RECEIPT may claim it was."""
    queue = unique("inequivalent")
    broker.declare_queue(queue, durable=True, arguments={"x-max-length": 3})
    client = stomp_client()
    client.conn.send(f"/queue/{queue}", "refused", headers={"receipt": "r"})
    error = next_of(client, ("RECEIPT", "ERROR"))
    assert error.command == "ERROR"
    assert error.headers["message"] == "precondition_failed"
    assert error.body.startswith("PRECONDITION_FAILED - inequivalent arg 'x-max-length'")
    assert client.wait_disconnected()
    assert no_receipt(client)
    assert broker.depth(queue) == 0


def test_subscribe_receipt_means_bound(stomp_client, broker):
    key = unique("bound")
    client = stomp_client()
    client.conn.subscribe(f"/topic/{key}", id="s", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    # consume and bind are done: a message published right now is routed to the subscription
    broker.publish("amq.topic", key, b"right-after")
    assert client.next("MESSAGE").body == "right-after"

    queue = [b["destination"] for b in broker.exchange_bindings("amq.topic") if b["routing_key"] == key]
    assert len(queue) == 1
    client.conn.unsubscribe(id="s", headers={"receipt": "unsub"})
    expect_receipt(client, "unsub")
    # the consumer is cancelled: nothing more is delivered, and the auto-delete queue goes
    broker.publish("amq.topic", key, b"too-late")
    assert client.nothing_more()
    assert broker.wait_gone(queue[0])


def test_unsubscribe_receipt_stops_queue_deliveries(stomp_client, broker):
    queue = unique("unsub")
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.subscribe(f"/queue/{queue}", id="s", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    client.conn.unsubscribe(id="s", headers={"receipt": "unsub"})
    expect_receipt(client, "unsub")
    client.conn.send(f"/queue/{queue}", "stays", headers={"receipt": "r"})
    expect_receipt(client, "r")
    assert client.nothing_more()
    assert broker.depth(queue) == 1


def test_synchronous_failure_sends_error_then_receipt(stomp_client, broker):
    exchange = unique("no-such-exchange")
    client = stomp_client()
    client.conn.subscribe(f"/exchange/{exchange}/k", id="s", headers={"receipt": "sub"})
    error = next_of(client, ("RECEIPT", "ERROR"))
    assert error.command == "ERROR"
    assert error.headers["message"] == "not_found"
    assert error.body == f"NOT_FOUND - no exchange '{exchange}' in vhost '/'"
    expect_receipt(client, "sub")  # after the ERROR, as the plugin does (docs/behaviour.md#receipts)
    assert client.wait_disconnected()


def test_error_for_bad_frame_carries_receipt_id_and_no_receipt(stomp_client, broker):
    client = stomp_client()
    client.conn.send("/foo/bar", "x", headers={"receipt": "r"})
    error = next_of(client, ("RECEIPT", "ERROR"))
    assert error.command == "ERROR"
    assert error.headers["message"] == "Unknown destination"
    # STOMP 1.2: the ERROR names the receipt it answers; no RECEIPT follows
    assert error.headers.get("receipt-id") == "r"
    assert client.wait_disconnected()
    assert no_receipt(client)


def test_pending_send_receipt_is_sent_before_disconnect_receipt(stomp_client, broker):
    queue = unique("pending")
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.send(f"/queue/{queue}", "last words", headers={"receipt": "send"})
    client.conn.disconnect(receipt="bye")
    # the adapter waits for the confirm instead of dropping the SEND receipt (session.py)
    expect_receipt(client, "send")
    expect_receipt(client, "bye")
    assert client.wait_disconnected()
    assert broker.depth(queue) == 1


def test_receipts_for_ack_nack_begin_commit_abort(stomp_client, broker):
    queue = unique("misc")
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client-individual", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    client.conn.send(f"/queue/{queue}", "one")
    client.conn.send(f"/queue/{queue}", "two")
    one, two = client.messages(2)
    client.conn.ack(one.headers["ack"], receipt="ack")
    expect_receipt(client, "ack")
    client.conn.begin("tx", headers={"receipt": "begin"})
    expect_receipt(client, "begin")
    client.conn.nack(two.headers["ack"], transaction="tx", receipt="nack", requeue="false")
    expect_receipt(client, "nack")
    client.conn.commit("tx", headers={"receipt": "commit"})
    expect_receipt(client, "commit")
    client.conn.begin("tx2", headers={"receipt": "begin2"})
    expect_receipt(client, "begin2")
    client.conn.abort("tx2", headers={"receipt": "abort"})
    expect_receipt(client, "abort")
    assert client.nothing_more()
    assert broker.depth(queue) == 0


@pytest.mark.own_amqp_connection
def test_broker_channel_error_closes_the_adapters_amqp_connection(stomp_client, broker):
    """After the broker closed the channel (here: publish to a missing exchange) the STOMP
    connection ends, and the adapter's AMQP connection for it must be closed too, not leaked."""
    before = amqp_client_ports()
    client = stomp_client()
    links = amqp_client_ports() - before
    assert len(links) == 1, links  # this client's own AMQP connection
    client.conn.send(f"/exchange/{unique('no-such-exchange')}/k", "x")
    assert client.next("ERROR").headers["message"] == "not_found"
    assert client.wait_disconnected()
    deadline = time.monotonic() + 5
    while links & amqp_client_ports() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not links & amqp_client_ports(), "the AMQP connection of the closed STOMP client is still open"
