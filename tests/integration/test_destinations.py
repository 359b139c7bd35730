"""Destinations against the real broker (docs/destinations.md#parsing–docs/destinations.md#topicpattern;
docs/destinations.md#amqp--message; docs/destinations.md#temporary-queues;
docs/destinations.md#durable-subscriptions).

STOMP is spoken through stomp.py; what the adapter did to the broker is checked through aio-pika
(passive declares, basic.get, publishes) and the management HTTP API (queue flags, arguments,
bindings) — see ``tests.support.BrokerProbe``.
"""

from __future__ import annotations

import time

import pytest

from adapter.mapping.destinations import subscription_queue_name
from tests.support import StompClient, expect_receipt, next_of, unique


def message_with_body(client: StompClient, body: str, timeout: float = 5.0):
    """The next MESSAGE carrying ``body``, skipping others (shared exchanges such as amq.fanout
    may carry messages of other users of the broker)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = client.next("MESSAGE", timeout=max(0.05, deadline - time.monotonic()))
        if message.body == body:
            return message
    raise AssertionError(f"no MESSAGE with body {body!r} within {timeout} s")


def flags(info: dict) -> tuple[bool, bool, bool]:
    return info["durable"], info["auto_delete"], info["exclusive"]


# ------------------------------------------------------------------------------------------ /queue
# an exclusive queue is gone with the client's AMQP connection: with multiplexing that connection
# may carry other sessions of the session-wide adapter and outlive the client (documented:
# tests/integration/test_multiplexing.py asserts when such a queue goes)
OWN_CONNECTION = pytest.mark.own_amqp_connection


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, (True, False, False)),
        pytest.param({"durable": "false"}, (False, True, True), marks=OWN_CONNECTION),
        # even on a SEND
        pytest.param({"persistent": "false"}, (False, True, True), marks=OWN_CONNECTION),
        # (docs/destinations.md#queue-flag-headers)
        ({"auto-delete": "true"}, (True, True, False)),
        # the broker makes exclusive non-durable
        pytest.param({"exclusive": "true"}, (False, False, True), marks=OWN_CONNECTION),
    ],
    ids=["default", "durable-false", "persistent-false", "auto-delete", "exclusive"],
)
def test_queue_flags_from_send_headers(stomp_client, broker, headers, expected):
    client = stomp_client()
    queue = unique("flags")
    broker.track_queue(queue)
    client.conn.send(f"/queue/{queue}", "m", headers={**headers, "receipt": "r"})
    expect_receipt(client, "r")

    info = broker.queue_info(queue)
    assert info is not None
    assert flags(info) == expected
    assert info["arguments"] == {}
    if not expected[2]:
        assert broker.depth(queue) == 1
    else:  # exclusive: owned by this STOMP connection, gone with it
        client.conn.disconnect(receipt="bye")
        assert client.wait_disconnected()
        assert broker.wait_gone(queue)


def test_queue_flags_from_subscribe_headers(stomp_client, broker):
    client = stomp_client()
    queue = unique("subflags")
    broker.track_queue(queue)
    client.conn.subscribe(f"/queue/{queue}", id="s", headers={"auto-delete": "true", "receipt": "r"})
    expect_receipt(client, "r")
    info = broker.queue_info(queue)
    assert flags(info) == (True, True, False)
    client.conn.unsubscribe(id="s", headers={"receipt": "u"})
    expect_receipt(client, "u")
    # auto-delete: the broker removes it once its only consumer is gone
    assert broker.wait_gone(queue)


def test_queue_declared_once_per_connection(stomp_client, broker):
    queue = unique("once")
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.send(f"/queue/{queue}", "one", headers={"x-max-length": "5", "receipt": "r1"})
    expect_receipt(client, "r1")
    # different flags and arguments on the same connection: no redeclare, so no error
    client.conn.send(
        f"/queue/{queue}", "two", headers={"x-max-length": "7", "durable": "false", "receipt": "r2"}
    )
    expect_receipt(client, "r2")
    client.conn.subscribe(f"/queue/{queue}", id="s", headers={"x-max-length": "9", "receipt": "r3"})
    expect_receipt(client, "r3")
    assert [m.body for m in client.messages(2)] == ["one", "two"]
    info = broker.queue_info(queue)
    assert info["arguments"] == {"x-max-length": 5}
    assert flags(info) == (True, False, False)

    # another connection does declare, and the broker refuses the inequivalent argument
    other = stomp_client()
    other.conn.send(f"/queue/{queue}", "three", headers={"x-max-length": "7"})
    error = other.next("ERROR")
    assert error.headers["message"] == "precondition_failed"
    assert error.body.startswith("PRECONDITION_FAILED - inequivalent arg 'x-max-length'")
    assert other.wait_disconnected()
    assert client.nothing_more()  # "three" was never published


def test_bare_name_is_a_queue(stomp_client, broker):
    client = stomp_client()
    queue = unique("bare")
    broker.track_queue(queue)
    client.conn.send(queue, "plain", headers={"receipt": "r"})
    expect_receipt(client, "r")
    assert flags(broker.queue_info(queue)) == (True, False, False)
    got = broker.get(queue)
    assert got.body == b"plain"
    assert (got.exchange, got.routing_key) == ("", queue)


# -------------------------------------------------------------------------------------- /amq/queue
def test_amq_queue_uses_existing_queue_without_declaring(stomp_client, broker):
    queue = unique("amq")
    # non-durable with an argument: any declare by the adapter would be inequivalent
    broker.declare_queue(queue, durable=False, arguments={"x-max-length": 7})
    client = stomp_client()
    client.conn.subscribe(f"/amq/queue/{queue}", id="s", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    client.conn.send(f"/amq/queue/{queue}", "hello", headers={"receipt": "r"})
    expect_receipt(client, "r")
    message = client.next("MESSAGE")
    assert message.body == "hello"
    assert message.headers["destination"] == f"/queue/{queue}"
    assert message.headers["subscription"] == "s"
    info = broker.queue_info(queue)
    assert info["durable"] is False
    assert info["arguments"] == {"x-max-length": 7}


def test_amq_queue_missing_on_subscribe_is_not_found(stomp_client, broker):
    client = stomp_client()
    queue = unique("missing")
    client.conn.subscribe(f"/amq/queue/{queue}", id="s", headers={"receipt": "sub"})
    error = next_of(client, ("RECEIPT", "ERROR"))
    assert error.command == "ERROR"
    assert error.headers["message"] == "not_found"
    assert error.body == f"NOT_FOUND - no queue '{queue}' in vhost '/'"
    # a synchronous AMQP failure: ERROR, then the RECEIPT, then close (docs/behaviour.md#receipts;
    # docs/behaviour.md#error-handling)
    expect_receipt(client, "sub")
    assert client.wait_disconnected()
    assert not broker.queue_exists(queue)


def test_amq_queue_missing_on_send_is_dropped(stomp_client, broker):
    client = stomp_client()
    queue = unique("missing")
    client.conn.send(f"/amq/queue/{queue}", "lost", headers={"receipt": "r"})
    expect_receipt(client, "r")  # unroutable messages are confirmed too
    assert not broker.queue_exists(queue)
    # the connection is still usable
    client.conn.subscribe(f"/topic/{unique('k')}", id="s", headers={"receipt": "sub"})
    expect_receipt(client, "sub")


# ------------------------------------------------------------------------------------------ /topic
def test_topic_fans_out_to_each_subscriber(stomp_client, broker):
    key = unique("fan")
    a, b = stomp_client(), stomp_client()
    a.conn.subscribe(f"/topic/{key}", id="a", headers={"receipt": "ra"})
    expect_receipt(a, "ra")
    b.conn.subscribe(f"/topic/{key}", id="b", headers={"receipt": "rb"})
    expect_receipt(b, "rb")

    bindings = [x for x in broker.exchange_bindings("amq.topic") if x["routing_key"] == key]
    assert len(bindings) == 2
    queues = [x["destination"] for x in bindings]
    for queue in queues:
        assert queue.startswith("stomp-subscription-")
        assert flags(broker.queue_info(queue)) == (False, True, False)
    assert queues[0] != queues[1]

    a.conn.send(f"/topic/{key}", "to-all", headers={"receipt": "r"})
    expect_receipt(a, "r")
    for client, sub in ((a, "a"), (b, "b")):
        message = client.next("MESSAGE")
        assert message.body == "to-all"
        assert message.headers["destination"] == f"/topic/{key}"
        assert message.headers["subscription"] == sub
    assert a.nothing_more() and b.nothing_more()

    # an AMQP publisher on amq.topic reaches STOMP subscribers, rendered as /topic/<key>
    broker.publish("amq.topic", key, b"from-amqp")
    assert a.next("MESSAGE").headers["destination"] == f"/topic/{key}"
    assert b.next("MESSAGE").body == "from-amqp"

    a.conn.unsubscribe(id="a", headers={"receipt": "u"})
    expect_receipt(a, "u")
    # a's auto-delete queue goes away with its consumer; b's stays and still receives
    deadline = time.monotonic() + 5
    while len(remaining := [q for q in queues if broker.queue_exists(q)]) > 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(remaining) == 1
    a.conn.send(f"/topic/{key}", "only-b", headers={"receipt": "r2"})
    expect_receipt(a, "r2")
    assert b.next("MESSAGE").body == "only-b"
    assert a.nothing_more()


def test_topic_wildcards(stomp_client, broker):
    base = unique("w")  # one word: no dots in it
    client = stomp_client()
    client.conn.subscribe(f"/topic/{base}.*.c", id="star", headers={"receipt": "r1"})
    expect_receipt(client, "r1")
    client.conn.subscribe(f"/topic/{base}.#", id="hash", headers={"receipt": "r2"})
    expect_receipt(client, "r2")

    for key in (f"{base}.b.c", f"{base}.b.b.c", base, f"{base}.x.y"):
        client.conn.send(f"/topic/{key}", key)
    client.conn.send(f"/topic/{unique('other')}.b.c", "nobody", headers={"receipt": "r3"})
    expect_receipt(client, "r3")

    received = client.messages(5)
    by_sub: dict[str, list[str]] = {"star": [], "hash": []}
    for message in received:
        by_sub[message.headers["subscription"]].append(message.body)
        assert message.headers["destination"] == f"/topic/{message.body}"
    assert by_sub["star"] == [f"{base}.b.c"]
    assert by_sub["hash"] == [f"{base}.b.c", f"{base}.b.b.c", base, f"{base}.x.y"]
    assert client.nothing_more()


# --------------------------------------------------------------------------------------- /exchange
def test_exchange_direct_with_key(stomp_client, broker):
    key = unique("direct")
    client = stomp_client()
    client.conn.subscribe(f"/exchange/amq.direct/{key}", id="d", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    bindings = [x for x in broker.exchange_bindings("amq.direct") if x["routing_key"] == key]
    assert len(bindings) == 1
    queue = bindings[0]["destination"]
    assert queue.startswith("stomp-subscription-")
    # 3.10.8 defaults for /exchange: non-durable, auto-delete, not exclusive
    # (docs/destinations.md#queue-flag-headers)
    assert flags(broker.queue_info(queue)) == (False, True, False)

    broker.publish("amq.direct", key, b"from-amqp")
    message = client.next("MESSAGE")
    assert message.body == "from-amqp"
    assert message.headers["destination"] == f"/exchange/amq.direct/{key}"
    assert message.headers["subscription"] == "d"

    client.conn.send(f"/exchange/amq.direct/{key}", "from-stomp", headers={"receipt": "r"})
    expect_receipt(client, "r")
    assert client.next("MESSAGE").body == "from-stomp"
    broker.publish("amq.direct", unique("other-key"), b"not for us")
    assert client.nothing_more()


def test_exchange_fanout_without_key(stomp_client, broker):
    a, b = stomp_client(), stomp_client()
    a.conn.subscribe("/exchange/amq.fanout", id="fa", headers={"receipt": "ra"})
    expect_receipt(a, "ra")
    b.conn.subscribe("/exchange/amq.fanout", id="fb", headers={"receipt": "rb"})
    expect_receipt(b, "rb")
    body = unique("fanout-body")
    a.conn.send("/exchange/amq.fanout", body, headers={"receipt": "r"})
    expect_receipt(a, "r")
    for client, sub in ((a, "fa"), (b, "fb")):
        message = message_with_body(client, body)
        # exchange with an empty routing key → /exchange/<x> (docs/destinations.md#amqp--message)
        assert message.headers["destination"] == "/exchange/amq.fanout"
        assert message.headers["subscription"] == sub


# ------------------------------------------------------------------------------ %2F and rewriting
def test_percent_2f_in_queue_name(stomp_client, broker):
    suffix = unique("q")
    queue = f"a/{suffix}"
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.subscribe(f"/queue/a%2F{suffix}", id="s", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    assert broker.queue_exists(queue)
    client.conn.send(f"/queue/a%2F{suffix}", "slash", headers={"receipt": "r"})
    expect_receipt(client, "r")
    message = client.next("MESSAGE")
    assert message.body == "slash"
    assert message.headers["destination"] == f"/queue/a%2F{suffix}"


def test_only_upper_case_percent_2f_is_decoded(stomp_client, broker):
    suffix = unique("q")
    literal = f"a%2f{suffix}"
    broker.track_queue(literal)
    client = stomp_client()
    client.conn.send(f"/queue/{literal}", "lower", headers={"receipt": "r"})
    expect_receipt(client, "r")
    assert broker.queue_info(literal) is not None  # declared literally, with the '%'
    assert broker.queue_info(f"a/{suffix}") is None


def test_percent_2f_in_topic_key(stomp_client, broker):
    key = unique("t")
    client = stomp_client()
    client.conn.subscribe(f"/topic/x%2F{key}", id="s", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    assert [x["routing_key"] for x in broker.exchange_bindings("amq.topic") if key in x["routing_key"]] == [
        f"x/{key}"
    ]
    broker.publish("amq.topic", f"x/{key}", b"t")
    assert client.next("MESSAGE").headers["destination"] == f"/topic/x%2F{key}"


def test_percent_2f_in_exchange_name_and_key(stomp_client, broker):
    exchange = f"ex/{unique('x')}"
    broker.declare_exchange(exchange, "direct")
    escaped = exchange.replace("/", "%2F")
    client = stomp_client()
    client.conn.subscribe(f"/exchange/{escaped}/k%2Fz", id="s", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    bindings = broker.exchange_bindings(exchange)
    assert [x["routing_key"] for x in bindings] == ["k/z"]
    client.conn.send(f"/exchange/{escaped}/k%2Fz", "both", headers={"receipt": "r"})
    expect_receipt(client, "r")
    message = client.next("MESSAGE")
    assert message.body == "both"
    assert message.headers["destination"] == f"/exchange/{escaped}/k%2Fz"


def test_message_destination_escaping(stomp_client, broker):
    exchange = f"probe ex/{unique('x')}"
    broker.declare_exchange(exchange, "fanout")
    client = stomp_client()
    client.conn.subscribe("/exchange/" + exchange.replace("/", "%2F"), id="s", headers={"receipt": "sub"})
    expect_receipt(client, "sub")
    # '/' → %2F, '%' → %25, bytes outside 0x20..0x7F → %XX; space, '~' and 0x7F unchanged
    broker.publish(exchange, "rk/with%slüsh \x01\x7f~", b"odd")
    message = client.next("MESSAGE")
    assert message.body == "odd"
    expected_exchange = exchange.replace("/", "%2F")
    assert message.headers["destination"] == (
        f"/exchange/{expected_exchange}/rk%2Fwith%25sl%C3%BCsh %01\x7f~"
    )
    broker.publish(exchange, "", b"no-key")
    assert client.next("MESSAGE").headers["destination"] == f"/exchange/{expected_exchange}"


# --------------------------------------------------------------------------------------- reply-to
def test_reply_to_temp_queue_with_amqp_replier(stomp_client, broker):
    requests = unique("req")
    broker.declare_queue(requests)
    client = stomp_client()
    client.conn.send(f"/amq/queue/{requests}", "ping", headers={"reply-to": "/temp-queue/x", "receipt": "r1"})
    expect_receipt(client, "r1")
    request = broker.get(requests)
    reply_to = request.properties.reply_to
    assert reply_to.startswith("amq.gen-")
    assert "reply-to" not in request.headers  # the /temp-queue/ value does not reach AMQP
    info = broker.queue_info(reply_to)
    assert (info["durable"], info["auto_delete"], info["exclusive"]) == (False, True, True)

    broker.publish("", reply_to, b"pong", correlation_id="c-1")
    reply = client.next("MESSAGE")
    assert reply.body == "pong"
    assert reply.headers["subscription"] == "/temp-queue/x"
    assert reply.headers["destination"] == f"/queue/{reply_to}"
    assert reply.headers["message-id"].startswith("T_/temp-queue/x@@")
    assert reply.headers["correlation-id"] == "c-1"

    # the same temp name reuses the queue, another name gets another one
    client.conn.send(f"/amq/queue/{requests}", "again", headers={"reply-to": "/temp-queue/x"})
    client.conn.send(
        f"/amq/queue/{requests}", "other", headers={"reply-to": "/temp-queue/y", "receipt": "r2"}
    )
    expect_receipt(client, "r2")
    assert broker.get(requests).properties.reply_to == reply_to
    other = broker.get(requests).properties.reply_to
    assert other.startswith("amq.gen-") and other != reply_to

    client.conn.disconnect(receipt="bye")
    assert client.wait_disconnected()
    assert broker.wait_gone(reply_to)
    assert broker.wait_gone(other)


def test_reply_to_temp_queue_with_stomp_replier(stomp_client, broker):
    requests = unique("req")
    broker.track_queue(requests)
    requester, replier = stomp_client(), stomp_client()
    replier.conn.subscribe(f"/queue/{requests}", id="srv", headers={"receipt": "sub"})
    expect_receipt(replier, "sub")
    requester.conn.send(
        f"/queue/{requests}", "ping", headers={"reply-to": "/temp-queue/r1", "correlation-id": "42"}
    )
    request = replier.next("MESSAGE")
    assert request.body == "ping"
    reply_to = request.headers["reply-to"]
    assert reply_to.startswith("/reply-queue/amq.gen-")

    replier.conn.send(reply_to, "pong", headers={"correlation-id": request.headers["correlation-id"]})
    reply = requester.next("MESSAGE")
    assert reply.body == "pong"
    assert reply.headers["subscription"] == "/temp-queue/r1"
    assert reply.headers["destination"] == "/queue/" + reply_to[len("/reply-queue/") :]
    assert reply.headers["correlation-id"] == "42"


def test_reply_to_other_values_copied(stomp_client, broker):
    queue = unique("rt")
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.send(f"/queue/{queue}", "a", headers={"reply-to": "/queue/answers"})
    client.conn.send(f"/queue/{queue}", "b", headers={"reply-to": "plain-name", "receipt": "r"})
    expect_receipt(client, "r")
    assert broker.get(queue).properties.reply_to == "/queue/answers"
    assert broker.get(queue).properties.reply_to == "plain-name"
    # on MESSAGE frames a bare AMQP reply_to is shown as /reply-queue/<name>
    # (docs/destinations.md#temporary-queues)
    client.conn.send(f"/queue/{queue}", "c", headers={"reply-to": "/queue/answers"})
    client.conn.send(f"/queue/{queue}", "d", headers={"reply-to": "plain-name"})
    client.conn.subscribe(f"/queue/{queue}", id="s")
    first, second = client.messages(2)
    assert first.headers["reply-to"] == "/queue/answers"
    assert second.headers["reply-to"] == "/reply-queue/plain-name"


# ------------------------------------------------------------------------ durable subscriptions
DURABLE = {"durable": "true", "auto-delete": "false"}


def test_durable_topic_subscription_lifecycle(stomp_client, broker):
    # the name scheme reproduces the broker's (docs/destinations.md#durable-subscriptions vector)
    assert (
        subscription_queue_name("durable", "test.subscription") == "stomp-subscription-tMbeqL30tjlgaXMmaFM6Ew"
    )
    key = unique("dur")
    sub_id = unique("id")
    queue = subscription_queue_name(key, sub_id)
    broker.track_queue(queue)

    first = stomp_client()
    first.conn.subscribe(f"/topic/{key}", id=sub_id, headers={**DURABLE, "receipt": "s1"})
    expect_receipt(first, "s1")
    info = broker.queue_info(queue)
    assert info is not None, f"expected the plugin's queue name {queue}"
    assert flags(info) == (True, False, False)
    assert [(b["source"], b["routing_key"]) for b in broker.queue_bindings(queue)] == [("amq.topic", key)]
    first.conn.disconnect(receipt="bye")
    assert first.wait_disconnected()

    publisher = stomp_client()
    publisher.conn.send(f"/topic/{key}", "while-away", headers={"receipt": "p"})
    expect_receipt(publisher, "p")
    assert broker.depth(queue) == 1  # kept while nobody is subscribed

    second = stomp_client()
    second.conn.subscribe(f"/topic/{key}", id=sub_id, headers={**DURABLE, "receipt": "s2"})
    expect_receipt(second, "s2")
    message = second.next("MESSAGE")
    assert message.body == "while-away"
    assert message.headers["destination"] == f"/topic/{key}"
    assert message.headers["subscription"] == sub_id

    second.conn.unsubscribe(id=sub_id, headers={"durable": "true", "receipt": "u"})
    expect_receipt(second, "u")
    assert not broker.queue_exists(queue)


def test_plain_unsubscribe_keeps_durable_subscription_queue(stomp_client, broker):
    key = unique("dur")
    sub_id = unique("id")
    queue = subscription_queue_name(key, sub_id)
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.subscribe(f"/topic/{key}", id=sub_id, headers={**DURABLE, "receipt": "s"})
    expect_receipt(client, "s")
    client.conn.unsubscribe(id=sub_id, headers={"receipt": "u"})
    expect_receipt(client, "u")
    client.conn.send(f"/topic/{key}", "kept", headers={"receipt": "p"})
    expect_receipt(client, "p")
    assert broker.depth(queue) == 1
    assert client.nothing_more()


def test_durable_subscription_is_shared_by_subscribers_with_the_same_id(stomp_client, broker):
    key = unique("dur")
    sub_id = unique("id")
    queue = subscription_queue_name(key, sub_id)
    broker.track_queue(queue)
    a, b = stomp_client(), stomp_client()
    for client in (a, b):
        client.conn.subscribe(f"/topic/{key}", id=sub_id, headers={**DURABLE, "receipt": "s"})
        expect_receipt(client, "s")
    for i in range(4):
        a.conn.send(f"/topic/{key}", f"m{i}")
    a.conn.send(f"/topic/{key}", "m4", headers={"receipt": "r"})
    expect_receipt(a, "r")
    # one queue, two consumers: every message delivered once, to one of them
    got_a = [m.body for m in _drain(a)]
    got_b = [m.body for m in _drain(b)]
    assert sorted(got_a + got_b) == ["m0", "m1", "m2", "m3", "m4"]
    assert got_a and got_b


def test_durable_unsubscribe_of_exchange_subscription_keeps_queue(stomp_client, broker):
    key = unique("dur")
    sub_id = unique("id")
    queue = subscription_queue_name(key, sub_id)  # the exchange is not part of the hash
    broker.track_queue(queue)
    client = stomp_client()
    headers = {"persistent": "true", "auto-delete": "false"}
    client.conn.subscribe(f"/exchange/amq.direct/{key}", id=sub_id, headers={**headers, "receipt": "s"})
    expect_receipt(client, "s")
    assert flags(broker.queue_info(queue)) == (True, False, False)
    client.conn.unsubscribe(id=sub_id, headers={"durable": "true", "receipt": "u"})
    expect_receipt(client, "u")
    assert broker.queue_exists(queue)  # only /topic durable subscriptions are deleted
    # (docs/destinations.md#durable-subscriptions)


def test_durable_subscription_with_x_queue_name(stomp_client, broker):
    key = unique("dur")
    queue = unique("named-durable")
    broker.track_queue(queue)
    client = stomp_client()
    headers = {**DURABLE, "x-queue-name": queue}
    client.conn.subscribe(f"/topic/{key}", id="d", headers={**headers, "receipt": "s"})
    expect_receipt(client, "s")
    assert flags(broker.queue_info(queue)) == (True, False, False)
    # the UNSUBSCRIBE must repeat x-queue-name for the queue to be deleted
    # (docs/destinations.md#durable-subscriptions)
    client.conn.unsubscribe(id="d", headers={**headers, "receipt": "u"})
    expect_receipt(client, "u")
    assert not broker.queue_exists(queue)


def _drain(client: StompClient) -> list:
    messages = []
    while True:
        try:
            messages.append(client.next("MESSAGE", timeout=0.3))
        except AssertionError:
            return messages


def test_durable_requires_id(stomp_client, broker):
    client = stomp_client("1.0")
    client.conn.subscribe(f"/topic/{unique('k')}", headers={"durable": "true"})
    error = client.next("ERROR")
    assert error.headers["message"] == "Missing Header"
    assert error.body == "Header 'id' is required for durable subscriptions"


def test_x_queue_name_names_the_subscription_queue(stomp_client, broker):
    key = unique("k")
    queue = unique("named")
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.subscribe(f"/topic/{key}", id="s", headers={"x-queue-name": queue, "receipt": "sub"})
    expect_receipt(client, "sub")
    assert flags(broker.queue_info(queue)) == (False, True, False)
    assert [(b["source"], b["routing_key"]) for b in broker.queue_bindings(queue)] == [("amq.topic", key)]
    client.conn.send(f"/topic/{key}", "named", headers={"receipt": "r"})
    expect_receipt(client, "r")
    assert client.next("MESSAGE").body == "named"
    client.conn.unsubscribe(id="s", headers={"receipt": "u"})
    expect_receipt(client, "u")
    assert broker.wait_gone(queue)  # auto-delete once its consumer is cancelled


# ----------------------------------------------------------------------------------- x-arguments
def test_x_max_length(stomp_client, broker):
    queue = unique("maxlen")
    broker.track_queue(queue)
    client = stomp_client()
    for i in range(3):
        client.conn.send(f"/queue/{queue}", f"m{i}", headers={"x-max-length": " 2 ", "receipt": f"r{i}"})
    for i in range(3):
        expect_receipt(client, f"r{i}")
    assert broker.queue_info(queue)["arguments"] == {"x-max-length": 2}
    assert broker.depth(queue) == 2
    first = broker.get(queue)
    assert first.body == b"m1"  # the head was dropped
    # the x- header is also copied into the message headers (docs/destinations.md#queue-arguments-x--headers;
    # docs/destinations.md#send--amqp)
    assert first.headers["x-max-length"] == " 2 "


def test_x_message_ttl_and_dead_letter_exchange(stomp_client, broker):
    queue, dlx, dlq = unique("ttl"), unique("dlx"), unique("dlq")
    broker.declare_exchange(dlx, "fanout")
    broker.declare_queue(dlq)
    broker.bind(dlq, dlx)
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.send(
        f"/queue/{queue}",
        "expires",
        headers={"x-message-ttl": "0", "x-dead-letter-exchange": dlx, "receipt": "r"},
    )
    expect_receipt(client, "r")
    info = broker.queue_info(queue)
    assert info["arguments"] == {"x-message-ttl": 0, "x-dead-letter-exchange": dlx}
    assert broker.wait_depth(dlq, 1) == 1
    assert broker.depth(queue) == 0
    dead = broker.get(dlq)
    assert dead.body == b"expires"
    death = dead.headers["x-death"][0]
    assert death["reason"] == "expired"
    assert death["queue"] == queue


def test_quorum_queue(stomp_client, broker):
    queue = unique("quorum")
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.subscribe(
        f"/queue/{queue}", id="q", ack="client-individual", headers={"x-queue-type": "quorum", "receipt": "s"}
    )
    expect_receipt(client, "s")
    info = broker.queue_info(queue)
    assert info["type"] == "quorum"
    assert info["arguments"] == {"x-queue-type": "quorum"}
    assert info["durable"] is True
    client.conn.send(f"/queue/{queue}", "q-msg")
    message = client.next("MESSAGE")
    assert message.body == "q-msg"
    client.conn.ack(message.headers["ack"], receipt="a")
    expect_receipt(client, "a")


def test_quorum_queue_cannot_be_non_durable(stomp_client, broker):
    queue = unique("quorum")
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.send(f"/queue/{queue}", "x", headers={"x-queue-type": "quorum", "durable": "false"})
    error = client.next("ERROR")
    assert error.headers["message"] == "precondition_failed"
    assert error.body.startswith("PRECONDITION_FAILED")
    assert client.wait_disconnected()
    assert not broker.queue_exists(queue)


STREAM = {"x-queue-type": "stream"}


def test_stream_queue_from_first_offset(stomp_client, broker):
    queue = unique("stream")
    broker.track_queue(queue)
    producer = stomp_client()
    for i in range(3):
        producer.conn.send(f"/queue/{queue}", f"s{i}", headers={**STREAM, "receipt": f"r{i}"})
    for i in range(3):
        expect_receipt(producer, f"r{i}")
    info = broker.queue_info(queue)
    assert info["type"] == "stream"
    assert info["arguments"] == STREAM

    consumer = stomp_client()
    consumer.conn.subscribe(
        f"/queue/{queue}",
        id="st",
        ack="client",
        headers={**STREAM, "x-stream-offset": "first", "prefetch-count": "10", "receipt": "s"},
    )
    expect_receipt(consumer, "s")
    messages = consumer.messages(3)
    assert [m.body for m in messages] == ["s0", "s1", "s2"]
    assert [m.headers["x-stream-offset"] for m in messages] == ["0", "1", "2"]
    consumer.conn.ack(messages[-1].headers["ack"], receipt="a")
    expect_receipt(consumer, "a")

    # from a given offset
    later = stomp_client()
    later.conn.subscribe(
        f"/queue/{queue}",
        id="st2",
        ack="client-individual",
        headers={**STREAM, "x-stream-offset": "offset=2", "prefetch-count": "10"},
    )
    assert later.next("MESSAGE").body == "s2"
    assert later.nothing_more()


def test_stream_consumer_needs_prefetch(stomp_client, broker):
    queue = unique("stream")
    broker.track_queue(queue)
    client = stomp_client()
    client.conn.subscribe(
        f"/queue/{queue}", id="st", ack="client", headers={**STREAM, "x-stream-offset": "first"}
    )
    error = client.next("ERROR")
    assert error.headers["message"] == "precondition_failed"
    assert error.body.startswith("PRECONDITION_FAILED - consumer prefetch count is not set")
    assert client.wait_disconnected()
