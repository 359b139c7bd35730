"""Broker nodes (adapter/amqp/brokers.py): the order a login tries them in."""

from __future__ import annotations

import random

from adapter.amqp.brokers import RETRY_AFTER_SECONDS, BrokerNodes, parse_nodes


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def labels(nodes):  # type: ignore[no-untyped-def]
    return [node.label for node in nodes]


def test_parse_nodes_defaults_ports_by_scheme():
    nodes = parse_nodes("amqp://u:p@a/,amqps://b/vh, amqps://[::1]:7000")
    assert labels(nodes) == ["amqp://a:5672", "amqps://b:5671", "amqps://[::1]:7000"]
    assert [node.tls for node in nodes] == [False, True, True]


def test_round_robin_starts_one_node_further_each_login():
    nodes = BrokerNodes(parse_nodes("amqp://a/,amqp://b/,amqp://c/"))
    firsts = [labels(nodes.attempt_order()) for _ in range(4)]
    assert [order[0] for order in firsts] == [
        "amqp://a:5672",
        "amqp://b:5672",
        "amqp://c:5672",
        "amqp://a:5672",
    ]
    assert firsts[1] == ["amqp://b:5672", "amqp://c:5672", "amqp://a:5672"]


def test_shuffle_tries_every_node_once_in_a_random_order():
    nodes = BrokerNodes(parse_nodes("amqp://a/,amqp://b/,amqp://c/"), "shuffle", rng=random.Random(1))
    orders = {tuple(labels(nodes.attempt_order())) for _ in range(30)}
    assert all(sorted(order) == ["amqp://a:5672", "amqp://b:5672", "amqp://c:5672"] for order in orders)
    assert len(orders) > 1


def test_a_failed_node_is_tried_last_until_it_has_rested():
    clock = Clock()
    nodes = BrokerNodes(parse_nodes("amqp://a/,amqp://b/"), clock=clock)
    a, b = nodes.nodes
    nodes.failed(a)
    assert labels(nodes.attempt_order()) == ["amqp://b:5672", "amqp://a:5672"]
    assert labels(nodes.attempt_order()) == ["amqp://b:5672", "amqp://a:5672"]
    clock.now += RETRY_AFTER_SECONDS
    # rested: back in the rotation (third login, so the rotation starts at the first node again)
    assert labels(nodes.attempt_order()) == ["amqp://a:5672", "amqp://b:5672"]
    nodes.connected(a, "a", "10.0.0.1")
    assert a.failed_at is None


def test_a_single_failed_node_is_still_tried():
    nodes = BrokerNodes(parse_nodes("amqp://a/"))
    nodes.failed(nodes.nodes[0])
    assert labels(nodes.attempt_order()) == ["amqp://a:5672"]
