"""The declare rules per broker generation (docs/compatibility.md#broker-generations), without a
broker: the version -> generation mapping, the flag table of each generation's plugin (read in
rabbitmq-server's sources: rabbit_stomp_util.erl default_params and the routing util's
queue_declare_method at v3.10.8, v3.13.7, v4.3.5), the session's use of the generation its
login reported, the AMQP handshake that reads the version, the per-node log line and the
workers' merge of the info series."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pamqp import commands, frame

from adapter.amqp import wire
from adapter.amqp.brokers import BrokerNodes, parse_nodes
from adapter.amqp.connection import AmqpConnection
from adapter.mapping import operations as ops
from adapter.mapping.destinations import (
    NEWEST_BROKER,
    BrokerGeneration,
    DestinationKind,
    broker_generation,
    parse_destination,
    queue_params,
    send_queue_declare,
    subscribe_target,
)
from adapter.mapping.profile import rules_for
from adapter.server.workermetrics import WorkerMetrics
from adapter.stomp.frame import Frame
from tests.unit.test_amqp_connection import Events, MemoryTransport, broker
from tests.unit.test_session import make_session, run

G = BrokerGeneration
K = DestinationKind


@pytest.mark.parametrize(
    ("version", "generation"),
    [
        ("3.10.8", G.V3_10),
        ("3.10.25", G.V3_10),
        ("3.9.29", G.V3_10),
        ("2.8.7", G.V3_10),
        ("3.11.0", G.V3_11),
        ("3.12.0", G.V3_11),
        ("3.13.7", G.V3_11),
        ("3.13.7+1.g0a1b2c3", G.V3_11),
        ("4.0.0-rc.1", G.V4),
        ("4.3.0", G.V4),
        ("4.3.5", G.V4),
        ("5.0.0", G.V4),  # newer than anything known: the newest rules
        (" 4.1.2", G.V4),
        ("0.0.0", None),  # a development build's version says nothing
        ("", None),
        (None, None),
        ("RabbitMQ", None),
        ("4", None),
        ("v4.3.0", None),
    ],
)
def test_broker_generation_from_version(version: str | None, generation: BrokerGeneration | None) -> None:
    assert broker_generation(version) is generation


def test_unknown_version_gets_rules_every_version_accepts() -> None:
    assert NEWEST_BROKER is G.V4
    # no transient non-exclusive queue for any subscription under the newest rules
    for kind in (K.TOPIC, K.EXCHANGE, K.QUEUE):
        for headers in ({}, {"durable": "false"}, {"auto-delete": "true"}):
            params = queue_params(kind, headers, NEWEST_BROKER)
            assert params.durable or params.exclusive, (kind, headers, params)


# (durable, exclusive, auto_delete) of a declare, per generation: 3.10, 3.11-3.13, 4.x
RULES = [
    # plain subscriptions: the reason for the table
    (K.TOPIC, {}, (False, False, True), (False, False, True), (False, True, True)),
    (K.EXCHANGE, {}, (False, False, True), (False, True, True), (False, True, True)),
    # durable /topic/ subscriptions stay durable and shareable everywhere
    (K.TOPIC, {"durable": "true", "auto-delete": "false"}, *[(True, False, False)] * 3),
    (K.TOPIC, {"persistent": "true"}, *[(True, False, True)] * 3),
    # a durable /exchange/ subscription: 3.11+'s plugins keep the exclusive default
    (
        K.EXCHANGE,
        {"durable": "true", "auto-delete": "false"},
        (True, False, False),
        *[(True, True, False)] * 2,
    ),
    # explicit headers win on every generation
    (K.TOPIC, {"exclusive": "false"}, *[(False, False, True)] * 3),
    (K.EXCHANGE, {"exclusive": "false"}, *[(False, False, True)] * 3),
    (K.TOPIC, {"exclusive": "true"}, *[(False, True, True)] * 3),
    (K.TOPIC, {"auto-delete": "false"}, (False, False, False), (False, False, False), (False, True, False)),
    # an invalid exclusive is "undefined": the durable rule decides (non-durable: exclusive)
    (K.TOPIC, {"exclusive": "yes"}, *[(False, True, True)] * 3),
    # /queue/ is the same everywhere: durable; a non-durable one exclusive
    (K.QUEUE, {}, *[(True, False, False)] * 3),
    (K.QUEUE, {"durable": "false"}, *[(False, True, True)] * 3),
    (K.QUEUE, {"exclusive": "true"}, *[(True, True, False)] * 3),
    # 4.x: a quorum or stream queue is durable and never exclusive, whatever the headers say
    (K.TOPIC, {"x-queue-type": "quorum"}, (False, False, True), (False, False, True), (True, False, True)),
    (
        K.EXCHANGE,
        {"x-queue-type": "stream", "auto-delete": "false"},
        (False, False, False),
        (False, True, False),
        (True, False, False),
    ),
    (
        K.QUEUE,
        {"x-queue-type": "quorum", "durable": "false"},
        (False, True, True),
        (False, True, True),
        (True, False, True),
    ),
    (K.TOPIC, {"x-queue-type": "classic"}, (False, False, True), (False, False, True), (False, True, True)),
    # never-declared kinds: the catch-all default
    (K.AMQ_QUEUE, {}, *[(False, True, True)] * 3),
]


@pytest.mark.parametrize(("kind", "headers", "v3_10", "v3_11", "v4"), RULES)
def test_flag_table(
    kind: DestinationKind,
    headers: dict[str, str],
    v3_10: tuple[bool, bool, bool],
    v3_11: tuple[bool, bool, bool],
    v4: tuple[bool, bool, bool],
) -> None:
    for generation, flags in ((G.V3_10, v3_10), (G.V3_11, v3_11), (G.V4, v4)):
        params = queue_params(kind, headers, generation)
        assert (params.durable, params.exclusive, params.auto_delete) == flags, generation


def test_without_a_generation_the_rules_are_3_10_8s() -> None:
    for kind, headers, v3_10, *_ in RULES:
        params = queue_params(kind, headers)
        assert (params.durable, params.exclusive, params.auto_delete) == v3_10


def test_subscribe_and_send_plans_follow_the_generation() -> None:
    topic = parse_destination("/topic/t")
    exchange = parse_destination("/exchange/x/k")
    for generation, topic_exclusive, exchange_exclusive in (
        (G.V3_10, False, False),
        (G.V3_11, False, True),
        (G.V4, True, True),
    ):
        on_topic = subscribe_target(topic, {}, "s", "amq.topic", generation=generation).declare
        on_exchange = subscribe_target(exchange, {}, "s", "amq.topic", generation=generation).declare
        assert on_topic is not None and on_topic.exclusive is topic_exclusive
        assert on_exchange is not None and on_exchange.exclusive is exchange_exclusive
    quorum = send_queue_declare(parse_destination("/queue/q"), {"x-queue-type": "quorum"}, (), G.V4)
    assert quorum is not None and (quorum.durable, quorum.exclusive) == (True, False)


@pytest.mark.parametrize("profile", ["rabbitmq", "activemq"])
@pytest.mark.parametrize(("generation", "exclusive"), [(G.V3_10, False), (G.V3_11, False), (G.V4, True)])
def test_session_declares_with_the_generation_its_login_reported(
    profile: str, generation: BrokerGeneration, exclusive: bool
) -> None:
    session = make_session(profile=profile)

    def answer(op: ops.Operation) -> object:
        if isinstance(op, ops.OpenConnection):
            return ops.LoginResult(True, server_version="RabbitMQ/x", broker=generation)
        if isinstance(op, ops.QueueDeclare):
            return op.queue or "amq.gen-test"
        return None

    run(session, Frame("CONNECT", {"accept-version": "1.2", "host": "/", "client-id": "c"}), answer)
    out = run(session, Frame("SUBSCRIBE", {"destination": "/topic/t", "id": "1"}), answer)
    [declare] = [op for op in out if isinstance(op, ops.QueueDeclare)]
    assert (declare.durable, declare.exclusive, declare.auto_delete) == (False, exclusive, True)
    # a temp queue is exclusive on every generation
    out = run(session, Frame("SEND", {"destination": "/queue/q", "reply-to": "/temp-queue/r"}, b"x"), answer)
    temp = [op for op in out if isinstance(op, ops.QueueDeclare) and op.queue == ""]
    assert [(op.durable, op.exclusive, op.auto_delete) for op in temp] == [(False, True, True)]


def test_rules_start_with_3_10_until_a_login() -> None:
    assert rules_for("rabbitmq").broker is G.V3_10
    assert rules_for("activemq").broker is G.V3_10


@pytest.mark.parametrize(
    ("properties", "version", "generation"),
    [
        ({"product": "RabbitMQ", "version": "4.3.0"}, "4.3.0", G.V4),
        ({"product": "RabbitMQ", "version": "3.12.14"}, "3.12.14", G.V3_11),
        ({"product": "RabbitMQ", "version": "3.10.8"}, "3.10.8", G.V3_10),
        ({"product": "RabbitMQ"}, None, NEWEST_BROKER),
        ({"version": "nightly"}, "nightly", NEWEST_BROKER),
    ],
)
async def test_handshake_reads_the_version(
    properties: dict[str, str], version: str | None, generation: BrokerGeneration
) -> None:
    connection = AmqpConnection(Events(), heartbeat=0, connection_name="x")
    connection.socket.connection_made(MemoryTransport())  # type: ignore[arg-type]
    connection.socket.data_received(broker((commands.Connection.Start(server_properties=properties), 0)))
    assert connection.broker_version == version
    assert connection.broker_generation is generation
    await asyncio.sleep(0)


def test_each_node_is_logged_once_and_on_change(caplog: pytest.LogCaptureFixture) -> None:
    nodes = BrokerNodes(parse_nodes("amqp://a:5672,amqp://b:5672"))
    a, b = nodes.nodes
    with caplog.at_level(logging.INFO, logger="adapter.server.brokers"):
        for _ in range(3):
            nodes.announced(a, "3.10.8")
        nodes.announced(b, None)
        nodes.announced(b, None)
        nodes.announced(a, "4.3.0")  # upgraded in place
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(lines) == 3
    assert (
        lines[0][0] == "INFO"
        and "amqp://a:5672 is version 3.10.8" in lines[0][1]
        and "3.10 rules" in lines[0][1]
    )
    assert lines[1][0] == "WARNING" and "amqp://b:5672 announces no version" in lines[1][1]
    assert "4.x rules" in lines[1][1]
    assert "version 4.3.0" in lines[2][1] and "4.x rules" in lines[2][1]
    assert a.announced == ("4.3.0", G.V4)
    assert b.announced == ("", G.V4)


def test_workers_broker_info_is_not_summed() -> None:
    def snapshot(version: str) -> list[dict[str, object]]:
        labels = {"node": "amqp://a:5672", "version": version, "rules": "4.x"}
        return [
            {
                "name": "stomp_adapter_broker_info",
                "type": "gauge",
                "help": "h",
                "samples": [["stomp_adapter_broker_info", labels, 1.0]],
            }
        ]

    [family] = WorkerMetrics().combine([snapshot("4.3.0"), snapshot("4.3.0"), snapshot("4.3.1")])
    assert sorted((s.labels["version"], s.value) for s in family.samples) == [("4.3.0", 1.0), ("4.3.1", 1.0)]


def test_basic_qos_is_never_global() -> None:
    """4.x treats basic.qos global=true as global=false; the adapter only ever sends false, so
    the prefetch means the same on every broker: per consumer."""
    for count in (0, 1, 65535):
        _, _, qos = frame.unmarshal(wire.basic_qos(1, count))
        assert isinstance(qos, commands.Basic.Qos)
        assert (qos.prefetch_count, qos.global_) == (count, False)
