"""BEGIN / COMMIT / ABORT against the real broker (docs/behaviour.md#limits).

Transactions are buffers in the adapter: SENDs and ACKs inside one reach the broker only at
COMMIT.  Whether they did is checked through aio-pika (queue depth) and through what a
subscriber receives.
"""

from __future__ import annotations

import pytest

from tests.support import expect_receipt, next_of, unique


@pytest.fixture
def queue(broker):
    name = unique("tx")
    broker.track_queue(name)
    return name


def test_send_takes_effect_at_commit(stomp_client, broker, queue):
    client = stomp_client()
    client.conn.begin("t1", headers={"receipt": "begin"})
    expect_receipt(client, "begin")
    client.conn.send(f"/queue/{queue}", "one", headers={"transaction": "t1", "receipt": "s1"})
    client.conn.send(f"/queue/{queue}", "two", headers={"transaction": "t1", "receipt": "s2"})
    # a confirmed publish on the same channel to the same queue: had the transactional SENDs
    # been published, they would be in the queue ahead of it
    client.conn.send(f"/queue/{queue}", "probe", headers={"receipt": "probe"})
    expect_receipt(client, "probe")
    assert broker.depth(queue) == 1

    client.conn.commit("t1", headers={"receipt": "commit"})
    # the SEND receipts (registered at COMMIT, released by confirms), then COMMIT's, which waits
    # for the confirms of every publish of the transaction (docs/behaviour.md, Receipts)
    expect_receipt(client, "s1")
    expect_receipt(client, "s2")
    expect_receipt(client, "commit")
    assert broker.depth(queue) == 3
    messages = [broker.get(queue) for _ in range(3)]
    assert [m.body for m in messages] == [b"probe", b"one", b"two"]
    # frame-control headers are not copied into the message (adapter choice, session.py)
    assert "transaction" not in messages[1].headers
    assert "receipt" not in messages[1].headers


def test_abort_discards_sends(stomp_client, broker, queue):
    client = stomp_client()
    client.conn.subscribe(f"/queue/{queue}", id="s", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    client.conn.begin("t", headers={"receipt": "begin"})
    expect_receipt(client, "begin")
    client.conn.send(f"/queue/{queue}", "discarded", headers={"transaction": "t", "receipt": "s"})
    client.conn.abort("t", headers={"receipt": "abort"})
    expect_receipt(client, "abort")
    client.conn.send(f"/queue/{queue}", "kept", headers={"receipt": "after"})
    expect_receipt(client, "after")  # and not "s": the aborted SEND never gets a RECEIPT
    assert client.next("MESSAGE").body == "kept"
    assert client.nothing_more()
    assert client.nothing_more("RECEIPT")


def test_disconnect_discards_open_transaction(stomp_client, broker, queue):
    client = stomp_client()
    client.conn.begin("t")
    client.conn.send(f"/queue/{queue}", "never", headers={"transaction": "t"})
    client.conn.disconnect(receipt="bye")
    assert client.wait_disconnected()
    assert broker.depth(queue) == 0

    later = stomp_client()
    later.conn.send(f"/queue/{queue}", "marker", headers={"receipt": "m"})
    expect_receipt(later, "m")
    later.conn.subscribe(f"/queue/{queue}", id="s")
    assert later.next("MESSAGE").body == "marker"
    assert later.nothing_more()


def test_ack_takes_effect_at_commit(stomp_client, broker, queue):
    client = stomp_client()
    for i in range(2):
        client.conn.send(f"/queue/{queue}", f"m{i}", headers={"receipt": f"r{i}"})
    expect_receipt(client, "r0")
    expect_receipt(client, "r1")
    # prefetch 1: the second message comes only once the first is really acknowledged
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client-individual", headers={"prefetch-count": "1"})
    first = client.next("MESSAGE")
    assert first.body == "m0"
    client.conn.begin("t")
    client.conn.ack(first.headers["ack"], transaction="t", receipt="ack")
    expect_receipt(client, "ack")
    assert client.nothing_more()  # the ACK is still buffered
    client.conn.commit("t", headers={"receipt": "commit"})
    expect_receipt(client, "commit")
    second = client.next("MESSAGE")
    assert second.body == "m1"
    client.conn.ack(second.headers["ack"])
    client.conn.disconnect(receipt="bye")
    assert client.wait_disconnected()
    assert broker.idle_depth(queue) == 0


def test_aborted_ack_leaves_message_unacknowledged(stomp_client, broker, queue):
    client = stomp_client()
    client.conn.send(f"/queue/{queue}", "m", headers={"receipt": "r"})
    expect_receipt(client, "r")
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client-individual")
    message = client.next("MESSAGE")
    client.conn.begin("t")
    client.conn.ack(message.headers["ack"], transaction="t")
    client.conn.abort("t", headers={"receipt": "abort"})
    expect_receipt(client, "abort")
    client.conn.disconnect(receipt="bye")
    assert client.wait_disconnected()
    assert broker.idle_depth(queue) == 1  # requeued: the ACK never happened


def test_nack_in_transaction(stomp_client, broker, queue):
    client = stomp_client()
    client.conn.subscribe(f"/queue/{queue}", id="s", ack="client-individual", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    client.conn.send(f"/queue/{queue}", "n")
    message = client.next("MESSAGE")
    client.conn.begin("t")
    client.conn.nack(message.headers["ack"], transaction="t", requeue="true")
    client.conn.begin("probe", headers={"receipt": "probe"})
    expect_receipt(client, "probe")
    assert client.nothing_more()  # not requeued yet
    client.conn.commit("t")
    again = client.next("MESSAGE")
    assert again.body == "n"
    assert again.headers["redelivered"] == "true"


@pytest.mark.parametrize("command", ["SEND", "COMMIT", "ABORT", "ACK"])
def test_unknown_transaction(stomp_client, broker, queue, command):
    client = stomp_client()
    headers = {"transaction": "nope"}
    if command == "SEND":
        headers["destination"] = f"/queue/{queue}"
    elif command == "ACK":
        client.conn.subscribe(f"/queue/{queue}", id="s", ack="client")
        client.conn.send(f"/queue/{queue}", "m")
        headers["id"] = client.next("MESSAGE").headers["ack"]
    client.conn.send_frame(command, headers, "body" if command == "SEND" else "")
    error = client.next("ERROR")
    assert error.headers["message"] == "Bad transaction"
    assert error.body == 'Invalid transaction identifier: "nope"\n'
    assert client.wait_disconnected()  # the adapter closes after every ERROR (session.py)
    if command == "SEND":
        assert not broker.queue_exists(queue) or broker.depth(queue) == 0


def test_missing_transaction_header(stomp_client, broker):
    client = stomp_client()
    client.conn.send_frame("BEGIN", {})
    error = client.next("ERROR")
    assert error.headers["message"] == "Missing transaction"
    assert error.body == "\"BEGIN\" must include a 'transaction' header\n"


def test_begin_of_open_transaction_is_an_error(stomp_client, broker, queue):
    """The plugin silently resets the transaction; the adapter refuses (session.py)."""
    client = stomp_client()
    client.conn.begin("t", headers={"receipt": "b1"})
    expect_receipt(client, "b1")
    client.conn.send(f"/queue/{queue}", "first", headers={"transaction": "t"})
    client.conn.begin("t", headers={"receipt": "b2"})
    error = next_of(client, ("RECEIPT", "ERROR"))
    assert error.command == "ERROR"
    assert error.headers["message"] == "Bad transaction"
    assert error.headers.get("receipt-id") == "b2"
    assert client.wait_disconnected()
    assert broker.depth(queue) == 0  # and the open transaction was discarded with the connection


def test_transactions_are_independent(stomp_client, broker, queue):
    client = stomp_client()
    client.conn.subscribe(f"/queue/{queue}", id="s", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    client.conn.begin("a")
    client.conn.begin("b")
    client.conn.send(f"/queue/{queue}", "from-a", headers={"transaction": "a"})
    client.conn.send(f"/queue/{queue}", "from-b", headers={"transaction": "b"})
    client.conn.send(f"/queue/{queue}", "plain")
    assert client.next("MESSAGE").body == "plain"
    client.conn.commit("b")
    assert client.next("MESSAGE").body == "from-b"
    client.conn.abort("a", headers={"receipt": "abort"})
    expect_receipt(client, "abort")
    assert client.nothing_more()
