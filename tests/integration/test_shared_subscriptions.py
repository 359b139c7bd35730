"""adapter.shared_subscriptions against the real broker, met by independent clients (stomp.py, raw
sockets, the ``websockets`` library) and inspected through aio-pika, the management API and the
AMQP proxy's record of methods (tests/amqp_proxy.py).

Hostile cases first: a subscriber that stops reading is cut off at the bound while a bystander
of the same topic gets every message; the broker ending a group (its connection closed, its
user deleted, no read permission) reaches every member as it would a plain subscriber; a wrong
passcode never rides on someone else's group.  Then what sharing is for: many subscribers, one
queue, every message in order, joins and leaves that send the broker nothing."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import pytest
from websockets.sync.client import connect as ws_connect

from adapter.server.metrics import build_registry, render
from adapter.sharing.rules import MAX_OPENED_PER_CONNECTION
from tests.amqp_proxy import MethodLog, ProxyThread
from tests.support import AdapterProcess, BrokerProbe, StompClient, frame_headers, read_frames, unique

MAX_LAG = 256 * 1024


@pytest.fixture
def shared(start_adapter: Callable[..., AdapterProcess]) -> AdapterProcess:
    return start_adapter(
        shared_subscriptions=True,
        shared_subscription_max_lag=MAX_LAG,
        web_stomp_listeners=["127.0.0.1:0"],
    )


@pytest.fixture
def clients() -> Iterator[list[StompClient]]:
    made: list[StompClient] = []
    yield made
    for client in made:
        client.close()


def subscriber(
    adapter: AdapterProcess, clients: list[StompClient], destination: str, **kwargs: Any
) -> StompClient:
    headers = kwargs.pop("subscribe_headers", {})
    client = StompClient(adapter.port, **kwargs)
    clients.append(client)
    sub_id = unique("s")
    client.conn.subscribe(destination, id=sub_id, ack="auto", headers={**headers, "receipt": sub_id})
    assert client.next(("RECEIPT", "ERROR")).command == "RECEIPT"
    return client


def publish_many(broker: BrokerProbe, routing_key: str, bodies: list[bytes]) -> None:
    """Publish on one channel of the independent client, to amq.topic."""
    import aio_pika

    async def work(channel: Any) -> None:
        exchange = await channel.get_exchange("amq.topic", ensure=False)
        for body in bodies:
            await exchange.publish(aio_pika.Message(body), routing_key=routing_key)

    broker.run(work)


def topic_queues(broker: BrokerProbe, routing_key: str) -> list[str]:
    """The queues bound to amq.topic with ``routing_key`` (the subscriptions' queues)."""
    return [
        b["destination"]
        for b in broker.exchange_bindings("amq.topic")
        if b["routing_key"] == routing_key and b["destination_type"] == "queue"
    ]


def groups(adapter: AdapterProcess) -> int:
    async def count() -> int:
        registry = adapter.server.context.shared_subscriptions
        assert registry is not None
        return len(registry.groups)

    return int(adapter.run(count()))


def scrape(adapter: AdapterProcess) -> str:
    """The adapter's /metrics text."""

    async def text() -> str:
        return render(build_registry(adapter.server.context)).decode()

    return str(adapter.run(text()))


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def raw_subscriber(port: int, destination: str, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
    sock.sendall(f"SUBSCRIBE\ndestination:{destination}\nid:slow\nreceipt:r\n\n\0".encode())
    frames, _closed = read_frames(sock, timeout=5, count=2)
    assert [frame_headers(f)[0] for f in frames] == ["CONNECTED", "RECEIPT"], frames
    return sock


# --- hostile: a subscriber that stops reading --------------------------------------------------
def test_a_subscriber_that_stops_reading_is_cut_off_at_the_bound_and_the_bystander_gets_everything(
    shared: AdapterProcess, broker: BrokerProbe, clients: list[StompClient]
) -> None:
    key = unique("slow")
    destination = f"/topic/{key}"
    slow = raw_subscriber(shared.port, destination, rcvbuf=4096)
    bystander = subscriber(shared, clients, destination)
    count, size = 800, 8 * 1024  # 6.4 MB: far over what the kernel buffers and the bound hold
    bodies = [f"{i:06d}".encode() + b"x" * (size - 6) for i in range(count)]
    # The slow client starts reading as soon as it has been cut off: after its close the adapter
    # gives a client that does not read at all a few seconds (the linger) before it resets it.
    slow_read: dict[str, Any] = {}

    def read_when_cut_off() -> None:
        if wait_until(lambda: shared.server.context.shared_subscriptions.evicted >= 1, timeout=60):  # type: ignore[union-attr]
            slow_read["frames"], slow_read["closed"] = read_frames(slow, timeout=20)

    reader = threading.Thread(target=read_when_cut_off)
    reader.start()
    publish_many(broker, key, bodies)
    got = bystander.messages(count, timeout=30)
    assert [m.body[:6] for m in got] == [b[:6].decode() for b in bodies]
    reader.join(90)
    assert "frames" in slow_read, "the slow subscriber was never cut off"
    assert "stomp_adapter_shared_subscribers_evicted_total 1.0" in scrape(shared)
    frames, closed = slow_read["frames"], slow_read["closed"]
    slow.close()
    commands = [frame_headers(f)[0] for f in frames]
    assert commands[-1] == "ERROR" and set(commands[:-1]) <= {"MESSAGE"}, commands[-3:]
    _command, headers, body = frame_headers(frames[-1])
    assert headers["message"] == "Slow consumer"
    assert b"adapter.shared_subscription_max_lag" in body and str(MAX_LAG).encode() in body
    assert len(commands) - 1 < count  # cut off, not served at the others' expense
    assert closed
    # what it did receive is a prefix of the topic, in order: nothing skipped silently
    numbers = [frame_headers(f)[2][:6] for f in frames[:-1]]
    assert numbers == [b[:6] for b in bodies[: len(numbers)]]


def test_a_websocket_subscriber_that_stops_reading_is_cut_off_too(
    shared: AdapterProcess, broker: BrokerProbe, clients: list[StompClient]
) -> None:
    key = unique("wsslow")
    destination = f"/topic/{key}"
    ws_port = shared.server.web_addresses[0][1]
    # max_queue=1: the client library stops reading its socket once one message waits unread
    with ws_connect(
        f"ws://127.0.0.1:{ws_port}/ws",
        subprotocols=["v12.stomp"],
        compression=None,
        max_queue=1,  # type: ignore[list-item]
    ) as ws:
        ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        ws.send("CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
        assert str(ws.recv(timeout=5)).startswith("CONNECTED")
        ws.send(f"SUBSCRIBE\ndestination:{destination}\nid:w\nreceipt:r\n\n\0")
        assert str(ws.recv(timeout=5)).startswith("RECEIPT")
        bystander = subscriber(shared, clients, destination)
        count = 800
        publish_many(broker, key, [f"{i:06d}".encode() + b"x" * 8186 for i in range(count)])
        got = bystander.messages(count, timeout=30)
        assert [m.body[:6] for m in got] == [f"{i:06d}" for i in range(count)]
        assert wait_until(lambda: shared.server.context.shared_subscriptions.evicted >= 1)  # type: ignore[union-attr]
        assert groups(shared) == 1  # the bystander's group goes on


# --- hostile: the broker ends a group ------------------------------------------------------------
def hub_connections(broker: BrokerProbe, destination: str) -> list[str]:
    return [
        c["name"]
        for c in broker.management("/api/connections")
        if (c.get("client_properties") or {}).get("connection_name") == f"STOMP shared {destination}"
    ]


def test_the_group_s_connection_closed_by_the_broker_reaches_every_member(
    shared: AdapterProcess, broker: BrokerProbe, clients: list[StompClient]
) -> None:
    key = unique("closed")
    destination = f"/topic/{key}"
    members = [subscriber(shared, clients, destination) for _ in range(3)]
    assert wait_until(lambda: len(hub_connections(broker, destination)) == 1)
    (name,) = hub_connections(broker, destination)
    broker.management(f"/api/connections/{quote(name, safe='')}", "DELETE")
    for member in members:
        error = member.next("ERROR", timeout=10)
        assert error.headers["message"] == "connection_forced", error.headers
        assert member.wait_disconnected()
    assert groups(shared) == 0


def test_a_deleted_user_loses_the_shared_subscription(
    shared: AdapterProcess, broker: BrokerProbe, clients: list[StompClient]
) -> None:
    user = broker.create_user("pw")
    destination = f"/topic/{unique('revoked')}"
    members = [subscriber(shared, clients, destination, login=user, passcode="pw") for _ in range(2)]
    broker.delete_user(user)
    for member in members:
        assert member.next("ERROR", timeout=10).command == "ERROR"
        assert member.wait_disconnected()
    assert wait_until(lambda: groups(shared) == 0)


@pytest.mark.own_amqp_connection  # a late CONNECT reaches the broker: not so when it joins
def test_cleared_permissions_act_on_shared_and_plain_subscribers_alike(
    shared: AdapterProcess, broker: BrokerProbe, clients: list[StompClient]
) -> None:
    """RabbitMQ checks read permission at consume and bind, not per message: a subscriber whose
    permissions are cleared keeps its messages until its channel or connection ends, shared or
    not (docs/configuration.md, "Shared subscriptions")."""
    user = broker.create_user("pw")
    key = unique("cleared")
    member = subscriber(shared, clients, f"/topic/{key}", login=user, passcode="pw")
    plain = subscriber(
        shared,
        clients,
        f"/topic/{key}",
        login=user,
        passcode="pw",
        subscribe_headers={"prefetch-count": "10"},
    )
    assert groups(shared) == 1
    broker.management(f"/api/permissions/%2F/{quote(user, safe='')}", "DELETE")
    publish_many(broker, key, [b"after"])
    assert member.next("MESSAGE").body == "after"
    assert plain.next("MESSAGE").body == "after"
    # without permissions on the vhost nobody of this user logs in any more, so nobody joins
    late = StompClient(shared.port, login=user, passcode="pw", connect=False)
    clients.append(late)
    with pytest.raises(Exception):  # noqa: B017 - stomp.py's connect error type varies by version
        late.conn.connect(user, "pw", wait=True)


def test_without_read_permission_the_first_subscriber_gets_the_broker_s_refusal(
    shared: AdapterProcess, broker: BrokerProbe, clients: list[StompClient]
) -> None:
    user = broker.create_user("pw", permissions={"configure": ".*", "write": ".*", "read": "^amq\\.gen.*$"})
    client = StompClient(shared.port, login=user, passcode="pw")
    clients.append(client)
    client.conn.subscribe(f"/topic/{unique('denied')}", id="s", ack="auto", headers={"receipt": "r"})
    error = client.next("ERROR", timeout=10)
    assert error.headers["message"] == "access_refused", error.headers
    assert client.wait_disconnected()
    assert groups(shared) == 0


def test_a_wrong_passcode_never_rides_on_someone_else_s_group(
    shared: AdapterProcess, broker: BrokerProbe, clients: list[StompClient]
) -> None:
    user = broker.create_user("right")
    key = unique("pass")
    owner = subscriber(shared, clients, f"/topic/{key}", login=user, passcode="right")
    intruder = StompClient(shared.port, login=user, passcode="wrong", connect=False)
    clients.append(intruder)
    with pytest.raises(Exception):  # noqa: B017 - stomp.py's connect error type varies by version
        intruder.conn.connect(user, "wrong", wait=True)
    publish_many(broker, key, [b"one"])
    assert owner.next("MESSAGE").body == "one"
    assert groups(shared) == 1


def test_one_client_subscribing_to_many_topics_opens_a_bounded_number_of_broker_connections(
    shared: AdapterProcess, broker: BrokerProbe, clients: list[StompClient]
) -> None:
    prefix = unique("wide")
    client = StompClient(shared.port)
    clients.append(client)
    count = MAX_OPENED_PER_CONNECTION + 8
    for n in range(count):
        client.conn.subscribe(f"/topic/{prefix}.{n}", id=f"s{n}", ack="auto", headers={"receipt": f"r{n}"})
        assert client.next(("RECEIPT", "ERROR")).command == "RECEIPT"
    assert groups(shared) == MAX_OPENED_PER_CONNECTION  # the rest are plain subscriptions

    def hubs() -> int:
        return sum(
            1
            for c in broker.management("/api/connections")
            if str((c.get("client_properties") or {}).get("connection_name", "")).startswith(
                f"STOMP shared /topic/{prefix}."
            )
        )

    assert wait_until(lambda: hubs() == MAX_OPENED_PER_CONNECTION)
    publish_many(broker, f"{prefix}.0", [b"shared"])
    publish_many(broker, f"{prefix}.{count - 1}", [b"plain"])
    assert sorted(m.body for m in client.messages(2)) == ["plain", "shared"]


# --- what sharing is for ---------------------------------------------------------------------
def test_many_subscribers_share_one_queue_and_get_every_message_in_order(
    shared: AdapterProcess, broker: BrokerProbe, clients: list[StompClient]
) -> None:
    key = unique("many")
    destination = f"/topic/{key}"
    members = [subscriber(shared, clients, destination, version=v) for v in ("1.0", "1.1", "1.2") * 7]
    ws_port = shared.server.web_addresses[0][1]
    with ws_connect(f"ws://127.0.0.1:{ws_port}/ws", subprotocols=["v12.stomp"], compression=None) as ws:  # type: ignore[list-item]
        ws.send("CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\0")
        assert str(ws.recv(timeout=5)).startswith("CONNECTED")
        ws.send(f"SUBSCRIBE\ndestination:{destination}\nid:w\nreceipt:r\n\n\0")
        assert str(ws.recv(timeout=5)).startswith("RECEIPT")
        assert len(topic_queues(broker, key)) == 1
        assert groups(shared) == 1
        bodies = [f"m{i}".encode() for i in range(200)]
        publish_many(broker, key, bodies)
        for member in members:
            got = member.messages(len(bodies), timeout=20)
            assert [m.body for m in got] == [b.decode() for b in bodies]
            assert len({m.headers["message-id"] for m in got}) == len(bodies)
        # one WebSocket message per MESSAGE frame, as for a plain subscription
        ws_got = [str(ws.recv(timeout=10)) for _ in bodies]
        assert all(m.startswith("MESSAGE\nsubscription:w\ndestination:/topic/") for m in ws_got)
        assert [m.split("\n\n", 1)[1].rstrip("\0\n") for m in ws_got] == [b.decode() for b in bodies]
    for member in members:
        member.close()
    # the last one gone: consumer cancelled, queue deleted
    assert wait_until(lambda: topic_queues(broker, key) == [])
    assert groups(shared) == 0


def test_joins_and_leaves_after_the_first_send_the_broker_nothing(
    amqp_url: str,
    start_adapter: Callable[..., AdapterProcess],
    broker: BrokerProbe,
    clients: list[StompClient],
) -> None:
    log = MethodLog()
    with ProxyThread(amqp_url, [log]) as proxy:
        adapter = start_adapter(amqp_url=proxy.url, shared_subscriptions=True)
        key = unique("quiet")
        destination = f"/topic/{key}"
        first = subscriber(adapter, clients, destination)
        others = [StompClient(adapter.port) for _ in range(5)]
        clients.extend(others)
        before = len(log.methods)
        links_before = {number for number, _ in log.methods}
        for i, client in enumerate(others):
            client.conn.subscribe(destination, id=f"s{i}", ack="auto", headers={"receipt": f"r{i}"})
            assert client.next("RECEIPT").command == "RECEIPT"
        joined = len(log.methods)
        for i, client in enumerate(others):
            client.conn.unsubscribe(f"s{i}", headers={"receipt": f"u{i}"})
            assert client.next("RECEIPT").command == "RECEIPT"
        # leaving sends nothing (but the last member's, which is `first`)
        assert log.methods[joined:] == []
        # a join's only methods are its rights check (adapter/amqp/rights_check.py): a login
        # on a connection of its own, and there a plain SUBSCRIBE's declare, consume and bind on
        # a queue of its own; on the members' and the group's connections not a channel.open,
        # not a consume, not a cancel
        checks = log.methods[before:joined]
        assert all(number not in links_before for number, _ in checks)
        kinds = {type(method).__qualname__ for _, method in checks}
        assert {kind for kind in kinds if not kind.startswith("Connection.")} == {
            "Channel.Open",
            "Queue.Declare",
            "Basic.Consume",
            "Queue.Bind",
        }
        (group_queue,) = topic_queues(broker, key)
        check_queues = {m.queue for _, m in checks if type(m).__qualname__ == "Queue.Bind"}
        assert len(check_queues) == len(others) and group_queue not in check_queues
        assert len(topic_queues(broker, key)) == 1
        publish_many(broker, key, [b"still"])
        assert first.next("MESSAGE").body == "still"


@pytest.mark.parametrize(
    "headers",
    [{"ack": "client"}, {"selector": "a = 1"}, {"prefetch-count": "5"}],
    ids=["ack-client", "selector", "prefetch"],
)
def test_subscriptions_that_differ_per_subscriber_keep_their_own_queue(
    shared: AdapterProcess, broker: BrokerProbe, clients: list[StompClient], headers: dict[str, str]
) -> None:
    key = unique("own")
    for _ in range(2):
        client = StompClient(shared.port)
        clients.append(client)
        client.conn.subscribe(
            f"/topic/{key}", id="s", ack=headers.get("ack", "auto"), headers={**headers, "receipt": "r"}
        )
        assert client.next("RECEIPT").command == "RECEIPT"
    assert len(topic_queues(broker, key)) == 2
    assert groups(shared) == 0
