"""Selectors on /queue/ subscriptions (activemq profile, adapter/dispatch/rules.py) against the
real RabbitMQ: competing consumers with selectors get exactly their messages, a message no
selector matches stays on the queue, and nothing is lost when consumers come and go.  The STOMP
side is stomp.py, the broker side an independent AMQP client (BrokerProbe)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support import AdapterProcess, BrokerProbe, StompClient, expect_receipt, unique


@pytest.fixture
def amq(start_adapter: Callable[..., AdapterProcess]) -> AdapterProcess:
    return start_adapter(profile="activemq")


@pytest.fixture
def clients(amq: AdapterProcess) -> Iterator[Callable[[], StompClient]]:
    opened: list[StompClient] = []

    def connect() -> StompClient:
        client = StompClient(amq.port)
        opened.append(client)
        return client

    yield connect
    for client in opened:
        client.close()


@pytest.fixture
def queue(broker: BrokerProbe) -> str:
    name = unique("amq-sel")
    broker.track_queue(name)
    return name


def subscribe(
    client: StompClient, queue: str, sub_id: str, selector: str, ack: str = "client-individual"
) -> None:
    client.conn.subscribe(
        f"/queue/{queue}", sub_id, ack=ack, headers={"selector": selector, "receipt": f"s-{sub_id}"}
    )
    expect_receipt(client, f"s-{sub_id}")


def send(client: StompClient, queue: str, colour: str, body: str) -> None:
    client.conn.send(f"/queue/{queue}", body, headers={"colour": colour, "persistent": "true"})


def parked(adapter: AdapterProcess, queue: str) -> int:
    """Messages the adapter holds unmatched on its channels for ``queue``."""

    async def count() -> int:
        dispatcher = adapter.server.context.session_settings.registries.dispatchers.get("/", queue)
        return sum(len(member.parked) for member in dispatcher.members)

    return int(adapter.run(count()))


def wait_parked(adapter: AdapterProcess, queue: str, expected: int, timeout: float = 5.0) -> int:
    deadline = time.monotonic() + timeout
    while (current := parked(adapter, queue)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return current


def test_two_consumers_with_disjoint_selectors_each_get_exactly_theirs(
    clients: Callable[[], StompClient], queue: str, broker: BrokerProbe
) -> None:
    red, blue, producer = clients(), clients(), clients()
    subscribe(red, queue, "r", "colour = 'red'")
    subscribe(blue, queue, "b", "colour = 'blue'")
    for n in range(20):
        send(producer, queue, "red" if n % 2 else "blue", f"{'red' if n % 2 else 'blue'}-{n}")
    got_red = red.messages(10)
    got_blue = blue.messages(10)
    assert sorted(m.body for m in got_red) == sorted(f"red-{n}" for n in range(1, 20, 2))
    assert sorted(m.body for m in got_blue) == sorted(f"blue-{n}" for n in range(0, 20, 2))
    assert red.nothing_more() and blue.nothing_more()
    # client-individual ACKs, each settled on the channel its message came from (a wrong
    # channel or tag would close that channel with PRECONDITION_FAILED)
    for client, got in ((red, got_red), (blue, got_blue)):
        for message in got[:-1]:
            client.conn.ack(message.headers["ack"])
        client.conn.ack(got[-1].headers["ack"], receipt="done")
        expect_receipt(client, "done")
    red.close()
    blue.close()
    assert broker.idle_depth(queue) == 0  # every message acked, none requeued


def test_a_message_no_selector_matches_stays_on_the_queue(
    amq: AdapterProcess, clients: Callable[[], StompClient], queue: str, broker: BrokerProbe
) -> None:
    red, blue = clients(), clients()
    subscribe(red, queue, "r", "colour = 'red'")
    subscribe(blue, queue, "b", "colour = 'blue'", ack="auto")
    send(red, queue, "green", "green-1")
    send(red, queue, "red", "red-1")
    assert red.messages(1)[0].body == "red-1"
    assert wait_parked(amq, queue, 1) == 1  # held, unacknowledged, by the adapter
    assert red.nothing_more() and blue.nothing_more()
    red.close()
    blue.close()
    # back on the queue when its holders left: never lost, never delivered
    assert broker.idle_depth(queue) == 2  # green, and red-1 that red never acked
    bodies = sorted(got.body for got in iter(lambda: broker.get(queue), None))
    assert bodies == [b"green-1", b"red-1"]


def test_a_consumer_that_joins_later_gets_the_parked_messages(
    amq: AdapterProcess, clients: Callable[[], StompClient], queue: str, broker: BrokerProbe
) -> None:
    red = clients()
    subscribe(red, queue, "r", "colour = 'red'")
    for n in range(3):
        send(red, queue, "blue", f"blue-{n}")
    assert wait_parked(amq, queue, 3) == 3
    blue = clients()
    subscribe(blue, queue, "b", "colour = 'blue'", ack="client")
    got = blue.messages(3)
    assert sorted(m.body for m in got) == ["blue-0", "blue-1", "blue-2"]
    assert red.nothing_more()
    # one cumulative ACK settles the three on red's channel
    last = max(got, key=lambda m: int(m.headers["ack"].rsplit("@@", 1)[1]))
    blue.conn.ack(last.headers["ack"], receipt="acked")
    expect_receipt(blue, "acked")
    red.close()
    blue.close()
    assert broker.idle_depth(queue) == 0


def test_a_consumer_that_disconnects_with_unacked_messages_loses_none(
    clients: Callable[[], StompClient], queue: str, broker: BrokerProbe
) -> None:
    first, producer = clients(), clients()
    subscribe(first, queue, "r", "colour = 'red'")
    for n in range(4):
        send(producer, queue, "red", f"red-{n}")
    first.messages(4)
    first.close()  # no ACK
    second = clients()
    subscribe(second, queue, "r", "colour = 'red'")
    again = second.messages(4)
    assert sorted(m.body for m in again) == [f"red-{n}" for n in range(4)]
    assert all(m.headers["redelivered"] == "true" for m in again)
    for message in again:
        second.conn.ack(message.headers["ack"])
    second.close()
    assert broker.idle_depth(queue) == 0


def test_routed_message_of_a_consumer_that_left_is_redelivered_not_lost(
    amq: AdapterProcess, clients: Callable[[], StompClient], queue: str, broker: BrokerProbe
) -> None:
    """A message that arrived on red's channel and was given to blue: red disconnects before
    blue acknowledges it.  The broker requeues it with red's channel (at least once: blue's
    later ACK settles nothing), and it comes back to blue as redelivered."""
    red = clients()
    subscribe(red, queue, "r", "colour = 'red'")
    send(red, queue, "blue", "blue-1")
    assert wait_parked(amq, queue, 1) == 1
    blue = clients()
    subscribe(blue, queue, "b", "colour = 'blue'")
    first = blue.messages(1)[0]
    assert first.headers["redelivered"] == "false"
    red.close()
    again = blue.messages(1, timeout=10)[0]
    assert (again.body, again.headers["redelivered"]) == ("blue-1", "true")
    blue.conn.ack(first.headers["ack"])  # settles nothing: red's channel is gone
    blue.conn.ack(again.headers["ack"])
    blue.close()
    assert broker.idle_depth(queue) == 0


def test_unsubscribe_returns_what_it_held(
    amq: AdapterProcess, clients: Callable[[], StompClient], queue: str, broker: BrokerProbe
) -> None:
    red = clients()
    subscribe(red, queue, "r", "colour = 'red'")
    send(red, queue, "green", "green-1")
    assert wait_parked(amq, queue, 1) == 1
    red.conn.unsubscribe("r", headers={"receipt": "u"})
    expect_receipt(red, "u")
    assert broker.wait_depth(queue, 1) == 1  # requeued while the connection stays open
    assert broker.get(queue) is not None


def test_transactional_ack_is_settled_at_commit(
    clients: Callable[[], StompClient], queue: str, broker: BrokerProbe
) -> None:
    red = clients()
    subscribe(red, queue, "r", "colour = 'red'")
    send(red, queue, "red", "red-1")
    message = red.messages(1)[0]
    red.conn.begin("t1")
    red.conn.ack(message.headers["ack"], transaction="t1")
    red.conn.abort("t1")
    red.conn.begin("t2")
    red.conn.ack(message.headers["ack"], transaction="t2")
    red.conn.commit("t2", headers={"receipt": "c"})
    expect_receipt(red, "c")
    red.close()
    assert broker.idle_depth(queue) == 0


def test_a_plain_amqp_consumer_on_the_queue_gets_what_is_released(
    amq: AdapterProcess, clients: Callable[[], StompClient], queue: str, broker: BrokerProbe
) -> None:
    """Nobody in the adapter matches: the message is held for the hold time, then released to
    the queue, where another consumer (here a plain AMQP one, as in another adapter process)
    gets it."""
    red = clients()
    subscribe(red, queue, "r", "colour = 'red'")
    send(red, queue, "green", "green-1")
    assert wait_parked(amq, queue, 1) == 1

    async def consume_one(channel: Any) -> bytes:
        declared = await channel.declare_queue(queue, passive=True)
        async with asyncio.timeout(20), declared.iterator() as messages:
            async for message in messages:
                await message.ack()
                return bytes(message.body)
        raise AssertionError("the queue iterator ended")

    assert broker.run(consume_one) == b"green-1"
    assert red.nothing_more()
    assert parked(amq, queue) == 0


# --- a subscription the broker refuses must not take the held messages with it (issue #24) -----


def collect(client: StompClient, count: int, timeout: float = 5.0) -> list[Any]:
    """Up to ``count`` MESSAGE frames, stopping early when none comes within ``timeout``."""
    got = []
    for _ in range(count):
        try:
            got.append(client.next("MESSAGE", timeout))
        except AssertionError:
            break
    return got


def refused_subscriber_takes_nothing(
    amq: AdapterProcess,
    clients: Callable[[], StompClient],
    queue: str,
    broker: BrokerProbe,
    holder: StompClient,
    refused: StompClient,
) -> None:
    """Blue messages are held on ``holder``'s channel (its selector is red); ``refused`` asks
    for them with a matching selector in ack:auto, and the broker refuses its consume.  Every
    blue message must still reach an authorised subscriber afterwards; ``holder`` is the
    bystander that stays served."""
    total = 5
    for n in range(total):
        send(holder, queue, "blue", f"blue-{n}")
    assert wait_parked(amq, queue, total) == total
    refused.conn.subscribe(
        f"/amq/queue/{queue}", "b", ack="auto", headers={"selector": "colour = 'blue'", "receipt": "sb"}
    )
    error = refused.next("ERROR")
    assert error.headers["message"] == "access_refused"
    assert refused.wait_disconnected(5)
    assert refused.nothing_more()  # not before the ERROR, not after it
    # the bystander is still served
    send(holder, queue, "red", "red-after")
    red = holder.next("MESSAGE")
    assert red.body == "red-after"
    holder.conn.ack(red.headers["ack"])
    # the blue messages are still held for an authorised subscriber (none acknowledged away),
    # and go back to the queue when their holder leaves
    assert parked(amq, queue) == total
    holder.close()
    assert broker.idle_depth(queue) == total
    blue = clients()
    subscribe(blue, queue, "b", "colour = 'blue'", ack="client-individual")
    got = collect(blue, total)
    assert sorted(m.body for m in got) == [f"blue-{n}" for n in range(total)]
    for message in got:
        blue.conn.ack(message.headers["ack"])
    blue.conn.unsubscribe("b", headers={"receipt": "ub"})
    expect_receipt(blue, "ub")
    blue.close()
    assert broker.idle_depth(queue) == 0


def test_a_subscriber_without_read_permission_gets_no_held_message_and_loses_none(
    amq: AdapterProcess, clients: Callable[[], StompClient], queue: str, broker: BrokerProbe
) -> None:
    reader = clients()
    subscribe(reader, queue, "r", "colour = 'red'")
    user = broker.create_user(
        "secret", prefix="amq-noread", permissions={"configure": ".*", "write": ".*", "read": "^$"}
    )
    refused = StompClient(amq.port, login=user, passcode="secret")
    try:
        refused_subscriber_takes_nothing(amq, clients, queue, broker, reader, refused)
    finally:
        refused.close()


def test_a_subscriber_refused_by_an_exclusive_consumer_gets_no_held_message_and_loses_none(
    amq: AdapterProcess, clients: Callable[[], StompClient], queue: str, broker: BrokerProbe
) -> None:
    holder = clients()
    holder.conn.subscribe(
        f"/queue/{queue}",
        "r",
        ack="client-individual",
        headers={"selector": "colour = 'red'", "activemq.exclusive": "true", "receipt": "s-r"},
    )
    expect_receipt(holder, "s-r")
    refused_subscriber_takes_nothing(amq, clients, queue, broker, holder, clients())


def test_a_plain_subscription_gets_the_held_messages_at_once(
    amq: AdapterProcess, clients: Callable[[], StompClient], queue: str, broker: BrokerProbe
) -> None:
    """A subscription without a selector matches everything: it is a member of the queue's
    dispatcher and gets what a selector subscription holds straight from the holding channel,
    not after the hold time (a released message would come back ``redelivered:true``)."""
    red = clients()
    subscribe(red, queue, "r", "colour = 'red'")
    total = 4
    for n in range(total):
        send(red, queue, "green", f"green-{n}")
    assert wait_parked(amq, queue, total) == total
    plain = clients()
    plain.conn.subscribe(f"/queue/{queue}", "p", ack="client", headers={"receipt": "s-p"})
    first = plain.next(("RECEIPT", "MESSAGE"))  # the RECEIPT first, then what it lets through
    assert (first.command, first.headers.get("receipt-id")) == ("RECEIPT", "s-p")
    got = plain.messages(total)
    assert sorted(m.body for m in got) == [f"green-{n}" for n in range(total)]
    assert all(m.headers["redelivered"] == "false" for m in got)  # never released in between
    assert parked(amq, queue) == 0
    # it also takes new messages of any colour; red keeps getting its own
    send(red, queue, "green", "green-new")
    assert plain.next("MESSAGE").body == "green-new"
    assert red.nothing_more()
    plain.conn.ack(got[-1].headers["ack"])  # cumulative: every earlier one too
    plain.close()
    red.close()
    assert broker.idle_depth(queue) == 1  # green-new, never acknowledged: back on the queue
