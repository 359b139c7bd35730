"""The adapter in front of brokers of other generations, played by the AMQP proxy
(tests/amqp_proxy.py) in front of the real RabbitMQ 3.10.8.

"4.3": connection.start says 4.3.0, and a queue.declare of a new transient non-exclusive queue
is answered with connection.close 541, as RabbitMQ 4.3 answers it (the deprecated feature
``transient_nonexcl_queues``, denied by default).  Every subscription path must work there:
plain ``/topic/`` and ``/exchange/``, temp queues, durable subscriptions, and the activemq
profile's topics.  "3.10.8" and "3.12.0": connection.start says so, nothing is refused, and
the flags the adapter declares are those of the plugin of that generation (read from the
proxy's record of the declares, and from the broker's management API).

A bystander client of the same adapter stays served throughout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from pamqp import commands

from tests.amqp_proxy import MethodLog, ProxyThread, RefuseTransientQueues, ServerVersion
from tests.support import AdapterProcess, BrokerProbe, StompClient, unique

Factory = Callable[..., tuple[ProxyThread, MethodLog]]


@pytest.fixture
def proxied(amqp_url: str) -> Iterator[Factory]:
    """Factory: a proxy presenting ``version`` (refusing transient non-exclusive queues when
    ``refuse``), and the log of the methods the adapter sent through it."""
    started: list[ProxyThread] = []

    def start(version: str | None, *, refuse: bool) -> tuple[ProxyThread, MethodLog]:
        log = MethodLog()
        hooks = [ServerVersion(version), log]
        if refuse:
            hooks.append(RefuseTransientQueues(amqp_url))
        proxy = ProxyThread(amqp_url, hooks).__enter__()
        started.append(proxy)
        return proxy, log

    yield start
    for proxy in started:
        proxy.__exit__(None, None, None)


@pytest.fixture
def rabbit43(
    proxied: Factory, start_adapter: Callable[..., AdapterProcess]
) -> Callable[..., tuple[AdapterProcess, MethodLog]]:
    def start(**settings: object) -> tuple[AdapterProcess, MethodLog]:
        proxy, log = proxied("4.3.0", refuse=True)
        return start_adapter(amqp_url=proxy.url, **settings), log

    return start


def _bystander(port: int, broker: BrokerProbe) -> tuple[StompClient, str]:
    queue = unique("bystander-")
    broker.track_queue(queue)
    client = StompClient(port)
    client.conn.subscribe(f"/queue/{queue}", id="b", headers={"receipt": "b"})
    client.next("RECEIPT")
    return client, queue


def _still_served(client: StompClient, queue: str) -> None:
    client.conn.send(f"/queue/{queue}", "still here")
    assert client.next("MESSAGE").body == "still here"


def _flags(declare: commands.Queue.Declare) -> tuple[bool, bool, bool]:
    return declare.durable, declare.exclusive, declare.auto_delete


def _subscribe_and_receive(client: StompClient, destination: str, **headers: str) -> None:
    """SUBSCRIBE with a receipt, then a SEND to the same destination comes back as MESSAGE."""
    client.conn.subscribe(destination, id="s", headers={"receipt": "r", **headers})
    answer = client.next(("RECEIPT", "ERROR"))
    assert answer.command == "RECEIPT", answer
    body = unique("m-")
    client.conn.send(destination, body)
    assert client.next("MESSAGE").body == body


@pytest.mark.parametrize(
    "destination", ["/topic/{name}", "/exchange/amq.topic/{name}", "/exchange/amq.fanout"]
)
def test_plain_subscriptions_work_in_front_of_4_3(
    rabbit43: Callable[..., tuple[AdapterProcess, MethodLog]], broker: BrokerProbe, destination: str
) -> None:
    adapter, log = rabbit43()
    bystander, queue = _bystander(adapter.port, broker)
    client = StompClient(adapter.port)
    assert client.next("CONNECTED").headers["server"] == "RabbitMQ/4.3.0"
    _subscribe_and_receive(client, destination.format(name=unique("t")))
    [declare] = [d for d in log.declares() if d.queue.startswith("stomp-subscription-")]
    assert _flags(declare) == (False, True, True)  # exclusive, as 4.3's plugin declares it
    _still_served(bystander, queue)


def test_temp_queue_works_in_front_of_4_3(
    rabbit43: Callable[..., tuple[AdapterProcess, MethodLog]], broker: BrokerProbe
) -> None:
    adapter, log = rabbit43()
    bystander, queue = _bystander(adapter.port, broker)
    requester = StompClient(adapter.port)
    service = unique("svc-")
    broker.track_queue(service)
    requester.conn.send(f"/queue/{service}", "ping", headers={"reply-to": "/temp-queue/r", "receipt": "p"})
    assert requester.next(("RECEIPT", "ERROR")).command == "RECEIPT"
    request = broker.get(service)
    assert request is not None
    reply_to = request.properties.reply_to
    assert reply_to.startswith("amq.gen-")  # the broker named it
    bystander.conn.send(f"/reply-queue/{reply_to}", "pong")
    assert requester.next("MESSAGE").body == "pong"
    [temp] = log.declares("")
    assert _flags(temp) == (False, True, True)
    _still_served(bystander, queue)


def test_durable_topic_subscription_in_front_of_4_3(
    rabbit43: Callable[..., tuple[AdapterProcess, MethodLog]], broker: BrokerProbe
) -> None:
    adapter, log = rabbit43()
    topic = unique("dur")
    client = StompClient(adapter.port)
    durable = {"durable": "true", "auto-delete": "false"}
    _subscribe_and_receive(client, f"/topic/{topic}", **durable)
    [declare] = [d for d in log.declares() if d.queue.startswith("stomp-subscription-")]
    broker.track_queue(declare.queue)
    assert _flags(declare) == (True, False, False)  # durable subscriptions stay shareable
    client.close()
    info = broker.queue_info(declare.queue)
    assert info is not None and (info["durable"], info["exclusive"]) == (True, False)
    # it outlives the connection; a later one resubscribes to the same queue
    again = StompClient(adapter.port)
    _subscribe_and_receive(again, f"/topic/{topic}", **durable)
    assert {d.queue for d in log.declares() if d.queue.startswith("stomp-subscription-")} == {declare.queue}


def test_activemq_profile_topics_in_front_of_4_3(
    rabbit43: Callable[..., tuple[AdapterProcess, MethodLog]], broker: BrokerProbe
) -> None:
    adapter, log = rabbit43(profile="activemq")
    bystander, queue = _bystander(adapter.port, broker)
    client = StompClient(adapter.port, headers={"client-id": unique("app-")})
    _subscribe_and_receive(client, f"/topic/{unique('news')}")
    named = unique("sub")
    client.conn.subscribe(
        f"/topic/{unique('dur')}", id="d", headers={"activemq.subscriptionName": named, "receipt": "d"}
    )
    assert client.next(("RECEIPT", "ERROR")).command == "RECEIPT"
    plain, durable = [_flags(d) for d in log.declares() if not d.queue.startswith("bystander-")]
    assert plain == (False, True, True)
    assert durable == (True, False, False)
    broker.track_queue(*(d.queue for d in log.declares() if d.durable))
    _still_served(bystander, queue)


@pytest.mark.parametrize(
    ("version", "topic", "exchange"),
    [
        ("3.10.8", (False, False, True), (False, False, True)),  # 3.10.8's plugin: today's flags
        ("3.12.0", (False, False, True), (False, True, True)),  # /exchange/ exclusive since 3.12.0
        ("3.13.7", (False, False, True), (False, True, True)),
        ("4.0.9", (False, True, True), (False, True, True)),  # 4.3.x's plugin's flags on every 4.x
    ],
)
def test_flags_follow_the_brokers_generation(
    proxied: Factory,
    start_adapter: Callable[..., AdapterProcess],
    version: str,
    topic: tuple[bool, bool, bool],
    exchange: tuple[bool, bool, bool],
) -> None:
    proxy, log = proxied(version, refuse=False)
    adapter = start_adapter(amqp_url=proxy.url)
    client = StompClient(adapter.port)
    assert client.next("CONNECTED").headers["server"] == f"RabbitMQ/{version}"
    client.conn.subscribe(f"/topic/{unique('t')}", id="t", headers={"receipt": "t"})
    client.conn.subscribe("/exchange/amq.fanout", id="x", headers={"receipt": "x"})
    assert client.next("RECEIPT").headers["receipt-id"] == "t"
    assert client.next("RECEIPT").headers["receipt-id"] == "x"
    on_topic, on_exchange = log.declares()
    assert _flags(on_topic) == topic
    assert _flags(on_exchange) == exchange


def test_unknown_version_gets_the_newest_rules(
    proxied: Factory, start_adapter: Callable[..., AdapterProcess]
) -> None:
    proxy, log = proxied(None, refuse=True)
    adapter = start_adapter(amqp_url=proxy.url)
    client = StompClient(adapter.port)
    _subscribe_and_receive(client, f"/topic/{unique('t')}")
    [declare] = log.declares()
    assert _flags(declare) == (False, True, True)


def test_basic_qos_is_never_global(rabbit43: Callable[..., tuple[AdapterProcess, MethodLog]]) -> None:
    """4.x treats global=true as global=false (per consumer): the adapter sends false, always."""
    adapter, log = rabbit43()
    client = StompClient(adapter.port)
    client.conn.subscribe(f"/topic/{unique('t')}", id="a", ack="client", headers={"prefetch-count": "3"})
    client.conn.subscribe(
        f"/topic/{unique('t')}", id="b", ack="client", headers={"prefetch-count": "5", "receipt": "b"}
    )
    client.next("RECEIPT")
    qos = log.sent(commands.Basic.Qos)
    assert [q.prefetch_count for q in qos] == [3, 5]
    assert [q.global_ for q in qos] == [False, False]


def test_refusal_as_4_3_answers_it(proxied: Factory, amqp_url: str) -> None:
    """The proxy itself: a new transient non-exclusive queue is refused with connection.close
    541 and the broker's text; an existing one gets the broker's equivalence check."""
    import asyncio

    import aiormq

    from tests.amqp_proxy import REFUSAL_TEXT

    proxy, _log = proxied("4.3.0", refuse=True)
    existing = unique("exists-")

    async def scenario() -> tuple[object, str]:
        setup = await aiormq.connect(amqp_url)
        channel = await setup.channel()
        await channel.queue_declare(existing, auto_delete=True)  # transient, non-exclusive
        connection = await aiormq.connect(proxy.url)
        ch = await connection.channel()
        ok = await ch.queue_declare(existing, auto_delete=True)  # exists: equivalent, passes
        try:
            await ch.queue_declare(unique("new-"), auto_delete=True)
        except aiormq.exceptions.AMQPError as error:
            refused = error
        else:
            refused = None
        await channel.queue_delete(existing)
        await setup.close()
        return ok, repr(refused)

    ok, refused = asyncio.run(scenario())
    assert ok is not None
    assert "541" in refused or "INTERNAL_ERROR" in refused
    assert REFUSAL_TEXT.startswith("INTERNAL_ERROR - Feature `transient_nonexcl_queues` is deprecated.")
    assert len(REFUSAL_TEXT.encode()) == 255


@pytest.mark.own_amqp_connection  # the second CONNECT joins the first's connection, on its node
# (with multiplexing: tests/integration/test_multiplexing.py,
# test_broker_info_metric_names_the_node_of_each_shared_connection)
def test_broker_info_metric_names_each_nodes_version(
    proxied: Factory, start_adapter: Callable[..., AdapterProcess]
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from adapter.server.metrics import build_registry, render

    old, _ = proxied("3.12.0", refuse=False)
    new, _ = proxied("4.3.0", refuse=True)
    adapter = start_adapter(amqp_url=f"{old.url},{new.url}")  # round robin: one login each
    for _ in range(2):
        StompClient(adapter.port).next("CONNECTED")

    async def scrape() -> bytes:
        return render(build_registry(adapter.server.context))

    text = adapter.run(scrape()).decode()
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "stomp_adapter_broker_info"]
    assert sorted(
        (s.labels["node"], s.labels["version"], s.labels["rules"], s.value) for s in family.samples
    ) == sorted(  # sorted on both sides: the proxies' ports are random
        [
            (f"amqp://127.0.0.1:{old.proxy.port}", "3.12.0", "3.11-3.13", 1.0),
            (f"amqp://127.0.0.1:{new.proxy.port}", "4.3.0", "4.x", 1.0),
        ]
    )


@pytest.mark.own_amqp_connection  # the reuse pool, which multiplexing replaces (its rules for
# connection-bound queues: tests/integration/test_multiplexing.py)
def test_connection_reuse_never_lends_a_connection_with_an_exclusive_queue(
    rabbit43: Callable[..., tuple[AdapterProcess, MethodLog]], broker: BrokerProbe
) -> None:
    """An exclusive queue belongs to the AMQP connection that declared it: a pooled connection
    must never carry one into another session (adapter/amqp/pool_runtime.py).  Two sessions one
    after the other each get their own subscription queue, and each works."""
    adapter, log = rabbit43(amqp_connection_reuse=True, amqp_connection_idle_seconds=60)
    queue = unique("reuse-")
    broker.track_queue(queue)
    reuse = adapter.server.context.amqp_reuse
    assert reuse is not None

    async def pooled() -> int:
        return len(reuse.pool)

    def wait_pooled(count: int) -> None:
        deadline = time.monotonic() + 10  # a safety timeout only
        while adapter.run(pooled()) != count:
            assert time.monotonic() < deadline, f"pool never held {count}"
            time.sleep(0.02)

    plain = StompClient(adapter.port)  # a session that declares nothing connection-bound ...
    plain.conn.send(f"/queue/{queue}", "x", headers={"receipt": "p"})
    plain.next("RECEIPT")
    plain.close()
    wait_pooled(1)
    first = StompClient(adapter.port)  # ... lends its connection to this one
    _subscribe_and_receive(first, f"/topic/{unique('t')}")
    first.close()
    second = StompClient(adapter.port)
    _subscribe_and_receive(second, f"/topic/{unique('t')}")
    declares = [d for d in log.declares() if d.queue.startswith("stomp-subscription-")]
    assert len(declares) == 2 and all(_flags(d) == (False, True, True) for d in declares)
    assert reuse.reused == 1  # the first subscriber's login was the pooled connection
    assert len(log.sent(commands.Connection.StartOk)) == 2  # the second's was a fresh one
